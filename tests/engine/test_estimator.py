"""The KV pool estimator: SGLang's own arithmetic, checked against worked examples.

Every expected number below is computed by hand in the test's docstring.
"""

from __future__ import annotations

from typing import Any

import pytest
from factories.model_configs import model_config
from kvgate_engine.estimator import (
    EstimateError,
    NoRoomForKvCache,
    bytes_per_token,
    derive_context_length,
    estimate_pool,
    estimate_weights_gib,
)

GIB = 2**30

LLAMA_31_8B = model_config("llama-3.1-8b")

LLAMA_3_70B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 80,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rope_scaling": None,
    "torch_dtype": "bfloat16",
}

QWEN25_7B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_hidden_layers": 28,
    "vocab_size": 152064,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}

QWEN3_4B = model_config("qwen3-4b")

DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "n_routed_experts": 256,
    "moe_intermediate_size": 2048,
    "intermediate_size": 18432,
    "vocab_size": 129280,
    "max_position_embeddings": 163840,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "quantization_config": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    "torch_dtype": "bfloat16",
}

MIXTRAL_8X7B: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "torch_dtype": "bfloat16",
}


def test_llama_31_8b_on_one_80_gib_gpu() -> None:
    """head_dim = 4096 / 32 = 128; 8 KV heads on TP 1.
    bytes/token = 8 × (128 + 128) × 32 layers × 2 (bf16) = 131,072.
    usable = 80 × 0.85 − 15 / 1 = 53 GiB; tokens = 53 × 2^30 / 131,072 = 53 × 8,192 = 434,176.
    context: 131,072 (llama3 rope_type: the factor 8 does not multiply)."""
    estimate = estimate_pool(LLAMA_31_8B, gpu_memory_gib=80, tp=1, weights_gib=15)
    assert estimate.bytes_per_token == 131_072
    assert estimate.kv_pool_tokens == 434_176
    assert estimate.context_length == 131_072
    assert estimate.usable_gib == pytest.approx(53.0)
    assert estimate.attention == "MHA"


def test_llama_31_8b_weights_from_its_config() -> None:
    """embeddings 128,256 × 4,096 = 525,336,576, lm_head the same (untied): 1,050,673,152.
    per layer: q,o 2 × 4,096 × 4,096 = 33,554,432; k,v 2 × 4,096 × 1,024 = 8,388,608;
    MLP 3 × 4,096 × 14,336 = 176,160,768; two norms 8,192 -> 218,112,000; × 32 = 6,979,584,000.
    + final norm 4,096 -> 8,030,261,248 params (the published 8.03 B) × 2 bytes
    = 16,060,522,496 bytes = 14.9575 GiB.
    pool on 80 GiB, mfs 0.85: (68 × 2^30 − 16,060,522,496) // 131,072
    = 56,953,921,536 // 131,072 = 434,523."""
    assert estimate_weights_gib(LLAMA_31_8B) == pytest.approx(8_030_261_248 * 2 / GIB)
    assert estimate_pool(LLAMA_31_8B, gpu_memory_gib=80, tp=1).kv_pool_tokens == 434_523


def test_mixtral_moe_weights_from_its_config() -> None:
    """per layer: attention 41,943,040; experts 8 × 3 × 4,096 × 14,336 = 1,409,286,144;
    router 4,096 × 8 = 32,768; norms 8,192 -> 1,451,270,144; × 32 = 46,440,644,608.
    embeddings + lm_head 2 × 32,000 × 4,096 = 262,144,000; final norm 4,096.
    total 46,702,792,704 params (the published 46.7 B) × 2 bytes."""
    assert estimate_weights_gib(MIXTRAL_8X7B) == pytest.approx(46_702_792_704 * 2 / GIB)


def test_llama_3_70b_at_tp_8() -> None:
    """8 KV heads // TP 8 = 1 per GPU; bytes/token = 1 × 256 × 80 × 2 = 40,960.
    usable = 80 × 0.9 − 140 / 8 = 72 − 17.5 = 54.5 GiB;
    tokens = 54.5 × 2^30 / 40,960 = 54.5 × 26,214.4 = 1,428,684.8 -> 1,428,684.
    context 8,192 (max_position_embeddings, no rope scaling)."""
    estimate = estimate_pool(
        LLAMA_3_70B, gpu_memory_gib=80, tp=8, mem_fraction_static=0.9, weights_gib=140
    )
    assert (estimate.bytes_per_token, estimate.kv_pool_tokens) == (40_960, 1_428_684)
    assert estimate.context_length == 8_192


def test_llama_3_70b_at_tp_16_replicates_kv_heads() -> None:
    """8 KV heads // TP 16 = 0 -> max(1, 0) = 1 per GPU: bytes/token stays 40,960.
    usable = 72 − 140 / 16 = 63.25 GiB; tokens = 63.25 × 26,214.4 = 1,658,060.8 -> 1,658,060."""
    estimate = estimate_pool(
        LLAMA_3_70B, gpu_memory_gib=80, tp=16, mem_fraction_static=0.9, weights_gib=140
    )
    assert (estimate.bytes_per_token, estimate.kv_pool_tokens) == (40_960, 1_658_060)


def test_gqa_model_with_tp_larger_than_its_kv_heads() -> None:
    """Qwen2.5-7B: 4 KV heads, head_dim 3,584 / 28 = 128.
    TP 2: 2 heads -> 2 × 256 × 28 × 2 = 28,672 bytes. TP 8: max(1, 4 // 8) = 1 -> 14,336 bytes
    (not 7,168: a GPU cannot hold half a head).
    SGLang runs it on TP 28 (28 query heads, each KV head on 7 ranks), not on TP 8 (28 heads do
    not split 8 ways). On 24 GiB, mfs 0.8, 16 GiB weights, TP 28: usable = 19.2 − 16 / 28 =
    18.63 GiB; tokens = 18.63 × 2^30 / 14,336 = 1,395,248.07 -> 1,395,248."""
    assert bytes_per_token(QWEN25_7B, tp=2) == 28_672
    assert bytes_per_token(QWEN25_7B, tp=4) == 14_336
    assert bytes_per_token(QWEN25_7B, tp=8) == 14_336
    estimate = estimate_pool(
        QWEN25_7B, gpu_memory_gib=24, tp=28, mem_fraction_static=0.8, weights_gib=16
    )
    assert estimate.kv_pool_tokens == 1_395_248
    with pytest.raises(EstimateError) as refused:
        estimate_pool(QWEN25_7B, gpu_memory_gib=24, tp=8, mem_fraction_static=0.8, weights_gib=16)
    assert refused.value.parameter == "tp"
    assert str(refused.value) == (
        "8 does not divide the model's 28 attention heads (num_attention_heads); SGLang asserts "
        "num_attention_heads % tp_size == 0 and the engine does not start; use one that divides "
        "28 and fits its 4 KV heads: 1, 2, 4 or 28"
    )


def test_deepseek_v3_mla_with_fp8_kv_cache() -> None:
    """MLA: (kv_lora_rank 512 + qk_rope_head_dim 64) × 61 layers × 1 byte (fp8) = 35,136 bytes,
    the same at every TP (the latent is replicated, not split).
    141 GiB GPUs, TP 8, mfs 0.88, 640 GiB weights: usable = 124.08 − 80 = 44.08 GiB;
    tokens = 44.08 × 2^30 / 35,136 = 1,347,066.8 -> 1,347,066.
    kv dtype auto = bf16 (the fp8 checkpoint has no kv_cache_quant_algo): 70,272 bytes,
    673,533.4 -> 673,533 tokens.
    context: 163,840 (yarn factor 40 ignored: rope_scaling has original_max_position_embeddings)."""
    assert bytes_per_token(DEEPSEEK_V3, tp=1, kv_cache_dtype="fp8_e4m3") == 35_136
    assert bytes_per_token(DEEPSEEK_V3, tp=8, kv_cache_dtype="fp8_e4m3") == 35_136
    fp8 = estimate_pool(
        DEEPSEEK_V3,
        gpu_memory_gib=141,
        tp=8,
        mem_fraction_static=0.88,
        kv_cache_dtype="fp8_e4m3",
        weights_gib=640,
    )
    assert (fp8.attention, fp8.kv_pool_tokens, fp8.context_length) == ("MLA", 1_347_066, 163_840)
    auto = estimate_pool(
        DEEPSEEK_V3, gpu_memory_gib=141, tp=8, mem_fraction_static=0.88, weights_gib=640
    )
    assert (auto.bytes_per_token, auto.kv_pool_tokens) == (70_272, 673_533)


FP8_FLOAT_SCHEME = {"type": "float", "num_bits": 8, "dynamic": False}


@pytest.mark.parametrize(
    ("quantization_config", "bytes_per_token_under_auto"),
    [
        ({"quant_method": "fp8", "kv_cache_quant_algo": "FP8"}, 65_536),
        (
            {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_scheme": FP8_FLOAT_SCHEME},
            65_536,
        ),
        ({"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_scheme": "FP8"}, 65_536),
        ({"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}, 65_536),
        (
            {
                "quant_method": "compressed-tensors",
                "kv_cache_scheme": FP8_FLOAT_SCHEME | {"strategy": "tensor", "symmetric": True},
            },
            65_536,
        ),
        # dynamic compressed-tensors schemes store no scales: SGLang ignores them
        (
            {
                "quant_method": "compressed-tensors",
                "kv_cache_scheme": FP8_FLOAT_SCHEME | {"strategy": "tensor", "dynamic": True},
            },
            131_072,
        ),
        (
            {
                "quant_method": "modelopt",
                "quant_algo": "FP8",
                "kv_cache_scheme": {"type": "float", "num_bits": 4},
            },
            131_072,
        ),
        # AWQ's config class has no KV dtype, so SGLang keeps auto = the model's dtype
        ({"quant_method": "awq", "kv_cache_quant_algo": "FP8"}, 131_072),
    ],
    ids=[
        "fp8 kv_cache_quant_algo",
        "ModelOpt kv_cache_scheme float 8",
        "ModelOpt FP4 kv_cache_scheme string",
        "ModelOpt nested quantization section",
        "compressed-tensors static fp8 per tensor",
        "compressed-tensors dynamic: model dtype",
        "ModelOpt 4-bit scheme: model dtype",
        "awq: model dtype",
    ],
)
def test_auto_kv_cache_dtype_follows_the_checkpoints_fp8_kv_scheme(
    quantization_config: dict[str, Any], bytes_per_token_under_auto: int
) -> None:
    """mem_cache/kv_cache_dtype.py: auto is fp8_e4m3 when the checkpoint's quantization config
    class reports kv_cache_quant_algo FP8 (131,072 bf16 bytes / 2 = 65,536)."""
    config = LLAMA_31_8B | {"quantization_config": quantization_config}
    assert bytes_per_token(config, tp=1) == bytes_per_token_under_auto
    estimate = estimate_pool(config, gpu_memory_gib=80, tp=1, weights_gib=16)
    expected = "fp8_e4m3" if bytes_per_token_under_auto == 65_536 else "bfloat16"
    assert estimate.kv_cache_dtype == expected


def test_deepseek_weights_need_the_flag() -> None:
    assert estimate_weights_gib(DEEPSEEK_V3) is None
    with pytest.raises(
        EstimateError, match=r"pass the weight size of one replica with --weights-gib"
    ):
        estimate_pool(DEEPSEEK_V3, gpu_memory_gib=141, tp=8)


def test_page_size_rounds_down() -> None:
    """usable = 68 − 15.001 = 52.999 GiB; 52.999 × 8,192 = 434,167.8 -> 434,167 at page size 1;
    page 16: 27,135 pages = 434,160; page 64: 6,783 pages = 434,112."""
    tokens = {
        page: estimate_pool(
            LLAMA_31_8B, gpu_memory_gib=80, tp=1, weights_gib=15.001, page_size=page
        ).kv_pool_tokens
        for page in (1, 16, 64)
    }
    assert tokens == {1: 434_167, 16: 434_160, 64: 434_112}


def test_config_with_head_dim_set() -> None:
    """Qwen3-4B: head_dim 128 is set (hidden 2,560 / 32 heads would give 80).
    bytes/token = 8 × (128 + 128) × 36 × 2 = 147,456 (80 would give 92,160).
    40 GiB, mfs 0.85, 8 GiB weights: usable = 34 − 8 = 26 GiB;
    tokens = 26 × 2^30 / 147,456 = 189,326.2 -> 189,326."""
    estimate = estimate_pool(QWEN3_4B, gpu_memory_gib=40, tp=1, weights_gib=8)
    assert (estimate.bytes_per_token, estimate.kv_pool_tokens) == (147_456, 189_326)


def test_max_total_tokens_only_lowers_the_pool() -> None:
    """434,176 (first example) capped at 100,000 -> 100,000; a 1,000,000 cap changes nothing."""
    low = estimate_pool(
        LLAMA_31_8B, gpu_memory_gib=80, tp=1, weights_gib=15, max_total_tokens=100_000
    )
    high = estimate_pool(
        LLAMA_31_8B, gpu_memory_gib=80, tp=1, weights_gib=15, max_total_tokens=1_000_000
    )
    assert (low.kv_pool_tokens, high.kv_pool_tokens) == (100_000, 434_176)


def test_weights_that_leave_no_room_say_so_with_numbers() -> None:
    """24 × 0.85 = 20.4 GiB per GPU < 30 GiB of weights on TP 1."""
    with pytest.raises(NoRoomForKvCache) as error:
        estimate_pool(LLAMA_31_8B, gpu_memory_gib=24, tp=1, weights_gib=30)
    assert str(error.value) == (
        "weights leave no room for the KV cache: 24.0 GiB × mem-fraction-static 0.85 = "
        "20.40 GiB per GPU, weights 30.00 GiB / TP 1 = 30.00 GiB per GPU, leaving -9.60 GiB "
        "(one 1-token page needs 131,072 bytes); raise --tp, --mem-fraction-static or use "
        "GPUs with more memory"
    )


@pytest.mark.parametrize(
    ("config", "context_length"),
    [
        ({"max_position_embeddings": 32768}, 32_768),
        (
            {"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0}},
            32_768,
        ),
        (
            {"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2}},
            8_192,
        ),
        (
            {
                "max_position_embeddings": 4096,
                "rope_parameters": {"rope_type": "linear", "factor": 2},
            },
            8_192,
        ),
        (
            {
                "max_position_embeddings": 4096,
                "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8}},
            },
            4_096,
        ),
        (
            {
                "max_position_embeddings": 32768,
                "rope_scaling": {
                    "type": "yarn",
                    "factor": 4.0,
                    "original_max_position_embeddings": 32768,
                },
            },
            32_768,
        ),
        (
            {
                "max_position_embeddings": 131072,
                "rope_scaling": {"rope_type": "llama3", "factor": 8},
            },
            131_072,
        ),
        (
            {"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.5}},
            10_240,
        ),
        ({"seq_length": 8192, "max_position_embeddings": 32768}, 8_192),
        ({"max_sequence_length": 4096, "seq_length": 8192}, 4_096),
        ({"model_max_length": 16384, "max_position_embeddings": 32768}, 16_384),
        ({"max_position_embeddings": 8192, "rope_scaling": None}, 8_192),
        ({"hidden_size": 4096}, 2_048),
        (
            {"text_config": {"max_position_embeddings": 262144}, "max_position_embeddings": 1},
            262_144,
        ),
    ],
    ids=[
        "plain",
        "yarn: transformers 5 adds original_max_position_embeddings, so no factor",
        "dynamic factor multiplies",
        "rope_parameters read as rope_scaling",
        "rope parameters per layer type: no top-level factor",
        "original_max_position_embeddings disables the factor",
        "llama3 disables the factor",
        "fractional factor",
        "seq_length before max_position_embeddings",
        "max_sequence_length first",
        "model_max_length before max_position_embeddings",
        "null rope_scaling",
        "no key: 2,048",
        "multimodal text_config",
    ],
)
def test_derive_context_length(config: dict[str, Any], context_length: int) -> None:
    assert derive_context_length(config) == context_length


@pytest.mark.parametrize(
    ("kwargs", "parameter", "message"),
    [
        ({"gpu_memory_gib": 0, "tp": 1}, "gpu_memory_gib", "above 0 and at most 16,384 (got 0)"),
        ({"gpu_memory_gib": float("inf"), "tp": 1}, "gpu_memory_gib", "(got inf)"),
        ({"gpu_memory_gib": 80, "tp": 0}, "tp", "between 1 and 512 GPUs per engine"),
        (
            {"gpu_memory_gib": 80, "tp": 1, "mem_fraction_static": 1.5},
            "mem_fraction_static",
            "must be between 0 and 1, exclusive (got 1.5)",
        ),
        ({"gpu_memory_gib": 80, "tp": 1, "page_size": 0}, "page_size", "1 or more (got 0)"),
        (
            {"gpu_memory_gib": 80, "tp": 1, "gpu_reserved_gib": 80},
            "gpu_reserved_gib",
            "below the GPU's 80 (got 80)",
        ),
        (
            {"gpu_memory_gib": 80, "tp": 1, "kv_cache_dtype": "nvfp4"},
            "kv_cache_dtype",
            "nvfp4 is a KV cache layout kvgate cannot size",
        ),
        (
            {"gpu_memory_gib": 80, "tp": 1, "kv_cache_dtype": "float16"},
            "kv_cache_dtype",
            "float16 is not accepted by any SGLang release kvgate supports",
        ),
        (
            {"gpu_memory_gib": 80, "tp": 1, "max_total_tokens": 0},
            "max_total_tokens",
            "must be 1 or more (got 0)",
        ),
    ],
)
def test_bad_inputs_are_refused_with_the_parameter_and_the_value(
    kwargs: dict[str, Any], parameter: str, message: str
) -> None:
    with pytest.raises(EstimateError) as refused:
        estimate_pool(LLAMA_31_8B, weights_gib=15, **kwargs)
    assert refused.value.parameter == parameter
    assert message in str(refused.value)


def test_config_without_layers_names_the_field() -> None:
    config = {k: v for k, v in LLAMA_31_8B.items() if k != "num_hidden_layers"}
    with pytest.raises(EstimateError, match="num_hidden_layers or num_layers or n_layer"):
        bytes_per_token(config, tp=1)
