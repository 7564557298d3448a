"""The pools SGLang's own code computed and kvgate's estimate of each recorded shape: Llama 4
(tests/fixtures/sglang_pools/llama4.json, recorded and re-checked live by
tests/conformance/llama4_pools_probe.py) and DeepSeek-V4 (deepseek_v4.json, per release, by
dsv4_pools_probe.py). The unit tests and the conformance tier hold the two to each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kvgate_engine.estimator import (
    SWA_FULL_TOKENS_RATIO,
    Estimate,
    EstimateError,
    NoRoomForKvCache,
    SlidingWindowPoolTooSmall,
    estimate_pool,
)

from factories.model_configs import model_config

LLAMA4_RECORD: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[1] / "fixtures" / "sglang_pools" / "llama4.json").read_text()
)


def llama4_estimate(shape: dict[str, Any], **kwargs: Any) -> Estimate:
    """kvgate's estimate for one recorded shape (``kwargs``: e.g. the GPU architecture)."""
    ratio = shape["ratio"]
    args = [] if ratio == SWA_FULL_TOKENS_RATIO else ["--swa-full-tokens-ratio", str(ratio)]
    return estimate_pool(
        model_config(shape["model"]),
        gpu_memory_gib=shape["gpu"],
        gpu_reserved_gib=shape["reserved"],
        mem_fraction_static=shape["mfs"],
        weights_gib=shape["weights"],
        tp=shape["tp"],
        kv_cache_dtype=shape["kv"],
        page_size=shape["page"],
        engine_args=args,
        **kwargs,
    )


DSV4_RECORD: dict[str, Any] = json.loads(
    (
        Path(__file__).resolve().parents[1] / "fixtures" / "sglang_pools" / "deepseek_v4.json"
    ).read_text()
)
# The inputs of a recorded DeepSeek-V4 shape (the rest of a record is SGLang's answer).
DSV4_SHAPE_INPUTS = (
    "name",
    "model",
    "gpu",
    "reserved",
    "mfs",
    "weights",
    "tp",
    "role",
    "engine_args",
    "max_total_tokens",
    "sm",
)


def dsv4_estimate(shape: dict[str, Any], release: str) -> Estimate:
    """kvgate's estimate for one recorded DeepSeek-V4 shape under SGLang ``release``."""
    return estimate_pool(
        model_config(shape["model"]),
        gpu_memory_gib=shape["gpu"],
        gpu_reserved_gib=shape["reserved"],
        mem_fraction_static=shape["mfs"],
        weights_gib=shape["weights"],
        tp=shape["tp"],
        page_size=1,
        max_total_tokens=shape["max_total_tokens"],
        gpu_arch=f"sm{shape['sm']}",
        engine_args=shape["engine_args"],
        role=shape["role"],
        release=release,
    )


def assert_dsv4_estimate_matches(version: str, answer: dict[str, Any]) -> None:
    """kvgate's estimate of one shape for ``version`` against what that release computed."""
    if "max_total_num_tokens" not in answer:
        refused = answer.get("refused", answer.get("refused_args", ""))
        # SGLang checks the SWA floor first; kvgate says no page fits when none does.
        expected: type[EstimateError] = EstimateError
        if "Not enough memory" in refused or "SWA pool (0 tokens)" in refused:
            expected = NoRoomForKvCache
        elif "SWA pool" in refused:
            expected = SlidingWindowPoolTooSmall
        with pytest.raises(expected):
            dsv4_estimate(answer, version)
        return
    estimate = dsv4_estimate(answer, version)
    pools = estimate.dsv4_pools
    assert pools is not None
    assert (
        pools.full_tokens,
        pools.swa_tokens,
        pools.c4_tokens,
        pools.c128_tokens,
        pools.c4_state_rows,
    ) == (
        answer["max_total_num_tokens"],
        answer["swa_max_total_num_tokens"],
        answer["c4_max_total_num_tokens"],
        answer["c128_max_total_num_tokens"],
        answer["c4_state_pool_size"],
    ), answer["name"]
    assert pools.bytes_per_full_token == answer["bytes_per_full_token"], answer["name"]
    assert estimate.context_length == answer["context_len"], answer["name"]
