"""The Llama 4 pools SGLang's own code computed (tests/fixtures/sglang_pools/llama4.json, recorded
and re-checked live by tests/conformance/llama4_pools_probe.py), and kvgate's estimate of one of
its shapes: the unit tests and the conformance tier hold the two to each other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvgate_engine.estimator import SWA_FULL_TOKENS_RATIO, Estimate, estimate_pool

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
