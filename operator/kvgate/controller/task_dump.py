"""``kill -USR1 <operator pid>``: log where every asyncio task of the operator waits.

A reconcile loop that stops making passes leaves nothing in the log by itself: the process is
alive, the Lease renewed, the event loop idle. The dump names each task (``reconcile-<ns>/<md>``,
``verify-...``, ``content-check-...``) and the chain of awaits it is suspended in, innermost
last, which is what a hang needs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Iterable
from types import FrameType
from typing import Any

log = logging.getLogger("kvgate.tasks")
MAX_DEPTH = 40


def await_chain(coro: Any) -> tuple[list[FrameType], Any]:
    """The frames of ``coro`` and of what it awaits, outermost first, and the last awaitable
    that has no frame (a Future, an Event's waiter), if any."""
    frames: list[FrameType] = []
    for _ in range(MAX_DEPTH):
        frame = next(
            (f for a in ("cr_frame", "gi_frame", "ag_frame") if (f := getattr(coro, a, None))),
            None,
        )
        if frame is None:
            return frames, coro
        frames.append(frame)
        inner = next(
            (
                i
                for a in ("cr_await", "gi_yieldfrom", "ag_await")
                if (i := getattr(coro, a, None)) is not None
            ),
            None,
        )
        if inner is None:
            return frames, None
        coro = inner
    return frames, None


def describe_tasks(tasks: Iterable[asyncio.Task[Any]] | None = None) -> str:
    """Every task (or ``tasks``): its name and the await chain it is suspended in."""
    chosen = list(asyncio.all_tasks() if tasks is None else tasks)
    lines = [f"{len(chosen)} asyncio tasks"]
    for task in sorted(chosen, key=lambda t: t.get_name()):
        frames, leaf = await_chain(task.get_coro())
        state = "done" if task.done() else "pending"
        lines.append(f"--- {task.get_name()} ({state})")
        for frame in frames:
            code = frame.f_code
            lines.append(f"    {code.co_filename}:{frame.f_lineno} in {code.co_name}")
        if leaf is not None:
            lines.append(f"    awaiting {type(leaf).__name__}")
    return "\n".join(lines)


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Log the tasks on SIGUSR1 (where the platform has it)."""
    if hasattr(signal, "SIGUSR1"):
        loop.add_signal_handler(signal.SIGUSR1, lambda: log.warning("%s", describe_tasks()))
