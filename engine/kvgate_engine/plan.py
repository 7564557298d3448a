"""Capacity planning: which context a shape can hold, and which shape holds a context.

Pure: plain data in, plain data out. Every pool here is :func:`estimate_pool`'s, so a plan never
promises more than admission would accept. A *shape* is one engine's hardware and memory settings:
GPU memory × tensor parallel × KV cache dtype × mem-fraction-static.

The largest safe ``contextLength`` of a shape is the largest ``C`` with

- ``ceil(C × headroom) ≤ pool`` (what the gate and admission require),
- ``C ≤ pool``: SGLang's ``max_req_input_len = min(C − 1, pool − 1) − 5`` must reach ``C − 6``
  (the live verdict's input rule; implied by the first when headroom ≥ 1, kept explicit),
- ``C ≤`` the model's own context length (SGLang refuses a longer ``--context-length``).

"Cheapest" means fewest GPUs per engine, then the most margin (pool ÷ requirement).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate_engine.estimator import (
    DEFAULT_GPU_RESERVED_GIB,
    Estimate,
    EstimateError,
    NoRoomForKvCache,
    bytes_per_token,
    check_sizes,
    derive_context_length,
    estimate_pool,
    estimate_weights_gib,
    layout_of,
    tensor_parallel_mismatch,
    unmodelled_architecture_note,
)
from kvgate_engine.verdict import Requirement, requirement_problem

DEFAULT_GPU_MEMORY_GIB: tuple[float, ...] = (24, 48, 80, 141, 192)
DEFAULT_TP: tuple[int, ...] = (1, 2, 4, 8)
DEFAULT_KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8_e4m3")
DEFAULT_MEM_FRACTION_STATIC: tuple[float, ...] = (0.85,)

# Memory sizes of common data-centre GPUs (GiB), the steps a "bigger GPU" fix may take.
GPU_CATALOG_GIB: tuple[float, ...] = (16, 24, 40, 48, 80, 94, 96, 141, 180, 192, 288)
# Above this, activations and CUDA graphs have too little room: no fix proposes more.
MAX_MEM_FRACTION_STATIC = 0.95
# Tensor-parallel sizes a fix may propose (one engine runs on one node of at most 8 GPUs).
TP_CHOICES: tuple[int, ...] = (1, 2, 4, 8)
# The search's flags, by estimate_pool parameter (check_sizes names the one at fault).
SEARCH_FLAGS = {
    "gpu_memory_gib": "--gpu-memory-gib",
    "tp": "--tp",
    "mem_fraction_static": "--mem-fraction-static",
    "page_size": "--page-size",
    "gpu_reserved_gib": "--gpu-reserved-gib",
    "weights_gib": "--weights-gib",
    "kv_cache_dtype": "--kv-cache-dtype",
    "config": "--config",
}
# A 16-bit KV cache can be halved with fp8; these are the dtypes a fix may switch from.
SIXTEEN_BIT_KV_DTYPES = frozenset({"auto", "bfloat16", "bf16", "float16", "fp16", "half"})

LIMITED_BY_POOL = "pool"
LIMITED_BY_MODEL = "model"
LIMITED_BY_NO_ROOM = "no room"


class PlanError(ValueError):
    """The plan cannot be made; ``field`` names the flag or field, the message the way out."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.detail = message


@dataclass(frozen=True)
class Shape:
    """One engine's hardware and memory settings."""

    gpu_memory_gib: float
    tp: int
    kv_cache_dtype: str
    mem_fraction_static: float

    @property
    def gpus(self) -> int:
        """GPUs one engine takes (one per tensor-parallel rank)."""
        return self.tp

    def label(self) -> str:
        return (
            f"{self.gpu_memory_gib:g} GiB × TP {self.tp}, {self.kv_cache_dtype}, "
            f"mem {self.mem_fraction_static:g}"
        )


@dataclass(frozen=True)
class ShapePlan:
    """What one shape holds. ``kv_pool_tokens`` is 0 when the weights leave no room."""

    shape: Shape
    kv_pool_tokens: int
    bytes_per_token: int
    usable_gib: float
    largest_safe_context: int
    limited_by: str  # LIMITED_BY_POOL | LIMITED_BY_MODEL | LIMITED_BY_NO_ROOM
    required_pool_tokens: int | None  # ceil(requested context × headroom), when one is asked
    holds: bool | None  # the requested context fits, when one is asked

    @property
    def margin(self) -> float | None:
        """pool ÷ requirement − 1 (0.25 = 25 % spare), when a context is requested."""
        if self.required_pool_tokens is None:
            return None
        return self.kv_pool_tokens / self.required_pool_tokens - 1


@dataclass(frozen=True)
class PlanRequest:
    """The search space and what must fit."""

    config: Mapping[str, Any]
    weights_gib: float | None = None  # None: computed from the config where the estimator can
    gpu_memory_gib: tuple[float, ...] = DEFAULT_GPU_MEMORY_GIB
    tp: tuple[int, ...] = DEFAULT_TP
    kv_cache_dtypes: tuple[str, ...] = DEFAULT_KV_CACHE_DTYPES
    mem_fraction_static: tuple[float, ...] = DEFAULT_MEM_FRACTION_STATIC
    headroom: float = 1.0
    context_length: int | None = None
    page_size: int = 1
    # Taken off each GPU before memFractionStatic, as admission does (spec.<role>.gpuReservedGiB);
    # the default 1 GiB is kvgate's assumption, not SGLang's and not measured.
    gpu_reserved_gib: float = DEFAULT_GPU_RESERVED_GIB


@dataclass(frozen=True)
class Plan:
    request: PlanRequest
    architecture: str
    weights_gib: float
    model_context_length: int
    shapes: tuple[ShapePlan, ...]  # every shape considered, fewest GPUs first
    cheapest: tuple[ShapePlan, ...]  # the shapes that hold the requested context, best first
    skipped: tuple[str, ...]  # search values left out, each with why
    notes: tuple[str, ...] = ()  # what the estimates rest on that kvgate does not know to hold

    @property
    def any_room(self) -> bool:
        return any(row.kv_pool_tokens > 0 for row in self.shapes)


def required_pool_tokens(context_length: int, headroom: float) -> int:
    """ceil(context_length × headroom): the smallest pool that holds the context, by the gate's
    own rule (kvgate_engine.verdict.Requirement); OverflowError when it is not a finite number."""
    return Requirement(context_length=context_length, headroom=headroom).required_pool_tokens


def _holds(context: int, headroom: float, kv_pool_tokens: int) -> bool:
    """The gate's ceil(C × headroom) ≤ pool, computed as the gate computes it."""
    try:
        return required_pool_tokens(context, headroom) <= kv_pool_tokens
    except (OverflowError, ValueError):  # C × headroom is not a finite number
        return False


def largest_safe_context(kv_pool_tokens: int, headroom: float, model_context_length: int) -> int:
    """The largest contextLength a pool holds under headroom, the input rule and the model limit.

    The largest C ≤ pool with ceil(C × headroom) ≤ pool as the gate computes it. Float division
    lands on C or next to it for any real pool; for a vast one (beyond 2^53 tokens) it can land
    far off, and the answer is found by bisection on the gate's arithmetic (monotonic in C)."""
    if kv_pool_tokens <= 0:
        return 0
    try:
        guess = min(math.floor(kv_pool_tokens / headroom), kv_pool_tokens)
    except (OverflowError, ValueError):
        guess = 0
    for context in (guess, guess - 1, guess + 1):
        fits = 0 <= context <= kv_pool_tokens and _holds(context, headroom, kv_pool_tokens)
        if fits and (
            context == kv_pool_tokens or not _holds(context + 1, headroom, kv_pool_tokens)
        ):
            return min(context, model_context_length)
    low, high = 0, kv_pool_tokens
    while low < high:
        middle = (low + high + 1) // 2
        if _holds(middle, headroom, kv_pool_tokens):
            low = middle
        else:
            high = middle - 1
    return min(low, model_context_length)


def architecture(config: Mapping[str, Any]) -> str:
    """The config's architecture name, for messages."""
    names = config.get("architectures")
    if isinstance(names, list) and names and isinstance(names[0], str):
        return names[0]
    model_type = config.get("model_type")
    return model_type if isinstance(model_type, str) else "this model"


def tp_problem(config: Mapping[str, Any], tp: int) -> str | None:
    """Why SGLang would refuse this TP size for the model, or None (the estimator's rule:
    :func:`~kvgate_engine.estimator.tensor_parallel_mismatch`)."""
    mismatch = tensor_parallel_mismatch(config, tp)
    return None if mismatch is None else mismatch.short()


def _weights(request: PlanRequest) -> float:
    if request.weights_gib is not None:
        return request.weights_gib  # checked with the other sizes (_check_request)
    try:
        weights = estimate_weights_gib(request.config)
    except Exception:  # a user's config.json can hold anything
        weights = None
    if weights is None:
        raise PlanError(
            "--weights-gib",
            f"the weights of {architecture(request.config)} cannot be computed from config.json "
            "(MLA, quantized or custom layers); pass one replica's weight size, e.g. "
            "--weights-gib 131.5",
        )
    return weights


def _check_sizes(**sizes: Any) -> None:
    """The estimator's rules for one shape, as a PlanError naming the flag."""
    try:
        check_sizes(**sizes)
    except EstimateError as error:
        raise PlanError(SEARCH_FLAGS.get(error.parameter, "--config"), str(error)) from None


def _check_request(request: PlanRequest) -> None:
    """Every value searched meets the estimator's rules (admission's bounds, one set of them)."""
    space = {
        "--gpu-memory-gib": request.gpu_memory_gib,
        "--tp": request.tp,
        "--kv-cache-dtype": request.kv_cache_dtypes,
        "--mem-fraction-static": request.mem_fraction_static,
    }
    for flag, values in space.items():
        if not values:
            raise PlanError(flag, "the search space is empty: give at least one value")
    for gib in request.gpu_memory_gib:
        _check_sizes(gpu_memory_gib=gib, tp=1)
    smallest = min(request.gpu_memory_gib)
    for tp in request.tp:
        _check_sizes(gpu_memory_gib=smallest, tp=tp)
    for fraction in request.mem_fraction_static:
        _check_sizes(gpu_memory_gib=smallest, tp=1, mem_fraction_static=fraction)
    _check_sizes(
        gpu_memory_gib=smallest,
        tp=1,
        page_size=request.page_size,
        gpu_reserved_gib=request.gpu_reserved_gib,
        weights_gib=request.weights_gib,
    )
    problem = requirement_problem(
        1 if request.context_length is None else request.context_length,
        request.headroom,
        context_name="--context-length",
        headroom_name="--headroom",
    )
    if problem is not None:
        raise PlanError(*problem)


def _check_config(config: Mapping[str, Any], kv_cache_dtypes: Sequence[str]) -> None:
    """Raise PlanError when the estimator cannot size this model's KV cache at all."""
    for dtype in kv_cache_dtypes:
        try:
            bytes_per_token(config, tp=1, kv_cache_dtype=dtype)
        except EstimateError as error:
            if error.parameter == "kv_cache_dtype":
                raise PlanError("--kv-cache-dtype", str(error)) from error
            raise PlanError(
                "--config", f"cannot size the KV cache of {architecture(config)}: {error}"
            ) from error
        except Exception as error:  # a config the estimator chokes on
            raise PlanError(
                "--config",
                f"cannot size the KV cache of {architecture(config)}: {error!r}; the estimator "
                "knows MHA/GQA and MLA decoders (measure a live engine with kvgate verify)",
            ) from error


def plan_shape(
    config: Mapping[str, Any],
    shape: Shape,
    *,
    weights_gib: float,
    headroom: float = 1.0,
    context_length: int | None = None,
    page_size: int = 1,
    max_total_tokens: int | None = None,
    estimator_options: Mapping[str, Any] | None = None,
) -> ShapePlan:
    """One shape under the estimator: its pool and the largest context it safely holds."""
    model_limit = derive_context_length(config)
    required = None if context_length is None else required_pool_tokens(context_length, headroom)
    try:
        estimate = _estimate(
            config, shape, weights_gib, page_size, max_total_tokens, estimator_options or {}
        )
    except NoRoomForKvCache:
        reserved = float((estimator_options or {}).get("gpu_reserved_gib", 0.0))
        usable = (
            shape.gpu_memory_gib - reserved
        ) * shape.mem_fraction_static - weights_gib / shape.tp
        per_token = bytes_per_token(config, tp=shape.tp, kv_cache_dtype=shape.kv_cache_dtype)
        holds = None if context_length is None else False
        return ShapePlan(shape, 0, per_token, usable, 0, LIMITED_BY_NO_ROOM, required, holds)
    pool = estimate.kv_pool_tokens
    largest = largest_safe_context(pool, headroom, model_limit)
    by_pool = largest_safe_context(pool, headroom, pool)
    limited_by = LIMITED_BY_MODEL if largest < by_pool else LIMITED_BY_POOL
    return ShapePlan(
        shape=shape,
        kv_pool_tokens=pool,
        bytes_per_token=estimate.bytes_per_token,
        usable_gib=estimate.usable_gib,
        largest_safe_context=largest,
        limited_by=limited_by,
        required_pool_tokens=required,
        holds=None if context_length is None else largest >= context_length,
    )


def cheapest_order(row: ShapePlan) -> tuple[int, float, float]:
    """Fewest GPUs, then most margin (then the smaller GPU)."""
    margin = row.margin if row.margin is not None else float(row.kv_pool_tokens)
    return (row.shape.gpus, -margin, row.shape.gpu_memory_gib)


def make_plan(request: PlanRequest) -> Plan:
    """Every shape of the search space, and the cheapest that hold the requested context.

    Raises PlanError (with the flag, the numbers and the way out) when the request is invalid,
    the model's KV cache cannot be sized, or no value of --tp is one SGLang would run.
    """
    _check_request(request)
    _check_config(request.config, request.kv_cache_dtypes)
    weights_gib = _weights(request)
    model_limit = derive_context_length(request.config)

    tps: list[int] = []
    skipped: list[str] = []
    for tp in sorted(set(request.tp)):
        problem = tp_problem(request.config, tp)
        if problem is None:
            tps.append(tp)
        else:
            skipped.append(problem)
    if not tps:
        raise PlanError(
            "--tp",
            "the search space is empty: " + "; ".join(skipped) + " (SGLang refuses them); "
            "use TP sizes that divide the model's attention heads, e.g. --tp 1,2,4,8",
        )

    rows = [
        plan_shape(
            request.config,
            Shape(gib, tp, dtype, fraction),
            weights_gib=weights_gib,
            headroom=request.headroom,
            context_length=request.context_length,
            page_size=request.page_size,
            estimator_options={"gpu_reserved_gib": request.gpu_reserved_gib},
        )
        for tp in tps
        for gib in sorted(set(request.gpu_memory_gib))
        for dtype in dict.fromkeys(request.kv_cache_dtypes)
        for fraction in sorted(set(request.mem_fraction_static))
    ]
    cheapest = sorted((row for row in rows if row.holds), key=cheapest_order)
    return Plan(
        request=request,
        architecture=architecture(request.config),
        weights_gib=weights_gib,
        model_context_length=model_limit,
        shapes=tuple(rows),
        cheapest=tuple(cheapest),
        skipped=tuple(skipped),
        notes=_notes(request.config),
    )


def _notes(config: Mapping[str, Any]) -> tuple[str, ...]:
    note = unmodelled_architecture_note(config, layout_of(config))
    return () if note is None else (note,)


# ---------------------------------------------------------------------------------------------
# One engine that does not hold its context: the single changes that would
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fix:
    """One field changed to one value, and what the estimator then predicts."""

    field: str  # gpuMemoryGiB | tensorParallel | memFractionStatic | kvCacheDtype | maxTotalTokens
    value: float | int | str
    kv_pool_tokens: int
    gpus: int
    new_hardware: bool  # a different GPU model, not just settings or more of the same GPU

    def spec_field(self, role: str) -> str:
        """The ModelDeployment field this changes: the KV dtype is the engine's, the rest the
        role's."""
        return f"engine.{self.field}" if self.field == "kvCacheDtype" else f"{role}.{self.field}"

    def describe(self, role: str) -> str:
        """e.g. ``decode.tensorParallel 2 (estimated pool 211,353 tokens)``."""
        value = f"{self.value:g}" if isinstance(self.value, float) else str(self.value)
        if isinstance(self.value, int):
            value = f"{self.value:,}"
        pool = f"estimated pool {self.kv_pool_tokens:,} tokens"
        return f"{self.spec_field(role)} {value} ({pool})"


@dataclass(frozen=True)
class RoleFit:
    """How far one engine's shape is from the context it must hold, and what fixes it."""

    shape: Shape
    context_length: int
    headroom: float
    kv_pool_tokens: int
    required_pool_tokens: int
    largest_safe_context: int
    fixes: tuple[Fix, ...]  # single changes that hold the context, smallest first

    @property
    def holds(self) -> bool:
        return self.kv_pool_tokens >= self.required_pool_tokens

    @property
    def short_by_tokens(self) -> int:
        """Pool tokens missing (0 when it holds)."""
        return max(0, self.required_pool_tokens - self.kv_pool_tokens)


def _pool(
    config: Mapping[str, Any],
    shape: Shape,
    weights_gib: float,
    page_size: int,
    max_total_tokens: int | None,
    estimator_options: Mapping[str, Any],
) -> int:
    try:
        return _estimate(
            config, shape, weights_gib, page_size, max_total_tokens, estimator_options
        ).kv_pool_tokens
    except NoRoomForKvCache:
        return 0


def _estimate(
    config: Mapping[str, Any],
    shape: Shape,
    weights_gib: float,
    page_size: int,
    max_total_tokens: int | None,
    estimator_options: Mapping[str, Any],
) -> Estimate:
    """The estimator's answer for one shape (raises NoRoomForKvCache)."""
    return estimate_pool(
        config,
        gpu_memory_gib=shape.gpu_memory_gib,
        tp=shape.tp,
        mem_fraction_static=shape.mem_fraction_static,
        kv_cache_dtype=shape.kv_cache_dtype,
        page_size=page_size,
        weights_gib=weights_gib,
        max_total_tokens=max_total_tokens,
        **estimator_options,
    )


def fix_order(fix: Fix) -> tuple[int, bool, int]:
    """Fewest GPUs, then the same GPU model before another, then most margin."""
    return (fix.gpus, fix.new_hardware, -fix.kv_pool_tokens)


def fit_role(
    config: Mapping[str, Any],
    shape: Shape,
    *,
    weights_gib: float,
    context_length: int,
    headroom: float = 1.0,
    page_size: int = 1,
    max_total_tokens: int | None = None,
    estimator_options: Mapping[str, Any] | None = None,
) -> RoleFit:
    """Can this shape hold the context, and if not, which single change would (each verified).

    ``estimator_options`` go to every :func:`estimate_pool` call unchanged (whatever else the
    caller's estimate takes besides the shape), so a fix is judged exactly as admission judges.
    """
    options = dict(estimator_options or {})
    required = required_pool_tokens(context_length, headroom)
    model_limit = derive_context_length(config)
    pool = _pool(config, shape, weights_gib, page_size, max_total_tokens, options)
    largest = largest_safe_context(pool, headroom, max(model_limit, context_length))
    fixes: list[Fix] = []
    if pool < required:
        if max_total_tokens is not None and max_total_tokens < required:
            uncapped = _pool(config, shape, weights_gib, page_size, None, options)
            if uncapped >= required:
                fixes.append(Fix("maxTotalTokens", required, required, shape.gpus, False))

        def holds(candidate: Shape) -> int | None:
            got = _pool(config, candidate, weights_gib, page_size, max_total_tokens, options)
            return got if got >= required else None

        if shape.kv_cache_dtype in SIXTEEN_BIT_KV_DTYPES:
            candidate = Shape(shape.gpu_memory_gib, shape.tp, "fp8_e4m3", shape.mem_fraction_static)
            got = holds(candidate)
            if got is not None:
                fixes.append(Fix("kvCacheDtype", "fp8_e4m3", got, shape.gpus, False))
        # The smallest fraction (in hundredths) that holds: the least taken from activations.
        start = math.floor(shape.mem_fraction_static * 100) + 1
        for hundredths in range(start, round(MAX_MEM_FRACTION_STATIC * 100) + 1):
            fraction = hundredths / 100
            got = holds(Shape(shape.gpu_memory_gib, shape.tp, shape.kv_cache_dtype, fraction))
            if got is not None:
                fixes.append(Fix("memFractionStatic", fraction, got, shape.gpus, False))
                break
        for tp in TP_CHOICES:
            if tp <= shape.tp or tp_problem(config, tp) is not None:
                continue
            got = holds(
                Shape(shape.gpu_memory_gib, tp, shape.kv_cache_dtype, shape.mem_fraction_static)
            )
            if got is not None:
                fixes.append(Fix("tensorParallel", tp, got, tp, False))
                break
        for gib in GPU_CATALOG_GIB:
            if gib <= shape.gpu_memory_gib:
                continue
            got = holds(Shape(gib, shape.tp, shape.kv_cache_dtype, shape.mem_fraction_static))
            if got is not None:
                fixes.append(Fix("gpuMemoryGiB", float(gib), got, shape.gpus, True))
                break
    return RoleFit(
        shape=shape,
        context_length=context_length,
        headroom=headroom,
        kv_pool_tokens=pool,
        required_pool_tokens=required,
        largest_safe_context=largest,
        fixes=tuple(sorted(fixes, key=fix_order)),
    )
