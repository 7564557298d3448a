"""The series the shipped dashboards read that no alert needed before (kvgate.kube.metrics): each
engine pod's readiness gate as the watch sees it, the probe backlog, and each ModelDeployment's
serving and target revision with its traffic split."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from factories.kmock_world import NS, engine_pod
from kvgate.api import labels
from kvgate.controller import engine_pods
from kvgate.controller.main import Prober
from kvgate.controller.runtime import Runtime
from kvgate.kube import metrics
from kvgate.kube.settings import OperatorSettings


def _pod_value(name: str, pod: dict[str, Any]) -> float | None:
    return metrics.REGISTRY.get_sample_value(
        name,
        {"namespace": NS, "deployment": "llama", "pod": pod["metadata"]["name"], "role": "decode"},
    )


def _with_gate(pod: dict[str, Any], status: str) -> dict[str, Any]:
    conditions = [c for c in pod["status"]["conditions"] if c.get("type") != labels.ENGINE_VERIFIED]
    gate = {"type": labels.ENGINE_VERIFIED, "status": status, "reason": "EngineVerified"}
    return {**pod, "status": {**pod["status"], "conditions": [*conditions, gate]}}


async def test_the_gate_of_each_engine_pod_follows_the_watch_and_is_forgotten_with_it(
    rt: Runtime,
) -> None:
    pod = engine_pod(9)
    engine_pods.on_pod_event(rt, "ADDED", pod)
    assert _pod_value("kvgate_engine_verified", pod) == 0.0  # no gate written yet
    engine_pods.on_pod_event(rt, "MODIFIED", _with_gate(pod, "True"))
    assert _pod_value("kvgate_engine_verified", pod) == 1.0
    engine_pods.on_pod_event(rt, "MODIFIED", _with_gate(pod, "False"))
    assert _pod_value("kvgate_engine_verified", pod) == 0.0
    engine_pods.on_pod_event(rt, "DELETED", pod)
    assert _pod_value("kvgate_engine_verified", pod) is None


def _backlog(priority: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(
        "kvgate_verification_backlog_reads", {"priority": priority}
    )


async def test_reads_waiting_for_a_probe_slot_are_the_verification_backlog(
    operator_settings: OperatorSettings,
) -> None:
    prober = Prober(dataclasses.replace(operator_settings, max_concurrent_probes=1))
    slots = prober.slots
    await slots.acquire(urgent=False)  # the only slot is taken
    waiters = [
        asyncio.ensure_future(slots.acquire(urgent=urgent)) for urgent in (True, False, False)
    ]
    await asyncio.sleep(0)
    assert (_backlog("urgent"), _backlog("periodic")) == (1.0, 2.0)
    for _ in waiters:
        slots.release()
        await asyncio.sleep(0)
    slots.release()
    await asyncio.gather(*waiters)
    assert (_backlog("urgent"), _backlog("periodic")) == (0.0, 0.0)


def _revision(deployment: str, revision: str, state: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(
        "kvgate_revision_info",
        {"namespace": NS, "deployment": deployment, "revision": revision, "state": state},
    )


def _share(deployment: str, revision: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(
        "kvgate_revision_traffic_ratio",
        {"namespace": NS, "deployment": deployment, "revision": revision},
    )


def test_serving_and_target_revisions_and_the_split_follow_the_status() -> None:
    split = {
        "servingRevision": "4f2a",
        "targetRevision": "9c1e",
        "trafficSplit": "4f2a=90%,9c1e=10%",
    }
    metrics.record_revisions(NS, "split", split)
    assert _revision("split", "4f2a", "serving") == 1.0
    assert _revision("split", "9c1e", "target") == 1.0
    assert (_share("split", "4f2a"), _share("split", "9c1e")) == (0.9, 0.1)
    done = {"servingRevision": "9c1e", "targetRevision": "9c1e", "trafficSplit": "9c1e=100%"}
    metrics.record_revisions(NS, "split", done)
    assert _revision("split", "9c1e", "serving") == _revision("split", "9c1e", "target") == 1.0
    assert _revision("split", "4f2a", "serving") is None  # the old revision's series are gone
    assert (_share("split", "4f2a"), _share("split", "9c1e")) == (None, 1.0)
    metrics.forget_md(NS, "split")
    assert _revision("split", "9c1e", "serving") is None
    assert _share("split", "9c1e") is None


@pytest.mark.parametrize("split", ["", "garbage", "4f2a=ninety%", "4f2a"])
def test_a_split_kvgate_cannot_read_leaves_no_traffic_series(split: str) -> None:
    metrics.record_revisions(NS, "odd", {"servingRevision": "4f2a", "trafficSplit": split})
    assert _revision("odd", "4f2a", "serving") == 1.0
    assert _share("odd", "4f2a") is None
    metrics.forget_md(NS, "odd")
