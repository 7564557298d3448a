"""How late the operator's event loop runs what is due: ``kvgate_event_loop_lag_seconds``.

Every watch event, pass, engine read and status write of the operator is a callback on one
asyncio event loop. When that loop has more ready work than one core runs, every callback waits
its turn, a pass somebody asked for included, and no pass slot or request priority can help: the
wait is before any of them. This task asks to be woken every ``interval`` seconds and records by
how much the wake-up came late, so a slow rollback under load shows whether the loop itself was
the queue.
"""

from __future__ import annotations

import asyncio

from kvgate.kube import metrics

INTERVAL_SECONDS = 0.25


async def measure(interval: float = INTERVAL_SECONDS) -> None:
    """Observe the loop's lateness every ``interval`` seconds until cancelled."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(interval)
        metrics.EVENT_LOOP_LAG.observe(max(0.0, loop.time() - asked - interval))
