"""``kill -USR1`` on the operator logs where each asyncio task waits (controller.task_dump)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest
from kvgate.controller import task_dump


async def _inner(event: asyncio.Event) -> None:
    await event.wait()


async def _outer(event: asyncio.Event) -> None:
    await _inner(event)


async def test_the_dump_names_each_task_and_the_innermost_line_it_awaits() -> None:
    event = asyncio.Event()
    task = asyncio.create_task(_outer(event), name="reconcile-models/llama")
    await asyncio.sleep(0)
    text = task_dump.describe_tasks([task])
    event.set()
    await task
    assert "--- reconcile-models/llama (pending)" in text
    assert "in _outer" in text and "in _inner" in text and "in wait" in text
    assert text.index("in _outer") < text.index("in _inner") < text.index("in wait")
    assert "awaiting Future" in text


async def test_sigusr1_logs_the_dump(caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    task_dump.install(loop)
    event = asyncio.Event()
    task = asyncio.create_task(_outer(event), name="verify-pod-a")
    await asyncio.sleep(0)
    try:
        with caplog.at_level(logging.WARNING, logger="kvgate.tasks"):
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(100):
                if any("verify-pod-a" in r.getMessage() for r in caplog.records):
                    break
                await asyncio.sleep(0.01)
        assert any("verify-pod-a" in r.getMessage() for r in caplog.records)
    finally:
        loop.remove_signal_handler(signal.SIGUSR1)
        event.set()
        await task


async def test_a_long_lived_task_that_dies_is_logged_with_its_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from kvgate.controller.runtime import spawn

    async def dies() -> None:
        raise TypeError("can't subtract offset-naive and offset-aware datetimes")

    with caplog.at_level(logging.ERROR, logger="kvgate.runtime"):
        task = spawn(dies(), name="reconcile-models/llama")
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
    [record] = [r for r in caplog.records if r.name == "kvgate.runtime"]
    assert "reconcile-models/llama ended with TypeError" in record.getMessage()
    assert record.exc_info is not None
