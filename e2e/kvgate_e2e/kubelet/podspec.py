"""Reading a pod spec the way the kubelet does: downward-API field references, probe settings,
named ports (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


class PodSpecError(ValueError):
    """The pod asks for something the loopback kubelet cannot provide."""


def field_ref_value(pod: Mapping[str, Any], field_path: str) -> str:
    """Value of a ``fieldRef.fieldPath`` (the downward API's supported paths)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": status.get("hostIP"),
        "status.podIP": status.get("podIP"),
        "status.hostIPs": ",".join(i["ip"] for i in status.get("hostIPs") or []),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []),
    }
    if field_path in simple:
        return str(simple[field_path] or "")
    match = _SUBSCRIPT.match(field_path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    if field_path == "metadata.labels":
        return _format_map(meta.get("labels") or {})
    if field_path == "metadata.annotations":
        return _format_map(meta.get("annotations") or {})
    raise PodSpecError(f"fieldRef.fieldPath {field_path!r} is not supported by the downward API")


def _format_map(values: Mapping[str, str]) -> str:
    return "\n".join(f'{k}="{v}"' for k, v in sorted(values.items()))


@dataclass(frozen=True)
class ProbeSettings:
    kind: str  # "httpGet" | "tcpSocket" | "exec" | "grpc"
    handler: Mapping[str, Any]
    initial_delay: float
    period: float
    timeout: float
    success_threshold: int
    failure_threshold: int


def probe_settings(probe: Mapping[str, Any]) -> ProbeSettings:
    """Probe fields with the API defaults (period 10 s, timeout 1 s, thresholds 1 and 3)."""
    for kind in ("httpGet", "tcpSocket", "exec", "grpc"):
        if kind in probe:
            handler = probe[kind]
            break
    else:
        raise PodSpecError(f"probe has no handler (httpGet, tcpSocket, exec, grpc): {probe}")
    return ProbeSettings(
        kind=kind,
        handler=handler,
        initial_delay=float(probe.get("initialDelaySeconds") or 0),
        period=float(probe.get("periodSeconds") or 10),
        timeout=float(probe.get("timeoutSeconds") or 1),
        success_threshold=int(probe.get("successThreshold") or 1),
        failure_threshold=int(probe.get("failureThreshold") or 3),
    )


def resolve_port(port: int | str, container: Mapping[str, Any]) -> int:
    """A probe's ``port``: a number, a numeric string or a named container port."""
    if isinstance(port, int):
        return port
    if port.isdigit():
        return int(port)
    for item in container.get("ports") or []:
        if item.get("name") == port:
            return int(item["containerPort"])
    raise PodSpecError(
        f"container {container.get('name')!r} has no port named {port!r}; "
        "name it in `ports` or use a number"
    )
