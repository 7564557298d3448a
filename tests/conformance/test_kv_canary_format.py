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
import re
from pathlib import Path
from typing import Any

import pytest
from kvgate.verify import kv_canary
from kvgate_engine.reference import canary
from test_sglang_argv import sglang_envs

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


def test_kvgate_reads_sglangs_own_lines(sglang_tree: Path) -> None:
    sglang = sglang_formatter(sglang_tree)["_format_violation"]
    text = sglang(row=ROWS[1], total=1, ring_overflow=False, step_when_pumped=2)
    prefixed = f"2026-11-05T12:00:00.123456789Z [2026-11-05 12:00:00 TP0] {text.splitlines()[0]}"
    found = kv_canary.parse_line(prefixed)
    assert found is not None
    assert (found.launch_tag, found.fail_reason, found.slot_idx, found.position) == (
        "SWEEP_K_FULL",
        "verify_chain_hash+verify_token",
        5,
        9,
    )
    assert found.logged_at == "2026-11-05T12:00:00.123456789Z"
    stats = sglang_stats_format(sglang_tree) % (640, 1234, 2, 1, 4, 12)
    assert kv_canary.parse_line(f"[2026-11-05 12:00:00 TP0] {stats}") is not None
    assert kv_canary.parse_line(sglang_stats_format(sglang_tree) % (64, 1, 0, 0, 4, 12)) is None


def test_sglangs_test_regex_finds_the_reference_line(sglang_tree: Path) -> None:
    utils = (sglang_tree / "test/kv_canary/violation_log_utils.py").read_text()
    pattern = re.search(r're\.compile\(\s*r"([^"]+)"', utils)
    assert pattern is not None
    line = canary.format_violation(row=ROWS[0], total=1, ring_overflow=False, step_when_pumped=1)
    match = re.search(pattern.group(1), line)
    assert match is not None and match.groups() == ("HEAD_K_FULL", "verify_position")
