"""Model config lookup and the engine's limits, derived the way SGLang derives them at start-up.

Pure: plain values in, an ``EngineLimits`` out. The pool arithmetic is kvgate's estimator (one
copy of the formula); this module only adds what SGLang does around it: the context-length
override rule, ``max_req_input_len`` and the default ``max_running_requests``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgate_engine.estimator import (
    GIB,
    EstimateError,
    derive_context_length,
    estimate_pool,
    estimate_weights_gib,
)

BUNDLED_MODELS_DIR = Path(__file__).parent / "models"
DEFAULT_GPU_MEMORY_GIB = 80.0  # one H100/A100-80GB: the common PD deployment GPU
ALLOW_LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


class StartupError(Exception):
    """The engine refuses to start; the message names the flag, the numbers and the way out."""


@dataclass(frozen=True)
class ModelConfig:
    name: str  # bundled config name, or the directory's basename
    source: Path  # the config.json that was read
    config: Mapping[str, Any]

    @property
    def vocab_size(self) -> int:
        text = self.config.get("text_config", self.config)
        vocab = text.get("vocab_size") if isinstance(text, Mapping) else None
        return vocab if isinstance(vocab, int) and vocab > 0 else 32000


def bundled_model_names() -> list[str]:
    return sorted(p.parent.name for p in BUNDLED_MODELS_DIR.glob("*/config.json"))


def resolve_model_config(model_path: str) -> ModelConfig:
    """config.json from a directory (or file) path, else the bundled config matching its basename.

    ``meta-llama/Llama-3.1-8B-Instruct`` matches the bundled ``llama-3.1-8b`` (case-insensitive,
    longest bundled name the basename starts with).
    """
    path = Path(model_path)
    candidates = [path / "config.json", path] if path.suffix != ".json" else [path]
    for candidate in candidates:
        if candidate.is_file() and candidate.name.endswith(".json"):
            return ModelConfig(path.name, candidate, _load(candidate))
    base = path.name.lower() if path.name else model_path.lower()
    matches = [n for n in bundled_model_names() if base == n or base.startswith(n)]
    if not matches:
        raise StartupError(
            f"--model-path {model_path!r}: no config.json there and no bundled config matches "
            f"{base!r} (bundled: {', '.join(bundled_model_names())}); point --model-path at a "
            f"directory holding a Hugging Face config.json"
        )
    name = max(matches, key=len)
    source = BUNDLED_MODELS_DIR / name / "config.json"
    return ModelConfig(name, source, _load(source))


def _load(source: Path) -> Mapping[str, Any]:
    try:
        config = json.loads(source.read_text())
    except (OSError, ValueError) as error:
        raise StartupError(f"--model-path: cannot read {source}: {error}") from error
    if not isinstance(config, dict):
        raise StartupError(f"--model-path: {source} is not a JSON object")
    return config


@dataclass(frozen=True)
class EngineLimits:
    """What the running engine holds and admits; the numbers /server_info reports."""

    context_length: int  # effective: /v1/models max_model_len
    derived_context_length: int
    kv_pool_tokens: int  # max_total_num_tokens == memory_usage.token_capacity
    page_size: int
    max_req_input_len: int
    max_running_requests: int
    bytes_per_token: int
    weights_gib: float
    kv_cache_gib: float
    gpu_memory_gib: float
    mem_fraction_static: float
    warnings: tuple[str, ...] = ()

    @property
    def num_pages(self) -> int:
        return self.kv_pool_tokens // self.page_size


def default_mem_fraction_static(gpu_memory_gib: float, tp: int, pp: int) -> float:
    """SGLang's default when --mem-fraction-static is not passed (it depends on the GPU)."""
    gpu_mb = gpu_memory_gib * 1024
    reserved_mb = 512 + 1.5 * 2048 + tp * pp / 8 * 1024
    if gpu_memory_gib > 60:
        reserved_mb = max(reserved_mb, 10 * 1024)
    fraction = round((gpu_mb - reserved_mb) / gpu_mb, 3)
    return min(max(fraction, 0.5), 0.95)  # tiny simulated GPUs would go negative


def compute_limits(
    model: ModelConfig,
    *,
    gpu_memory_gib: float,
    tp: int,
    pp: int = 1,
    mem_fraction_static: float | None,
    kv_cache_dtype: str,
    page_size: int,
    context_length: int | None,
    max_total_tokens: int | None,
    max_running_requests: int | None,
    weights_gib: float | None,
    allow_longer_context: bool,
    release: str,
) -> EngineLimits:
    """SGLang ``release``'s start-up arithmetic; raises StartupError where SGLang refuses to
    start. The model's own context length is the one that release derives (its pinned
    transformers: ``kvgate_engine.estimator.derive_context_length``)."""
    derived = derive_context_length(model.config, release)
    warnings: list[str] = []
    if context_length is None:
        effective_context = derived
    elif context_length > derived and not allow_longer_context:
        raise StartupError(
            f"User-specified context_length ({context_length}) is greater than the derived "
            f"context_length ({derived}). This may lead to incorrect model outputs or CUDA "
            f"errors. Note that the derived context_length may differ from "
            f"max_position_embeddings in the model's config. To allow overriding this maximum, "
            f"set the env var {ALLOW_LONGER_CONTEXT_ENV}=1"
        )
    else:
        effective_context = context_length
        if context_length > derived:
            warnings.append(
                f"--context-length {context_length:,} > derived {derived:,}; allowed by "
                f"{ALLOW_LONGER_CONTEXT_ENV}=1"
            )
    mfs = (
        mem_fraction_static
        if mem_fraction_static is not None
        else default_mem_fraction_static(gpu_memory_gib, tp, pp)
    )
    if weights_gib is None:
        weights_gib = estimate_weights_gib(model.config)
        if weights_gib is None:
            raise StartupError(
                f"cannot size the weights of {model.name} from its config.json; set "
                f"KVGATE_WEIGHTS_GIB to the weight size of one replica in GiB"
            )
    try:
        estimate = estimate_pool(
            model.config,
            gpu_memory_gib=gpu_memory_gib,
            tp=tp,
            mem_fraction_static=mfs,
            kv_cache_dtype=kv_cache_dtype,
            page_size=page_size,
            weights_gib=weights_gib,
            max_total_tokens=max_total_tokens,
        )
    except EstimateError as error:
        raise StartupError(
            f"Not enough memory for the KV cache (KVGATE_GPU_MEMORY_GIB={gpu_memory_gib:g}): "
            f"{error}"
        ) from error
    pool = estimate.kv_pool_tokens
    if max_total_tokens is not None and max_total_tokens > pool:
        warnings.append(
            f"max_total_tokens={max_total_tokens:,} is larger than the profiled value {pool:,}. "
            f"Use the profiled value instead."
        )
    if pool < effective_context:
        warnings.append(
            f"KV pool holds {pool:,} tokens, fewer than --context-length {effective_context:,}. "
            f"One full-length request cannot fit."
        )
    max_req_input_len = min(effective_context - 1, pool - 1) - 5
    if max_running_requests is None:
        by_pool = min(max(int(pool / effective_context * 512), 2048), 4096)
        max_running_requests = max(1, min(by_pool, pool // 2))
    return EngineLimits(
        context_length=effective_context,
        derived_context_length=derived,
        kv_pool_tokens=pool,
        page_size=page_size,
        max_req_input_len=max_req_input_len,
        max_running_requests=max_running_requests,
        bytes_per_token=estimate.bytes_per_token,
        weights_gib=estimate.weights_gib / tp,
        kv_cache_gib=math.floor(pool * estimate.bytes_per_token / GIB * 100) / 100,
        gpu_memory_gib=gpu_memory_gib,
        mem_fraction_static=mfs,
        warnings=tuple(warnings),
    )
