"""A warm standby: a replica that does not hold the Lease keeps the operator's own stores current
(ModelDeployments, engine pods, kvgate's Deployments: kvgate.kube.informer) and writes nothing:
no verifier, reconcile loop, status, pod condition or Event runs until it leads
(``Runtime.leading``).

When it takes the Lease it leads from those stores instead of listing from nothing. The scale
benchmark's leader kill at 1,000 ModelDeployments (9,000 engine pods) showed what a cold standby
costs: the new leader listed every pod, then re-read every engine, so a shrunk engine's gate went
False 40.2 s after the kill and a ModelDeployment applied at the kill was reconciled after
105.6 s, with a 331.9 MiB peak. Taking over:

1. every watch is re-opened from the last resourceVersion its store holds, and the leader waits
   until the API server has accepted each (it then replays every change after that version), or,
   when that version is gone (410), until the reflector has listed again: a watch that hung or
   expired while standing by cannot leave the leader acting on a stale store;
2. every ModelDeployment's loop starts (kvgate.controller.md_loops); a new or edited one's first
   pass goes first, and within a namespace a settled one's waits behind those in flight
   (kvgate.rollout.pass_priority);
3. every engine pod's verifier starts (kvgate.controller.engine_pods.take_over): an engine whose
   pod shows it proved itself since it last started is not read again at first sight; the
   others (restarted, refused, changed) are read at once, first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kvgate.controller import engine_pods, md_loops
from kvgate.controller.runtime import Runtime

log = logging.getLogger("kvgate.standby")


WARM_UP_SECONDS = 60.0  # the longest a replica waits for its stores before standing for the Lease


async def warm_up(rt: Runtime, stop: asyncio.Event, limit: float = WARM_UP_SECONDS) -> None:
    """Wait until every store has listed once (or ``limit`` seconds, or ``stop``) before this
    replica stands for the Lease. When a leader dies, its Deployment starts a replacement at
    once, which would otherwise race the warm standby for the expired Lease with empty stores
    (in a 3-ModelDeployment run it won: its first sight of the Lease came as the standby's
    expiry did). The limit keeps a replica whose list cannot complete (a watched namespace it
    may not read) from never leading: it then leads as a cold leader did, listing as it goes."""
    deadline = time.monotonic() + limit
    while not stop.is_set() and not all(r.synced for r in rt.reflectors):
        if time.monotonic() >= deadline:
            log.warning(
                "standing for the Lease before every store is listed (%.0fs): %s",
                limit,
                ", ".join(r.path for r in rt.reflectors if not r.synced),
            )
            return
        await asyncio.sleep(0.05)


async def take_over(
    rt: Runtime, stop: asyncio.Event, holding: asyncio.Future[Any] | None = None
) -> bool:
    """Start leading from the standby's stores (see the module's steps); False when ``stop``
    was set, or ``holding`` (the Lease's renewals) ended, before the watches re-opened (nothing
    was started then)."""
    started = time.monotonic()
    resumed = asyncio.ensure_future(rt.resume_reflectors())
    stopping = asyncio.ensure_future(stop.wait())
    waits: set[asyncio.Future[Any]] = {resumed, stopping}
    if holding is not None:
        waits.add(holding)
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
    if not resumed.done():
        resumed.cancel()
        return False
    resumed.result()
    rt.leading = True
    md_loops.take_over(rt)
    engine_pods.take_over(rt)
    log.info(
        "leading from the standby's stores",
        extra={
            "model_deployments": len(rt.mds),
            "engine_pods": len(rt.pods),
            "deployments": len(rt.deployments),
            "watches_reopened_after_s": round(time.monotonic() - started, 3),
        },
    )
    return True
