"""Prometheus metrics (units in the names), served on the operator's --metrics-port."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

_POD_LABELS = ("namespace", "deployment", "pod", "role")
PodSeries = tuple[str, str, str, str]  # the values of _POD_LABELS


class _PodGaugeTable(Collector):
    """Every per-engine-pod gauge in one table: series -> one value per gauge (None: unset).

    prometheus_client gives each labelled child of a Gauge its own objects (a metric instance, a
    value holder, two locks; ~0.7 KiB), so five gauges cost ~3.5 KiB per engine pod, 31 MiB at 9,000
    pods (the target: the operator within 300 MB at 1,000 ModelDeployments, docs/design/scale.md).
    Here a pod's five values share one list (~0.2 KiB). Exposition is the same: one gauge family per
    name.
    """

    def __init__(self) -> None:
        self._docs: list[tuple[str, str]] = []
        self._values: dict[PodSeries, list[float | None]] = {}

    def gauge(self, name: str, documentation: str) -> _PodGauge:
        self._docs.append((name, documentation))
        return _PodGauge(self, len(self._docs) - 1, name)

    def set(self, series: PodSeries, column: int, value: float) -> None:
        row = self._values.get(series)
        if row is None:
            row = self._values[series] = [None] * len(self._docs)
        row[column] = float(value)

    def unset(self, series: PodSeries, column: int) -> None:
        row = self._values.get(series)
        if row is not None:
            row[column] = None

    def forget(self, series: PodSeries) -> None:
        self._values.pop(series, None)

    def forget_md(self, namespace: str, deployment: str) -> None:
        for series in [s for s in self._values if s[:2] == (namespace, deployment)]:
            del self._values[series]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rows = list(self._values.items())
        for column, (name, documentation) in enumerate(self._docs):
            family = GaugeMetricFamily(name, documentation, labels=_POD_LABELS)
            for series, row in rows:
                value = row[column]
                if value is not None:
                    family.add_metric(series, value)
            yield family


class _PodGauge:
    """One gauge of the table, used like a labelled Gauge: ``labels(*series).set(value)``."""

    def __init__(self, table: _PodGaugeTable, column: int, name: str) -> None:
        self._table, self._column = table, column
        # As prometheus_client's metrics name them (the chart's alert-rule tests read these).
        self._name, self._labelnames = name, _POD_LABELS

    def labels(self, namespace: str, deployment: str, pod: str, role: str) -> _PodGaugeChild:
        return _PodGaugeChild(self._table, self._column, (namespace, deployment, pod, role))


class _PodGaugeChild:
    def __init__(self, table: _PodGaugeTable, column: int, series: PodSeries) -> None:
        self._table, self._column, self._series = table, column, series

    def set(self, value: float) -> None:
        self._table.set(self._series, self._column, value)

    def unset(self) -> None:
        """No sample for this series of this gauge (the pod's other gauges stay)."""
        self._table.unset(self._series, self._column)


_PER_POD = _PodGaugeTable()

KV_POOL_TOKENS = _PER_POD.gauge(
    "kvgate_engine_kv_pool_tokens",
    "KV pool of the engine's live engine, tokens (minimum over DP ranks).",
)
HEADROOM_RATIO = _PER_POD.gauge(
    "kvgate_engine_headroom_ratio",
    "KV pool tokens / context length of the engine pod (must be >= safety.headroom).",
)
CONTEXT_LENGTH_TOKENS = Gauge(
    "kvgate_context_length_tokens",
    "Advertised context window of the ModelDeployment's current spec, tokens.",
    ("namespace", "deployment"),
    registry=REGISTRY,
)
LAST_VERIFIED = _PER_POD.gauge(
    "kvgate_engine_last_verified_timestamp_seconds",
    "Unix time of the engine pod's last Safe verdict; for a pod this operator process has not "
    "verified yet, the time it started watching it (so the age is never overstated).",
)
REVERIFY_INTERVAL = _PER_POD.gauge(
    "kvgate_engine_reverify_interval_seconds",
    "How often the engine pod's live engine is re-verified, seconds.",
)
POD_READY = _PER_POD.gauge(
    "kvgate_engine_pod_ready",
    "1 when the engine pod's Ready condition is True (it serves: it is in its Service's "
    "endpoints), else 0; from the pod watch, not from the verifier.",
)
GATE_VERIFIED = _PER_POD.gauge(
    "kvgate_engine_verified",
    "1 while the engine pod's kvgate.io/engine-verified readiness gate is True, else 0 (False or "
    "not written yet); from the pod watch. changes() over it counts the gate's transitions.",
)
UNVERIFIED_SINCE = _PER_POD.gauge(
    "kvgate_engine_unverified_since_timestamp_seconds",
    "Unix time since which the engine pod's kvgate.io/engine-verified gate has not been True: "
    "the gate's lastTransitionTime, or the pod's creation while no gate is written; no sample "
    "while the gate is True. KvgateEngineUnverified compares its age with the verify timeout.",
)
VERIFY_TIMEOUT = _PER_POD.gauge(
    "kvgate_engine_verify_timeout_seconds",
    "The engine pod's ModelDeployment's rollout.verifyTimeoutSeconds: how long a pod may stay "
    "unverified before its revision is refused.",
)
REGISTRY.register(_PER_POD)  # after its gauges: the registry reads their names on registration
WATCH_LISTS = Counter(
    "kvgate_watch_lists",
    "Complete lists by the operator's own list-then-watch (kvgate.kube.informer), by resource: the "
    "first at start, then one each time the watch expired (410 Gone). A climbing count means "
    "the watch keeps losing its place.",
    ["resource"],
    registry=REGISTRY,
)
LEADER = Gauge(
    "kvgate_leader",
    "1 on the operator replica that runs kvgate's handlers (with --standalone: every running "
    "operator, once kopf started), 0 on a replica that does not.",
    registry=REGISTRY,
)
STATUS_WRITE_RETRIES = Counter(
    "kvgate_status_write_retries_total",
    "Status writes (kind: pod_condition, md_status) retried after a transient failure, by "
    "reason (connection, timeout, http_<status>).",
    ("kind", "reason"),
    registry=REGISTRY,
)
VERIFICATIONS = Counter(
    "kvgate_verifications_total",
    "Live engine verifications by outcome (Safe, Unsafe, CannotTell) and reason.",
    ("result", "reason"),
    registry=REGISTRY,
)
ROLLOUTS_REFUSED = Counter(
    "kvgate_rollouts_refused_total",
    "Revisions refused because an engine failed verification or did not verify in time.",
    ("namespace", "deployment", "reason"),
    registry=REGISTRY,
)
GATEWAY_FORCED_DELETIONS = Counter(
    "kvgate_gateway_forced_deletions_total",
    "Engine pods deleted because a gateway still routed to them after they turned NotReady.",
    ("namespace", "deployment", "role"),
    registry=REGISTRY,
)
OWNERSHIP_CONFLICTS = Gauge(
    "kvgate_ownership_conflicts_objects",
    "Objects a ModelDeployment needs that exist but are not its own (kvgate leaves them alone).",
    ("namespace", "deployment"),
    registry=REGISTRY,
)
ROUTER_PODS_REPLACED = Counter(
    "kvgate_router_pods_replaced_total",
    "Router pods deleted because they refused kvgate's control-plane key (they started on a "
    "router key Secret kvgate did not write).",
    ("namespace", "deployment"),
    registry=REGISTRY,
)
ROUTER_UNKNOWN_WORKERS_REMOVED = Counter(
    "kvgate_router_unknown_workers_removed_total",
    "Workers removed from a router because they were not a verified engine pod of its revision.",
    ("namespace", "deployment", "worker_type"),
    registry=REGISTRY,
)
RECONCILE_DURATION = Histogram(
    "kvgate_reconcile_duration_seconds",
    "Time to gather, plan and apply one ModelDeployment reconcile, seconds.",
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
REVERIFY_WAIT = Histogram(
    "kvgate_reverify_wait_seconds",
    "How long a due periodic re-verification waited for its turn in the fleet's budget "
    "(KVGATE_REVERIFY_READS_PER_SECOND), seconds; a read after a change never waits. Waits "
    "near the reverify interval mean engines are re-read every engines / budget seconds.",
    registry=REGISTRY,
    buckets=(0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
VERIFICATION_DURATION = Histogram(
    "kvgate_verification_duration_seconds",
    "Time to read one live engine and judge it, seconds.",
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20),
)


POOL_ESTIMATE_DRIFT_RATIO = Gauge(
    "kvgate_kv_pool_estimate_drift_ratio",
    "Worst verified engine of the role: (live KV pool - admission estimate) / estimate; below "
    "-estimator.optimisticDriftPercent/100 the estimate is optimistic.",
    ("namespace", "deployment", "role"),
    registry=REGISTRY,
)
POOL_ESTIMATED_TOKENS = Gauge(
    "kvgate_kv_pool_estimated_tokens",
    "The admission estimate of the role's KV pool for its shape, tokens.",
    ("namespace", "deployment", "role"),
    registry=REGISTRY,
)


def record_pool_estimates(namespace: str, deployment: str, status: Mapping[str, Any]) -> None:
    """The status' poolEstimate of each role as gauges; a role without one drops its series."""
    for role in ("prefill", "decode"):
        estimate = (status.get(role) or {}).get("poolEstimate") or {}
        series = (namespace, deployment, role)
        tokens = estimate.get("estimatedKvPoolTokens")
        drift = estimate.get("driftPercent")
        if isinstance(tokens, int):
            POOL_ESTIMATED_TOKENS.labels(*series).set(tokens)
        else:
            _drop(POOL_ESTIMATED_TOKENS, series)
        if isinstance(drift, int | float):
            POOL_ESTIMATE_DRIFT_RATIO.labels(*series).set(drift / 100)
        else:
            _drop(POOL_ESTIMATE_DRIFT_RATIO, series)


REVISION_INFO = Gauge(
    "kvgate_revision_info",
    "1 for the ModelDeployment's serving revision (state serving) and its target revision, the "
    "one its current spec computes (state target); one revision can be both.",
    ("namespace", "deployment", "revision", "state"),
    registry=REGISTRY,
)
REVISION_TRAFFIC_RATIO = Gauge(
    "kvgate_revision_traffic_ratio",
    "Each revision's share of the Service's ready routers (status.trafficSplit), 0 to 1.",
    ("namespace", "deployment", "revision"),
    registry=REGISTRY,
)
# The revision series each ModelDeployment has now, so a revision that left drops its own.
_REVISION_SERIES: dict[tuple[str, str], tuple[set[tuple[str, str]], set[str]]] = {}


def parse_traffic_split(text: str) -> dict[str, float]:
    """``4f2a=90%,9c1e=10%`` (status.trafficSplit) as shares, {} for anything else."""
    shares: dict[str, float] = {}
    for part in text.split(","):
        revision, _, percent = part.partition("=")
        number = percent.removesuffix("%")
        if not revision or not percent.endswith("%") or not number.isdigit():
            return {}
        shares[revision] = int(number) / 100
    return shares


def record_revisions(namespace: str, deployment: str, status: Mapping[str, Any]) -> None:
    """The status' serving and target revision and its traffic split as gauges."""
    states = {
        (str(status[key]), state)
        for key, state in (("servingRevision", "serving"), ("targetRevision", "target"))
        if status.get(key)
    }
    shares = parse_traffic_split(str(status.get("trafficSplit") or ""))
    old_states, old_shares = _REVISION_SERIES.get((namespace, deployment), (set(), set()))
    for revision, state in old_states - states:
        _drop(REVISION_INFO, (namespace, deployment, revision, state))
    for revision in old_shares - shares.keys():
        _drop(REVISION_TRAFFIC_RATIO, (namespace, deployment, revision))
    for revision, state in states:
        REVISION_INFO.labels(namespace, deployment, revision, state).set(1)
    for revision, share in shares.items():
        REVISION_TRAFFIC_RATIO.labels(namespace, deployment, revision).set(share)
    _REVISION_SERIES[(namespace, deployment)] = (states, set(shares))


_ROLE = ("namespace", "deployment", "role")
ROLE_DESIRED = Gauge(
    "kvgate_role_desired_replicas",
    "An autoscaled role's count as its RoleScale asks for it (spec.replicas): the autoscaler's.",
    _ROLE,
    registry=REGISTRY,
)
ROLE_EFFECTIVE = Gauge(
    "kvgate_role_effective_replicas",
    "The count kvgate runs for an autoscaled role: the RoleScale's within minReplicas.."
    "maxReplicas and spec.prefillPerDecode.",
    _ROLE,
    registry=REGISTRY,
)
ROLE_VERIFIED = Gauge(
    "kvgate_role_verified_replicas",
    "An autoscaled role's verified Ready engines in the revisions taking traffic (its "
    "RoleScale's status.replicas, what an autoscaler counts as current).",
    _ROLE,
    registry=REGISTRY,
)
ROLE_VERIFIED_KV_TOKENS = Gauge(
    "kvgate_role_verified_kv_tokens",
    "Sum of the live KV pools (tokens) of an autoscaled role's verified engines taking traffic: "
    "the KV capacity proven to hold the context window.",
    _ROLE,
    registry=REGISTRY,
)
ROLE_DRAINING = Gauge(
    "kvgate_role_draining_replicas",
    "An autoscaled role's engines out of traffic for a scale-down, waiting for their requests.",
    _ROLE,
    registry=REGISTRY,
)
DRAIN_SECONDS = Histogram(
    "kvgate_scale_down_drain_seconds",
    "From an engine leaving traffic for a scale-down to its drain ending (no request or KV "
    "transfer in flight, or the drain timeout).",
    ("role",),
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600),
    registry=REGISTRY,
)
DRAINS = Counter(
    "kvgate_scale_down_drains",
    "Engines drained for a scale-down, by result: drained (nothing in flight) or timeout "
    "(removed at drainTimeoutSeconds with requests in flight).",
    ("role", "result"),
    registry=REGISTRY,
)
SCALE_UP_VERIFIED_SECONDS = Histogram(
    "kvgate_scale_up_verified_seconds",
    "From kvgate seeing an autoscaled role's count raised to as many verified engines of it "
    "taking traffic.",
    ("role",),
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800),
    registry=REGISTRY,
)
_ROLE_GAUGES = (ROLE_DESIRED, ROLE_EFFECTIVE, ROLE_VERIFIED, ROLE_VERIFIED_KV_TOKENS, ROLE_DRAINING)


def record_role(series: tuple[str, str, str], values: Mapping[str, int] | None) -> None:
    """An autoscaled role's gauges (keys desired, effective, verified, verified_kv_tokens,
    draining); None drops them (the role is not autoscaled)."""
    if values is None:
        for gauge in _ROLE_GAUGES:
            _drop(gauge, series)
        return
    ROLE_DESIRED.labels(*series).set(values["desired"])
    ROLE_EFFECTIVE.labels(*series).set(values["effective"])
    ROLE_VERIFIED.labels(*series).set(values["verified"])
    ROLE_VERIFIED_KV_TOKENS.labels(*series).set(values["verified_kv_tokens"])
    ROLE_DRAINING.labels(*series).set(values["draining"])


def forget_md(namespace: str, deployment: str) -> None:
    """Drop every series of a deleted ModelDeployment, gauges, counters and histograms alike: a
    stale drift would keep its alert firing, and counters kept for every name a ModelDeployment
    ever had would grow /metrics without bound (name churn: ``pr-1233``, ``pr-1234``, ...).
    Every registered metric with a ``namespace`` and a ``deployment`` label is per
    ModelDeployment, so a metric added later is dropped too
    (tests/kube/test_md_metrics_forgotten.py)."""
    _REVISION_SERIES.pop((namespace, deployment), None)
    _PER_POD.forget_md(namespace, deployment)
    for metric in _per_md_metrics():
        metric.remove_by_labels({"namespace": namespace, "deployment": deployment})


def _per_md_metrics() -> list[MetricWrapperBase]:
    """The registered metrics labelled by namespace and deployment."""
    return [
        collector
        for collector in list(REGISTRY._collector_to_names)  # prometheus_client keeps them here
        if isinstance(collector, MetricWrapperBase)
        and {"namespace", "deployment"} <= set(collector._labelnames)
    ]


def _drop(gauge: Gauge, series: tuple[str, ...]) -> None:
    with contextlib.suppress(KeyError):  # never set for this ModelDeployment
        gauge.remove(*series)


def forget_pod(namespace: str, deployment: str, pod: str, role: str) -> None:
    """Drop a deleted pod's series, its gauges and its counters alike (no stale pool numbers on
    dashboards; no series for every pod a ModelDeployment ever had). An engine pod's and a
    multi-node worker pod's (kvgate.controller.kv_canary_watch) alike."""
    _PER_POD.forget((namespace, deployment, pod, role))
    series = {"namespace": namespace, "deployment": deployment, "pod": pod, "role": role}
    for metric in _per_md_metrics():
        if "pod" in metric._labelnames:
            metric.remove_by_labels({k: v for k, v in series.items() if k in metric._labelnames})


class _Backlog(Collector):
    """Engine reads waiting for a probe slot (kvgate.kube.probe_slots), by priority."""

    def __init__(self) -> None:
        self.waiting: Callable[[], tuple[int, int]] | None = None
        # As prometheus_client's metrics name them (the chart's rule tests read these).
        self._name, self._labelnames = "kvgate_verification_backlog_reads", ("priority",)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            self._name,
            "Engine reads waiting for one of the KVGATE_MAX_CONCURRENT_PROBES slots, by priority: "
            "urgent (the pod changed: it is read first) and periodic (re-verification).",
            labels=self._labelnames,
        )
        if self.waiting is not None:
            urgent, periodic = self.waiting()
            family.add_metric(("urgent",), urgent)
            family.add_metric(("periodic",), periodic)
        yield family


_BACKLOG = _Backlog()
REGISTRY.register(_BACKLOG)


def watch_backlog(waiting: Callable[[], tuple[int, int]]) -> None:
    """Expose what ``waiting`` returns, (urgent, periodic), as the verification backlog."""
    _BACKLOG.waiting = waiting


class _PassSlots(Collector):
    """ModelDeployment pass slots (kvgate.controller.pass_slots): busy, and passes waiting by
    class."""

    # Each family's label names, as prometheus_client's metrics hold theirs in _labelnames (the
    # chart's rule and dashboard tests read what the registry serves through these).
    families: ClassVar[dict[str, tuple[str, ...]]] = {
        "kvgate_reconcile_slots": (),
        "kvgate_reconcile_slots_busy": (),
        "kvgate_reconcile_passes_waiting": ("class",),
    }

    def __init__(self) -> None:
        self.state: Callable[[], tuple[int, int, dict[str, int]]] | None = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        size = GaugeMetricFamily(
            "kvgate_reconcile_slots",
            "Passes that may run at once (KVGATE_MAX_CONCURRENT_RECONCILES).",
        )
        busy = GaugeMetricFamily(
            "kvgate_reconcile_slots_busy", "Pass slots held by a running pass."
        )
        waiting = GaugeMetricFamily(
            "kvgate_reconcile_passes_waiting",
            "Passes waiting for a pass slot, by class (kvgate.rollout.pass_priority): "
            "requested (somebody asked: a new spec, a rollback, a scale request; served first), "
            "in_flight, settled.",
            labels=("class",),
        )
        if self.state is not None:
            total, held, by_class = self.state()
            size.add_metric((), total)
            busy.add_metric((), held)
            for name, count in sorted(by_class.items()):
                waiting.add_metric((name,), count)
        yield size
        yield busy
        yield waiting


_PASS_SLOTS = _PassSlots()
REGISTRY.register(_PASS_SLOTS)


def watch_pass_slots(state: Callable[[], tuple[int, int, dict[str, int]]]) -> None:
    """Expose what ``state`` returns, (slots, busy, waiting by class), as the pass slots."""
    _PASS_SLOTS.state = state


EVENT_LOOP_LAG = Histogram(
    "kvgate_event_loop_lag_seconds",
    "How late the operator's event loop woke a timer that was due (kvgate.controller.loop_lag: "
    "every 0.25 s), seconds: the time every callback waits for the loop when it has more work "
    "than one core runs.",
    registry=REGISTRY,
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PASS_SLOT_WAIT = Histogram(
    "kvgate_reconcile_slot_wait_seconds",
    "How long a ModelDeployment pass waited for a pass slot, by its class when it got one "
    "(requested, in_flight, settled), seconds.",
    ("class",),
    registry=REGISTRY,
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


CONTENT_CHECKS = Counter(
    "kvgate_content_checks_total",
    "Content checks at maximum length (safety.contentProbe) that decided, by result "
    "(passed, failed).",
    ("namespace", "deployment", "result"),
    registry=REGISTRY,
)
CONTENT_CHECK_DURATION = Histogram(
    "kvgate_content_check_duration_seconds",
    "Wall time of one content check (every probe, one after another), seconds.",
    ("namespace", "deployment"),
    buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
    registry=REGISTRY,
)
KV_CANARY_VIOLATIONS = Counter(
    "kvgate_kv_canary_violations_total",
    "Engine pods whose log showed an SGLang KV canary violation (safety.kvCanary); each one's "
    "gate turned False with reason KvCanaryViolation.",
    _POD_LABELS,
    registry=REGISTRY,
)

# Every request of kvgate's own client (kopf's watches are long-lived streams, not counted): at
# steady state it must follow changes, not fleet size (README, Measured: Scale).
API_REQUESTS = Counter(
    "kvgate_api_requests",
    "Requests kvgate's client sent to the Kubernetes API, by verb and resource.",
    ["verb", "resource"],
    registry=REGISTRY,
)
