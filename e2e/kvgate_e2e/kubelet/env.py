"""A container's environment on the loopback kubelet: base variables, Services, envFrom, env."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvgate_e2e.kubelet.api import KubeApi
from kvgate_e2e.kubelet.images import expand_vars
from kvgate_e2e.kubelet.podspec import PodSpecError, field_ref_value
from kvgate_e2e.kubelet.volumes import object_files

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


async def container_env(
    api: KubeApi,
    pod_view: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    venv_bin: str,
    service_env: Mapping[str, str],
) -> dict[str, str]:
    """The environment of ``container``; ``pod_view`` is the pod with the status fields the
    kubelet has decided (pod IP, host IP) for the downward API."""
    meta = pod_view["metadata"]
    env: dict[str, str] = {
        "PATH": f"{venv_bin}:{BASE_PATH}",
        "HOME": "/root",
        "HOSTNAME": meta["name"],
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }
    env |= dict(service_env)
    namespace = meta["namespace"]
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("configmaps", "configMapRef"), ("secrets", "secretRef")):
            if key in source:
                ref = source[key]
                files = await object_files(api, namespace, kind, ref.get("name", ""), ref)
                env |= {prefix + k: v.decode() for k, v in files.items()}
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand_vars(str(item["value"]), env)
            continue
        ref = item.get("valueFrom") or {}
        if "fieldRef" in ref:
            env[name] = field_ref_value(pod_view, ref["fieldRef"]["fieldPath"])
        elif "secretKeyRef" in ref or "configMapKeyRef" in ref:
            kind, key = (
                ("secrets", "secretKeyRef")
                if "secretKeyRef" in ref
                else ("configmaps", "configMapKeyRef")
            )
            sel = ref[key]
            files = await object_files(api, namespace, kind, sel["name"], sel)
            if sel["key"] in files:
                env[name] = files[sel["key"]].decode()
            elif not sel.get("optional"):
                raise PodSpecError(f"env {name}: key {sel['key']!r} not in {kind} {sel['name']}")
        elif "resourceFieldRef" in ref:
            env[name] = "0"
        else:
            env.setdefault(name, "")
    return env
