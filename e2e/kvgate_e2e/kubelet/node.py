"""The simulated GPU nodes: CLI syntax, Node object, Node status and Lease bodies (pure).

A node is written ``NAME[:key=value]...``, e.g. ``big:gpus=8:gpu-memory-gib=80`` or
``small-0:pool=small:gpus=8:gpu-memory-gib=24:cpu=32:memory=256Gi``. Fields follow kwok's node
initialisation stage and the kubelet's defaults.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

POOL_LABEL = "kvgate.io/pool"
GPU_MEMORY_KEY = "kvgate.io/gpu-memory-gib"
# A node whose engines get a KV pool of at most N tokens (`--max-total-tokens N` appended by the
# kubelet's image mapping, after every flag kvgate passed: SGLang keeps the last value). The
# exact pool a scenario wants, from the node, where admission cannot see it: a node with less
# free GPU memory is what it stands for. Only the cluster admin can annotate a node.
MAX_TOTAL_TOKENS_ANNOTATION = "e2e.kvgate.io/max-total-tokens"
GPU_RESOURCE = "nvidia.com/gpu"
LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION_SECONDS = 40
KUBELET_VERSION = "v1.37.2"
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
_GIB_RE = re.compile(r"^\d+(\.\d+)?$")


class NodeSpecError(ValueError):
    """A ``--node`` value is malformed."""


@dataclass(frozen=True)
class NodeSpec:
    name: str
    pool: str
    gpus: int = 8
    gpu_memory_gib: float = 80.0
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110


def parse_node_spec(text: str) -> NodeSpec:
    """Parse ``NAME[:gpus=N][:gpu-memory-gib=G][:pool=P][:cpu=C][:memory=M][:pods=N]``."""
    name, *pairs = text.split(":")
    if not _NAME_RE.match(name):
        raise NodeSpecError(
            f"--node {text!r}: node name {name!r} must be a lowercase DNS name, e.g. big-0"
        )
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not value:
            raise NodeSpecError(f"--node {text!r}: {pair!r} is not key=value")
        values[key] = value
    allowed = {"gpus", "gpu-memory-gib", "pool", "cpu", "memory", "pods"}
    unknown = sorted(set(values) - allowed)
    if unknown:
        raise NodeSpecError(
            f"--node {text!r}: unknown key(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    gib = values.get("gpu-memory-gib", "80")
    if not _GIB_RE.match(gib):
        raise NodeSpecError(f"--node {text!r}: gpu-memory-gib={gib} must be a number, e.g. 80")
    for key in ("gpus", "pods"):
        if key in values and not values[key].isdigit():
            raise NodeSpecError(f"--node {text!r}: {key}={values[key]} must be an integer")
    return NodeSpec(
        name=name,
        pool=values.get("pool", name),
        gpus=int(values.get("gpus", "8")),
        gpu_memory_gib=float(gib),
        cpu=values.get("cpu", "64"),
        memory=values.get("memory", "512Gi"),
        pods=int(values.get("pods", "110")),
    )


def pool_cap(node_annotations: Mapping[str, str]) -> int | None:
    """The node's ``e2e.kvgate.io/max-total-tokens``, if set; a ValueError naming it when it is
    not a positive number of tokens."""
    cap = node_annotations.get(MAX_TOTAL_TOKENS_ANNOTATION)
    if cap is None:
        return None
    if not cap.isdigit() or int(cap) <= 0:
        raise ValueError(
            f"node annotation {MAX_TOTAL_TOKENS_ANNOTATION}={cap!r}: expected a positive number "
            "of tokens"
        )
    return int(cap)


def format_gib(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def _arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def node_manifest(spec: NodeSpec) -> dict[str, Any]:
    """The Node object to create (metadata only; status is patched separately)."""
    arch = _arch()
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {
                "kubernetes.io/hostname": spec.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch,
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": arch,
                POOL_LABEL: spec.pool,
                GPU_MEMORY_KEY: format_gib(spec.gpu_memory_gib),
                "nvidia.com/gpu.count": str(spec.gpus),
                "type": "kvgate-loopback",
            },
            "annotations": {
                GPU_MEMORY_KEY: format_gib(spec.gpu_memory_gib),
                "node.alpha.kubernetes.io/ttl": "0",
            },
        },
        "spec": {},
    }


def node_conditions(now: str, heartbeat: str) -> list[dict[str, Any]]:
    def cond(kind: str, status: str, reason: str, message: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": heartbeat,
            "lastTransitionTime": now,
        }

    return [
        cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        cond(
            "MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory"
        ),
        cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID"),
        cond("NetworkUnavailable", "False", "RouteCreated", "loopback network is ready"),
    ]


def node_status(spec: NodeSpec, node_ip: str, now: str, heartbeat: str) -> dict[str, Any]:
    """The ``status`` body for ``nodes/<name>/status``."""
    resources = {
        "cpu": spec.cpu,
        "memory": spec.memory,
        "pods": str(spec.pods),
        "ephemeral-storage": "1Ti",
        GPU_RESOURCE: str(spec.gpus),
    }
    return {
        "capacity": dict(resources),
        "allocatable": dict(resources),
        "addresses": [
            {"type": "InternalIP", "address": node_ip},
            {"type": "Hostname", "address": spec.name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "architecture": _arch(),
            "bootID": "",
            "containerRuntimeVersion": "loopback://0.1.0",
            "kernelVersion": platform.release(),
            "kubeProxyVersion": "",
            "kubeletVersion": KUBELET_VERSION,
            "machineID": "",
            "operatingSystem": "linux",
            "osImage": "kvgate loopback kubelet",
            "systemUUID": "",
        },
        "conditions": node_conditions(now, heartbeat),
        "phase": "Running",
    }


def lease_manifest(node: str, node_uid: str, renew_time: str) -> dict[str, Any]:
    """The heartbeat Lease in ``kube-node-lease`` (owned by the Node, like the kubelet's)."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": node,
            "namespace": LEASE_NAMESPACE,
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}
            ],
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": renew_time,
        },
    }


def gpu_memory_from_node(node: dict[str, Any], default: float) -> float:
    """The node's simulated GPU memory: annotation, then label, then the default."""
    meta = node.get("metadata") or {}
    for source in (meta.get("annotations") or {}, meta.get("labels") or {}):
        value = source.get(GPU_MEMORY_KEY)
        if value is not None and _GIB_RE.match(str(value)):
            return float(value)
    return default
