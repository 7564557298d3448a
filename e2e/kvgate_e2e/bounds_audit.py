"""Find timing bounds in e2e code that are bare numbers: a numeric literal given as the deadline
of a wait (``poll_until``, ``deadline_loop``, ``Deadline``, ``wait_*``, ``until``, ``.wait``) or
as a ``timeout``/``deadline`` keyword, with no comment on its line or the line before.

Every bound in a test must come from something the run measured or be a deadline whose comment
names what it bounds and why that number (docs/testing.md); a bare number is usually a guess of
this machine's speed. ``python -m kvgate_e2e.bounds_audit FILE...`` lists them (exit 1 if any);
``e2e/tests/test_bounds_audit_unit.py`` keeps the files that were cleaned clean.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

_WAITS = frozenset({"poll_until", "deadline_loop", "Deadline", "until", "wait"})
_KEYWORDS = ("timeout", "deadline")


@dataclass(frozen=True)
class BareBound:
    path: str
    line: int
    value: float
    code: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.value:g}: {self.code}"


def _number(node: ast.expr) -> float | None:
    if isinstance(node, ast.Constant):
        value = node.value
        # bool is an int: True is no bound
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _bounds(call: ast.Call) -> Iterator[ast.expr]:
    name = _name(call)
    if name in _WAITS or name.startswith("wait_"):
        # The first argument of a wait is what it waits for (a name, a probe), except Deadline's.
        yield from call.args if name == "Deadline" else call.args[1:]
    for keyword in call.keywords:
        if keyword.arg and any(k in keyword.arg for k in _KEYWORDS):
            yield keyword.value


def bare_bounds(path: Path, source: str | None = None) -> list[BareBound]:
    """The bare numeric bounds in one Python file."""
    text = path.read_text() if source is None else source
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call):
            continue
        for arg in _bounds(node):
            value = _number(arg)
            if value is None or value == 0:
                continue
            line = lines[arg.lineno - 1]
            before = lines[arg.lineno - 2].strip() if arg.lineno >= 2 else ""
            if "#" in line or before.startswith("#"):
                continue
            found.append(BareBound(str(path), arg.lineno, value, line.strip()))
    return sorted(found, key=lambda b: b.line)


def main(argv: Sequence[str] | None = None) -> int:
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    found = [bound for path in paths for bound in bare_bounds(path)]
    for bound in found:
        print(bound)
    print(f"{len(found)} bare bounds in {len(paths)} files", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
