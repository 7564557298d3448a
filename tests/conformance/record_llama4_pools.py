"""Record Llama 4's KV pools as SGLang itself sizes them (tests/fixtures/sglang_pools/llama4.json).

Run it with a released SGLang on its own path, never with kvgate's package (a release without an
installed environment: its wheel's ``sglang`` package first on the PYTHONPATH of an installed
release with the same transformers pin), e.g.::

    S=~/.cache/kvgate/sglang-cpu/0.5.23
    PYTHONPATH=$S/site LD_LIBRARY_PATH=$S/lib .venv/bin/python \
        tests/conformance/record_llama4_pools.py 0.5.23 > /tmp/0.5.23.json

For each shape it builds SGLang's ``ModelConfig`` from the fixture config.json, takes the layer
split from ``get_hybrid_layer_ids``, the window from ``resolve_sliding_window_size`` (for Llama 4:
``attention_chunk_size``), the multimodal reservation from ``mm_runtime_reservation_gb``, and calls
``HybridSWAPoolConfigurator.calculate_pool_sizes`` with the bytes kvgate's memory convention gives
(``((gpu − reserved) × mem_fraction_static − weights / tp − multimodal GiB) × 2^30``), under the
attention TP size and --swa-full-tokens-ratio of the shape. A shape whose SWA pool SGLang refuses
records SGLang's error instead of a pool.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from sglang.srt.configs import model_config as sglang_model_config
from sglang.srt.mem_cache import kv_cache_configurator
from sglang.srt.model_executor import pool_configurator
from sglang.srt.model_executor.model_runner_components import load_model_utils

GIB = 2**30
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"

# name, config, gpu GiB, reserved GiB, mem_fraction_static, weights GiB, tp, kv dtype, page, ratio
SHAPES: list[dict[str, Any]] = [
    # Scout in bf16 (~203 GiB) on 8 × H100 80 GB.
    dict(
        name="scout-tp8-h100",
        model="llama-4-scout-17b-16e",
        gpu=80,
        reserved=1,
        mfs=0.85,
        weights=203,
        tp=8,
        kv="bfloat16",
        page=1,
        ratio=0.8,
    ),
    # Scout on 4 × H200 141 GB: 2 KV heads a rank.
    dict(
        name="scout-tp4-h200",
        model="llama-4-scout-17b-16e",
        gpu=141,
        reserved=1,
        mfs=0.85,
        weights=203,
        tp=4,
        kv="bfloat16",
        page=1,
        ratio=0.8,
    ),
    # Scout with an fp8 KV cache and page 64 on 8 × H100.
    dict(
        name="scout-tp8-fp8-page64",
        model="llama-4-scout-17b-16e",
        gpu=80,
        reserved=1,
        mfs=0.85,
        weights=203,
        tp=8,
        kv="fp8_e4m3",
        page=64,
        ratio=0.8,
    ),
    # Scout with --swa-full-tokens-ratio 0.5.
    dict(
        name="scout-tp8-ratio0.5",
        model="llama-4-scout-17b-16e",
        gpu=80,
        reserved=1,
        mfs=0.85,
        weights=203,
        tp=8,
        kv="bfloat16",
        page=1,
        ratio=0.5,
    ),
    # Maverick in fp8 weights (~390 GiB) on 8 × H200.
    dict(
        name="maverick-tp8-h200",
        model="llama-4-maverick-17b-128e",
        gpu=141,
        reserved=1,
        mfs=0.85,
        weights=390,
        tp=8,
        kv="bfloat16",
        page=1,
        ratio=0.8,
    ),
    # Scout with --swa-full-tokens-ratio 0.05: a small chunked pool, still above the floor.
    dict(
        name="scout-tp8-ratio0.05",
        model="llama-4-scout-17b-16e",
        gpu=80,
        reserved=1,
        mfs=0.85,
        weights=203,
        tp=8,
        kv="bfloat16",
        page=1,
        ratio=0.05,
    ),
    # Scout on 4 × H100 at mem_fraction_static 0.648: the chunked pool just above the floor.
    dict(
        name="scout-tp4-h100-mfs0.648",
        model="llama-4-scout-17b-16e",
        gpu=80,
        reserved=1,
        mfs=0.648,
        weights=203,
        tp=4,
        kv="bfloat16",
        page=1,
        ratio=0.8,
    ),
    # The same at 0.647: the weights fit, the chunked pool is at or below chunk + page.
    dict(
        name="scout-tp4-h100-mfs0.647-floor",
        model="llama-4-scout-17b-16e",
        gpu=80,
        reserved=1,
        mfs=0.647,
        weights=203,
        tp=4,
        kv="bfloat16",
        page=1,
        ratio=0.8,
    ),
    # Maverick in bf16 (~745 GiB) on 8 × H200 at 0.666: the weights fit, the pool does not.
    dict(
        name="maverick-bf16-tp8-h200-mfs0.666-floor",
        model="llama-4-maverick-17b-128e",
        gpu=141,
        reserved=1,
        mfs=0.666,
        weights=745,
        tp=8,
        kv="bfloat16",
        page=64,
        ratio=0.8,
    ),
]
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}


def _model_config(model: str) -> Any:
    directory = Path(tempfile.mkdtemp())
    (directory / "config.json").write_text((FIXTURES / f"{model}.json").read_text())
    return sglang_model_config.ModelConfig(model_path=str(directory))


def _pool(shape: dict[str, Any]) -> dict[str, Any]:
    config = _model_config(shape["model"])
    swa_ids, full_ids = sglang_model_config.get_hybrid_layer_ids(
        config.hf_config.architectures, config.hf_text_config
    )
    # 0.5.19 reads the split from the model config, 0.5.23 from the configurator's layer_info.
    config.swa_attention_layer_ids, config.full_attention_layer_ids = swa_ids, full_ids
    window = load_model_utils.resolve_sliding_window_size(object(), config)
    mm_gib = kv_cache_configurator.mm_runtime_reservation_gb(
        is_multimodal=config.is_multimodal, mm_feature_transport=None
    )
    pool_configurator.get_parallel = lambda: SimpleNamespace(
        attn_tp_size=shape["tp"], attn_dcp_size=1
    )
    pool_configurator.get_schedule = lambda: SimpleNamespace(swa_full_tokens_ratio=shape["ratio"])
    pool_configurator.get_memory = lambda: SimpleNamespace(enable_unified_memory=False)
    spec = SimpleNamespace(
        is_eagle=lambda: False, is_standalone=lambda: False, is_dflash_family=lambda: False
    )
    kvc = SimpleNamespace(
        model_config=config,
        kv_cache_dtype=TORCH_DTYPES[shape["kv"]],
        kv_cache_dtype_str=shape["kv"],
        layer_info=SimpleNamespace(
            swa_attention_layer_ids=swa_ids, full_attention_layer_ids=full_ids
        ),
        sliding_window_size=window,
        page_size=shape["page"],
        spec_algorithm=spec,
        is_draft_worker=False,
        fused_entry_bytes=lambda kind: None,
    )
    configurator = pool_configurator.HybridSWAPoolConfigurator(kvc)
    usable_gib = (
        (shape["gpu"] - shape["reserved"]) * shape["mfs"] - shape["weights"] / shape["tp"] - mm_gib
    )
    available_bytes = int(usable_gib * GIB)
    record: dict[str, Any] = {
        **shape,
        "sliding_window_size": window,
        "swa_layers": len(swa_ids),
        "full_layers": len(full_ids),
        "multimodal_reservation_gib": mm_gib,
        "available_bytes": available_bytes,
        "cell_size": configurator._cell_size,
    }
    try:
        pools = configurator.calculate_pool_sizes(available_bytes, shape["page"])
    except ValueError as refused:
        return {**record, "refused": str(refused)}
    return {
        **record,
        "max_total_num_tokens": pools.max_total_num_tokens,
        "swa_max_total_num_tokens": pools.swa_max_total_num_tokens,
    }


def main() -> None:
    import sglang

    release = sys.argv[1]
    if sglang.__version__ != release:
        raise SystemExit(f"this is SGLang {sglang.__version__}, not {release}")
    json.dump(
        {"release": release, "shapes": [_pool(shape) for shape in SHAPES]}, sys.stdout, indent=2
    )


if __name__ == "__main__":
    main()
