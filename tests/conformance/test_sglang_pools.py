"""Conformance: the KV pools kvgate estimates are the ones each SGLang release sizes, token for
token, computed live by that release's own code.

- Llama 4 (chunked attention): ``llama4_pools_probe.py`` runs each release's ``ModelConfig``,
  ``get_hybrid_layer_ids``, ``resolve_sliding_window_size``, ``mm_runtime_reservation_gb`` and
  ``HybridSWAPoolConfigurator.calculate_pool_sizes`` on the shapes of
  tests/fixtures/sglang_pools/llama4.json. Each release's answer must be that record (so the unit
  tier, which reads the record, tests against what the releases compute), and kvgate's estimate
  must give the same full and chunked pools, or refuse where the release refuses.
- DeepSeek-V4 (``DeepseekV4ForCausalLM``): ``dsv4_pools_probe.py`` resolves each shape's engine
  arguments with the release's ``prepare_server_args`` and sizes it with the release's
  ``DSV4PoolConfigurator`` on a CUDA device of the shape's SM version; the answers differ per
  release and tests/fixtures/sglang_pools/deepseek_v4.json records each one. The release's answer
  must be its record, and kvgate's estimate for that release must give the same full, SWA, c4 and
  c128 pools, c4 state rows and bytes per full token, or refuse where the release refuses.
- Gemma 3 (``Gemma3ForConditionalGeneration``): whether the release reserves the multimodal
  (VLM cache) memory out of the KV budget, without and with ``--enable-multimodal``, from its own
  ``ModelConfig.is_multimodal`` and ``mm_runtime_reservation_gb``; kvgate's budget must differ by
  exactly that.

The answers are cached per release (tests/factories/release_answers.py), so a run after the first
takes seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from factories.model_configs import model_config
from factories.release_answers import ask_release, model_directory
from factories.sglang_pools import (
    DSV4_RECORD,
    DSV4_SHAPE_INPUTS,
    LLAMA4_RECORD,
    assert_dsv4_estimate_matches,
    llama4_estimate,
)
from kvgate_engine.estimator import (
    ChunkedPoolTooSmall,
    estimate_pool,
)
from test_sglang_argv import SUPPORTED_VERSIONS, sglang_envs

pytestmark = pytest.mark.conformance

__all__ = ["sglang_envs"]  # the module fixture this file uses

HERE = Path(__file__).resolve().parent
LLAMA4_PROBE = (HERE / "llama4_pools_probe.py").read_text()
DSV4_PROBE = (HERE / "dsv4_pools_probe.py").read_text()
SHAPE_INPUTS = ("name", "model", "gpu", "reserved", "mfs", "weights", "tp", "kv", "page", "ratio")

# Runs inside the SGLang environment: Gemma 3's multimodal switch and reservation as the
# release's ModelConfig decides them, without the flag (None, the parser's default) and with it.
MULTIMODAL_PROBE = r"""
import json, sys
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.mem_cache.kv_cache_configurator import mm_runtime_reservation_gb
model = json.load(sys.stdin)["model"]
answer = {}
for name, flag in (("default", None), ("flag", True)):
    config = ModelConfig(model_path=model, enable_multimodal=flag)
    answer[name] = {
        "is_multimodal": config.is_multimodal,
        "reservation_gib": mm_runtime_reservation_gb(
            is_multimodal=config.is_multimodal, mm_feature_transport=None
        ),
    }
print("KVGATE-RESULTS " + json.dumps(answer))
"""


def llama4_pools(version: str, release: Path) -> list[dict[str, Any]]:
    """The recorded Llama 4 shapes as the release at ``release`` sizes them."""
    shapes = [{key: shape[key] for key in SHAPE_INPUTS} for shape in LLAMA4_RECORD["shapes"]]
    models = sorted({shape["model"] for shape in shapes})
    question = {
        "release": version,
        "configs": {name: model_config(name) for name in models},
        "shapes": shapes,
    }
    computed: list[dict[str, Any]] = ask_release(release, LLAMA4_PROBE, question)
    return computed


def dsv4_pools(version: str, release: Path) -> list[dict[str, Any]]:
    """The recorded DeepSeek-V4 shapes as the release at ``release`` sizes them."""
    shapes = [{key: shape[key] for key in DSV4_SHAPE_INPUTS} for shape in DSV4_RECORD["shapes"]]
    question = {
        "release": version,
        "configs": {name: model_config(name) for name in {s["model"] for s in shapes}},
        "shapes": shapes,
    }
    computed: list[dict[str, Any]] = ask_release(release, DSV4_PROBE, question)
    return computed


def gemma3_multimodal(release: Path) -> dict[str, dict[str, Any]]:
    """Gemma 3's is_multimodal and VLM reservation in the release at ``release``, without
    --enable-multimodal ("default") and with it ("flag")."""
    directory = model_directory(model_config("gemma-3-27b-it"))
    answer: dict[str, dict[str, Any]] = ask_release(
        release, MULTIMODAL_PROBE, {"model": str(directory)}, reads=[directory / "config.json"]
    )
    return answer


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_llama4_pools_are_what_each_release_computes_token_for_token(
    version: str, sglang_envs: dict[str, Path]
) -> None:
    computed = llama4_pools(version, sglang_envs[version])

    assert computed == LLAMA4_RECORD["shapes"], f"SGLang {version} no longer matches the record"
    for shape in computed:
        if "refused" in shape:
            with pytest.raises(ChunkedPoolTooSmall) as refused:
                llama4_estimate(shape, gpu_arch="sm90")
            assert f"SWA pool ({refused.value.swa_pool_tokens} tokens)" in shape["refused"]
            continue
        estimate = llama4_estimate(shape, gpu_arch="sm90")
        assert (estimate.kv_pool_tokens, estimate.swa_pool_tokens) == (
            shape["max_total_num_tokens"],
            shape["swa_max_total_num_tokens"],
        ), shape["name"]
        assert estimate.usable_gib * 2**30 == pytest.approx(shape["available_bytes"], abs=1)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_deepseek_v4_pools_are_what_each_release_computes_token_for_token(
    version: str, sglang_envs: dict[str, Path]
) -> None:
    computed = dsv4_pools(version, sglang_envs[version])

    assert computed == DSV4_RECORD["releases"][version], f"SGLang {version} no longer matches"
    for answer in computed:
        assert_dsv4_estimate_matches(version, answer)


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_gemma3_reserves_multimodal_memory_exactly_when_each_release_does(
    version: str, sglang_envs: dict[str, Path]
) -> None:
    config = model_config("gemma-3-27b-it")
    answer = gemma3_multimodal(sglang_envs[version])

    def usable(engine_args: list[str]) -> float:
        estimate = estimate_pool(
            config,
            gpu_memory_gib=80,
            gpu_reserved_gib=1,
            weights_gib=51,
            tp=1,
            engine_args=engine_args,
        )
        return estimate.usable_gib

    budget = (80 - 1) * 0.85 - 51
    assert usable([]) == pytest.approx(budget - answer["default"]["reservation_gib"])
    assert usable(["--enable-multimodal"]) == pytest.approx(
        budget - answer["flag"]["reservation_gib"]
    )
    # The control: the flag does turn the reservation on, so the probe can tell the two apart.
    assert answer["flag"]["is_multimodal"] and answer["flag"]["reservation_gib"] > 0
