"""kvgate_event_loop_lag_seconds (kvgate.controller.loop_lag): a loop kept busy shows as lag."""

from __future__ import annotations

import asyncio
import time

from kvgate.controller import loop_lag
from kvgate.kube.metrics import REGISTRY


def _lag() -> tuple[float, float]:
    total = REGISTRY.get_sample_value("kvgate_event_loop_lag_seconds_sum") or 0.0
    count = REGISTRY.get_sample_value("kvgate_event_loop_lag_seconds_count") or 0.0
    return total, count


async def test_a_callback_that_holds_the_loop_is_recorded_as_that_much_lag() -> None:
    interval = 0.01
    before = _lag()
    window_from = time.monotonic()
    task = asyncio.create_task(loop_lag.measure(interval=interval))
    try:
        await asyncio.sleep(0.05)  # the task's first timers run while the loop is free
        held_from = time.monotonic()
        time.sleep(0.3)  # a callback that holds the loop, as a CPU-bound step does
        held = time.monotonic() - held_from
        while _lag()[1] - before[1] < 6:  # a few more wake-ups after the hold
            await asyncio.sleep(interval)
    finally:
        task.cancel()
    window = time.monotonic() - window_from
    total, count = _lag()
    lag, wakeups = total - before[0], count - before[1]
    # The hold fell inside one wait, which so ended at least ``held - interval`` late; the
    # waits ran one after another inside the window, so the lag and the intervals fit in it.
    assert lag >= held - interval
    assert lag + wakeups * interval <= window
