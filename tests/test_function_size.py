"""The pure folders (plain data in, plain data out) hold no function over 60 lines: a decision
reads as a few named steps, each of which a newcomer can read and test on its own."""

from __future__ import annotations

import ast
from pathlib import Path

import kvgate
from test_package_layout import PURE

PACKAGE = Path(kvgate.__file__).parent
MAX_PURE_FUNCTION_LINES = 60


def long_functions(folder: Path, limit: int = MAX_PURE_FUNCTION_LINES) -> list[str]:
    """``path:function (lines)`` of every function or method in ``folder`` over ``limit`` lines
    (end_lineno - lineno + 1: decorators aside, its docstring and body included)."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    where = path.relative_to(folder.parent)
                    found.append(f"{where}:{node.name} ({lines} lines)")
    return found


def test_no_function_in_the_pure_folders_is_over_60_lines() -> None:
    long = [f for folder in PURE for f in long_functions(PACKAGE / folder)]
    assert long == [], (
        f"functions over {MAX_PURE_FUNCTION_LINES} lines in the pure folders; split each into "
        f"steps named for what they decide: {long}"
    )


def test_the_size_check_sees_a_long_method(tmp_path: Path) -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_PURE_FUNCTION_LINES))
    folder = tmp_path / "pure"
    folder.mkdir()
    (folder / "decide.py").write_text(f"class Plan:\n    def step(self) -> None:\n{body}\n")
    assert long_functions(folder) == ["pure/decide.py:step (61 lines)"]
    assert long_functions(folder, limit=61) == []
