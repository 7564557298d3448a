"""The context-manager half every started part of the e2e world shares: ``with part:`` starts
it, and stops it on the way out, also when its own start fails half-way (so what it had
started goes with it)."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Started:
    """A base for parts with ``start()`` and ``stop()``: ``stop()`` must be safe to call on a
    part whose ``start()`` raised at any point."""

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
