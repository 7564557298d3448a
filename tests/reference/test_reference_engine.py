"""The reference engine on its own: flags, sizing, SGLang endpoints, paged pool, copy model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import pytest
from kvgate_engine.estimator import estimate_pool
from kvgate_engine.probe import parse_report
from kvgate_engine.reference.admission import emulates_incident, scheduler_check
from kvgate_engine.reference.args import DEFAULT_VERSION
from kvgate_engine.reference.kv_pool import PagedKVPool, PoolExhausted
from kvgate_engine.reference.model import K_DIM, V_DIM, CopyAttentionModel
from kvgate_engine.reference.sizing import (
    BUNDLED_MODELS_DIR,
    StartupError,
    compute_limits,
    resolve_model_config,
)

if TYPE_CHECKING:
    from conftest import EngineLauncher

TINY = json.loads((BUNDLED_MODELS_DIR / "tiny-llama" / "config.json").read_text())


def run_engine_cli(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvgate_engine.reference", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


# -- flags and start-up refusals -----------------------------------------------------------------


def test_unknown_flag_exits_2_and_names_the_flag() -> None:
    result = run_engine_cli("--model-path", "tiny-llama", "--no-such-flag", "3")
    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag 3" in result.stderr
    assert "sglang.launch_server flags" in result.stderr


def test_every_flag_kvgate_launcher_emits_is_accepted() -> None:
    from kvgate_engine.reference.args import parse_launch_args

    launch = parse_launch_args(
        [
            *("--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "m"),
            *("--host", "0.0.0.0", "--port", "30000", "--context-length", "131072"),
            *("--mem-fraction-static", "0.88", "--tp-size", "8", "--page-size", "64"),
            *("--kv-cache-dtype", "fp8_e4m3", "--disaggregation-mode", "prefill"),
            *("--disaggregation-transfer-backend", "mooncake"),
            *("--disaggregation-bootstrap-port", "8998", "--max-total-tokens", "500000"),
            *("--enable-metrics", "--disaggregation-enable-kv-checksum", "--kv-canary", "log"),
            *("--load-format", "dummy", "--skip-tokenizer-init", "--trust-remote-code"),
            *("--skip-server-warmup", "--log-level", "warning"),
        ]
    )
    assert launch["tp_size"] == 8
    assert launch["disaggregation_mode"] == "prefill"
    assert launch["kv_canary"] == "log"


def test_context_longer_than_the_model_derives_refuses_to_start_like_sglang() -> None:
    result = run_engine_cli("--model-path", "tiny-llama", "--context-length", "4096", "--port", "1")
    assert result.returncode == 1
    assert "User-specified context_length (4096) is greater than the derived" in result.stderr
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in result.stderr


def test_longer_context_is_allowed_with_sglangs_override_env() -> None:
    limits = compute_limits(
        resolve_model_config("tiny-llama"),
        gpu_memory_gib=0.01,
        tp=1,
        mem_fraction_static=0.85,
        kv_cache_dtype="auto",
        page_size=1,
        context_length=4096,
        max_total_tokens=None,
        max_running_requests=None,
        weights_gib=None,
        allow_longer_context=True,
        release=DEFAULT_VERSION,
    )
    assert limits.context_length == 4096
    assert limits.derived_context_length == 2048


def test_the_model_context_is_the_one_the_emulated_release_derives(tmp_path: Path) -> None:
    """Olmo3's linear rope factor still multiplies under transformers 5.12.1 (SGLang 0.5.19 to
    0.5.21) and not under 5.19.0 (0.5.22 on), so --context-length 8192 on a 4,096-token Olmo3
    starts on 0.5.21 and is refused on 0.5.22, as each release's own engine does."""
    olmo3 = {
        **TINY,
        "model_type": "olmo3",
        "max_position_embeddings": 4096,
        "rope_scaling": {"rope_type": "linear", "factor": 4.0},
    }
    (tmp_path / "config.json").write_text(json.dumps(olmo3))
    flags = ("--model-path", str(tmp_path), "--context-length", "8192", "--port", "1")
    newer = run_engine_cli(*flags, env={"KVGATE_ENGINE_VERSION": "0.5.22"})
    assert newer.returncode == 1
    assert "User-specified context_length (8192) is greater than the derived" in newer.stderr
    assert "derived context_length (4096)" in newer.stderr
    older = compute_limits(
        resolve_model_config(str(tmp_path)),
        gpu_memory_gib=80,
        tp=1,
        mem_fraction_static=0.85,
        kv_cache_dtype="auto",
        page_size=1,
        context_length=8192,
        max_total_tokens=None,
        max_running_requests=None,
        weights_gib=None,
        allow_longer_context=False,
        release="0.5.21",
    )
    assert (older.derived_context_length, older.context_length) == (16_384, 8192)


def test_gpu_too_small_for_the_weights_refuses_to_start_with_the_numbers() -> None:
    result = run_engine_cli(
        "--model-path", "llama-3.1-8b", "--mem-fraction-static", "0.85", "--port", "1",
        env={"KVGATE_GPU_MEMORY_GIB": "8"},
    )  # fmt: skip
    assert result.returncode == 1
    assert "KVGATE_GPU_MEMORY_GIB=8" in result.stderr
    assert "weights 14.96 GiB" in result.stderr


def test_model_path_resolves_a_directory_and_bundled_names(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "max_position_embeddings": 777}))
    assert resolve_model_config(str(tmp_path)).config["max_position_embeddings"] == 777
    assert resolve_model_config("meta-llama/Llama-3.1-8B-Instruct").name == "llama-3.1-8b"
    with pytest.raises(StartupError, match="no bundled config matches 'gpt-99'"):
        resolve_model_config("/models/gpt-99")


def test_pool_below_context_starts_with_a_lowered_max_req_input_len() -> None:
    limits = compute_limits(
        resolve_model_config("tiny-llama"),
        gpu_memory_gib=0.0005,
        tp=1,
        mem_fraction_static=0.85,
        kv_cache_dtype="auto",
        page_size=1,
        context_length=None,
        max_total_tokens=None,
        max_running_requests=None,
        weights_gib=None,
        allow_longer_context=False,
        release=DEFAULT_VERSION,
    )
    assert limits.kv_pool_tokens == 692
    assert limits.max_req_input_len == 692 - 1 - 5
    assert any("fewer than --context-length 2,048" in w for w in limits.warnings)


def test_incident_emulation_follows_the_version() -> None:
    """The leak ends with 0.5.20 (measured on the released engines: 0.5.19 answers an over-pool
    prompt with tokens, 0.5.20 sends decode no KV and fails it)."""
    assert emulates_incident("0.5.19", forced=False)
    assert not emulates_incident("0.5.20", forced=False)
    assert not emulates_incident("0.5.21", forced=False)
    assert not emulates_incident("0.5.23", forced=False)
    assert emulates_incident("0.5.23", forced=True)
    message = scheduler_check(800, 686)
    assert message is not None
    assert message.message == (
        "Input length (800 tokens) exceeds the maximum allowed length (686 tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )


# -- the paged pool and the model ----------------------------------------------------------------


def test_pool_costs_nothing_until_pages_are_used() -> None:
    pool = PagedKVPool(num_pages=1_000_000, page_size=1, k_dim=K_DIM, v_dim=V_DIM)
    assert pool.materialized_slots == 0
    pool.alloc(10)
    assert 10 <= pool.materialized_slots <= 4096
    assert pool.free_pages == 1_000_000 - 10


def test_freed_pages_keep_their_data_and_are_reused_lowest_first() -> None:
    model = CopyAttentionModel(vocab_size=1024)
    pool = PagedKVPool(num_pages=64, page_size=4, k_dim=K_DIM, v_dim=V_DIM)
    first = pool.alloc(8)
    keys, values = model.kv([11, 12, 13, 14, 15, 16, 17, 18])
    pool.write(pool.slots(first, 8), keys, values)
    pool.free(first)
    second = pool.alloc(8)
    assert second == first
    _, stale_values = pool.read(pool.slots(second, 8))
    assert stale_values[:, 0].tolist() == [11, 12, 13, 14, 15, 16, 17, 18]
    with pytest.raises(PoolExhausted):
        pool.alloc(64 * 4)


def test_model_copies_its_prompt_through_the_kv_cache() -> None:
    model = CopyAttentionModel(vocab_size=1024)
    prompt = [3, 900, 901, 902, 5]
    keys, values = model.kv(prompt)
    assert [model.decode_step(t, keys, values) for t in range(5)] == prompt


def test_model_reads_stale_slots_verbatim() -> None:
    model = CopyAttentionModel(vocab_size=1024)
    stale_keys, stale_values = model.kv([1, 2, 700, 701, 702, 703])
    fresh_keys, fresh_values = model.kv([0])
    stale_keys[0], stale_values[0] = fresh_keys[0], fresh_values[0]  # only slot 0 written
    output = [model.decode_step(t, stale_keys, stale_values) for t in range(6)]
    assert output == [0, 2, 700, 701, 702, 703]


# -- a live engine -------------------------------------------------------------------------------


async def test_server_info_reports_the_pool_the_estimator_predicts(
    engines: EngineLauncher,
) -> None:
    engine = await engines.start(
        "--mem-fraction-static", "0.85", "--page-size", "4", "--context-length", "2048",
        "--enable-metrics", "--served-model-name", "tiny",
        env={"KVGATE_GPU_MEMORY_GIB": "0.0005"},
    )  # fmt: skip
    expected = estimate_pool(TINY, gpu_memory_gib=0.0005, tp=1, page_size=4)
    status, info = await engines.get_json(f"{engine.url}/server_info")
    assert status == 200
    assert info["max_total_num_tokens"] == expected.kv_pool_tokens == 692
    assert info["internal_states"][0]["memory_usage"]["token_capacity"] == 692
    assert info["max_req_input_len"] == min(2048 - 1, 692 - 1) - 5
    assert info["version"] == "0.5.23"
    assert info["disaggregation_mode"] == "null"
    assert info["context_length"] == 2048
    assert info["page_size"] == 4
    assert info["mem_fraction_static"] == 0.85
    status, legacy = await engines.get_json(f"{engine.url}/get_server_info")
    assert status == 200
    assert legacy["max_total_num_tokens"] == 692

    status, models = await engines.get_json(f"{engine.url}/v1/models")
    assert models["data"][0] == {
        "id": "tiny",
        "object": "model",
        "created": models["data"][0]["created"],
        "owned_by": "sglang",
        "root": "tiny-llama",
        "parent": None,
        "max_model_len": 2048,
    }
    report = parse_report(info, models)
    assert report.kv_pool_tokens == 692
    assert report.effective_context_length == 2048
    assert report.role == "null"

    status, model_info = await engines.get_json(f"{engine.url}/model_info")
    assert model_info["architectures"] == ["LlamaForCausalLM"]
    assert (await engines.get_json(f"{engine.url}/get_model_info"))[0] == 200
    assert (await engines.get_json(f"{engine.url}/version"))[0] == 404
    status, metrics = await engines.get_json(f"{engine.url}/metrics")
    assert status == 200
    assert 'sglang:max_total_num_tokens{engine_type="unified"' in metrics
    assert "sglang:context_len" in metrics


async def test_unified_engine_answers_the_known_function_and_rejects_like_sglang(
    engines: EngineLauncher,
) -> None:
    engine = await engines.start(
        "--mem-fraction-static", "0.85", env={"KVGATE_GPU_MEMORY_GIB": "0.0005"}
    )
    prompt = [7, 300, 301, 302, 303, 9]
    ok = await engines.generate(
        engine, {"input_ids": prompt, "sampling_params": {"max_new_tokens": 4}}
    )
    assert ok.status == 200
    assert ok.body["output_ids"] == [7, 300, 301, 302]
    assert ok.body["meta_info"]["finish_reason"] == {"type": "length", "length": 4}
    assert "text" not in ok.body  # --skip-tokenizer-init

    too_long = await engines.generate(
        engine, {"input_ids": [5] * 700, "sampling_params": {"max_new_tokens": 4}}
    )
    assert too_long.status == 400
    assert too_long.body["error"]["message"].startswith("Input length (700 tokens) exceeds")

    beyond_context = await engines.generate(engine, {"input_ids": [5] * 2048})
    assert beyond_context.status == 400
    assert "longer than the model's context length (2048 tokens)" in str(beyond_context.body)

    out_of_vocab = await engines.generate(engine, {"input_ids": [1, 5000]})
    assert out_of_vocab.status == 400
    assert "input_ids[1] = 5000 is not a token id of this model (0..1,023)" in str(
        out_of_vocab.body
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine.url}/generate", data=b"{not json") as response,
    ):
        assert response.status == 400

    batch = await engines.generate(engine, {"input_ids": [[1, 2], [3]]})
    assert batch.status == 400
    assert "batch requests are not supported" in batch.body["error"]["message"]
    status, _ = await engines.get_json(f"{engine.url}/metrics")
    assert status == 404  # only with --enable-metrics


async def test_text_in_text_out_on_native_and_openai_endpoints(engines: EngineLauncher) -> None:
    engine = await engines.start(skip_tokenizer_init=False, env={"KVGATE_GPU_MEMORY_GIB": "0.001"})
    native = await engines.generate(
        engine, {"text": "hello, kvgate", "sampling_params": {"max_new_tokens": 5}}
    )
    assert native.status == 200, native.body
    assert native.body["text"] == "hello"

    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{engine.url}/v1/completions",
            json={"model": "tiny-llama", "prompt": "known answer", "max_tokens": 5},
        ) as response:
            completion = await response.json()
        async with session.post(
            f"{engine.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "ping pong"}], "max_tokens": 4},
        ) as response:
            chat = await response.json()
    assert completion["choices"][0]["text"] == "known"
    assert completion["usage"] == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "ping"}


async def test_engine_binds_exactly_the_host_it_is_given(engines: EngineLauncher) -> None:
    engine = await engines.start(host="127.0.0.77")
    assert (await engines.get_json(f"{engine.url}/ready"))[0] == 200
    with pytest.raises(aiohttp.ClientConnectionError):
        await engines.get_json(f"http://127.0.0.1:{engine.port}/ready")


async def test_sigterm_stops_the_engine_cleanly(engines: EngineLauncher) -> None:
    engine = await engines.start()
    started = time.monotonic()
    assert engines.stop(engine) == 0
    assert time.monotonic() - started < 10
    assert "SIGTERM" in engine.log()


async def test_an_engine_started_with_keys_reports_them_and_guards_its_routes_as_sglang(
    engines: EngineLauncher,
) -> None:
    from kvgate_engine.probe import fetch_report
    from kvgate_engine.report import EngineReport

    api_key, admin_key, password = "ref-api-5u7", "ref-admin-2k9", "ref-ssl-8p1"
    engine = await engines.start(
        *("--api-key", api_key, f"--admin-api-key={admin_key}"),
        *("--ssl-keyfile-password", password, "--context-length", "2048"),
    )
    async with aiohttp.ClientSession() as session:

        async def get(path: str, key: str | None) -> tuple[int, Any]:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with session.get(f"{engine.url}{path}", headers=headers) as response:
                return response.status, await response.json(content_type=None)

        # SGLang's NORMAL routes need the API key (the admin key does not open them) ...
        for path in ("/server_info", "/get_server_info", "/v1/models", "/model_info"):
            assert (await get(path, None)) == (401, {"error": "Unauthorized"}), path
            assert (await get(path, admin_key))[0] == 401, path
            assert (await get(path, api_key))[0] == 200, path
        # ... and /health, /ready never do (Kubernetes probes carry no key).
        assert (await get("/health", None))[0] == 200
        _, info = await get("/server_info", api_key)

    # What SGLang 0.5.23 reports (sglang/srt/utils/common.py build_server_info): the secrets in
    # their fields, in the DP rank's state, and in launch_command.
    for doc in (info, info["internal_states"][0]):
        assert (doc["api_key"], doc["admin_api_key"]) == (api_key, admin_key)
        assert doc["ssl_keyfile_password"] == password
    assert f"--api-key {api_key}" in info["launch_command"]
    assert f"--admin-api-key={admin_key}" in info["launch_command"]

    report = await fetch_report(engine.url, api_key=api_key)
    assert isinstance(report, EngineReport) and report.kv_pool_tokens is not None
    for secret in (api_key, admin_key, password):
        assert secret not in repr(report)
