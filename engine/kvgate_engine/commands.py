"""``kvgate verify`` and ``kvgate estimate``: argument handling and output, nothing else.

Exit codes: verify 0 safe, 1 unsafe, 2 could not tell or an input error; estimate 0 an estimate,
1 the weights leave no room for a KV cache, 2 an input error or a model it cannot size. An input
error raises :class:`~kvgate_engine.command_inputs.InputError`; the command line reports it.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import urllib.parse
from dataclasses import asdict
from typing import Any, TextIO

from packaging.version import InvalidVersion, Version

from kvgate_engine.command_inputs import CONFIG_FILE, CONFIG_LIMITS, InputError, load_json
from kvgate_engine.command_output import envelope, print_json, report_failure
from kvgate_engine.estimator import Estimate, EstimateError, NoRoomForKvCache, estimate_pool
from kvgate_engine.launcher import API_KEY_ENV
from kvgate_engine.probe import MODELS_LIMITS, SERVER_INFO_LIMITS, parse_report, verify
from kvgate_engine.sglang_choices import NEWEST_CHECKED
from kvgate_engine.verdict import (
    REPORT_UNREADABLE,
    Outcome,
    Requirement,
    Verdict,
    judge,
    requirement_problem,
)

EXIT_CODES = {Outcome.SAFE: 0, Outcome.UNSAFE: 1, Outcome.CANNOT_TELL: 2}
EXIT_NO_ROOM = 1
EXIT_INPUT = 2
# A request that waits longer is a hang by another name; the operator's own probe uses 5 s.
MAX_TIMEOUT_SECONDS = 600.0
SERVER_INFO_FILE = "a saved /server_info JSON (curl http://ENGINE:30000/server_info)"
MODELS_FILE = "a saved /v1/models JSON (curl http://ENGINE:30000/v1/models)"

# estimate_pool's parameters as `kvgate estimate` spells them.
ESTIMATE_FLAGS = {
    "config": "--config",
    "gpu_memory_gib": "--gpu-memory-gib",
    "tp": "--tp",
    "mem_fraction_static": "--mem-fraction-static",
    "kv_cache_dtype": "--kv-cache-dtype",
    "page_size": "--page-size",
    "weights_gib": "--weights-gib",
    "max_total_tokens": "--max-total-tokens",
    "gpu_reserved_gib": "--gpu-reserved-gib",
    "gpu_arch": "--gpu-arch",
    "engine_args": "--engine-arg",
    "release": "--sglang-release",
}


# ---------------------------------------------------------------------------------------------
# kvgate verify
# ---------------------------------------------------------------------------------------------


def _requirement(args: argparse.Namespace) -> Requirement:
    """The requirement the flags state; InputError naming the flag that no engine can meet."""
    problem = requirement_problem(
        args.context_length,
        args.headroom,
        context_name="--context-length",
        headroom_name="--headroom",
    )
    if problem is not None:
        raise InputError(*problem)
    try:
        Version(args.min_version)
    except InvalidVersion:
        raise InputError(
            "--min-version", f"{args.min_version!r} is not a version; use one such as 0.5.22"
        ) from None
    return Requirement(
        context_length=args.context_length,
        headroom=args.headroom,
        role=args.role,
        min_version=args.min_version,
    )


def _offline_verdict(args: argparse.Namespace, requirement: Requirement) -> Verdict:
    server_info = load_json(
        args.server_info,
        input_name="--server-info",
        limits=SERVER_INFO_LIMITS,
        what=SERVER_INFO_FILE,
    )
    models: object | None = None
    if args.models:
        models = load_json(
            args.models, input_name="--models", limits=MODELS_LIMITS, what=MODELS_FILE
        )
    return judge(parse_report(server_info, models), requirement)


def _api_key(args: argparse.Namespace) -> str | None:
    """--api-key, else $KVGATE_ENGINE_API_KEY (the variable the engine pods carry it in)."""
    key: str | None = getattr(args, "api_key", None)
    return key if key is not None else (os.environ.get(API_KEY_ENV) or None)


def _check_url(url: str) -> None:
    """An engine's base URL: http(s)://host[:port]; InputError naming --url otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
        usable = parts.scheme in ("http", "https") and bool(parts.hostname)
        usable = usable and (parts.port is None or parts.port > 0)  # .port raises if not a port
    except ValueError:
        usable = False
    if not usable:
        raise InputError(
            "--url",
            f"{url!r} is not an engine URL; give http://HOST:PORT, e.g. http://10.0.0.5:30000",
        )


def _live_verdict(args: argparse.Namespace, requirement: Requirement) -> Verdict:
    _check_url(args.url)
    timeout = getattr(args, "timeout", 5.0)
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_SECONDS):
        raise InputError(
            "--timeout",
            f"must be a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS:g} (got "
            f"{timeout:g}); e.g. 5",
        )
    return asyncio.run(
        verify(
            args.url,
            requirement,
            timeout=timeout,
            api_key=_api_key(args),
            key_source=f"--api-key or ${API_KEY_ENV}",
        )
    )


def verdict_json(verdict: Verdict, requirement: Requirement, source: str) -> dict[str, Any]:
    """The stable ``kvgate verify --json`` object: every key is always present."""
    report = verdict.report
    return envelope(
        "verify",
        EXIT_CODES[verdict.outcome],
        {
            "outcome": str(verdict.outcome),
            "reason": verdict.reason,
            "message": verdict.message,
            "source": source,
            "findings": [{"reason": f.reason, "message": f.message} for f in verdict.findings],
            "requirement": {
                "context_length": requirement.context_length,
                "headroom": requirement.headroom,
                "required_pool_tokens": requirement.required_pool_tokens,
                "role": requirement.role,
                "min_version": requirement.min_version,
            },
            "report": None
            if report is None
            else {
                "version": report.version,
                "role": report.role,
                "kv_pool_tokens": report.kv_pool_tokens,
                "kv_pool_tokens_per_rank": list(report.kv_pool_tokens_per_rank),
                "max_req_input_len": report.max_req_input_len,
                "effective_context_length": report.effective_context_length,
                "served_model_name": report.served_model_name,
                "problems": list(report.problems),
            },
        },
    )


def _headroom(value: float) -> str:
    return f"{value:.1f}" if value == int(value) else f"{value:g}"


def _n(value: int | None) -> str:
    return "unknown" if value is None else f"{value:,}"


def print_verdict(verdict: Verdict, requirement: Requirement, source: str, out: TextIO) -> None:
    """Human output: the outcome, each failed check with its numbers, then what was read."""
    required = requirement.required_pool_tokens
    if verdict.outcome is Outcome.SAFE:
        print(f"SAFE: {source} holds the context window", file=out)
    elif verdict.outcome is Outcome.UNSAFE:
        failed = [f for f in verdict.findings if f.reason != REPORT_UNREADABLE]
        print(f"UNSAFE: {source} fails {len(failed)} check(s)", file=out)
    else:
        print(f"CANNOT TELL: {source} could not be verified (never treated as safe)", file=out)
    for finding in verdict.findings:
        print(f"  - {finding.reason}: {finding.message}", file=out)
    report = verdict.report
    if report is None:
        return
    ranks = ", ".join(f"{t:,}" for t in report.kv_pool_tokens_per_rank) or "not reported"
    print(
        f"  engine: version {report.version or 'unknown'}, role {report.role or 'unknown'}, "
        f"model {report.served_model_name or 'unknown'}",
        file=out,
    )
    print(
        f"  KV pool {_n(report.kv_pool_tokens)} tokens (per DP rank: {ranks}); required "
        f"{required:,} = context length {requirement.context_length:,} × headroom "
        f"{_headroom(requirement.headroom)}",
        file=out,
    )
    print(
        f"  effective context {_n(report.effective_context_length)} tokens; max_req_input_len "
        f"{_n(report.max_req_input_len)} (needs ≥ {requirement.context_length - 6:,})",
        file=out,
    )
    if verdict.outcome is not Outcome.CANNOT_TELL:  # there the problems are the findings
        for problem in report.problems:
            print(f"  note: {problem}", file=out)


def verify_main(args: argparse.Namespace) -> int:
    """``kvgate verify``: exit 0 safe, 1 unsafe, 2 cannot tell (or an input error, raised)."""
    requirement = _requirement(args)
    if args.models and not args.server_info:
        raise InputError("--models", "goes with --server-info; with --url it is read live")
    if args.server_info and getattr(args, "api_key", None) is not None:
        raise InputError("--api-key", "goes with --url (a saved report needs no key)")
    if args.url:
        source = args.url
        verdict = _live_verdict(args, requirement)
    else:
        source = args.server_info
        verdict = _offline_verdict(args, requirement)
    if args.json:
        print_json(verdict_json(verdict, requirement, source))
    else:
        print_verdict(verdict, requirement, source, sys.stdout)
    return EXIT_CODES[verdict.outcome]


# ---------------------------------------------------------------------------------------------
# kvgate estimate
# ---------------------------------------------------------------------------------------------


def estimate_json(estimate: Estimate, args: argparse.Namespace) -> dict[str, Any]:
    """The ``kvgate estimate --json`` object."""
    result: dict[str, Any] = asdict(estimate)
    result.update(
        {
            "gpu_memory_gib": args.gpu_memory_gib,
            "tp": args.tp,
            "mem_fraction_static": args.mem_fraction_static,
            "kv_cache_dtype": args.kv_cache_dtype,
            "page_size": args.page_size,
            "max_total_tokens": args.max_total_tokens,
            "pool_holds_context": estimate.kv_pool_tokens >= estimate.context_length,
            "notes": _notes(estimate),
        }
    )
    return envelope("estimate", 0, result)


def _notes(estimate: Estimate) -> list[str]:
    return [f"{note}; verify a live engine (kvgate verify)" for note in estimate.notes]


def estimate_main(args: argparse.Namespace) -> int:
    """``kvgate estimate``: 0 with an estimate, 1 when weights leave no room, 2 when unable."""
    config = load_json(args.config, input_name="--config", limits=CONFIG_LIMITS, what=CONFIG_FILE)
    try:
        estimate = estimate_pool(
            config,
            gpu_memory_gib=args.gpu_memory_gib,
            tp=args.tp,
            mem_fraction_static=args.mem_fraction_static,
            kv_cache_dtype=args.kv_cache_dtype,
            page_size=args.page_size,
            weights_gib=args.weights_gib,
            max_total_tokens=args.max_total_tokens,
            gpu_reserved_gib=getattr(args, "gpu_reserved_gib", 0.0),
            gpu_arch=getattr(args, "gpu_arch", None),
            engine_args=getattr(args, "engine_arg", None) or (),
            release=getattr(args, "sglang_release", NEWEST_CHECKED),
        )
    except NoRoomForKvCache as exc:
        # A sliding-window pool below one window and a page: the budget is what is short.
        flag = "--mem-fraction-static" if exc.parameter == "swa_pool" else "--weights-gib"
        return report_failure("estimate", EXIT_NO_ROOM, flag, str(exc), as_json=args.json)
    except EstimateError as exc:
        raise InputError(ESTIMATE_FLAGS.get(exc.parameter, "--config"), str(exc)) from None
    if args.json:
        print_json(estimate_json(estimate, args))
        return 0
    print(f"KV pool: {estimate.kv_pool_tokens:,} tokens per engine (estimate; verify live)")
    print(
        f"  {estimate.attention} attention, {estimate.bytes_per_token:,} bytes per token per GPU "
        f"(TP {args.tp}, kv-cache-dtype {estimate.kv_cache_dtype or args.kv_cache_dtype}, "
        f"page size {estimate.page_size:,})"
    )
    print(
        f"  usable {estimate.usable_gib:,.2f} GiB per GPU = ({args.gpu_memory_gib:g} − reserved "
        f"{estimate.gpu_reserved_gib:g}) GiB × {args.mem_fraction_static:g} − weights "
        f"{estimate.weights_gib:,.2f} GiB / TP {args.tp}"
        + (
            f" − linear-attention state {estimate.mamba_state_gib:,.2f} GiB"
            if estimate.mamba_state_gib
            else ""
        )
    )
    if estimate.swa_pool_tokens is not None:
        print(f"  sliding-window layers' pool: {estimate.swa_pool_tokens:,} tokens")
    print(f"  model context length (derived from config.json): {estimate.context_length:,} tokens")
    for note in _notes(estimate):
        print(f"  note: {note}")
    if estimate.kv_pool_tokens < estimate.context_length:
        print(
            f"  warning: the pool holds {estimate.kv_pool_tokens:,} tokens, fewer than the "
            f"model's {estimate.context_length:,}-token context; advertise at most "
            f"{estimate.kv_pool_tokens:,} or add memory (more TP, higher mem-fraction-static)"
        )
    return 0
