"""A container's process on the loopback kubelet: started in its own session, logged to a file,
stopped with SIGTERM and, when its grace period runs out, SIGKILL to the whole process group."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any


def wait_in_thread(popen: subprocess.Popen[bytes]) -> asyncio.Future[int]:
    """Future for the exit code, resolved by a small thread (no executor slot held)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[int] = loop.create_future()

    def resolve(code: int) -> None:
        if not fut.done():
            fut.set_result(code)

    def waiter() -> None:
        code = popen.wait()
        with contextlib.suppress(RuntimeError):  # the loop may be closed by now
            loop.call_soon_threadsafe(resolve, code)

    threading.Thread(target=waiter, name=f"wait-{popen.pid}", daemon=True).start()
    return fut


@dataclass
class ContainerProcess:
    popen: subprocess.Popen[bytes]
    exited: asyncio.Future[int]
    log_file: IO[bytes]
    started_monotonic: float


def start_process(
    argv: Sequence[str], env: Mapping[str, str], cwd: str, log_path: Path, header: str
) -> ContainerProcess:
    """Start ``argv`` in a new session, stdout and stderr appended to ``log_path`` after
    ``header``."""
    log_file = log_path.open("ab")
    log_file.write(header.encode())
    log_file.flush()
    popen = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    return ContainerProcess(popen, wait_in_thread(popen), log_file, time.monotonic())


def signal_group(proc: ContainerProcess, sig: int) -> None:
    """Signal the process group (a no-op once it is gone)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.popen.pid, sig)


class KillDeadline:
    """When every process of a pod still running gets SIGKILL (monotonic seconds): none at
    first; a later deletion with a shorter grace period moves it earlier, never later."""

    def __init__(self) -> None:
        self.at = math.inf
        self._moved = asyncio.Event()

    def move_to(self, at: float) -> None:
        if at >= self.at:
            return
        self.at = at
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    def moved(self) -> asyncio.Event:
        """Set when the deadline next moves (a new event after each move)."""
        return self._moved


async def stop_process(proc: ContainerProcess, grace: float, deadline: KillDeadline) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds or at ``deadline``, whichever is first;
    returns once the process has exited (reported at once when it exits on SIGTERM)."""
    if proc.exited.done():
        return
    signal_group(proc, signal.SIGTERM)
    end = time.monotonic() + max(grace, 0.0)
    while not proc.exited.done():
        moved = deadline.moved()
        left = min(end, deadline.at) - time.monotonic()
        if left <= 0:
            signal_group(proc, signal.SIGKILL)
            await proc.exited
            break
        # Until the process exits, the grace runs out, or the deadline moves earlier.
        shortened = asyncio.ensure_future(moved.wait())
        either: list[asyncio.Future[Any]] = [proc.exited, shortened]
        try:
            await asyncio.wait(either, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            shortened.cancel()
    # The group may hold children that outlived the leader.
    signal_group(proc, signal.SIGKILL)
