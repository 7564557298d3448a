"""The estimator on the models people deploy now, against SGLang 0.5.23's own arithmetic.

The config.json files in tests/fixtures/model_configs/ were written from the published
Hugging Face configs (deepseek-ai/DeepSeek-V3.2, zai-org/GLM-5, Qwen/Qwen3-Next-80B-A3B-Instruct,
openai/gpt-oss-120b, google/gemma-3-27b-it) from memory, without network access; the keys the
pool depends on were checked against the SGLang classes that read them (configs/model_config.py,
configs/qwen3_next.py). Each expected number is worked by hand in the docstring from SGLang's
arithmetic under kvgate's memory convention:

    available bytes per rank = ((gpuMemoryGiB − gpuReservedGiB) × memFractionStatic
                                − weightsGiB / tp [− 100 MiB for multimodal]) × 2^30

which is SGLang's ``_profile_available_bytes`` (mem_cache/kv_cache_configurator.py) with the
free memory before load taken as gpuMemoryGiB − gpuReservedGiB. Pools must agree within 0.5 %.
"""

from __future__ import annotations

from typing import Any

import pytest
from factories.model_configs import model_config
from kvgate_engine.estimator import (
    EstimateError,
    NoRoomForKvCache,
    SizingFlags,
    bytes_per_token,
    derive_context_length,
    estimate_pool,
    layout_of,
)
from kvgate_engine.sglang_choices import SUPPORTED_RELEASES

GIB = 2**30


def within_half_percent(estimated: int, by_hand: int) -> bool:
    return abs(estimated - by_hand) <= by_hand * 0.005


DS32 = model_config("deepseek-v3.2")
GLM5 = model_config("glm-5")
GPT_OSS = model_config("gpt-oss-120b")
GEMMA3 = model_config("gemma-3-27b-it")
QWEN3_NEXT = model_config("qwen3-next-80b-a3b")

# 8 × 140 GiB GPUs, 1 GiB reserved, mfs 0.88: DeepSeek-V3.2 642 GiB of fp8 weights.
DS_USABLE = (140 - 1) * 0.88 - 642 / 8  # 42.07 GiB
GLM_USABLE = (140 - 1) * 0.88 - 705 / 8  # 34.195 GiB


def _dsa(config: dict[str, Any], weights: float, **kwargs: Any) -> int:
    return estimate_pool(
        config,
        gpu_memory_gib=140,
        tp=8,
        mem_fraction_static=0.88,
        weights_gib=weights,
        gpu_reserved_gib=1,
        **kwargs,
    ).kv_pool_tokens


@pytest.mark.parametrize(
    ("kwargs", "cell", "by_hand"),
    [
        # auto, GPU unknown: bf16 (SGLang's Hopper choice, the larger cell):
        # (512 + 64) × 2 = 1,152 + indexer 128 + 128/128 × 4 = 132 → 1,284 × 61 = 78,324
        ({}, 78_324, int(int(DS_USABLE * GIB) // 78_324) // 64 * 64),  # 576,704
        # fp8 on Hopper's flashmla_kv (scaled): 512 + 4 × 4 + 64 × 2 = 656 + 132 → 788 × 61
        ({"kv_cache_dtype": "fp8_e4m3"}, 48_068, int(int(DS_USABLE * GIB) // 48_068) // 64 * 64),
        # auto on Blackwell = fp8 on trtllm, raw rows: 576 + 132 = 708 × 61 = 43,188
        ({"gpu_arch": "sm100"}, 43_188, int(int(DS_USABLE * GIB) // 43_188) // 64 * 64),
        # auto on Hopper = bf16, as unknown
        ({"gpu_arch": "sm90"}, 78_324, int(int(DS_USABLE * GIB) // 78_324) // 64 * 64),
        # MTP (NEXTN, no draft path): + int(1,152 × 61 × 1 / 61) + 132 indexer = 79,608
        (
            {"engine_args": ["--speculative-algorithm", "NEXTN"]},
            79_608,
            int(int(DS_USABLE * GIB) // 79_608) // 64 * 64,
        ),
    ],
)
def test_deepseek_v32_dsa_pool_as_sglang_stores_it_model_executor_pool_configurator(
    kwargs: dict[str, Any], cell: int, by_hand: int
) -> None:
    """DSA (pool_configurator.py _compute_cell_size + kv_cache_configurator.py
    calculate_mla_kv_cache_dim): latent + rope, fp8 with scales, plus the indexer K cache on
    every layer; page size forced to 64 (arg_groups/model_overrides/deepseek_v2.py)."""
    estimate = estimate_pool(
        DS32,
        gpu_memory_gib=140,
        tp=8,
        mem_fraction_static=0.88,
        weights_gib=642,
        gpu_reserved_gib=1,
        **kwargs,
    )
    assert estimate.attention == "DSA"
    assert estimate.bytes_per_token == cell
    assert estimate.page_size == 64
    assert estimate.kv_pool_tokens % 64 == 0
    assert within_half_percent(estimate.kv_pool_tokens, by_hand)


def test_deepseek_v32_is_no_longer_over_estimated() -> None:
    """The old rule (512 + 64) × 61 × 1 byte = 35,136 counted 1,285,632 tokens for fp8; SGLang
    stores 48,068 bytes a token (939,712 tokens): the old figure was 1.37× too high."""
    assert _dsa(DS32, 642, kv_cache_dtype="fp8_e4m3") == 939_712
    assert _dsa(DS32, 642) == 576_704


def test_glm5_dsa_pool() -> None:
    """GLM-5: 78 layers. bf16: (1,152 + 132) × 78 = 100,152 bytes; usable 34.195 GiB
    → 366,619 → 366,592 at page 64. fp8 scaled: (656 + 132) × 78 = 61,464 → 597,312."""
    assert bytes_per_token(GLM5, tp=8) == 100_152
    assert _dsa(GLM5, 705) == 366_592
    assert _dsa(GLM5, 705, kv_cache_dtype="fp8_e4m3") == 597_312
    by_hand = int(int(GLM_USABLE * GIB) // 100_152) // 64 * 64
    assert within_half_percent(_dsa(GLM5, 705), by_hand)


def test_dsa_refuses_kv_dtypes_sglang_refuses() -> None:
    """overrides.py _dsa_kv_cache_dtype_default asserts bf16 or fp8_e4m3."""
    with pytest.raises(EstimateError, match="only with kvCacheDtype auto, bfloat16 or fp8_e4m3"):
        _dsa(DS32, 642, kv_cache_dtype="fp8_e5m2")


@pytest.mark.parametrize(
    ("tp", "weights", "by_hand", "swa"),
    [
        # n = 8 KV heads; 8 × (64 + 64) × 2 = 2,048 bytes a layer; 18 full + 0.8 × 18 SWA
        # = 66,355.2 bytes; usable (80 − 1) × 0.85 − 60.5 = 6.65 GiB → 107,608; SWA 86,086
        (1, 60.5, 107_608, 86_086),
        # TP 4: 2 heads a rank → 16,588.8 bytes; usable 67.15 − 15.125 = 52.025 → 3,367,417
        (4, 60.5, 3_367_417, 2_693_933),
    ],
)
def test_gpt_oss_full_layers_bound_the_pool_swa_layers_cost_their_share(
    tp: int, weights: float, by_hand: int, swa: int
) -> None:
    """pool_configurator.py HybridSWAPoolConfigurator: cell = full × full_layers +
    swa_full_tokens_ratio (0.8) × swa × swa_layers; max_total_num_tokens is the full pool."""
    estimate = estimate_pool(
        GPT_OSS, gpu_memory_gib=80, tp=tp, weights_gib=weights, gpu_reserved_gib=1
    )
    assert estimate.attention == "SWA"
    assert within_half_percent(estimate.kv_pool_tokens, by_hand)
    assert estimate.swa_pool_tokens is not None
    assert within_half_percent(estimate.swa_pool_tokens, swa)
    # Counting all 36 layers as full gave 96,847 tokens at TP 1: 1.11× too few.
    assert estimate.kv_pool_tokens > int(6.65 * GIB / (2_048 * 36)) or tp != 1


def test_gpt_oss_swa_ratio_flag_changes_the_split() -> None:
    """--swa-full-tokens-ratio 0.5: cell = 36,864 + 0.5 × 36,864 = 55,296 → 129,129."""
    estimate = estimate_pool(
        GPT_OSS,
        gpu_memory_gib=80,
        tp=1,
        weights_gib=60.5,
        gpu_reserved_gib=1,
        engine_args=["--swa-full-tokens-ratio=0.5"],
    )
    assert within_half_percent(estimate.kv_pool_tokens, int(int(6.65 * GIB) // 55_296))


def test_gemma3_every_layer_is_in_the_full_pool_as_sglang_0523_disables_hybrid_swa() -> None:
    """arg_groups/model_overrides/gemma2_gemma3.py sets disable_hybrid_swa_memory, so all 62
    layers are full: 16 heads × (128 + 128) × 62 × 2 = 507,904 bytes. Text-only (no VLM cache,
    see the next test): usable (80 − 1) × 0.85 − 51 = 16.15 GiB → 34,142 tokens; TP 2:
    253,952 bytes, usable 41.65 → 176,101."""
    one = estimate_pool(GEMMA3, gpu_memory_gib=80, tp=1, weights_gib=51, gpu_reserved_gib=1)
    two = estimate_pool(GEMMA3, gpu_memory_gib=80, tp=2, weights_gib=51, gpu_reserved_gib=1)
    assert (one.attention, one.bytes_per_token) == ("MHA", 507_904)
    assert within_half_percent(one.kv_pool_tokens, 34_142)
    assert within_half_percent(two.kv_pool_tokens, 176_101)


def test_gemma3_reserves_the_vlm_cache_only_with_enable_multimodal() -> None:
    """configs/model_config.py (0.5.19 to 0.5.23) lists Gemma3ForConditionalGeneration in
    mm_disabled_models: without --enable-multimodal SGLang serves it text-only, is_multimodal is
    False and mm_runtime_reservation_gb reserves nothing. With the flag the 100 MiB VLM cache
    comes off the budget: usable 16.15 − 0.09765625 = 16.0523 GiB → 33,935 tokens."""
    text_only = estimate_pool(GEMMA3, gpu_memory_gib=80, tp=1, weights_gib=51, gpu_reserved_gib=1)
    multimodal = estimate_pool(
        GEMMA3,
        gpu_memory_gib=80,
        tp=1,
        weights_gib=51,
        gpu_reserved_gib=1,
        engine_args=["--enable-multimodal"],
    )
    assert text_only.kv_pool_tokens == int(int(16.15 * GIB) // 507_904)
    assert multimodal.kv_pool_tokens == int(int((16.15 - 100 / 1024) * GIB) // 507_904)


def test_qwen3_next_mamba_state_first_then_full_layers_bound_the_pool() -> None:
    """kv_cache_configurator.py _handle_max_mamba_cache + configs/qwen3_next.py at TP 4:
    state a linear layer = conv (4,096 + 2 × 16 × 128) / 4 × 3 × 2 bytes = 12,288 + SSM
    32 / 4 × 128 × 128 × 4 bytes = 524,288 → 536,576; × 36 linear layers = 19,316,736 a request.
    usable (80 − 1) × 0.85 − 149 / 4 = 29.9 GiB; mamba budget 29.9 × 0.9 / 1.9 GiB → 786 slots,
    (786 + 1) × 19,316,736 = 14.1582 GiB; KV 1 head × 512 × 2 × 12 full layers = 12,288 bytes
    → 1,375,537 (1,375,488 at page 64). Counting 48 full layers gave 653,175: 2.1× too few."""
    estimate = estimate_pool(
        QWEN3_NEXT, gpu_memory_gib=80, tp=4, weights_gib=149, gpu_reserved_gib=1
    )
    assert (estimate.attention, estimate.bytes_per_token) == ("LINEAR", 12_288)
    assert estimate.mamba_state_gib == pytest.approx(787 * 19_316_736 / GIB)
    assert within_half_percent(estimate.kv_pool_tokens, 1_375_537)


def test_kv_heads_split_by_attention_tp_under_dp_attention() -> None:
    """tp 8 with --enable-dp-attention --dp-size 4: attention TP 2, so 4 of Llama-8B's 8 KV
    heads a rank: 4 × 256 × 32 × 2 = 65,536 bytes, twice what plain TP 8 (1 head) costs."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "torch_dtype": "bfloat16",
    }
    dp = ["--enable-dp-attention", "--dp-size", "4"]
    assert bytes_per_token(config, tp=8) == 16_384
    assert bytes_per_token(config, tp=8, engine_args=dp) == 65_536


def test_v_head_dim_num_attention_groups_and_mxfp8_scales() -> None:
    """K uses head_dim 192, V v_head_dim 128 (configs/model_config.py); KV heads from
    num_attention_groups 4 (Step3); mxfp8 adds one scale byte per 32 elements:
    4 × (192 + 128) × 10 = 12,800 elements → 12,800 + 400 bytes."""
    config = {
        "architectures": ["Step3TextForCausalLM"],
        "hidden_size": 4096,
        "head_dim": 192,
        "v_head_dim": 128,
        "num_attention_heads": 32,
        "num_attention_groups": 4,
        "num_hidden_layers": 10,
        "torch_dtype": "bfloat16",
    }
    assert bytes_per_token(config, tp=1) == 25_600
    assert bytes_per_token(config, tp=1, kv_cache_dtype="mxfp8") == 13_200


def test_max_total_tokens_is_rounded_down_to_the_page() -> None:
    """pool_configurator.py calculate_pool_sizes_from_max_tokens: 100,001 at page 64 → 99,968."""
    estimate = estimate_pool(
        GEMMA3,
        gpu_memory_gib=80,
        tp=2,
        weights_gib=51,
        page_size=64,
        max_total_tokens=100_001,
    )
    assert estimate.kv_pool_tokens == 99_968


def test_reserved_memory_comes_off_before_the_fraction() -> None:
    """(80 − 4) × 0.85 − 51 = 13.6 GiB / 507,904 → 28,751 (1 GiB reserved: 34,142)."""
    four = estimate_pool(GEMMA3, gpu_memory_gib=80, tp=1, weights_gib=51, gpu_reserved_gib=4)
    assert within_half_percent(four.kv_pool_tokens, int(13.6 * GIB // 507_904))


@pytest.mark.parametrize(
    ("config", "args", "reason"),
    [
        ({"architectures": ["Step3p5ForCausalLM"]}, [], "sliding-window pool"),
        ({"architectures": ["X"], "compress_ratios": [4]}, [], "compressed attention"),
        ({"architectures": ["FalconH1ForCausalLM"], "mamba_d_state": 16}, [], "mamba"),
        ({"architectures": ["X"], "index_topk": 2048, "kv_lora_rank": 512}, [], "indexer"),
        (
            {"architectures": ["X"], "layer_types": ["sliding_attention", "full_attention"]},
            [],
            "layer types",
        ),
        (
            DS32,
            ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "d"],
            "draft",
        ),
        (GPT_OSS, ["--enable-unified-memory"], "--enable-unified-memory"),
        (QWEN3_NEXT, ["--speculative-algorithm", "NEXTN"], "num_nextn_predict_layers"),
    ],
)
def test_layouts_kvgate_does_not_model_are_refused_with_the_reason_never_guessed(
    config: dict[str, Any], args: list[str], reason: str
) -> None:
    with pytest.raises(EstimateError, match=reason):
        estimate_pool(config, gpu_memory_gib=80, tp=1, weights_gib=1, engine_args=args)


def test_layouts_of_the_fixtures() -> None:
    assert [layout_of(c) for c in (DS32, GLM5, GPT_OSS, GEMMA3, QWEN3_NEXT)] == [
        "DSA",
        "DSA",
        "SWA",
        "MHA",
        "LINEAR",
    ]


def test_a_swa_pool_too_small_for_one_window_is_no_room() -> None:
    """validate_swa_pool_size: SGLang refuses to start when swa tokens <= window + page."""
    with pytest.raises(NoRoomForKvCache, match="sliding-window pool"):
        estimate_pool(GPT_OSS, gpu_memory_gib=80, tp=1, weights_gib=67.14, gpu_reserved_gib=1)


def test_sizing_flags_parse_both_spellings() -> None:
    flags = SizingFlags.from_args(["--speculative-algorithm=nextn", "--dp-size", "2"])
    assert (flags.speculative_algorithm, flags.attention_dp) == ("NEXTN", 1)


def test_gemma3_context_is_its_config_class_default_as_transformers_5_nests_its_rope() -> None:
    """sglang/srt/utils/hf_transformers/common.py get_context_length reads max_position_embeddings
    with getattr on the transformers config, where Gemma3TextConfig defaults it to 131,072 (the
    published config.json leaves it out). transformers 5.12.1 and 5.19.0 (pinned by every
    supported release) store Gemma 3's rope_scaling per layer type, so SGLang finds no top-level
    factor: 131,072, not 131,072 × 8."""
    for release in SUPPORTED_RELEASES:
        assert derive_context_length(GEMMA3, release) == 131_072
    # Without the model type kvgate knows no class default: SGLang's last resort, 2,048.
    anonymous = {**GEMMA3, "text_config": {**GEMMA3["text_config"], "model_type": "unknown"}}
    assert derive_context_length(anonymous) == 2_048


def test_olmo3_rope_factor_counts_until_its_transformers_nests_it_per_layer_type() -> None:
    """Olmo3Config nests its rope parameters in transformers 5.19.0 (SGLang 0.5.22 on), not in
    5.12.1 (0.5.19-0.5.21), where a linear factor still multiplies."""
    olmo3 = {
        "model_type": "olmo3",
        "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    }
    assert derive_context_length(olmo3, "0.5.21") == 16_384
    assert derive_context_length(olmo3, "0.5.22") == 4_096
    assert derive_context_length(olmo3) == 4_096


UNIFIED_AND_MAMBA = ("--enable-unified-memory", "--max-mamba-cache-size")


@pytest.mark.parametrize(
    ("args", "algorithm", "draft", "unmodelled"),
    [
        (["--speculative-alg", "eagle"], "EAGLE", None, ()),
        (["--speculative-draft-model", "d", "--speculative-algorithm=EAGLE3"], "EAGLE3", "d", ()),
        (["--speculative-draft-model-p=d"], None, "d", ()),
        (["--decode-context-parallel-size", "2"], None, None, ("--dcp-size",)),
        (["--enable-unified", "--max-mamba-c=8"], None, None, UNIFIED_AND_MAMBA),
        # "--speculative-" is a prefix of several: SGLang refuses it, it sets nothing
        (["--speculative-", "EAGLE"], None, None, ()),
    ],
)
def test_sizing_flags_are_read_as_sglang_reads_them_abbreviated_or_by_alias(
    args: list[str], algorithm: str | None, draft: str | None, unmodelled: tuple[str, ...]
) -> None:
    flags = SizingFlags.from_args(args)
    assert flags.speculative_algorithm == algorithm
    assert flags.speculative_draft_model_path == draft
    assert flags.unmodelled == unmodelled


def test_dp_attention_is_read_with_its_size_by_alias() -> None:
    flags = SizingFlags.from_args(["--enable-dp-attention", "--data-parallel-size=4"])
    assert flags.attention_dp == 4


def test_qwen3_next_state_comes_from_the_request_cap_without_the_radix_cache() -> None:
    """_handle_max_mamba_cache: --disable-radix-cache with --max-running-requests 64 keeps
    max_mamba_cache_size = 64 state slots (+1 padding) = 65 × 19,316,736 bytes = 1.1694 GiB,
    not 0.9/1.9 of the budget (787 slots, 14.16 GiB). KV: (29.9 GiB − 1,255,587,840 bytes) /
    12,288 = 2,510,530 tokens → 2,510,528 at page 64."""
    args = ["--disable-radix-cache", "--max-running-requests", "64"]
    estimate = estimate_pool(
        QWEN3_NEXT, gpu_memory_gib=80, tp=4, weights_gib=149, gpu_reserved_gib=1, engine_args=args
    )
    assert estimate.mamba_state_gib == pytest.approx(65 * 19_316_736 / GIB)
    assert within_half_percent(estimate.kv_pool_tokens, 2_510_528)
    # attention DP 2: 32 slots a DP shard
    dp = [*args, "--attn-dp-size", "2"]
    shard = estimate_pool(
        QWEN3_NEXT, gpu_memory_gib=80, tp=4, weights_gib=149, gpu_reserved_gib=1, engine_args=dp
    )
    assert shard.mamba_state_gib == pytest.approx(33 * 2 * 19_316_736 / GIB)


def test_a_request_cap_whose_state_fills_the_gpu_names_the_flag_and_the_numbers() -> None:
    args = ["--disable-radix-cache", "--max-running-requests", "4096"]
    with pytest.raises(NoRoomForKvCache) as error:
        estimate_pool(
            QWEN3_NEXT,
            gpu_memory_gib=80,
            tp=4,
            weights_gib=149,
            gpu_reserved_gib=1,
            engine_args=args,
        )
    message = str(error.value)
    assert "--max-running-requests 4096" in message
    assert "4,097 state slots of 19,316,736 bytes" in message
    assert "lower --max-running-requests below 1,660" in message


@pytest.mark.parametrize(
    "args",
    [
        ["--attn-dp-size", "4"],
        ["--attention-data-parallel-size=4"],
        ["--attn-dp-size", "1", "--enable-dp-attention", "--dp-size", "4"],
        ["--enable-dp-attention", "--dp-size", "4"],
    ],
)
def test_attention_dp_is_read_in_the_0_5_23_spelling_and_the_old_one(args: list[str]) -> None:
    """arg_groups/fields/parallel.py (0.5.22 on): --attn-dp-size N; --dp-size N with
    --enable-dp-attention resolves to it when --attn-dp-size is 1. Llama-8B at TP 8: attention
    TP 2, 4 KV heads a rank: 65,536 bytes a token."""
    config = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_hidden_layers": 32,
        "torch_dtype": "bfloat16",
    }
    assert bytes_per_token(config, tp=8, engine_args=args) == 65_536


@pytest.mark.parametrize(
    ("role", "cell"),
    [("prefill", 48_068), ("decode", 43_188), (None, 43_188)],
)
def test_dsa_fp8_layout_follows_the_local_roles_backend(role: str | None, cell: int) -> None:
    """calculate_mla_kv_cache_dim: in PD only the local role's backend decides. On SM100 with
    --dsa-prefill-backend flashmla_kv (decode keeps its default, trtllm) a prefill engine stores
    scaled rows (656 + 132) × 61 = 48,068 bytes and a decode engine raw rows (576 + 132) × 61 =
    43,188; without disaggregation either backend on trtllm makes the rows raw."""
    estimate = estimate_pool(
        DS32,
        gpu_memory_gib=140,
        tp=8,
        mem_fraction_static=0.88,
        weights_gib=642,
        gpu_reserved_gib=1,
        gpu_arch="sm100",
        engine_args=["--dsa-prefill-backend", "flashmla_kv"],
        role=role,
    )
    assert estimate.bytes_per_token == cell
