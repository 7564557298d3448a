"""Which ModelDeployment revision and role an engine pod belongs to, proven by ownership (pure).

Labels are not proof: anyone who may create or label pods in the namespace can copy them. An engine
pod is kvgate's only when its controller chain ends at the ModelDeployment: the pod is controlled
by a ReplicaSet, that ReplicaSet by the Deployment ``<md>-<rev>-<role>``, and that Deployment by
the ModelDeployment (its uid). The revision and role are then read from that Deployment, which the
operator wrote, and the pod's own labels must agree with them. Only such pods are verified; any
other pod carrying kvgate's labels keeps its gate False and never turns Ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.api import labels
from kvgate.api.models import Role
from kvgate.api.ownership import controller_of, is_controlled_by
from kvgate.objects.builders import component_name

NOT_OWNED = "NotOwnedByModelDeployment"
ENGINE_ROLES = frozenset(r.value for r in (Role.PREFILL, Role.DECODE))
ROUTER_ROLES = frozenset({labels.ROLE_ROUTER})
Obj = Mapping[str, Any]


@dataclass(frozen=True)
class EngineIdentity:
    md_name: str
    revision: str
    role: str
    deployment: str  # the revision Deployment's name


@dataclass(frozen=True)
class Unproven:
    """Why a pod is not (provably) one of kvgate's engine pods."""

    message: str


def _ref(obj: Obj, kind: str, api_group: str) -> Mapping[str, Any] | None:
    ref = controller_of(obj)
    if ref is None or ref.get("kind") != kind:
        return None
    if str(ref.get("apiVersion", "")).split("/")[0] != api_group:
        return None
    return ref


def controller_reference(obj: Obj, kind: str) -> Mapping[str, Any] | None:
    """The object's controller reference when it is an ``apps/*`` ``kind`` (not yet proof)."""
    return _ref(obj, kind, "apps")


def replica_set_name(pod: Obj) -> str | None:
    """Name of the ReplicaSet that controls the pod, per its ownerReference (not yet proof)."""
    ref = _ref(pod, "ReplicaSet", "apps")
    return str(ref["name"]) if ref is not None and ref.get("name") else None


def deployment_name(replica_set: Obj) -> str | None:
    """Name of the Deployment that controls the ReplicaSet, per its ownerReference."""
    ref = _ref(replica_set, "Deployment", "apps")
    return str(ref["name"]) if ref is not None and ref.get("name") else None


def identify(
    pod: Obj,
    replica_set: Obj | None,
    deployment: Obj | None,
    md_uid: str | None,
    roles: frozenset[str] = ENGINE_ROLES,
) -> EngineIdentity | Unproven:
    """The pod's revision and role (one of ``roles``) when its controller chain ends at the
    ModelDeployment."""
    meta = pod.get("metadata", {})
    who = f"pod {meta.get('name', '?')}"
    rs_ref = _ref(pod, "ReplicaSet", "apps")
    if rs_ref is None:
        return Unproven(f"{who} is not controlled by a ReplicaSet")
    if replica_set is None or replica_set.get("metadata", {}).get("uid") != rs_ref.get("uid"):
        return Unproven(f"{who}: its ReplicaSet {rs_ref.get('name')} does not exist (uid differs)")
    dep_ref = _ref(replica_set, "Deployment", "apps")
    if dep_ref is None:
        return Unproven(f"{who}: ReplicaSet {rs_ref.get('name')} is not controlled by a Deployment")
    if deployment is None or deployment.get("metadata", {}).get("uid") != dep_ref.get("uid"):
        return Unproven(f"{who}: Deployment {dep_ref.get('name')} does not exist (uid differs)")
    dep_meta = deployment.get("metadata", {})
    if not is_controlled_by(deployment, md_uid):
        return Unproven(
            f"{who}: Deployment {dep_meta.get('name')} is not controlled by the ModelDeployment"
        )
    dep_labels = dep_meta.get("labels", {}) or {}
    md_name = dep_labels.get(labels.DEPLOYMENT, "")
    revision, role = dep_labels.get(labels.REVISION, ""), dep_labels.get(labels.ROLE, "")
    if role not in roles or dep_meta.get("name") != component_name(md_name, revision, role):
        return Unproven(
            f"{who}: Deployment {dep_meta.get('name')} is not a kvgate "
            f"{'/'.join(sorted(roles))} Deployment"
        )
    pod_labels = meta.get("labels", {}) or {}
    for key, want in (
        (labels.DEPLOYMENT, md_name),
        (labels.REVISION, revision),
        (labels.ROLE, role),
    ):
        if pod_labels.get(key) != want:
            return Unproven(
                f"{who}: label {key}={pod_labels.get(key)!r} differs from its Deployment "
                f"{dep_meta.get('name')} ({want!r}); was the pod relabelled?"
            )
    return EngineIdentity(md_name, revision, role, str(dep_meta.get("name")))
