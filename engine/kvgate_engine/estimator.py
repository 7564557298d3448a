"""Predict one engine's KV pool before any GPU is spent, with SGLang's own arithmetic.

The formulas follow SGLang 0.5.23, reimplemented, not imported; each
rule below names the SGLang file it comes from. :func:`layout_of` sorts a config into:

- MHA/GQA: ``max(1, kv_heads // attn_tp) × (head_dim + v_head_dim) × layers × dtype_bytes``
  (+ a scale byte per 32 elements for ``mxfp8``), ``attn_tp = tp // attention-DP size``;
- MLA: ``(kv_lora_rank + qk_rope_head_dim) × layers × dtype_bytes`` on every rank;
- DSA (DeepSeek-V3.2, GLM-5): the latent as SGLang stores it (bf16; fp8 raw or with scales and
  a bf16 rope part) plus a uint8 indexer K cache per layer, page size forced to 64;
- SWA (gpt-oss; Llama 4's chunked attention, its chunk as the window): full layers plus
  ``swa_full_tokens_ratio`` × the sliding layers per token; an SWA pool at or below one window
  plus one page is refused, as SGLang refuses to start;
- LINEAR (Qwen3-Next, Qwen3.5): the gated-delta-net state takes its share of memory first, the
  full-attention layers bound the pool.
- DSV4 (DeepSeek-V4): its own sizer, per SGLang release (:mod:`kvgate_engine.deepseek_v4`),
  which is why :func:`estimate_pool` takes the engine's release and environment.

kvgate's memory convention: usable GiB per rank = ``(gpu_memory_gib − gpu_reserved_gib) ×
mem_fraction_static − weights_gib / tp`` (SGLang applies the fraction to the free memory it
measures after the CUDA context and NCCL exist); tokens = ``floor(usable × 2^30 / bytes)``
rounded down to the page; ``max_total_tokens`` can only lower it. Layouts it does not model
raise :class:`EstimateError` instead of guessing. The live probe is the authority.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate_engine.deepseek_v4 import (
    DEEPSEEK_V4_ARCHITECTURE,
    DSV4_KV_CACHE_DTYPES,
    DSV4_PAGE,
    DeepseekV4Pools,
    DeepseekV4Request,
    DeepseekV4Unsized,
    checks_swa_floor,
    deepseek_v4_model,
    deepseek_v4_pools,
    deepseek_v4_unsized,
    is_deepseek_v4,
)
from kvgate_engine.flag_reader import last_uses
from kvgate_engine.sglang_choices import (
    KV_CACHE_DTYPE,
    NEWEST_CHECKED,
    OLDEST_CHECKED,
    SUPPORTED_RELEASES,
    accepted_values,
    refusing_releases,
)
from kvgate_engine.shape_limits import (
    MAX_ENGINE_NODES,
    MAX_GPU_MEMORY_GIB,
    MAX_GPUS_PER_NODE,
    MAX_TENSOR_PARALLEL,
)

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
# SGLang reads these keys with getattr on the transformers config object, so a key a published
# config.json leaves out takes its config class's default. The model types whose published
# configs rely on that (transformers as installed with SGLang 0.5.23):
# transformers/models/gemma3/configuration_gemma3.py, Gemma3TextConfig.max_position_embeddings.
CONFIG_CLASS_DEFAULTS: dict[str, dict[str, int]] = {
    "gemma3_text": {"max_position_embeddings": 131_072},
}

# The transformers each supported SGLang release pins (its wheel's Requires-Dist).
TRANSFORMERS_PINNED: dict[str, str] = {
    "0.5.19": "5.12.1",
    "0.5.20": "5.12.1",
    "0.5.21": "5.12.1",
    "0.5.22": "5.19.0",
    "0.5.23": "5.19.0",
}
# Rope types whose dict transformers 5 completes with original_max_position_embeddings.
ROPE_TYPES_WITH_ORIGINAL = frozenset({"llama3", "yarn", "longrope"})
# transformers version -> the model types whose config class turns a flat rope_scaling into one
# dict per layer type (convert_rope_params_to_dict in models/<type>/configuration_<type>.py).
_ROPE_PER_LAYER_TYPE: dict[str, frozenset[str]] = {
    "5.12.1": frozenset({"gemma3_text", "gemma3n_text"}),
    "5.19.0": frozenset({"gemma3_text", "gemma3n_text", "olmo3"}),
}


def rope_per_layer_type_models(release: str) -> frozenset[str]:
    """The model types whose rope parameters SGLang ``release`` sees per layer type (a release
    kvgate has not checked takes the newest checked release's transformers)."""
    pinned = TRANSFORMERS_PINNED.get(release, TRANSFORMERS_PINNED[NEWEST_CHECKED])
    return _ROPE_PER_LAYER_TYPE[pinned]


# --kv-cache-dtype values the estimator sizes: those every supported SGLang release accepts
# (kvgate_engine.sglang_choices) apart from the FP4 caches, whose layout kvgate does not model.
KV_DTYPE_BYTES = {
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "mxfp8": 1,
    "bfloat16": 2,
    "bf16": 2,
}
MODEL_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 2, "float": 2, "half": 2}


@dataclass(frozen=True)
class Estimate:
    kv_pool_tokens: int
    bytes_per_token: int
    context_length: int
    usable_gib: float
    weights_gib: float
    attention: str  # layout_of(): "MHA" | "MLA" | "DSA" | "SWA" | "LINEAR"; or "DSV4"
    page_size: int = 1  # the page the pool was rounded to (SGLang may force one)
    kv_cache_dtype: str = ""  # as SGLang resolves it ("auto" made concrete)
    gpu_reserved_gib: float = 0.0
    swa_pool_tokens: int | None = None  # sliding-window layers' pool (SWA hybrids)
    mamba_state_gib: float = 0.0  # linear-attention state taken before the KV pool
    draft_layers: int = 0  # speculative-decoding draft layers sharing the pool
    notes: tuple[str, ...] = ()  # what the number rests on that kvgate does not know to hold
    dsv4_pools: DeepseekV4Pools | None = None  # DeepSeek-V4: every pool SGLang sizes


class EstimateError(ValueError):
    """The estimate cannot be made; the message carries the numbers and the way out.

    ``parameter`` is the :func:`estimate_pool` input at fault (``config`` unless another is), so
    a caller can put the name its user knows in front of the message: ``--tp`` on the command
    line, ``spec.prefill.tensorParallel`` at admission."""

    def __init__(self, message: str, parameter: str = "config") -> None:
        super().__init__(message)
        self.parameter = parameter


class NoRoomForKvCache(EstimateError):
    """The weights (or, with ``parameter`` engine_args, a state the engine flags size) leave no
    GPU memory for even one page of KV cache."""

    def __init__(self, message: str, parameter: str = "weights_gib") -> None:
        super().__init__(message, parameter)


class SlidingWindowPoolTooSmall(NoRoomForKvCache):
    """The weights fit, but the sliding-window layers' pool cannot hold one request's window
    and a page, so SGLang refuses to start (pool_configurator.py validate_swa_pool_size)."""

    window_name = "sliding_window"

    def __init__(self, swa_pool_tokens: int, window: int, page: int, ratio: float) -> None:
        self.swa_pool_tokens = swa_pool_tokens
        self.window = window
        self.page = page
        self.ratio = ratio
        super().__init__(
            f"the sliding-window pool ({swa_pool_tokens:,} tokens, swa-full-tokens-ratio "
            f"{ratio:g} of the full pool) is at or below {self.window_name} {window:,} + page "
            f"{page:,} = {window + page:,} tokens, so SGLang refuses to start the engine; give "
            f"the KV pool more memory (GPU memory, mem-fraction-static or TP) or raise "
            f"--swa-full-tokens-ratio",
            "swa_pool",
        )


class ChunkedPoolTooSmall(SlidingWindowPoolTooSmall):
    """Chunked attention (Llama 4): the window is one attention chunk."""

    window_name = "one attention chunk (attention_chunk_size)"


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


def _rope_parameters(text: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The rope dict transformers 5 keeps as ``rope_parameters`` (its ``rope_scaling`` property
    returns the same): config.json's ``rope_scaling`` when set, else its ``rope_parameters``."""
    for key in ("rope_scaling", "rope_parameters"):
        value = text.get(key)
        if isinstance(value, Mapping) and value:
            return value
    return None


def _rope_factor(text: Mapping[str, Any], release: str) -> float:
    """The factor SGLang's get_context_length multiplies by, as transformers 5 leaves the dict.

    transformers' ``RotaryEmbeddingConfigMixin.standardize_rope_params`` (5.12.1 and 5.19.0)
    adds ``original_max_position_embeddings`` to a llama3, yarn or longrope dict, and SGLang
    counts such a factor as 1; model types in ROPE_PER_LAYER_TYPE store the dict per layer type,
    where SGLang finds no top-level ``factor``. A dict already keyed by layer type has none
    either."""
    rope = _rope_parameters(text)
    if rope is None:
        return 1
    if str(text.get("model_type") or "") in rope_per_layer_type_models(release):
        return 1
    raw = rope.get("factor", 1)
    factor: float = raw if isinstance(raw, int | float) and not isinstance(raw, bool) else 1
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if "original_max_position_embeddings" in rope or rope_type in ROPE_TYPES_WITH_ORIGINAL:
        return 1
    return factor


def derive_context_length(config: Mapping[str, Any], release: str = NEWEST_CHECKED) -> int:
    """The model's own context length, as SGLang ``release`` derives it when --context-length is
    not given (``get_context_length`` in utils/hf_transformers/common.py, on the config object
    of the transformers version that release pins: TRANSFORMERS_PINNED).

    First of CONTEXT_LENGTH_KEYS times the rope factor (:func:`_rope_factor`: 1 for llama3, yarn
    and longrope, for an ``original_max_position_embeddings``, and for rope parameters stored per
    layer type, as Gemma 3's are). A key the config leaves out takes its transformers config
    class's default where kvgate knows it (CONFIG_CLASS_DEFAULTS); no key at all: 2,048.
    Remote-code config classes that skip transformers' rope standardisation are not modelled.
    """
    text = _text_config(config)
    factor = _rope_factor(text, release)
    defaults = CONFIG_CLASS_DEFAULTS.get(str(text.get("model_type") or ""), {})
    for key in CONTEXT_LENGTH_KEYS:
        value = text.get(key, defaults.get(key))
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
    keys = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
    for key in (*keys, "num_attention_groups"):  # Step3's name for its KV heads
        value = _int(text, key)
        if value is not None and value > 0:
            return value
    return _require(text, "num_attention_heads")


def _layers(text: Mapping[str, Any]) -> int:
    return _require(text, "num_hidden_layers", "num_layers", "n_layer")


# SGLang's attention layers assert on the TP size at start-up (models/llama.py LlamaAttention,
# qwen2.py, qwen3.py, gpt_oss.py, deepseek_v2.py): the query heads split evenly over the attention
# TP ranks; the KV heads split evenly too, or, when there are fewer than ranks, each is replicated
# on an equal number of ranks.
@dataclass(frozen=True)
class TensorParallelMismatch:
    """A TP size the model's attention heads do not allow."""

    tp: int
    heads: int
    kv_heads: int | None = None  # set when the KV heads are what does not fit
    kv_heads_key: str = "num_key_value_heads"

    def short(self) -> str:
        """``TP 3 does not divide num_attention_heads 32``."""
        if self.kv_heads is None:
            return f"TP {self.tp} does not divide num_attention_heads {self.heads}"
        return f"TP {self.tp} and {self.kv_heads_key} {self.kv_heads} do not divide one another"

    def explain(self, where: str = "") -> str:
        """What SGLang asserts, with the numbers; ``where`` goes before the config key."""
        if self.kv_heads is None:
            return (
                f"{self.tp} does not divide the model's {self.heads} attention heads "
                f"({where}num_attention_heads); SGLang asserts num_attention_heads % tp_size == 0 "
                "and the engine does not start"
            )
        return (
            f"{self.tp} and the model's {self.kv_heads} KV heads ({where}{self.kv_heads_key}) "
            "do not divide one another; SGLang splits the KV heads over the TP ranks, or "
            "replicates them when TP is larger, and asserts that one divides the other, so the "
            "engine does not start"
        )


def _configured_kv_heads(text: Mapping[str, Any]) -> tuple[int, str] | None:
    """The KV head count the config states, and its key (None: as many as query heads)."""
    if text.get("multi_query"):
        return 1, "multi_query"
    keys = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
    for key in (*keys, "num_attention_groups"):
        value = _int(text, key)
        if value is not None and value > 0:
            return value, key
    return None


def tensor_parallel_mismatch(
    config: Mapping[str, Any], tp: int, *, attention_dp: int = 1
) -> TensorParallelMismatch | None:
    """Why SGLang's attention layers refuse ``tp`` for this model, or None (also when the config
    does not say its heads). With DP attention the heads split over ``tp / attention_dp``."""
    attn_tp = tp // attention_dp if attention_dp >= 1 and tp % attention_dp == 0 else tp
    if attn_tp <= 1:
        return None  # one rank holds every head
    text = _text_config(config)
    heads = _int(text, "num_attention_heads")
    if heads is None or heads <= 0:
        return None
    if heads % attn_tp:
        return TensorParallelMismatch(tp, heads)
    kv = None if is_mla(config) else _configured_kv_heads(text)
    if kv is not None:
        kv_heads, key = kv
        if (kv_heads % attn_tp) if kv_heads >= attn_tp else (attn_tp % kv_heads):
            return TensorParallelMismatch(tp, heads, kv_heads, key)
    return None


def tensor_parallel_sizes(
    config: Mapping[str, Any], limit: int, *, multiple_of: int = 1
) -> list[int]:
    """The TP sizes up to ``limit`` (multiples of ``multiple_of``) the model's heads allow."""
    return [
        tp
        for tp in range(multiple_of, limit + 1, multiple_of)
        if tensor_parallel_mismatch(config, tp) is None
    ]


def fitting_tensor_parallel(config: Mapping[str, Any], limit: int, *, multiple_of: int = 1) -> str:
    """The way out of a mismatch: ``one that divides 32: 1, 2, 4, 8, 16 or 32``."""
    sizes = tensor_parallel_sizes(config, limit, multiple_of=multiple_of)
    heads = _int(_text_config(config), "num_attention_heads") or 0
    if not sizes:
        return f"no size up to {limit:,} fits the model's {heads} attention heads"
    divisors = [tp for tp in range(multiple_of, limit + 1, multiple_of) if heads % tp == 0]
    kv = _configured_kv_heads(_text_config(config))
    what = f"one that divides {heads}"
    if sizes != divisors and kv is not None:
        what += f" and fits its {kv[0]} KV heads"
    return f"{what}: {listed(sizes)}"


def listed(values: Sequence[int]) -> str:
    """``1, 2, 4 or 8``."""
    shown = [f"{value:,}" for value in values]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"


def _is_fp8(value: object) -> bool:
    return isinstance(value, str) and value.strip().upper() == "FP8"


def _float8_scheme(scheme: object) -> bool:
    return (
        isinstance(scheme, Mapping)
        and scheme.get("type") == "float"
        and scheme.get("num_bits") == 8
    )


def _static_fp8_tensor_scheme(scheme: object) -> bool:
    """CompressedTensorsKVCacheMethod.is_supported_scheme: static symmetric per-tensor FP8."""
    return (
        isinstance(scheme, Mapping)
        and _float8_scheme(scheme)
        and scheme.get("strategy") == "tensor"
        and bool(scheme.get("symmetric", True))
        and not scheme.get("dynamic", False)
    )


def _modelopt_fp8_kv(quant: Mapping[str, Any]) -> bool:
    """ModelOpt (layers/quantization/modelopt_quant.py from_config, and ModelConfig's
    _parse_modelopt for MXFP8): a nested ``quantization`` section's ``kv_cache_quant_algo``;
    flat, a ``kv_cache_scheme`` dict of 8-bit floats, a ``kv_cache_scheme`` string FP8/FLOAT8
    (FP4 checkpoints only), else ``kv_cache_quant_algo``. MIXED_PRECISION without NVFP4 layers
    loads as w4afp8, which declares no KV dtype."""
    section = quant.get("quantization")
    if quant.get("quant_algo") is None:
        return isinstance(section, Mapping) and _is_fp8(section.get("kv_cache_quant_algo"))
    algo = str(quant.get("quant_algo")).upper()
    scheme = quant.get("kv_cache_scheme")
    if algo == "MIXED_PRECISION":
        layers = quant.get("quantized_layers") or {}
        if not isinstance(layers, Mapping) or not any(
            isinstance(layer, Mapping)
            and str(layer.get("quant_algo", "")).upper() in ("NVFP4", "W4A16_NVFP4")
            for layer in layers.values()
        ):
            return False
    if isinstance(scheme, Mapping):
        return _float8_scheme(scheme)
    if isinstance(scheme, str) and "FP4" in algo:
        return scheme.strip().upper() in ("FP8", "FLOAT8")
    return _is_fp8(quant.get("kv_cache_quant_algo"))


# quant_method -> whether its SGLang config class turns --kv-cache-dtype auto into fp8_e4m3
# (mem_cache/kv_cache_dtype.py configure_kv_cache_dtype reads quant_config.kv_cache_quant_algo;
# the classes registered in layers/quantization/__init__.py that set it). Other methods' classes
# have no kv_cache_quant_algo, so auto stays the model's dtype whatever the config says.
_FP8_KV_RULES: dict[str, Callable[[Mapping[str, Any]], bool]] = {
    "fp8": lambda quant: _is_fp8(quant.get("kv_cache_quant_algo")),
    "mxfp8": lambda quant: _is_fp8(quant.get("kv_cache_quant_algo")),
    "modelopt": _modelopt_fp8_kv,
    "modelopt_fp8": _modelopt_fp8_kv,
    "modelopt_fp4": _modelopt_fp8_kv,
    "modelopt_mixed": _modelopt_fp8_kv,
    "compressed-tensors": lambda quant: _static_fp8_tensor_scheme(quant.get("kv_cache_scheme")),
    "minimax_m3_nvfp4": lambda quant: _is_fp8(quant.get("kv_cache_quant_algo", "FP8")),
}


def checkpoint_fp8_kv_cache(config: Mapping[str, Any]) -> str | None:
    """The ``quantization_config`` method whose FP8 KV scheme makes SGLang (0.5.19 to 0.5.23)
    size ``--kv-cache-dtype auto`` as fp8_e4m3, or None when auto stays the model's dtype.
    A ModelOpt ``hf_quant_config.json`` beside config.json is not seen here."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return None
    # ModelConfig._parse_quant_hf_config reads a config without quant_method as ModelOpt's.
    method = str(quant.get("quant_method") or "modelopt").lower()
    rule = _FP8_KV_RULES.get(method)
    return method if rule is not None and rule(quant) else None


def kv_dtype_bytes(config: Mapping[str, Any], kv_cache_dtype: str) -> int:
    """Bytes per KV element for --kv-cache-dtype (``auto`` = the model's own dtype)."""
    if kv_cache_dtype == "auto":
        if checkpoint_fp8_kv_cache(config) is not None:
            return 1
        model_dtype = _text_config(config).get("torch_dtype") or config.get("torch_dtype")
        model_dtype = model_dtype or config.get("dtype") or "float32"
        if model_dtype not in MODEL_DTYPE_BYTES:
            raise EstimateError(
                f"config.json torch_dtype {model_dtype!r} is not one the estimator knows "
                f"({', '.join(sorted(MODEL_DTYPE_BYTES))}); pass an explicit --kv-cache-dtype"
            )
        return MODEL_DTYPE_BYTES[str(model_dtype)]
    problem = kv_cache_dtype_problem(kv_cache_dtype)
    if problem is not None:
        raise EstimateError(problem, "kv_cache_dtype")
    return KV_DTYPE_BYTES[kv_cache_dtype]


def sized_kv_cache_dtypes() -> tuple[str, ...]:
    """The --kv-cache-dtype values the estimator takes, in SGLang's order: ``auto`` and every
    value of KV_DTYPE_BYTES that the newest checked release lists."""
    listed = accepted_values(KV_CACHE_DTYPE, NEWEST_CHECKED) or ()
    return tuple(value for value in listed if value == "auto" or value in KV_DTYPE_BYTES)


def kv_cache_dtype_problem(kv_cache_dtype: str) -> str | None:
    """Why the estimator will not size this --kv-cache-dtype, or None: a value every supported
    SGLang release refuses (the engine would exit 2 at start-up), or one kvgate cannot size."""
    if kv_cache_dtype == "auto" or kv_cache_dtype in KV_DTYPE_BYTES:
        return None
    shown = repr(kv_cache_dtype) if not kv_cache_dtype.isprintable() else kv_cache_dtype or "''"
    choices = f"use one of {', '.join(sized_kv_cache_dtypes())}"
    if len(refusing_releases(KV_CACHE_DTYPE, kv_cache_dtype)) == len(SUPPORTED_RELEASES):
        return (
            f"{shown} is not accepted by any SGLang release kvgate supports ({OLDEST_CHECKED} "
            f"to {NEWEST_CHECKED}; the engine exits 2 at start-up); {choices}"
        )
    return f"{shown} is a KV cache layout kvgate cannot size; {choices}"


# --- What SGLang 0.5.23 does per model family (each rule cites the file it comes from) ---

# srt/configs/model_config.py is_deepseek_dsa: these architectures with an ``index_topk`` key
# run DeepSeek Sparse Attention (MLA latent + a per-layer indexer K cache).
DSA_ARCHITECTURES = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "MistralLarge3ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "Glm5NextForConditionalGeneration",
        "LongcatFlashForCausalLM",
        "Dots3NoteForCausalLM",
        "HYV4ForCausalLM",
    }
)
# mem_cache/memory_pool.py DSATokenToKVPool: fp8 latent scales per 128 elements (4-byte
# float each), the rope part kept in bf16, the indexer K cache in uint8 with the same scales.
DSA_QUANT_BLOCK = 128
# configs/model_config.py SWA_SINK_ARCHS: hybrid sliding-window models whose layer_types
# list says which layers are sliding; SGLang gives those a smaller SWA pool.
SWA_SINK_ARCHITECTURES = frozenset(
    {"GptOssForCausalLM", "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM"}
)
# configs/model_config.py is_deepseek_v4. DeepseekV4ForCausalLM (model_type deepseek_v4) is sized
# by kvgate_engine.deepseek_v4, per release; layout_of and bytes_per_token, which have no memory
# or release to size it with, refuse it. The NextN and DSpark architectures are draft models,
# not engines of their own.
DEEPSEEK_V4_ARCHITECTURES = frozenset(
    {"DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark"}
)
DEEPSEEK_V4_REFUSAL = (
    "cannot size {arch} from the config alone: SGLang sizes the DeepSeek-V4 family with its own "
    "DSV4PoolConfigurator (full, sliding-window and c4/c128 compressed pools beside "
    "per-request compress state, page 256), whose arithmetic differs per release and needs "
    "the engine's memory; estimate the engine's pool (kvgate estimate, or admission with "
    "spec.model.config and gpuMemoryGiB set) or verify a live engine"
)
DEEPSEEK_V4_DRAFT_REFUSAL = (
    "cannot estimate {arch}: it is a DeepSeek-V4 draft model (speculative decoding), which "
    "SGLang sizes inside the target engine's pool; serve DeepseekV4ForCausalLM"
)
# Other hybrid-SWA architectures SGLang sizes with pool splits kvgate does not model
# (configs/model_config.py is_hybrid_swa_model): refused, never guessed.
UNMODELLED_SWA_ARCHITECTURES = frozenset(
    {
        "BeamForCausalLM",
        "Step3p5ForCausalLM",
        "Step3p7ForConditionalGeneration",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "LagunaForCausalLM",
        "MellumForCausalLM",
        "MiMoV2FlashForCausalLM",
        "InklingForConditionalGeneration",
        "IQuestQ1ForCausalLM",
    }
)
# configs/model_config.py is_local_attention_model: chunked local attention, which SGLang sizes
# as a hybrid SWA model (is_hybrid_swa_model) with attention_chunk_size as the window
# (load_model_utils.py resolve_sliding_window_size) and every fourth layer full
# (get_hybrid_layer_ids).
CHUNKED_ATTENTION_ARCHITECTURES = frozenset({"Llama4ForConditionalGeneration"})
# configs/model_config.py ModelConfig mm_disabled_models (the same list in 0.5.19 to 0.5.23):
# SGLang serves these text-only unless --enable-multimodal, so is_multimodal is False and no
# VLM cache is reserved (mem_cache/kv_cache_configurator.py mm_runtime_reservation_gb).
MULTIMODAL_OFF_BY_DEFAULT_ARCHITECTURES = frozenset(
    {
        "Gemma3ForConditionalGeneration",
        "Llama4ForConditionalGeneration",
        "Step3VLForConditionalGeneration",
        "InklingForConditionalGeneration",
    }
)
CHUNKED_FULL_LAYER_EVERY = 4
# The page sizes trtllm_mha keeps; any other becomes 64 (arg_groups/overrides.py
# _mla_backend_page_constraints). SGLang picks trtllm_mha for Llama 4 on SM100
# (arg_groups/model_overrides/llama4.py).
TRTLLM_MHA_PAGE_SIZES = frozenset({16, 32, 64, 128})
TRTLLM_MHA_DEFAULT_PAGE = 64
# arg_groups/model_overrides/gemma2_gemma3.py sets disable_hybrid_swa_memory: SGLang 0.5.23
# stores every Gemma 2/3 layer in the full pool, sliding or not.
FULL_POOL_SWA_ARCHITECTURES = frozenset(
    {
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Gemma3ForConditionalGeneration",
        "Gemma3nForCausalLM",
        "Gemma3nForConditionalGeneration",
    }
)
# configs/hybrid_arch.py hybrid_gdn_config: gated-delta-net (linear attention) hybrids.
LINEAR_HYBRID_ARCHITECTURES = frozenset(
    {
        "Qwen3NextForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
    }
)
SWA_FULL_TOKENS_RATIO = 0.8  # arg_groups/fields/schedule.py swa_full_tokens_ratio fallback
MAMBA_FULL_MEMORY_RATIO = 0.9  # arg_groups/fields/schedule.py mamba_full_memory_ratio fallback
# environ.py SGLANG_VLM_CACHE_SIZE_MB: multimodal models reserve it out of the KV budget
# (mem_cache/kv_cache_configurator.py mm_runtime_reservation_gb).
VLM_CACHE_GIB = 100 / 1024
# The CUDA context, cuBLAS workspaces and NCCL buffers exist before SGLang measures the free
# memory its --mem-fraction-static applies to (distributed/bootstrap.py
# measure_pre_model_load_memory), so a GPU's nameplate memory overstates the budget. ~0.5 GiB
# of context on Hopper plus NCCL's buffers under TP: 1 GiB is the documented default. It is
# kvgate's own assumption, not SGLang's (SGLang subtracts no fixed reserve: it sizes from the free
# memory it measures, the minimum across ranks) and not a measurement; the operator reports the
# drift of live pools from the estimate, from which a cluster measures its GPUs' reserve.
DEFAULT_GPU_RESERVED_GIB = 1.0
# Speculative algorithms whose draft layers add KV to the target's pool
# (model_executor/pool_configurator.py DefaultPoolConfigurator: is_eagle / is_standalone).
EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN", "MTP", "FROZEN_KV_MTP", "STANDALONE"})
# Flags that change pool sizing in ways kvgate does not model: with any of them set, refuse.
UNMODELLED_FLAGS = (
    "--enable-unified-memory",
    "--enable-hisparse",
    "--enable-kv-cache-sharding",
    "--dcp-size",
    "--max-mamba-cache-size",
)
# Every option string of the flags SizingFlags reads -> the flag it stands for (SGLang's aliases
# included: tests/conformance/test_engine_args_spellings.py fails on one left out), and those of
# them that take no value.
SIZING_FLAGS: Mapping[str, str] = {
    "--speculative-algorithm": "--speculative-algorithm",
    "--speculative-draft-model-path": "--speculative-draft-model-path",
    "--speculative-draft-model": "--speculative-draft-model-path",
    "--swa-full-tokens-ratio": "--swa-full-tokens-ratio",
    "--mamba-full-memory-ratio": "--mamba-full-memory-ratio",
    "--disable-hybrid-swa-memory": "--disable-hybrid-swa-memory",
    "--enable-multimodal": "--enable-multimodal",
    "--disable-radix-cache": "--disable-radix-cache",
    "--max-running-requests": "--max-running-requests",
    "--enable-dp-attention": "--enable-dp-attention",
    "--dp-size": "--dp-size",
    "--data-parallel-size": "--dp-size",
    "--attn-dp-size": "--attn-dp-size",
    "--attention-data-parallel-size": "--attn-dp-size",
    "--dsa-prefill-backend": "--dsa-prefill-backend",
    "--dsa-decode-backend": "--dsa-decode-backend",
    **{flag: flag for flag in UNMODELLED_FLAGS},
    "--decode-context-parallel-size": "--dcp-size",
}
SIZING_SWITCHES = frozenset(
    {
        "--disable-hybrid-swa-memory",
        "--enable-multimodal",
        "--disable-radix-cache",
        "--enable-dp-attention",
        "--enable-unified-memory",
        "--enable-hisparse",
        "--enable-kv-cache-sharding",
    }
)


@dataclass(frozen=True)
class SizingFlags:
    """The engine flags (beyond kvgate's own) that change how SGLang sizes the pool."""

    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    swa_full_tokens_ratio: float = SWA_FULL_TOKENS_RATIO
    mamba_full_memory_ratio: float = MAMBA_FULL_MEMORY_RATIO
    disable_hybrid_swa_memory: bool = False
    enable_multimodal: bool = False
    disable_radix_cache: bool = False
    max_running_requests_set: bool = False
    max_running_requests: int | None = None  # its value, when it is a positive integer
    attention_dp: int = 1
    dsa_prefill_backend: str | None = None
    dsa_decode_backend: str | None = None
    unmodelled: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: Sequence[str]) -> SizingFlags:
        """Read the sizing flags out of extra ``sglang.launch_server`` arguments, the way
        SGLang's parser reads them (:mod:`kvgate_engine.flag_reader`: abbreviations, ``=``,
        aliases; the last value wins)."""
        values: dict[str, str | None] = {
            SIZING_FLAGS[flag]: use.value
            for flag, use in last_uses(args, SIZING_FLAGS, SIZING_SWITCHES).items()
        }
        unmodelled = tuple(flag for flag in UNMODELLED_FLAGS if flag in values)
        algorithm = values.get("--speculative-algorithm")
        return cls(
            speculative_algorithm=algorithm.upper() if algorithm else None,
            speculative_draft_model_path=values.get("--speculative-draft-model-path"),
            swa_full_tokens_ratio=_flag_float(
                values, "--swa-full-tokens-ratio", SWA_FULL_TOKENS_RATIO
            ),
            mamba_full_memory_ratio=_flag_float(
                values, "--mamba-full-memory-ratio", MAMBA_FULL_MEMORY_RATIO
            ),
            disable_hybrid_swa_memory="--disable-hybrid-swa-memory" in values,
            enable_multimodal="--enable-multimodal" in values,
            disable_radix_cache="--disable-radix-cache" in values,
            max_running_requests_set="--max-running-requests" in values,
            max_running_requests=_positive_int(values.get("--max-running-requests")),
            attention_dp=_attention_dp(values),
            dsa_prefill_backend=values.get("--dsa-prefill-backend"),
            dsa_decode_backend=values.get("--dsa-decode-backend"),
            unmodelled=unmodelled,
        )


def _positive_int(raw: str | None) -> int | None:
    return int(raw) if raw is not None and raw.isdigit() and int(raw) > 0 else None


def _attention_dp(values: Mapping[str, str | None]) -> int:
    """The attention data-parallel size (0: not a number): ``--attn-dp-size`` (SGLang 0.5.22
    on, arg_groups/fields/parallel.py), else the older spelling ``--dp-size`` with
    ``--enable-dp-attention``, which 0.5.22 on resolve the same way when ``--attn-dp-size`` is
    1 (parallel_hook.py _handle_deprecated_dp_attention)."""
    if "--attn-dp-size" in values:
        raw = values["--attn-dp-size"]
        size = int(raw) if raw and raw.isdigit() else 0
        if size != 1:
            return size
    if "--enable-dp-attention" in values:
        raw_dp = values.get("--dp-size")
        return int(raw_dp) if raw_dp and raw_dp.isdigit() else 0
    return 1


def _flag_float(values: Mapping[str, str | None], flag: str, default: float) -> float:
    raw = values.get(flag)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise EstimateError(f"engine flag {flag} {raw!r} is not a number", "engine_args") from None


def _architecture(config: Mapping[str, Any]) -> str:
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        return archs[0]
    return ""


def _gpu_major(gpu_arch: str | None) -> int | None:
    """``sm90`` -> 9, ``sm100`` -> 10, ``sm120`` -> 12; None when unknown."""
    if gpu_arch is None:
        return None
    match = re.fullmatch(r"sm_?(\d{2,3})", gpu_arch.strip().lower())
    if match is None:
        raise EstimateError(
            f"GPU architecture {gpu_arch!r} is not an SM version like sm90 (Hopper) or sm100 "
            f"(Blackwell); leave it unset for the conservative estimate",
            "gpu_arch",
        )
    return int(match.group(1)) // 10


def layout_of(config: Mapping[str, Any]) -> str:
    """How SGLang 0.5.23 lays out this model's KV cache: MHA, MLA, DSA, SWA or LINEAR.

    Raises EstimateError for layouts kvgate does not model, so nobody gets a guess.
    """
    text = _text_config(config)
    arch = _architecture(config)
    unmodelled = (
        f"cannot estimate {arch or 'this model'}: SGLang sizes its KV cache with a layout "
        f"kvgate does not model"
    )
    if arch in DEEPSEEK_V4_ARCHITECTURES - {DEEPSEEK_V4_ARCHITECTURE}:
        raise EstimateError(DEEPSEEK_V4_DRAFT_REFUSAL.format(arch=arch))
    if arch in DEEPSEEK_V4_ARCHITECTURES:
        raise EstimateError(DEEPSEEK_V4_REFUSAL.format(arch=arch))
    if arch in UNMODELLED_SWA_ARCHITECTURES or text.get("is_hybrid_swa") is True:
        raise EstimateError(f"{unmodelled} (sliding-window pool split); verify a live engine")
    if text.get("compress_ratios") is not None:
        raise EstimateError(f"{unmodelled} (compressed attention); verify a live engine")
    if arch in LINEAR_HYBRID_ARCHITECTURES:
        return "LINEAR"
    if any(key in text for key in ("linear_num_value_heads", "ssm_state_size", "mamba_d_state")):
        raise EstimateError(f"{unmodelled} (linear-attention or mamba state); verify a live engine")
    if text.get("index_topk") is not None:
        if arch in DSA_ARCHITECTURES and text.get("kv_lora_rank") is not None:
            return "DSA"
        raise EstimateError(f"{unmodelled} (sparse-attention indexer); verify a live engine")
    if arch in SWA_SINK_ARCHITECTURES or arch in CHUNKED_ATTENTION_ARCHITECTURES:
        return "SWA"
    layer_types = text.get("layer_types")
    if (
        isinstance(layer_types, list)
        and any(kind != "full_attention" for kind in layer_types)
        and arch not in FULL_POOL_SWA_ARCHITECTURES
    ):
        kinds = sorted({str(kind) for kind in layer_types})
        raise EstimateError(f"{unmodelled} (layer types {', '.join(kinds)}); verify a live engine")
    return "MLA" if is_mla(config) else "MHA"


# Architectures whose KV cache SGLang 0.5.23 lays out as the MHA/GQA rule above says (models/
# llama.py, also Phi3 and InternLM3; mistral.py, mixtral.py, qwen2.py, qwen2_moe.py, qwen3.py,
# qwen3_moe.py, granite.py, granitemoe.py, olmo2.py, glm4.py, internlm2.py, exaone.py, step3's
# text model), or as MLA (models/deepseek_v2.py). Any other MHA- or MLA-looking config is sized
# by the same rule, with a note that says so.
STANDARD_ATTENTION_ARCHITECTURES = frozenset(
    {
        "LlamaForCausalLM",
        "Phi3ForCausalLM",
        "InternLM3ForCausalLM",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "GraniteForCausalLM",
        "GraniteMoeForCausalLM",
        "Olmo2ForCausalLM",
        "Glm4ForCausalLM",
        "InternLM2ForCausalLM",
        "ExaoneForCausalLM",
        "Step3TextForCausalLM",
        *FULL_POOL_SWA_ARCHITECTURES,
    }
)
MLA_ARCHITECTURES = frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"})


def forced_page_size(config: Mapping[str, Any]) -> int:
    """The page SGLang forces on CUDA for the config's layout, 1 for none: DSA 64 × index_kpool
    (arg_groups/model_overrides/deepseek_v2.py); the linear hybrids 64 on SM100 with trtllm_mha
    (qwen3_5.py), and Llama 4 64 on SM100 with trtllm_mha unless the page is one it keeps
    (llama4.py), taken whenever the GPU is not known, as the pool estimate does; DeepSeek-V4
    256 (model_overrides/deepseek_v4.py)."""
    if is_deepseek_v4(config):
        return DSV4_PAGE
    layout = layout_of(config)
    if layout == "DSA":
        return 64 * (_int(_text_config(config), "index_kpool") or 1)
    if _architecture(config) in CHUNKED_ATTENTION_ARCHITECTURES:
        return TRTLLM_MHA_DEFAULT_PAGE  # trtllm_mha on SM100 (llama4.py)
    return 64 if layout == "LINEAR" else 1


def unmodelled_architecture_note(config: Mapping[str, Any], layout: str) -> str | None:
    """What an estimate of ``layout`` rests on when the config's architecture is not one kvgate
    knows to be laid out that way, or None. Only MHA and MLA are ever assumed: DSA, SWA and
    LINEAR are chosen by architecture name (layout_of)."""
    arch = _architecture(config)
    known = STANDARD_ATTENTION_ARCHITECTURES if layout == "MHA" else MLA_ARCHITECTURES
    if layout not in ("MHA", "MLA") or arch in known:
        return None
    name = arch or "config.json names no architecture, so this model"
    if layout == "MLA":
        rule = "multi-head latent attention (MLA: (kv_lora_rank + qk_rope_head_dim) × layers)"
    else:
        rule = "standard attention (MHA/GQA: num_key_value_heads × head_dim × num_hidden_layers)"
    verb = "is not an architecture kvgate models" if arch else "is not one kvgate knows"
    return f"{name} {verb}; its KV pool is estimated as {rule}, which may be wrong for it"


@dataclass(frozen=True)
class _Cell:
    """Bytes one pool token costs on one GPU rank, and what SGLang forces around it."""

    layout: str
    bytes: float  # per token of max_total_num_tokens (SWA: full + ratio × SWA share)
    kv_cache_dtype: str  # as resolved
    forced_page: int = 1  # page sizes are rounded down to a multiple of this as well
    mamba_bytes_per_request: int = 0
    swa_ratio: float = 0.0
    sliding_window: int | None = None
    chunked: bool = False  # the window is an attention chunk (Llama 4)
    # Non-empty: the attention backend keeps these pages and turns any other into the default.
    kept_pages: frozenset[int] = frozenset()
    draft_layers: int = 0

    def page(self, requested: int) -> int:
        """The page SGLang runs with for a requested ``--page-size``."""
        if self.kept_pages and requested not in self.kept_pages:
            return TRTLLM_MHA_DEFAULT_PAGE
        # Rounding to a multiple of both the requested and the forced page is never above
        # either.
        return math.lcm(requested, self.forced_page)


def _kv_bytes(config: Mapping[str, Any], kv_cache_dtype: str) -> tuple[int, str]:
    """Element size and resolved name of the KV dtype (mem_cache/kv_cache_dtype.py)."""
    size = kv_dtype_bytes(config, kv_cache_dtype)
    if kv_cache_dtype != "auto":
        return size, kv_cache_dtype
    return size, "fp8_e4m3" if size == 1 else "bfloat16"


def _dsa_indexer_layers(text: Mapping[str, Any], layers: int) -> int:
    """Layers with their own indexer K cache (configs/model_config.py dsa_layer_skips_topk)."""

    def skips(layer: int) -> bool:
        indexer_types = text.get("indexer_types")
        if isinstance(indexer_types, list):
            return 0 <= layer < len(indexer_types) and indexer_types[layer] == "shared"
        cli_factor = _int(text, "cli_factor") or 1
        if cli_factor > 1:
            return layer % cli_factor != 0
        pattern = text.get("index_topk_pattern")
        if isinstance(pattern, list | str):
            return layer < len(pattern) and pattern[layer] == "S"
        freq = _int(text, "index_topk_freq") or 1
        offset = _int(text, "index_skip_topk_offset")
        if offset is not None and offset > 0:
            return max(layer - offset + 1, 0) % freq != 0
        return max(layer - 1, 0) % freq != 0

    return sum(not skips(layer) for layer in range(layers))


def _dsa_backend(arch: str, gpu_major: int | None, chosen: str | None) -> str | None:
    """The fp8 DSA backend of one phase: the flag's value, else SGLang's CUDA default
    (overrides.py _dsa_split_backend_resolution): trtllm on SM >= 10, flashmla_kv below,
    flashinfer_sparse_mla for GLM-5 on SM120; None when the GPU is not known."""
    if chosen is not None:
        return chosen
    if gpu_major is None:
        return None
    if arch == "GlmMoeDsaForCausalLM" and gpu_major == 12:
        return "flashinfer_sparse_mla"
    return "trtllm" if gpu_major >= 10 else "flashmla_kv"


def _dsa_raw_fp8_rows(
    arch: str, gpu_major: int | None, flags: SizingFlags, role: str | None
) -> bool:
    """Whether the fp8 pool stores raw rows (kv_cache_configurator.py calculate_mla_kv_cache_dim):
    the local role's backend is trtllm (a decode engine's --dsa-decode-backend, a prefill
    engine's --dsa-prefill-backend, either without disaggregation), or both are TileLang."""
    prefill = _dsa_backend(arch, gpu_major, flags.dsa_prefill_backend)
    decode = _dsa_backend(arch, gpu_major, flags.dsa_decode_backend)
    local = {"prefill": (prefill,), "decode": (decode,)}.get(role or "", (prefill, decode))
    return "trtllm" in local or prefill == decode == "tilelang"


def _dsa_cell(
    config: Mapping[str, Any],
    kv_cache_dtype: str,
    gpu_major: int | None,
    draft_layers: int,
    flags: SizingFlags,
    role: str | None,
) -> _Cell:
    """DSA (DeepSeek-V3.2, GLM-5): mem_cache/kv_cache_configurator.py calculate_mla_kv_cache_dim
    and model_executor/pool_configurator.py _compute_dsa_indexer_cell_size.

    ``auto`` is fp8 on SM >= 10 and bf16 below (arg_groups/overrides.py
    _dsa_kv_cache_dtype_default); unknown GPU: bf16, the larger cell. fp8 rows are raw on the
    Blackwell trtllm backend and scaled (latent + 4-byte scale per 128 + bf16 rope) on Hopper's
    flashmla_kv (overrides.py _dsa_split_backend_resolution); unknown GPU: scaled, the larger.
    """
    text = _text_config(config)
    arch = _architecture(config)
    layers = _layers(text)
    rank = _require(text, "kv_lora_rank")
    rope = _require(text, "qk_rope_head_dim")
    sinks = bool(text.get("learnable_sink"))
    if kv_cache_dtype == "auto":
        dtype = (
            "fp8_e4m3" if gpu_major is not None and gpu_major >= 10 and not sinks else "bfloat16"
        )
    elif kv_cache_dtype in ("bf16", "bfloat16"):
        dtype = "bfloat16"
    elif kv_cache_dtype == "fp8_e4m3" and not sinks:
        dtype = "fp8_e4m3"
    else:
        raise EstimateError(
            f"SGLang serves {arch} (DeepSeek sparse attention) only with kvCacheDtype auto, "
            f"bfloat16{'' if sinks else ' or fp8_e4m3'}, not {kv_cache_dtype!r}",
            "kv_cache_dtype",
        )
    if dtype == "bfloat16":
        per_layer = (rank + rope) * 2
    elif _dsa_raw_fp8_rows(arch, gpu_major, flags, role):
        per_layer = rank + rope  # trtllm (or TileLang on both): raw fp8 rows
    else:
        if rank % DSA_QUANT_BLOCK:
            raise EstimateError(f"kv_lora_rank {rank} is not a multiple of {DSA_QUANT_BLOCK}")
        per_layer = rank + rank // DSA_QUANT_BLOCK * 4 + rope * 2
    index_head_dim = _require(text, "index_head_dim")
    index_kpool = _int(text, "index_kpool") or 1
    indexer_per_layer = -(-(index_head_dim + index_head_dim // DSA_QUANT_BLOCK * 4) // index_kpool)
    target_kv = per_layer * layers
    cell = target_kv + indexer_per_layer * _dsa_indexer_layers(text, layers)
    if draft_layers:
        # pool_configurator.py: the draft's KV scaled from the target's, its indexer on every
        # draft layer (allocate_all_layers).
        cell += int(target_kv * draft_layers / layers) + indexer_per_layer * draft_layers
    return _Cell(
        layout="DSA",
        bytes=cell,
        kv_cache_dtype=dtype,
        # arg_groups/model_overrides/deepseek_v2.py: page_size = 64 × index_kpool on CUDA.
        forced_page=64 * index_kpool,
        draft_layers=draft_layers,
    )


@dataclass(frozen=True)
class _KvRow:
    """One layer's K and V for one token on one rank (MHA/GQA: KV heads split over the
    attention TP ranks, at least one head per rank)."""

    elements: int  # heads × (head_dim + v_head_dim)
    dtype_bytes: int
    mxfp8: bool

    @property
    def bytes(self) -> int:
        return self.elements * self.dtype_bytes

    @property
    def scale_bytes(self) -> float:
        return self.elements / 32 if self.mxfp8 else 0  # one scale byte per 32 elements

    @property
    def bytes_with_scales(self) -> int:
        return self.bytes + int(self.scale_bytes)

    def all_layers(self, layers: int) -> int:
        """Every layer in the full pool (its scales rounded once over all layers)."""
        return self.bytes * layers + (int(self.elements * layers) // 32 if self.mxfp8 else 0)


def _attention_tp(tp: int, flags: SizingFlags) -> int:
    """The ranks one attention group spans: tp over the attention data-parallel size."""
    if flags.attention_dp < 1 or tp % flags.attention_dp:
        raise EstimateError(
            f"attention data-parallel size {flags.attention_dp} must divide the tensor-parallel "
            f"size {tp} (--attn-dp-size, or --dp-size with --enable-dp-attention)",
            "engine_args",
        )
    return tp // flags.attention_dp


def _mla_cell(
    text: Mapping[str, Any], layers: int, dtype_bytes: int, dtype: str, draft_layers: int
) -> _Cell:
    """MLA: the latent and the rope key per layer, the same on every rank."""
    cell: float = (
        (_require(text, "kv_lora_rank") + _require(text, "qk_rope_head_dim")) * layers * dtype_bytes
    )
    if draft_layers:
        cell += int(cell * draft_layers / layers)
    return _Cell(layout="MLA", bytes=cell, kv_cache_dtype=dtype, draft_layers=draft_layers)


def _chunked_attention_pages(gpu_major: int | None) -> frozenset[int]:
    """The pages Llama 4's attention backend keeps: trtllm_mha's on SM100, or when the GPU is
    not known (the smaller pool); no constraint on other GPUs (fa3, triton)."""
    return TRTLLM_MHA_PAGE_SIZES if gpu_major is None or gpu_major == 10 else frozenset()


def _swa_layer_split(config: Mapping[str, Any], layers: int) -> tuple[int, int | None, bool]:
    """Sliding layers, the window, and whether it is an attention chunk
    (configs/model_config.py get_hybrid_layer_ids; load_model_utils.py
    resolve_sliding_window_size)."""
    text = _text_config(config)
    if _architecture(config) in CHUNKED_ATTENTION_ARCHITECTURES:
        # Every fourth layer is full whatever no_rope_layers says; the window is the config's
        # sliding window if it has one (SGLang's _get_sliding_window_size), else the chunk.
        swa_layers = sum((layer + 1) % CHUNKED_FULL_LAYER_EVERY != 0 for layer in range(layers))
        for key in ("sliding_window_size", "sliding_window", "window_size"):
            if text.get(key) is not None:
                return swa_layers, _int(text, key), False
        return swa_layers, _require(text, "attention_chunk_size"), True
    layer_types = text.get("layer_types")
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        raise EstimateError(
            f"config.json layer_types must list all {layers} layers to size the sliding-window "
            f"pool of {_architecture(config)}"
        )
    swa_layers = sum(kind == "sliding_attention" for kind in layer_types)
    return swa_layers, _int(text, "sliding_window"), False


def _swa_cell(
    config: Mapping[str, Any],
    layers: int,
    row: _KvRow,
    dtype: str,
    draft_layers: int,
    flags: SizingFlags,
    gpu_major: int | None,
) -> _Cell:
    """SWA (gpt-oss, Llama 4's chunked attention): the full layers plus the sliding layers'
    share of the pool (pool_configurator.py HybridSWAPoolConfigurator);
    --disable-hybrid-swa-memory keeps every layer in the full pool."""
    chunked = _architecture(config) in CHUNKED_ATTENTION_ARCHITECTURES
    pages = _chunked_attention_pages(gpu_major) if chunked else frozenset()
    if flags.disable_hybrid_swa_memory:
        return _Cell(
            layout="MHA",
            bytes=row.all_layers(layers),
            kv_cache_dtype=dtype,
            kept_pages=pages,
            draft_layers=draft_layers,
        )
    swa_layers, window, is_chunk = _swa_layer_split(config, layers)
    if flags.disable_radix_cache and flags.max_running_requests_set:
        raise EstimateError(
            "--disable-radix-cache with --max-running-requests sizes the SWA pool from the "
            "request cap (pool_configurator.py SWARequestCapPoolConfigurator), which kvgate "
            "does not model; verify a live engine",
            "engine_args",
        )
    full_layers = layers - swa_layers
    full_token = row.bytes_with_scales
    ratio = flags.swa_full_tokens_ratio
    if not 0 < ratio <= 1:
        raise EstimateError(f"--swa-full-tokens-ratio {ratio:g} must be in (0, 1]", "engine_args")
    if full_layers == 0:
        raise EstimateError("an all-sliding-window model is not modelled; verify a live engine")
    # pool_configurator.py HybridSWAPoolConfigurator._recompute_cell_size
    cell = full_token * (full_layers + draft_layers) + ratio * full_token * swa_layers
    return _Cell(
        layout="SWA",
        bytes=cell,
        kv_cache_dtype=dtype,
        swa_ratio=ratio,
        sliding_window=window,
        chunked=is_chunk,
        kept_pages=pages,
        draft_layers=draft_layers,
    )


def _linear_cell(
    text: Mapping[str, Any],
    layers: int,
    row: _KvRow,
    dtype: str,
    attn_tp: int,
    gpu_major: int | None,
    draft_layers: int,
) -> _Cell:
    """LINEAR: gated-delta-net hybrids (configs/qwen3_next.py). The full-attention layers make
    the pool's cell; the linear layers' state is taken per request before it."""
    if draft_layers:
        raise EstimateError(
            "speculative decoding on a linear-attention hybrid reserves intermediate mamba "
            "state kvgate does not model; verify a live engine",
            "engine_args",
        )
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == layers:
        full_layers = sum(kind == "full_attention" for kind in layer_types)
    else:
        interval = _require(text, "full_attention_interval")
        full_layers = sum((layer + 1) % interval == 0 for layer in range(layers))
    linear_layers = layers - full_layers
    return _Cell(
        layout="LINEAR",
        bytes=row.bytes_with_scales * full_layers,
        kv_cache_dtype=dtype,
        mamba_bytes_per_request=_gdn_state_bytes(text, attn_tp) * linear_layers,
        # arg_groups/model_overrides/qwen3_5.py forces page 64 on SM100 with trtllm_mha.
        forced_page=64 if gpu_major is None or gpu_major == 10 else 1,
    )


def _cell(
    config: Mapping[str, Any],
    *,
    tp: int,
    kv_cache_dtype: str,
    gpu_major: int | None,
    draft_layers: int,
    flags: SizingFlags,
    role: str | None = None,
) -> _Cell:
    """The pool token's cell for the config's layout (layout_of); ``role`` is the engine's
    disaggregation mode ("prefill", "decode"; None: neither), which picks DSA's fp8 layout."""
    text = _text_config(config)
    layout = layout_of(config)
    attn_tp = _attention_tp(tp, flags)
    if layout == "DSA":
        return _dsa_cell(config, kv_cache_dtype, gpu_major, draft_layers, flags, role)
    dtype_bytes, dtype = _kv_bytes(config, kv_cache_dtype)
    layers = _layers(text)
    if layout == "MLA":
        return _mla_cell(text, layers, dtype_bytes, dtype, draft_layers)
    head_dim = _head_dim(text)
    v_head_dim = _int(text, "v_head_dim") or head_dim  # configs/model_config.py
    heads = max(1, _kv_heads(text) // attn_tp)
    row = _KvRow(heads * (head_dim + v_head_dim), dtype_bytes, kv_cache_dtype == "mxfp8")
    if layout == "MHA":
        cell = row.all_layers(layers)
        if draft_layers:
            cell += int(cell * draft_layers / layers)
        return _Cell(layout="MHA", bytes=cell, kv_cache_dtype=dtype, draft_layers=draft_layers)
    if layout == "SWA":
        return _swa_cell(config, layers, row, dtype, draft_layers, flags, gpu_major)
    return _linear_cell(text, layers, row, dtype, attn_tp, gpu_major, draft_layers)


def _gdn_state_bytes(text: Mapping[str, Any], attn_tp: int) -> int:
    """One linear layer's state per request on one rank (configs/qwen3_next.py
    mamba2_cache_params, configs/mamba_utils.py Mamba2StateShape.create): conv state
    (conv_dim / tp) × (kernel − 1) in bf16 + temporal (v_heads / tp) × v_dim × k_dim in the
    SSM dtype (config mamba_ssm_dtype, default float32)."""
    k_heads = _require(text, "linear_num_key_heads")
    v_heads = _require(text, "linear_num_value_heads")
    k_dim = _require(text, "linear_key_head_dim")
    v_dim = _require(text, "linear_value_head_dim")
    kernel = _require(text, "linear_conv_kernel_dim")
    if k_heads % attn_tp or v_heads % attn_tp:
        raise EstimateError(
            f"linear-attention heads ({k_heads} key, {v_heads} value) do not divide by the "
            f"attention TP size {attn_tp}; SGLang pads them in a way kvgate does not model",
            "tp",
        )
    conv_dim = v_heads * v_dim + 2 * k_heads * k_dim
    ssm_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(
        str(text.get("mamba_ssm_dtype") or "float32"), 4
    )
    conv = conv_dim // attn_tp * (kernel - 1) * 2
    temporal = v_heads // attn_tp * v_dim * k_dim * ssm_bytes
    return conv + temporal


def speculative_draft_layers(config: Mapping[str, Any], flags: SizingFlags) -> int:
    """Draft layers whose KV shares the target's pool (model_runner_components/
    spec_aux_hidden_state.py): a path-less NEXTN/MTP/EAGLE draft is the checkpoint's own
    ``num_nextn_predict_layers``. A separate draft model's config is not in the spec: refuse."""
    algorithm = flags.speculative_algorithm
    if algorithm is None or algorithm == "NGRAM":
        return 0
    if algorithm not in EAGLE_FAMILY:
        raise EstimateError(
            f"--speculative-algorithm {algorithm} sizes a draft pool kvgate does not model; "
            f"verify a live engine",
            "engine_args",
        )
    if flags.speculative_draft_model_path is not None:
        raise EstimateError(
            f"--speculative-draft-model-path {flags.speculative_draft_model_path}: the draft "
            f"model's KV shares the pool and its config is not in the spec; verify a live engine",
            "engine_args",
        )
    layers = _int(_text_config(config), "num_nextn_predict_layers")
    if layers is None or layers <= 0:
        raise EstimateError(
            f"--speculative-algorithm {algorithm} without a draft model needs the config's "
            f"num_nextn_predict_layers, which this config.json does not have",
            "engine_args",
        )
    return layers


def bytes_per_token(
    config: Mapping[str, Any],
    *,
    tp: int,
    kv_cache_dtype: str = "auto",
    gpu_arch: str | None = None,
    draft_layers: int = 0,
    engine_args: Sequence[str] = (),
) -> int:
    """KV cache bytes one pool token takes on one GPU rank (rounded up; for sliding-window
    hybrids this includes the SWA layers' share, for linear hybrids only the full layers)."""
    cell = _cell(
        config,
        tp=tp,
        kv_cache_dtype=kv_cache_dtype,
        gpu_major=_gpu_major(gpu_arch),
        draft_layers=draft_layers,
        flags=SizingFlags.from_args(engine_args),
    )
    return math.ceil(cell.bytes)


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


def _shown(value: float) -> str:
    """A number as a message shows it: 1,000,000 / 0.85 / 1e+25 / inf / nan."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}" if abs(value) < 10**30 else f"a {len(str(abs(value))):,}-digit number"
    return f"{value:g}"


def check_sizes(
    *,
    gpu_memory_gib: float,
    tp: int,
    mem_fraction_static: float = 0.85,
    page_size: int = 1,
    gpu_reserved_gib: float = 0.0,
    weights_gib: float | None = None,
    max_total_tokens: int | None = None,
) -> None:
    """Refuse sizes no engine can have: EstimateError naming the parameter, the value and a good
    one. The API model's bounds (kvgate.api.models) come from the same limits, so admission,
    ``kvgate estimate`` and ``kvgate plan`` refuse the same values."""
    if not (math.isfinite(gpu_memory_gib) and 0 < gpu_memory_gib <= MAX_GPU_MEMORY_GIB):
        raise EstimateError(
            f"must be a finite number of GiB above 0 and at most {MAX_GPU_MEMORY_GIB:,} (got "
            f"{_shown(gpu_memory_gib)}); give the memory of one GPU, e.g. 80",
            "gpu_memory_gib",
        )
    if not (math.isfinite(gpu_reserved_gib) and 0 <= gpu_reserved_gib < gpu_memory_gib):
        raise EstimateError(
            f"must be a finite number of GiB, 0 or more and below the GPU's "
            f"{_shown(gpu_memory_gib)} (got {_shown(gpu_reserved_gib)}); e.g. "
            f"{DEFAULT_GPU_RESERVED_GIB:g}, the default",
            "gpu_reserved_gib",
        )
    if not 1 <= tp <= MAX_TENSOR_PARALLEL:
        raise EstimateError(
            f"must be between 1 and {MAX_TENSOR_PARALLEL} GPUs per engine ({MAX_GPUS_PER_NODE} "
            f"per node on at most {MAX_ENGINE_NODES} nodes) (got {_shown(tp)}); e.g. 1, 2, 4 "
            "or 8",
            "tp",
        )
    if not 0 < mem_fraction_static < 1:
        raise EstimateError(
            f"must be between 0 and 1, exclusive (got {_shown(mem_fraction_static)}); e.g. 0.85",
            "mem_fraction_static",
        )
    if page_size < 1:
        raise EstimateError(f"must be 1 or more (got {_shown(page_size)}); e.g. 1", "page_size")
    if weights_gib is not None and not (math.isfinite(weights_gib) and weights_gib > 0):
        raise EstimateError(
            f"must be a finite number of GiB above 0 (got {_shown(weights_gib)}); give the "
            "weight size of one replica, e.g. 15",
            "weights_gib",
        )
    if max_total_tokens is not None and max_total_tokens < 1:
        raise EstimateError(
            f"must be 1 or more (got {_shown(max_total_tokens)}); leave it out to keep "
            "SGLang's pool",
            "max_total_tokens",
        )


def _modelled_flags(engine_args: Sequence[str]) -> SizingFlags:
    """The sizing flags, refusing those that change the pool in ways kvgate does not model."""
    flags = SizingFlags.from_args(engine_args)
    if flags.unmodelled:
        raise EstimateError(
            f"engine flags {', '.join(flags.unmodelled)} change how SGLang sizes the KV pool in "
            f"ways kvgate does not model; verify a live engine",
            "engine_args",
        )
    return flags


def _replica_weights_gib(config: Mapping[str, Any], weights_gib: float | None) -> float:
    """The weights of one replica: as given, else computed from the config, else refused."""
    if weights_gib is not None:
        return weights_gib
    estimated = estimate_weights_gib(config)
    if estimated is None:
        arch = config.get("architectures") or config.get("model_type") or "this model"
        raise EstimateError(
            f"cannot compute the weights of {arch} from config.json (MLA, quantized or "
            f"custom layers); pass the weight size of one replica with --weights-gib "
            f"(spec.model.weightsGiB)",
            "weights_gib",
        )
    return estimated


@dataclass(frozen=True)
class _Memory:
    """kvgate's memory convention for one GPU rank (see estimate_pool)."""

    gpu_memory_gib: float
    gpu_reserved_gib: float
    mem_fraction_static: float
    weights_gib: float  # of one replica
    tp: int

    @property
    def budget_gib(self) -> float:
        """The free memory before the weights load, times mem_fraction_static."""
        return (self.gpu_memory_gib - self.gpu_reserved_gib) * self.mem_fraction_static

    @property
    def weights_per_rank(self) -> float:
        return self.weights_gib / self.tp

    def no_room(self, usable_gib: float, page: int, page_bytes: int) -> NoRoomForKvCache:
        """Not one page fits: the arithmetic that says so, and the way out."""
        memory = (
            f"({self.gpu_memory_gib:,.1f} GiB − reserved {self.gpu_reserved_gib:g} GiB)"
            if self.gpu_reserved_gib
            else f"{self.gpu_memory_gib:,.1f} GiB"
        )
        return NoRoomForKvCache(
            f"weights leave no room for the KV cache: {memory} × mem-fraction-static "
            f"{self.mem_fraction_static:g} = {self.budget_gib:,.2f} GiB per GPU, weights "
            f"{self.weights_gib:,.2f} GiB / TP {self.tp} = {self.weights_per_rank:,.2f} GiB per "
            f"GPU, leaving {usable_gib:,.2f} GiB (one {page:,}-token page needs "
            f"{page_bytes:,} bytes); raise --tp, --mem-fraction-static or use GPUs with more "
            f"memory"
        )


def _mamba_state_gib(usable_gib: float, per_request: int, flags: SizingFlags) -> float:
    """The linear-attention state SGLang takes before the KV pool (kv_cache_configurator.py
    _handle_max_mamba_cache): with --disable-radix-cache and --max-running-requests N, N over
    the attention-DP size state slots; otherwise ratio/(1+ratio) of the budget goes to state
    slots. Each has a padding slot (+1); the rest is the KV pool's."""
    if flags.disable_radix_cache and flags.max_running_requests is not None:
        slots = max(1, flags.max_running_requests // max(flags.attention_dp, 1))
        state_gib = (slots + 1) * per_request / GIB
        if state_gib >= usable_gib:
            dp = max(flags.attention_dp, 1)
            most = max(1, int(usable_gib * GIB // per_request) - 2) * dp
            raise NoRoomForKvCache(
                f"no room for the KV cache beside the linear-attention state: "
                f"--max-running-requests {flags.max_running_requests} with "
                f"--disable-radix-cache keeps {slots + 1:,} state slots of {per_request:,} "
                f"bytes = {state_gib:,.2f} GiB per GPU, of {usable_gib:,.2f} GiB usable; lower "
                f"--max-running-requests below {most:,} (the state alone), "
                f"raise --tp or --mem-fraction-static, or use GPUs with more memory",
                "engine_args",
            )
        return state_gib
    ratio = flags.mamba_full_memory_ratio
    mamba_budget = usable_gib * ratio / (1 + ratio) * GIB
    slots = int((mamba_budget - per_request) // per_request)
    if slots <= 0:
        raise NoRoomForKvCache(
            f"no room for the linear-attention state: {usable_gib:,.2f} GiB usable per GPU "
            f"gives {slots} state slots of {per_request:,} bytes; raise --tp, "
            f"--mem-fraction-static or use GPUs with more memory"
        )
    return (slots + 1) * per_request / GIB


def _pool_tokens(
    usable_gib: float, cell: _Cell, page: int, max_total_tokens: int | None, memory: _Memory
) -> int:
    """The usable memory in cells, rounded down to the page; at least one page, and
    --max-total-tokens only lowers it."""
    available_bytes = int(usable_gib * GIB) if usable_gib > 0 else 0
    tokens = int(available_bytes // cell.bytes) // page * page
    if tokens <= 0:
        raise memory.no_room(usable_gib, page, math.ceil(cell.bytes * page))
    if max_total_tokens is not None and max_total_tokens < tokens:
        # SGLang: --max-total-tokens only lowers the pool, then the configurator rounds it
        # down to the page size (pool_configurator.py calculate_pool_sizes_from_max_tokens).
        tokens = max_total_tokens // page * page
    return tokens


def _swa_pool_tokens(tokens: int, cell: _Cell, page: int) -> int:
    """The sliding-window layers' pool, which must hold one request's window and a page
    (pool_configurator.py _solve_pool_sizes and validate_swa_pool_size)."""
    swa_tokens = int(tokens * cell.swa_ratio) // page * page
    window = cell.sliding_window
    if window is not None and window + page >= swa_tokens:
        too_small = ChunkedPoolTooSmall if cell.chunked else SlidingWindowPoolTooSmall
        raise too_small(swa_tokens, window, page, cell.swa_ratio)
    return swa_tokens


def _multimodal(config: Mapping[str, Any], flags: SizingFlags) -> bool:
    """Whether SGLang runs the model's vision tower, which reserves the VLM cache: a multimodal
    config, unless its architecture is one SGLang keeps text-only without --enable-multimodal
    (configs/model_config.py mm_disabled_models)."""
    if "vision_config" not in config:
        return False
    return (
        flags.enable_multimodal
        or _architecture(config) not in MULTIMODAL_OFF_BY_DEFAULT_ARCHITECTURES
    )


@dataclass(frozen=True)
class _DeepseekV4Inputs:
    """The engine inputs DeepSeek-V4's sizing reads besides memory, release and env."""

    kv_cache_dtype: str
    max_total_tokens: int | None
    engine_args: Sequence[str]
    flags: SizingFlags
    role: str | None


def _deepseek_v4_estimate(
    config: Mapping[str, Any],
    memory: _Memory,
    inputs: _DeepseekV4Inputs,
    release: str | None,
    engine_env: Mapping[str, str],
) -> Estimate:
    """DeepSeek-V4 (kvgate_engine.deepseek_v4): the release's own sizer, or a refusal that says
    which input keeps it from being exact."""
    flags = inputs.flags
    refusal = deepseek_v4_unsized(release, inputs.kv_cache_dtype, inputs.engine_args, engine_env)
    if refusal is None and flags.speculative_algorithm is not None:
        refusal = DeepseekV4Unsized(
            f"--speculative-algorithm {flags.speculative_algorithm}: SGLang resizes the "
            "DeepSeek-V4 rings and pools for the draft in ways kvgate does not model; verify a "
            "live engine",
            "engine_args",
        )
    if refusal is None and flags.max_running_requests_set and flags.max_running_requests is None:
        refusal = DeepseekV4Unsized(
            "--max-running-requests must be a positive integer", "engine_args"
        )
    try:
        if refusal is not None:
            raise refusal
        assert release is not None  # deepseek_v4_unsized refuses an unknown release
        usable_gib = memory.budget_gib - memory.weights_per_rank
        request = DeepseekV4Request(
            release=release,
            available_bytes=int(usable_gib * GIB) if usable_gib > 0 else 0,
            swa_ratio=_dsv4_swa_ratio(inputs.engine_args),
            max_running_requests=flags.max_running_requests,
            attention_dp=_attention_tp_groups(flags),
            role=inputs.role,
            engine_args=inputs.engine_args,
            max_total_tokens=inputs.max_total_tokens,
        )
        pools = deepseek_v4_pools(deepseek_v4_model(_text_config(config)), request)
    except DeepseekV4Unsized as unsized:
        raise EstimateError(str(unsized), unsized.parameter) from None
    page_bytes = math.ceil(pools.bytes_per_full_token * DSV4_PAGE)
    if pools.full_tokens <= 0 and 0 < usable_gib * GIB <= pools.c128_state_bytes:
        raise NoRoomForKvCache(
            f"no room for the KV cache beside DeepSeek-V4's ratio-128 compress state: "
            f"{pools.request_slots:,} request slots (--max-running-requests per attention-DP "
            f"worker, SGLang's default 256, plus one) take {pools.c128_state_bytes / GIB:,.2f} "
            f"GiB per GPU of the {usable_gib:,.2f} GiB the weights leave (one {DSV4_PAGE}-token "
            f"page needs {page_bytes:,} bytes more); lower --max-running-requests, raise --tp "
            "or --mem-fraction-static, or use GPUs with more memory",
            "engine_args",
        )
    if pools.full_tokens <= 0:
        raise memory.no_room(usable_gib, DSV4_PAGE, page_bytes)
    if checks_swa_floor(release) and pools.swa_floor_broken:
        raise SlidingWindowPoolTooSmall(pools.swa_tokens, pools.window, DSV4_PAGE, pools.swa_ratio)
    return Estimate(
        kv_pool_tokens=pools.full_tokens,
        bytes_per_token=math.ceil(pools.bytes_per_full_token),
        context_length=derive_context_length(config, release),
        usable_gib=usable_gib,
        weights_gib=memory.weights_gib,
        attention="DSV4",
        page_size=DSV4_PAGE,
        kv_cache_dtype=DSV4_KV_CACHE_DTYPES[-1],
        gpu_reserved_gib=memory.gpu_reserved_gib,
        swa_pool_tokens=pools.swa_tokens,
        dsv4_pools=pools,
    )


def _dsv4_swa_ratio(engine_args: Sequence[str]) -> float | None:
    """--swa-full-tokens-ratio as given, None when the engine args leave it out."""
    if "--swa-full-tokens-ratio" not in last_uses(engine_args, SIZING_FLAGS, SIZING_SWITCHES):
        return None
    return _modelled_flags(engine_args).swa_full_tokens_ratio


def _attention_tp_groups(flags: SizingFlags) -> int:
    """The attention data-parallel size (1 without DP attention)."""
    if flags.attention_dp < 1:
        raise DeepseekV4Unsized(
            "the attention data-parallel size is not a number (--attn-dp-size, or --dp-size "
            "with --enable-dp-attention)",
            "engine_args",
        )
    return flags.attention_dp


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
    gpu_reserved_gib: float = 0.0,
    gpu_arch: str | None = None,
    engine_args: Sequence[str] = (),
    draft_layers: int | None = None,
    role: str | None = None,
    release: str | None = NEWEST_CHECKED,
    engine_env: Mapping[str, str] | None = None,
) -> Estimate:
    """Predicted KV pool tokens of one engine (per GPU rank; every rank holds the same count).

    kvgate's memory convention: SGLang's KV budget per rank is
    ``free_before_load × mem_fraction_static − weights_per_rank`` (mem_cache/
    kv_cache_configurator.py _profile_available_bytes); kvgate takes ``free_before_load =
    gpu_memory_gib − gpu_reserved_gib`` and ``weights_per_rank = weights_gib / tp``.
    ``engine_args`` are the extra launch flags (speculative decoding, DP attention, SWA and
    mamba ratios); ``draft_layers`` overrides the draft layer count they imply. ``role`` is the
    engine's disaggregation mode ("prefill" or "decode"; None: not disaggregated): a DSA pool's
    fp8 layout follows that role's backend. ``release`` is the engine's SGLang release (None:
    not known) and ``engine_env`` its environment, which DeepSeek-V4's sizing depends on.
    """
    check_sizes(
        gpu_memory_gib=gpu_memory_gib,
        gpu_reserved_gib=gpu_reserved_gib,
        tp=tp,
        mem_fraction_static=mem_fraction_static,
        page_size=page_size,
        weights_gib=weights_gib,
        max_total_tokens=max_total_tokens,
    )
    flags = _modelled_flags(engine_args)
    mismatch = tensor_parallel_mismatch(config, tp, attention_dp=max(flags.attention_dp, 1))
    if mismatch is not None:
        way = fitting_tensor_parallel(config, MAX_TENSOR_PARALLEL)
        raise EstimateError(f"{mismatch.explain()}; use {way}", "tp")
    gpu_major = _gpu_major(gpu_arch)
    if is_deepseek_v4(config):
        memory = _Memory(
            gpu_memory_gib=gpu_memory_gib,
            gpu_reserved_gib=gpu_reserved_gib,
            mem_fraction_static=mem_fraction_static,
            weights_gib=_replica_weights_gib(config, weights_gib),
            tp=tp,
        )
        inputs = _DeepseekV4Inputs(kv_cache_dtype, max_total_tokens, engine_args, flags, role)
        return _deepseek_v4_estimate(config, memory, inputs, release, engine_env or {})
    if draft_layers is None:
        draft_layers = speculative_draft_layers(config, flags)
    cell = _cell(
        config,
        tp=tp,
        kv_cache_dtype=kv_cache_dtype,
        gpu_major=gpu_major,
        draft_layers=draft_layers,
        flags=flags,
        role=role,
    )
    memory = _Memory(
        gpu_memory_gib=gpu_memory_gib,
        gpu_reserved_gib=gpu_reserved_gib,
        mem_fraction_static=mem_fraction_static,
        weights_gib=_replica_weights_gib(config, weights_gib),
        tp=tp,
    )
    page = cell.page(page_size)  # SGLang overrides the page size for some families
    multimodal_gib = VLM_CACHE_GIB if _multimodal(config, flags) else 0.0
    usable_gib = memory.budget_gib - memory.weights_per_rank - multimodal_gib
    mamba_state_gib = 0.0
    if cell.mamba_bytes_per_request and usable_gib > 0:
        mamba_state_gib = _mamba_state_gib(usable_gib, cell.mamba_bytes_per_request, flags)
        usable_gib -= mamba_state_gib
    tokens = _pool_tokens(usable_gib, cell, page, max_total_tokens, memory)
    swa_tokens = _swa_pool_tokens(tokens, cell, page) if cell.layout == "SWA" else None
    note = unmodelled_architecture_note(config, cell.layout)
    return Estimate(
        kv_pool_tokens=tokens,
        bytes_per_token=math.ceil(cell.bytes),
        context_length=derive_context_length(config),
        usable_gib=usable_gib,
        weights_gib=memory.weights_gib,
        attention=cell.layout,
        page_size=page,
        kv_cache_dtype=cell.kv_cache_dtype,
        gpu_reserved_gib=gpu_reserved_gib,
        swa_pool_tokens=swa_tokens,
        mamba_state_gib=mamba_state_gib,
        draft_layers=cell.draft_layers,
        notes=() if note is None else (note,),
    )
