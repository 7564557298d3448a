"""Scenario: KV-safe autoscaling of the decode role, by the world's real HPA.

One ModelDeployment (the safe sample, decode with ``autoscaling`` 1..3) goes through:

1. ``kubectl scale`` on its RoleScale ``autoscale-decode`` (2), and a count above
   ``maxReplicas`` refused by the API server with the numbers; ``kubectl get rolescale`` shows
   desired and verified replicas per role;
2. a rollout while scaled out: the new revision's decode Deployment is created at the current
   count (2), not at ``spec.decode.replicas`` (1); then ``kubectl scale`` back to 1 (an idle
   engine drains at once);
3. streaming load through the ModelDeployment's Service (3 requests in flight at once) raises
   ``sglang_num_running_reqs``: Prometheus scrapes the engines, prometheus-adapter serves the
   metric, the real HPA scales the RoleScale 1 -> 3; the new engines take traffic only once
   verified (the invariant sampler);
4. the load drops to one stream: the HPA goes back to 1 while requests stream, kvgate drains the
   two engines it removes (each leaves traffic, finishes its requests, then is deleted), and no
   streaming request fails.

Measured: HPA decision (its ``lastScaleTime``) -> verified engines serving, each drain's time, and
the failed requests during the scale-down (0).

Run: ``KVGATE_REQUIRE_E2E=1 .venv/bin/pytest -q -s e2e/tests/test_scenario_autoscaling.py``.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.deadlines import (
    EVENT_DEADLINE,
    GENERATE_TIMEOUT,
    PASS_DEADLINE,
    POD_GONE_DEADLINE,
    REVISION_DEADLINE,
    ROLE_SCALE_DEADLINE,
    STEP_DEADLINE,
)
from kvgate_e2e.prometheus import Prometheus
from kvgate_e2e.prometheus_adapter import PrometheusAdapter
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import KNOWN_PROMPT_IDS, World
from scenario_helpers import (
    SERVED_MODEL,
    deadline_loop,
    engine_pods,
    events,
    md_story,
    metric_value,
    operator_metrics,
    sample_md,
    stream_generate,
    wait_md_ready,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
MD = "autoscale"
SCALE = f"{MD}-decode"
METRIC = "sglang_num_running_reqs"
API = "kvgate.io/v1alpha1"
STEP_SECONDS = 0.02
STREAM_TOKENS = 400  # 8 s a stream at STEP_SECONDS a token
# Deadlines, not bounds (the run prints the scale-up and drain times it measured): only a step
# that never happens reaches one. Shared ones come from kvgate_e2e.deadlines (the first revision
# Ready uses REVISION_DEADLINE, 300 s, like every other file; it was 240 s here).
STREAM_TIMEOUT = 180  # one stream of STREAM_TOKENS (8 s of decode steps): ends a hung stream only
# The streams' running requests through Prometheus's scrape and the metrics adapter, as the HPA
# reads them.
METRICS_DEADLINE = 90
# The HPA writing the RoleScale (and its lastScaleTime): its sync period is 2 s in the e2e cluster,
# the scale-up policy at once, after the adapter serves the metric.
HPA_UP_DEADLINE = 120
# Two more decode engines started and verified after the HPA's decision, under streaming load.
HPA_SCALE_OUT_DEADLINE = 240
# The HPA back to 1 once only one stream runs: the running-request metric has to fall through
# the scrape and the adapter first.
HPA_DOWN_DEADLINE = 180
# Two engines drained, one after the other, each bounded by drainTimeoutSeconds (180 s) while
# its streams finish, then their pods gone.
DRAINS_DEADLINE = 400


def autoscaled_md() -> dict[str, Any]:
    md = sample_md(MD)
    # 50 tokens/s a request, as a GPU engine streams: long requests at almost no CPU here.
    md["spec"]["engine"]["env"] = [
        {"name": "KVGATE_REFERENCE_DECODE_STEP_SECONDS", "value": str(STEP_SECONDS)}
    ]
    md["spec"]["decode"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 3,
        "drainTimeoutSeconds": 180,
    }
    return md


def hpa(namespace: str) -> dict[str, Any]:
    """Decode between 1 and 3 engines at one running request per engine, at once both ways."""
    at_once = {"stabilizationWindowSeconds": 0, "policies": [
        {"type": "Pods", "value": 2, "periodSeconds": 1}
    ]}  # fmt: skip
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": SCALE, "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": API, "kind": "RoleScale", "name": SCALE},
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": METRIC},
                        "target": {"type": "AverageValue", "averageValue": "1"},
                    },
                }
            ],
            "behavior": {"scaleUp": at_once, "scaleDown": at_once},
        },
    }  # fmt: skip


def body(tokens: int) -> dict[str, Any]:
    return {
        "model": SERVED_MODEL,
        "input_ids": KNOWN_PROMPT_IDS,
        "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True},
    }


@dataclass
class Streams:
    """``workers`` threads each streaming one long request after another through the Service;
    every result kept. ``set_workers(n)`` lets the surplus finish their request and stop."""

    url: str
    tokens: int
    results: list[tuple[float, float, bool, str]] = field(default_factory=list)
    workers: int = 0
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _run(self, index: int) -> None:
        while index < self.workers:
            started = time.monotonic()
            try:
                answer = stream_generate(self.url, body(self.tokens), timeout=STREAM_TIMEOUT)
                got = len(answer.output_ids)
                ok = answer.status == 200 and not answer.errors and got >= self.tokens
                detail = f"HTTP {answer.status}, {got} tokens, errors {answer.errors}"
            except Exception as exc:  # a reset stream is a failed request
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.results.append((started, time.monotonic(), ok, detail))

    def set_workers(self, count: int) -> None:
        old, self.workers = self.workers, count
        for index in range(old, count):
            thread = threading.Thread(target=self._run, args=(index,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self) -> None:
        self.workers = 0
        for thread in self._threads:
            thread.join(240)

    def in_flight_during(self, start: float, end: float) -> list[tuple[float, float, bool, str]]:
        with self._lock:
            return [r for r in self.results if r[0] < end and r[1] > start]


def rolescale(world: World, ns: str) -> dict[str, Any]:
    found = world.get("rolescale", SCALE, ns)
    assert found is not None, f"no RoleScale {SCALE}"
    return found


def verified_replicas(world: World, ns: str) -> int:
    return int((rolescale(world, ns).get("status") or {}).get("replicas") or 0)


def pod_names(world: World, ns: str) -> set[str]:
    """The decode engine pods now running (not terminating)."""
    return {p["metadata"]["name"] for p in engine_pods(world, ns, MD, "decode")}


def created_decode_pods(world: World, ns: str) -> set[str]:
    """Every decode engine pod a ReplicaSet of this ModelDeployment created in the namespace
    (their ``SuccessfulCreate`` Events)."""
    names = {
        e["message"].removeprefix("Created pod: ")
        for e in events(world, ns, "SuccessfulCreate")
        if e.get("involvedObject", {}).get("kind") == "ReplicaSet"
    }
    return {n for n in names if n.startswith(f"{MD}-") and "-decode-" in n}


def wait_verified(world: World, ns: str, want: int, timeout: float, what: str) -> float:
    started = time.monotonic()
    deadline_loop(
        what,
        lambda: (
            verified_replicas(world, ns) == want
            and len(engine_pods(world, ns, MD, "decode")) == want
        ),
        timeout,
        details=lambda: (
            json.dumps(rolescale(world, ns), default=str)[:2000] + "\n" + md_story(world, MD, ns)
        ),
    )
    return time.monotonic() - started


def parse_rfc3339(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_decode_scales_out_verified_and_back_in_drained_with_no_failed_stream(
    world: World, prometheus: Prometheus, metrics_adapter: PrometheusAdapter, namespace: str
) -> None:
    ns = namespace
    world.apply(autoscaled_md(), namespace=ns)
    wait_md_ready(world, MD, ns, REVISION_DEADLINE)
    scale = deadline_loop(
        "the RoleScale created", lambda: world.get("rolescale", SCALE, ns), EVENT_DEADLINE
    )
    assert scale["spec"]["replicas"] == 1
    assert scale["spec"]["minReplicas"] == 1 and scale["spec"]["maxReplicas"] == 3

    # 1. kubectl scale, within the bounds and above them; kubectl get shows both counts.
    too_many = world.kubectl("scale", "rolescale", SCALE, "--replicas=4", f"-n={ns}", check=False)
    assert too_many.returncode != 0
    assert "replicas 4 is above maxReplicas 3" in too_many.stderr, too_many.stderr
    assert "spec.decode.autoscaling.maxReplicas" in too_many.stderr, too_many.stderr
    world.kubectl("scale", "rolescale", SCALE, "--replicas=2", f"-n={ns}")
    wait_verified(
        world,
        ns,
        want=2,
        timeout=ROLE_SCALE_DEADLINE,
        what="2 verified decode engines after kubectl scale",
    )
    table = world.kubectl("get", "rolescale", f"-n={ns}").stdout
    print(table)
    header, row = table.splitlines()[:2]
    assert header.split()[:7] == [
        "NAME", "DEPLOYMENT", "ROLE", "DESIRED", "RUNNING", "VERIFIED", "MIN"
    ]  # fmt: skip
    assert row.split()[:6] == [SCALE, MD, "decode", "2", "2", "2"], table

    # 2. A rollout while scaled out starts the new revision at the current count.
    before = (world.get_md(MD, ns) or {})["status"]["servingRevision"]
    changed = autoscaled_md()
    changed["spec"]["decode"]["memFractionStatic"] = 0.84
    world.apply(changed, namespace=ns)
    target = deadline_loop(
        "the new revision to be the target",
        lambda: (
            (t := (world.get_md(MD, ns) or {}).get("status", {}).get("targetRevision")) != before
            and t
        ),
        EVENT_DEADLINE,
    )
    created = deadline_loop(
        "the new revision's decode Deployment",
        lambda: world.get("deployment", f"{MD}-{target}-decode", ns),
        PASS_DEADLINE,
    )
    assert created["spec"]["replicas"] == 2, created["spec"]
    deadline_loop(
        "the new revision serving",
        lambda: (world.get_md(MD, ns) or {}).get("status", {}).get("servingRevision") == target,
        REVISION_DEADLINE,
        details=lambda: md_story(world, MD, ns),
    )
    wait_verified(
        world, ns, want=2, timeout=POD_GONE_DEADLINE, what="the old revision's decode engines gone"
    )
    # Back to 1 by kubectl: an engine without traffic drains at once.
    world.kubectl("scale", "rolescale", SCALE, "--replicas=1", f"-n={ns}")
    wait_verified(
        world,
        ns,
        want=1,
        timeout=POD_GONE_DEADLINE,
        what="1 decode engine after kubectl scale down",
    )
    idle_drains = {e["message"] for e in events(world, ns, "EngineDrained")}
    assert len(idle_drains) == 1, idle_drains

    url = world.service_url(MD, ns) + "/generate"
    first = deadline_loop(
        "a streamed request through the Service",
        lambda: (a := stream_generate(url, body(8), timeout=GENERATE_TIMEOUT)).status == 200 and a,
        STEP_DEADLINE,
        retry_on=(OSError,),
    )
    assert len(first.output_ids) == 8, first.raw[:500]
    tokens = STREAM_TOKENS
    streams = Streams(url, tokens)
    with InvariantSampler(world.cluster, ns, name="autoscaling") as sampler:
        # 3. Load: 3 streams at once on 1 engine -> the HPA asks for 3.
        streams.set_workers(3)
        seen: list[Any] = []

        def running() -> bool:
            values = metrics_adapter.pod_metrics(ns, METRIC, "kvgate.io/role=decode")
            seen[:] = [values]
            return sum(values.values()) >= 3

        def running_story() -> str:
            series = prometheus.query(f'sglang:num_running_reqs{{namespace="{ns}"}}')
            return (
                f"adapter: {seen}\nprometheus: {series}\nstreams: {streams.results[-5:]}\n"
                + metrics_adapter.log_tail(10)
            )

        deadline_loop(
            "3 streams running on the decode engines, as the HPA reads them",
            running,
            METRICS_DEADLINE,
            retry_on=(Exception,),
            details=running_story,
        )
        world.apply(hpa(ns), namespace=ns)
        # The HPA controller writes the scale first and its own status after: wait for both.
        scaled_at = deadline_loop(
            "the HPA to set the RoleScale to 3 and record when",
            lambda: (
                rolescale(world, ns)["spec"]["replicas"] == 3
                and world.get("hpa", SCALE, ns).get("status", {}).get("lastScaleTime")
            ),
            HPA_UP_DEADLINE,
            details=lambda: json.dumps(world.get("hpa", SCALE, ns), default=str)[:3000],
        )
        decided = parse_rfc3339(scaled_at)
        wait_verified(
            world,
            ns,
            want=3,
            timeout=HPA_SCALE_OUT_DEADLINE,
            what="3 verified decode engines after the HPA's scale-up",
        )
        up_seconds = time.time() - decided

        # 4. One stream left: the HPA goes back to 1 while requests stream; kvgate drains.
        gone_before = created_decode_pods(world, ns) - pod_names(world, ns)
        down_started = time.monotonic()
        streams.set_workers(1)
        deadline_loop(
            "the HPA to set the RoleScale to 1",
            lambda: rolescale(world, ns)["spec"]["replicas"] == 1,
            HPA_DOWN_DEADLINE,
            details=lambda: json.dumps(world.get("hpa", SCALE, ns), default=str)[:3000],
        )
        wait_verified(
            world, ns, want=1, timeout=DRAINS_DEADLINE, what="1 decode engine after the drains"
        )
        down_ended = time.monotonic()
        removed = created_decode_pods(world, ns) - gone_before - pod_names(world, ns)
        streams.stop()
    assert sampler.stats.samples > 0

    in_flight = streams.in_flight_during(down_started, down_ended)
    failed = [r for r in streams.results if not r[2]]
    assert failed == [], failed
    assert len(in_flight) >= 3, in_flight  # the two finishing, and at least one still streaming
    drained = [e for e in events(world, ns, "EngineDrained") if e["message"] not in idle_drains]
    messages = [e["message"] for e in drained]
    # Every engine removed during the scale-down was drained, and announced, exactly once: the
    # two of the three, and any the HPA started in between (it may scale back up while the two
    # finishing streams end: each such engine is drained in its turn).
    announced = Counter(m.split()[2] for m in messages)  # "decode pod <name> drained in …"
    assert len(removed) >= 2 and removed <= set(announced), (removed, messages)
    assert set(announced.values()) == {1}, messages  # an Event on the transition only
    if len(removed) > 2:
        print(f"the HPA scaled back up during the scale-down: {len(removed)} engines drained")
    seconds = []
    for message in messages:
        assert "(0 running, 0 queued, 0 in the KV transfer queues)" in message, message
        seconds.append(float(re.search(r"drained in ([0-9.]+) s", message).group(1)))  # type: ignore[union-attr]
    assert events(world, ns, "DrainTimedOut") == []
    for event in drained:
        print(f"EngineDrained: {event['message']}")
    scraped = operator_metrics(world)
    count = metric_value(scraped, "kvgate_scale_down_drains_total", role="decode", result="drained")
    # At least this test's three drains: the series has no ModelDeployment label, and any
    # ModelDeployment whose serving revision loses replicas drains too (a shared world).
    assert count is not None and count >= 3, count
    print(
        f"\nMEASURED autoscaling: HPA decision -> 3 verified decode engines serving "
        f"{up_seconds:.1f}s; drains {', '.join(f'{s:.1f}s' for s in sorted(seconds))}; "
        f"{len(in_flight)} streams in flight during the scale-down "
        f"({down_ended - down_started:.1f}s), {len(failed)} failed; "
        f"{len(streams.results)} streams of {tokens} tokens in all"
    )
