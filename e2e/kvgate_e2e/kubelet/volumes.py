"""A pod's volume material on the loopback kubelet: what each volume holds, written to disk.

Secrets and config maps are read from the API server, service-account tokens requested from it
(TokenRequest bound to the pod), downward-API files taken from the pod; emptyDir and hostPath
need nothing written. The container environment reads config maps and secrets the same way.

A persistentVolumeClaim is resolved as the kubelet's volume manager does: the claim must be Bound,
and its PersistentVolume's ``local`` or ``hostPath`` directory (the volume types of this world: a
local PersistentVolume on the node) becomes ``<volumes>/<volume name>``, a symlink the pod's bind
mount follows. A claim that does not exist or is not bound yet keeps the pod in ContainerCreating
(retried every second), as a real kubelet's FailedMount does. Removing the pod's volume material
removes the link, never the volume's files.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kvgate_e2e.kubelet.api import ApiError, KubeApi
from kvgate_e2e.kubelet.podspec import PodSpecError, field_ref_value


async def object_files(
    api: KubeApi, namespace: str, kind: str, name: str, src: Mapping[str, Any]
) -> dict[str, bytes]:
    """The keys of a secret or config map (``kind``: secrets | configmaps), as files: all of
    them, or the ``items`` of ``src`` under their paths; {} for a missing optional one."""
    try:
        obj = await api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}")
    except ApiError as exc:
        if exc.status == 404 and src.get("optional"):
            return {}
        raise
    data: dict[str, bytes] = {}
    for key, value in (obj.get("data") or {}).items():
        data[key] = base64.b64decode(value) if kind == "secrets" else str(value).encode()
    for key, value in (obj.get("binaryData") or {}).items():
        data[key] = base64.b64decode(value)
    items = src.get("items")
    if not items:
        return data
    return {item["path"]: data[item["key"]] for item in items if item["key"] in data}


def downward_files(pod: Mapping[str, Any], items: Sequence[Mapping[str, Any]]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for item in items:
        ref = item.get("fieldRef")
        if ref:
            out[item["path"]] = field_ref_value(pod, ref["fieldPath"]).encode()
    return out


async def request_token(
    api: KubeApi, pod: Mapping[str, Any], audience: str | None, expiration: int
) -> str:
    """A service-account token bound to ``pod`` (what the projected token volume holds)."""
    meta = pod["metadata"]
    sa = pod["spec"].get("serviceAccountName") or "default"
    spec: dict[str, Any] = {
        "expirationSeconds": expiration,
        "boundObjectRef": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "uid": meta["uid"],
        },
    }
    if audience:
        spec["audiences"] = [audience]
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
    result = await api.create(
        f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token", body
    )
    return str(result["status"]["token"])


async def volume_files(
    api: KubeApi, pod: Mapping[str, Any], volume: Mapping[str, Any]
) -> dict[str, bytes] | None:
    """The files of one volume; None for a plain directory (emptyDir) or a host path."""
    namespace = pod["metadata"]["namespace"]
    if "emptyDir" in volume:
        return None
    if "secret" in volume:
        src = volume["secret"]
        return await object_files(api, namespace, "secrets", src.get("secretName", ""), src)
    if "configMap" in volume:
        src = volume["configMap"]
        return await object_files(api, namespace, "configmaps", src.get("name", ""), src)
    if "downwardAPI" in volume:
        return downward_files(pod, volume["downwardAPI"].get("items") or [])
    if "projected" in volume:
        files: dict[str, bytes] = {}
        for source in volume["projected"].get("sources") or []:
            if "serviceAccountToken" in source:
                sat = source["serviceAccountToken"]
                token = await request_token(
                    api, pod, sat.get("audience"), int(sat.get("expirationSeconds") or 3607)
                )
                files[sat.get("path", "token")] = token.encode()
            elif "configMap" in source:
                src = source["configMap"]
                files |= await object_files(api, namespace, "configmaps", src.get("name", ""), src)
            elif "secret" in source:
                src = source["secret"]
                files |= await object_files(api, namespace, "secrets", src.get("name", ""), src)
            elif "downwardAPI" in source:
                files |= downward_files(pod, source["downwardAPI"].get("items") or [])
        return files
    if "hostPath" in volume or "persistentVolumeClaim" in volume:
        return None
    raise PodSpecError(
        f"volume {volume.get('name')!r} uses a source the loopback kubelet does not support "
        "(supported: emptyDir, secret, configMap, downwardAPI, projected, hostPath, "
        "persistentVolumeClaim of a local or hostPath PersistentVolume)"
    )


async def claim_path(api: KubeApi, namespace: str, claim: str) -> Path:
    """The directory of the PersistentVolume bound to ``claim``: its ``local`` or ``hostPath``
    path. ApiError (404) or PodSpecError while the claim is missing or not bound."""
    pvc = await api.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
    phase = (pvc.get("status") or {}).get("phase") or "Pending"
    volume_name = (pvc.get("spec") or {}).get("volumeName")
    if phase != "Bound" or not volume_name:
        raise PodSpecError(
            f"persistentvolumeclaim {namespace}/{claim} is not bound (phase {phase}): waiting"
        )
    pv = await api.get(f"/api/v1/persistentvolumes/{volume_name}")
    spec = pv.get("spec") or {}
    for kind in ("local", "hostPath"):
        source = spec.get(kind)
        if isinstance(source, Mapping) and source.get("path"):
            return Path(str(source["path"]))
    raise PodSpecError(
        f"persistentvolume {volume_name} (claim {namespace}/{claim}) is neither local nor "
        "hostPath: the loopback kubelet mounts only node directories"
    )


def link_claim(target: Path, path: Path) -> None:
    """``target`` becomes a symlink to the volume's directory (replacing an older link)."""
    if not path.is_dir():
        raise PodSpecError(f"the PersistentVolume's directory {path} does not exist on this node")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.is_file():
        target.unlink()
    elif target.exists():
        raise PodSpecError(f"{target} exists and is not a link to a volume")
    target.symlink_to(path, target_is_directory=True)


def write_files(target: Path, files: Mapping[str, bytes]) -> None:
    """Write each file under ``target`` atomically (a reader never sees half a token)."""
    target.mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        tmp.chmod(0o644)
        tmp.replace(path)


async def write_volumes(api: KubeApi, pod: Mapping[str, Any], root: Path) -> None:
    """Materialise every volume of ``pod`` under ``root/<volume name>``."""
    for volume in pod["spec"].get("volumes") or []:
        target = root / volume["name"]
        if "persistentVolumeClaim" in volume:
            claim = str(volume["persistentVolumeClaim"].get("claimName", ""))
            link_claim(target, await claim_path(api, pod["metadata"]["namespace"], claim))
            continue
        files = await volume_files(api, pod, volume)
        if files is None:  # emptyDir and friends: a plain directory
            target.mkdir(parents=True, exist_ok=True)
            continue
        write_files(target, files)
