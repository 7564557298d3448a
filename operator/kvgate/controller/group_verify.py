"""Multi-node engines: the I/O around kvgate.verify.lws_identity and kvgate.verify.group_gate.

A leader pod (rank 0 of a LeaderWorkerSet group) is proven through its leader StatefulSet and its
LeaderWorkerSet; its gate condition is computed from the probe's verdict AND its group's workers,
listed by the LeaderWorkerSet's labels and each proven through the group's StatefulSet. Worker
pod events wake the leader's verifier, so a lost or restarted rank takes the engine out of
traffic at once, not at the next re-verification.
"""

from __future__ import annotations

from typing import Any

from kvgate_engine.verdict import Requirement, Verdict

from kvgate.api import labels, multinode
from kvgate.controller.runtime import Runtime
from kvgate.verify import gate, group_gate, lws_identity
from kvgate.verify.lws_identity import LeaderIdentity
from kvgate.verify.pod_identity import Unproven

Pod = dict[str, Any]

# Leader pod uid -> the workers (rank, uid) it was last verified with. In memory only: after an
# operator restart the first pass probes again and records the group it then finds.
_VERIFIED_WITH: dict[str, group_gate.Members] = {}
# Leader pod uid -> how many of its workers' events were seen: part of the leader verifier's
# fingerprint (kvgate.controller.engine_pods), so a worker's change is checked at once.
_WORKER_EVENTS: dict[str, int] = {}


def is_group_pod(pod: Pod) -> bool:
    """Controlled by a StatefulSet: a LeaderWorkerSet's pod (kvgate's Deployments' pods are
    controlled by ReplicaSets). Proof comes from the identity chain, not from this."""
    return lws_identity.statefulset_name(pod) is not None


async def leader_identity(rt: Runtime, pod: Pod, md_uid: str | None) -> LeaderIdentity | Unproven:
    """Read the leader's StatefulSet and LeaderWorkerSet and prove the chain."""
    namespace = str(pod.get("metadata", {}).get("namespace", ""))
    sts_name = lws_identity.statefulset_name(pod)
    statefulset = await rt.api.get("StatefulSet", namespace, sts_name) if sts_name else None
    lws_name = lws_identity.leader_worker_set_name(statefulset) if statefulset else None
    lws = await rt.api.get("LeaderWorkerSet", namespace, lws_name) if lws_name else None
    return lws_identity.identify_leader(pod, statefulset, lws, md_uid)


async def group_of(rt: Runtime, leader: Pod, identity: LeaderIdentity) -> group_gate.GroupState:
    """The leader's group as the API server holds it now."""
    meta = leader.get("metadata", {})
    namespace = str(meta.get("namespace", ""))
    group = str((meta.get("labels") or {}).get(multinode.GROUP_INDEX_LABEL, ""))
    candidates = await rt.api.list(
        "Pod",
        namespace,
        {multinode.LWS_NAME_LABEL: identity.lws_name, multinode.GROUP_INDEX_LABEL: group},
    )
    statefulsets: dict[str, dict[str, Any] | None] = {}
    workers = []
    for pod in candidates:
        if pod.get("metadata", {}).get("uid") == meta.get("uid"):
            continue
        name = lws_identity.statefulset_name(pod)
        if name and name not in statefulsets:
            statefulsets[name] = await rt.api.get("StatefulSet", namespace, name)
        workers.append((pod, statefulsets.get(name) if name else None))
    return group_gate.group_state(leader, identity.lws_name, identity.size, workers)


async def condition(
    rt: Runtime, pod: Pod, verdict: Verdict, requirement: Requirement, md_uid: str | None
) -> gate.Condition | None:
    """The leader's engine-verified condition: the verdict, only with its whole group."""
    uid = str(pod.get("metadata", {}).get("uid", ""))
    identity = await leader_identity(rt, pod, md_uid)
    if isinstance(identity, Unproven):
        _VERIFIED_WITH.pop(uid, None)
        return gate.condition_for_unverifiable(pod, gate.NOT_OWNED, identity.message, rt.clock())
    group = await group_of(rt, pod, identity)
    result = group_gate.condition_for_group(
        pod, verdict, requirement, group, _VERIFIED_WITH.get(uid), rt.clock()
    )
    verified = (result or gate.current_condition(pod) or {}).get("status") == "True"
    if verified:
        _VERIFIED_WITH[uid] = group.members
    else:
        _VERIFIED_WITH.pop(uid, None)
    return result


async def condition_engine_down(rt: Runtime, pod: Pod, md_uid: str | None) -> gate.Condition | None:
    """A verified leader whose own engine is not ready (or that is being deleted): a lost rank
    usually takes rank 0 down with it (SGLang's leader fails with its group; LeaderWorkerSet then
    deletes the leader to recreate the group), so the cause is named when the group misses a
    rank (``EngineGroupIncomplete``), not only the leader's symptom (``EngineNotReady``)."""
    now = rt.clock()
    current = gate.current_condition(pod) or {}
    # Verified until now, or already out for its engine or its group: the worker's status may
    # show the lost rank only after the leader's engine was seen down.
    lost = current.get("status") == "True" or current.get("reason") in (
        gate.ENGINE_NOT_READY,
        group_gate.GROUP_INCOMPLETE,
    )
    if lost:
        identity = await leader_identity(rt, pod, md_uid)
        if not isinstance(identity, Unproven):
            group = await group_of(rt, pod, identity)
            if not group.complete:
                _VERIFIED_WITH.pop(str(pod.get("metadata", {}).get("uid", "")), None)
                return group_gate.condition_for_incomplete(pod, group, now)
    return gate.condition_for_engine_down(pod, now)


def worker_events(uid: str) -> int:
    return _WORKER_EVENTS.get(uid, 0)


def forget(uid: str) -> None:
    _VERIFIED_WITH.pop(uid, None)
    _WORKER_EVENTS.pop(uid, None)


def on_worker_event(rt: Runtime, event_type: str | None, worker: Pod) -> None:
    """A worker changed (created, restarted, deleted): wake its group's leader verifier."""
    meta = worker.get("metadata", {})
    worker_labels = meta.get("labels") or {}
    lws_name = worker_labels.get(multinode.LWS_NAME_LABEL)
    group = worker_labels.get(multinode.GROUP_INDEX_LABEL)
    if not lws_name or group is None:
        return
    md_name = str(worker_labels.get(labels.DEPLOYMENT, ""))
    for uid, pod in rt.pods.of_md(str(meta.get("namespace", "")), md_name):
        pod_meta = pod.get("metadata", {})
        pod_labels = pod_meta.get("labels") or {}
        if (
            pod_meta.get("namespace") == meta.get("namespace")
            and pod_labels.get(multinode.LWS_NAME_LABEL) == lws_name
            and pod_labels.get(multinode.GROUP_INDEX_LABEL) == group
            and group_gate.is_leader(pod)
        ):
            _WORKER_EVENTS[uid] = _WORKER_EVENTS.get(uid, 0) + 1
            rt.pod_wake(uid).set()
