"""Probe slots: at most N engines read at once, changed engines first.

Every engine pod is re-read every reverify interval (30 s by default): with 8,000 engines that is
~270 reads a second, queued on the same few slots as the read that follows a restart. In a FIFO
queue the restarted engine waits behind every periodic read queued before it, so the time from a
restart to its verdict would grow with the fleet (the target: re-verified within 1 s p50 among 1,000
ModelDeployments, docs/design/scale.md). Here a read marked urgent — the verifier saw the pod
change: a new IP, readiness, a restart, a first sighting — takes the next free slot before any
periodic read.

``URGENT`` is a context variable so the verifier marks its own task's reads without widening the
probe's signature; a task inherits it only from where it was set.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

URGENT: contextvars.ContextVar[bool] = contextvars.ContextVar("kvgate_probe_urgent", default=False)


class ProbeSlots:
    """A semaphore of ``size`` slots with two FIFO queues: urgent waiters are served first."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"probe slots: size must be at least 1, got {size}")
        self._free = size
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._periodic: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> tuple[int, int]:
        """(urgent, periodic) waiters."""
        return len(self._urgent), len(self._periodic)

    async def acquire(self, *, urgent: bool) -> None:
        if self._free > 0 and not self._urgent and (urgent or not self._periodic):
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._urgent if urgent else self._periodic
        queue.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot just as it was cancelled: pass it on
            elif waiter in queue:
                queue.remove(waiter)
            raise

    def release(self) -> None:
        for queue in (self._urgent, self._periodic):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)  # the slot goes straight to the waiter
                    return
        self._free += 1

    @asynccontextmanager
    async def slot(self, urgent: bool | None = None) -> AsyncIterator[None]:
        """Hold one slot; ``urgent`` defaults to the caller's ``URGENT`` context."""
        await self.acquire(urgent=URGENT.get() if urgent is None else urgent)
        try:
            yield
        finally:
            self.release()
