"""The reference engine refuses the flag values the SGLang release it emulates refuses (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kvgate_engine.reference.args import parse_launch_args
from kvgate_engine.sglang_choices import (
    FLAG_CHOICES,
    KV_CACHE_DTYPE,
    SUPPORTED_RELEASES,
    accepted_values,
)

MODEL = ("--model-path", "tiny-llama")


@pytest.mark.parametrize("dtype", ["float16", "fp16", "half"])
def test_kv_cache_dtypes_sglang_refuses_exit_2_naming_the_choices(
    dtype: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_launch_args([*MODEL, "--kv-cache-dtype", dtype])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --kv-cache-dtype: invalid choice: '{dtype}'" in err
    assert "'bfloat16'" in err and "'fp4_mx_block16'" in err


@pytest.mark.parametrize("version", SUPPORTED_RELEASES)
@pytest.mark.parametrize("flag", sorted(FLAG_CHOICES))
def test_every_value_the_emulated_release_lists_is_accepted(flag: str, version: str) -> None:
    values = accepted_values(flag, version)
    assert values
    dest = flag.removeprefix("--").replace("-", "_")
    for value in values:
        launch = parse_launch_args([*MODEL, flag, value], version)
        assert launch[dest] == value


def test_a_value_only_older_releases_list_is_refused_by_the_newer_emulation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """fp4_e2m1 left --kv-cache-dtype's choices in SGLang 0.5.21."""
    older = parse_launch_args([*MODEL, "--kv-cache-dtype", "fp4_e2m1"], "0.5.20")
    assert older["kv_cache_dtype"] == "fp4_e2m1"
    with pytest.raises(SystemExit) as exit_info:
        parse_launch_args([*MODEL, "--kv-cache-dtype", "fp4_e2m1"], "0.5.21")
    assert exit_info.value.code == 2
    assert "invalid choice: 'fp4_e2m1'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--disaggregation-transfer-backend", "tcp"),
        ("--disaggregation-mode", "unified"),
        ("--kv-canary", "on"),
    ],
)
def test_other_fixed_set_flags_refuse_values_sglang_refuses(flag: str, value: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_launch_args([*MODEL, flag, value])
    assert exit_info.value.code == 2


def test_engine_started_with_float16_exits_2_before_loading_anything() -> None:
    """What the crash-looping pod did on real SGLang; KVGATE_ENGINE_VERSION picks the release."""
    result = subprocess.run(
        [sys.executable, "-m", "kvgate_engine.reference", *MODEL, "--kv-cache-dtype", "float16"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KVGATE_ENGINE_VERSION": "0.5.19"},
    )
    assert result.returncode == 2, result.stderr
    assert "argument --kv-cache-dtype: invalid choice: 'float16'" in result.stderr
    # 0.5.19's own list, which still has fp4_e2m1
    assert "'fp4_e2m1'" in result.stderr
    assert KV_CACHE_DTYPE in result.stderr
