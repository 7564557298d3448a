"""The verdict: every branch of judge() on SGLang-shaped payloads, with the numbers."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from kvgate_engine.probe import parse_report
from kvgate_engine.report import EngineReport
from kvgate_engine.verdict import Outcome, Requirement, cannot_tell, judge

FIXTURES = Path(__file__).parents[1] / "fixtures" / "engine"


def load(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def fixture_report(server_info: str, models: str | None = None) -> EngineReport:
    return parse_report(load(server_info), load(models) if models else None)


def healthy(**changes: Any) -> EngineReport:
    """A decode engine that holds a 131,072-token context, with fields replaced."""
    report = EngineReport(
        version="0.5.23",
        role="decode",
        kv_pool_tokens=412_345,
        kv_pool_tokens_per_rank=(412_345,),
        max_req_input_len=131_066,
        effective_context_length=131_072,
        served_model_name="llama-3.1-8b",
    )
    return dataclasses.replace(report, **changes)


CTX = 131_072

# (id, server_info fixture, models fixture, requirement, outcome, reasons in order)
FIXTURE_TABLE = [
    (
        "0.5.23 decode holds the context",
        "server_info_0.5.23_decode.json",
        "models_131072.json",
        Requirement(CTX, role="decode"),
        Outcome.SAFE,
        ["EngineVerified"],
    ),
    (
        "0.5.22 prefill holds the context",
        "server_info_0.5.22_prefill.json",
        "models_131072.json",
        Requirement(CTX, role="prefill"),
        Outcome.SAFE,
        ["EngineVerified"],
    ),
    (
        "0.5.21 is below the 0.5.22 floor",
        "server_info_0.5.21_decode.json",
        "models_131072.json",
        Requirement(CTX, role="decode"),
        Outcome.UNSAFE,
        ["EngineVersionTooOld"],
    ),
    (
        "0.5.20 is below the floor",
        "server_info_0.5.20_decode.json",
        "models_131072.json",
        Requirement(CTX, role="decode"),
        Outcome.UNSAFE,
        ["EngineVersionTooOld"],
    ),
    (
        "0.5.19 passes a 0.5.19 floor",
        "server_info_0.5.19_prefill.json",
        "models_131072.json",
        Requirement(CTX, role="prefill", min_version="0.5.19"),
        Outcome.SAFE,
        ["EngineVerified"],
    ),
    (
        "old flat shape with memory_usage passes an old floor",
        "server_info_flat_0.4.6.json",
        None,
        Requirement(CTX, role="prefill", min_version="0.4"),
        Outcome.SAFE,
        ["EngineVerified"],
    ),
    (
        "old flat shape is below the default floor",
        "server_info_flat_0.4.6.json",
        None,
        Requirement(CTX, role="prefill"),
        Outcome.UNSAFE,
        ["EngineVersionTooOld"],
    ),
    (
        "oldest shape: pool from max_total_num_tokens, no role needed",
        "server_info_flat_no_memory_usage.json",
        None,
        Requirement(CTX, min_version="0.4"),
        Outcome.SAFE,
        ["EngineVerified"],
    ),
    (
        "oldest shape cannot prove its role",
        "server_info_flat_no_memory_usage.json",
        None,
        Requirement(CTX, role="decode", min_version="0.4"),
        Outcome.CANNOT_TELL,
        ["ReportUnreadable", "ReportUnreadable"],
    ),
    (
        "the incident: 681,280-token pool behind a 1,048,576-token context",
        "server_info_0.5.23_incident_decode.json",
        "models_1048576.json",
        Requirement(1_048_576, role="decode"),
        Outcome.UNSAFE,
        ["KvPoolTooSmall", "MaxInputTooShort"],
    ),
    (
        "DP rank 1 holds less than the context although rank 0 holds it",
        "server_info_0.5.23_dp2_uneven_decode.json",
        "models_1048576.json",
        Requirement(1_048_576, role="decode"),
        Outcome.UNSAFE,
        ["KvPoolTooSmall"],
    ),
    (
        # Both ranks hold 1,000,000, but the engine takes prompts up to its own 1,048,576
        # window: rank 1 could not hold one, nor could a paired engine proven to hold 1,000,000.
        "DP ranks hold the context but the engine's window is longer",
        "server_info_0.5.23_dp2_uneven_decode.json",
        "models_1048576.json",
        Requirement(1_000_000, role="decode"),
        Outcome.UNSAFE,
        ["ContextTooLong", "MaxInputTooLong"],
    ),
    (
        "prefill engine on a decode pod",
        "server_info_0.5.22_prefill.json",
        "models_131072.json",
        Requirement(CTX, role="decode"),
        Outcome.UNSAFE,
        ["RoleMismatch"],
    ),
    (
        "unified engine on a decode pod",
        "server_info_0.5.23_unified.json",
        "models_131072.json",
        Requirement(CTX, role="decode"),
        Outcome.UNSAFE,
        ["RoleMismatch"],
    ),
    (
        "headroom 1.2 fits a 412,345-token pool",
        "server_info_0.5.23_decode.json",
        "models_131072.json",
        Requirement(CTX, headroom=1.2, role="decode"),
        Outcome.SAFE,
        ["EngineVerified"],
    ),
    (
        "headroom 4.0 does not fit",
        "server_info_0.5.23_decode.json",
        "models_131072.json",
        Requirement(CTX, headroom=4.0, role="decode"),
        Outcome.UNSAFE,
        ["KvPoolTooSmall"],
    ),
    (
        "a context above the engine's own is too short on both counts",
        "server_info_0.5.23_decode.json",
        "models_131072.json",
        Requirement(262_144, role="decode"),
        Outcome.UNSAFE,
        ["ContextTooShort", "MaxInputTooShort"],
    ),
    (
        "without /v1/models the max_req_input_len fallback still proves the context",
        "server_info_0.5.23_decode.json",
        None,
        Requirement(CTX, role="decode"),
        Outcome.SAFE,
        ["EngineVerified"],
    ),
]


@pytest.mark.parametrize(
    ("server_info", "models", "requirement", "outcome", "reasons"),
    [row[1:] for row in FIXTURE_TABLE],
    ids=[row[0] for row in FIXTURE_TABLE],
)
def test_fixture_verdicts(
    server_info: str,
    models: str | None,
    requirement: Requirement,
    outcome: Outcome,
    reasons: list[str],
) -> None:
    verdict = judge(fixture_report(server_info, models), requirement)
    assert verdict.outcome is outcome, verdict.message
    assert ([f.reason for f in verdict.findings] or ["EngineVerified"]) == reasons
    assert verdict.reason == reasons[0]


def test_incident_messages_carry_the_numbers() -> None:
    verdict = judge(
        fixture_report("server_info_0.5.23_incident_decode.json", "models_1048576.json"),
        Requirement(1_048_576, role="decode"),
    )
    assert verdict.findings[0].message == (
        "KV pool 681,280 tokens < context length 1,048,576 × headroom 1.0 (short by 367,296 tokens)"
    )
    assert verdict.findings[1].message == (
        "max_req_input_len 681,274 tokens < context length 1,048,576 − 6 = 1,048,570 "
        "(short by 367,296 tokens)"
    )
    assert verdict.message == "; ".join(f.message for f in verdict.findings)


def test_dp_verdict_names_the_smallest_rank() -> None:
    verdict = judge(
        fixture_report("server_info_0.5.23_dp2_uneven_decode.json", "models_1048576.json"),
        Requirement(1_048_576),
    )
    assert verdict.message == (
        "KV pool 1,000,000 tokens < context length 1,048,576 × headroom 1.0 "
        "(short by 48,576 tokens)"
    )


def test_role_and_version_messages() -> None:
    verdict = judge(healthy(role="prefill", version="0.5.21"), Requirement(CTX, role="decode"))
    assert [f.message for f in verdict.findings] == [
        "engine runs disaggregation_mode 'prefill', pod role is 'decode'",
        "engine version 0.5.21 < minimum 0.5.22 (use an image at or above 0.5.22, or lower "
        "safety.minEngineVersion)",
    ]


def test_fractional_headroom_is_shown_and_rounded_up() -> None:
    requirement = Requirement(CTX, headroom=1.1)
    assert requirement.required_pool_tokens == 144_180  # ceil(144,179.2)
    verdict = judge(healthy(kv_pool_tokens=144_179), requirement)
    assert verdict.findings[0].message == (
        "KV pool 144,179 tokens < context length 131,072 × headroom 1.1 (short by 1 tokens)"
    )
    assert judge(healthy(kv_pool_tokens=144_180), requirement).outcome is Outcome.SAFE


# Boundaries and single-field cases on hand-made reports.
REPORT_TABLE = [
    ("pool exactly the context", healthy(kv_pool_tokens=CTX), Outcome.SAFE, []),
    ("pool one short", healthy(kv_pool_tokens=CTX - 1), Outcome.UNSAFE, ["KvPoolTooSmall"]),
    ("max input exactly ctx-6", healthy(max_req_input_len=CTX - 6), Outcome.SAFE, []),
    (
        "max input ctx-7",
        healthy(max_req_input_len=CTX - 7),
        Outcome.UNSAFE,
        ["MaxInputTooShort"],
    ),
    (
        "effective context one short",
        healthy(effective_context_length=CTX - 1),
        Outcome.UNSAFE,
        ["ContextTooShort"],
    ),
    (
        "effective context longer (an engine told a larger --context-length)",
        healthy(effective_context_length=2 * CTX),
        Outcome.UNSAFE,
        ["ContextTooLong"],
    ),
    (
        "max input reaching the context",
        healthy(max_req_input_len=CTX),
        Outcome.UNSAFE,
        ["MaxInputTooLong"],
    ),
    ("max input one below the context", healthy(max_req_input_len=CTX - 1), Outcome.SAFE, []),
    ("pool missing", healthy(kv_pool_tokens=None), Outcome.CANNOT_TELL, ["ReportUnreadable"]),
    (
        "max input missing",
        healthy(max_req_input_len=None),
        Outcome.CANNOT_TELL,
        ["ReportUnreadable"],
    ),
    (
        "effective context missing",
        healthy(effective_context_length=None),
        Outcome.CANNOT_TELL,
        ["ReportUnreadable"],
    ),
    ("version missing", healthy(version=None), Outcome.CANNOT_TELL, ["ReportUnreadable"]),
    (
        "version not PEP 440",
        healthy(version="nightly-abc"),
        Outcome.CANNOT_TELL,
        ["ReportUnreadable"],
    ),
    (
        "0.5.3 is older than 0.5.22 (PEP 440, not string order)",
        healthy(version="0.5.3"),
        Outcome.UNSAFE,
        ["EngineVersionTooOld"],
    ),
    (
        "a release candidate is older than its release",
        healthy(version="0.5.22rc1"),
        Outcome.UNSAFE,
        ["EngineVersionTooOld"],
    ),
    ("a post release passes", healthy(version="0.5.22.post1"), Outcome.SAFE, []),
    # sglang/version.py: a build without package metadata or a reachable tag says 0.0.0.devN
    # (setuptools-scm adds +g<sha>); its number says nothing about the code: cannot tell.
    (
        "a source build's 0.0.0.dev1+g version cannot tell (sglang/version.py fallback)",
        healthy(version="0.0.0.dev1+g1a2b3c4"),
        Outcome.CANNOT_TELL,
        ["EngineVersionUnknown"],
    ),
    (
        "sglang/version.py's bare 0.0.0.dev0 fallback cannot tell",
        healthy(version="0.0.0.dev0"),
        Outcome.CANNOT_TELL,
        ["EngineVersionUnknown"],
    ),
    (
        "setuptools-scm's untagged guess 0.1.dev5+g cannot tell",
        healthy(version="0.1.dev5+gdeadbee"),
        Outcome.CANNOT_TELL,
        ["EngineVersionUnknown"],
    ),
    (
        "a dev build numbered after a release tag is judged by its number",
        healthy(version="0.5.24.dev3+gdeadbee"),
        Outcome.SAFE,
        [],
    ),
    (
        "a dev build numbered before the floor is too old",
        healthy(version="0.5.21.dev7+gdeadbee"),
        Outcome.UNSAFE,
        ["EngineVersionTooOld"],
    ),
    ("role missing but not required", healthy(role=None), Outcome.SAFE, []),
    (
        "unsafe wins over unknown",
        healthy(kv_pool_tokens=1, version=None),
        Outcome.UNSAFE,
        ["KvPoolTooSmall", "ReportUnreadable"],
    ),
    (
        "problems that cost no check do not block",
        healthy(problems=("/v1/models: HTTP 404",)),
        Outcome.SAFE,
        [],
    ),
]


@pytest.mark.parametrize(
    ("report", "outcome", "reasons"),
    [row[1:] for row in REPORT_TABLE],
    ids=[row[0] for row in REPORT_TABLE],
)
def test_report_verdicts(report: EngineReport, outcome: Outcome, reasons: list[str]) -> None:
    verdict = judge(report, Requirement(CTX))
    assert verdict.outcome is outcome, verdict.message
    assert [f.reason for f in verdict.findings] == reasons


def test_role_required_but_not_reported_cannot_tell() -> None:
    verdict = judge(healthy(role=None), Requirement(CTX, role="decode"))
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.message == "disaggregation_mode not reported"


def test_cannot_tell_lists_the_parsers_problems() -> None:
    report = healthy(kv_pool_tokens=None, problems=("max_total_num_tokens is negative: -5",))
    verdict = judge(report, Requirement(CTX))
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.message == "KV pool size not reported; max_total_num_tokens is negative: -5"


def test_invalid_version_floor_cannot_tell() -> None:
    verdict = judge(healthy(), Requirement(CTX, min_version="latest"))
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert "'latest' is not a PEP 440 version" in verdict.message


def test_safe_verdict_reason_and_message() -> None:
    verdict = judge(healthy(), Requirement(CTX, role="decode"))
    assert (verdict.outcome, verdict.reason, verdict.findings) == (
        Outcome.SAFE,
        "EngineVerified",
        (),
    )


def test_cannot_tell_helper_has_no_report() -> None:
    verdict = cannot_tell("EngineUnreachable", "engine unreachable: connection refused")
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert verdict.reason == "EngineUnreachable"
    assert verdict.message == "engine unreachable: connection refused"
    assert verdict.report is None


def test_source_build_version_message_names_the_version_the_floor_and_the_way_out() -> None:
    verdict = judge(healthy(version="0.0.0.dev1+g1a2b3c4"), Requirement(CTX, min_version="0.5.22"))
    assert verdict.message == (
        "engine version 0.0.0.dev1+g1a2b3c4 is a source build without a release number (SGLang "
        "reports 0.0.0.devN when built outside a release tag, sglang/version.py), so whether it "
        "is at or above minimum 0.5.22 cannot be told; run a released image (e.g. "
        "lmsysorg/sglang:v0.5.23) or build from a release tag"
    )
