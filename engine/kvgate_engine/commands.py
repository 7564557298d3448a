"""``kvgate verify`` and ``kvgate estimate``: argument handling and output, nothing else."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

from kvgate_engine.estimator import Estimate, EstimateError, NoRoomForKvCache, estimate_pool
from kvgate_engine.probe import parse_report, verify
from kvgate_engine.verdict import (
    REPORT_UNREADABLE,
    Outcome,
    Requirement,
    Verdict,
    cannot_tell,
    judge,
)

EXIT_CODES = {Outcome.SAFE: 0, Outcome.UNSAFE: 1, Outcome.CANNOT_TELL: 2}


# ---------------------------------------------------------------------------------------------
# kvgate verify
# ---------------------------------------------------------------------------------------------


def _load_json(path: str, what: str) -> tuple[object, str | None]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        return None, f"cannot read {what} file {path}: {exc.strerror or exc}"
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, f"{what} file {path} is not JSON: {exc}"


def _offline_verdict(args: argparse.Namespace, requirement: Requirement) -> Verdict:
    server_info, error = _load_json(args.server_info, "--server-info")
    if error is not None:
        return cannot_tell(REPORT_UNREADABLE, error)
    models: object | None = None
    if args.models:
        models, error = _load_json(args.models, "--models")
        if error is not None:
            return cannot_tell(REPORT_UNREADABLE, error)
    return judge(parse_report(server_info, models), requirement)


def _usage_error(message: str) -> int:
    print(f"kvgate verify: {message}", file=sys.stderr)
    return 2


def verdict_json(verdict: Verdict, requirement: Requirement, source: str) -> dict[str, Any]:
    """The stable ``kvgate verify --json`` object: every key is always present."""
    report = verdict.report
    return {
        "outcome": str(verdict.outcome),
        "exit_code": EXIT_CODES[verdict.outcome],
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
    }


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
    """``kvgate verify``: exit 0 safe, 1 unsafe, 2 cannot tell."""
    if args.context_length is None or args.context_length <= 0:
        return _usage_error(
            f"--context-length must be a positive integer, got {args.context_length}"
        )
    if not args.headroom >= 1.0:
        return _usage_error(
            f"--headroom must be >= 1.0 (the pool must hold the context), got {args.headroom:g}"
        )
    if args.models and not args.server_info:
        return _usage_error("--models goes with --server-info; with --url it is read live")
    requirement = Requirement(
        context_length=args.context_length,
        headroom=args.headroom,
        role=args.role,
        min_version=args.min_version,
    )
    timeout = getattr(args, "timeout", 5.0)
    if args.url:
        source = args.url
        verdict = asyncio.run(verify(args.url, requirement, timeout=timeout))
    else:
        source = args.server_info
        verdict = _offline_verdict(args, requirement)
    if args.json:
        print(json.dumps(verdict_json(verdict, requirement, source), indent=2, sort_keys=True))
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
        }
    )
    return result


def _estimate_failure(message: str, exit_code: int, as_json: bool) -> int:
    if as_json:
        print(json.dumps({"error": message, "exit_code": exit_code}, indent=2, sort_keys=True))
    else:
        print(f"kvgate estimate: {message}", file=sys.stderr)
    return exit_code


def estimate_main(args: argparse.Namespace) -> int:
    """``kvgate estimate``: 0 with an estimate, 1 when weights leave no room, 2 when unable."""
    config, error = _load_json(args.config, "--config")
    if error is not None:
        return _estimate_failure(error, 2, args.json)
    if not isinstance(config, Mapping):
        return _estimate_failure(f"--config file {args.config} is not a JSON object", 2, args.json)
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
        )
    except EstimateError as exc:
        no_room = isinstance(exc, NoRoomForKvCache)
        return _estimate_failure(str(exc), 1 if no_room else 2, args.json)
    if args.json:
        print(json.dumps(estimate_json(estimate, args), indent=2, sort_keys=True))
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
    print(f"  model context length (derived from config.json): {estimate.context_length:,} tokens")
    if estimate.kv_pool_tokens < estimate.context_length:
        print(
            f"  warning: the pool holds {estimate.kv_pool_tokens:,} tokens, fewer than the "
            f"model's {estimate.context_length:,}-token context; advertise at most "
            f"{estimate.kv_pool_tokens:,} or add memory (more TP, higher mem-fraction-static)"
        )
    return 0
