"""Waiting for a condition with a deadline: the one poll loop of the e2e harness and tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass
class Deadline:
    """``seconds`` from ``start`` (monotonic); one deadline can span several waits."""

    seconds: float
    start: float = field(default_factory=time.monotonic)

    def remaining(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def expired(self) -> bool:
        return self.remaining() <= 0


def poll_until(
    what: str,
    probe: Callable[[], T | None],
    timeout: float | Deadline,
    *,
    period: float = 0.2,
    retry_on: tuple[type[BaseException], ...] = (Exception,),
    error: Callable[[str], BaseException] = AssertionError,
    details: Callable[[], str] | None = None,
    guard: Callable[[], None] | None = None,
) -> T:
    """Call ``probe`` every ``period`` seconds until it returns something truthy, and return it.

    An exception of a ``retry_on`` kind counts as "not yet" (the probe may race with the object's
    creation) and is named if time runs out. ``guard`` runs before each probe and may raise to
    stop early (a component died). After ``timeout`` raise ``error`` with a message naming
    ``what``, the seconds, the last error and ``details()`` (logs, state).
    """
    deadline = timeout if isinstance(timeout, Deadline) else Deadline(timeout)
    last_error: BaseException | None = None
    while True:
        if guard is not None:
            guard()
        try:
            value = probe()
            if value:
                return value
        except retry_on as exc:
            last_error = exc
        if deadline.expired():
            message = f"timed out after {deadline.seconds:.0f}s waiting for {what}"
            if last_error is not None:
                message += f" (last error: {type(last_error).__name__}: {last_error})"
            if details is not None:
                message += "\n" + details()
            raise error(message)
        time.sleep(min(period, max(deadline.remaining(), 0.01)))
