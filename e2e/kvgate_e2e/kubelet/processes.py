"""A container's process on the loopback kubelet: started in its own session, its output logged,
stopped with SIGTERM and, when its grace period runs out, SIGKILL to the whole process group.

Output goes through two pipes (stdout, stderr) to one pump thread per container instance (a
blocked event loop never blocks a container's writes), which appends it to the container's raw
log ``<pod dir>/<container>.log`` (every instance after its ``=====`` header line, as before:
``log_path``) and writes the CRI log of that instance, ``<pod dir>/logs/<container>/<restart
count>.log``, one timestamped record per line (``kubelet_logs.CriFramer``), which the kubelet's
``containerLogs`` endpoint serves (``kubelet_log_server``)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate_e2e.kubelet.logs import STDERR, STDOUT, CriFramer

# After the process exits, how long the log waits for the pipes' end (a child that outlived the
# container's main process may hold them) before a follower's stream is ended anyway.
LOG_DRAIN_SECONDS = 1.0


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


class ContainerLog:
    """One container instance's output: pumped from its pipes into the raw log and its CRI log
    (``path``). ``wait_change`` lets a follower on an event loop sleep until the pump wrote
    more; ``done()`` once the instance exited and its output is all written."""

    def __init__(self, raw_path: Path, path: Path, header: str, restart_count: int) -> None:
        self.raw_path = raw_path
        self.path = path
        self.restart_count = restart_count
        self.pid: int | None = None
        self.finished = threading.Event()  # both pipes at their end, files closed
        self._exited_at: float | None = None
        self._lock = threading.Lock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._raw = raw_path.open("ab")
        self._raw.write(header.encode())
        self._raw.flush()
        self._cri = path.open("ab")

    def start_pump(self, fds: Mapping[int, str]) -> None:
        """Pump ``fds`` (read end -> stream name) until all are at their end (a thread)."""
        threading.Thread(
            target=self._pump, args=(dict(fds),), name=f"log-{self.path.parent.name}", daemon=True
        ).start()

    def _pump(self, fds: dict[int, str]) -> None:
        framers = {fd: CriFramer(stream) for fd, stream in fds.items()}
        try:
            with selectors.DefaultSelector() as sel:
                for fd in fds:
                    sel.register(fd, selectors.EVENT_READ)
                while sel.get_map():
                    for key, _ in sel.select():
                        fd = int(key.fd)
                        try:
                            data = os.read(fd, 65536)
                        except OSError:
                            data = b""
                        if data:
                            self._raw.write(data)
                            records = framers[fd].feed(data)
                        else:
                            sel.unregister(fd)
                            os.close(fd)
                            records = framers[fd].close()
                        if records:
                            self._cri.write(b"".join(records))
                        self._raw.flush()
                        self._cri.flush()
                        self._notify()
        finally:
            with contextlib.suppress(OSError):
                self._raw.close()
            with contextlib.suppress(OSError):
                self._cri.close()
            self.finished.set()
            self._notify()

    def close_unstarted(self) -> None:
        """The process never started: close the files."""
        self._raw.close()
        self._cri.close()
        self.finished.set()

    def mark_exited(self) -> None:
        self._exited_at = time.monotonic()
        self._notify()

    def done(self) -> bool:
        """The instance has exited and its log is complete (or its pipes outlived it by
        LOG_DRAIN_SECONDS): a follower reads to the end and stops."""
        if self.finished.is_set():
            return True
        return self._exited_at is not None and time.monotonic() - self._exited_at > (
            LOG_DRAIN_SECONDS
        )

    def _notify(self) -> None:
        with self._lock:
            waiters = list(self._waiters)
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(event.set)

    async def wait_change(self, timeout: float) -> None:
        """Until the pump writes more, the instance exits, or ``timeout`` seconds."""
        entry = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            self._waiters.add(entry)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(entry[1].wait(), timeout)
        finally:
            with self._lock:
                self._waiters.discard(entry)


@dataclass
class ContainerProcess:
    popen: subprocess.Popen[bytes]
    exited: asyncio.Future[int]
    log: ContainerLog
    started_monotonic: float


def start_process(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    log_path: Path,
    header: str,
    *,
    cri_log_path: Path | None = None,
    restart_count: int = 0,
) -> ContainerProcess:
    """Start ``argv`` in a new session; its stdout and stderr are appended to ``log_path`` after
    ``header`` and framed into the CRI log ``cri_log_path`` (default: ``<log_path without
    .log>/<restart_count>.log``)."""
    if cri_log_path is None:
        cri_log_path = log_path.with_suffix("") / f"{restart_count}.log"
    log = ContainerLog(log_path, cri_log_path, header, restart_count)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    except BaseException:
        for fd in (out_r, err_r):
            os.close(fd)
        log.close_unstarted()
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    log.pid = popen.pid
    log.start_pump({out_r: STDOUT, err_r: STDERR})
    return ContainerProcess(popen, wait_in_thread(popen), log, time.monotonic())


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
