"""Probe: Llama 4's KV pools as a released SGLang sizes them, with its own code.

Runs inside one release's environment (never with kvgate's package); it reads
``{"release": ..., "configs": {name: config.json}, "shapes": [...]}`` on stdin and prints
``KVGATE-RESULTS <json>``, the shapes with SGLang's answers: the ``shapes`` of
tests/fixtures/sglang_pools/llama4.json. tests/conformance/test_sglang_pools.py runs it in every
conformance environment (tests/conformance/setup_env.sh installs what ``ModelConfig`` imports) with
the inputs of each recorded shape (name, model, gpu, reserved, mfs, weights, tp, kv, page and
ratio; the configs tests/fixtures/model_configs/<model>.json) and requires the record. By hand::

    PYTHONPATH=~/.cache/kvgate/conformance/sglang-0.5.23 .venv/bin/python \
        tests/conformance/llama4_pools_probe.py < in.json

For each shape it builds SGLang's ``ModelConfig`` from the config.json, takes the layer split from
``get_hybrid_layer_ids``, the window from ``resolve_sliding_window_size`` (for Llama 4:
``attention_chunk_size``), the multimodal reservation from ``mm_runtime_reservation_gb``, and calls
``HybridSWAPoolConfigurator.calculate_pool_sizes`` with the bytes kvgate's memory convention gives
(``((gpu − reserved) × mem_fraction_static − weights / tp − multimodal GiB) × 2^30``), under the
shape's attention TP size and --swa-full-tokens-ratio. A shape whose SWA pool SGLang refuses
records SGLang's error instead of a pool.
"""

import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import sglang
import torch
from sglang.srt.configs import model_config as sglang_model_config
from sglang.srt.mem_cache import kv_cache_configurator
from sglang.srt.model_executor import pool_configurator
from sglang.srt.model_executor.model_runner_components import load_model_utils

GIB = 2**30
TORCH_DTYPES = {"bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}


def _model_config(config: dict[str, Any]) -> Any:
    directory = Path(tempfile.mkdtemp())
    (directory / "config.json").write_text(json.dumps(config))
    return sglang_model_config.ModelConfig(model_path=str(directory))


def _pool(shape: dict[str, Any], config_json: dict[str, Any]) -> dict[str, Any]:
    config = _model_config(config_json)
    swa_ids, full_ids = sglang_model_config.get_hybrid_layer_ids(
        config.hf_config.architectures, config.hf_text_config
    )
    # 0.5.19 reads the split from the model config, 0.5.23 from the configurator's layer_info.
    config.swa_attention_layer_ids, config.full_attention_layer_ids = swa_ids, full_ids
    window = load_model_utils.resolve_sliding_window_size(object(), config)
    mm_gib = kv_cache_configurator.mm_runtime_reservation_gb(
        is_multimodal=config.is_multimodal, mm_feature_transport=None
    )
    # The runtime context the configurator reads (get_parallel, get_schedule, get_memory).
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


question = json.load(sys.stdin)
if sglang.__version__ != question["release"]:
    raise SystemExit(f"this is SGLang {sglang.__version__}, not {question['release']}")
answer = [_pool(shape, question["configs"][shape["model"]]) for shape in question["shapes"]]
print("KVGATE-RESULTS " + json.dumps(answer))
