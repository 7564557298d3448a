"""The package's folders show its architecture: pure decisions apart from the I/O around them.

``api``, ``gen``, ``build``, ``rollout``, ``verify`` and ``diagnose`` take plain data and return
plain data; only ``kube`` (the client, informers, leader election, metrics) and ``controller``
(the trigger handlers and the reconcile pass) do I/O. A pure module that imports asyncio,
aiohttp, kopf or the I/O folders fails here, naming the module and the import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kvgate
import kvgate_engine

PACKAGE = Path(kvgate.__file__).parent
ENGINE_PACKAGE = Path(kvgate_engine.__file__).parent
# A function reads as one screenful of steps; the CLI's argument table is the one exception.
MAX_FUNCTION_LINES = 100
LONG_BY_DESIGN = {("kvgate/cmd/cli.py", "build_parser")}
PURE = ("api", "gen", "objects", "rollout", "verify", "diagnose")
IO_ONLY = ("asyncio", "aiohttp", "kopf", "kvgate.kube", "kvgate.controller")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _forbidden(path: Path) -> list[str]:
    return sorted(
        name
        for name in _imports(path)
        if any(name == bad or name.startswith(f"{bad}.") for bad in IO_ONLY)
    )


def test_pure_folders_import_no_event_loop_http_kopf_or_io_modules() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): found
        for folder in PURE
        for path in sorted((PACKAGE / folder).rglob("*.py"))
        if (found := _forbidden(path))
    }
    assert offenders == {}


def test_the_purity_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import asyncio\nfrom kvgate.kube import k8s\nfrom kvgate.api import labels\n"
    )
    assert _forbidden(module) == ["asyncio", "kvgate.kube", "kvgate.kube.k8s"]


def _long_functions(root: Path) -> list[tuple[str, str, int]]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                where = f"{root.name}/{path.relative_to(root)}"
                if lines > MAX_FUNCTION_LINES and (where, node.name) not in LONG_BY_DESIGN:
                    found.append((where, node.name, lines))
    return found


def test_no_function_is_over_100_lines_outside_the_cli_argument_table() -> None:
    long = _long_functions(PACKAGE) + _long_functions(ENGINE_PACKAGE)
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines (split them into steps): {long}"


def test_the_function_length_check_sees_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "long.py").write_text(f"def long() -> None:\n{body}\n")
    assert _long_functions(tmp_path) == [(f"{tmp_path.name}/long.py", "long", 101)]


def test_the_package_top_level_holds_at_most_ten_modules() -> None:
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 10, modules


def test_every_folder_says_in_its_docstring_what_lives_there() -> None:
    undocumented = [
        folder.name
        for folder in sorted(PACKAGE.iterdir())
        if (folder / "__init__.py").is_file()
        and not ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
    ]
    assert undocumented == []


def test_the_production_image_and_the_cli_hold_no_e2e_code() -> None:
    """The image copies the operator and engine packages only, and nothing the ``kvgate``
    command can run reaches the e2e world (``make demo`` runs ``python -m kvgate_e2e.demo``)."""
    root = PACKAGE.parents[1]
    dockerfile = (root / "operator" / "Dockerfile").read_text()
    copies = [line for line in dockerfile.splitlines() if line.startswith("COPY")]
    assert copies and not [line for line in copies if "e2e" in line]
    assert "e2e" not in (root / "operator" / "Dockerfile.dockerignore").read_text()
    reaching = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "kvgate_e2e" in path.read_text()
    )
    assert reaching == []
