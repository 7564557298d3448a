"""DeepSeek-V4's pools per SGLang release, against the numbers each release's own code gave.

tests/fixtures/sglang_pools/deepseek_v4.json holds, per release and shape, what SGLang 0.5.19 to
0.5.23 computed with their own argument resolution (``prepare_server_args``) and
``DSV4PoolConfigurator`` on a CUDA device of the shape's SM version
(tests/conformance/dsv4_pools_probe.py says how). The config is
tests/fixtures/model_configs/deepseek-v4-flash-base.json, the published config.json of
deepseek-ai/DeepSeek-V4-Flash-Base: 43 layers, the first two sliding-window only, then compress
ratios 4 and 128 in turn (21 and 20 layers), a 128-token window, 448 + 64 head dims.
"""

from __future__ import annotations

from typing import Any

import pytest
from factories.model_configs import model_config
from factories.sglang_pools import DSV4_RECORD, assert_dsv4_estimate_matches, dsv4_estimate
from kvgate_engine.estimator import EstimateError, estimate_pool, forced_page_size
from kvgate_engine.sglang_choices import SUPPORTED_RELEASES

FLASH = model_config("deepseek-v4-flash-base")
ANSWERS = [
    (release, answer) for release, answers in DSV4_RECORD["releases"].items() for answer in answers
]
RATIO = ["--swa-full-tokens-ratio", "0.1"]


def _answer(release: str, name: str) -> dict[str, Any]:
    answer: dict[str, Any] = next(a for a in DSV4_RECORD["releases"][release] if a["name"] == name)
    return answer


def _flash(**changes: Any) -> dict[str, Any]:
    inputs: dict[str, Any] = {
        "gpu_memory_gib": 141,
        "gpu_reserved_gib": 1,
        "weights_gib": 160,
        "tp": 8,
        "release": "0.5.23",
        "engine_args": RATIO,
    }
    return inputs | changes


def test_the_record_was_computed_by_every_supported_release() -> None:
    assert sorted(DSV4_RECORD["releases"]) == list(SUPPORTED_RELEASES)
    answers = DSV4_RECORD["releases"].values()
    assert all(len(shapes) == len(DSV4_RECORD["shapes"]) for shapes in answers)


@pytest.mark.parametrize(
    ("release", "answer"), ANSWERS, ids=[f"{r}-{a['name']}" for r, a in ANSWERS]
)
def test_deepseek_v4_pools_are_the_ones_each_release_sizes(
    release: str, answer: dict[str, Any]
) -> None:
    """Full, SWA, c4 and c128 pools and the c4 state rows token for token, the bytes a full
    token costs to the last bit, or the refusal where the release refuses."""
    assert_dsv4_estimate_matches(release, answer)


@pytest.mark.parametrize(
    ("release", "full", "swa", "per_token"),
    [
        ("0.5.19", 13_442_816, 1_344_256, 7_705.450000000001),
        ("0.5.20", 13_442_816, 1_344_256, 7_705.450000000001),
        ("0.5.21", 14_616_576, 1_461_504, 7_086.75),
        ("0.5.22", 14_616_576, 1_461_504, 7_086.75),
        ("0.5.23", 14_616_576, 1_461_504, 7_086.75),
    ],
)
def test_flash_on_eight_h200s_holds_what_each_release_sizes(
    release: str, full: int, swa: int, per_token: float
) -> None:
    """(141 − 1) × 0.85 − 160 / 8 = 99 GiB per GPU; the ratio-128 state of 257 request slots
    takes 2.53 GiB first. 0.5.19 and 0.5.20 price a latent row at 584 bytes and the ratio-4
    state per window; 0.5.21 on price the padded V4 pages (585 bytes a token, 864 in the
    2-token ratio-128 page) and the ratio-4 state per 256-token page."""
    answer = _answer(release, "flash-tp8-h200")
    assert (answer["max_total_num_tokens"], answer["swa_max_total_num_tokens"]) == (full, swa)
    estimate = estimate_pool(FLASH, **_flash(release=release, engine_args=[]))
    pools = estimate.dsv4_pools
    assert pools is not None and (pools.full_tokens, pools.swa_tokens) == (full, swa)
    assert pools.bytes_per_full_token == per_token == answer["bytes_per_full_token"]


def test_the_gpu_sm_version_does_not_change_the_pools_sglang_sizes() -> None:
    """SGLANG_DSV4_KV_LAYOUT defaults to v4 in every release, so SGLang lays the pools out the
    same on Hopper (SM90) and Blackwell (SM100): an H200's numbers on an SM100 device are the
    same pools, in SGLang and in kvgate."""
    for release in SUPPORTED_RELEASES:
        hopper = _answer(release, "flash-tp8-h200")
        blackwell = _answer(release, "flash-tp8-h200-as-sm100")
        assert hopper["max_total_num_tokens"] == blackwell["max_total_num_tokens"]
        assert (
            hopper.get("kv_layout")
            == blackwell.get("kv_layout")
            == (None if release in ("0.5.19", "0.5.20") else "v4")
        )
        assert dsv4_estimate(hopper, release) == dsv4_estimate(blackwell, release)


def test_deepseek_v4_runs_page_256_and_fp8_for_auto() -> None:
    estimate = estimate_pool(FLASH, **_flash(page_size=1))
    assert (estimate.page_size, estimate.kv_cache_dtype, estimate.attention) == (
        256,
        "fp8_e4m3",
        "DSV4",
    )
    assert forced_page_size(FLASH) == 256


@pytest.mark.parametrize(
    ("changes", "parameter", "words"),
    [
        ({"release": None}, "release", "release is not known"),
        ({"release": "0.5.18"}, "release", "0.5.18"),
        ({"kv_cache_dtype": "bfloat16"}, "kv_cache_dtype", "fp8_e4m3"),
        ({"engine_args": [*RATIO, "--dsv4-attn-backend", "trtllm"]}, "engine_args", "trtllm"),
        ({"engine_env": {"SGLANG_DSV4_KV_LAYOUT": "auto"}}, "engine_env", "SM version"),
        ({"engine_env": {"SGLANG_OPT_USE_ONLINE_COMPRESS": "1"}}, "engine_env", "online"),
        ({"engine_args": [*RATIO, "--speculative-algorithm", "EAGLE"]}, "engine_args", "draft"),
        ({"engine_args": ["--swa-full-tokens-ratio", "1.5"]}, "engine_args", "(0, 1]"),
    ],
)
def test_deepseek_v4_inputs_kvgate_does_not_size_exactly_are_refused_by_name(
    changes: dict[str, Any], parameter: str, words: str
) -> None:
    with pytest.raises(EstimateError) as refused:
        estimate_pool(FLASH, **_flash(**changes))
    assert refused.value.parameter == parameter and words in str(refused.value)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (FLASH | {"model_type": "deepseek_v41"}, "V4.1"),
        (FLASH | {"architectures": ["DeepseekV4ForCausalLMNextN"]}, "draft model"),
        (FLASH | {"compress_ratios": [0, 2, *FLASH["compress_ratios"][2:]]}, "0, 4 or 128"),
        (FLASH | {"kv_source_layer_ids": [2]}, "kv_source_layer_ids"),
    ],
)
def test_deepseek_v4_family_members_kvgate_does_not_size_are_refused(
    config: dict[str, Any], words: str
) -> None:
    with pytest.raises(EstimateError) as refused:
        estimate_pool(config, **_flash())
    assert words in str(refused.value)


def test_a_small_decode_batch_needs_its_extra_slots_stated() -> None:
    """A decode worker with at most 32 running requests reserves extra slots in SGLang's argument
    resolution; kvgate sizes it once --disaggregation-decode-extra-slots says how many."""
    args = [*RATIO, "--max-running-requests", "32"]
    with pytest.raises(EstimateError, match="--disaggregation-decode-extra-slots"):
        estimate_pool(FLASH, **_flash(engine_args=args, role="decode"))
    stated = estimate_pool(
        FLASH,
        **_flash(engine_args=[*args, "--disaggregation-decode-extra-slots", "64"], role="decode"),
    )
    assert stated.kv_pool_tokens > 0


@pytest.mark.parametrize("spelling", ["--dp-size", "--data-parallel-size"])
def test_a_decode_engine_s_data_parallel_replicas_count_under_either_spelling(
    spelling: str,
) -> None:
    """SGLang's parser takes --data-parallel-size as --dp-size; 128 running requests over 8
    replicas is 16 a rank, a small decode batch either way."""
    args = [*RATIO, "--max-running-requests", "128", spelling, "8"]
    with pytest.raises(EstimateError, match="--disaggregation-decode-extra-slots"):
        estimate_pool(FLASH, **_flash(engine_args=args, role="decode"))
