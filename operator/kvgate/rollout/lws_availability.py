"""A multi-node ModelDeployment on a cluster that cannot run LeaderWorkerSets (pure).

Engines with ``nodes`` > 1 run as LeaderWorkerSets (kvgate.objects.lws_builders). When the API
server does not serve ``leaderworkerset.x-k8s.io/v1`` (LeaderWorkerSet not installed) or kvgate may
not use it (chart value ``leaderWorkerSet.enabled`` off), kvgate creates nothing for those roles and
says so: ``Degraded=True`` with reason ``LeaderWorkerSetUnavailable``, a message naming the
roles, their nodes and the ways out, and a Warning Event when that first appears. A revision
that already serves is left serving (its own objects are untouched); the multi-node revision
cannot become verified, so the usual verification timeout refuses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from kvgate.api import multinode
from kvgate.api.models import ModelDeploymentSpec, Role
from kvgate.api.timestamps import rfc3339
from kvgate.rollout.status import DEGRADED, Event

LWS_UNAVAILABLE = "LeaderWorkerSetUnavailable"
Status = dict[str, Any]


class LwsAccess(StrEnum):
    """What listing LeaderWorkerSets told the operator."""

    SERVED = "served"
    NOT_INSTALLED = "not-installed"  # HTTP 404: the API group/version is not served
    FORBIDDEN = "forbidden"  # HTTP 403: the operator's RBAC lacks it


def access_from_status(http_status: int | None) -> LwsAccess:
    """The access an API answer shows: None (a list that worked), 404 or 403."""
    if http_status == 404:
        return LwsAccess.NOT_INSTALLED
    if http_status == 403:
        return LwsAccess.FORBIDDEN
    return LwsAccess.SERVED


def multi_node_roles(spec: ModelDeploymentSpec) -> list[tuple[str, int]]:
    """(role, nodes) of every role whose engines span more than one node."""
    out = []
    for role in (Role.PREFILL, Role.DECODE):
        role_spec = spec.prefill if role is Role.PREFILL else spec.decode
        if multinode.is_multi_node(role_spec):
            out.append((role.value, role_spec.nodes))
    return out


def unavailable_message(spec: ModelDeploymentSpec, access: LwsAccess) -> str | None:
    """Why the multi-node roles cannot run and what to do; None when they can (or none)."""
    roles = multi_node_roles(spec)
    if access is LwsAccess.SERVED or not roles:
        return None
    named = " and ".join(f"spec.{role}.nodes {nodes}" for role, nodes in roles)
    fields = " and ".join(f"spec.{role}.nodes" for role, _ in roles)
    if access is LwsAccess.NOT_INSTALLED:
        why = (
            f"this cluster does not serve {multinode.LWS_API_VERSION} (LeaderWorkerSet is not "
            "installed); install LeaderWorkerSet v0.9.0 or later "
            "(https://github.com/kubernetes-sigs/lws) and set the kvgate chart value "
            "leaderWorkerSet.enabled=true"
        )
    else:
        why = (
            "kvgate may not manage LeaderWorkerSets (RBAC); set the kvgate chart value "
            "leaderWorkerSet.enabled=true (LeaderWorkerSet must be installed)"
        )
    return (
        f"{named} need{'s' if len(roles) == 1 else ''} a LeaderWorkerSet per engine group, but "
        f"{why}; or set {fields} to 1. Nothing was created for "
        f"{'that role' if len(roles) == 1 else 'those roles'}; a revision already serving keeps "
        "serving"
    )


def _previous(previous: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any]:
    for cond in (previous or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def with_lws_unavailable(
    status: Status,
    message: str | None,
    *,
    generation: int,
    previous: Mapping[str, Any] | None,
    now: datetime,
) -> Status:
    """The status with Degraded=True (reason LeaderWorkerSetUnavailable); unchanged when the
    message is None."""
    if message is None:
        return status
    before = _previous(previous, DEGRADED)
    same = before.get("status") == "True" and before.get("lastTransitionTime")
    degraded = {
        "type": DEGRADED,
        "status": "True",
        "reason": LWS_UNAVAILABLE,
        "message": message,
        "lastTransitionTime": before["lastTransitionTime"] if same else rfc3339(now),
        "observedGeneration": generation,
    }
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != DEGRADED]
    return {**status, "conditions": [*conditions, degraded], "message": message}


def lws_events(message: str | None, previous: Mapping[str, Any] | None) -> list[Event]:
    """A Warning when the condition first appears or its message changes."""
    if message is None:
        return []
    before = _previous(previous, DEGRADED)
    if before.get("reason") == LWS_UNAVAILABLE and before.get("message") == message:
        return []
    return [Event("Warning", LWS_UNAVAILABLE, message)]
