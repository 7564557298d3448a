"""Llama 4's chunked-attention pools, against the numbers SGLang's own code gave.

tests/fixtures/sglang_pools/llama4.json holds, per shape, what SGLang 0.5.19 to 0.5.23 (the same
on every shape) computed with their own ModelConfig, get_hybrid_layer_ids and
HybridSWAPoolConfigurator (tests/conformance/llama4_pools_probe.py says how). The configs are
tests/fixtures/model_configs/llama-4-{scout-17b-16e,maverick-17b-128e}.json, written from the
published Hugging Face config.json of meta-llama/Llama-4-Scout-17B-16E-Instruct and
meta-llama/Llama-4-Maverick-17B-128E-Instruct.
"""

from __future__ import annotations

from typing import Any

import pytest
from factories.model_configs import model_config
from factories.sglang_pools import LLAMA4_RECORD, llama4_estimate
from kvgate_engine.estimator import (
    ChunkedPoolTooSmall,
    estimate_pool,
    forced_page_size,
    layout_of,
)
from kvgate_engine.sglang_choices import SUPPORTED_RELEASES

SIZED = [shape for shape in LLAMA4_RECORD["shapes"] if "refused" not in shape]
REFUSED = [shape for shape in LLAMA4_RECORD["shapes"] if "refused" in shape]


def test_the_record_was_computed_by_sglang_releases_that_agree() -> None:
    assert (
        LLAMA4_RECORD["releases_run"] == list(SUPPORTED_RELEASES)
        and LLAMA4_RECORD["releases_agree"]
    )
    assert len(SIZED) >= 6 and len(REFUSED) >= 2


@pytest.mark.parametrize("shape", SIZED, ids=[shape["name"] for shape in SIZED])
def test_llama4_pools_are_the_ones_sglang_sizes(shape: dict[str, Any]) -> None:
    """Every fourth layer full, the other 36 chunked (SWA pool at swa_full_tokens_ratio);
    the window is attention_chunk_size; multimodal stays off, so no VLM cache is reserved."""
    estimate = llama4_estimate(shape, gpu_arch="sm90")
    assert estimate.attention == "SWA"
    assert estimate.kv_pool_tokens == shape["max_total_num_tokens"]
    assert estimate.swa_pool_tokens == shape["swa_max_total_num_tokens"]
    assert estimate.bytes_per_token == -(-shape["cell_size"] // 1)
    assert estimate.page_size == shape["page"]


def test_llama4_context_length_is_the_published_window() -> None:
    """max_position_embeddings, the llama3 rope factor not applied (Scout: 10M, Maverick: 1M)."""
    shape = SIZED[0]
    assert llama4_estimate(shape).context_length == 10_485_760
    maverick = next(s for s in SIZED if s["model"].startswith("llama-4-maverick"))
    assert llama4_estimate(maverick).context_length == 1_048_576


@pytest.mark.parametrize("shape", REFUSED, ids=[shape["name"] for shape in REFUSED])
def test_a_chunked_pool_at_or_below_one_chunk_plus_a_page_is_refused_with_the_numbers(
    shape: dict[str, Any],
) -> None:
    """SGLang refuses to start (its ValueError is in the record); kvgate refuses to estimate,
    naming the SWA pool, the chunk, the page and the way out."""
    with pytest.raises(ChunkedPoolTooSmall) as refused:
        llama4_estimate(shape, gpu_arch="sm90")
    swa_tokens = int(shape["refused"].split("(")[1].split(" ")[0])  # "SWA pool (7463 tokens)"
    error = refused.value
    assert (error.swa_pool_tokens, error.window, error.page) == (swa_tokens, 8192, shape["page"])
    message = str(error)
    assert f"{swa_tokens:,}" in message and "8,192" in message
    assert "attention_chunk_size" in message and "--swa-full-tokens-ratio" in message


def test_on_blackwell_sglang_picks_trtllm_mha_whose_page_is_64_unless_16_32_64_or_128() -> None:
    """arg_groups/model_overrides/llama4.py: trtllm_mha on SM100; arg_groups/overrides.py
    _mla_backend_page_constraints: page 1 becomes 64, page 32 stays. Unknown GPU: 64."""
    shape = SIZED[0]
    assert llama4_estimate(shape, gpu_arch="sm100").page_size == 64
    assert llama4_estimate({**shape, "page": 32}, gpu_arch="sm100").page_size == 32
    assert llama4_estimate(shape, gpu_arch="sm90").page_size == 1
    assert llama4_estimate(shape).page_size == 64
    assert forced_page_size(model_config("llama-4-scout-17b-16e")) == 64


def test_llama4_with_hybrid_swa_memory_disabled_keeps_every_layer_in_the_full_pool() -> None:
    """--disable-hybrid-swa-memory: 48 layers × 1 head × 256 × 2 bytes = 24,576 a token."""
    config = model_config("llama-4-scout-17b-16e")
    assert layout_of(config) == "SWA"
    estimate = estimate_pool(
        config,
        gpu_memory_gib=80,
        gpu_reserved_gib=1,
        weights_gib=203,
        tp=8,
        gpu_arch="sm90",
        engine_args=["--disable-hybrid-swa-memory"],
    )
    assert (estimate.attention, estimate.bytes_per_token) == ("MHA", 24_576)
    assert estimate.kv_pool_tokens == int(int((79 * 0.85 - 203 / 8) * 2**30) // 24_576)


def test_enable_multimodal_reserves_the_vlm_cache_out_of_the_budget() -> None:
    """--enable-multimodal turns Llama 4's vision tower on; SGLang then reserves
    SGLANG_VLM_CACHE_SIZE_MB (100 MiB) before the pool (mm_runtime_reservation_gb)."""
    shape = SIZED[0]
    plain = llama4_estimate(shape, gpu_arch="sm90")
    config = model_config(shape["model"])
    multimodal = estimate_pool(
        config,
        gpu_memory_gib=80,
        gpu_reserved_gib=1,
        weights_gib=203,
        tp=8,
        gpu_arch="sm90",
        engine_args=["--enable-multimodal"],
    )
    assert multimodal.usable_gib == pytest.approx(plain.usable_gib - 100 / 1024)
    assert multimodal.kv_pool_tokens < plain.kv_pool_tokens
