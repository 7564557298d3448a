"""The tenant-data incident on the released pre-fix SGLang, without kvgate and then under it.

Real-engine mode (``kvgate_e2e.real_engine``): the pods of ``kvgate-real-incident-0`` (a node of
its own, annotated ``e2e.kvgate.io/engine-runtime=sglang-cpu``) run the released SGLang on CPU,
the tiny Llama of the real-engine scenario, and the real smg 1.13 as the PD gateway.

The release is **0.5.19**, not 0.5.20. Both run on CPU with the switches 0.5.23 needs
(``research/sglang-cpu.md``; 0.5.19 and 0.5.20 pin torch 2.13.0, sglang-kernel 0.4.6.post1 and
0.4.7, transformers 5.12.1: ``e2e/sglang-cpu/install.sh`` installs them unchanged). But 0.5.20
no longer has the bug in this shape: its prefill retires the aborted one-token placeholder
without sending it (``_retire_aborted_prefill_result`` in ``disaggregation/prefill.py``, which
calls ``CommonKVSender.abort()``: that marks the room Failed on the prefill side only), so
decode, which reserved the whole prompt, never hears of it and gives up after
``SGLANG_DISAGGREGATION_WAITING_TIMEOUT``: measured here, a streamed 3,000-token prompt (pool
2,048, context 4,096) through smg got HTTP 200, 300 s of pings, then an abort event with status
500 ("timed out after 300.0s in KVPoll.WaitingForInput") and no token. 0.5.19's
``process_batch_result_disagg_prefill`` has no such check: the placeholder's one token of KV
goes out as the last chunk (``send_kv_chunk(req, last_chunk=True)``), decode sees the transfer
succeed and generates from pages nothing wrote. That is the incident, and this module shows it.

1. Out of the path: a plain prefill Deployment (``--max-total-tokens 2048``, context 4,096), a
   plain decode Deployment (pool 8,192) and smg with Kubernetes discovery, no ModelDeployment.
   A prompt of 3,000 tokens (longer than the prefill's pool, shorter than the window) is
   refused by the prefill's scheduler ("Input length (3000 tokens) exceeds the maximum allowed
   length (2042 tokens)" in its log), and the client gets HTTP 200 with 16 generated tokens and
   ``finish_reason: length``, non-streamed and streamed alike: the bug. (On 0.5.20 the same
   non-streamed request gets smg's 400 naming that refusal.) Whose data those tokens come from:
   the same greedy prompt, sent again after another request of 2,000 tokens (A1, then A2), gets
   different tokens depending on which one ran before it: decode read what that request left
   in its pages.
2. Under kvgate: the honest spelling (image ``v0.5.19``) is denied at admission; the same
   engines behind a tag that names no release (the node's ``e2e.kvgate.io/sglang-release``
   resolves it to 0.5.19) on a node whose free memory holds 2,048 tokens
   (``e2e.kvgate.io/max-total-tokens``) pass admission with a warning, start, report their real
   numbers and are refused at verification for the pool (the gate's first reason; the version is
   named after it): not Ready, in no router's workers, the Service answers nothing, and the
   engines' own request counters do not move while the same prompt is sent.

Run: ``KVGATE_REQUIRE_E2E=1 .venv/bin/pytest -q -s e2e/tests/test_scenario_real_incident.py``
(root; after ``make real-engine-deps``). Prints ``MEASURED`` lines.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import PASS_DEADLINE, POD_GONE_DEADLINE, REAL_ANSWER_DEADLINE
from kvgate_e2e.kubelet.node import MAX_TOTAL_TOKENS_ANNOTATION
from kvgate_e2e.real_engine import (
    CPU_MEM_FRACTION_STATIC,
    DEFAULT_VERSION,
    RELEASE_ANNOTATION,
    RUNTIME_ANNOTATION,
    SGLANG_CPU,
    TINY_CONTEXT,
    TINY_POOL,
    TINY_SERVED,
    RealEngineError,
    one_real_pair_at_a_time,
    sglang_cpu,
    tiny_llama_md,
)
from kvgate_e2e.real_engine_cache import tiny_llama
from kvgate_e2e.sampler import InvariantSampler, live_host
from kvgate_e2e.world import (
    GATE,
    REAL_INCIDENT_NODE,
    REAL_INCIDENT_POOL,
    World,
    condition,
    http_json,
    is_ready,
)
from scenario_helpers import (
    StreamAnswer,
    deadline_loop,
    engine_pods,
    events,
    node_pool_capped,
    requests_served,
    router_workers,
    server_info,
    stream_generate,
)
from test_scenario_incident import plain_router

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.real_engine,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]

PRE_FIX = "0.5.19"
CONTEXT = TINY_CONTEXT  # 4,096
PREFILL_POOL = 2048  # max_req_input_len = min(4,095, 2,047) - 5 = 2,042
DECODE_POOL = TINY_POOL  # 8,192: decode reserves the whole prompt
OVER_POOL = [(7 + i) % 380 + 2 for i in range(3000)]  # > 2,048, < 4,096; ids of the 384 vocab
SHORT = [0, 40, 41, 42, 100, 200, 300, 12, 13, 14]
NEW_TOKENS = 16
START_TIMEOUT = 600.0  # a CPU SGLang pair started on a loaded 2-core machine
NEUTRAL_IMAGE = "lmsysorg/sglang:latest"  # names no release: admission cannot read it
# Request timeouts and deadlines, not bounds: only a request that hangs or a step that never
# happens reaches one. Shared ones come from kvgate_e2e.deadlines.
SHORT_TIMEOUT = 60  # the SHORT prompt and NEW_TOKENS decoded by the CPU SGLang pair
# A prompt of 2,000 to 3,000 tokens prefilled on CPU SGLang and NEW_TOKENS decoded.
LONG_PROMPT_TIMEOUT = 120


def body(ids: list[int]) -> dict[str, Any]:
    return {
        "model": TINY_SERVED,
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0},
    }


def finish_reasons(answer: StreamAnswer) -> list[str]:
    return [
        str((e.get("meta_info") or {}).get("finish_reason", {}).get("type"))
        for e in answer.events
        if isinstance(e, dict) and (e.get("meta_info") or {}).get("finish_reason")
    ]


def final_ids(answer: StreamAnswer) -> list[int]:
    """The output ids of a stream's last event (SGLang's events carry every id so far)."""
    last = [e for e in answer.events if isinstance(e, dict) and "output_ids" in e]
    return [int(i) for i in last[-1]["output_ids"]] if last else []


@dataclass
class Incident:
    world: World
    model: Path
    ns: str


@pytest.fixture(scope="module")
def incident(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Incident]:
    try:
        sglang_cpu(PRE_FIX)
        current = sglang_cpu(DEFAULT_VERSION)
    except RealEngineError as exc:
        pytest.fail(f"{exc} (make real-engine-deps installs both)")
    found = tiny_llama(current, sys.executable, tmp_path_factory.mktemp("tiny-llama"), 0)
    node, ns = (
        REAL_INCIDENT_NODE,
        "t-real-incident-" + hashlib.sha1(str(found.value).encode()).hexdigest()[:6],
    )
    waited = time.monotonic()
    with one_real_pair_at_a_time():
        print(f"\nMEASURED waited {time.monotonic() - waited:.1f}s for the real-engine turn")
        try:
            world.kubectl(
                "annotate", "node", node, f"{RUNTIME_ANNOTATION}={SGLANG_CPU}", "--overwrite"
            )
            world.create_namespace(ns)
            yield Incident(world, found.value, ns)
        finally:
            try:
                # The engines' memory is freed before the next real pair may start.
                world.delete_namespace(ns)
            finally:
                for key in (RUNTIME_ANNOTATION, RELEASE_ANNOTATION, MAX_TOTAL_TOKENS_ANNOTATION):
                    world.kubectl("annotate", "node", node, f"{key}-", check=False)


def engine_log(world: World, ns: str, pod: str, tail: int = 3000) -> str:
    path = world.kubelet.kubelet.log_path(ns, pod, "engine")
    return path.read_text(errors="replace")[-tail:] if path and path.exists() else "(no log)"


# ------------------------------------------------------------------ without kvgate
def plain_engine(model: Path, role: str, pool: int) -> dict[str, Any]:
    """A pre-fix engine as a team without kvgate deploys it: a Deployment, /health readiness."""
    labels = {"app": "leaky", "tier": "engine", "role": role}
    args = ["--model-path", str(model), "--served-model-name", TINY_SERVED, "--port", "30000"]
    args += ["--context-length", str(CONTEXT), "--max-total-tokens", str(pool)]
    args += ["--mem-fraction-static", str(CPU_MEM_FRACTION_STATIC), "--enable-metrics"]
    args += ["--disaggregation-mode", role, "--disaggregation-bootstrap-port", "8998"]
    annotations = {"sglang.ai/bootstrap-port": "8998"} if role == "prefill" else {}
    container = {
        "name": "engine",
        "image": f"lmsysorg/sglang:v{PRE_FIX}",
        "command": ["python3", "-m", "sglang.launch_server"],
        "args": args,
        "ports": [{"name": "http", "containerPort": 30000}],
        # SGLang's /health runs a one-token generation: seconds on a loaded CPU, not the
        # probe's default 1 s.
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": 30000},
            "periodSeconds": 3,
            "timeoutSeconds": 30,
        },
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"leaky-{role}"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "nodeSelector": {"kvgate.io/pool": REAL_INCIDENT_POOL},
                    "terminationGracePeriodSeconds": 2,
                    "containers": [container],
                },
            },
        },
    }


def first_answer(url: str) -> tuple[int, Any]:
    """A short prompt through the gateway's Service, retried while smg has no workers yet."""

    def ask() -> tuple[int, Any] | None:
        code, answer = http_json(url, body(SHORT), timeout=SHORT_TIMEOUT)
        return (code, answer) if code == 200 else None

    return deadline_loop(
        "a first 200 through the pre-fix pair", ask, REAL_ANSWER_DEADLINE, period=1.0
    )


def test_without_kvgate_a_prompt_longer_than_the_pool_gets_http_200_and_tokens(
    incident: Incident,
) -> None:
    world, ns = incident.world, incident.ns
    started = time.monotonic()
    manifests = [
        plain_engine(incident.model, "prefill", PREFILL_POOL),
        plain_engine(incident.model, "decode", DECODE_POOL),
        *plain_router(ns),
    ]
    world.apply(yaml.safe_dump_all(manifests), namespace=ns)
    try:
        deadline_loop(
            "the plain smg to be Ready (both pre-fix engines Ready and discovered)",
            lambda: any(is_ready(p) for p in world.list("pods", ns, "app=leaky-router")),
            START_TIMEOUT,
            period=1.0,
        )
    except AssertionError:
        for pod in world.list("pods", ns, "app=leaky"):
            name = pod["metadata"]["name"]
            print(f"--- {name}:\n{engine_log(world, ns, name)}")
        raise
    up = time.monotonic() - started
    generate = world.service_url("leaky-router", ns) + "/generate"
    first_answer(generate)
    first = time.monotonic() - started
    print(f"\nMEASURED pre-fix pair applied -> first 200 through smg: {first:.1f}s")

    pools = {}
    for pod in world.list("pods", ns, "app=leaky,tier=engine"):
        info = server_info(world.engine_url(pod))
        assert info is not None and info["version"] == PRE_FIX, info
        pools[info["disaggregation_mode"]] = (
            info["max_total_num_tokens"],
            info["max_req_input_len"],
        )
    print(f"live (pool, max_req_input_len) per role: {pools}; context length {CONTEXT}")
    assert pools == {
        "prefill": (PREFILL_POOL, PREFILL_POOL - 6),
        "decode": (DECODE_POOL, CONTEXT - 6),
    }

    # The prefill refuses the prompt (its scheduler's own check) ...
    (prefill,) = world.list("pods", ns, "app=leaky,role=prefill")
    refusal = (
        f"Input length ({len(OVER_POOL)} tokens) exceeds the maximum allowed length "
        f"({PREFILL_POOL - 6} tokens)"
    )
    # ... and the user gets HTTP 200 and tokens, non-streamed and streamed alike.
    code, plain = http_json(generate, body(OVER_POOL), timeout=LONG_PROMPT_TIMEOUT)
    print(f"over-pool prompt, not streamed: HTTP {code} {str(plain)[:400]}")
    assert code == 200, plain
    assert plain["meta_info"]["prompt_tokens"] == len(OVER_POOL), plain
    assert plain["meta_info"]["finish_reason"]["type"] == "length", plain
    assert len(plain["output_ids"]) == NEW_TOKENS, plain
    leaked = stream_generate(generate, body(OVER_POOL), timeout=LONG_PROMPT_TIMEOUT)
    print(f"over-pool prompt, streamed: HTTP {leaked.status}: {leaked.raw[-500:]!r}")
    assert leaked.status == 200, leaked
    assert leaked.errors == [] and "abort" not in finish_reasons(leaked), leaked.raw[-2000:]
    streamed = final_ids(leaked)
    assert len(streamed) == NEW_TOKENS, leaked.raw[-2000:]
    log = engine_log(world, ns, prefill["metadata"]["name"], tail=200_000)
    assert log.count(refusal) >= 2, log[-3000:]
    print(
        f"BUG on SGLang {PRE_FIX}: the prefill refused the {len(OVER_POOL):,}-token prompt "
        f"(pool {PREFILL_POOL:,}, context {CONTEXT:,}: {refusal!r} in its log, twice), and "
        f"the client got HTTP 200 with {NEW_TOKENS} tokens both times: {plain['output_ids']}, "
        f"streamed {streamed}"
    )
    # Whose data: the same greedy prompt's answer changes with what another request (A1 or A2,
    # 2,000 tokens each, within both pools) left in decode's pages just before it.
    answers = answers_after_other_requests(generate)
    print(f"the over-pool prompt's 16 tokens after another request's prompt: {answers}")
    assert len({tuple(ids) for _, ids in answers}) >= 2, answers
    print(f"MEASURED out-of-path half {time.monotonic() - started:.1f}s (engines up {up:.1f}s)")


def answers_after_other_requests(generate: str) -> list[tuple[str, list[int]]]:
    """The over-pool prompt's greedy answer after A1, after A2, after A1 ... (up to 3 rounds,
    until two answers differ): a correct engine gives one answer whatever came before."""
    others = {
        "A1": [(5 * i + 3) % 380 + 2 for i in range(2000)],
        "A2": [(11 * i + 1) % 380 + 2 for i in range(2000)],
    }
    answers: list[tuple[str, list[int]]] = []
    for _ in range(3):
        for name, ids in others.items():
            code, other = http_json(generate, body(ids), timeout=LONG_PROMPT_TIMEOUT)
            assert code == 200, other  # within both pools: served right
            code, answer = http_json(generate, body(OVER_POOL), timeout=LONG_PROMPT_TIMEOUT)
            assert code == 200, answer
            answers.append((f"after {name}", [int(i) for i in answer["output_ids"]]))
        if len({tuple(ids) for _, ids in answers}) >= 2:
            break
    return answers


# ------------------------------------------------------------------ under kvgate
def incident_md(model: Path, image: str) -> dict[str, Any]:
    md = tiny_llama_md("pre-fix", model, REAL_INCIDENT_POOL)
    md["spec"]["engine"]["image"] = image
    # Keep the refused engines running (by default a refused revision is scaled to 0) so these
    # very engines are shown kept off traffic while they run.
    md["spec"]["rollout"]["scaleDownRefused"] = False
    return md


def apply_md(world: World, ns: str, md: dict[str, Any]) -> Any:
    return world.kubectl(
        "apply", f"--namespace={ns}", "-f", "-", input=yaml.safe_dump(md), check=False
    )


def both_refused(world: World, ns: str, seen: list[dict[str, Any]]) -> list[Any] | None:
    seen.extend(router_workers(world, ns, "pre-fix"))
    pods = engine_pods(world, ns, "pre-fix")
    gates = [condition(p, GATE) for p in pods]
    if len(pods) == 2 and all(g and g["reason"] == "KvPoolTooSmall" for g in gates):
        return pods
    return None


def test_under_kvgate_the_same_engines_are_refused_for_the_pool_and_take_no_traffic(
    incident: Incident,
) -> None:
    world, ns, node = incident.world, incident.ns, REAL_INCIDENT_NODE
    # One real PD pair at a time: the first half's engines go first.
    world.kubectl("delete", "deployment", "--all", f"--namespace={ns}", "--wait=true")
    deadline_loop(
        "the out-of-path pair gone",
        lambda: not world.list("pods", ns, "app=leaky") or None,
        POD_GONE_DEADLINE,
    )
    denied = apply_md(world, ns, incident_md(incident.model, f"lmsysorg/sglang:v{PRE_FIX}"))
    print(denied.stderr)
    assert denied.returncode != 0 and "denied the request" in denied.stderr
    assert f"spec.engine.image: lmsysorg/sglang:v{PRE_FIX} is SGLang {PRE_FIX} <" in denied.stderr

    started = time.monotonic()
    seen: list[dict[str, Any]] = []
    world.kubectl("annotate", "node", node, f"{RELEASE_ANNOTATION}={PRE_FIX}", "--overwrite")
    with (
        node_pool_capped(world, node, PREFILL_POOL),
        InvariantSampler(world.cluster, ns, name="real-incident-kvgate"),
    ):
        admitted = apply_md(world, ns, incident_md(incident.model, NEUTRAL_IMAGE))
        print(admitted.stderr)
        assert admitted.returncode == 0, admitted.stderr
        assert f"{NEUTRAL_IMAGE} names no version" in admitted.stderr, admitted.stderr
        try:
            pods = deadline_loop(
                "both pre-fix engines refused for their pool",
                lambda: both_refused(world, ns, seen),
                START_TIMEOUT,
                period=1.0,
            )
        except AssertionError:
            for pod in engine_pods(world, ns, "pre-fix"):
                name = pod["metadata"]["name"]
                print(f"--- {name}:\n{engine_log(world, ns, name)}")
            raise
        print(f"\nMEASURED pre-fix MD applied -> both refused: {time.monotonic() - started:.1f}s")
        urls = [world.engine_url(p) for p in pods]
        for pod, url in zip(pods, urls, strict=True):
            role, name = pod["metadata"]["labels"]["kvgate.io/role"], pod["metadata"]["name"]
            info = server_info(url)
            assert info is not None and info["version"] == PRE_FIX, info
            assert info["max_total_num_tokens"] == PREFILL_POOL, info["max_total_num_tokens"]
            gate = condition(pod, GATE)
            assert gate is not None and gate["status"] == "False", gate
            print(f"{role} gate: {gate['reason']}: {gate['message']}")
            assert gate["message"].startswith(
                f"{role} pod {name} reports KV pool 2,048 tokens < context length 4,096"
            ), gate
            assert f"engine version {PRE_FIX} < minimum 0.5.22" in gate["message"], gate
            assert not is_ready(pod)
        names = {p["metadata"]["name"] for p in pods}
        evs = deadline_loop(
            "KvPoolTooSmall Events for both engines",
            lambda: pool_events(world, ns, names),
            PASS_DEADLINE,
        )
        print(f"Event: {evs[0]['message']}")

        # The same prompt, as a user would send it: through the Service, then at each router.
        served = [requests_served(u) for u in urls]
        answers = no_traffic_answers(world, ns)
        print("kvgate-managed answers to the over-pool prompt:\n  " + "\n  ".join(answers))
        assert [requests_served(u) for u in urls] == served, "a request reached a refused engine"
        seen.extend(router_workers(world, ns, "pre-fix"))
    ips = {p["status"]["podIP"] for p in pods}
    assert not [w for w in seen if live_host(w) in ips], seen
    md = world.get_md("pre-fix", ns)
    assert md is not None and not is_ready(md)
    print(f"MEASURED under-kvgate half {time.monotonic() - started:.1f}s")


def pool_events(world: World, ns: str, names: set[str]) -> list[dict[str, Any]] | None:
    """The KvPoolTooSmall Events with the numbers, once every pod of ``names`` has one."""
    found = [
        e
        for e in events(world, ns, "KvPoolTooSmall")
        if e["involvedObject"]["name"] in names
        and "2,048" in e["message"]
        and "4,096" in e["message"]
    ]
    return found if {e["involvedObject"]["name"] for e in found} == names else None


def no_traffic_answers(world: World, ns: str) -> list[str]:
    """Send the over-pool prompt through the MD's Service (absent, or nothing behind it) and at
    every router pod; assert none answers with tokens. Returns what each said."""
    answers: list[str] = []
    if world.get("service", "pre-fix", ns) is None:
        answers.append("Service pre-fix: does not exist (no revision serves)")
    else:
        try:
            got = stream_generate(world.service_url("pre-fix", ns) + "/generate", body(OVER_POOL))
        except OSError as exc:  # no ready router behind the ClusterIP
            answers.append(f"Service pre-fix: {type(exc).__name__}: {exc}")
        else:
            answers.append(f"Service pre-fix: HTTP {got.status} {got.raw[:160]!r}")
            assert got.status != 200 or not got.output_ids, got
    routers = world.list("pods", ns, "kvgate.io/deployment=pre-fix,kvgate.io/component=router")
    assert routers and not any(is_ready(r) for r in routers)
    for router in routers:
        url = f"http://127.0.0.1:{world.forward(router['status']['podIP'], 8000)}/generate"
        got = stream_generate(url, body(OVER_POOL))
        answers.append(f"router pod: HTTP {got.status} {got.raw[:160]!r}")
        assert got.status != 200 or not got.output_ids, got
    return answers
