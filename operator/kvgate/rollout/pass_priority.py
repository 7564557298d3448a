"""Which ModelDeployment pass takes the next free pass slot (pure).

At most ``max_concurrent_reconciles`` passes run at once; the others wait. Which one goes next
decides how long a user waits for what they asked, so three rules, in this order:

1. **A pass somebody asked for goes first** (``PassClass.REQUESTED``): a new or edited spec (a
   scale request included), a ``kvgate.io/rollback`` annotation, a RoleScale's new count.
   Asking is one API write per pass, so these cannot crowd out the rest for long.
2. **Namespaces take turns** within a class: the namespace served least recently goes next, so
   a tenant with 200 ModelDeployments that never turn Ready (and keep waking their loops) gets
   every other slot against a tenant with one, not 200 of every 201. Before, every pass of a
   ModelDeployment that was not Ready waited ahead of every pass of a settled one, FIFO: another
   namespace's rollback of a settled ModelDeployment never ran while the first queue stayed full.
3. **Within a namespace**, a pass of a ModelDeployment in flight (rolling out, not Ready) goes
   before a settled one's catch-up (a new leader's first passes: with 1,000 ModelDeployments, one
   applied at a failover waited 105.6 s behind every settled one's first pass, scale
   benchmark), then first come, first served.

Then one slot in ``REQUESTED_SHARE`` (2 of the default 32) is kept for passes asked for: a pass
of another class takes a free slot only while more than that many are free
(``may_take_slot``). Without it an asked-for pass waited for the first running pass to end;
with a tenant's passes holding all 32 slots, each slow because its reads queued behind the
others' (3.2 s a pass on average), the victim's passes waited up to 1.1 s for a slot (fairness
benchmark, traced).

``next_pass`` and ``may_take_slot`` apply them to plain data; kvgate.controller.pass_slots keeps
the queue.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from kvgate.rollout.rollback import ROLLBACK_ANNOTATION

REQUESTED_SHARE = 16  # one slot in this many is kept for passes asked for


def reserved_slots(size: int) -> int:
    """Of ``size`` pass slots, how many only a pass asked for may take: one in REQUESTED_SHARE
    (none below REQUESTED_SHARE slots: a small operator keeps every slot for every pass)."""
    return max(0, size) // REQUESTED_SHARE


class PassClass(IntEnum):
    """How soon a waiting pass is due; lower goes first."""

    REQUESTED = 0  # the user asked for something no pass has acted on yet
    IN_FLIGHT = 1  # rolling out, refused or not Ready: the pass follows the cluster
    SETTLED = 2  # a catch-up: its status shows it serving its current spec, Ready


@dataclass(frozen=True)
class WaitingPass:
    """A pass waiting for a slot: its ModelDeployment's namespace, its class, and its place in
    arrival order (a counter, unique per pass)."""

    namespace: str
    pass_class: PassClass
    enqueued: int


def next_pass(waiting: Iterable[WaitingPass], last_served: Mapping[str, int]) -> WaitingPass | None:
    """The waiting pass the next free slot goes to (None: none waits). ``last_served``: the
    grant number each namespace last had a slot at; a namespace missing from it (never served,
    or none of its passes waited since) goes ahead of every namespace in it."""

    def order(p: WaitingPass) -> tuple[bool, int, PassClass, int]:
        return (
            p.pass_class is not PassClass.REQUESTED,
            last_served.get(p.namespace, -1),
            p.pass_class,
            p.enqueued,
        )

    return min(waiting, key=order, default=None)


def may_take_slot(pass_class: PassClass, free: int, reserved: int) -> bool:
    """Whether a pass of ``pass_class`` may take one of ``free`` slots, ``reserved`` of which
    only a pass asked for may take."""
    if pass_class is PassClass.REQUESTED:
        return free > 0
    return free > reserved


def pass_class(body: Mapping[str, Any], *, requested: bool = False) -> PassClass:
    """The class of the ModelDeployment's next pass, from its body as last seen; ``requested``:
    an event outside the body asked for it (a RoleScale's new count, ``scale_requested``)."""
    if requested or requested_by_body(body):
        return PassClass.REQUESTED
    if settled_by_status(body):
        return PassClass.SETTLED
    return PassClass.IN_FLIGHT


def requested_by_body(body: Mapping[str, Any]) -> bool:
    """Whether the ModelDeployment asks for something no pass has acted on: a spec kvgate has
    not observed (new, or edited: ``metadata.generation`` is not ``status.observedGeneration``)
    or a rollback annotation (the pass that acts on it removes it)."""
    meta = body.get("metadata") or {}
    if ROLLBACK_ANNOTATION in (meta.get("annotations") or {}):
        return True
    generation = meta.get("generation")
    return (
        generation is not None
        and (body.get("status") or {}).get("observedGeneration") != generation
    )


def scale_requested(role_scale: Mapping[str, Any]) -> bool:
    """Whether a RoleScale holds a count kvgate has not acted on: its ``metadata.generation``
    (bumped by every write of its spec: ``kubectl scale``, an autoscaler) is not its
    ``status.observedGeneration``. kvgate's own status writes leave the generation alone."""
    generation = (role_scale.get("metadata") or {}).get("generation")
    observed = (role_scale.get("status") or {}).get("observedGeneration")
    return generation is not None and observed != generation


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
