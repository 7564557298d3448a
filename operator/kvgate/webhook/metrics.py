"""Prometheus metrics of the admission webhook (units in the names), in their own registry: a
`kvgate webhook` pod exposes these and nothing of the operator's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from kvgate.admission.review import OPERATIONS

REGISTRY = CollectorRegistry(auto_describe=True)

RESULTS = ("allowed", "denied", "rejected", "error")
UNKNOWN_OPERATION = "unknown"

REQUESTS = Counter(
    "kvgate_admission_requests_total",
    "Admission requests answered, by operation (CREATE, UPDATE, ...; unknown for a request too "
    "malformed to say) and result: allowed, denied (the ModelDeployment is unsafe), rejected "
    "(not a well-formed AdmissionReview for this webhook: HTTP 4xx) or error (a kvgate bug; "
    "denied).",
    ("operation", "result"),
    registry=REGISTRY,
)
DURATION = Histogram(
    "kvgate_admission_duration_seconds",
    "Time to read, check and answer one AdmissionReview (allowed, denied or error; a request "
    "refused with a 4xx is not timed), seconds.",
    registry=REGISTRY,
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 2.5),
)


def operation_label(value: object) -> str:
    """The `operation` label for a request's operation field (bounded: unknown otherwise)."""
    return value if isinstance(value, str) and value in OPERATIONS else UNKNOWN_OPERATION


# Every series exists from the start (a rate over a series that appears late misses its start).
_SERIES = {
    (operation, result): REQUESTS.labels(operation, result)
    for operation in (*OPERATIONS, UNKNOWN_OPERATION)
    for result in RESULTS
}


def count(operation: str, result: str) -> None:
    """One answered request."""
    _SERIES[(operation_label(operation), result)].inc()
