"""Prove which ModelDeployment revision and role a pod belongs to (I/O around
kvgate.verify.pod_identity).

Reads the pod's ReplicaSet and that ReplicaSet's Deployment; a proven chain is cached per pod.
"""

from __future__ import annotations

from typing import Any, cast

from kvgate.controller import group_verify
from kvgate.controller.runtime import Runtime
from kvgate.verify import pod_identity, pod_view
from kvgate.verify.pod_identity import EngineIdentity, Unproven

Pod = dict[str, Any]


def _ownership_fingerprint(pod: Pod) -> bytes:
    """A digest of the pod's ownerReferences and labels (kept per pod: the JSON itself was
    ~350 bytes a pod, 3 MiB at 9,000 engine pods)."""
    meta = pod.get("metadata", {})
    return pod_view.digest([meta.get("ownerReferences"), meta.get("labels")])


async def resolve_identity(
    rt: Runtime,
    pod: Pod,
    md_uid: str | None,
    roles: frozenset[str] = pod_identity.ENGINE_ROLES,
) -> EngineIdentity | Unproven:
    """Prove the pod's revision and role through its controller chain (ReplicaSet -> Deployment
    -> ModelDeployment). A proven chain is cached until the pod's ownerReferences or labels
    change (a ReplicaSet's or Deployment's controller never changes without a new uid), and
    serves the pod's siblings of the same ReplicaSet for a while (Runtime.owner_chains)."""
    meta = pod.get("metadata", {})
    uid, namespace = str(meta.get("uid", "")), str(meta.get("namespace", ""))
    key = _ownership_fingerprint(pod)
    cached = rt.identities.get(uid)
    if cached is not None and cached[0] == key:
        return cast(EngineIdentity, cached[1])
    if group_verify.is_group_pod(pod):  # a multi-node engine's leader: the LeaderWorkerSet chain
        leader = await group_verify.leader_identity(rt, pod, md_uid)
        result: EngineIdentity | Unproven = (
            leader if isinstance(leader, Unproven) else leader.engine
        )
        if isinstance(result, EngineIdentity) and result.role in roles:
            rt.identities[uid] = (key, result)
            return result
        rt.identities.pop(uid, None)
        return result if isinstance(result, Unproven) else Unproven("not an engine pod")
    chain_key = _chain_key(pod, namespace)
    chain = rt.owner_chains.get(chain_key) if chain_key is not None else None
    if chain is not None:  # a sibling pod proved this ReplicaSet's chain moments ago
        cached_rs, cached_deployment = chain
        result = pod_identity.identify(pod, cached_rs, cached_deployment, md_uid, roles)
        if isinstance(result, EngineIdentity):
            rt.identities[uid] = (key, result)
            return result
    if chain_key is None:
        replica_set, deployment = await _read_chain(rt, pod, namespace)
    else:  # the pods of one ReplicaSet start together: one read serves those asking at once
        replica_set, deployment = await rt.owner_chains.read_once(
            chain_key, lambda: _read_chain(rt, pod, namespace)
        )
    result = pod_identity.identify(pod, replica_set, deployment, md_uid, roles)
    if isinstance(result, EngineIdentity):
        rt.identities[uid] = (key, result)
        if chain_key is not None and replica_set is not None and deployment is not None:
            rt.owner_chains.put(chain_key, (_chain_part(replica_set), _chain_part(deployment)))
    else:
        rt.identities.pop(uid, None)
    return result


async def _read_chain(rt: Runtime, pod: Pod, namespace: str) -> tuple[Pod | None, Pod | None]:
    """The pod's ReplicaSet and that ReplicaSet's Deployment, as the API server has them."""
    replica_set = deployment = None
    rs_name = pod_identity.replica_set_name(pod)
    if rs_name:
        replica_set = await rt.api.get("ReplicaSet", namespace, rs_name)
    dep_name = pod_identity.deployment_name(replica_set) if replica_set else None
    if dep_name:
        deployment = await rt.api.get("Deployment", namespace, dep_name)
    return replica_set, deployment


def _chain_key(pod: Pod, namespace: str) -> tuple[str, str, str] | None:
    """(namespace, ReplicaSet name, ReplicaSet uid) of the pod's controller reference."""
    ref = pod_identity.controller_reference(pod, "ReplicaSet")
    if ref is None or not ref.get("name") or not ref.get("uid"):
        return None
    return namespace, str(ref["name"]), str(ref["uid"])


def _chain_part(obj: Pod) -> Pod:
    """What pod_identity.identify reads of a ReplicaSet or Deployment."""
    meta = obj.get("metadata", {})
    return {
        "metadata": {k: meta[k] for k in ("name", "uid", "labels", "ownerReferences") if k in meta}
    }
