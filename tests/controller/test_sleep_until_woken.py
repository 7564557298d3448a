"""How every verifier and ModelDeployment loop waits: for a wake-up or its deadline."""

from __future__ import annotations

import asyncio
import math
import time
import tracemalloc
from collections.abc import Callable

from kvgate.controller.runtime import Wake, sleep_until_woken


async def test_a_wake_up_ends_the_sleep_and_is_cleared() -> None:
    wake = Wake()
    asyncio.get_running_loop().call_later(0.05, wake.set)
    started = time.monotonic()
    assert await sleep_until_woken(wake, 30.0) is True
    assert time.monotonic() - started < 5.0
    assert not wake.is_set()


async def test_the_deadline_ends_the_sleep_unwoken() -> None:
    started = time.monotonic()
    assert await sleep_until_woken(Wake(), 0.05) is False
    assert time.monotonic() - started >= 0.04


async def test_a_wake_up_that_came_before_the_sleep_counts_even_past_the_deadline() -> None:
    wake = Wake()
    wake.set()
    assert await sleep_until_woken(wake, -1.0) is True
    assert not wake.is_set()


async def test_an_endless_sleep_still_wakes() -> None:
    wake = Wake()
    asyncio.get_running_loop().call_later(0.05, wake.set)
    assert await sleep_until_woken(wake, math.inf) is True


async def test_a_sleeper_costs_no_task_of_its_own() -> None:
    """10,000 sleepers at 1,000 ModelDeployments: a task each for the wait was 11 MiB."""
    wake = Wake()
    before = len(asyncio.all_tasks())
    sleeper = asyncio.create_task(sleep_until_woken(wake, 30.0))
    await asyncio.sleep(0.01)
    assert len(asyncio.all_tasks()) == before + 1  # the sleeper itself, nothing more
    wake.set()
    assert await sleeper is True


async def test_a_wake_wakes_every_sleeper_and_a_cancelled_one_leaves_nothing_behind() -> None:
    wake = Wake()
    first = asyncio.create_task(sleep_until_woken(wake, 30.0))
    second = asyncio.create_task(wake.wait())
    cancelled = asyncio.create_task(wake.wait())
    await asyncio.sleep(0.01)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    wake.set()
    assert await first is True and await second is True
    assert not wake.is_set()  # the sleeper cleared it
    assert await sleep_until_woken(wake, 0.01) is False
    assert wake._waiters is None


def test_a_wake_costs_a_fraction_of_an_asyncio_event() -> None:
    """One per engine pod and per ModelDeployment: 10,000 at 1,000 ModelDeployments."""

    def traced(make: Callable[[], object]) -> int:
        tracemalloc.start()
        try:
            kept = [make() for _ in range(1000)]
            size = tracemalloc.get_traced_memory()[0]
            del kept
            return size
        finally:
            tracemalloc.stop()

    assert traced(Wake) * 4 < traced(asyncio.Event)
