"""Conformance: the launcher's argv parses with each supported SGLang release's own parser.

Each release lives in its own directory outside the project venv (tests/conformance/setup_env.sh);
the parse runs in a subprocess with PYTHONPATH pointing there, so nothing else imports sglang, and
what the release answers is cached by everything it depends on (factories/release_answers.py).
SGLang's ``prepare_server_args`` exits 2 on an unknown flag, and its resolution step reads the
model's ``config.json`` (a directory holding only that file is enough) and refuses a
``--context-length`` above the model's own.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from factories.model_configs import model_config
from factories.release_answers import CONFORMANCE_CACHE, ask_release, model_directory
from kvgate.api.models import ModelDeploymentSpec, Role
from kvgate.objects.engine_launch import engine_launch
from kvgate_engine.launcher import engine_argv as launcher_argv

pytestmark = pytest.mark.conformance


def engine_argv(spec: ModelDeploymentSpec, role: Role) -> list[str]:
    return launcher_argv(engine_launch(spec, role))


HERE = Path(__file__).parent
SETUP = HERE / "setup_env.sh"
CACHE = CONFORMANCE_CACHE
SUPPORTED_VERSIONS = ("0.5.23", "0.5.22", "0.5.21", "0.5.20", "0.5.19")
UNKNOWN_FLAG = "--kvgate-no-such-flag"

LLAMA_31_8B_CONFIG = model_config("llama-3.1-8b")

# Runs inside the SGLang environment: parse each argv, report the exit code and what SGLang read.
PARSER = r"""
import json, sys
from sglang.srt.server_args import prepare_server_args

FIELDS = ["model_path", "served_model_name", "host", "port", "context_length",
          "mem_fraction_static", "tp_size", "page_size", "kv_cache_dtype", "disaggregation_mode",
          "disaggregation_transfer_backend", "disaggregation_bootstrap_port", "max_total_tokens",
          "enable_metrics", "disaggregation_enable_kv_checksum", "kv_canary", "api_key",
          "disaggregation_ib_device"]
results = []
for argv in json.load(sys.stdin):
    try:
        args = prepare_server_args(argv)
    except SystemExit as exc:
        results.append({"exit": exc.code})
        continue
    except Exception as exc:
        results.append({"exit": "exception", "error": f"{type(exc).__name__}: {exc}"})
        continue
    results.append({"exit": 0, "values": {f: getattr(args, f, None) for f in FIELDS}})
print("KVGATE-RESULTS " + json.dumps(results))
"""


def specs(version: str, model_dir: Path) -> list[tuple[str, ModelDeploymentSpec, Role]]:
    image = f"lmsysorg/sglang:v{version}"
    model = {"name": "llama-3.1-8b", "path": str(model_dir), "contextLength": 131072}
    everything: dict[str, Any] = {
        "model": model,
        "engine": {
            "image": image,
            "kvCacheDtype": "fp8_e4m3",
            "pageSize": 16,
            "transfer": {"backend": "nixl"},
            "port": 31000,
            "bootstrapPort": 9001,
            "args": ["--log-level", "warning"],
        },
        "safety": {"kvCanary": True, "kvChecksum": True},
        "prefill": {"memFractionStatic": 0.9, "maxTotalTokens": 500000},
        "decode": {"memFractionStatic": 0.8, "maxTotalTokens": 400000},
    }
    defaults: dict[str, Any] = {"model": model, "engine": {"image": image}}
    # The engine API key: `--api-key $(KVGATE_ENGINE_API_KEY)` (Kubernetes expands it).
    api_key: dict[str, Any] = {
        "model": model,
        "engine": {"image": image, "apiKeySecretRef": {"name": "engine-key", "key": "token"}},
    }
    # mooncake over TCP: SGLang later resolves it to mooncake with MC_FORCE_TCP=1
    # (sglang/srt/arg_groups/pd_disaggregation_hook.py).
    mooncake_tcp: dict[str, Any] = {
        "model": model,
        "engine": {"image": image, "transfer": {"backend": "mooncake_tcp"}},
    }
    return [
        (f"{label}-{role}", ModelDeploymentSpec.model_validate(spec), role)
        for label, spec in (
            ("everything", everything),
            ("defaults", defaults),
            ("api-key", api_key),
            ("mooncake-tcp", mooncake_tcp),
        )
        for role in (Role.PREFILL, Role.DECODE)
    ]


def rdma_spec(version: str, model_dir: Path) -> ModelDeploymentSpec:
    """mooncake over RDMA from a device plugin, with --disaggregation-ib-device."""
    return ModelDeploymentSpec.model_validate(
        {
            "model": {"name": "llama-3.1-8b", "path": str(model_dir), "contextLength": 131072},
            "engine": {
                "image": f"lmsysorg/sglang:v{version}",
                "transfer": {
                    "rdma": {"resourceName": "rdma/hca_shared_devices_a"},
                    "ibDevices": ["mlx5_0", "mlx5_1"],
                },
            },
        }
    )


def expected_values(spec: ModelDeploymentSpec, role: Role, argv: list[str]) -> dict[str, Any]:
    role_spec = spec.prefill if role is Role.PREFILL else spec.decode
    values: dict[str, Any] = {
        "model_path": spec.model.path,
        "served_model_name": spec.model.name,
        "host": "0.0.0.0",
        "port": spec.engine.port,
        "context_length": spec.model.context_length,
        "mem_fraction_static": role_spec.mem_fraction_static,
        "page_size": spec.engine.page_size,
        "kv_cache_dtype": str(spec.engine.kv_cache_dtype),
        "disaggregation_mode": str(role),
        "disaggregation_transfer_backend": str(spec.engine.transfer.backend),
        "max_total_tokens": role_spec.max_total_tokens,
        "enable_metrics": True,
        "tp_size": role_spec.tensor_parallel,
    }
    if role is Role.PREFILL:
        values["disaggregation_bootstrap_port"] = spec.engine.bootstrap_port
    if "--disaggregation-enable-kv-checksum" in argv:
        values["disaggregation_enable_kv_checksum"] = True
    if "--kv-canary" in argv:
        values["kv_canary"] = "log"
    if "--api-key" in argv:
        values["api_key"] = "$(KVGATE_ENGINE_API_KEY)"
    return values


@functools.cache
def _installed() -> tuple[Path, ...]:
    """Install (idempotently) every supported release; fail loudly if one cannot be. Once per
    process: each module's fixture asks, and setup_env.sh takes seconds even when all is cached
    (it imports torch, under a lock the other worker waits on)."""
    result = subprocess.run(
        ["bash", str(SETUP), *SUPPORTED_VERSIONS],
        capture_output=True,
        text=True,
        timeout=3600,
        env={**os.environ, "KVGATE_PYTHON": sys.executable},
    )
    assert result.returncode == 0, f"setup_env.sh failed:\n{result.stdout}\n{result.stderr}"
    return tuple(CACHE / f"sglang-{version}" for version in SUPPORTED_VERSIONS)


@pytest.fixture(scope="module")
def sglang_envs() -> dict[str, Path]:
    return dict(zip(SUPPORTED_VERSIONS, _installed(), strict=True))


@pytest.fixture(scope="module")
def model_dir() -> Path:
    """The model's config.json, at a path named by its content: the argv naming it is the same
    on every run, so the release's answer can be cached."""
    return model_directory(LLAMA_31_8B_CONFIG)


def parse_with_sglang(target: Path, argvs: list[list[str]], model: Path) -> list[dict[str, Any]]:
    parsed: list[dict[str, Any]] = ask_release(target, PARSER, argvs, reads=[model / "config.json"])
    return parsed


@pytest.mark.parametrize("version", SUPPORTED_VERSIONS)
def test_launcher_argv_parses_with_sglang(
    version: str, sglang_envs: dict[str, Path], model_dir: Path
) -> None:
    cases = specs(version, model_dir)
    argvs = [engine_argv(spec, role) for _, spec, role in cases]
    # Everything after "python3 -m sglang.launch_server" is what launch_server hands the parser.
    inputs = [argv[3:] for argv in argvs]
    # The control: the same argv plus a flag SGLang does not know must fail (exit 2).
    inputs.append([*argvs[0][3:], UNKNOWN_FLAG])
    # --disaggregation-ib-device: the parser accepts it, then SGLang checks the names against
    # /sys/class/infiniband (sglang/srt/arg_groups/validation_hook.py), which a machine without
    # RDMA lacks: reaching that check proves the flag and its value were read.
    rdma_argv = engine_argv(rdma_spec(version, model_dir), Role.PREFILL)
    inputs.append(rdma_argv[3:])
    results = parse_with_sglang(sglang_envs[version], inputs, model_dir)
    rdma_result = results.pop()
    assert rdma_result["exit"] != 2, f"sglang {version} rejected {rdma_argv}: {rdma_result}"
    if rdma_result["exit"] == 0:
        assert rdma_result["values"]["disaggregation_ib_device"] == "mlx5_0,mlx5_1"
    else:
        assert "nfiniband" in rdma_result["error"] or "IB device" in rdma_result["error"], (
            rdma_result
        )
    inputs.pop()

    assert len(results) == len(inputs)
    for (name, spec, role), argv, result in zip(cases, argvs, results, strict=False):
        assert result["exit"] == 0, f"sglang {version} rejected {name}: {result} for {argv}"
        want = expected_values(spec, role, argv)
        got = {key: result["values"][key] for key in want}
        assert got == want, f"sglang {version} read {name} differently"
    assert results[-1]["exit"] == 2, f"sglang {version} accepted {UNKNOWN_FLAG}: {results[-1]}"
