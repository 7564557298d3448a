"""Which ModelDeployment revision and role a multi-node engine's leader pod belongs to (pure).

The LeaderWorkerSet counterpart of kvgate.verify.pod_identity. A leader pod is kvgate's only when
its
controller chain ends at the ModelDeployment: the pod is controlled by the leader StatefulSet
``<lws>``, that StatefulSet by the LeaderWorkerSet ``<md>-<rev>-<role>``, and that
LeaderWorkerSet by the ModelDeployment (its uid). Revision and role are read from the
LeaderWorkerSet, which the operator wrote; the pod's labels must agree, and it must be rank 0
(only the leader serves, so only the leader is verified). The group size is the
LeaderWorkerSet's, for kvgate.verify.group_gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvgate.api import labels, multinode
from kvgate.api.ownership import controller_of, is_controlled_by
from kvgate.objects.builders import component_name
from kvgate.verify.pod_identity import ENGINE_ROLES, EngineIdentity, Unproven

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class LeaderIdentity:
    """A proven leader: its engine identity and its group (LeaderWorkerSet name and size)."""

    engine: EngineIdentity
    lws_name: str
    size: int


def _ref(obj: Obj, kind: str, api_group: str) -> Mapping[str, Any] | None:
    ref = controller_of(obj)
    if ref is None or ref.get("kind") != kind:
        return None
    if str(ref.get("apiVersion", "")).split("/")[0] != api_group:
        return None
    return ref


def statefulset_name(pod: Obj) -> str | None:
    """The StatefulSet controlling the pod, per its ownerReference (not yet proof)."""
    ref = _ref(pod, "StatefulSet", "apps")
    return str(ref["name"]) if ref is not None and ref.get("name") else None


def leader_worker_set_name(statefulset: Obj) -> str | None:
    """The LeaderWorkerSet controlling the StatefulSet, per its ownerReference."""
    ref = _ref(statefulset, multinode.LWS_KIND, multinode.LWS_GROUP)
    return str(ref["name"]) if ref is not None and ref.get("name") else None


def identify_leader(
    pod: Obj, statefulset: Obj | None, lws: Obj | None, md_uid: str | None
) -> LeaderIdentity | Unproven:
    """The leader's revision, role and group when its controller chain ends at the
    ModelDeployment."""
    meta = pod.get("metadata", {})
    who = f"pod {meta.get('name', '?')}"
    pod_labels = meta.get("labels", {}) or {}
    if str(pod_labels.get(multinode.WORKER_INDEX_LABEL, "")) != "0":
        return Unproven(f"{who} is not the leader (rank 0) of a LeaderWorkerSet group")
    sts_ref = _ref(pod, "StatefulSet", "apps")
    if sts_ref is None:
        return Unproven(f"{who} is not controlled by a StatefulSet")
    if statefulset is None or statefulset.get("metadata", {}).get("uid") != sts_ref.get("uid"):
        return Unproven(
            f"{who}: its StatefulSet {sts_ref.get('name')} does not exist (uid differs)"
        )
    lws_ref = _ref(statefulset, multinode.LWS_KIND, multinode.LWS_GROUP)
    if lws_ref is None:
        return Unproven(
            f"{who}: StatefulSet {sts_ref.get('name')} is not controlled by a LeaderWorkerSet"
        )
    if lws is None or lws.get("metadata", {}).get("uid") != lws_ref.get("uid"):
        return Unproven(
            f"{who}: LeaderWorkerSet {lws_ref.get('name')} does not exist (uid differs)"
        )
    lws_meta = lws.get("metadata", {})
    lws_name = str(lws_meta.get("name", ""))
    if not is_controlled_by(lws, md_uid):
        return Unproven(
            f"{who}: LeaderWorkerSet {lws_name} is not controlled by the ModelDeployment"
        )
    lws_labels = lws_meta.get("labels", {}) or {}
    md_name = lws_labels.get(labels.DEPLOYMENT, "")
    revision, role = lws_labels.get(labels.REVISION, ""), lws_labels.get(labels.ROLE, "")
    if role not in ENGINE_ROLES or lws_name != component_name(md_name, revision, role):
        return Unproven(f"{who}: LeaderWorkerSet {lws_name} is not a kvgate engine group")
    if sts_ref.get("name") != lws_name:
        return Unproven(
            f"{who}: StatefulSet {sts_ref.get('name')} is not the leaders' of {lws_name}"
        )
    for key, want in (
        (labels.DEPLOYMENT, md_name),
        (labels.REVISION, revision),
        (labels.ROLE, role),
        (labels.COMPONENT, labels.COMPONENT_ENGINE),
    ):
        if pod_labels.get(key) != want:
            return Unproven(
                f"{who}: label {key}={pod_labels.get(key)!r} differs from its LeaderWorkerSet "
                f"{lws_name} ({want!r}); was the pod relabelled?"
            )
    size = lws.get("spec", {}).get("leaderWorkerTemplate", {}).get("size", 1)
    if not isinstance(size, int) or size < 1:
        return Unproven(f"{who}: LeaderWorkerSet {lws_name} has no group size")
    return LeaderIdentity(EngineIdentity(md_name, revision, role, lws_name), lws_name, size)
