"""The package's folders show its architecture: pure decisions apart from the I/O around them.

``api``, ``objects``, ``verify``, ``gen``, ``admission``, ``rollout`` and ``diagnose`` take plain
data and return plain data; ``kube`` (the client, informers, leader election, metrics),
``webhook`` (the admission server) and ``controller`` (the trigger handlers and the reconcile pass)
do I/O. A pure module that imports asyncio, aiohttp, kopf or the I/O folders fails here, naming
the module and the import.

The folders are layered (``LAYERS``, lowest first, the order docs/architecture.md states): a
module imports only its own folder and the folders below it, at the top or inside a function.
An import against that order fails here, naming the module, the line and the import.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import kvgate
import kvgate_engine

PACKAGE = Path(kvgate.__file__).parent
ENGINE_PACKAGE = Path(kvgate_engine.__file__).parent
# A function reads as one screenful of steps; the CLI's argument table is the one exception.
MAX_FUNCTION_LINES = 100
LONG_BY_DESIGN = {("kvgate/cmd/cli.py", "build_parser")}
PURE = ("api", "objects", "verify", "gen", "admission", "rollout", "diagnose")
IO_ONLY = ("asyncio", "aiohttp", "kopf", "kvgate.kube", "kvgate.webhook", "kvgate.controller")
# Lowest first: each folder may import only itself and the folders before it.
LAYERS = (
    "api",
    "objects",
    "verify",
    "gen",
    "admission",
    "rollout",
    "diagnose",
    "modelfetch",
    "kube",
    "webhook",
    "controller",
    "cmd",
)
ARCHITECTURE_DOC = PACKAGE.parents[1] / "docs" / "architecture.md"


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


def _kvgate_imports(path: Path, package: Path) -> list[tuple[int, str]]:
    """Every ``kvgate.*`` module ``path`` imports, with its line: top-level and function-level
    ``import`` and ``from ... import`` alike, relative ones resolved against ``package``."""
    parts = path.relative_to(package.parent).with_suffix("").parts
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = parts[: len(parts) - node.level] if node.level else ()
            module = ".".join([*base, *([node.module] if node.module else [])])
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.startswith(f"{package.name}.")]


def _against_the_layers(package: Path, layers: tuple[str, ...]) -> list[str]:
    """``folder/module.py:line imports kvgate.x.y`` for every import of a folder above the
    module's own (or of a folder the order does not name)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if len(rel.parts) < 2:
            continue
        own = layers.index(rel.parts[0]) if rel.parts[0] in layers else -1
        for line, name in _kvgate_imports(path, package):
            folder = name.split(".")[1]
            if not (package / folder).is_dir() or folder == rel.parts[0]:
                continue
            if folder not in layers or own < 0 or layers.index(folder) > own:
                found.append(f"{rel}:{line} imports {name}")
    return found


def test_every_folder_has_a_place_in_the_layers() -> None:
    folders = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert sorted(folders) == sorted(LAYERS)


TESTS = PACKAGE.parents[1] / "tests"
# The folders of tests/ that are not a folder of the operator package, and what each holds.
TESTS_OF_OTHER_THINGS = {
    "engine": "kvgate_engine (the estimator, launcher, probe and verdict the operator shares)",
    "plan": "kvgate_engine.plan and `kvgate plan`",
    "reference": "kvgate_engine.reference, the reference engine",
    "conformance": "kvgate's argv and arithmetic against each released SGLang",
    "chart": "charts/kvgate",
    "image": "operator/image, the shipped image",
    "benchmarks": "benchmark scripts, not tests",
    "factories": "builders and fixtures shared by the tests of several folders",
    "fixtures": "data files",
    "golden": "golden files",
}


def test_the_unit_tests_mirror_the_package_folders() -> None:
    """A folder's tests live in tests/<folder>/; every other folder of tests/ says what it is."""
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    untested = [f for f in LAYERS if not list((TESTS / f).glob("test_*.py"))]
    unexplained = sorted(folders - set(LAYERS) - set(TESTS_OF_OTHER_THINGS))
    assert untested == [], f"package folders without tests/<folder>/test_*.py: {untested}"
    assert unexplained == [], f"tests/ folders that mirror no package folder: {unexplained}"


def test_no_module_imports_a_folder_above_its_own_even_inside_a_function() -> None:
    against = _against_the_layers(PACKAGE, LAYERS)
    assert against == [], f"imports against the order {' → '.join(LAYERS)}: {against}"


def test_no_module_imports_a_private_name_of_another_folder() -> None:
    private = [
        f"{path.relative_to(PACKAGE)}:{line} imports {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in _kvgate_imports(path, PACKAGE)
        if name.split(".")[1] != path.relative_to(PACKAGE).parts[0]
        and any(part.startswith("_") and not part.startswith("__") for part in name.split("."))
    ]
    assert private == [], f"another folder's private names (make them public there): {private}"


def test_the_layering_check_sees_an_upward_import_at_the_top_or_in_a_function(
    tmp_path: Path,
) -> None:
    package = tmp_path / "kvgate"
    for folder, text in {
        "low": "from kvgate.low import peer\nfrom kvgate import high\n",
        "high": "import kvgate.low.m\n\ndef f() -> None:\n    from ..low import m\n",
        "mid": "def f() -> None:\n    from kvgate.high.m import thing\n",
    }.items():
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
        (package / folder / "m.py").write_text(text)
    assert _against_the_layers(package, ("low", "mid", "high")) == [
        "low/m.py:2 imports kvgate.high",
        "mid/m.py:2 imports kvgate.high.m.thing",
    ]


def _doc_folders(text: str) -> dict[str, set[str]]:
    """The modules docs/architecture.md names under each ``- **`folder/`**`` entry of its module
    map: a bare ``name.py`` is the entry's folder's, ``other/name.py`` is ``other``'s."""
    named: dict[str, set[str]] = {}
    for entry in re.split(r"\n(?=- \*\*`)", text)[1:]:
        head = re.match(r"- \*\*`(\w+)/`\*\*", entry)
        if head is None:
            continue
        named.setdefault(head.group(1), set())
        for folder, module in re.findall(r"`(?:(\w+)/)?(\w+\.py)`", entry.split("\n\n")[0]):
            named.setdefault(folder or head.group(1), set()).add(module)
    return named


def test_the_architecture_doc_names_every_module_under_its_folder_and_no_other() -> None:
    named = _doc_folders(ARCHITECTURE_DOC.read_text())
    actual = {
        folder: {p.name for p in (PACKAGE / folder).glob("*.py") if p.name != "__init__.py"}
        for folder in LAYERS
    }
    missing = {f: sorted(actual[f] - named.get(f, set())) for f in LAYERS}
    unknown = {f: sorted(m - actual.get(f, set())) for f, m in named.items()}
    assert {f: m for f, m in missing.items() if m} == {}, "modules the doc does not name"
    assert {f: m for f, m in unknown.items() if m} == {}, "modules the doc names that do not exist"


def test_the_architecture_doc_states_the_layering_the_layout_test_enforces() -> None:
    text = ARCHITECTURE_DOC.read_text()
    assert text.count("lowest first:") == 1, "docs/architecture.md states the folders' order once"
    sentence = re.split(r"\.\s", text.split("lowest first:")[1], maxsplit=1)[0]
    assert tuple(re.findall(r"`(\w+)`", sentence)) == LAYERS


def test_the_doc_check_reads_bare_and_foldered_module_names() -> None:
    text = (
        "intro\n\n- **`a/`** — `x.py` and `b/y.py`, see `z.py`;\n  `w.py`\n\n"
        "`v.py` in a later paragraph\n- **`b/`** — `u.py`\n"
    )
    assert _doc_folders(text) == {"a": {"x.py", "z.py", "w.py"}, "b": {"y.py", "u.py"}}


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
