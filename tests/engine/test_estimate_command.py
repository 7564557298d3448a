"""`kvgate estimate`: predicted KV pool from config.json; 1 when weights leave no room."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from factories.model_configs import model_config
from kvgate.cmd.cli import main

LLAMA_31_8B = model_config("llama-3.1-8b")
DEEPSEEK_V3_MLA: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_hidden_layers": 61,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "max_position_embeddings": 163840,
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def llama(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_31_8B))
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["estimate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_pool_bytes_per_token_and_context(
    capsys: pytest.CaptureFixture[str], llama: str
) -> None:
    """(81 GiB − 1 GiB reserved by default) × 0.85 − 15 GiB = 53 GiB;
    53 × 2^30 / 131,072 bytes = 434,176 tokens."""
    code, out, _ = run(
        capsys,
        "--config",
        llama,
        "--gpu-memory-gib",
        "81",
        "--tp",
        "1",
        "--weights-gib",
        "15",
        "--json",
    )
    result = json.loads(out)
    assert code == 0
    assert (result["kv_pool_tokens"], result["bytes_per_token"], result["context_length"]) == (
        434_176,
        131_072,
        131_072,
    )
    assert result["pool_holds_context"] is True
    assert result["attention"] == "MHA"


def test_weights_are_computed_from_a_llama_config(
    capsys: pytest.CaptureFixture[str], llama: str
) -> None:
    """8,030,261,248 params × 2 bytes = 14.96 GiB; (68 × 2^30 − 16,060,522,496) // 131,072."""
    code, out, _ = run(capsys, "--config", llama, "--gpu-memory-gib", "81", "--tp", "1")
    assert code == 0
    assert out.splitlines()[0] == "KV pool: 434,523 tokens per engine (estimate; verify live)"
    assert "weights 14.96 GiB / TP 1" in out


def test_human_output_warns_when_the_pool_is_below_the_models_context(
    capsys: pytest.CaptureFixture[str], llama: str
) -> None:
    """24 GiB × 0.85 − 15 GiB = 5.4 GiB → 44,236 tokens (5.4 × 8,192 = 44,236.8)."""
    code, out, _ = run(
        capsys, "--config", llama, "--gpu-memory-gib", "25", "--tp", "1", "--weights-gib", "15"
    )
    assert code == 0
    assert "KV pool: 44,236 tokens" in out
    assert "fewer than the model's 131,072-token context" in out


def test_weights_that_leave_no_room_exit_1_with_numbers(
    capsys: pytest.CaptureFixture[str], llama: str
) -> None:
    code, _, err = run(
        capsys, "--config", llama, "--gpu-memory-gib", "17", "--tp", "1", "--weights-gib", "15"
    )
    assert code == 1
    budget = "(17.0 GiB − reserved 1 GiB) × mem-fraction-static 0.85"
    assert f"weights leave no room for the KV cache: {budget}" in err
    assert "leaving -1.40 GiB" in err


def test_no_room_json_exits_1(capsys: pytest.CaptureFixture[str], llama: str) -> None:
    code, out, _ = run(
        capsys,
        "--config",
        llama,
        "--gpu-memory-gib",
        "17",
        "--tp",
        "1",
        "--weights-gib",
        "15",
        "--json",
    )
    assert code == 1
    assert json.loads(out)["exit_code"] == 1


def test_mla_without_weights_asks_for_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V3_MLA))
    code, _, err = run(capsys, "--config", str(path), "--gpu-memory-gib", "141", "--tp", "8")
    assert code == 2
    assert "pass the weight size of one replica with --weights-gib" in err


def test_mla_with_fp8_kv_and_weights(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """(512 + 64) × 61 × 1 byte = 35,136 bytes; usable (142 − 1) × 0.88 − 640 / 8 = 44.08 GiB
    → 1,347,066 tokens."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V3_MLA))
    code, out, _ = run(
        capsys,
        "--config",
        str(path),
        "--gpu-memory-gib",
        "142",
        "--tp",
        "8",
        "--mem-fraction-static",
        "0.88",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--weights-gib",
        "640",
        "--json",
    )
    result = json.loads(out)
    assert code == 0
    assert (result["attention"], result["bytes_per_token"], result["kv_pool_tokens"]) == (
        "MLA",
        35_136,
        1_347_066,
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "is not JSON"),
        ("[1, 2]", "is not a JSON object"),
        (None, "--config: cannot read "),
    ],
)
def test_unreadable_config_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    code, _, err = run(capsys, "--config", str(path), "--gpu-memory-gib", "81", "--tp", "1")
    assert code == 2
    assert message in err


def test_page_size_and_cap_are_applied(capsys: pytest.CaptureFixture[str], llama: str) -> None:
    code, out, _ = run(
        capsys,
        "--config",
        llama,
        "--gpu-memory-gib",
        "81",
        "--tp",
        "1",
        "--weights-gib",
        "15.001",
        "--page-size",
        "64",
        "--max-total-tokens",
        "500000",
        "--json",
    )
    assert code == 0
    assert json.loads(out)["kv_pool_tokens"] == 434_112  # 6,783 pages of 64


# --- bad input: exit 2 naming the flag, the value and the way out --------------------------------


def test_a_binary_config_exits_2_naming_the_flag_and_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(bytes(range(0xF5, 0x100)) + bytes(range(256)))
    code, out, err = run(capsys, "--config", str(path), "--gpu-memory-gib", "80", "--tp", "1")
    assert code == 2
    assert out == ""
    assert err == (
        f"kvgate estimate: --config: {path} is not UTF-8 text (byte 0xf5 at offset 0: a binary "
        "file?); pass the model's config.json\n"
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (
            ["--gpu-memory-gib", "inf", "--tp", "1"],
            "--gpu-memory-gib: must be a finite number of GiB above 0 and at most 16,384 (got "
            "inf); give the memory of one GPU, e.g. 80",
        ),
        (
            ["--gpu-memory-gib", "80", "--tp", "1", "--weights-gib", "-15"],
            "--weights-gib: must be a finite number of GiB above 0 (got -15); give the weight "
            "size of one replica, e.g. 15",
        ),
        (
            ["--gpu-memory-gib", "80", "--tp", "1000000"],
            "--tp: must be between 1 and 512 GPUs per engine (16 per node on at most 32 nodes) "
            "(got 1,000,000); e.g. 1, 2, 4 or 8",
        ),
        (
            ["--gpu-memory-gib", "80", "--tp", "3"],
            "--tp: 3 does not divide the model's 32 attention heads (num_attention_heads); "
            "SGLang asserts num_attention_heads % tp_size == 0 and the engine does not start; "
            "use one that divides 32: 1, 2, 4, 8, 16 or 32",
        ),
        (
            ["--gpu-memory-gib", "80", "--tp", "1", "--kv-cache-dtype", "float16"],
            "--kv-cache-dtype: float16 is not accepted by any SGLang release kvgate supports "
            "(0.5.19 to 0.5.23; the engine exits 2 at start-up); use one of auto, fp8_e5m2, "
            "fp8_e4m3, mxfp8, bf16, bfloat16",
        ),
        (
            ["--gpu-memory-gib", "80", "--tp", "1", "--max-total-tokens", "0"],
            "--max-total-tokens: must be 1 or more (got 0); leave it out to keep SGLang's pool",
        ),
    ],
    ids=[
        "infinite GPU",
        "negative weights",
        "TP of a million",
        "TP 3 of 32 heads",
        "float16",
        "cap 0",
    ],
)
def test_a_value_sglang_or_kvgate_would_refuse_exits_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], llama: str, argv: list[str], words: str
) -> None:
    code, out, err = run(capsys, "--config", llama, "--weights-gib", "15", *argv)
    assert code == 2
    assert out == ""
    assert err == f"kvgate estimate: {words}\n"


def test_a_tp_that_splits_the_kv_heads_unevenly_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """48 heads split 16 ways is fine; 12 KV heads neither split nor replicate over 16 ranks."""
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({**LLAMA_31_8B, "num_attention_heads": 48, "num_key_value_heads": 12})
    )
    code, _, err = run(
        capsys, "--config", str(path), "--gpu-memory-gib", "80", "--tp", "16", "--weights-gib", "15"
    )
    assert code == 2
    assert err.startswith(
        "kvgate estimate: --tp: 16 and the model's 12 KV heads (num_key_value_heads) do not "
        "divide one another"
    )


def test_an_architecture_kvgate_does_not_model_is_sized_with_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA_31_8B, "architectures": ["FooForCausalLM"]}))
    argv = ["--config", str(path), "--gpu-memory-gib", "80", "--tp", "1", "--weights-gib", "15"]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    note = (
        "FooForCausalLM is not an architecture kvgate models; its KV pool is estimated as "
        "standard attention (MHA/GQA: num_key_value_heads × head_dim × num_hidden_layers), "
        "which may be wrong for it; verify a live engine (kvgate verify)"
    )
    assert f"  note: {note}\n" in out
    code, out, _ = run(capsys, *argv, "--json")
    assert json.loads(out)["notes"] == [note]
    code, out, _ = run(capsys, "--config", llama_config_path(tmp_path), *argv[2:], "--json")
    assert json.loads(out)["notes"] == []


def llama_config_path(tmp_path: Path) -> str:
    path = tmp_path / "llama.json"
    path.write_text(json.dumps(LLAMA_31_8B))
    return str(path)


def test_json_has_the_schema_version_and_errors_are_objects_naming_the_input(
    capsys: pytest.CaptureFixture[str], llama: str, tmp_path: Path
) -> None:
    code, out, _ = run(
        capsys,
        "--config",
        llama,
        "--gpu-memory-gib",
        "80",
        "--tp",
        "1",
        "--weights-gib",
        "15",
        "--json",
    )
    payload = json.loads(out)
    assert (
        payload["schemaVersion"],
        payload["command"],
        payload["exit_code"],
        payload["error"],
    ) == (
        1,
        "estimate",
        0,
        None,
    )
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    code, out, err = run(
        capsys, "--config", str(binary), "--gpu-memory-gib", "80", "--tp", "1", "--json"
    )
    assert code == 2 and err == ""
    assert json.loads(out) == {
        "schemaVersion": 1,
        "command": "estimate",
        "exit_code": 2,
        "error": {
            "input": "--config",
            "message": f"{binary} is not UTF-8 text (byte 0xff at offset 0: a binary file?); "
            "pass the model's config.json",
        },
    }


def _llama4_scout(tmp_path: Path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(model_config("llama-4-scout-17b-16e")))
    return str(path)


def test_llama4_is_estimated_with_its_chunked_pool(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """SGLang 0.5.19 and 0.5.23 size Scout on 8 × 80 GiB (H100) with 203 GiB of weights at
    2,147,267 full and 1,717,813 chunked tokens (tests/fixtures/sglang_pools/llama4.json)."""
    argv = ["--config", _llama4_scout(tmp_path), "--gpu-memory-gib", "80", "--tp", "8"]
    argv += ["--weights-gib", "203", "--gpu-arch", "sm90"]
    code, out, _ = run(capsys, *argv, "--json")
    result = json.loads(out)
    assert code == 0
    assert (result["kv_pool_tokens"], result["swa_pool_tokens"]) == (2_147_267, 1_717_813)
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "sliding-window layers' pool: 1,717,813 tokens" in out


def test_llama4_whose_chunked_pool_sglang_refuses_exits_1_with_the_numbers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Scout on 4 × 80 GiB at mem-fraction-static 0.647: SGLang refuses its 7,463-token chunked
    pool (≤ 8,192 + page 1); kvgate prints the numbers, not an estimate."""
    code, out, err = run(
        capsys,
        *("--config", _llama4_scout(tmp_path), "--gpu-memory-gib", "80", "--tp", "4"),
        *("--weights-gib", "203", "--mem-fraction-static", "0.647", "--gpu-arch", "sm90"),
    )
    assert code == 1 and out == ""
    assert "--mem-fraction-static: the sliding-window pool (7,463 tokens" in err, err
    assert "8,192 + page 1" in err and "--swa-full-tokens-ratio" in err, err
