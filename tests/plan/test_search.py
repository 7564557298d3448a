"""The planner's search: what each shape holds, which is cheapest, which single change fixes one."""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

import pytest
from kvgate_engine.estimator import DEFAULT_GPU_RESERVED_GIB, NoRoomForKvCache, estimate_pool
from kvgate_engine.plan import (
    LIMITED_BY_MODEL,
    LIMITED_BY_NO_ROOM,
    LIMITED_BY_POOL,
    PlanError,
    PlanRequest,
    Shape,
    fit_role,
    largest_safe_context,
    make_plan,
    plan_shape,
    required_pool_tokens,
)

from .models import (
    DEEPSEEK_V3,
    DEEPSEEK_V3_WEIGHTS_GIB,
    LLAMA_31_8B,
    LLAMA_31_70B,
    LLAMA_70B_WEIGHTS_GIB,
    MAMBA,
    QWEN3_4B,
)

MODELS: list[tuple[str, dict[str, Any], float]] = [
    ("llama-3.1-8b", LLAMA_31_8B, 15.0),
    ("llama-3.1-70b", LLAMA_31_70B, LLAMA_70B_WEIGHTS_GIB),
    ("qwen3-4b", QWEN3_4B, 7.5),
    ("deepseek-v3-mla", DEEPSEEK_V3, DEEPSEEK_V3_WEIGHTS_GIB),
]
GPU_SIZES = (24.0, 48.0, 80.0, 141.0, 192.0)
TPS = (1, 2, 4, 8)
FRACTIONS = (0.7, 0.85, 0.9)
DTYPES_WIDE_TO_NARROW = ("bfloat16", "fp8_e4m3")


def _estimated_pool(
    config: dict[str, Any],
    shape: Shape,
    weights_gib: float,
    reserved: float = DEFAULT_GPU_RESERVED_GIB,  # what make_plan takes off, as admission does
) -> int:
    """The estimator's pool, independently of the planner; 0 when the weights leave no room."""
    try:
        return estimate_pool(
            config,
            gpu_memory_gib=shape.gpu_memory_gib,
            tp=shape.tp,
            mem_fraction_static=shape.mem_fraction_static,
            kv_cache_dtype=shape.kv_cache_dtype,
            weights_gib=weights_gib,
            gpu_reserved_gib=reserved,
        ).kv_pool_tokens
    except NoRoomForKvCache:
        return 0


@pytest.mark.parametrize(
    ("pool", "headroom", "model_limit", "expected"),
    [
        (434_176, 1.0, 131_072, 131_072),  # the model's own limit binds
        (100_000, 1.0, 131_072, 100_000),  # the pool binds: C ≤ pool (the input rule)
        (100_000, 1.2, 131_072, 83_333),  # ceil(83,333 × 1.2) = 100,000 ≤ pool
        (100_001, 1.2, 131_072, 83_334),  # ceil(83,334 × 1.2) = 100,001
        (10, 1.1, 131_072, 9),  # ceil(9 × 1.1) = 10; 10 × 1.1 = 11 > 10
        (7, 3.0, 131_072, 2),
        (1, 1.0, 131_072, 1),
        (0, 1.0, 131_072, 0),  # no room, no context
        (1_000_000, 1.0, 2_048, 2_048),  # a config with no context key: SGLang's 2,048
    ],
)
def test_largest_safe_context_is_the_largest_the_gate_accepts(
    pool: int, headroom: float, model_limit: int, expected: int
) -> None:
    got = largest_safe_context(pool, headroom, model_limit)
    assert got == expected
    if got:
        assert required_pool_tokens(got, headroom) <= pool
    if got < model_limit:
        assert required_pool_tokens(got + 1, headroom) > pool  # one more would not fit


@pytest.mark.parametrize("headroom", [1.0, 1.05, 1.1, 1.25, 1.333, 2.0, 3.7])
def test_largest_safe_context_sits_exactly_on_the_gates_line(headroom: float) -> None:
    for pool in [*range(1, 400), 131_071, 131_072, 434_176, 1_048_576, 681_280]:
        got = largest_safe_context(pool, headroom, 10**9)
        assert math.ceil(got * headroom) <= pool < math.ceil((got + 1) * headroom)


@pytest.mark.parametrize("headroom", [1.0, 1.2, 3.7, 1e25])
def test_largest_safe_context_of_a_vast_pool_is_found_in_a_few_steps(headroom: float) -> None:
    """Float division lands far off the gate's line for pools beyond 2^53 tokens; the answer is
    still exact, and found by bisection rather than by stepping one token at a time."""
    for pool in (2**53 + 1, 10**18, 10**30):
        started = time.process_time()  # CPU: the load of a shared machine is not the claim
        got = largest_safe_context(pool, headroom, 10**40)
        assert time.process_time() - started < 0.1
        assert required_pool_tokens(got, headroom) <= pool
        # one more would not fit, or C has reached the pool (the input rule: C <= pool)
        assert got == pool or required_pool_tokens(got + 1, headroom) > pool


def test_llama_70b_on_80_and_141_gib_gpus() -> None:
    """docs/planning.md's example: 80 GiB needs TP 4 for 128k; 141 GiB holds it on TP 2."""
    plan = make_plan(
        PlanRequest(
            LLAMA_31_70B,
            weights_gib=LLAMA_70B_WEIGHTS_GIB,
            gpu_memory_gib=(80, 141),
            context_length=131_072,
        )
    )
    rows = {(r.shape.gpu_memory_gib, r.shape.tp, r.shape.kv_cache_dtype): r for r in plan.shapes}
    assert len(rows) == 2 * 4 * 2
    assert rows[(80, 1, "auto")].limited_by == LIMITED_BY_NO_ROOM
    assert rows[(80, 2, "auto")].limited_by == LIMITED_BY_POOL
    assert rows[(80, 2, "auto")].holds is False
    assert rows[(80, 4, "auto")].holds is True
    assert rows[(80, 4, "auto")].limited_by == LIMITED_BY_MODEL
    assert rows[(80, 4, "auto")].largest_safe_context == 131_072
    best = plan.cheapest[0]
    assert (best.shape.gpu_memory_gib, best.shape.tp, best.shape.kv_cache_dtype) == (
        141,
        2,
        "fp8_e4m3",
    )


@pytest.mark.parametrize(("name", "config", "weights"), MODELS, ids=[m[0] for m in MODELS])
def test_more_gpus_never_lower_the_largest_safe_context(
    name: str, config: dict[str, Any], weights: float
) -> None:
    for gib, dtype, fraction, headroom in itertools.product(
        GPU_SIZES, DTYPES_WIDE_TO_NARROW, FRACTIONS, (1.0, 1.2)
    ):
        previous = -1
        for tp in TPS:
            row = plan_shape(
                config, Shape(gib, tp, dtype, fraction), weights_gib=weights, headroom=headroom
            )
            assert row.largest_safe_context >= previous, (name, gib, dtype, fraction, tp)
            previous = row.largest_safe_context


@pytest.mark.parametrize(("name", "config", "weights"), MODELS, ids=[m[0] for m in MODELS])
def test_a_smaller_kv_dtype_never_lowers_the_largest_safe_context(
    name: str, config: dict[str, Any], weights: float
) -> None:
    for gib, tp, fraction in itertools.product(GPU_SIZES, TPS, FRACTIONS):
        wide, narrow = (
            plan_shape(config, Shape(gib, tp, dtype, fraction), weights_gib=weights)
            for dtype in DTYPES_WIDE_TO_NARROW
        )
        assert narrow.largest_safe_context >= wide.largest_safe_context, (name, gib, tp, fraction)
        assert narrow.kv_pool_tokens >= wide.kv_pool_tokens


@pytest.mark.parametrize(("name", "config", "weights"), MODELS, ids=[m[0] for m in MODELS])
@pytest.mark.parametrize("context_length", [4_096, 32_768, 131_072, 1_000_000])
@pytest.mark.parametrize("headroom", [1.0, 1.3])
def test_the_cheapest_shape_really_holds_the_context_and_none_cheaper_does(
    name: str, config: dict[str, Any], weights: float, context_length: int, headroom: float
) -> None:
    plan = make_plan(
        PlanRequest(
            config,
            weights_gib=weights,
            gpu_memory_gib=GPU_SIZES,
            mem_fraction_static=FRACTIONS,
            headroom=headroom,
            context_length=context_length,
        )
    )
    required = math.ceil(context_length * headroom)
    holding = [
        row.shape
        for row in plan.shapes
        if _estimated_pool(config, row.shape, weights) >= required
        and context_length <= plan.model_context_length
    ]
    assert {row.shape for row in plan.cheapest} == set(holding)
    if not holding:
        assert plan.cheapest == ()
        return
    best = plan.cheapest[0]
    assert _estimated_pool(config, best.shape, weights) >= required
    assert best.shape.gpus == min(shape.gpus for shape in holding)
    same_gpus = [s for s in holding if s.gpus == best.shape.gpus]
    assert best.kv_pool_tokens == max(_estimated_pool(config, s, weights) for s in same_gpus)


def test_a_context_beyond_the_models_limit_is_held_by_no_shape() -> None:
    plan = make_plan(
        PlanRequest(LLAMA_31_8B, weights_gib=15.0, gpu_memory_gib=(192,), context_length=131_073)
    )
    assert plan.cheapest == ()
    assert max(r.kv_pool_tokens for r in plan.shapes) > 1_000_000  # the pool was not the limit
    assert {r.largest_safe_context for r in plan.shapes} == {131_072}


def test_tp_sizes_sglang_refuses_are_skipped_and_said_why() -> None:
    plan = make_plan(PlanRequest(LLAMA_31_70B, weights_gib=131.5, tp=(3, 4, 8)))
    assert {r.shape.tp for r in plan.shapes} == {4, 8}
    assert plan.skipped == ("TP 3 does not divide num_attention_heads 64",)


@pytest.mark.parametrize(
    ("request_fields", "field", "words"),
    [
        ({"config": MAMBA, "weights_gib": 5.0}, "--config", ["MambaForCausalLM", "hidden_size"]),
        (
            {"config": DEEPSEEK_V3, "weights_gib": None},
            "--weights-gib",
            ["DeepseekV3ForCausalLM", "--weights-gib"],
        ),
        ({"tp": (3, 5)}, "--tp", ["search space is empty", "TP 3", "TP 5", "--tp 1,2,4,8"]),
        ({"tp": ()}, "--tp", ["search space is empty"]),
        ({"gpu_memory_gib": ()}, "--gpu-memory-gib", ["search space is empty"]),
        ({"kv_cache_dtypes": ()}, "--kv-cache-dtype", ["search space is empty"]),
        ({"kv_cache_dtypes": ("int3",)}, "--kv-cache-dtype", ["int3 is not accepted", "fp8_e4m3"]),
        ({"mem_fraction_static": (1.2,)}, "--mem-fraction-static", ["1.2", "between 0 and 1"]),
        ({"gpu_memory_gib": (0.0,)}, "--gpu-memory-gib", ["above 0", "(got 0)"]),
        ({"tp": (0,)}, "--tp", ["between 1 and 512", "(got 0)"]),
        ({"headroom": 0.9}, "--headroom", ["0.9", ">= 1.0"]),
        ({"context_length": 0}, "--context-length", ["1 or more (got 0)"]),
        ({"weights_gib": -3.0}, "--weights-gib", ["above 0 (got -3)"]),
        ({"page_size": 0}, "--page-size", ["1 or more (got 0)"]),
    ],
)
def test_an_impossible_plan_names_the_flag_the_numbers_and_the_way_out(
    request_fields: dict[str, Any], field: str, words: list[str]
) -> None:
    fields: dict[str, Any] = {"config": LLAMA_31_70B, "weights_gib": 131.5} | request_fields
    with pytest.raises(PlanError) as raised:
        make_plan(PlanRequest(**fields))
    assert raised.value.field == field
    for word in words:
        assert word in str(raised.value)


FIT_CASES = [
    # (config, weights, shape, context, headroom, expected first fix)
    (LLAMA_31_8B, 15.0, Shape(24, 1, "auto", 0.85), 65_536, 1.0, ("kvCacheDtype", "fp8_e4m3")),
    (LLAMA_31_8B, 15.0, Shape(24, 1, "fp8_e4m3", 0.85), 100_000, 1.0, ("memFractionStatic", 0.88)),
    (LLAMA_31_8B, 15.0, Shape(24, 1, "auto", 0.85), 131_072, 1.0, ("gpuMemoryGiB", 40.0)),
    (LLAMA_31_8B, 15.0, Shape(24, 1, "auto", 0.85), 100_000, 1.3, ("gpuMemoryGiB", 40.0)),
    (LLAMA_31_70B, 131.5, Shape(80, 2, "auto", 0.85), 131_072, 1.0, ("gpuMemoryGiB", 141.0)),
    (
        LLAMA_31_70B,
        131.5,
        Shape(80, 2, "fp8_e4m3", 0.85),
        131_072,
        1.0,
        ("memFractionStatic", 0.95),
    ),
    (LLAMA_31_70B, 131.5, Shape(80, 1, "auto", 0.85), 131_072, 1.0, ("gpuMemoryGiB", 288.0)),
    (DEEPSEEK_V3, 642.0, Shape(80, 8, "auto", 0.85), 163_840, 1.0, ("gpuMemoryGiB", 141.0)),
]


@pytest.mark.parametrize(
    ("config", "weights", "shape", "context_length", "headroom", "first"), FIT_CASES
)
def test_every_proposed_fix_holds_the_context_under_the_estimator(
    config: dict[str, Any],
    weights: float,
    shape: Shape,
    context_length: int,
    headroom: float,
    first: tuple[str, Any],
) -> None:
    fit = fit_role(
        config, shape, weights_gib=weights, context_length=context_length, headroom=headroom
    )
    required = math.ceil(context_length * headroom)
    assert not fit.holds
    assert fit.short_by_tokens == required - fit.kv_pool_tokens
    assert (fit.fixes[0].field, fit.fixes[0].value) == first
    field_names = {
        "gpuMemoryGiB": "gpu_memory_gib",
        "tensorParallel": "tp",
        "kvCacheDtype": "kv_cache_dtype",
        "memFractionStatic": "mem_fraction_static",
    }
    for fix in fit.fixes:
        changed = Shape(
            **(
                {
                    "gpu_memory_gib": shape.gpu_memory_gib,
                    "tp": shape.tp,
                    "kv_cache_dtype": shape.kv_cache_dtype,
                    "mem_fraction_static": shape.mem_fraction_static,
                }
                | {field_names[fix.field]: fix.value}
            )
        )
        # fit_role got no estimator options here: nothing reserved.
        assert _estimated_pool(config, changed, weights, 0.0) == fix.kv_pool_tokens >= required
    # The largest context of this shape is what the gate accepts on its pool.
    assert required_pool_tokens(fit.largest_safe_context, headroom) <= max(fit.kv_pool_tokens, 0)


def test_fixes_are_the_smallest_of_their_kind() -> None:
    """memFractionStatic: the first hundredth that holds; tensorParallel: the next TP that does."""
    shape = Shape(80, 2, "auto", 0.85)
    fit = fit_role(LLAMA_31_70B, shape, weights_gib=131.5, context_length=40_000)
    by_field = {fix.field: fix for fix in fit.fixes}
    fraction = by_field["memFractionStatic"].value
    assert isinstance(fraction, float)
    below = Shape(80, 2, "auto", round(fraction - 0.01, 2))
    assert _estimated_pool(LLAMA_31_70B, below, 131.5) < 40_000
    assert by_field["tensorParallel"].value == 4
    # Same GPUs first (fp8, a higher fraction), then another GPU model, then more GPUs.
    assert [f.field for f in fit.fixes][-1] == "tensorParallel"


def test_a_shape_that_holds_needs_no_fix() -> None:
    fit = fit_role(
        LLAMA_31_8B, Shape(80, 1, "auto", 0.85), weights_gib=15.0, context_length=131_072
    )
    assert fit.holds and fit.fixes == () and fit.short_by_tokens == 0
    assert fit.largest_safe_context == 131_072
