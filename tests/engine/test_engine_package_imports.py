"""kvgate_engine stands alone: no module of it imports the operator package ``kvgate``.

The operator imports the engine package (launcher, probe, verdict); an import the other way makes
a package cycle. Read from the source, so that an import inside a function counts as well.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kvgate_engine

ENGINE_PACKAGE = Path(kvgate_engine.__file__).parent


def imported_packages(source: str) -> set[str]:
    """The top-level package names ``source`` imports (relative imports excluded)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_imported_packages_sees_every_form_of_import() -> None:
    source = (
        "import kvgate.api.models\nfrom kvgate import x\ndef f():\n    import kvgate_engine.plan\n"
    )
    assert imported_packages(source) == {"kvgate", "kvgate_engine"}


def test_no_engine_module_imports_the_operator_package() -> None:
    modules = sorted(ENGINE_PACKAGE.rglob("*.py"))
    assert len(modules) > 10  # the whole package was read
    offenders = [
        str(module.relative_to(ENGINE_PACKAGE.parent))
        for module in modules
        if "kvgate" in imported_packages(module.read_text())
    ]
    assert offenders == [], (
        f"{offenders} import kvgate: kvgate_engine must not depend on the operator package; "
        "give the engine code a plain input type and map the API model to it in kvgate"
    )
