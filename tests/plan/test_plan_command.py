"""`kvgate plan`: every flag, every error (field, numbers, way out) and its exit code."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from factories.model_configs import model_config
from kvgate.admission import check_document
from kvgate.cmd.cli import main

from .models import (
    DEEPSEEK_V3,
    LLAMA_31_8B,
    LLAMA_70B_CONFIG,
    MAMBA,
    QWEN3_4B,
    SAMPLE,
    mutated,
    sample,
)

LLAMA_70B = str(LLAMA_70B_CONFIG)
KVGATE = Path(sys.executable).parent / "kvgate"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code, out, _ = run(capsys, *argv, "--json")
    payload: dict[str, Any] = json.loads(out)
    assert payload["exit_code"] == code
    return code, payload


def write(tmp_path: Path, name: str, content: Any) -> str:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return str(path)


def shapes(payload: dict[str, Any]) -> list[tuple[float, int, str, float]]:
    return [
        (s["gpu_memory_gib"], s["tp"], s["kv_cache_dtype"], s["mem_fraction_static"])
        for s in payload["shapes"]
    ]


# --- the search --------------------------------------------------------------------------------


def test_table_lists_every_shape_and_the_cheapest_that_hold_the_context(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(
        capsys,
        "--config",
        LLAMA_70B,
        "--weights-gib",
        "131.5",
        "--gpu-memory-gib",
        "80",
        "141",
        "--context-length",
        "131072",
    )
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("LlamaForCausalLM: weights 131.50 GiB per replica")
    assert "largest safe contextLength" in lines[1] and "holds 131,072" in lines[1]
    rows = [line for line in lines if line.lstrip().startswith(("80 ", "141 "))]
    assert len(rows) == 2 * 4 * 2  # GPU sizes × default TP 1,2,4,8 × default auto,fp8_e4m3
    assert any("no room" in row for row in rows)
    assert "shapes with the fewest GPUs that hold contextLength 131,072 × headroom 1.0" in out
    assert "  1. 141 GiB × TP 2, fp8_e4m3, mem 0.85: 2 GPU(s) per engine" in out


def test_json_carries_every_shape_and_the_cheapest_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, payload = run_json(
        capsys, "--config", LLAMA_70B, "--gpu-memory-gib", "80,141", "--context-length", "131072"
    )
    assert code == 0
    assert payload["model"] == {
        "architecture": "LlamaForCausalLM",
        "weights_gib": pytest.approx(131.4165, abs=1e-3),  # computed from config.json
        "context_length": 131_072,
    }
    assert payload["required_pool_tokens"] == 131_072
    assert len(payload["shapes"]) == 16
    cheapest = payload["cheapest"]
    assert all(s["holds"] for s in cheapest)
    assert [s["gpus"] for s in cheapest] == sorted(s["gpus"] for s in cheapest)
    assert (cheapest[0]["gpu_memory_gib"], cheapest[0]["tp"]) == (141.0, 2)
    held = {(s["gpu_memory_gib"], s["tp"], s["kv_cache_dtype"]) for s in cheapest}
    assert held == {
        (s["gpu_memory_gib"], s["tp"], s["kv_cache_dtype"])
        for s in payload["shapes"]
        if s["kv_pool_tokens"] >= 131_072
    }


def test_each_search_flag_sets_its_axis(capsys: pytest.CaptureFixture[str]) -> None:
    code, payload = run_json(
        capsys,
        "--config",
        LLAMA_70B,
        "--gpu-memory-gib",
        "141",
        "--tp",
        "2,4",
        "8",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--mem-fraction-static",
        "0.8,0.9",
    )
    assert code == 0
    assert shapes(payload) == [
        (141.0, tp, "fp8_e4m3", fraction) for tp in (2, 4, 8) for fraction in (0.8, 0.9)
    ]
    assert payload["context_length"] is None
    assert all(s["holds"] is None and s["margin"] is None for s in payload["shapes"])
    assert payload["cheapest"] == []


def test_weights_gib_sets_the_weights_and_shrinks_the_pool(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = (
        "--config",
        LLAMA_70B,
        "--gpu-memory-gib",
        "141",
        "--tp",
        "2",
        "--kv-cache-dtype",
        "auto",
    )
    _, derived = run_json(capsys, *argv)
    _, heavier = run_json(capsys, *argv, "--weights-gib", "150")
    assert heavier["model"]["weights_gib"] == 150
    assert heavier["shapes"][0]["kv_pool_tokens"] < derived["shapes"][0]["kv_pool_tokens"]


def test_headroom_raises_the_requirement_and_lowers_the_largest_safe_context(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = (
        "--config",
        LLAMA_70B,
        "--gpu-memory-gib",
        "80",
        "--tp",
        "2",
        "--kv-cache-dtype",
        "auto",
    )
    _, plain = run_json(capsys, *argv, "--context-length", "10000")
    _, padded = run_json(capsys, *argv, "--context-length", "10000", "--headroom", "1.25")
    assert plain["required_pool_tokens"] == 10_000
    assert padded["required_pool_tokens"] == 12_500
    pool = plain["shapes"][0]["kv_pool_tokens"]  # 15,019 tokens: the pool binds
    assert plain["shapes"][0]["largest_safe_context_length"] == pool
    assert padded["shapes"][0]["largest_safe_context_length"] == int(pool / 1.25)
    assert padded["shapes"][0]["margin"] < plain["shapes"][0]["margin"]


def test_page_size_rounds_the_pool_down_to_whole_pages(capsys: pytest.CaptureFixture[str]) -> None:
    argv = (
        "--config",
        LLAMA_70B,
        "--gpu-memory-gib",
        "80",
        "--tp",
        "2",
        "--kv-cache-dtype",
        "auto",
    )
    _, one = run_json(capsys, *argv)
    _, paged = run_json(capsys, *argv, "--page-size", "64")
    assert paged["page_size"] == 64
    assert paged["shapes"][0]["kv_pool_tokens"] == one["shapes"][0]["kv_pool_tokens"] // 64 * 64


def test_the_models_own_limit_caps_the_largest_safe_context(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--config", LLAMA_70B, "--gpu-memory-gib", "141", "--tp", "8")
    assert code == 0
    assert "131,072  model limit" in out


# --- what has no answer: exit 1 ----------------------------------------------------------------


def test_a_context_no_shape_holds_exits_1_with_the_best_and_the_way_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(
        capsys,
        "--config",
        LLAMA_70B,
        "--gpu-memory-gib",
        "80",
        "--tp",
        "2",
        "--context-length",
        "100000",
    )
    assert code == 1
    assert "80 GiB" not in err.split("no shape")[0]
    assert (
        "kvgate plan: --context-length: no shape searched holds contextLength 100,000 × "
        "headroom 1.0 = 100,000 pool tokens; the most any holds is 18,897 "
        "(80 GiB × TP 2, fp8_e4m3, mem 0.85); add larger --tp values or bigger "
        "--gpu-memory-gib, try --kv-cache-dtype fp8_e4m3, or advertise at most 18,897"
    ) in err
    assert "no " in out  # the table is still printed, each row saying it does not hold


def test_a_context_beyond_the_model_says_the_models_limit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, payload = run_json(capsys, "--config", LLAMA_70B, "--context-length", "1048576")
    assert code == 1
    assert payload["error"]["input"] == "--context-length"
    assert "the model's config supports at most 131,072 tokens" in payload["error"]["message"]
    assert payload["cheapest"] == []


def test_weights_that_fit_nowhere_exit_1_naming_the_numbers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run(capsys, "--config", LLAMA_70B, "--gpu-memory-gib", "80", "--tp", "1")
    assert code == 1
    assert err.strip() == (
        "kvgate plan: --weights-gib: weights 131.42 GiB leave no room for a KV pool on any "
        "shape searched; the roomiest, 80 GiB × TP 1, auto, mem 0.85, has 80 × 0.85 = 68.00 GiB "
        "per GPU for 131.42 GiB of weights per GPU; add larger --tp values, bigger "
        "--gpu-memory-gib, or a higher --mem-fraction-static"
    )


# --- usage and input errors: exit 2 ------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "argv", "words"),
    [
        (MAMBA, ["--weights-gib", "5"], ["--config: cannot size the KV cache of MambaForCausalLM"]),
        (DEEPSEEK_V3, [], ["--weights-gib: the weights of DeepseekV3ForCausalLM", "--weights-gib"]),
        (
            LLAMA_31_8B,
            ["--tp", "3,5"],
            ["--tp: the search space is empty: TP 3 does not divide num_attention_heads 32"],
        ),
        (LLAMA_31_8B, ["--tp", ","], ["--tp: the search space is empty"]),
        (LLAMA_31_8B, ["--tp", "two"], ["--tp: 'two' is not an integer; e.g. --tp 1,2,4,8"]),
        (
            LLAMA_31_8B,
            ["--gpu-memory-gib", "-80"],
            [
                "--gpu-memory-gib: must be a finite number of GiB above 0 and at most 16,384 "
                "(got -80)"
            ],
        ),
        (
            LLAMA_31_8B,
            ["--kv-cache-dtype", "int4"],
            ["--kv-cache-dtype: int4 is not accepted by any SGLang release"],
        ),
        (
            LLAMA_31_8B,
            ["--mem-fraction-static", "1.5"],
            ["--mem-fraction-static: must be between 0 and 1, exclusive (got 1.5)"],
        ),
        (
            LLAMA_31_8B,
            ["--headroom", "0.5"],
            ["--headroom: must be a finite number >= 1.0 (got 0.5)"],
        ),
        (LLAMA_31_8B, ["--context-length", "-1"], ["--context-length: must be 1 or more (got -1)"]),
        (LLAMA_31_8B, ["--page-size", "0"], ["--page-size: must be 1 or more (got 0)"]),
        (
            LLAMA_31_8B,
            ["--weights-gib", "0"],
            ["--weights-gib: must be a finite number of GiB above 0 (got 0)"],
        ),
        (
            LLAMA_31_8B,
            ["--kv-cache-dtype", "float16"],
            ["--kv-cache-dtype: float16 is not accepted by any SGLang release kvgate supports"],
        ),
        (
            LLAMA_31_8B,
            ["--headroom", "1e308", "--context-length", "131072"],
            [
                "--headroom: contextLength 131,072 × headroom 1e+308 is too large to compute; "
                "lower --context-length or --headroom"
            ],
        ),
    ],
)
def test_bad_input_exits_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    config: dict[str, Any],
    argv: list[str],
    words: list[str],
) -> None:
    path = write(tmp_path, "config.json", config)
    code, out, err = run(capsys, "--config", path, *argv)
    assert code == 2
    assert out == ""
    for word in words:
        assert word in err
    code, payload = run_json(capsys, "--config", path, *argv)
    assert code == 2 and words[0] in f"{payload['error']['input']}: {payload['error']['message']}"


def test_unreadable_config_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "--config", str(tmp_path / "missing.json"))
    assert code == 2 and "--config: cannot read" in err
    code, _, err = run(capsys, "--config", write(tmp_path, "bad.json", "{nope"))
    assert code == 2 and "is not JSON" in err
    code, _, err = run(capsys, "--config", write(tmp_path, "list.json", [1, 2]))
    assert code == 2 and "is not a JSON object" in err


def test_neither_config_nor_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys)
    assert code == 2
    assert "pass --config config.json (a search) or -f modeldeployment.yaml" in err


# --- -f: an existing ModelDeployment ------------------------------------------------------------


def test_file_whose_roles_hold_their_context_exits_0(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, _ = run(capsys, "-f", write(tmp_path, "md.yaml", yaml.safe_dump(mutated({}))))
    assert code == 0
    assert "ModelDeployment/llama-8b: contextLength 131,072 × headroom 1.0" in out
    assert "  decode (80 GiB × TP 1, auto, mem 0.85): KV pool 434,176 tokens, holds it" in out


def test_file_with_a_short_role_says_how_far_and_the_single_change_that_fixes_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = mutated({"spec.decode.gpuMemoryGiB": 24})
    path = write(tmp_path, "md.yaml", yaml.safe_dump(doc))
    code, out, _ = run(capsys, "-f", path)
    assert code == 1
    assert (
        "  decode (24 GiB × TP 1, auto, mem 0.85): KV pool 44,236 tokens, short by 86,836 tokens; "
        "largest safe contextLength on this shape 44,236\n"
        "    estimated with gpuReservedGiB 0 from spec.decode.gpuReservedGiB\n"
        "    fix: decode.gpuMemoryGiB 40 (estimated pool 155,648 tokens)\n"
        "    or:  decode.tensorParallel 2 (estimated pool 211,353 tokens)\n"
        "    or:  model.contextLength 44,236\n"
    ) in out
    assert "prefill (80 GiB × TP 1, auto, mem 0.85): KV pool 434,176 tokens, holds it" in out

    code, payload = run_json(capsys, "-f", path)
    decode = payload["documents"][0]["roles"]["decode"]
    assert decode["holds"] is False and decode["short_by_tokens"] == 86_836
    assert decode["fixes"][0] == {
        "field": "gpuMemoryGiB",
        "value": 40.0,
        "kv_pool_tokens": 155_648,
        "gpus": 1,
        "new_hardware": True,
    }


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"spec.model.config": None}, "spec.model.config is not set"),
        ({"spec.decode.gpuMemoryGiB": None}, "spec.decode.gpuMemoryGiB is not set"),
        ({"spec.model.config": MAMBA}, "--config: cannot size the KV cache of MambaForCausalLM"),
        ({"spec.decode.replicas": -1}, "is not a valid ModelDeployment: spec.decode.replicas"),
    ],
)
def test_file_that_cannot_be_planned_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, changes: dict[str, Any], words: str
) -> None:
    doc = mutated(changes)
    for key in [k for k, v in changes.items() if v is None]:
        *parents, last = key.split(".")
        node = doc
        for parent in parents:
            node = node[parent]
        del node[last]
    code, _, err = run(capsys, "-f", write(tmp_path, "md.yaml", yaml.safe_dump(doc)))
    assert code == 2
    assert words in err


def test_file_weights_come_from_the_spec_or_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = sample()
    doc["spec"]["model"]["config"] = DEEPSEEK_V3
    del doc["spec"]["model"]["weightsGiB"]
    path = write(tmp_path, "md.yaml", yaml.safe_dump(doc))
    code, _, err = run(capsys, "-f", path)
    assert code == 2 and "spec.model.weightsGiB: the weights of DeepseekV3ForCausalLM" in err
    code, payload = run_json(capsys, "-f", path, "--weights-gib", "642")
    assert code == 1  # 642 GiB of weights on one 80 GiB GPU
    assert payload["documents"][0]["roles"]["decode"]["kv_pool_tokens"] == 0


def test_file_rejects_search_flags(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "-f", str(SAMPLE), "--tp", "2", "--headroom", "1.2")
    assert code == 2
    assert "-f plans the ModelDeployment's own shapes; drop --tp, --headroom" in err


def test_file_that_cannot_be_read_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, _, err = run(capsys, "-f", str(tmp_path / "nope.yaml"))
    assert code == 2 and "-f: cannot read" in err
    code, _, err = run(capsys, "-f", write(tmp_path, "empty.yaml", "---\n"))
    assert code == 2 and "holds no document" in err


def test_a_gpu_size_no_gpu_has_exits_2_at_once_instead_of_searching_for_ever(
    tmp_path: Path,
) -> None:
    """1e25 GiB made a pool of 10^30 tokens, and the search for its largest safe context stepped
    one token at a time (it never returned for Qwen3-4B)."""
    config = write(tmp_path, "config.json", QWEN3_4B)
    done = subprocess.run(
        [str(KVGATE), "plan", "--config", config, "--weights-gib", "8", "--gpu-memory-gib", "1e25"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "kvgate plan: --gpu-memory-gib: must be a finite number of GiB above 0 and at most "
        "16,384 (got 1e+25); give the memory of one GPU, e.g. 80\n"
    )


def test_a_binary_config_exits_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(b"\x00\xff" * 100)
    code, out, err = run(capsys, "--config", str(path))
    assert (code, out) == (2, "")
    assert err == (
        f"kvgate plan: --config: {path} is not UTF-8 text (byte 0xff at offset 1: a binary "
        "file?); pass the model's config.json\n"
    )


def test_a_yaml_alias_bomb_given_to_f_is_refused_unexpanded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    lines = ["x: &a0 [" + ",".join(["lol"] * 10) + "]"]
    lines += [f"x{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 6)]
    path = write(tmp_path, "md.yaml", "\n".join(lines) + "\n" + SAMPLE.read_text())
    started = time.process_time()  # CPU: the load of a shared machine is not the claim
    code, out, err = run(capsys, "-f", path)
    assert (code, out) == (2, "")
    assert err.startswith(f"kvgate plan: -f: {path}: document 1 expands to more than 65,536 values")
    assert time.process_time() - started < 1.0


def test_a_file_whose_tensor_parallel_does_not_divide_the_heads_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(tmp_path, "md.yaml", yaml.safe_dump(mutated({"spec.decode.tensorParallel": 3})))
    code, _, err = run(capsys, "-f", path)
    assert code == 2
    assert (
        "ModelDeployment/llama-8b: spec.decode.tensorParallel: 3 does not divide the model's 32 "
        "attention heads"
    ) in err


def test_an_architecture_kvgate_does_not_model_is_planned_with_a_note(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = write(tmp_path, "config.json", {**LLAMA_31_8B, "architectures": ["FooForCausalLM"]})
    argv = ("--config", config, "--weights-gib", "15", "--gpu-memory-gib", "80", "--tp", "1")
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert "note: FooForCausalLM is not an architecture kvgate models" in out
    _, payload = run_json(capsys, *argv)
    assert payload["notes"][0].endswith("; verify a live engine (kvgate verify)")
    _, payload = run_json(capsys, "--config", write(tmp_path, "llama.json", LLAMA_31_8B))
    assert payload["notes"] == []


def test_json_has_the_schema_version_and_errors_are_objects(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for argv in (["--config", LLAMA_70B], ["-f", str(SAMPLE)]):
        code, payload = run_json(capsys, *argv)
        assert (payload["schemaVersion"], payload["command"], payload["error"]) == (1, "plan", None)
    code, payload = run_json(capsys, "--config", LLAMA_70B, "--headroom", "inf")
    assert code == 2
    assert payload == {
        "schemaVersion": 1,
        "command": "plan",
        "exit_code": 2,
        "error": {
            "input": "--headroom",
            "message": "must be a finite number >= 1.0 (got inf); the pool must hold the "
            "context: 1.0 or more, e.g. 1.2",
        },
    }


# --- --plot --------------------------------------------------------------------------------------

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
UNSAFE_RGB = (0xD6, 0x27, 0x28)


def _unsafe_pixels(path: Path) -> int:
    import matplotlib.pyplot as plt
    import numpy as np

    pixels = (plt.imread(path)[:, :, :3] * 255).round().astype(int)
    return int(np.all(pixels == np.array(UNSAFE_RGB), axis=-1).sum())


def test_plot_writes_a_png_that_changes_with_the_inputs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    small, large, safe = tmp_path / "small.png", tmp_path / "large.png", tmp_path / "safe.png"
    base = ("--config", LLAMA_70B, "--context-length", "131072")
    assert run(capsys, *base, "--gpu-memory-gib", "80", "--plot", str(small))[0] == 0
    assert run(capsys, *base, "--gpu-memory-gib", "80", "141", "--plot", str(large))[0] == 0
    code = run(capsys, *base, "--gpu-memory-gib", "141", "--tp", "4,8", "--plot", str(safe))[0]
    assert code == 0
    for path in (small, large, safe):
        assert path.read_bytes()[:8] == PNG_MAGIC
    assert small.read_bytes() != large.read_bytes()
    assert large.stat().st_size > small.stat().st_size  # twice the bars, a wider picture
    assert _unsafe_pixels(small) > 0  # TP 1 and TP 2 on 80 GiB are marked unsafe
    assert _unsafe_pixels(safe) == 0  # every shape holds: nothing is marked
    # The same plan draws the same bytes.
    again = tmp_path / "again.png"
    run(capsys, *base, "--gpu-memory-gib", "80", "--plot", str(again))
    assert again.read_bytes() == small.read_bytes()


def test_plot_of_a_file_draws_its_roles(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    picture = tmp_path / "roles.png"
    path = write(tmp_path, "md.yaml", yaml.safe_dump(mutated({"spec.decode.gpuMemoryGiB": 24})))
    assert run(capsys, "-f", path, "--plot", str(picture))[0] == 1
    assert picture.read_bytes()[:8] == PNG_MAGIC
    assert _unsafe_pixels(picture) > 0


def test_plot_without_matplotlib_exits_2_with_the_install_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib → ImportError
    picture = tmp_path / "plan.png"
    code, out, err = run(capsys, "--config", LLAMA_70B, "--plot", str(picture))
    assert code == 2
    assert out == ""
    assert (
        "kvgate plan: --plot: needs matplotlib" in err and "pip install '.[plot]' in a clone" in err
    )
    assert not picture.exists()


def test_plot_to_an_unwritable_path_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    code, _, err = run(
        capsys, "--config", LLAMA_70B, "--plot", str(tmp_path / "no" / "such" / "dir.png")
    )
    assert code == 2 and "--plot: cannot write" in err


def test_the_search_keeps_the_gpu_memory_admission_keeps_and_says_when_it_cannot(
    capsys: pytest.CaptureFixture[str],
) -> None:
    common = ("--config", LLAMA_70B, "--weights-gib", "131.5", "--gpu-memory-gib", "80")
    common += ("--tp", "4", "--kv-cache-dtype", "auto")
    _, default = run_json(capsys, *common)
    _, none_kept = run_json(capsys, *common, "--gpu-reserved-gib", "0")
    _, more_kept = run_json(capsys, *common, "--gpu-reserved-gib", "4")
    pools = [p["shapes"][0]["kv_pool_tokens"] for p in (none_kept, default, more_kept)]
    # Admission's default (1 GiB per GPU) is what the search takes off unless told otherwise.
    assert pools[0] > pools[1] > pools[2], pools
    code, _, err = run(capsys, *common, "--gpu-reserved-gib", "80")
    assert code == 2
    assert (
        "--gpu-reserved-gib: must be a finite number of GiB, 0 or more and below the GPU's 80 "
        "(got 80)" in err
    )


def test_file_plan_sizes_each_role_with_that_roles_dsa_backend(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The same DeepSeek-V3.2 spec admission sizes per role (--dsa-decode-backend trtllm keeps
    raw fp8 rows on decode, 105,152 tokens at 96 GiB here; flashmla_kv on prefill, scaled rows,
    94,464; both numbers are admission's denials): `kvgate plan -f` reports the pools admission
    would, not one layout for both."""
    roles: dict[str, Any] = {}
    for role in ("prefill", "decode"):
        roles |= {
            f"spec.{role}.tensorParallel": 8,
            f"spec.{role}.memFractionStatic": 0.88,
            f"spec.{role}.gpuMemoryGiB": 96,
        }
    doc = mutated(
        roles
        | {
            "spec.model.config": model_config("deepseek-v3.2"),
            "spec.model.weightsGiB": 642,
            "spec.model.contextLength": 131_072,
            "spec.engine.kvCacheDtype": "fp8_e4m3",
            "spec.engine.args": [
                "--dsa-decode-backend",
                "trtllm",
                "--dsa-prefill-backend",
                "flashmla_kv",
            ],
        }
    )
    path = write(tmp_path, "md.yaml", yaml.safe_dump(doc))
    _, payload = run_json(capsys, "-f", path)
    roles_out = payload["documents"][0]["roles"]
    assert roles_out["decode"]["kv_pool_tokens"] == 105_152
    assert roles_out["prefill"]["kv_pool_tokens"] == 94_464
    denials = {p.field: p.message for p in check_document(doc).denials}
    assert "105,152 tokens" in denials["spec.decode"]
    assert "94,464 tokens" in denials["spec.prefill"]
