"""docs/refusals.md lists every reason kvgate writes and every admission check, from one table
(kvgate.api.refusals); a reason the code writes and the table does not list fails here.

The code is read, not run: every CamelCase string of two words or more in the operator and
engine packages (a reason is one: ``KvPoolTooSmall``), and every one-word string at a place a
reason goes (``reason=``, ``{"reason": ...}``, ``Event(type, reason, message)``,
``_Cond(status, reason, message)``, an ``("Warning", reason, ...)`` tuple), with module constants
resolved. Strings of that shape that are not reasons (Kubernetes kinds, model architectures,
condition types, internal decision names) are listed below with why.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import kvgate
import kvgate_engine
from kvgate.admission import checks
from kvgate.api.refusals import ADMISSION_CHECKS, PLACES, REASONS
from kvgate.gen import refusalsgen

ROOT = Path(kvgate.__file__).resolve().parents[2]
SOURCES = (Path(kvgate.__file__).parent, Path(kvgate_engine.__file__).parent)
# Not scanned: the API models (enum values, the CRD), the catalogue itself, the generators and
# the CPU reference engine (it writes no reason kvgate reports).
SKIPPED = ("api/models.py", "api/refusals.py", "gen/", "reference/")
CAMEL = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+")
EVENT_TYPES = frozenset({"Normal", "Warning"})
# Calls whose argument at this position is a reason.
REASON_ARGUMENT = {"Event": 1, "_Cond": 1, "Finding": 0, "cannot_tell": 0, "Refusal": 1}
# CamelCase strings in the code that are not reasons, and why.
NOT_REASONS: dict[str, str] = {
    # Kubernetes kinds and API words
    "ModelDeployment": "a kind",
    "RoleScale": "a kind",
    "LeaderWorkerSet": "a kind",
    "StatefulSet": "a kind",
    "ReplicaSet": "a kind",
    "NetworkPolicy": "a kind",
    "ServiceAccount": "a kind",
    "RoleBinding": "a kind",
    "AdmissionReview": "a kind",
    "DeleteOptions": "a kind",
    "ValidatingWebhookConfiguration": "a kind",
    "RollingUpdate": "a Deployment strategy",
    "ClusterIP": "a Service type",
    "RuntimeDefault": "a seccomp profile",
    "ClusterFirstWithHostNet": "a DNS policy",
    "BearerToken": "the kubernetes client's api_key key",
    # condition types (the reasons are in the table)
    "EnginesVerified": "a ModelDeployment condition type",
    "ReplicaFailure": "a Deployment and ReplicaSet condition type (its reason FailedCreate is "
    "in the table)",
    # values that are not reasons
    "CannotTell": "kvgate verify's outcome (Safe, Unsafe, CannotTell), not a reason",
    "VerifiedEngines": "where the serving revision was read from (planner.Evidence), internal",
    "OlderKey": "a router key refusal's decision (worker_audit.KeyRefusal), internal",
    "WithinGrace": "the gateway watch's decision, internal (GatewayIgnoredNotReady is written)",
    "GatewayHonouredNotReady": "the gateway watch's decision, internal",
    "GatewayUnreachable": "the gateway watch's decision, logged without its name",
    "NoRouters": "the gateway watch's decision, internal",
    "ContentCheckInconclusive": "a content check that decided nothing: logged by its message and "
    "run again, never written as a reason",
    "KnownAnswer": "a content-check probe's expected answer (status.contentChecks[].probes[]"
    ".expect), not a reason",
    "RecreateGroupOnPodRestart": "a LeaderWorkerSet restart policy",
    "LeaderCreated": "a LeaderWorkerSet startup policy",
}
# Model architectures (config.json "architectures"), not reasons.
ARCHITECTURE = re.compile(r".*(For[A-Z][A-Za-z]+|LMHeadModel|Model)$")


def _files() -> Iterator[Path]:
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            relative = path.relative_to(source).as_posix()
            if not any(relative.startswith(skip) or relative == skip for skip in SKIPPED):
                yield path


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _exports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names.update(e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant))
    return names


def _constants(trees: dict[Path, ast.Module]) -> dict[str, set[str]]:
    """Module-level NAME = "text" of every module, by NAME (a name two modules use maps to
    both values)."""
    found: dict[str, set[str]] = {}
    for tree in trees.values():
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found.setdefault(target.id, set()).add(node.value.value)
    return found


def _values(node: ast.AST | None, constants: dict[str, set[str]]) -> set[str]:
    """The strings an expression at a reason's place can be: literals, constants (``NAME``,
    ``module.NAME``), both arms of ``a if c else b`` and of ``a or b``."""
    if node is None:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name):
        return constants.get(node.id, set())
    if isinstance(node, ast.Attribute):
        return constants.get(node.attr, set())
    if isinstance(node, ast.IfExp):
        return _values(node.body, constants) | _values(node.orelse, constants)
    if isinstance(node, ast.BoolOp):
        return set().union(*(_values(v, constants) for v in node.values))
    return set()


def _call_name(call: ast.Call) -> str:
    func = call.func
    return (
        func.id
        if isinstance(func, ast.Name)
        else func.attr
        if isinstance(func, ast.Attribute)
        else ""
    )


def _reasons_in(tree: ast.Module, where: str, constants: dict[str, set[str]]) -> dict[str, str]:
    """The reason-shaped strings of one module -> file:line."""
    found: dict[str, str] = {}
    skip = _docstrings(tree)
    exported = _exports(tree)
    in_fstrings = {
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
    }
    # A string compared with (``code == "RepoNotFound"``) is read from elsewhere, not written.
    compared = {
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        for side in (node.left, *node.comparators)
        for part in ast.walk(side)
    }
    for node in ast.walk(tree):
        at_reason: set[str] = set()
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in skip
            and id(node) not in in_fstrings
            and id(node) not in compared
            and node.value not in exported
            and CAMEL.fullmatch(node.value)
        ):
            found.setdefault(node.value, f"{where}:{node.lineno}")
        elif isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg == "reason":
                    at_reason |= _values(keyword.value, constants)
            position = REASON_ARGUMENT.get(_call_name(node))
            if position is not None and len(node.args) > position:
                at_reason |= _values(node.args[position], constants)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "reason":
                    at_reason |= _values(value, constants)
        elif (
            isinstance(node, ast.Tuple)
            and len(node.elts) >= 2
            and _values(node.elts[0], {}) & EVENT_TYPES
        ):
            at_reason |= _values(node.elts[1], constants)
        for value in at_reason:
            if re.fullmatch(r"[A-Z][A-Za-z0-9]+", value):
                found.setdefault(value, f"{where}:{getattr(node, 'lineno', 0)}")
    return found


def reasons_in_code() -> dict[str, str]:
    """Every reason-shaped string the operator and engine packages hold -> file:line."""
    trees = {path: ast.parse(path.read_text(), str(path)) for path in _files()}
    constants = _constants(trees)
    found: dict[str, str] = {}
    for path, tree in trees.items():
        for name, where in _reasons_in(tree, path.relative_to(ROOT).as_posix(), constants).items():
            found.setdefault(name, where)
    return found


def _is_reason_shaped(name: str) -> bool:
    return name not in NOT_REASONS and not ARCHITECTURE.fullmatch(name)


def test_every_reason_the_code_writes_is_in_the_table() -> None:
    catalogued = {row.name for row in REASONS}
    missing = {
        name: where
        for name, where in reasons_in_code().items()
        if _is_reason_shaped(name) and name not in catalogued
    }
    assert missing == {}, (
        "reasons the code writes that docs/refusals.md does not list: add a row to "
        "operator/kvgate/api/refusals.py REASONS (or, if it is not a reason, to NOT_REASONS "
        "here, saying what it is), then run python -m kvgate.gen.refusalsgen"
    )


def test_every_reason_in_the_table_is_one_the_code_writes() -> None:
    in_code = set(reasons_in_code())
    stale = sorted(row.name for row in REASONS if row.name not in in_code)
    assert stale == []


def test_the_not_reasons_list_names_only_strings_the_code_holds() -> None:
    assert sorted(set(NOT_REASONS) - set(reasons_in_code())) == []


def test_the_scan_sees_a_reason_wherever_one_is_written() -> None:
    """The scan's own check: each place a reason goes is seen; a docstring, an f-string and
    ``__all__`` are not."""
    source = (
        '"""DocOnly"""\n'
        '__all__ = ["ExportedName"]\n'
        'X = "Oneword"\n'
        "def f(e, n):\n"
        '    e(reason="Keyword")\n'
        '    Event("Warning", X, f"InFstring {n}")\n'
        '    _Cond("False", "Truthy" if n else "Falsy", "")\n'
        '    if n == "ComparedOnly": pass\n'
        '    return {"reason": "Dictvalue"}, ("Normal", "Tuplevalue", "m"), "SomeNewReason"\n'
    )
    tree = ast.parse(source)
    found = _reasons_in(tree, "m.py", _constants({Path("m.py"): tree}))
    assert {
        "Oneword",
        "Keyword",
        "Truthy",
        "Falsy",
        "Dictvalue",
        "Tuplevalue",
        "SomeNewReason",
    } <= set(found)
    assert not {"DocOnly", "ExportedName", "InFstring", "ComparedOnly"} & set(found)


def test_every_admission_check_has_a_row() -> None:
    run = ["check_identity", "check_metadata", "check_size", "parse_model", "check_group_names"]
    run += [check.__name__ for check in checks.CHECKS]
    assert [row.check for row in ADMISSION_CHECKS] == run


def test_every_row_says_where_it_appears_and_a_refusal_says_what_to_change() -> None:
    for row in REASONS:
        assert row.where and set(row.where) <= set(PLACES), row
        assert row.means, row
        if row.refusal:
            assert row.change, row
    assert len({row.name for row in REASONS}) == len(REASONS)


def test_docs_refusals_md_holds_the_generated_tables() -> None:
    document = (ROOT / refusalsgen.REFUSALS_DOC).read_text()
    assert document == refusalsgen.render(document), "run python -m kvgate.gen.refusalsgen"
    for row in REASONS:
        assert f"| `{row.name}` |" in document


def test_the_readme_and_operating_guide_link_the_refusals_page() -> None:
    for page in ("README.md", "docs/operating.md"):
        assert "refusals.md" in (ROOT / page).read_text(), page
