"""Conformance: the reference engine's KV canary lines are SGLang 0.5.23's, and kvgate reads both.

SGLang's formatter (``srt/kv_canary/runner/violation_reporter.py:_format_violation``), its enums
(``kernels/ops/kv_canary/consts.py`` FailReason, ``kernels/ops/kv_canary/verify.py``
CanaryLaunchTag) and the stats format (``srt/kv_canary/runner/stats_logger.py``) are taken from
the 0.5.23 source with ``ast`` and run here: nothing imports sglang (its modules import torch
kernels). The 0.5.23 tree comes from tests/conformance/setup_env.sh.
"""

from __future__ import annotations

import ast
import enum
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from kvgate.verify import kv_canary
from kvgate_engine.reference import canary
from test_sglang_argv import SUPPORTED_VERSIONS, sglang_envs

pytestmark = pytest.mark.conformance

__all__ = ["sglang_envs"]  # the module fixture this file uses

VERSION = "0.5.23"
ROWS = [
    # kernel_kind, slot_idx, position, stored_token, expected_token, chain_hash, aux, fail bits
    [0, 17, 1_000_003, 0, 0, 0, 0, 2],  # what the reference engine reports (verify_position)
    [4, 5, 9, 11, 12, 2**64 + 7, -1, 1 | 32],  # sweep, chain hash + token
    [1, 3, 4, 5, 6, 0xABC, 0xDEF, 8 | 16],  # a write mismatch
    [99, 0, 0, 0, 0, 0, 0, 0],  # unknown tag, no reason
]


@pytest.fixture(scope="module")
def sglang_tree(sglang_envs: dict[str, Path]) -> Path:
    """0.5.23's source, from the releases the tier installs (once per worker)."""
    return sglang_envs[VERSION] / "sglang"


def _class(source: str, name: str) -> str:
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return ast.get_source_segment(source, node) or ""


def sglang_formatter(root: Path) -> dict[str, Any]:
    """SGLang's own _format_violation with its own enums, executed from the source text."""
    namespace: dict[str, Any] = {"IntEnum": enum.IntEnum, "IntFlag": enum.IntFlag}
    exec(_class((root / "kernels/ops/kv_canary/consts.py").read_text(), "FailReason"), namespace)
    exec(
        _class((root / "kernels/ops/kv_canary/verify.py").read_text(), "CanaryLaunchTag"),
        namespace,
    )
    reporter = (root / "srt/kv_canary/runner/violation_reporter.py").read_text()
    tree = ast.parse(reporter)
    wanted = {"_WRITE_BITS", "_TOKEN_BITS", "_reason_label", "_canary_kind_label"}
    wanted.add("_format_violation")
    for node in tree.body:
        names = (
            {t.id for t in node.targets if isinstance(t, ast.Name)}
            if isinstance(node, ast.Assign)
            else {getattr(node, "name", "")}
        )
        if names & wanted:
            exec(ast.get_source_segment(reporter, node) or "", namespace)
    return namespace


def sglang_stats_format(root: Path) -> str:
    source = (root / "srt/kv_canary/runner/stats_logger.py").read_text()
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "info"
            and node.args
        ):
            first = ast.literal_eval(node.args[0])
            if isinstance(first, str) and first.startswith("[canary] step="):
                return first
    raise AssertionError("no [canary] stats format in stats_logger.py")


@pytest.mark.parametrize("row", ROWS)
def test_reference_violation_lines_are_sglangs_byte_for_byte(
    sglang_tree: Path, row: list[int]
) -> None:
    sglang = sglang_formatter(sglang_tree)["_format_violation"]
    args: dict[str, Any] = {"row": row, "total": 3, "ring_overflow": False, "step_when_pumped": 41}
    assert canary.format_violation(**args) == sglang(**args)


def test_reference_stats_line_is_sglangs(sglang_tree: Path) -> None:
    assert sglang_stats_format(sglang_tree) == canary.STATS_FORMAT


def sglang_log_format(root: Path) -> tuple[str, str]:
    """configure_logger's format and datefmt, as the release's source writes them (the prefix
    and the milliseconds are f-string holes: the scheduler's ranks, SGLANG_LOG_MS)."""
    source = (root / "srt/utils/common.py").read_text()
    found = re.search(
        r'format = f"(\[%\(asctime\)s\{maybe_ms\}\{prefix\}\] %\(message\)s)"', source
    )
    datefmt = re.search(r'datefmt="([^"]+)"', source[source.index("def configure_logger(") :])
    assert found is not None and datefmt is not None, "configure_logger changed its format"
    return found.group(1), datefmt.group(1)


def logged(root: Path, message: str, *, prefix: str, ms: bool) -> str:
    """``message`` as SGLang's configure_logger formats it: its own logging.Formatter."""
    fmt, datefmt = sglang_log_format(root)
    fmt = fmt.replace("{maybe_ms}", ".%(msecs)03d" if ms else "").replace("{prefix}", prefix)
    formatter = logging.Formatter(fmt, datefmt=datefmt)
    record = logging.LogRecord("sglang", logging.WARNING, __file__, 1, message, None, None)
    return formatter.format(record)


def enum_members(root: Path, path: str, name: str) -> list[str]:
    namespace: dict[str, Any] = {"IntEnum": enum.IntEnum, "IntFlag": enum.IntFlag}
    exec(_class((root / path).read_text(), name), namespace)
    return [member.name for member in namespace[name]]


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_kvgate_knows_each_releases_launch_tags_and_fail_reasons(
    sglang_envs: dict[str, Path], version: str
) -> None:
    root = sglang_envs[version] / "sglang"
    tags = enum_members(root, "kernels/ops/kv_canary/verify.py", "CanaryLaunchTag")
    reasons = enum_members(root, "kernels/ops/kv_canary/consts.py", "FailReason")
    assert set(tags) == kv_canary.LAUNCH_TAGS
    assert [r.lower().removesuffix("_mismatch") for r in reasons] == list(kv_canary.FAIL_REASONS)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
@pytest.mark.parametrize("row", ROWS)
def test_kvgate_reads_each_releases_own_violation_record(
    sglang_envs: dict[str, Path], version: str, row: list[int]
) -> None:
    root = sglang_envs[version] / "sglang"
    sglang = sglang_formatter(root)["_format_violation"]
    text = sglang(row=row, total=1, ring_overflow=False, step_when_pumped=2)
    record = text.splitlines()[0]
    for prefix, ms in (("", False), (" TP0", False), (" DP1 PP0 TP3 EP3", True)):
        line = logged(root, text, prefix=prefix, ms=ms).splitlines()[0]
        found = kv_canary.parse_line(f"2026-11-05T12:00:00.123456789Z {line}")
        assert found is not None, line
        fields = dict(field.split("=", 1) for field in record.split(": ", 1)[1].split(" "))
        assert (found.launch_tag, found.fail_reason) == (
            fields["launch_tag"],
            fields["fail_reason"],
        )
        assert (found.slot_idx, found.position) == (row[1], row[2])
        assert (found.stored_token, found.expected_token) == (row[3], row[4])
        assert found.ranks == (prefix.strip() or None)
        assert found.logged_at == "2026-11-05T12:00:00.123456789Z"
        # The record quoted in any other message is not SGLang's record.
        quoted = logged(root, f"Receive: obj=GenerateReqInput(rid={record!r})", prefix="", ms=ms)
        assert kv_canary.parse_line(quoted) is None
    # The record's later lines are details, never a record of their own.
    for rest in text.splitlines()[1:]:
        assert kv_canary.parse_line(rest) is None


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_kvgate_reads_each_releases_stats_line(sglang_envs: dict[str, Path], version: str) -> None:
    root = sglang_envs[version] / "sglang"
    stats = sglang_stats_format(root)
    found = kv_canary.parse_line(
        logged(root, stats % (640, 1234, 2, 1, 4, 12), prefix=" TP0", ms=False)
    )
    assert found is not None and found.total == 1 and found.ranks == "TP0"
    assert (
        kv_canary.parse_line(logged(root, stats % (64, 1, 0, 0, 4, 12), prefix="", ms=False))
        is None
    )


def test_sglangs_test_regex_finds_the_reference_line(sglang_tree: Path) -> None:
    utils = (sglang_tree / "test/kv_canary/violation_log_utils.py").read_text()
    pattern = re.search(r're\.compile\(\s*r"([^"]+)"', utils)
    assert pattern is not None
    line = canary.format_violation(row=ROWS[0], total=1, ring_overflow=False, step_when_pumped=1)
    match = re.search(pattern.group(1), line)
    assert match is not None and match.groups() == ("HEAD_K_FULL", "verify_position")
