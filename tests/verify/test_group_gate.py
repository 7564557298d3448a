"""The gate of a multi-node engine: the leader is verified only with a safe pool AND every rank of
its group running; workers count only when provably of this leader's group (table tests)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from factories.model_deployments import NOW
from kvgate.api import labels, multinode
from kvgate.verify import group_gate
from kvgate.verify.group_gate import GroupState
from kvgate_engine.report import EngineReport
from kvgate_engine.verdict import Requirement, cannot_tell, judge

LWS = "llama-1a2b3c4d5e-decode"
REQ = Requirement(context_length=131_072, headroom=1.0, role="decode")
LATER = NOW + timedelta(seconds=30)


def report(pool: int) -> EngineReport:
    return EngineReport(
        version="0.5.23",
        role="decode",
        kv_pool_tokens=pool,
        kv_pool_tokens_per_rank=(pool,),
        max_req_input_len=min(131_072, pool) - 6,
        effective_context_length=131_072,
        served_model_name="llama",
    )


SAFE = judge(report(400_000), REQ)
SMALL = judge(report(100_000), REQ)


def leader(verified: bool | None = None, uid: str = "leader-uid") -> dict[str, Any]:
    conditions = []
    if verified is not None:
        conditions.append(
            {
                "type": labels.ENGINE_VERIFIED,
                "status": "True" if verified else "False",
                "reason": "EngineVerified" if verified else "EngineNotReady",
                "message": "m",
                "lastTransitionTime": "2026-12-01T00:00:00Z",
            }
        )
    return {
        "metadata": {
            "name": f"{LWS}-0",
            "uid": uid,
            "labels": {
                labels.ROLE: "decode",
                multinode.LWS_NAME_LABEL: LWS,
                multinode.GROUP_INDEX_LABEL: "0",
                multinode.WORKER_INDEX_LABEL: "0",
            },
        },
        "status": {"conditions": conditions},
    }


def sts(name: str = f"{LWS}-0", owner_uid: str = "leader-uid", kind: str = "Pod") -> Any:
    return {
        "metadata": {
            "name": name,
            "uid": f"sts-{name}",
            "ownerReferences": [{"kind": kind, "uid": owner_uid, "controller": True}],
        }
    }


def worker(
    index: int,
    *,
    uid: str | None = None,
    phase: str = "Running",
    running: bool = True,
    restarts: int = 0,
    terminating: bool = False,
    sts_name: str = f"{LWS}-0",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": f"{LWS}-0-{index}",
        "uid": uid or f"w{index}",
        "labels": {
            multinode.LWS_NAME_LABEL: LWS,
            multinode.GROUP_INDEX_LABEL: "0",
            multinode.WORKER_INDEX_LABEL: str(index),
        },
        "ownerReferences": [
            {"kind": "StatefulSet", "name": sts_name, "uid": f"sts-{sts_name}", "controller": True}
        ],
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    state = {"running": {"startedAt": "2026-12-01T00:00:00Z"}} if running else {"waiting": {}}
    return {
        "metadata": meta,
        "status": {
            "phase": phase,
            "containerStatuses": [
                {"name": "engine", "ready": running, "restartCount": restarts, "state": state}
            ],
        },
    }


def group(size: int, *workers: tuple[Any, Any]) -> GroupState:
    return group_gate.group_state(leader(), LWS, size, list(workers))


def with_sts(pod: Any) -> tuple[Any, Any]:
    return pod, sts()


# (case, size, workers, complete, words in the message)
GROUPS: list[tuple[str, int, list[tuple[Any, Any]], bool, list[str]]] = [
    ("a single-pod group needs no worker", 1, [], True, ["all 1 ranks run"]),
    ("every rank runs", 3, [with_sts(worker(1)), with_sts(worker(2))], True, ["all 3 ranks run"]),
    ("a rank has no pod", 3, [with_sts(worker(1))], False, ["2 of 3 ranks", "rank 2 has no pod"]),
    (
        "a worker is still pending",
        2,
        [with_sts(worker(1, phase="Pending", running=False))],
        False,
        ["1 of 2 ranks", "is Pending"],
    ),
    (
        "a worker's engine is waiting (crash loop)",
        2,
        [with_sts(worker(1, running=False))],
        False,
        ["no running engine container"],
    ),
    (
        "a worker restarted its engine",
        2,
        [with_sts(worker(1, restarts=1))],
        False,
        ["restarted its engine (1 restarts)", "cannot rejoin"],
    ),
    (
        "a worker is terminating",
        2,
        [with_sts(worker(1, terminating=True))],
        False,
        ["is terminating"],
    ),
    (
        "a replacement runs while the old pod terminates",
        2,
        [with_sts(worker(1, uid="old", terminating=True)), with_sts(worker(1, uid="new"))],
        True,
        ["all 2 ranks run"],
    ),
    (
        "a tenant's pod with copied labels and no StatefulSet",
        2,
        [(worker(1), None)],
        False,
        ["rank 1 has no pod"],
    ),
    (
        "a StatefulSet owned by another leader (a previous group)",
        2,
        [(worker(1), sts(owner_uid="old-leader"))],
        False,
        ["rank 1 has no pod"],
    ),
    (
        "a StatefulSet of another group",
        2,
        [(worker(1, sts_name=f"{LWS}-1"), sts(name=f"{LWS}-1"))],
        False,
        ["rank 1 has no pod"],
    ),
    (
        "a StatefulSet controlled by something else than a pod",
        2,
        [(worker(1), sts(kind="ReplicaSet"))],
        False,
        ["rank 1 has no pod"],
    ),
    (
        "a worker claiming a rank beyond the group",
        2,
        [with_sts(worker(1)), with_sts(worker(5))],
        True,
        ["all 2 ranks run"],
    ),
]


@pytest.mark.parametrize(
    ("size", "workers", "complete", "words"),
    [g[1:] for g in GROUPS],
    ids=[g[0] for g in GROUPS],
)
def test_group_is_complete_only_when_every_proven_rank_runs(
    size: int, workers: list[tuple[Any, Any]], complete: bool, words: list[str]
) -> None:
    state = group(size, *workers)
    assert state.complete is complete, state.message
    for word in words:
        assert word in state.message, state.message


FULL = group(2, with_sts(worker(1)))
MISSING = group(2)


def test_safe_leader_of_a_complete_group_is_verified_with_the_ranks_in_the_message() -> None:
    cond = group_gate.condition_for_group(leader(), SAFE, REQ, FULL, None, NOW)
    assert cond is not None and cond["status"] == "True"
    assert "KV pool 400,000 tokens" in cond["message"] and "all 2 ranks run" in cond["message"]


def test_safe_leader_with_a_missing_rank_is_not_verified() -> None:
    cond = group_gate.condition_for_group(leader(verified=True), SAFE, REQ, MISSING, None, NOW)
    assert cond is not None and cond["status"] == "False"
    assert cond["reason"] == group_gate.GROUP_INCOMPLETE
    assert "1 of 2 ranks run" in cond["message"] and "rank 1 has no pod" in cond["message"]


def test_unsafe_leader_of_a_complete_group_keeps_the_pool_refusal() -> None:
    cond = group_gate.condition_for_group(leader(), SMALL, REQ, FULL, None, NOW)
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "KvPoolTooSmall"


def test_unreadable_leader_of_a_complete_group_is_not_verified() -> None:
    verdict = cannot_tell("EngineUnreachable", "connection refused")
    cond = group_gate.condition_for_group(leader(), verdict, REQ, FULL, None, NOW)
    assert cond is not None and cond["status"] == "False"


def test_replaced_worker_turns_a_verified_leader_false_then_the_group_reverifies() -> None:
    verified_with = FULL.members
    replaced = group(2, with_sts(worker(1, uid="w1-new")))
    assert replaced.complete
    first = group_gate.condition_for_group(
        leader(verified=True), SAFE, REQ, replaced, verified_with, NOW
    )
    assert first is not None and first["status"] == "False"
    assert first["reason"] == group_gate.GROUP_CHANGED
    # The next pass: the leader is no longer verified, the probe is safe, the group complete.
    second = group_gate.condition_for_group(
        leader(verified=False), SAFE, REQ, replaced, verified_with, LATER
    )
    assert second is not None and second["status"] == "True"


def test_same_members_keep_a_verified_leader_verified_without_a_write() -> None:
    first = group_gate.condition_for_group(leader(), SAFE, REQ, FULL, None, NOW)
    assert first is not None
    pod = leader()
    pod["status"]["conditions"] = [first]
    assert group_gate.condition_for_group(pod, SAFE, REQ, FULL, FULL.members, LATER) is None


def test_leader_and_lws_are_read_from_the_pod_labels() -> None:
    assert group_gate.is_leader(leader())
    assert not group_gate.is_leader(worker(1))
    assert group_gate.lws_name_of(leader()) == LWS
