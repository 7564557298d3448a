"""`kvgate plan`: which context a shape holds, which shape holds a context. Output only.

    kvgate plan --config config.json [--weights-gib W] [--gpu-memory-gib G ...] [--tp 1,2,4,8]
                [--kv-cache-dtype auto,fp8_e4m3] [--mem-fraction-static 0.85]
                [--headroom H] [--context-length C] [--page-size P] [--json] [--plot FILE.png]
    kvgate plan -f modeldeployment.yaml [--json] [--plot FILE.png]

Exit codes:
  0  the plan was made: some shape holds --context-length (without it: some shape has room for
     a KV pool); with -f, every role of every ModelDeployment holds its contextLength
  1  nothing searched holds the requested context, or the weights leave no room on any shape;
     with -f, a role does not hold its contextLength (the fixes are printed)
  2  usage or input error: unreadable file, an architecture the estimator cannot size, weights
     it cannot compute, an empty search space, a value out of range, --plot unavailable
  3  internal error (a kvgate bug), in one line

Every value is checked with the estimator's rules (``kvgate_engine.estimator.check_sizes``),
the ones admission applies; files are read within caps (``kvgate_engine.command_inputs``,
``kvgate.admission.documents``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from kvgate_engine.command_inputs import CONFIG_FILE, CONFIG_LIMITS, InputError, load_json
from kvgate_engine.command_output import envelope, print_json, report_failure
from kvgate_engine.estimator import DEFAULT_GPU_RESERVED_GIB, EstimateError
from kvgate_engine.plan import (
    LIMITED_BY_MODEL,
    LIMITED_BY_NO_ROOM,
    Fix,
    Plan,
    PlanError,
    PlanRequest,
    RoleFit,
    ShapePlan,
    make_plan,
    required_pool_tokens,
)

from kvgate.admission.checks import check_finite, check_tensor_parallel_heads, role_reserve
from kvgate.admission.documents import document_name, load_manifests
from kvgate.admission.gpu_reserve import (
    DEFAULT_SOURCE,
    RESERVE_FLAG,
    GpuReserve,
    parse_reserve_flags,
    with_reserve,
)
from kvgate.admission.plan_hint import fit_spec_role
from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.schema import parse_model
from kvgate.api.models import ModelDeploymentSpec, Role
from kvgate.cmd.plan_plot import Bar, PlotUnavailable, render

EXIT_OK = 0
EXIT_NOTHING_HOLDS = 1
EXIT_USAGE = 2
SHOWN_CHEAPEST = 3


class _SpecError(Exception):
    """A ModelDeployment that cannot be planned: the field and what is wrong with it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _flatten(values: Sequence[str] | None) -> list[str]:
    """`--tp 1,2 4` → ["1", "2", "4"]: commas and repeated values both work."""
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]


def _numbers(values: Sequence[str] | None, flag: str, kind: type[float] | type[int]) -> list[Any]:
    result: list[Any] = []
    for text in _flatten(values):
        try:
            result.append(kind(text))
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise InputError(flag, f"{text!r} is not {what}; e.g. {flag} 1,2,4,8") from None
    return result


# ---------------------------------------------------------------------------------------------
# --config: the search
# ---------------------------------------------------------------------------------------------


def _request(args: argparse.Namespace) -> PlanRequest:
    if args.config is None:
        raise InputError("", "pass --config config.json (a search) or -f modeldeployment.yaml")
    config: Mapping[str, Any] = load_json(
        args.config, input_name="--config", limits=CONFIG_LIMITS, what=CONFIG_FILE
    )
    fields: dict[str, Any] = {}
    gib = _numbers(args.gpu_memory_gib, "--gpu-memory-gib", float)
    if args.gpu_memory_gib is not None:
        fields["gpu_memory_gib"] = tuple(gib)
    if args.tp is not None:
        fields["tp"] = tuple(_numbers(args.tp, "--tp", int))
    if args.kv_cache_dtype is not None:
        fields["kv_cache_dtypes"] = tuple(_flatten(args.kv_cache_dtype))
    if args.mem_fraction_static is not None:
        fields["mem_fraction_static"] = tuple(
            _numbers(args.mem_fraction_static, "--mem-fraction-static", float)
        )
    return PlanRequest(
        config=config,
        weights_gib=args.weights_gib,
        headroom=1.0 if args.headroom is None else args.headroom,
        context_length=args.context_length,
        page_size=1 if args.page_size is None else args.page_size,
        gpu_reserved_gib=(
            DEFAULT_GPU_RESERVED_GIB if args.gpu_reserved_gib is None else args.gpu_reserved_gib
        ),
        **fields,
    )


def _h(headroom: float) -> str:
    return f"{headroom:.1f}" if headroom == int(headroom) else f"{headroom:g}"


def _margin(row: ShapePlan) -> str:
    margin = row.margin
    return "" if margin is None or row.kv_pool_tokens == 0 else f"{margin * 100:+.1f}%"


def _limited(row: ShapePlan) -> str:
    return {LIMITED_BY_MODEL: "model limit", LIMITED_BY_NO_ROOM: "no room"}.get(
        row.limited_by, "KV pool"
    )


def shape_json(row: ShapePlan) -> dict[str, Any]:
    """One shape of `kvgate plan --json`."""
    return {
        "gpu_memory_gib": row.shape.gpu_memory_gib,
        "tp": row.shape.tp,
        "gpus": row.shape.gpus,
        "kv_cache_dtype": row.shape.kv_cache_dtype,
        "mem_fraction_static": row.shape.mem_fraction_static,
        "kv_pool_tokens": row.kv_pool_tokens,
        "bytes_per_token": row.bytes_per_token,
        "usable_gib": round(row.usable_gib, 4),
        "largest_safe_context_length": row.largest_safe_context,
        "limited_by": row.limited_by,
        "holds": row.holds,
        "margin": None if row.margin is None else round(row.margin, 4),
    }


def plan_json(plan: Plan, exit_code: int, problem: tuple[str, str] | None) -> dict[str, Any]:
    """The stable `kvgate plan --json` object: every key is always present."""
    request = plan.request
    return envelope(
        "plan",
        exit_code,
        {
            "model": {
                "architecture": plan.architecture,
                "weights_gib": round(plan.weights_gib, 4),
                "context_length": plan.model_context_length,
            },
            "headroom": request.headroom,
            "context_length": request.context_length,
            "required_pool_tokens": None
            if request.context_length is None
            else required_pool_tokens(request.context_length, request.headroom),
            "page_size": request.page_size,
            "skipped": list(plan.skipped),
            "notes": notes(plan),
            "shapes": [shape_json(row) for row in plan.shapes],
            "cheapest": [shape_json(row) for row in plan.cheapest],
        },
        error=problem,
    )


def notes(plan: Plan) -> list[str]:
    """What the plan's estimates rest on, each with the way to check it."""
    return [f"{note}; verify a live engine (kvgate verify)" for note in plan.notes]


def print_plan(plan: Plan, out: TextIO, reserve: GpuReserve | None = None) -> None:
    """The human table: every shape, then the cheapest that hold the requested context."""
    request = plan.request
    reserve = reserve or GpuReserve(request.gpu_reserved_gib, "--gpu-reserved-gib")
    print(
        f"{plan.architecture}: weights {plan.weights_gib:,.2f} GiB per replica, model context "
        f"{plan.model_context_length:,} tokens, headroom {_h(request.headroom)}, page size "
        f"{request.page_size:,}, {reserve.describe()} (estimates; kvgate verifies every live "
        "engine)",
        file=out,
    )
    holds_header = "" if request.context_length is None else f"  holds {request.context_length:,}"
    header = (
        f"{'GPU GiB':>7}  {'TP':>2}  {'GPUs':>4}  {'KV dtype':<9}  {'mem':>4}  "
        f"{'KV pool tokens':>14}  {'largest safe contextLength':>26}  {'limited by':<11}"
        f"{holds_header}"
    )
    print(header.rstrip(), file=out)
    for row in plan.shapes:
        s = row.shape
        pool = f"{row.kv_pool_tokens:,}" if row.kv_pool_tokens else "—"
        largest = f"{row.largest_safe_context:,}" if row.largest_safe_context else "—"
        line = (
            f"{s.gpu_memory_gib:>7g}  {s.tp:>2}  {s.gpus:>4}  {s.kv_cache_dtype:<9}  "
            f"{s.mem_fraction_static:>4g}  {pool:>14}  {largest:>26}  {_limited(row):<11}"
        )
        if row.holds is not None:
            line += f"  {'yes' if row.holds else 'no':<3} {_margin(row)}"
        print(line.rstrip(), file=out)
    for skipped in plan.skipped:
        print(f"skipped: {skipped} (SGLang refuses it)", file=out)
    for note in notes(plan):
        print(f"note: {note}", file=out)
    if request.context_length is None or not plan.cheapest:
        return
    required = required_pool_tokens(request.context_length, request.headroom)
    print(
        f"shapes with the fewest GPUs that hold contextLength {request.context_length:,} × "
        f"headroom {_h(request.headroom)} = {required:,} pool tokens (then most margin; GPU "
        "prices are not known here):",
        file=out,
    )
    for rank, row in enumerate(plan.cheapest[:SHOWN_CHEAPEST], start=1):
        print(
            f"  {rank}. {row.shape.label()}: {row.shape.gpus} GPU(s) per engine, pool "
            f"{row.kv_pool_tokens:,} tokens ({_margin(row)})",
            file=out,
        )


def _nothing_holds(plan: Plan) -> tuple[str, str] | None:
    """Why the plan has no answer (exit 1): the flag to change and the message; or None."""
    request = plan.request
    if not plan.any_room:
        best = max(plan.shapes, key=lambda row: row.usable_gib)
        s = best.shape
        return "--weights-gib", (
            f"weights {plan.weights_gib:,.2f} GiB leave no room for a KV pool on "
            f"any shape searched; the roomiest, {s.label()}, has {s.gpu_memory_gib:g} × "
            f"{s.mem_fraction_static:g} = {s.gpu_memory_gib * s.mem_fraction_static:,.2f} GiB "
            f"per GPU for {plan.weights_gib / s.tp:,.2f} GiB of weights per GPU; add larger "
            f"--tp values, bigger --gpu-memory-gib, or a higher --mem-fraction-static"
        )
    if request.context_length is None or plan.cheapest:
        return None
    best = max(plan.shapes, key=lambda row: row.largest_safe_context)
    message = (
        f"no shape searched holds contextLength {request.context_length:,} × "
        f"headroom {_h(request.headroom)} = "
        f"{required_pool_tokens(request.context_length, request.headroom):,} pool tokens; "
        f"the most any holds is {best.largest_safe_context:,} ({best.shape.label()})"
    )
    if request.context_length > plan.model_context_length:
        return "--context-length", message + (
            f"; the model's config supports at most {plan.model_context_length:,} tokens "
            f"(SGLang refuses a longer --context-length): ask for at most "
            f"{plan.model_context_length:,}"
        )
    return "--context-length", message + (
        "; add larger --tp values or bigger --gpu-memory-gib, try --kv-cache-dtype fp8_e4m3, "
        f"or advertise at most {best.largest_safe_context:,}"
    )


def _plot_plan(plan: Plan, path: str) -> None:
    request = plan.request
    context = request.context_length or plan.model_context_length
    required = required_pool_tokens(context, request.headroom)
    bars = [
        Bar(
            f"{row.shape.gpu_memory_gib:g}G×TP{row.shape.tp} {row.shape.kv_cache_dtype} "
            f"{row.shape.mem_fraction_static:g}",
            row.kv_pool_tokens,
            row.kv_pool_tokens >= required,
        )
        for row in plan.shapes
    ]
    title = (
        f"{plan.architecture}, {plan.weights_gib:,.1f} GiB weights: KV pool per shape vs "
        f"context {context:,} × headroom {_h(request.headroom)}"
    )
    render(bars, required, title, Path(path))


def _plot(draw: Any, path: str) -> None:
    """Draw the plot; InputError naming --plot when it cannot be drawn or written."""
    try:
        draw()
    except PlotUnavailable as error:
        raise InputError("--plot", str(error)) from None
    except OSError as error:
        raise InputError("--plot", f"cannot write {path}: {error}") from None


def _search_main(args: argparse.Namespace) -> int:
    try:
        plan = make_plan(_request(args))
    except PlanError as error:
        raise InputError(error.field, error.detail) from None
    problem = _nothing_holds(plan)
    code = EXIT_OK if problem is None else EXIT_NOTHING_HOLDS
    if args.plot:
        _plot(lambda: _plot_plan(plan, args.plot), args.plot)
    if args.json:
        print_json(plan_json(plan, code, problem))
    else:
        given = args.gpu_reserved_gib is not None
        reserve = GpuReserve(
            plan.request.gpu_reserved_gib, "--gpu-reserved-gib" if given else DEFAULT_SOURCE
        )
        print_plan(plan, sys.stdout, reserve)
        if problem is not None:
            report_failure("plan", code, *problem, as_json=False)
    return code


# ---------------------------------------------------------------------------------------------
# -f: an existing ModelDeployment, per role
# ---------------------------------------------------------------------------------------------


def _fit_spec(
    spec: ModelDeploymentSpec, weights_flag: float | None, policy: ClusterPolicy
) -> tuple[dict[str, RoleFit], dict[str, GpuReserve], list[str]]:
    config = spec.model.config
    # Admission's rules first: sizes no GPU has, a TP the model's heads do not allow.
    for check in (check_finite, check_tensor_parallel_heads):
        denials, _ = check(spec, policy)
        if denials:
            raise _SpecError("; ".join(str(denial) for denial in denials))
    if config is None:
        raise _SpecError(
            "spec.model.config is not set: the plan needs the model's config.json there "
            "(or run kvgate plan --config config.json)"
        )
    weights = spec.model.weights_gi_b or weights_flag
    try:
        request = PlanRequest(config, weights_gib=weights, tp=(1,), kv_cache_dtypes=("auto",))
        plan = make_plan(request)  # validates the config and finds the weights
    except PlanError as error:
        field = "spec.model.weightsGiB" if error.field == "--weights-gib" else error.field
        raise _SpecError(f"{field}: {error.detail}") from None
    fits: dict[str, RoleFit] = {}
    reserves: dict[str, GpuReserve] = {}
    for role in Role:
        given = spec.prefill if role is Role.PREFILL else spec.decode
        reserves[role.value] = role_reserve(role.value, given, policy)
        role_spec = with_reserve(given, reserves[role.value])
        if role_spec.gpu_memory_gi_b is None:
            raise _SpecError(
                f"spec.{role.value}.gpuMemoryGiB is not set: the plan needs the memory of one "
                f"GPU; set it (e.g. 80 for an H100)"
            )
        try:
            fits[role.value] = fit_spec_role(spec, role_spec, plan.weights_gib, role.value)
        except EstimateError as error:
            raise _SpecError(f"spec.{role.value}: cannot estimate the KV pool: {error}") from None
    return fits, reserves, notes(plan)


def fix_json(fix: Fix) -> dict[str, Any]:
    return {
        "field": fix.field,
        "value": fix.value,
        "kv_pool_tokens": fix.kv_pool_tokens,
        "gpus": fix.gpus,
        "new_hardware": fix.new_hardware,
    }


def role_json(fit: RoleFit, reserve: GpuReserve) -> dict[str, Any]:
    return {
        "gpu_reserved_gib": reserve.gib,
        "gpu_reserved_gib_source": reserve.source,
        "gpu_memory_gib": fit.shape.gpu_memory_gib,
        "tp": fit.shape.tp,
        "kv_cache_dtype": fit.shape.kv_cache_dtype,
        "mem_fraction_static": fit.shape.mem_fraction_static,
        "kv_pool_tokens": fit.kv_pool_tokens,
        "required_pool_tokens": fit.required_pool_tokens,
        "holds": fit.holds,
        "short_by_tokens": fit.short_by_tokens,
        "largest_safe_context_length": fit.largest_safe_context,
        "fixes": [fix_json(fix) for fix in fit.fixes],
    }


def print_role(role: str, fit: RoleFit, reserve: GpuReserve, out: TextIO) -> None:
    state = (
        f"holds it ({(fit.kv_pool_tokens / fit.required_pool_tokens - 1) * 100:+.1f}%)"
        if fit.holds
        else f"short by {fit.short_by_tokens:,} tokens"
    )
    print(
        f"  {role} ({fit.shape.label()}): KV pool {fit.kv_pool_tokens:,} tokens, {state}; "
        f"largest safe contextLength on this shape {fit.largest_safe_context:,}",
        file=out,
    )
    print(f"    estimated with {reserve.describe()}", file=out)
    if fit.holds:
        return
    if fit.fixes:
        print(f"    fix: {fit.fixes[0].describe(role)}", file=out)
        for fix in fit.fixes[1:]:
            print(f"    or:  {fix.describe(role)}", file=out)
    else:
        print(f"    no single change to {role}'s shape holds it", file=out)
    if fit.largest_safe_context:
        print(f"    or:  model.contextLength {fit.largest_safe_context:,}", file=out)


def _file_main(args: argparse.Namespace) -> int:
    try:
        policy = ClusterPolicy(
            gpu_reserved_gib_by_product=parse_reserve_flags(getattr(args, "gpu_reserve", None))
        )
    except ValueError as error:
        raise InputError(RESERVE_FLAG, str(error)) from None
    documents = load_manifests(args.file, input_name="-f")
    results: list[dict[str, Any]] = []
    all_hold = True
    bars: list[Bar] = []
    required = 0
    for index, document in enumerate(documents):
        name = document_name(document, index)
        model, problems = parse_model(document) if isinstance(document, dict) else (None, [])
        if model is None:
            detail = "; ".join(str(p) for p in problems) or "not a mapping"
            raise InputError("-f", f"{args.file}: {name} is not a valid ModelDeployment: {detail}")
        try:
            fits, reserves, spec_notes = _fit_spec(model.spec, args.weights_gib, policy)
        except _SpecError as error:
            raise InputError("-f", f"{args.file}: {name}: {error.message}") from None
        spec = model.spec
        required = required_pool_tokens(spec.model.context_length, spec.safety.headroom)
        all_hold = all_hold and all(fit.holds for fit in fits.values())
        results.append(
            {
                "name": name,
                "context_length": spec.model.context_length,
                "headroom": spec.safety.headroom,
                "required_pool_tokens": required,
                "roles": {role: role_json(fit, reserves[role]) for role, fit in fits.items()},
                "notes": spec_notes,
            }
        )
        bars += [
            Bar(
                f"{role} {fit.shape.gpu_memory_gib:g}G×TP{fit.shape.tp}",
                fit.kv_pool_tokens,
                fit.holds,
            )
            for role, fit in fits.items()
        ]
        if not args.json:
            print(
                f"{name}: contextLength {spec.model.context_length:,} × headroom "
                f"{_h(spec.safety.headroom)} = {required:,} pool tokens per engine"
            )
            for role, fit in fits.items():
                print_role(role, fit, reserves[role], sys.stdout)
            for note in spec_notes:
                print(f"  note: {note}")
    code = EXIT_OK if all_hold else EXIT_NOTHING_HOLDS
    if args.plot:
        title = f"{args.file}: KV pool per role"
        _plot(lambda: render(bars, required, title, Path(args.plot)), args.plot)
    if args.json:
        print_json(envelope("plan", code, {"documents": results}))
    return code


def main(args: argparse.Namespace) -> int:
    """`kvgate plan`: 0 a shape holds, 1 nothing holds, 2 usage or input error."""
    if args.file is not None:
        search_flags = [
            flag
            for flag, value in (
                ("--config", args.config),
                ("--gpu-memory-gib", args.gpu_memory_gib),
                ("--tp", args.tp),
                ("--kv-cache-dtype", args.kv_cache_dtype),
                ("--mem-fraction-static", args.mem_fraction_static),
                ("--context-length", args.context_length),
                ("--headroom", args.headroom),
                ("--page-size", args.page_size),
            )
            if value is not None
        ]
        if search_flags:
            raise InputError(
                search_flags[0],
                f"-f plans the ModelDeployment's own shapes; drop {', '.join(search_flags)} "
                "(or drop -f to search with --config)",
            )
        return _file_main(args)
    return _search_main(args)
