"""The gate of a multi-node engine: is every rank of the leader's group running? (pure)

A multi-node engine is verified when its leader (rank 0, the only pod that serves
``/server_info``) reports a pool that meets the requirement **and** every worker of its group
runs. A group with a missing rank is not an engine: SGLang's leader answers for the whole group,
and a rank that is gone, waiting, or restarted (SGLang's ranks cannot rejoin a running engine)
leaves it unable to serve, whatever it last reported.

Workers count only when proven to belong to this leader's group: each must be controlled by the
StatefulSet ``<lws>-<g>`` that LeaderWorkerSet creates for the group, and that StatefulSet by
the leader pod itself (its uid). A pod that merely copies the labels is ignored, so it can never
complete a group. The group size comes from the LeaderWorkerSet kvgate wrote (proven by the
leader's identity), never from the pods.

The membership the leader was verified with is its :class:`GroupState` ``members``; when it
changes (a worker replaced) the leader's gate turns False at once and the group is verified
again — probe and ranks — before it takes traffic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvgate_engine.verdict import Outcome, Requirement, Verdict

from kvgate.api import multinode
from kvgate.api.ownership import controller_of
from kvgate.verify import gate

Obj = Mapping[str, Any]

GROUP_INCOMPLETE = "EngineGroupIncomplete"
GROUP_CHANGED = "EngineGroupChanged"

# (worker index, pod uid) of every proven worker: who the leader was verified with.
Members = tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class GroupState:
    """The leader's group as observed: complete or not, why, and who its workers are."""

    complete: bool
    message: str  # what is missing, or "all N ranks run"
    members: Members


def _labels(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata", {}).get("labels", {}) or {}


def _worker_index(pod: Obj) -> int | None:
    try:
        return int(str(_labels(pod).get(multinode.WORKER_INDEX_LABEL, "")))
    except ValueError:
        return None


def _proven_worker(pod: Obj, statefulset: Obj | None, leader: Obj, lws_name: str) -> bool:
    ref = controller_of(pod)
    group = _labels(leader).get(multinode.GROUP_INDEX_LABEL)
    if ref is None or ref.get("kind") != "StatefulSet" or statefulset is None:
        return False
    sts_meta = statefulset.get("metadata", {})
    if ref.get("uid") != sts_meta.get("uid") or sts_meta.get("name") != f"{lws_name}-{group}":
        return False
    owner = controller_of(statefulset)
    return (
        owner is not None
        and owner.get("kind") == "Pod"
        and owner.get("uid") == leader.get("metadata", {}).get("uid")
    )


def _running(pod: Obj) -> str | None:
    """None when the worker's engine runs; else why it does not (for the message)."""
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return "is terminating"
    phase = pod.get("status", {}).get("phase", "Pending")
    if phase != "Running":
        return f"is {phase}"
    status = gate.engine_container_status(pod)
    if status is None or "running" not in (status.get("state") or {}):
        return "has no running engine container"
    restarts = int(status.get("restartCount", 0))
    if restarts:
        return (
            f"restarted its engine ({restarts} restarts): a rank cannot rejoin a running "
            "engine; LeaderWorkerSet recreates the group"
        )
    return None


def group_state(
    leader: Obj,
    lws_name: str,
    size: int,
    workers: Sequence[tuple[Obj, Obj | None]],
) -> GroupState:
    """The leader's group from its candidate workers (pod, the StatefulSet controlling it)."""
    proven: dict[int, Obj] = {}
    for pod, statefulset in workers:
        index = _worker_index(pod)
        if index is None or not 1 <= index < size:
            continue
        if not _proven_worker(pod, statefulset, leader, lws_name):
            continue
        current = proven.get(index)
        # Two pods of one rank: a replacement while the old one terminates; the live one counts.
        if current is None or current.get("metadata", {}).get("deletionTimestamp"):
            proven[index] = pod
    members: Members = tuple(
        sorted((i, str(p.get("metadata", {}).get("uid", ""))) for i, p in proven.items())
    )
    problems = []
    for index in range(1, size):
        member = proven.get(index)
        if member is None:
            problems.append(f"rank {index} has no pod")
            continue
        why = _running(member)
        if why is not None:
            problems.append(f"rank {index} (pod {gate.pod_name(member)}) {why}")
    if problems:
        running = size - 1 - len(problems)
        return GroupState(
            False,
            f"{running + 1} of {size} ranks run ({'; '.join(problems)})",
            members,
        )
    return GroupState(True, f"all {size} ranks run", members)


def condition_for_group(
    leader: Obj,
    verdict: Verdict,
    requirement: Requirement,
    group: GroupState,
    verified_with: Members | None,
    now: datetime,
) -> gate.Condition | None:
    """The leader's engine-verified condition: True only for a SAFE verdict on a complete group
    whose members are the ones it was last verified with (or the first verification)."""
    if not group.complete:
        return condition_for_incomplete(leader, group, now)
    if gate.is_verified(leader) and verified_with is not None and verified_with != group.members:
        return gate.condition_for_unverifiable(
            leader,
            GROUP_CHANGED,
            f"engine group changed since it was verified (workers {_show(verified_with)} -> "
            f"{_show(group.members)}); it is verified again",
            now,
        )
    if verdict.outcome is not Outcome.SAFE:
        return gate.condition_for_verdict(leader, verdict, requirement, now)
    message = f"{gate.verdict_message(leader, verdict, requirement)}; {group.message}"
    return gate._condition(leader, "True", verdict.reason, message, now)


def condition_for_incomplete(
    leader: Obj, group: GroupState, now: datetime
) -> gate.Condition | None:
    """The leader's condition while its group misses a rank (whatever its own engine says)."""
    return gate.condition_for_unverifiable(
        leader,
        GROUP_INCOMPLETE,
        f"engine group incomplete: {group.message}; verified again once every rank runs",
        now,
    )


def _show(members: Members) -> str:
    return ", ".join(f"rank {i}" for i, _ in members) or "none"


def lws_name_of(leader: Obj) -> str | None:
    """The LeaderWorkerSet a leader pod names (its workers are listed by it); proof is the
    identity chain, not this label."""
    value = _labels(leader).get(multinode.LWS_NAME_LABEL)
    return str(value) if value else None


def is_leader(pod: Obj) -> bool:
    return str(_labels(pod).get(multinode.WORKER_INDEX_LABEL, "")) == "0"
