"""kvgate's alerts fire and resolve in a real Prometheus, from real metrics.

The world's Prometheus (``kvgate_e2e.prometheus``, the ``prometheus`` fixture) scrapes what the
chart's monitors select and evaluates the chart's PrometheusRule, rendered with short ``for:``
values (PROMETHEUS_RULE_VALUES); alerts are read from ``ALERTS`` (no Alertmanager).

Run: ``KVGATE_REQUIRE_E2E=1 .venv/bin/pytest -q -s e2e/tests/test_alerts_fire.py`` (root).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import urllib.request
from datetime import datetime
from typing import Any

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.polling import poll_until
from kvgate_e2e.prometheus import Prometheus, wait_scraped
from kvgate_e2e.world import (
    ALERTS_NODE,
    ALERTS_POOL,
    OPERATOR_NAMESPACE,
    World,
    condition,
    http_json,
    is_ready,
)
from scenario_helpers import (
    GATE,
    SERVED_MODEL,
    engine_pods,
    known_answer,
    md_condition,
    md_story,
    node_pool_capped,
    sample_md,
    wait_known_answer,
    wait_md_ready,
)

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
INTERVAL = 1.0  # the fixture's scrape and evaluation interval
PROMETHEUS_RULE_VALUES = {
    "headroomFor": "2s",
    "kvUsageFor": "2s",
    "unverifiedFor": "2s",
    "refusedRolloutWindow": "20s",
    "kvCanaryWindow": "20s",
}


def test_the_charts_service_monitor_scrapes_the_operator_and_the_webhook(
    world: World, prometheus: Prometheus
) -> None:
    """Both metrics Services of the release are targets, up, with ``<namespace>/<Service>`` as
    ``job`` (what the rules read: no tenant's monitor produces it); the operator's series carry
    the target's namespace and pod unless they name an engine pod's (the ServiceMonitor puts
    those back from exported_*, test_alerts_fire's alerts name the engine pods), and the
    webhook's are there."""
    leader = wait_scraped(prometheus, f'kvgate_leader{{namespace="{OPERATOR_NAMESPACE}"}} == 1')
    assert leader[0].labels["job"] == f"{OPERATOR_NAMESPACE}/kvgate-metrics", leader
    assert not any(k.startswith("exported_") for k in leader[0].labels), leader
    webhook = wait_scraped(
        prometheus, f'up{{job="{OPERATOR_NAMESPACE}/kvgate-webhook-metrics"}} == 1'
    )
    assert webhook[0].labels["namespace"] == OPERATOR_NAMESPACE, webhook


# ---------------------------------------------------------------------------- the scenario
MD = "alerts"
CONTEXT = 16_384
POOL_CAP = 17_500  # the node's cap: headroom 17,500 / 16,384 = 1.07 < 1.1, and it verifies
REFUSED_CONTEXT = 32_768  # above the capped pool: the revision is refused KvPoolTooSmall
VERIFY_TIMEOUT = 30  # rollout.verifyTimeoutSeconds: KvgateEngineUnverified's deadline
# The first revision's deadline: a loaded machine once took over 30 s to start its router, which
# refused the revision before any alert was looked at. Rollout settings are not part of the
# revision, so the spec then moves to VERIFY_TIMEOUT without a rollout.
FIRST_VERIFY_TIMEOUT = 300
FOR_SECONDS = 2.0  # every `for:` of PROMETHEUS_RULE_VALUES
WINDOW_SECONDS = 20.0  # refusedRolloutWindow and kvCanaryWindow
# What the test adds to Prometheus' own latency: its 0.2 s polling, the query through the relay,
# the gate times' 1 s resolution, a loaded 2-core machine.
SLACK = 3.0
FIRE_BOUND = FOR_SECONDS + 2 * INTERVAL + SLACK  # `for:` + one scrape + one evaluation
# The load: each request reserves prompt + max_new_tokens = 15,000 of the decode's 17,500 pages
# (86 %) for its whole decode; two clients, so one always waits for the other's pages.
LOAD_PROMPT, LOAD_NEW_TOKENS, LOAD_CLIENTS = 2_000, 13_000, 2
# A request may wait for the other's whole decode, then decode its own: on a loaded 2-core machine
# the two can take well over 120 s (alone, the longer takes ~20 s). A failed request's error and
# every request's seconds are kept (Load.errors, Load.seconds) for the failure message.
REQUEST_TIMEOUT = 300


def alerts_md(context: int = CONTEXT, verify_timeout: int = VERIFY_TIMEOUT) -> dict[str, Any]:
    md = sample_md(MD, pool=ALERTS_POOL)
    md["spec"]["model"]["contextLength"] = context
    md["spec"]["safety"]["kvCanary"] = True
    md["spec"]["rollout"]["verifyTimeoutSeconds"] = verify_timeout
    return md


def shorten_verify_timeout(world: World, ns: str) -> None:
    """The Ready ModelDeployment's rollout.verifyTimeoutSeconds down to VERIFY_TIMEOUT, seen by
    the operator (observedGeneration) and still serving the same revision."""
    before = world.get_md(MD, ns) or {}
    serving = (before.get("status") or {}).get("servingRevision")
    world.apply(alerts_md(), namespace=ns)

    def seen() -> dict[str, Any] | None:
        md = world.get_md(MD, ns) or {}
        generation = (md.get("metadata") or {}).get("generation")
        ready = md_condition(world, MD, ns, "Ready") or {}
        return md if ready.get("observedGeneration") == generation and is_ready(md) else None

    md = poll_until(
        "the operator to see the shorter verify timeout",
        seen,
        60,
        details=lambda: md_story(world, MD, ns),
    )
    assert (md.get("status") or {}).get("servingRevision") == serving, md.get("status")


def rfc3339_seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def gate_changed_at(pod: dict[str, Any]) -> float:
    gate = condition(pod, GATE)
    assert gate is not None, pod["metadata"]["name"]
    return rfc3339_seconds(gate["lastTransitionTime"])


def engine_usage(world: World, pod: dict[str, Any]) -> float:
    """The engine's own ``sglang:num_used_tokens`` / ``sglang:max_total_num_tokens``."""
    with urllib.request.urlopen(f"{world.engine_url(pod)}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    values = dict(re.findall(r"^(sglang:\w+)\{[^}]*\} (\S+)$", text, re.M))
    return float(values["sglang:num_used_tokens"]) / float(values["sglang:max_total_num_tokens"])


class Load:
    """LOAD_CLIENTS clients sending long requests through the router until stopped; ``ended``
    is when the last one came back."""

    def __init__(self, world: World, ns: str) -> None:
        self.world, self.ns = world, ns
        self.stop = threading.Event()
        self.answers: list[int] = []
        self.errors: list[str] = []  # the requests that got no HTTP answer: how long, what
        self.seconds: list[float] = []  # every request's
        self.ended = 0.0
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def _run(self) -> None:
        body = {
            "model": SERVED_MODEL,
            "input_ids": [(i % 30_000) + 1_000 for i in range(LOAD_PROMPT)],
            "sampling_params": {"max_new_tokens": LOAD_NEW_TOKENS, "temperature": 0},
        }
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                code, _ = self.world.router_request(MD, body, self.ns, timeout=REQUEST_TIMEOUT)
            except OSError as exc:
                code = 0
                self.errors.append(f"{time.monotonic() - sent:.1f}s: {type(exc).__name__}: {exc}")
            self.answers.append(code)
            self.seconds.append(time.monotonic() - sent)
        self.ended = max(self.ended, time.time())

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(2 * REQUEST_TIMEOUT)


def measured(what: str, seconds: float) -> float:
    print(f"MEASURED {what}: {seconds:.1f}s")
    return seconds


def quiet(prometheus: Prometheus, alert: str, ns: str) -> None:
    """Before its cause: ``alert`` is neither pending nor firing for the namespace."""
    active = [a for a in prometheus.alerts() if a.matches(alert, {"namespace": ns})]
    assert active == [], active


def fired_after(
    prometheus: Prometheus,
    alert: str,
    labels: dict[str, str],
    cause: float,
    deadline: float,
    for_seconds: float = FOR_SECONDS,
) -> float:
    """Seconds from ``cause`` (Unix time) to ``alert`` firing with ``labels``: Prometheus' own
    ``activeAt`` (the evaluation that found it true) plus its ``for:``."""
    prometheus.wait_firing(alert, labels, deadline)
    active = prometheus.active_since(alert, labels)
    assert active is not None, (alert, labels)
    return active + for_seconds - cause


def resolved_after(
    prometheus: Prometheus, alert: str, labels: dict[str, str], cause_gone: float, deadline: float
) -> float:
    """Seconds from ``cause_gone`` (Unix time) to no ``alert`` with ``labels`` in ``ALERTS``,
    by Prometheus' own record (the evaluation after which it was gone)."""
    prometheus.wait_resolved(alert, labels, deadline)
    resolved: float = poll_until(
        f"Prometheus' record of {alert} resolving",
        lambda: prometheus.resolved_at(alert, labels, cause_gone),
        5,
    )
    return resolved - cause_gone


def headroom_fires(prometheus: Prometheus, world: World, ns: str) -> None:
    """Both engines verified on the capped node (pool / context 1.07 < 1.1): from each gate's
    turn to True (kvgate sets the ratio at that verdict) to KvgateEngineHeadroomLow firing."""
    for pod in engine_pods(world, ns, MD):
        name = pod["metadata"]["name"]
        seconds = fired_after(
            prometheus,
            "KvgateEngineHeadroomLow",
            {"namespace": ns, "pod": name},
            gate_changed_at(pod),
            60,
        )
        measured(f"headroom low {pod['metadata']['labels']['kvgate.io/role']} -> firing", seconds)
        assert seconds <= FIRE_BOUND, (name, seconds)
    ratio = prometheus.query(f'kvgate_engine_headroom_ratio{{namespace="{ns}"}}')
    assert {round(s.value, 3) for s in ratio} == {round(POOL_CAP / CONTEXT, 3)}, ratio


def kv_usage_fires_and_resolves(prometheus: Prometheus, world: World, ns: str) -> None:
    """Long requests through the router hold > 80 % of the decode's verified pool: from the
    engine's own /metrics first showing it to KvgateEngineKvUsageHigh firing; from the load's
    last answer to resolved."""
    (decode,) = engine_pods(world, ns, MD, "decode")
    labels = {"namespace": ns, "pod": decode["metadata"]["name"], "role": "decode"}
    quiet(prometheus, "KvgateEngineKvUsageHigh", ns)
    with Load(world, ns) as load:
        started = time.time()
        over = poll_until(
            "the decode engine's own KV usage above 80 %",
            lambda: engine_usage(world, decode) > 0.8 and time.time(),
            90,
            period=0.1,
        )
        measured("load start -> decode KV usage > 80 %", over - started)
        seconds = fired_after(prometheus, "KvgateEngineKvUsageHigh", labels, over, 60)
        measured("KV usage > 80 % -> KvgateEngineKvUsageHigh firing", seconds)
    assert seconds <= FIRE_BOUND, seconds
    measured(f"the longest of the load's {len(load.seconds)} requests", max(load.seconds))
    assert load.answers and set(load.answers) == {200}, (load.answers, load.errors)
    seconds = resolved_after(prometheus, "KvgateEngineKvUsageHigh", labels, load.ended, 30)
    measured("load's last answer -> KvgateEngineKvUsageHigh resolved", seconds)
    assert seconds <= 2 * INTERVAL + SLACK, seconds


def refused_rollout_fires(prometheus: Prometheus, world: World, ns: str) -> float:
    """A revision advertising more context than the capped pool is refused; the spec put back
    is the cause gone. Returns when the refusal was seen."""
    quiet(prometheus, "KvgateRolloutRefused", ns)
    world.apply(alerts_md(REFUSED_CONTEXT), namespace=ns)
    poll_until(
        "the refused revision in the ModelDeployment's status",
        lambda: ((world.get_md(MD, ns) or {}).get("status") or {}).get("refusedRevision"),
        120,
        details=lambda: md_story(world, MD, ns),
    )
    refused_at = time.time()
    labels = {"namespace": ns, "deployment": MD, "reason": "EngineUnsafe"}  # the pool check
    seconds = fired_after(prometheus, "KvgateRolloutRefused", labels, refused_at, 30, 0.0)
    measured("rollout refused (seen in status) -> KvgateRolloutRefused firing", seconds)
    assert seconds <= 2 * INTERVAL + SLACK, seconds
    world.apply(alerts_md(), namespace=ns)
    return refused_at


def corrupt_decode(world: World, ns: str) -> tuple[dict[str, Any], float]:
    """The decode engine's next decode reads a corrupted KV slot: SGLang's canary logs the
    violation, kvgate turns the gate False. Returns the pod and when its gate turned."""
    (decode,) = engine_pods(world, ns, MD, "decode")
    name = decode["metadata"]["name"]
    code, answer = http_json(f"{world.engine_url(decode)}/kvgate/canary/corrupt", body={})
    assert code == 200, (code, answer)

    def tripped() -> dict[str, Any] | None:
        with contextlib.suppress(OSError):
            known_answer(world, MD, ns, timeout=10)  # makes it decode
        pod = world.get("pod", name, ns)
        gate = condition(pod, GATE) if pod else None
        return pod if gate and gate.get("reason") == "KvCanaryViolation" else None

    pod = poll_until(f"{name}'s gate KvCanaryViolation", tripped, 90, period=0.5)
    return pod, gate_changed_at(pod)


def canary_and_unverified_fire_and_resolve(
    prometheus: Prometheus, world: World, ns: str, refused_at: float
) -> None:
    """A KV canary violation fires KvgateKvCanaryViolation at once; the tripped pod, out of
    traffic, fires KvgateEngineUnverified once unverified longer than verifyTimeoutSeconds, and
    resolves when it is deleted. The refusal's alert resolves meanwhile, after its window."""
    quiet(prometheus, "KvgateKvCanaryViolation", ns)
    quiet(prometheus, "KvgateEngineUnverified", ns)
    pod, gate_false = corrupt_decode(world, ns)
    name = pod["metadata"]["name"]
    labels = {"namespace": ns, "pod": name}
    seconds = fired_after(prometheus, "KvgateKvCanaryViolation", labels, gate_false, 30, 0.0)
    measured("canary violation (gate False) -> KvgateKvCanaryViolation firing", seconds)
    assert seconds <= 2 * INTERVAL + SLACK, seconds
    seconds = resolved_after(
        prometheus,
        "KvgateRolloutRefused",
        {"namespace": ns, "deployment": MD},
        refused_at,
        WINDOW_SECONDS + 30,
    )
    measured("rollout refused -> KvgateRolloutRefused resolved (window 20 s)", seconds)
    assert WINDOW_SECONDS - SLACK <= seconds <= WINDOW_SECONDS + 2 * INTERVAL + SLACK, seconds
    seconds = fired_after(
        prometheus, "KvgateEngineUnverified", labels, gate_false, VERIFY_TIMEOUT + 40
    )
    measured("gate False -> KvgateEngineUnverified firing (verifyTimeoutSeconds 30)", seconds)
    # Not before the deadline and its `for:`, and within one scrape and evaluation after it.
    assert VERIFY_TIMEOUT + FOR_SECONDS - 1 <= seconds <= VERIFY_TIMEOUT + FIRE_BOUND, seconds
    world.kubectl("delete", "pod", name, f"--namespace={ns}", "--wait=false")
    deleted = time.time()
    seconds = resolved_after(prometheus, "KvgateEngineUnverified", labels, deleted, 30)
    measured("tripped pod deleted -> KvgateEngineUnverified resolved", seconds)
    assert seconds <= 2 * INTERVAL + SLACK, seconds
    seconds = resolved_after(
        prometheus, "KvgateKvCanaryViolation", labels, gate_false, WINDOW_SECONDS + 30
    )
    measured("canary violation -> KvgateKvCanaryViolation resolved (window 20 s)", seconds)
    assert seconds <= WINDOW_SECONDS + 2 * INTERVAL + SLACK, seconds


def test_kvgates_alerts_fire_from_real_metrics_and_resolve_when_the_cause_goes(
    world: World, namespace: str, prometheus: Prometheus
) -> None:
    """One ModelDeployment on a node of its own whose pool is capped just above the context:
    headroom low from the start, then KV usage under load, a refused rollout, a KV canary
    violation and the engine it leaves unverified past its deadline; each alert fires within
    its ``for:`` plus one scrape and evaluation of its cause and resolves when the cause goes.
    Finally the node's cap goes and the engines are replaced: headroom resolves."""
    ns = namespace
    started = time.monotonic()
    with node_pool_capped(world, ALERTS_NODE, POOL_CAP):
        world.apply(alerts_md(verify_timeout=FIRST_VERIFY_TIMEOUT), namespace=ns)
        wait_md_ready(world, MD, ns, 180)
        shorten_verify_timeout(world, ns)
        # The chart's PodMonitor finds the engines on their http port, the routers' monitor smg.
        for job in ("kvgate-system/kvgate-engines", "kvgate-system/kvgate-routers"):
            wait_scraped(prometheus, f'up{{job="{job}",namespace="{ns}"}} == 1', 60)
        headroom_fires(prometheus, world, ns)
        kv_usage_fires_and_resolves(prometheus, world, ns)
        refused_at = refused_rollout_fires(prometheus, world, ns)
        canary_and_unverified_fire_and_resolve(prometheus, world, ns, refused_at)
    for pod in engine_pods(world, ns, MD):
        world.kubectl("delete", "pod", pod["metadata"]["name"], f"--namespace={ns}", "--wait=false")
    deleted = time.time()
    seconds = resolved_after(prometheus, "KvgateEngineHeadroomLow", {"namespace": ns}, deleted, 60)
    measured("capped engines deleted (cap lifted) -> KvgateEngineHeadroomLow resolved", seconds)
    assert seconds <= 2 * INTERVAL + SLACK, seconds
    wait_known_answer(world, MD, ns, 120, "the replaced engines serving through the router")
    print(f"Ready condition at the end: {md_condition(world, MD, ns, 'Ready')}")
    assert not [a for a in prometheus.alerts() if a.labels.get("namespace") == ns]
    measured("alerts scenario", time.monotonic() - started)
