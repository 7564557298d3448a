"""Probe: DeepSeek-V4's KV pools as a released SGLang sizes them, with its own code.

Runs inside one release's environment (never with kvgate's package); it reads
``{"release": ..., "configs": {name: config.json}, "shapes": [...]}`` on stdin and prints
``KVGATE-RESULTS <json>``, the shapes with SGLang's answers: the ``shapes`` of
tests/fixtures/sglang_pools/deepseek_v4.json. tests/conformance/test_sglang_pools.py runs it in
every conformance environment with the inputs of each recorded shape and requires the record. By
hand::

    PYTHONPATH=~/.cache/kvgate/conformance/sglang-0.5.23 .venv/bin/python \
        tests/conformance/dsv4_pools_probe.py < in.json

For each shape it

1. resolves the engine's arguments with the release's own ``prepare_server_args`` (the model's
   config.json in a directory of its own, the shape's ``args``): the DeepSeek-V4 overrides and
   hooks fill ``swa_full_tokens_ratio``, ``max_running_requests``, the page size and the decode
   engine's extra request slots there;
2. builds the release's ``ModelConfig`` and ``DSV4PoolConfigurator`` from those resolved values,
   on a CUDA device of the shape's SM version (``torch.cuda`` answers as that GPU would; the
   release's runtime context is the resolved arguments), and records the KV layout
   ``select_dsv4_kv_layout`` picks there (0.5.21 on);
3. calls ``calculate_pool_sizes`` with the bytes kvgate's memory convention gives
   (``((gpu − reserved) × mem_fraction_static − weights / tp) × 2^30``), then, for a shape with
   ``max_total_tokens`` below the pool, ``calculate_pool_sizes_from_max_tokens`` as
   ``KVCacheConfigurator`` does.

A shape SGLang refuses records the error instead of pools.
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
from sglang.srt.mem_cache import deepseek_v4_memory_pool
from sglang.srt.model_executor import pool_configurator
from sglang.srt.model_executor.model_runner_components import load_model_utils
from sglang.srt.server_args import prepare_server_args

GIB = 2**30
# The resolved arguments the configurator reads (through get_schedule, get_disagg, ...).
RESOLVED = (
    "swa_full_tokens_ratio",
    "_swa_full_tokens_ratio_explicitly_set",
    "max_running_requests",
    "swa_prefix_tails",
    "chunked_prefill_size",
    "disable_overlap_schedule",
    "disable_radix_cache",
    "disaggregation_mode",
    "disaggregation_decode_extra_slots",
    "page_size",
    "kv_cache_dtype",
    "dsv4_attn_backend",
    "max_total_tokens",
    "attn_dp_size",
    "dp_size",
    "enable_dp_attention",
)


def _config_directory(config: dict[str, Any]) -> str:
    directory = Path(tempfile.mkdtemp())
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def _resolved(model: str, args: list[str]) -> dict[str, Any]:
    """The release's own argument resolution, as a flat dict of the fields the sizer reads."""
    server_args = prepare_server_args(["--model-path", model, *args])
    if hasattr(server_args, "resolve_once"):  # resolution is a separate step in some releases
        server_args.resolve_once()
    flat = dict(server_args.resolved_dict()) if hasattr(server_args, "resolved_dict") else {}
    for name in RESOLVED:
        if name not in flat and hasattr(server_args, name):
            flat[name] = getattr(server_args, name)
    return {name: flat.get(name) for name in RESOLVED}


def _attention_dp(resolved: dict[str, Any]) -> int:
    """The attention data-parallel size the release resolved: attn_dp_size where it has the
    field (0.5.20 on), else dp_size under --enable-dp-attention (0.5.19's parallel state)."""
    if resolved["attn_dp_size"] is not None:
        return int(resolved["attn_dp_size"])
    return int(resolved["dp_size"]) if resolved["enable_dp_attention"] else 1


def _runtime_context(resolved: dict[str, Any], attn_dp: int) -> dict[str, Any]:
    """Stand-ins for runtime_context.get_* built from the resolved arguments (no spec decode,
    no HiSparse, no unified memory, no encoder replay)."""
    values = SimpleNamespace(
        **{**resolved, "attn_dp_size": attn_dp},
        enable_hisparse=False,
        enable_unified_memory=False,
        attn_tp_size=1,
        attn_dcp_size=1,
        pp_size=1,
        speculative_algorithm=None,
        speculative_num_draft_tokens=None,
    )
    exec_ = SimpleNamespace(
        kernel=SimpleNamespace(
            dsv4_attn_backend=resolved["dsv4_attn_backend"],
            enable_deepseek_v4_fp4_indexer=False,
        ),
        features=SimpleNamespace(enable_encoder_swa_bounded_replay=False),
    )
    return {
        "get_schedule": lambda: values,
        "get_disagg": lambda: values,
        "get_memory": lambda: values,
        "get_parallel": lambda: values,
        "get_spec": lambda: values,
        "get_model": lambda: values,
        "get_exec": lambda: exec_,
        "max_speculative_num_draft_tokens": lambda: None,
    }


def _as_gpu(sm: int) -> None:
    """torch.cuda answers as a CUDA GPU of SM version ``sm`` (90: Hopper, 100: Blackwell)."""
    torch.cuda.is_available = lambda: True
    torch.version.cuda = torch.version.cuda or "12.9"
    torch.cuda.get_device_capability = lambda device=None: (sm // 10, sm % 10)


def _pools(config: Any) -> dict[str, Any]:
    return {
        "max_total_num_tokens": config.max_total_num_tokens,
        "swa_max_total_num_tokens": config.swa_max_total_num_tokens,
        "c4_max_total_num_tokens": config.c4_max_total_num_tokens,
        "c128_max_total_num_tokens": config.c128_max_total_num_tokens,
        "c4_state_pool_size": config.c4_state_pool_size,
    }


def _argv(shape: dict[str, Any]) -> list[str]:
    """The engine's arguments as kvgate's launcher passes them (page 1, auto dtype), the role's
    disaggregation mode and the shape's extra engine args."""
    argv = ["--tp-size", str(shape["tp"]), "--mem-fraction-static", str(shape["mfs"])]
    argv += ["--page-size", "1", "--kv-cache-dtype", "auto", "--device", "cpu"]
    if shape["role"] is not None:
        argv += ["--disaggregation-mode", shape["role"]]
    if shape["max_total_tokens"] is not None:
        argv += ["--max-total-tokens", str(shape["max_total_tokens"])]
    return argv + shape["engine_args"]


def _shape(shape: dict[str, Any], config_json: dict[str, Any]) -> dict[str, Any]:
    model = _config_directory(config_json)
    try:
        resolved = _resolved(model, _argv(shape))
    except (Exception, SystemExit) as refused:
        return {**shape, "refused_args": f"{type(refused).__name__}: {refused}"}
    config = sglang_model_config.ModelConfig(model_path=model)
    attn_dp = _attention_dp(resolved)
    context = _runtime_context(resolved, attn_dp)
    for module in (pool_configurator, deepseek_v4_memory_pool):
        for name, stand_in in context.items():
            if hasattr(module, name):
                setattr(module, name, stand_in)
    _as_gpu(shape["sm"])
    layers = config.hf_text_config.num_hidden_layers
    spec = SimpleNamespace(
        is_none=lambda: True,
        is_eagle=lambda: False,
        is_dspark=lambda: False,
        is_standalone=lambda: False,
        is_dflash_family=lambda: False,
    )
    kvc = SimpleNamespace(
        model_config=config,
        kv_cache_dtype=torch.float8_e4m3fn,
        kv_cache_dtype_str=resolved["kv_cache_dtype"],
        layer_info=SimpleNamespace(start_layer=0, end_layer=layers),
        ps=SimpleNamespace(pp_size=1, attn_dp_size=attn_dp),
        pp_size=1,
        attn_dp_size=attn_dp,
        sliding_window_size=load_model_utils.resolve_sliding_window_size(object(), config),
        page_size=resolved["page_size"],
        spec_algorithm=spec,
        is_draft_worker=False,
        is_hybrid_swa=True,
        device="cuda",
    )
    record: dict[str, Any] = {**shape, "resolved": resolved, "context_len": config.context_len}
    if hasattr(deepseek_v4_memory_pool, "select_dsv4_kv_layout"):
        layout, _option = deepseek_v4_memory_pool.select_dsv4_kv_layout()
        record["kv_layout"] = str(layout.value)
    usable_gib = (shape["gpu"] - shape["reserved"]) * shape["mfs"] - shape["weights"] / shape["tp"]
    available_bytes = int(usable_gib * GIB)
    record["available_bytes"] = available_bytes
    try:
        configurator = pool_configurator.create_memory_pool_configurator(kvc)
        record["configurator"] = type(configurator).__name__
        record["bytes_per_full_token"] = configurator.bytes_per_full_token
        pools = configurator.calculate_pool_sizes(available_bytes, resolved["page_size"])
        cap = resolved["max_total_tokens"]
        if cap is not None and cap < pools.max_total_num_tokens:
            pools = configurator.calculate_pool_sizes_from_max_tokens(cap, resolved["page_size"])
    except (ValueError, RuntimeError, AssertionError) as refused:
        return {**record, "refused": f"{type(refused).__name__}: {refused}"}
    return {**record, **_pools(pools)}


question = json.load(sys.stdin)
if sglang.__version__ != question["release"]:
    raise SystemExit(f"this is SGLang {sglang.__version__}, not {question['release']}")
answer = [_shape(shape, question["configs"][shape["model"]]) for shape in question["shapes"]]
print("KVGATE-RESULTS " + json.dumps(answer))
