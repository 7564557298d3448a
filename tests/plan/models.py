"""Public model configs (trimmed to what the estimator reads) and the shipped sample for the
planner's tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from factories.model_configs import model_config

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "plan"
SAMPLE = Path(__file__).resolve().parents[2] / "crds" / "samples" / "llama-8b.yaml"
LLAMA_70B_CONFIG = GOLDEN / "llama-3.1-70b-config.json"
LLAMA_31_70B: dict[str, Any] = json.loads(LLAMA_70B_CONFIG.read_text())
LLAMA_70B_WEIGHTS_GIB = 131.5  # 70.6 B parameters in bfloat16

LLAMA_31_8B = model_config("llama-3.1-8b")

QWEN3_4B = model_config("qwen3-4b")

# MLA: the latent is replicated on every rank, so TP only adds room for it.
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "max_position_embeddings": 163840,
    "rope_scaling": {"factor": 40, "original_max_position_embeddings": 4096, "type": "yarn"},
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3"},
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3_WEIGHTS_GIB = 642.0

# No attention shape the estimator knows: a state-space model.
MAMBA: dict[str, Any] = {
    "architectures": ["MambaForCausalLM"],
    "model_type": "mamba",
    "d_model": 2560,
    "n_layer": 64,
    "vocab_size": 50280,
    "torch_dtype": "bfloat16",
}


def sample() -> dict[str, Any]:
    """The shipped safe sample: Llama-3.1-8B, 131,072 tokens, 80 GiB GPUs."""
    doc: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())
    return doc


def mutated(changes: dict[str, Any]) -> dict[str, Any]:
    """The sample with dotted-path changes applied: {"spec.decode.gpuMemoryGiB": 24}.

    No GPU memory reserved, so the pools are the estimator's plain formula.
    """
    doc = sample()
    for role in ("prefill", "decode"):
        doc["spec"][role]["gpuReservedGiB"] = 0
    for dotted, value in changes.items():
        node = doc
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    return doc
