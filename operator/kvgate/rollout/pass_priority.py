"""Which ModelDeployment passes go first when more are due than may run at once (pure).

A leader that takes over starts one loop per ModelDeployment, and each loop's first pass is due
at once: with 1,000 ModelDeployments, a ModelDeployment applied at the failover waited behind
every settled one's first pass (105.6 s from the kill to its reconciliation, scale benchmark).
A pass of a ModelDeployment that its own status shows settled (its current generation observed,
serving its target revision, Ready) is a catch-up: it waits behind the passes of every
ModelDeployment that is new, edited, rolling out or not Ready (kvgate.kube.probe_slots' two
queues, FIFO within each).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def settled_by_status(body: Mapping[str, Any]) -> bool:
    """Whether the ModelDeployment's status, as kvgate last wrote it, shows it settled at its
    current spec: ``status.observedGeneration`` is ``metadata.generation``, it serves its target
    revision, and its Ready condition is True. Anything missing: not settled (its pass goes
    first)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    generation = meta.get("generation")
    if generation is None or status.get("observedGeneration") != generation:
        return False
    target = status.get("targetRevision")
    if not target or status.get("servingRevision") != target:
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
        if isinstance(c, Mapping)
    )
