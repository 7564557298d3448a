"""Predict one engine's KV pool before any GPU is spent, with SGLang's own arithmetic.

The formulas follow SGLang 0.5.23 (research/sglang.md §2), reimplemented, not imported:

- bytes per token per GPU rank:
  - MHA/GQA: ``max(1, kv_heads // tp) × (head_dim + v_head_dim) × layers × dtype_bytes``,
    ``head_dim`` = config ``head_dim``, else ``hidden_size // num_attention_heads``;
    ``v_head_dim`` = ``head_dim``;
  - MLA (config has ``kv_lora_rank``): ``(kv_lora_rank + qk_rope_head_dim) × layers ×
    dtype_bytes``, not divided by TP (the latent is replicated on every rank);
- ``dtype_bytes``: kv dtype ``auto`` = the model dtype (2 bytes: SGLang serves float32
  checkpoints in 16 bits), or 1 when the checkpoint's ``quantization_config`` says
  ``kv_cache_quant_algo: FP8``; ``fp8_e4m3``/``fp8_e5m2`` = 1; ``bfloat16``/``float16`` = 2;
- usable GiB per rank = ``gpu_memory_gib × mem_fraction_static − weights_gib / tp``;
- tokens = ``floor(usable × 2^30 / bytes_per_token)``, rounded down to a multiple of the page size;
  ``max_total_tokens`` can only lower it.

This is an estimate: the CUDA context, NCCL buffers, activations and other tenants take memory
the formula does not see. The live probe is the authority.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GIB = 2**30

# SGLang's CONTEXT_LENGTH_KEYS (utils/hf_transformers/common.py), in its order.
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)
DEFAULT_CONTEXT_LENGTH = 2048

KV_DTYPE_BYTES = {
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "mxfp8": 1,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
}
MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 2, "float": 2, "half": 2}


@dataclass(frozen=True)
class Estimate:
    kv_pool_tokens: int
    bytes_per_token: int
    context_length: int
    usable_gib: float
    weights_gib: float
    attention: str  # "MHA" | "MLA"


class EstimateError(ValueError):
    """The estimate cannot be made; the message carries the numbers and the way out."""


class NoRoomForKvCache(EstimateError):
    """The weights leave no GPU memory for even one page of KV cache."""


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language-model part of a config (multimodal configs nest it as text_config)."""
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def _int(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not value.is_integer():
        return None
    return int(value)


def _require(config: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = _int(config, key)
        if value is not None and value > 0:
            return value
    raise EstimateError(
        f"config.json has no positive integer {' or '.join(keys)}; the KV pool cannot be "
        f"estimated without it (fix the config, or measure a live engine with kvgate verify)"
    )


def derive_context_length(config: Mapping[str, Any]) -> int:
    """The model's own context length, as SGLang derives it when --context-length is not given.

    First of CONTEXT_LENGTH_KEYS times ``rope_scaling.factor``; the factor counts as 1 when
    ``rope_scaling`` has ``original_max_position_embeddings`` or ``rope_type == "llama3"``
    (those configs already state the extended window). No key at all: 2,048.
    """
    text = _text_config(config)
    factor: float = 1
    rope_scaling = text.get("rope_scaling")
    if isinstance(rope_scaling, Mapping) and rope_scaling:
        raw = rope_scaling.get("factor", 1)
        factor = raw if isinstance(raw, int | float) and not isinstance(raw, bool) else 1
        if "original_max_position_embeddings" in rope_scaling:
            factor = 1
        if rope_scaling.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        value = text.get(key)
        if value is not None and isinstance(value, int | float) and not isinstance(value, bool):
            return int(factor * value)
    return DEFAULT_CONTEXT_LENGTH


def is_mla(config: Mapping[str, Any]) -> bool:
    text = _text_config(config)
    return text.get("kv_lora_rank") is not None and text.get("use_mla", True) is not False


def _head_dim(text: Mapping[str, Any]) -> int:
    head_dim = _int(text, "head_dim")
    if head_dim is not None and head_dim > 0:
        return head_dim
    return _require(text, "hidden_size") // _require(text, "num_attention_heads")


def _kv_heads(text: Mapping[str, Any]) -> int:
    # SGLang's ModelConfig.get_total_num_kv_heads attribute order; MQA configs have one.
    if text.get("multi_query"):
        return 1
    for key in ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num"):
        value = _int(text, key)
        if value is not None and value > 0:
            return value
    return _require(text, "num_attention_heads")


def _layers(text: Mapping[str, Any]) -> int:
    return _require(text, "num_hidden_layers", "num_layers", "n_layer")


def kv_dtype_bytes(config: Mapping[str, Any], kv_cache_dtype: str) -> int:
    """Bytes per KV element for --kv-cache-dtype (``auto`` = the model's own dtype)."""
    if kv_cache_dtype == "auto":
        quant = config.get("quantization_config")
        if isinstance(quant, Mapping):
            algo = quant.get("kv_cache_quant_algo")
            if isinstance(algo, str) and algo.upper() == "FP8":
                return 1
        model_dtype = _text_config(config).get("torch_dtype") or config.get("torch_dtype")
        model_dtype = model_dtype or config.get("dtype") or "float32"
        if model_dtype not in MODEL_DTYPE_BYTES:
            raise EstimateError(
                f"config.json torch_dtype {model_dtype!r} is not one the estimator knows "
                f"({', '.join(sorted(MODEL_DTYPE_BYTES))}); pass an explicit --kv-cache-dtype"
            )
        return MODEL_DTYPE_BYTES[str(model_dtype)]
    if kv_cache_dtype not in KV_DTYPE_BYTES:
        raise EstimateError(
            f"--kv-cache-dtype {kv_cache_dtype!r} is not supported by the estimator; use one of "
            f"auto, {', '.join(KV_DTYPE_BYTES)}"
        )
    return KV_DTYPE_BYTES[kv_cache_dtype]


def bytes_per_token(config: Mapping[str, Any], *, tp: int, kv_cache_dtype: str = "auto") -> int:
    """KV cache bytes one token takes on one GPU rank."""
    text = _text_config(config)
    dtype_bytes = kv_dtype_bytes(config, kv_cache_dtype)
    layers = _layers(text)
    if is_mla(config):
        kv_lora_rank = _require(text, "kv_lora_rank")
        rope_dim = _require(text, "qk_rope_head_dim")
        return (kv_lora_rank + rope_dim) * layers * dtype_bytes
    head_dim = _head_dim(text)
    v_head_dim = head_dim
    kv_heads_per_rank = max(1, _kv_heads(text) // tp)
    return kv_heads_per_rank * (head_dim + v_head_dim) * layers * dtype_bytes


def _weight_bytes_per_param(config: Mapping[str, Any]) -> int | None:
    if config.get("quantization_config") is not None:
        return None  # packed/scaled layouts differ per method: ask for --weights-gib
    dtype = _text_config(config).get("torch_dtype") or config.get("torch_dtype")
    dtype = dtype or config.get("dtype") or "float32"
    return MODEL_DTYPE_BYTES.get(str(dtype))


def estimate_weights_gib(config: Mapping[str, Any]) -> float | None:
    """Weights of one replica in GiB for Llama-like dense and Mixtral/Qwen-style MoE decoders.

    embeddings + lm_head (unless tied) + per layer (attention q/k/v/o + MLP or experts + norms).
    ``None`` when the architecture is not one this arithmetic covers (MLA, quantized
    checkpoints, hybrid or custom layers): the caller must ask for ``--weights-gib``.
    """
    text = _text_config(config)
    if is_mla(config) or config.get("text_config") is not None:
        return None
    per_param = _weight_bytes_per_param(config)
    if per_param is None:
        return None
    hidden = _int(text, "hidden_size")
    heads = _int(text, "num_attention_heads")
    vocab = _int(text, "vocab_size")
    layers = _int(text, "num_hidden_layers")
    intermediate = _int(text, "intermediate_size")
    if not all(v is not None and v > 0 for v in (hidden, heads, vocab, layers, intermediate)):
        return None
    assert hidden and heads and vocab and layers and intermediate  # for the type checker
    head_dim = _head_dim(text)
    kv_heads = _kv_heads(text)

    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    if text.get("attention_bias") or text.get("model_type") == "qwen2":
        attention += (heads + 2 * kv_heads) * head_dim
    experts = _int(text, "num_local_experts") or _int(text, "num_experts") or 0
    if experts > 0:
        expert_size = _int(text, "moe_intermediate_size") or intermediate
        mlp = experts * 3 * hidden * expert_size + hidden * experts  # experts + router
        shared = _int(text, "shared_expert_intermediate_size") or 0
        if shared:
            mlp += 3 * hidden * shared + hidden  # shared expert + its gate
    else:
        mlp = 3 * hidden * intermediate  # gate, up, down
    per_layer = attention + mlp + 2 * hidden  # two RMSNorms
    embeddings = vocab * hidden
    tied = text.get("tie_word_embeddings", config.get("tie_word_embeddings"))
    lm_head = 0 if tied else embeddings
    params = embeddings + lm_head + layers * per_layer + hidden
    return params * per_param / GIB


def estimate_pool(
    config: Mapping[str, Any],
    *,
    gpu_memory_gib: float,
    tp: int,
    mem_fraction_static: float = 0.85,
    kv_cache_dtype: str = "auto",
    page_size: int = 1,
    weights_gib: float | None = None,
    max_total_tokens: int | None = None,
) -> Estimate:
    """Predicted KV pool tokens of one engine (per GPU rank; every rank holds the same count)."""
    if gpu_memory_gib <= 0:
        raise EstimateError(f"GPU memory {gpu_memory_gib:g} GiB must be > 0")
    if tp < 1:
        raise EstimateError(f"tensor-parallel size {tp} must be >= 1")
    if not 0 < mem_fraction_static < 1:
        raise EstimateError(
            f"mem_fraction_static {mem_fraction_static:g} must be between 0 and 1 (exclusive)"
        )
    if page_size < 1:
        raise EstimateError(f"page size {page_size} must be >= 1")
    if weights_gib is None:
        weights_gib = estimate_weights_gib(config)
        if weights_gib is None:
            arch = config.get("architectures") or config.get("model_type") or "this model"
            raise EstimateError(
                f"cannot compute the weights of {arch} from config.json (MLA, quantized or "
                f"custom layers); pass the weight size of one replica with --weights-gib "
                f"(spec.model.weightsGiB)"
            )
    per_token = bytes_per_token(config, tp=tp, kv_cache_dtype=kv_cache_dtype)
    budget_gib = gpu_memory_gib * mem_fraction_static
    weights_per_rank = weights_gib / tp
    usable_gib = budget_gib - weights_per_rank
    tokens = math.floor(usable_gib * GIB / per_token) if usable_gib > 0 else 0
    tokens = tokens // page_size * page_size
    if tokens <= 0:
        raise NoRoomForKvCache(
            f"weights leave no room for the KV cache: {gpu_memory_gib:,.1f} GiB × "
            f"mem-fraction-static {mem_fraction_static:g} = {budget_gib:,.2f} GiB per GPU, "
            f"weights {weights_gib:,.2f} GiB / TP {tp} = {weights_per_rank:,.2f} GiB per GPU, "
            f"leaving {usable_gib:,.2f} GiB (one {page_size:,}-token page needs "
            f"{per_token * page_size:,} bytes); raise --tp, --mem-fraction-static or use "
            f"GPUs with more memory"
        )
    if max_total_tokens is not None and max_total_tokens < tokens:
        tokens = max_total_tokens  # SGLang: --max-total-tokens only lowers the pool
    return Estimate(
        kv_pool_tokens=tokens,
        bytes_per_token=per_token,
        context_length=derive_context_length(config),
        usable_gib=usable_gib,
        weights_gib=weights_gib,
        attention="MLA" if is_mla(config) else "MHA",
    )
