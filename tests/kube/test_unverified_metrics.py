"""The series KvgateEngineUnverified reads (kvgate.kube.metrics): since when each engine pod's
gate has not been True, and the verify deadline of its ModelDeployment."""

from __future__ import annotations

from typing import Any

from factories.kmock_world import NS, engine_pod
from factories.model_deployments import md_doc
from kvgate.api import labels
from kvgate.controller import engine_pods
from kvgate.controller.runtime import Runtime
from kvgate.kube import metrics

CREATED = "2026-08-01T10:00:00Z"
CREATED_UNIX = 1_785_578_400.0
LOST = "2026-08-01T10:05:00Z"


def _value(name: str, pod: dict[str, Any]) -> float | None:
    return metrics.REGISTRY.get_sample_value(
        name,
        {"namespace": NS, "deployment": "llama", "pod": pod["metadata"]["name"], "role": "decode"},
    )


def _since(pod: dict[str, Any]) -> float | None:
    return _value("kvgate_engine_unverified_since_timestamp_seconds", pod)


def _created_pod() -> dict[str, Any]:
    pod = engine_pod(9)
    pod["metadata"]["creationTimestamp"] = CREATED
    return pod


def _with_gate(pod: dict[str, Any], status: str, at: str) -> dict[str, Any]:
    conditions = [c for c in pod["status"]["conditions"] if c.get("type") != labels.ENGINE_VERIFIED]
    gate = {
        "type": labels.ENGINE_VERIFIED,
        "status": status,
        "reason": "EngineVerified" if status == "True" else "KvCanaryViolation",
        "lastTransitionTime": at,
    }
    return {**pod, "status": {**pod["status"], "conditions": [*conditions, gate]}}


async def test_a_pod_never_verified_is_unverified_since_it_was_created(rt: Runtime) -> None:
    pod = _created_pod()
    engine_pods.on_pod_event(rt, "ADDED", pod)
    assert _since(pod) == CREATED_UNIX
    engine_pods.on_pod_event(rt, "DELETED", pod)
    assert _since(pod) is None


async def test_a_verified_pod_has_no_unverified_since_and_one_that_lost_it_has_the_gates_time(
    rt: Runtime,
) -> None:
    pod = _created_pod()
    engine_pods.on_pod_event(rt, "ADDED", pod)
    engine_pods.on_pod_event(rt, "MODIFIED", _with_gate(pod, "True", "2026-08-01T10:01:00Z"))
    assert _since(pod) is None
    engine_pods.on_pod_event(rt, "MODIFIED", _with_gate(pod, "False", LOST))
    assert _since(pod) == CREATED_UNIX + 300
    engine_pods.on_pod_event(rt, "DELETED", pod)


async def test_the_verify_deadline_is_the_model_deployments_verify_timeout(rt: Runtime) -> None:
    rt.mds[(NS, "llama")] = md_doc(rollout__verifyTimeoutSeconds=45)
    pod = _created_pod()
    engine_pods.on_pod_event(rt, "ADDED", pod)
    assert _value("kvgate_engine_verify_timeout_seconds", pod) == 45.0
    engine_pods.on_pod_event(rt, "DELETED", pod)
    rt.mds.clear()
    other = _created_pod()
    engine_pods.on_pod_event(rt, "ADDED", other)
    assert _value("kvgate_engine_verify_timeout_seconds", other) == 900.0  # the default
    engine_pods.on_pod_event(rt, "DELETED", other)
