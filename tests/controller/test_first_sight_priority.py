"""A new leader sees thousands of engine pods at once; the ones whose engine restarted after
their last verification (or that were never verified) are read before the ones verified since
their engine started. The round-9 scale run: a shrunk engine restarted just after the leader
was killed waited 98 s behind 9,000 first-sight reads."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kvgate.api import labels
from kvgate.controller import engine_pods
from kvgate.controller.runtime import Runtime
from kvgate.kube import probe_slots
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings
from kvgate.verify import gate

VERIFIED_AT = "2026-12-02T10:00:05Z"


def pod(
    *, started: str | None, gate_status: str | None = "True", ready: bool = True
) -> dict[str, Any]:
    conditions = [{"type": "Ready", "status": "True"}]
    if gate_status is not None:
        conditions.append(
            {
                "type": labels.ENGINE_VERIFIED,
                "status": gate_status,
                "reason": "EngineVerified",
                "lastTransitionTime": VERIFIED_AT,
            }
        )
    state = {"running": {"startedAt": started}} if started else {"waiting": {}}
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "uid": "u1",
            "labels": {labels.COMPONENT: labels.COMPONENT_ENGINE, labels.DEPLOYMENT: "llama"},
        },
        "status": {
            "podIP": "127.0.0.1",
            "conditions": conditions,
            "containerStatuses": [
                {"name": "engine", "ready": ready, "restartCount": 1, "state": state}
            ],
        },
    }


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (pod(started="2026-12-02T10:00:00Z"), True),  # verified after the engine started
        (pod(started=VERIFIED_AT), True),  # the same second
        (pod(started="2026-12-02T10:00:06Z"), False),  # restarted after its verification
        (pod(started="2026-12-02T10:00:00Z", gate_status="False"), False),
        (pod(started="2026-12-02T10:00:00Z", gate_status=None), False),  # never verified
        (pod(started=None), False),  # not running
        (pod(started="2026-12-02T10:00:00Z", ready=False), False),  # not ready now
    ],
)
def test_verified_since_engine_start(body: dict[str, Any], expected: bool) -> None:
    assert gate.verified_since_engine_start(body) is expected


@pytest.mark.parametrize(
    ("started", "urgent"),
    [("2026-12-02T10:00:00Z", False), ("2026-12-02T10:00:06Z", True)],
)
async def test_a_first_sight_read_is_urgent_only_if_the_engine_restarted_after_its_verification(
    monkeypatch: pytest.MonkeyPatch, started: str, urgent: bool
) -> None:
    reads: list[bool] = []
    done = asyncio.Event()

    async def record(*_: Any) -> None:
        reads.append(probe_slots.URGENT.get())
        done.set()

    monkeypatch.setattr(engine_pods, "check_pod", record)
    api = KubeApi(Credentials(server="http://127.0.0.1:9"))
    rt = Runtime(api=api, settings=OperatorSettings(), verify=None)  # type: ignore[arg-type]
    try:
        engine_pods.on_pod_event(rt, None, pod(started=started))
        await asyncio.wait_for(done.wait(), timeout=5)
        # A later change of the same pod is urgent whatever its history.
        done.clear()
        changed = pod(started=started)
        changed["status"]["containerStatuses"][0]["restartCount"] = 2
        engine_pods.on_pod_event(rt, "MODIFIED", changed)
        await asyncio.wait_for(done.wait(), timeout=5)
    finally:
        await rt.shutdown()
        await api.close()
    assert reads == [urgent, True]
