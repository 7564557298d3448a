"""Prometheus metrics (units in the names), served on the operator's --metrics-port."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

_POD_LABELS = ("namespace", "deployment", "pod", "role")

KV_POOL_TOKENS = Gauge(
    "kvgate_engine_kv_pool_tokens",
    "KV pool of the engine's live engine, tokens (minimum over DP ranks).",
    _POD_LABELS,
    registry=REGISTRY,
)
HEADROOM_RATIO = Gauge(
    "kvgate_engine_headroom_ratio",
    "KV pool tokens / context length of the engine pod (must be >= safety.headroom).",
    _POD_LABELS,
    registry=REGISTRY,
)
CONTEXT_LENGTH_TOKENS = Gauge(
    "kvgate_context_length_tokens",
    "Advertised context window of the ModelDeployment's current spec, tokens.",
    ("namespace", "deployment"),
    registry=REGISTRY,
)
LAST_VERIFIED = Gauge(
    "kvgate_engine_last_verified_timestamp_seconds",
    "Unix time of the engine pod's last Safe verdict; for a pod this operator process has not "
    "verified yet, the time it started watching it (so the age is never overstated).",
    _POD_LABELS,
    registry=REGISTRY,
)
REVERIFY_INTERVAL = Gauge(
    "kvgate_engine_reverify_interval_seconds",
    "How often the engine pod's live engine is re-verified, seconds.",
    _POD_LABELS,
    registry=REGISTRY,
)
POD_READY = Gauge(
    "kvgate_engine_pod_ready",
    "1 when the engine pod's Ready condition is True (it serves: it is in its Service's "
    "endpoints), else 0; from the pod watch, not from the verifier.",
    _POD_LABELS,
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


def forget_pod(namespace: str, deployment: str, pod: str, role: str) -> None:
    """Drop a deleted pod's series (no stale pool numbers on dashboards)."""
    for gauge in (KV_POOL_TOKENS, HEADROOM_RATIO, LAST_VERIFIED, REVERIFY_INTERVAL, POD_READY):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, deployment, pod, role)


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
