"""The writes that keep one object kvgate builds as it built it (pure).

Used for the objects a ModelDeployment has one of (the router's ServiceAccount, Role, RoleBinding
and key Secret) and for each revision's NetworkPolicies: the object as read in, the writes that
create it or bring it back out, or the conflict when someone else controls an object of that name
(kvgate never adopts or touches it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.api.content_types import MERGE_PATCH
from kvgate.api.ownership import OwnershipConflict, conflict_for
from kvgate.rollout.workload_writes import Create, Delete, Patch, PlannedWrite

Body = dict[str, Any]

# Fields of these objects that kvgate restores when they differ from what it built.
DRIFT_FIELDS = ("data", "rules", "subjects", "spec")


@dataclass(frozen=True)
class Ensured:
    writes: tuple[PlannedWrite, ...] = ()
    conflict: OwnershipConflict | None = None


def contains(current: Any, desired: Any) -> bool:
    """Everything kvgate set is still there (the API server may add defaults around it)."""
    if isinstance(desired, dict):
        return isinstance(current, dict) and all(
            contains(current.get(k), v) for k, v in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(current, list)
            and len(current) == len(desired)
            and all(contains(c, d) for c, d in zip(current, desired, strict=True))
        )
    return bool(current == desired)


def ensure(desired: Body, current: Mapping[str, Any] | None, owner_uid: str | None) -> Ensured:
    """Create the object, or bring the ModelDeployment's own copy back to what kvgate built (a
    tenant's edit or a lost field); an object someone else controls is a conflict."""
    if current is None:
        return Ensured((Create(desired),))
    conflict = conflict_for(current, owner_uid)
    if conflict is not None:
        return Ensured(conflict=conflict)
    kind, name = str(desired["kind"]), str(desired["metadata"]["name"])
    if desired.get("roleRef") is not None and current.get("roleRef") != desired["roleRef"]:
        # roleRef is immutable: replace the binding (it is the ModelDeployment's own).
        return Ensured((Delete(kind, name), Create(desired)))
    drift = {
        key: desired[key]
        for key in DRIFT_FIELDS
        if key in desired and not contains(current.get(key), desired[key])
    }
    if not drift:
        return Ensured()
    note = f"drifted from what kvgate built ({', '.join(sorted(drift))}); restoring it"
    return Ensured((Patch(kind, name, drift, MERGE_PATCH, note=note),))
