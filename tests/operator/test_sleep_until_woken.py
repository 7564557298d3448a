"""How every verifier and ModelDeployment loop waits: for a wake-up or its deadline."""

from __future__ import annotations

import asyncio
import math
import time

from kvgate.handlers.runtime import sleep_until_woken


async def test_a_wake_up_ends_the_sleep_and_is_cleared() -> None:
    wake = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, wake.set)
    started = time.monotonic()
    assert await sleep_until_woken(wake, 30.0) is True
    assert time.monotonic() - started < 5.0
    assert not wake.is_set()


async def test_the_deadline_ends_the_sleep_unwoken() -> None:
    started = time.monotonic()
    assert await sleep_until_woken(asyncio.Event(), 0.05) is False
    assert time.monotonic() - started >= 0.04


async def test_a_wake_up_that_came_before_the_sleep_counts_even_past_the_deadline() -> None:
    wake = asyncio.Event()
    wake.set()
    assert await sleep_until_woken(wake, -1.0) is True
    assert not wake.is_set()


async def test_an_endless_sleep_still_wakes() -> None:
    wake = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, wake.set)
    assert await sleep_until_woken(wake, math.inf) is True


async def test_a_sleeper_costs_no_task_of_its_own() -> None:
    """10,000 sleepers at 1,000 ModelDeployments: a task each for the wait was 11 MiB."""
    wake = asyncio.Event()
    before = len(asyncio.all_tasks())
    sleeper = asyncio.create_task(sleep_until_woken(wake, 30.0))
    await asyncio.sleep(0.01)
    assert len(asyncio.all_tasks()) == before + 1  # the sleeper itself, nothing more
    wake.set()
    assert await sleeper is True
