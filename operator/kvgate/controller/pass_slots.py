"""Pass slots: at most N ModelDeployment passes at once; the next free slot goes to the waiting
pass kvgate.rollout.pass_priority picks (asked-for first, namespaces in turn, in flight before
settled, then first come), and a few slots only to a pass asked for
(``pass_priority.reserved_slots``)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from kvgate.kube import metrics
from kvgate.rollout.pass_priority import (
    PassClass,
    WaitingPass,
    may_take_slot,
    next_pass,
    reserved_slots,
)

PassKey = tuple[str, str]  # (namespace, name) of a ModelDeployment


class PassSlots:
    """A semaphore of ``size`` slots whose waiters are served in pass_priority's order;
    ``reserved`` of them (default: pass_priority.reserved_slots) only for a pass asked for."""

    def __init__(self, size: int, reserved: int | None = None) -> None:
        if size < 1:
            raise ValueError(f"pass slots: size must be at least 1, got {size}")
        self.size = size
        self.reserved = reserved_slots(size) if reserved is None else reserved
        self._free = size
        self._arrivals = itertools.count()
        self._grants = itertools.count()
        # enqueued -> (the waiting pass, its ModelDeployment, the future its slot is handed on)
        self._waiting: dict[int, tuple[WaitingPass, PassKey, asyncio.Future[PassClass]]] = {}
        self._by_key: dict[PassKey, int] = {}
        # Passes of each namespace waiting or holding a slot, and the grant each such namespace
        # last had. A namespace with none comes back first in line, once: its first pass then
        # holds a slot, so the namespace stays counted while it has any pass waiting or running
        # (and a deleted namespace is forgotten).
        self._active: Counter[str] = Counter()
        self._last_served: dict[str, int] = {}

    @property
    def busy(self) -> int:
        """Slots held by a running pass."""
        return self.size - self._free

    @property
    def waiting(self) -> dict[PassClass, int]:
        """Waiting passes by class."""
        counts = Counter(p.pass_class for p, _, _ in self._waiting.values())
        return {c: counts.get(c, 0) for c in PassClass}

    async def acquire(self, key: PassKey, pass_class: PassClass) -> PassClass:
        """Take a slot for ``key``'s pass, waiting for its turn when none is free; every
        acquire is followed by one ``release(key)``. Returns the pass's class when it got the
        slot (``reclassify`` may have raised it meanwhile)."""
        self._active[key[0]] += 1
        if not self._waiting and may_take_slot(pass_class, self._free, self.reserved):
            self._free -= 1
            self._last_served[key[0]] = next(self._grants)
            metrics.PASS_SLOT_WAIT.labels(pass_class.name.lower()).observe(0)
            return pass_class
        waiting = WaitingPass(key[0], pass_class, next(self._arrivals))
        loop = asyncio.get_running_loop()
        since = loop.time()
        future: asyncio.Future[PassClass] = loop.create_future()
        self._waiting[waiting.enqueued] = (waiting, key, future)
        self._by_key[key] = waiting.enqueued
        self._hand_on()  # a free slot this class may take, and nobody ahead of it
        try:
            granted = await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(key)  # handed a slot just as it was cancelled: pass it on
            else:
                self._forget(waiting.enqueued)
                self._done(key[0])
            raise
        metrics.PASS_SLOT_WAIT.labels(granted.name.lower()).observe(loop.time() - since)
        return granted

    def release(self, key: PassKey) -> None:
        """``key``'s pass is over: hand its slot to the waiting pass next in order, or free
        it."""
        self._done(key[0])
        self._free += 1
        self._hand_on()

    def _hand_on(self) -> None:
        """Give free slots to the waiting passes next in order, while the next may take one (a
        reserved slot waits for a pass asked for)."""
        while self._waiting:
            chosen = next_pass((w for w, _, _ in self._waiting.values()), self._last_served)
            assert chosen is not None
            if not may_take_slot(chosen.pass_class, self._free, self.reserved):
                return
            _, waiter, future = self._waiting[chosen.enqueued]
            self._forget(chosen.enqueued)
            if not future.done():
                self._free -= 1
                self._last_served[waiter[0]] = next(self._grants)
                future.set_result(chosen.pass_class)  # the slot goes straight to the waiter
            # else: cancelled, not yet woken to say so: its acquire counts it out.

    def reclassify(self, key: PassKey, pass_class: PassClass) -> None:
        """``key``'s waiting pass (if one waits) is now of ``pass_class``, in its place in arrival
        order: a rollback asked while it waited moves it ahead."""
        enqueued = self._by_key.get(key)
        if enqueued is None:
            return
        waiting, key, future = self._waiting[enqueued]
        self._waiting[enqueued] = (
            WaitingPass(waiting.namespace, pass_class, enqueued),
            key,
            future,
        )
        self._hand_on()  # asked for now: it may take a reserved slot

    @asynccontextmanager
    async def slot(self, key: PassKey, pass_class: PassClass) -> AsyncIterator[PassClass]:
        """Hold one slot for ``key``'s pass; yields its class when it got the slot."""
        granted = await self.acquire(key, pass_class)
        try:
            yield granted
        finally:
            self.release(key)

    def _forget(self, enqueued: int) -> None:
        entry = self._waiting.pop(enqueued, None)
        if entry is None:
            return
        key = entry[1]
        if self._by_key.get(key) == enqueued:
            del self._by_key[key]

    def _done(self, namespace: str) -> None:
        self._active[namespace] -= 1
        if self._active[namespace] <= 0:
            del self._active[namespace]
            self._last_served.pop(namespace, None)
