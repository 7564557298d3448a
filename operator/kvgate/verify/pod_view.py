"""What the operator keeps of a pod it watches: the fields its decisions read, nothing else.

A pod as the API server sends it is ~10 KB of JSON (~55 KiB of Python objects), more than half of it
``metadata.managedFields``, the rest the full container spec (command, args, env, resources, probes,
volume mounts) that kvgate wrote itself and never reads back. Held for every engine and router pod,
that is ~0.5 GB at 9,000 pods (the target: 1,000 ModelDeployments within 300 MB,
docs/design/scale.md). The operator keeps this projection instead: identity and ownership, labels,
kvgate's own annotations, each container's name and ports (the engine and router URLs), and the
status the gate and the verifier read (IP, phase, conditions, container readiness and restarts).

Every reader of ``Runtime.pods`` and ``Runtime.routers`` (kvgate.verify.gate, pod_identity,
group_gate,
gateway_watch, step_check, kv_canary_watch, router_workers) reads only these fields; the tests
feed full API bodies through the watch handlers, so a reader of a dropped field fails them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from typing import Any

from kvgate.api import labels
from kvgate.objects.model_source import FETCH_CONTAINER

Pod = dict[str, Any]

METADATA_FIELDS = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
    "ownerReferences",
)
CONTAINER_FIELDS = ("name", "ports")
STATUS_FIELDS = ("phase", "podIP")  # and the conditions kvgate reads (_read_conditions)
CONTAINER_STATUS_FIELDS = ("name", "ready", "started", "restartCount", "state", "containerID")
INIT_STATUS_FIELDS = ("name", "restartCount", "state", "lastState")


INTERN_MAX = 64  # strings up to this length are shared (keys, condition types, labels, ...)


def compact(value: Any) -> Any:
    """A copy of JSON data whose keys and short strings are interned: thousands of stored pods
    and ModelDeployments then share one "lastTransitionTime", one "True", one label value, one
    node name, instead of holding a copy each (json.loads shares keys only within a document)."""
    if isinstance(value, dict):
        return {sys.intern(k) if isinstance(k, str) else k: compact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [compact(v) for v in value]
    if isinstance(value, str) and len(value) <= INTERN_MAX:
        return sys.intern(value)
    return value


def slim_md(md: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator keeps of a ModelDeployment between passes: everything but
    ``metadata.managedFields`` (the status alone is a dozen fields' worth), compacted."""
    meta = {k: v for k, v in (md.get("metadata") or {}).items() if k != "managedFields"}
    out: dict[str, Any] = compact({**md, "metadata": meta})
    return out


def _pick(source: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: source[key] for key in keys if key in source}


def _read_conditions(conditions: list[Any]) -> list[dict[str, Any]]:
    """The conditions kvgate reads: kvgate's own (whole) and whether the pod is Ready. The
    kubelet's others (PodScheduled, Initialized, ContainersReady, ...) and their timestamps
    were a fifth of a stored pod."""
    out = []
    for cond in conditions:
        kind = cond.get("type") if isinstance(cond, Mapping) else None
        if isinstance(kind, str) and kind.startswith(f"{labels.PREFIX}/"):
            out.append(dict(cond))
        elif kind == "Ready":
            out.append({"type": kind, "status": cond.get("status")})
    return out


# Equal in every pod of one ReplicaSet, so one copy serves them all: ~2.5 KiB a pod, 22 MiB at
# 9,000 engine pods. Nothing modifies them in place (a stored pod's status is
# replaced whole, kvgate.controller.engine_pods._write); test_pod_view proves the sharing.
SHARED_FIELDS = (
    ("metadata", "labels"),
    ("metadata", "ownerReferences"),
    ("metadata", "annotations"),
    ("spec", "containers"),
)
SHARED_MAX = 50_000  # distinct values kept; then the table starts over (pods keep theirs)
_shared: dict[bytes, Any] = {}  # 16-byte digest of the value's JSON -> the value


def digest(value: Any) -> bytes:
    """16 bytes that tell JSON values apart (sorted keys): a key kept per pod instead of the
    JSON itself."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _share(value: Any) -> Any:
    """The one stored copy of a value equal to ``value`` (which becomes it, if none)."""
    key = digest(value)
    found = _shared.get(key)
    if found is None:
        if len(_shared) >= SHARED_MAX:
            _shared.clear()
        found = _shared[key] = value
    return found


def slim(pod: Mapping[str, Any]) -> Pod:
    """The projection of a pod body the operator stores (plain data in, plain data out; the
    input is not modified, and nothing in the result is shared with a dropped field). Its
    SHARED_FIELDS are shared with every stored pod that has equal ones: read them, never
    modify them in place."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    out_meta = _pick(meta, METADATA_FIELDS)
    ours = {
        key: value
        for key, value in (meta.get("annotations") or {}).items()
        if key.startswith(f"{labels.PREFIX}/")
    }
    if ours:
        out_meta["annotations"] = ours
    out: Pod = {"metadata": out_meta}
    for key in ("apiVersion", "kind"):
        if key in pod:
            out[key] = pod[key]
    out_spec: dict[str, Any] = {
        "containers": [_pick(c, CONTAINER_FIELDS) for c in spec.get("containers") or []]
    }
    if "nodeName" in spec:
        out_spec["nodeName"] = spec["nodeName"]
    out["spec"] = out_spec
    out_status = _pick(status, STATUS_FIELDS)
    if "conditions" in status:
        out_status["conditions"] = _read_conditions(status.get("conditions") or [])
    if "containerStatuses" in status:
        out_status["containerStatuses"] = [
            _pick(s, CONTAINER_STATUS_FIELDS) for s in status.get("containerStatuses") or []
        ]
    downloads = [  # the model download's init container only (kvgate.rollout.model_download)
        _pick(s, INIT_STATUS_FIELDS)
        for s in status.get("initContainerStatuses") or []
        if isinstance(s, Mapping) and s.get("name") == FETCH_CONTAINER
    ]
    if downloads:
        out_status["initContainerStatuses"] = downloads
    out["status"] = out_status
    compacted: Pod = compact(out)
    for part, key in SHARED_FIELDS:
        if key in compacted[part]:
            compacted[part][key] = _share(compacted[part][key])
    return compacted


WORKLOAD_METADATA_FIELDS = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "labels",
    "ownerReferences",
)
WORKLOAD_SPEC_FIELDS = ("replicas", "selector")
WORKLOAD_CONDITION = "ReplicaFailure"  # the one Deployment condition kept
WORKLOAD_STATUS_FIELDS = (
    "observedGeneration",
    "replicas",
    "updatedReplicas",
    "readyReplicas",
    "availableReplicas",
    "unavailableReplicas",
)


def slim_workload(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator keeps of one of its Deployments (Runtime.deployments): identity and
    ownership, labels, kvgate's own annotations, the replicas asked and reached. Its pod
    template (~10 KB of JSON a Deployment, with managedFields; 3,000 of them at 1,000
    ModelDeployments) is kvgate's own build, which the passes compare through the template hash
    annotation, never field by field. Readers: the pass's workload_state, _pods_of and
    workload_writes.deployment_writes (replicas, annotations, kind); test_pod_view feeds them
    full bodies and slim ones and asserts the same writes."""
    meta = body.get("metadata") or {}
    out_meta = _pick(meta, WORKLOAD_METADATA_FIELDS)
    if "annotations" in meta:  # absent stays absent: a JSON patch must then add the map
        annotations = meta["annotations"]
        out_meta["annotations"] = (
            {k: v for k, v in annotations.items() if k.startswith(f"{labels.PREFIX}/")}
            if isinstance(annotations, Mapping)
            else annotations
        )
    out: dict[str, Any] = {
        **{key: body[key] for key in ("apiVersion", "kind") if key in body},
        "metadata": out_meta,
        "spec": _pick(body.get("spec") or {}, WORKLOAD_SPEC_FIELDS),
        "status": _pick(body.get("status") or {}, WORKLOAD_STATUS_FIELDS),
    }
    # Of the conditions, only ReplicaFailure: the pods its ReplicaSet cannot create, in the API
    # server's words (kvgate.rollout.pod_creation); the others are timestamps kvgate never reads.
    failures = [
        dict(c)
        for c in (body.get("status") or {}).get("conditions") or []
        if isinstance(c, Mapping) and c.get("type") == WORKLOAD_CONDITION
    ]
    if failures:
        out["status"]["conditions"] = failures
    compacted: dict[str, Any] = compact(out)
    return compacted
