"""Which objects the operator may act on (pure): only those its ModelDeployment controls.

kvgate derives every object it writes (Deployments, the Service, the router's ServiceAccount, Role,
RoleBinding and control-plane Secret, NetworkPolicies) from a ModelDeployment and marks it with a
controller ownerReference to that ModelDeployment's uid. An object with the same name that lacks
that reference was made by someone else (a tenant, another tool, an earlier ModelDeployment of the
same name): kvgate never adopts, patches or deletes it, and reports a ``Conflict`` that names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.api.models import API_VERSION, KIND

CONFLICT = "Conflict"


@dataclass(frozen=True)
class OwnershipConflict:
    """An object kvgate wanted to manage that its ModelDeployment does not control."""

    kind: str
    name: str
    controller: str | None  # "Kind/name" of its controller, if it has one
    # What kvgate holds back while the object is someone else's (said in the message).
    consequence: str | None = None
    # Nothing serves while it lasts (Ready False, as with a foreign <md> Service).
    stops_serving: bool = False

    @property
    def message(self) -> str:
        held = (
            f"it is controlled by {self.controller}"
            if self.controller
            else "it has no controller ownerReference to this ModelDeployment"
        )
        then = f"; {self.consequence}" if self.consequence else ""
        return (
            f"{self.kind} {self.name} already exists and kvgate does not own it ({held}){then}; "
            "kvgate never adopts objects it did not create. Delete or rename that object, or "
            "give the ModelDeployment another name"
        )


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with ``controller: true``, if any (Kubernetes allows at most one)."""
    for ref in obj.get("metadata", {}).get("ownerReferences", None) or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def is_controlled_by(obj: Mapping[str, Any], owner_uid: str | None, *, kind: str = KIND) -> bool:
    """The object's controller ownerReference names this owner (by uid, kind and API group)."""
    ref = controller_of(obj)
    if ref is None or not owner_uid:
        return False
    if kind == KIND and str(ref.get("apiVersion", "")).split("/")[0] != API_VERSION.split("/")[0]:
        return False
    return ref.get("uid") == owner_uid and ref.get("kind") == kind


def conflict_for(obj: Mapping[str, Any], owner_uid: str | None) -> OwnershipConflict | None:
    """None when the ModelDeployment controls ``obj``; else the conflict to report."""
    if is_controlled_by(obj, owner_uid):
        return None
    ref = controller_of(obj)
    return OwnershipConflict(
        kind=str(obj.get("kind") or "object"),
        name=str(obj.get("metadata", {}).get("name", "?")),
        controller=f"{ref.get('kind')}/{ref.get('name')}" if ref is not None else None,
    )
