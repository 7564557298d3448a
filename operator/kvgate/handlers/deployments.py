"""kvgate-managed Deployments: any change (e.g. a router turning Ready) wakes their MD."""

from __future__ import annotations

from typing import Any

from kvgate import labels
from kvgate.handlers.runtime import Runtime


def on_deployment_event(rt: Runtime, body: dict[str, Any]) -> None:
    meta = body.get("metadata", {})
    rt.wake_md(meta.get("namespace"), meta.get("labels", {}).get(labels.DEPLOYMENT))


def on_router_access_event(rt: Runtime, body: dict[str, Any]) -> None:
    """The router's ServiceAccount, Role or RoleBinding, or a NetworkPolicy: its next pass reads
    them again (kvgate.access_checks)."""
    meta = body.get("metadata", {})
    namespace, name = meta.get("namespace"), meta.get("labels", {}).get(labels.DEPLOYMENT)
    if namespace and name:
        rt.access_changed.add((namespace, name))
    on_deployment_event(rt, body)
