"""Ownership conflicts in a ModelDeployment's status (pure): condition and Event on transition.

When an object kvgate must manage exists but is not the ModelDeployment's own (see
``kvgate.api.ownership``), kvgate leaves it alone and says so: ``Degraded=True`` with reason
``Conflict`` naming every such object, and ``Ready=False`` too when the conflicting object is the
``<md>`` Service (kvgate cannot point clients at a verified revision) or one that stops serving
(the router key Secret: kvgate runs no router on a key it did not write). A ``Conflict`` Warning
Event is posted when the set of conflicts changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from kvgate.api.ownership import CONFLICT, OwnershipConflict
from kvgate.api.timestamps import rfc3339
from kvgate.rollout.status import DEGRADED, READY, Event

Status = dict[str, Any]


def conflict_message(conflicts: Sequence[OwnershipConflict]) -> str:
    return "; ".join(c.message for c in conflicts)


def _previous(previous: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any]:
    for cond in (previous or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def with_conflicts(
    status: Status,
    conflicts: Sequence[OwnershipConflict],
    *,
    generation: int,
    previous: Mapping[str, Any] | None,
    now: datetime,
) -> Status:
    """The status with the conflicts reported (unchanged when there are none)."""
    if not conflicts:
        return status
    message = conflict_message(conflicts)
    override = {DEGRADED: "True"}
    if any(c.kind == "Service" or c.stops_serving for c in conflicts):
        override[READY] = "False"
    conditions = []
    for cond in status.get("conditions") or []:
        kind = cond.get("type")
        if kind not in override:
            conditions.append(cond)
            continue
        before = _previous(previous, kind)
        same = before.get("status") == override[kind] and before.get("lastTransitionTime")
        conditions.append(
            {
                **cond,
                "status": override[kind],
                "reason": CONFLICT,
                "message": message,
                "lastTransitionTime": before["lastTransitionTime"] if same else rfc3339(now),
                "observedGeneration": generation,
            }
        )
    return {**status, "conditions": conditions, "message": message}


def conflict_events(
    conflicts: Sequence[OwnershipConflict], previous: Mapping[str, Any] | None
) -> list[Event]:
    """A Warning when the conflicts differ from what the previous status reported."""
    before = _previous(previous, DEGRADED)
    if not conflicts:
        return []
    message = conflict_message(conflicts)
    if before.get("reason") == CONFLICT and before.get("message") == message:
        return []
    return [Event("Warning", CONFLICT, message)]
