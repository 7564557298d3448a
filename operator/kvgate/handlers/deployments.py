"""kvgate-managed Deployments: any change (e.g. a router turning Ready) wakes their MD."""

from __future__ import annotations

from typing import Any

from kvgate import labels
from kvgate.handlers.runtime import Runtime


def on_deployment_event(rt: Runtime, body: dict[str, Any]) -> None:
    meta = body.get("metadata", {})
    rt.wake_md(meta.get("namespace"), meta.get("labels", {}).get(labels.DEPLOYMENT))


def on_router_access_event(rt: Runtime, event_type: str | None, body: dict[str, Any]) -> None:
    """The router's ServiceAccount, Role or RoleBinding, or a NetworkPolicy, was edited or
    deleted: its next pass reads them again (kvgate.access_checks). ADDED is the echo of the
    pass that created it (whoever creates one under kvgate's name first, the pass that reads
    it finds out; one created after a deletion follows that deletion's event)."""
    meta = body.get("metadata", {})
    namespace, name = meta.get("namespace"), meta.get("labels", {}).get(labels.DEPLOYMENT)
    if namespace and name and event_type != "ADDED":
        rt.access_changed.add((namespace, name))
    on_deployment_event(rt, body)
