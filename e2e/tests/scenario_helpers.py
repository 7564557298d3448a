"""Shared pieces of the e2e scenarios 2, 3, 4 and 6: ModelDeployment manifests derived from the
sample, reading what a user would read (``kubectl get kvmd``, conditions, Events, smg's workers),
streamed requests, and a background known-answer traffic loop. The per-test namespace and the
wall-time line come from conftest's ``namespace`` fixture."""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from kvgate_e2e.deadlines import (
    HTTP_GET_TIMEOUT,
    METRICS_TIMEOUT,
    PASS_DEADLINE,
    POD_GONE_DEADLINE,
)
from kvgate_e2e.kubelet.node import MAX_TOTAL_TOKENS_ANNOTATION
from kvgate_e2e.polling import poll_until
from kvgate_e2e.sampler import routes_to_ip
from kvgate_e2e.world import (
    BIG_POOL,
    KNOWN_PROMPT_IDS,
    OPERATOR_NAMESPACE,
    OPERATOR_SELECTOR,
    RELEASE,
    World,
    condition,
    http_json,
    is_ready,
    known_answer_body,
    load_sample,
    manifest_text,
    output_ids,
)

T = TypeVar("T")
GATE = "kvgate.io/engine-verified"
SERVED_MODEL = "llama-3.1-8b"  # the sample's served model name


# The scenarios' name for the harness's one poll loop: every 0.2 s until truthy, failing with an
# AssertionError naming what it waited for after the timeout.
deadline_loop = poll_until


def sample_md(name: str, pool: str = BIG_POOL, **spec_changes: Any) -> dict[str, Any]:
    """The safe sample (llama-8b, 131,072 tokens, 80 GiB GPUs) renamed, both roles pinned to
    ``pool`` (``kvgate.io/pool``: without it an engine may land on the 24 GiB pool and be
    refused, rightly); ``spec_changes`` replace top-level spec keys (``rollout=...``)."""
    md = copy.deepcopy(load_sample("llama-8b"))
    md["metadata"] = {"name": name}
    for role in ("prefill", "decode"):
        md["spec"][role]["nodeSelector"] = {"kvgate.io/pool": pool}
    md["spec"].update(spec_changes)
    return md


def on_pool_without_estimate(md: dict[str, Any], pool: str) -> dict[str, Any]:
    """Pin both roles to a node pool and drop ``gpuMemoryGiB`` so admission cannot estimate the
    pool: only the live engine can tell."""
    for role in ("prefill", "decode"):
        md["spec"][role].pop("gpuMemoryGiB", None)
        md["spec"][role]["nodeSelector"] = {"kvgate.io/pool": pool}
    return md


@contextmanager
def node_pool_capped(world: World, node: str, tokens: int) -> Iterator[None]:
    """Every engine ``node`` starts meanwhile, reference or real SGLang, gets a KV pool of at
    most ``tokens``: the node's ``e2e.kvgate.io/max-total-tokens`` (kvgate_e2e.kubelet.node), a
    node with less free GPU memory, which admission cannot see. Removed on the way out."""
    annotation = f"{MAX_TOTAL_TOKENS_ANNOTATION}={tokens}"
    world.kubectl("annotate", "node", node, annotation, "--overwrite")
    try:
        yield
    finally:
        world.kubectl("annotate", "node", node, f"{MAX_TOTAL_TOKENS_ANNOTATION}-", check=False)


def get_md_table(world: World, namespace: str) -> str:
    """``kubectl get kvmd`` as a user sees it (printer columns)."""
    return str(world.kubectl("get", "kvmd", f"--namespace={namespace}").stdout)


def md_condition(world: World, name: str, namespace: str, kind: str) -> dict[str, Any] | None:
    md = world.get_md(name, namespace)
    return condition(md, kind) if md else None


def md_story(world: World, md: str, namespace: str) -> str:
    """What a timed-out wait on ``md`` shows: the leading operator's log and tasks, the whole
    status, then a short summary last (the revisions, conditions, content checks, pods with
    phase, readiness and gate, Deployments and the latest Events): a CI log keeps a failure's
    head and tail, so the lines that say what happened come at the end."""
    status = (world.get_md(md, namespace) or {}).get("status") or {}
    lines = ["operator log:\n" + world.operator_log(120)]
    lines.append("operator tasks:\n" + world.operator_tasks())
    lines.append(f"ModelDeployment {namespace}/{md} status: {json.dumps(status, sort_keys=True)}")
    lines.append(f"--- {namespace}/{md} in short ---")
    lines.append(
        " ".join(
            f"{key}={status.get(key)}"
            for key in ("servingRevision", "targetRevision", "refusedRevision")
            if key in status
        )
    )
    for c in status.get("conditions") or []:
        lines.append(
            f"condition {c.get('type')}={c.get('status')} "
            f"{c.get('reason')}: {str(c.get('message'))[:300]}"
        )
    for check in status.get("contentChecks") or []:
        lines.append(
            f"content check {check.get('revision')} passed={check.get('passed')}: "
            f"{str(check.get('message'))[:400]}"
        )
    for pod in world.list("pods", namespace, f"kvgate.io/deployment={md}"):
        lines.append(_pod_line(pod))
    for deployment in world.list("deployments", namespace, f"kvgate.io/deployment={md}"):
        replicas = deployment.get("status") or {}
        lines.append(
            f"deployment {deployment['metadata']['name']}: replicas "
            f"{deployment['spec'].get('replicas')}, ready {replicas.get('readyReplicas', 0)}"
        )
    for event in events(world, namespace)[-10:]:
        lines.append(f"event {event.get('reason')}: {str(event.get('message'))[:300]}")
    return "\n".join(lines)


def _pod_line(pod: dict[str, Any]) -> str:
    """One pod for a story: phase, conditions, why one is not True (a gate, unschedulable),
    drain marks."""
    conditions = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or []}
    why = {
        c["type"]: f"{c.get('reason')}: {str(c.get('message'))[:160]}"
        for c in (pod.get("status") or {}).get("conditions") or []
        if c.get("status") != "True" and (c.get("reason") or c.get("message"))
    }
    marks = {
        k: v
        for k, v in (pod["metadata"].get("annotations") or {}).items()
        if k.startswith(("kvgate.io/drain", "controller.kubernetes.io/pod-deletion"))
    }
    return (
        f"pod {pod['metadata']['name']}: {(pod.get('status') or {}).get('phase')} "
        f"{conditions} deleting={bool(pod['metadata'].get('deletionTimestamp'))}"
        f"{f' {why}' if why else ''}{f' {marks}' if marks else ''}"
    )


def wait_md_ready(
    world: World, md: str, namespace: str, timeout: float, what: str | None = None
) -> dict[str, Any]:
    """Wait until ``md``'s Ready condition is True and return the ModelDeployment; a timeout
    names ``what`` and shows the operator's log."""
    ready: dict[str, Any] = deadline_loop(
        what or f"ModelDeployment {md} to be Ready",
        lambda: (m := world.get_md(md, namespace)) is not None and is_ready(m) and m,
        timeout,
        details=lambda: md_story(world, md, namespace),
    )
    return ready


def known_answer(world: World, md: str, namespace: str, timeout: float = 30.0) -> tuple[bool, str]:
    """One known-answer request through ``md``'s Service (its router): (answered right, what
    came back). The reference engine copies the prompt, so a right answer is HTTP 200 with the
    prompt's first four ids; a 200 with other tokens says WRONG TOKENS."""
    body = known_answer_body(SERVED_MODEL)
    code, answer = world.router_request(md, body, namespace, timeout=timeout)
    ids = output_ids(answer)
    if code == 200 and ids is not None and ids != KNOWN_PROMPT_IDS[:4]:
        return False, f"WRONG TOKENS {ids}"
    return code == 200 and ids == KNOWN_PROMPT_IDS[:4], f"HTTP {code} {str(answer)[:200]}"


def wait_known_answer(
    world: World,
    md: str,
    namespace: str,
    timeout: float = 60,
    what: str = "a known-answer request through the router",
) -> None:
    """Wait until ``md`` serves: a known-answer request through its Service answered right; a
    timeout names the last answer."""
    last = ["no answer yet"]

    def answered() -> bool:
        ok, last[0] = known_answer(world, md, namespace)
        return ok

    deadline_loop(what, answered, timeout, details=lambda: f"last answer: {last[0]}")


def refused_with(
    world: World, namespace: str, md: str, reason: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wait until ``md`` records its refused revision, with nothing serving; its EnginesVerified
    condition says ``reason`` and Ready says RolloutRefused. Returns those two conditions."""
    refused = deadline_loop(
        f"{md}'s status to record the refused revision",
        lambda: (m := world.get_md(md, namespace)) and m["status"].get("refusedRevision") and m,
        PASS_DEADLINE,
    )
    assert refused["status"].get("servingRevision") is None, refused["status"]
    verified = md_condition(world, md, namespace, "EnginesVerified")
    assert verified is not None and verified["status"] == "False", verified
    assert verified["reason"] == reason, verified
    ready = md_condition(world, md, namespace, "Ready")
    assert ready is not None and ready["status"] == "False", ready
    assert ready["reason"] == "RolloutRefused", ready
    return verified, ready


def events(world: World, namespace: str, reason: str | None = None) -> list[dict[str, Any]]:
    items = world.list("events", namespace)
    return [e for e in items if reason is None or e.get("reason") == reason]


def engine_pods(world: World, namespace: str, md: str, role: str | None = None) -> list[Any]:
    selector = f"kvgate.io/deployment={md},kvgate.io/component=engine"
    if role:
        selector += f",kvgate.io/role={role}"
    return [
        p
        for p in world.list("pods", namespace, selector)
        if not p["metadata"].get("deletionTimestamp")
    ]


def router_workers(world: World, namespace: str, md: str) -> list[dict[str, Any]]:
    """Every worker of every running router pod of ``md`` (``GET /workers``)."""
    from kvgate_e2e.world import http_json, router_key

    out: list[dict[str, Any]] = []
    auth = {"Authorization": f"Bearer {router_key(world, namespace, md)}"}
    selector = f"kvgate.io/deployment={md},kvgate.io/component=router"
    for router in world.list("pods", namespace, selector):
        ip = router.get("status", {}).get("podIP")
        if not ip or router["status"].get("phase") != "Running":
            continue
        code, body = http_json(
            f"http://127.0.0.1:{world.forward(ip, 8000)}/workers",
            timeout=HTTP_GET_TIMEOUT,
            headers=auth,
        )
        if code == 200 and isinstance(body, dict):
            out.extend(body.get("workers") or [])
    return out


def routed(world: World, namespace: str, md: str, ip: str) -> bool:
    """Does a router of ``md`` still route to the engine at ``ip`` (a worker whose host is that
    IP exactly, not draining)?"""
    return routes_to_ip(router_workers(world, namespace, md), ip)


def service_revision(world: World, ns: str, md_name: str) -> str | None:
    """The revision the ModelDeployment's Service selects (None: no Service)."""
    svc = world.get("service", md_name, ns)
    return None if svc is None else (svc["spec"].get("selector") or {}).get("kvgate.io/revision")


class TrafficLoop:
    """Known-answer requests in a loop from a background thread, each result recorded:
    ``with TrafficLoop(send) as traffic: ...``; ``send()`` returns (ok, detail)."""

    def __init__(self, send: Callable[[], tuple[bool, str]], pause: float = 0.1) -> None:
        import threading

        self.send = send
        self.pause = pause
        self.results: list[tuple[float, bool, str]] = []  # (done, ok, detail)
        self.started: list[float] = []  # when each of ``results`` was sent, in the same order
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                ok, detail = self.send()
            except Exception as exc:  # a refused connection is a failed request
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            self.started.append(started)
            self.results.append((time.monotonic(), ok, detail))
            self._stop.wait(self.pause)

    def __enter__(self) -> TrafficLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)

    @property
    def failures(self) -> list[tuple[float, bool, str]]:
        return [r for r in self.results if not r[1]]


def stream_generate(url: str, body: Mapping[str, Any], timeout: float = 60.0) -> StreamAnswer:
    """POST ``body`` with ``"stream": true`` to ``url`` (``.../generate``) and read the whole
    server-sent event stream, as a streaming client does: the HTTP status of the head, and every
    ``data:`` event parsed as JSON (``[DONE]`` ends it)."""
    data = json.dumps({**body, "stream": True}).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, text = resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read().decode(errors="replace")
    events: list[Any] = []
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        payload = line.removeprefix("data:").strip()
        if payload == "[DONE]":
            break
        try:
            events.append(json.loads(payload))
        except ValueError:
            events.append(payload)
    if not events and text.strip() and not text.lstrip().startswith("data:"):
        try:  # a non-streamed error answer (e.g. the router's own 404)
            events.append(json.loads(text))
        except ValueError:
            events.append(text)
    return StreamAnswer(status, events, text)


@dataclass(frozen=True)
class StreamAnswer:
    """What a streaming client received."""

    status: int
    events: list[Any]
    raw: str

    @property
    def output_ids(self) -> list[int]:
        """Every ``output_ids`` the stream carried, in order (cumulative or incremental)."""
        out: list[int] = []
        for event in self.events:
            for item in event if isinstance(event, list) else [event]:
                if isinstance(item, dict) and isinstance(item.get("output_ids"), list):
                    out.extend(int(x) for x in item["output_ids"])
        return out

    @property
    def errors(self) -> list[Any]:
        return [e["error"] for e in self.events if isinstance(e, dict) and "error" in e]


@dataclass(frozen=True)
class Tenant:
    """``kubectl`` as ``system:serviceaccount:<ns>:tenant``, bound to the built-in ``edit`` role
    in its namespace only, as a cluster admin would give a team its namespace."""

    world: World
    namespace: str

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:tenant"

    def kubectl(self, *args: str, input: str | None = None) -> Any:
        return self.world.kubectl(
            f"--as={self.user}",
            "--as-group=system:serviceaccounts",
            f"--as-group=system:serviceaccounts:{self.namespace}",
            f"--namespace={self.namespace}",
            *args,
            input=input,
            check=False,
        )

    def create(self, obj: dict[str, Any], *flags: str) -> Any:
        return self.kubectl("create", *flags, "-f", "-", input=manifest_text(obj))


def make_tenant(world: World, namespace: str) -> Tenant:
    world.apply(
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "tenant"}}, namespace
    )
    world.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "tenant-edit"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "edit",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "tenant", "namespace": namespace}],
        },
        namespace,
    )
    return Tenant(world, namespace)


def requests_served(url: str) -> float:
    """The engine's own request counter (``sglang:num_requests_total`` on its ``/metrics``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=HTTP_GET_TIMEOUT) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("sglang:num_requests_total"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("engine /metrics has no sglang:num_requests_total")


class FirstSeen:
    """One polling thread per named probe; records the first time each held, on ``clock``
    (``time.monotonic`` by default; ``time.time`` to compare with log timestamps)."""

    def __init__(
        self,
        probes: Mapping[str, Callable[[], bool]],
        interval: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seen: dict[str, float] = {}
        self._clock = clock
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(name, probe, interval), daemon=True)
            for name, probe in probes.items()
        ]

    def _run(self, name: str, probe: Callable[[], bool], interval: float) -> None:
        while not self._stop.is_set():
            try:
                if probe():
                    self.seen[name] = self._clock()
                    return
            except Exception:  # a probe may race with a restart or a pod change; try again
                pass
            self._stop.wait(interval)

    def __enter__(self) -> FirstSeen:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def wait(self, name: str, timeout: float) -> float:
        return deadline_loop(f"{name} (first seen)", lambda: self.seen.get(name), timeout)


def server_info(url: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """An engine's ``/server_info`` read directly (None while it does not answer 200)."""
    try:
        code, info = http_json(f"{url}/server_info", timeout=timeout)
    except OSError:
        return None
    return info if code == 200 and isinstance(info, dict) else None


@contextmanager
def operator_down(world: World) -> Iterator[dict[str, float]]:
    """kvgate's controller Deployment at 0 replicas inside the block; back, with a leader,
    afterwards, whatever happens inside. The yielded dict gets the wall times ``scaled_up``
    (the scale back up was asked) and ``leader_ready`` (a Ready leader, the webhook answering)."""
    deployment = world.get("deployment", RELEASE, OPERATOR_NAMESPACE)
    assert deployment is not None
    replicas = int(deployment["spec"]["replicas"])
    scale = ("scale", f"--namespace={OPERATOR_NAMESPACE}", f"deployment/{RELEASE}")
    world.kubectl(*scale, "--replicas=0")
    times: dict[str, float] = {}
    try:
        deadline_loop(
            "every controller pod to be gone",
            lambda: not world.list("pods", OPERATOR_NAMESPACE, OPERATOR_SELECTOR),
            POD_GONE_DEADLINE,
        )
        yield times
    finally:
        times["scaled_up"] = time.time()
        world.kubectl(*scale, f"--replicas={replicas}")
        world.wait_operator_ready()
        times["leader_ready"] = time.time()


def operator_metrics(world: World) -> str:
    """The leading operator's /metrics as Prometheus would scrape it."""
    leader = world.operator_pod()
    assert leader is not None, "no operator pod"
    url = f"http://127.0.0.1:{world.forward(leader['status']['podIP'], 8080)}/metrics"
    with urllib.request.urlopen(url, timeout=METRICS_TIMEOUT) as response:
        return str(response.read().decode())


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the first ``name`` series whose labels include ``labels`` (None: none)."""
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        fields, _, value = line[len(name) + 1 :].rpartition("} ")
        found = dict(
            pair.split("=", 1) for pair in fields.replace('"', "").split(",") if "=" in pair
        )
        if all(found.get(k) == v for k, v in labels.items()):
            return float(value)
    return None
