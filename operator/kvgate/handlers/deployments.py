"""kvgate-managed Deployments: any change (e.g. a router turning Ready) wakes their MD."""

from __future__ import annotations

from typing import Any

from kvgate import labels
from kvgate.handlers.runtime import Runtime


def on_deployment_event(rt: Runtime, body: dict[str, Any]) -> None:
    meta = body.get("metadata", {})
    rt.wake_md(meta.get("namespace"), meta.get("labels", {}).get(labels.DEPLOYMENT))
