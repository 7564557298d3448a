"""The engine-verified condition: True only for a safe live engine, patched only on change."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from factories.model_deployments import NOW
from kvgate.api import labels
from kvgate.verify import gate
from kvgate_engine.report import EngineReport
from kvgate_engine.verdict import Requirement, cannot_tell, judge

REQ = Requirement(context_length=1_048_576, headroom=1.0, role="decode")
LATER = NOW + timedelta(seconds=30)


def report(pool: int, *, context: int = 1_048_576, role: str = "decode") -> EngineReport:
    return EngineReport(
        version="0.5.23",
        role=role,
        kv_pool_tokens=pool,
        kv_pool_tokens_per_rank=(pool,),
        max_req_input_len=min(context, pool) - 6,
        effective_context_length=context,
        served_model_name="glm",
    )


def pod(condition: dict[str, str] | None = None, *, ready: bool = True, restarts: int = 0) -> Any:
    return {
        "metadata": {
            "name": "llama-7c9d-decode-x2",
            "uid": "u1",
            "labels": {labels.ROLE: "decode"},
            "annotations": {
                labels.REQUIREMENT: '{"contextLength":1048576,"headroom":1.0,'
                '"minEngineVersion":"0.5.22","role":"decode"}'
            },
        },
        "spec": {
            "containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": 30000}]}]
        },
        "status": {
            "podIP": "198.18.0.7",
            "containerStatuses": [{"name": "engine", "ready": ready, "restartCount": restarts}],
            "conditions": [condition] if condition else [],
        },
    }


def test_small_pool_gives_false_with_the_numbers_in_the_message() -> None:
    cond = gate.condition_for_verdict(pod(), judge(report(681_280), REQ), REQ, NOW)
    assert cond is not None
    assert cond["status"] == "False"
    assert cond["reason"] == "KvPoolTooSmall"
    assert cond["message"].startswith(
        "decode pod llama-7c9d-decode-x2 reports KV pool 681,280 tokens < context length "
        "1,048,576 × headroom 1.0"
    )
    assert cond["lastTransitionTime"] == "2026-11-05T12:00:00Z"
    assert cond["type"] == "kvgate.io/engine-verified"


def test_safe_engine_gives_true_with_its_pool() -> None:
    cond = gate.condition_for_verdict(pod(), judge(report(1_200_000), REQ), REQ, NOW)
    assert cond is not None and cond["status"] == "True" and cond["reason"] == "EngineVerified"
    assert "KV pool 1,200,000 tokens ≥ context length 1,048,576" in cond["message"]


@pytest.mark.parametrize("reason", ["EngineUnreachable", "ReportUnreadable"])
def test_cannot_tell_never_gives_true(reason: str) -> None:
    cond = gate.condition_for_verdict(pod(), cannot_tell(reason, "connection refused"), REQ, NOW)
    assert cond is not None and cond["status"] == "False" and cond["reason"] == reason
    assert "could not be verified: connection refused" in cond["message"]


def test_unchanged_condition_needs_no_patch() -> None:
    first = gate.condition_for_verdict(pod(), judge(report(1_200_000), REQ), REQ, NOW)
    assert first is not None
    assert gate.condition_for_verdict(pod(first), judge(report(1_200_000), REQ), REQ, LATER) is None


def test_transition_time_is_kept_unless_the_status_flips() -> None:
    first = gate.condition_for_verdict(pod(), judge(report(1_200_000), REQ), REQ, NOW)
    assert first is not None
    # Same status, new message (pool grew): time kept.
    second = gate.condition_for_verdict(pod(first), judge(report(1_300_000), REQ), REQ, LATER)
    assert second is not None and second["lastTransitionTime"] == first["lastTransitionTime"]
    # Flip to False: time moves.
    third = gate.condition_for_verdict(pod(second), judge(report(681_280), REQ), REQ, LATER)
    assert third is not None and third["lastTransitionTime"] == "2026-11-05T12:00:30Z"


def test_verified_pod_whose_engine_stops_being_ready_loses_the_gate_at_once() -> None:
    verified = gate.condition_for_verdict(pod(), judge(report(1_200_000), REQ), REQ, NOW)
    cond = gate.condition_for_engine_down(pod(verified, ready=False, restarts=1), LATER)
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "EngineNotReady"
    assert "restarts: 1" in cond["message"]
    # Already False: nothing to write.
    assert gate.condition_for_engine_down(pod(cond, ready=False, restarts=1), LATER) is None


def test_engine_url_needs_an_ip_and_a_ready_engine_container() -> None:
    assert gate.engine_url(pod()) == "http://198.18.0.7:30000"
    assert gate.engine_url(pod(ready=False)) is None
    no_ip = pod()
    del no_ip["status"]["podIP"]
    assert gate.engine_url(no_ip) is None


def test_a_pod_kvgate_cannot_verify_gets_a_false_gate_naming_why() -> None:
    cond = gate.condition_for_unverifiable(pod(), gate.NOT_OWNED, "not controlled by X", NOW)
    assert cond is not None and cond["status"] == "False"
    assert cond["reason"] == gate.NOT_OWNED and "not controlled by X" in cond["message"]
