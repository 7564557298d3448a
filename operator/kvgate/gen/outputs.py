"""The one check-or-write step of every generator: compare each file with the text it should
hold; ``--check`` names the stale ones and writes nothing, otherwise they are written."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path


def check_or_write(wanted: Mapping[Path, str], *, check: bool, command: str) -> int:
    """With ``check``: every file whose text differs from ``wanted`` (or that is missing) is named
    on stderr with ``command``, the way to regenerate it, and the answer is 1 when any is (0
    otherwise); nothing is written. Without: the stale files are written (their folders
    created) and named, and the answer is 0."""
    stale = [path for path, text in wanted.items() if _current(path) != text]
    if check:
        for path in stale:
            print(f"{path} is out of date: run `{command}`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(wanted[path])
        print(f"wrote {path}")
    return 0


def _current(path: Path) -> str | None:
    return path.read_text() if path.exists() else None
