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
from dataclasses import dataclass
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
# How long a wait for an alert to fire or resolve may take before the test gives up: a deadline,
# not the bound (each assertion checks the measured seconds against Bounds); 60 s is past any
# Bounds value a run has measured (the largest slack measured is in docs/benchmarks.md), so only
# an alert that never comes reaches it.
ALERT_WAIT = 60.0
# A gate's lastTransitionTime has 1 s resolution: a cause read from it may be up to 1 s early.
GATE_TIME_RESOLUTION = 1.0
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


def shorten_verify_timeout(world: World, ns: str) -> float:
    """The Ready ModelDeployment's rollout.verifyTimeoutSeconds down to VERIFY_TIMEOUT, seen by
    the operator (observedGeneration) and still serving the same revision; the seconds from the
    write to the status showing it (the operator's reaction on this machine now)."""
    before = world.get_md(MD, ns) or {}
    serving = (before.get("status") or {}).get("servingRevision")
    written = time.monotonic()
    world.apply(alerts_md(), namespace=ns)

    def seen() -> dict[str, Any] | None:
        md = world.get_md(MD, ns) or {}
        generation = (md.get("metadata") or {}).get("generation")
        ready = md_condition(world, MD, ns, "Ready") or {}
        return md if ready.get("observedGeneration") == generation and is_ready(md) else None

    md = poll_until(
        "the operator to see the shorter verify timeout",
        seen,
        60,  # a deadline, not the bound: the reaction is measured here and bounds the alerts
        period=0.1,
        details=lambda: md_story(world, MD, ns),
    )
    reaction = time.monotonic() - written
    assert (md.get("status") or {}).get("servingRevision") == serving, md.get("status")
    return measured("spec write -> the operator's status showing it", reaction)


def rfc3339_seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def gate_changed_at(pod: dict[str, Any]) -> float:
    gate = condition(pod, GATE)
    assert gate is not None, pod["metadata"]["name"]
    return rfc3339_seconds(gate["lastTransitionTime"])


def engine_usage(world: World, pod: dict[str, Any]) -> float:
    """The engine's own ``sglang:num_used_tokens`` / ``sglang:max_total_num_tokens``."""
    with urllib.request.urlopen(f"{world.engine_url(pod)}/metrics", timeout=5) as answer:  # polled
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


@dataclass(frozen=True)
class Bounds:
    """Each alert's bound from what this run measured: one scrape and one evaluation
    (``INTERVAL`` each) plus ``slack``: the operator's reaction to a spec change measured at the
    start (twice: a pass may have begun just before the cause), how late Prometheus' own scrapes
    and evaluations ran so far (``Prometheus.cadence``, read at each check), and the gate times'
    resolution. Nothing here is a guess of the machine's speed: a slower machine measures more."""

    prometheus: Prometheus
    reaction: float  # seconds from a spec write to the operator's status showing it
    first_ready: float  # seconds from the first apply to the ModelDeployment Ready

    @property
    def revision_start(self) -> float:
        """A deadline for engines to start, verify (or be refused) and serve: twice what the
        first revision took in this run (router included, which later revisions reuse)."""
        return 2 * self.first_ready

    def slack(self) -> float:
        cadence = self.prometheus.cadence()
        return 2 * self.reaction + cadence.lateness + GATE_TIME_RESOLUTION

    def fire(self) -> float:
        """`for:` + one scrape + one evaluation after the cause."""
        return FOR_SECONDS + 2 * INTERVAL + self.slack()

    def resolve(self) -> float:
        """One scrape + one evaluation after the cause went."""
        return 2 * INTERVAL + self.slack()


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
        5,  # the record exists once wait_resolved returned; this covers the query's last step
    )
    return resolved - cause_gone


def headroom_fires(prometheus: Prometheus, world: World, ns: str, bounds: Bounds) -> None:
    """Both engines verified on the capped node (pool / context 1.07 < 1.1): from each gate's
    turn to True (kvgate sets the ratio at that verdict) to KvgateEngineHeadroomLow firing."""
    for pod in engine_pods(world, ns, MD):
        name = pod["metadata"]["name"]
        seconds = fired_after(
            prometheus,
            "KvgateEngineHeadroomLow",
            {"namespace": ns, "pod": name},
            gate_changed_at(pod),
            ALERT_WAIT,
        )
        measured(f"headroom low {pod['metadata']['labels']['kvgate.io/role']} -> firing", seconds)
        assert seconds <= (bound := bounds.fire()), (name, seconds, bound)
    ratio = prometheus.query(f'kvgate_engine_headroom_ratio{{namespace="{ns}"}}')
    assert {round(s.value, 3) for s in ratio} == {round(POOL_CAP / CONTEXT, 3)}, ratio


def kv_usage_fires_and_resolves(
    prometheus: Prometheus, world: World, ns: str, bounds: Bounds
) -> None:
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
            # The decode reserves a request's pages whole when it admits it: the deadline is the
            # first request's 2,000-token prefill and handoff, well under one REQUEST_TIMEOUT.
            90,
            period=0.1,
        )
        measured("load start -> decode KV usage > 80 %", over - started)
        seconds = fired_after(prometheus, "KvgateEngineKvUsageHigh", labels, over, ALERT_WAIT)
        measured("KV usage > 80 % -> KvgateEngineKvUsageHigh firing", seconds)
    assert seconds <= (bound := bounds.fire()), (seconds, bound)
    measured(f"the longest of the load's {len(load.seconds)} requests", max(load.seconds))
    assert load.answers and set(load.answers) == {200}, (load.answers, load.errors)
    seconds = resolved_after(prometheus, "KvgateEngineKvUsageHigh", labels, load.ended, ALERT_WAIT)
    measured("load's last answer -> KvgateEngineKvUsageHigh resolved", seconds)
    assert seconds <= (bound := bounds.resolve()), (seconds, bound)


def refused_rollout_fires(prometheus: Prometheus, world: World, ns: str, bounds: Bounds) -> float:
    """A revision advertising more context than the capped pool is refused; the spec put back
    is the cause gone. Returns when the refusal was seen."""
    quiet(prometheus, "KvgateRolloutRefused", ns)
    world.apply(alerts_md(REFUSED_CONTEXT), namespace=ns)
    poll_until(
        "the refused revision in the ModelDeployment's status",
        lambda: ((world.get_md(MD, ns) or {}).get("status") or {}).get("refusedRevision"),
        bounds.revision_start,
        details=lambda: md_story(world, MD, ns),
    )
    refused_at = time.time()
    labels = {"namespace": ns, "deployment": MD, "reason": "EngineUnsafe"}  # the pool check
    seconds = fired_after(prometheus, "KvgateRolloutRefused", labels, refused_at, ALERT_WAIT, 0.0)
    measured("rollout refused (seen in status) -> KvgateRolloutRefused firing", seconds)
    assert seconds <= (bound := bounds.resolve()), (seconds, bound)  # no `for:`
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

    # Each try sends one known-answer request (at most 10 s); the first decode after the
    # corruption trips the canary, so the deadline allows nine tries.
    pod = poll_until(f"{name}'s gate KvCanaryViolation", tripped, 90, period=0.5)
    return pod, gate_changed_at(pod)


def canary_and_unverified_fire_and_resolve(
    prometheus: Prometheus, world: World, ns: str, refused_at: float, bounds: Bounds
) -> None:
    """A KV canary violation fires KvgateKvCanaryViolation at once; the tripped pod, out of
    traffic, fires KvgateEngineUnverified once unverified longer than verifyTimeoutSeconds, and
    resolves when it is deleted. The refusal's alert resolves meanwhile, after its window."""
    quiet(prometheus, "KvgateKvCanaryViolation", ns)
    quiet(prometheus, "KvgateEngineUnverified", ns)
    pod, gate_false = corrupt_decode(world, ns)
    name = pod["metadata"]["name"]
    labels = {"namespace": ns, "pod": name}
    seconds = fired_after(
        prometheus, "KvgateKvCanaryViolation", labels, gate_false, ALERT_WAIT, 0.0
    )
    measured("canary violation (gate False) -> KvgateKvCanaryViolation firing", seconds)
    assert seconds <= (bound := bounds.resolve()), (seconds, bound)  # no `for:`
    seconds = resolved_after(
        prometheus,
        "KvgateRolloutRefused",
        {"namespace": ns, "deployment": MD},
        refused_at,
        WINDOW_SECONDS + ALERT_WAIT,
    )
    measured("rollout refused -> KvgateRolloutRefused resolved (window 20 s)", seconds)
    slack = bounds.slack()
    assert WINDOW_SECONDS - slack <= seconds <= WINDOW_SECONDS + 2 * INTERVAL + slack, (
        seconds,
        slack,
    )
    seconds = fired_after(
        prometheus, "KvgateEngineUnverified", labels, gate_false, VERIFY_TIMEOUT + ALERT_WAIT
    )
    measured("gate False -> KvgateEngineUnverified firing (verifyTimeoutSeconds 30)", seconds)
    # Not before the deadline and its `for:`, and within one scrape and evaluation after it.
    bound = VERIFY_TIMEOUT + bounds.fire()
    assert VERIFY_TIMEOUT + FOR_SECONDS - GATE_TIME_RESOLUTION <= seconds <= bound, (seconds, bound)
    world.kubectl("delete", "pod", name, f"--namespace={ns}", "--wait=false")
    deleted = time.time()
    seconds = resolved_after(prometheus, "KvgateEngineUnverified", labels, deleted, ALERT_WAIT)
    measured("tripped pod deleted -> KvgateEngineUnverified resolved", seconds)
    assert seconds <= (bound := bounds.resolve()), (seconds, bound)
    seconds = resolved_after(
        prometheus, "KvgateKvCanaryViolation", labels, gate_false, WINDOW_SECONDS + ALERT_WAIT
    )
    measured("canary violation -> KvgateKvCanaryViolation resolved (window 20 s)", seconds)
    assert seconds <= (bound := WINDOW_SECONDS + bounds.resolve()), (seconds, bound)


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
        first = time.monotonic()
        # The first revision's deadline: a cold start of the router and both engines under
        # FIRST_VERIFY_TIMEOUT; what it took bounds the later waits (Bounds.revision_start).
        wait_md_ready(world, MD, ns, FIRST_VERIFY_TIMEOUT)
        ready = measured("apply -> the first revision Ready", time.monotonic() - first)
        bounds = Bounds(prometheus, shorten_verify_timeout(world, ns), ready)
        # The chart's PodMonitor finds the engines on their http port, the routers' monitor smg.
        for job in ("kvgate-system/kvgate-engines", "kvgate-system/kvgate-routers"):
            wait_scraped(prometheus, f'up{{job="{job}",namespace="{ns}"}} == 1', ALERT_WAIT)
        headroom_fires(prometheus, world, ns, bounds)
        kv_usage_fires_and_resolves(prometheus, world, ns, bounds)
        refused_at = refused_rollout_fires(prometheus, world, ns, bounds)
        canary_and_unverified_fire_and_resolve(prometheus, world, ns, refused_at, bounds)
    for pod in engine_pods(world, ns, MD):
        world.kubectl("delete", "pod", pod["metadata"]["name"], f"--namespace={ns}", "--wait=false")
    deleted = time.time()
    seconds = resolved_after(
        prometheus, "KvgateEngineHeadroomLow", {"namespace": ns}, deleted, ALERT_WAIT
    )
    measured("capped engines deleted (cap lifted) -> KvgateEngineHeadroomLow resolved", seconds)
    assert seconds <= (bound := bounds.resolve()), (seconds, bound)
    wait_known_answer(
        world, MD, ns, bounds.revision_start, "the replaced engines serving through the router"
    )
    print(f"Ready condition at the end: {md_condition(world, MD, ns, 'Ready')}")
    assert not [a for a in prometheus.alerts() if a.labels.get("namespace") == ns]
    measured("alerts scenario", time.monotonic() - started)
