"""Local PersistentVolumes of the e2e world: a node directory offered to pods as a claim (pure).

A ``local`` PersistentVolume names a directory of one node (its ``nodeAffinity`` keeps pods that
use it on that node, enforced by the scheduler's VolumeBinding plugin) and is pre-bound to its
claim both ways (the PV's ``claimRef``, the claim's ``volumeName``), so kube-controller-manager's
PV binder binds them at once, with no storage class or provisioner. The loopback kubelet mounts
the claim as the PV's directory (``kvgate_e2e.kubelet.volumes``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

HOSTNAME_LABEL = "kubernetes.io/hostname"


def volume_name(namespace: str, claim: str) -> str:
    """The PersistentVolume behind ``claim`` (cluster-scoped: named after both)."""
    return f"{namespace}-{claim}"


def local_claim(
    claim: str,
    namespace: str,
    path: Path,
    node: str,
    *,
    size: str = "1Gi",
    access_mode: str = "ReadOnlyMany",
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A ``local`` PersistentVolume of ``node`` at ``path`` and the claim bound to it."""
    pv_name = volume_name(namespace, claim)
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "labels": {"e2e.kvgate.io/claim": claim}},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": [access_mode],
            "persistentVolumeReclaimPolicy": "Retain",  # never delete what the test made
            "storageClassName": "",
            "local": {"path": str(path)},
            "claimRef": {"namespace": namespace, "name": claim},
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": HOSTNAME_LABEL, "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                }
            },
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace},
        "spec": {
            "accessModes": [access_mode],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": size}},
        },
    }
    return pv, pvc


def claim_bound(claim: dict[str, Any] | None) -> bool:
    return bool(claim) and ((claim or {}).get("status") or {}).get("phase") == "Bound"
