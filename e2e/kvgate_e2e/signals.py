"""Ctrl-C and SIGTERM stop a long-running harness command cleanly (its ``with World()`` exits
and removes the cluster), also when it was started with SIGINT ignored, as a background job
of a non-interactive shell is."""

from __future__ import annotations

import signal
from types import FrameType


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def interrupt_on_signals() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
