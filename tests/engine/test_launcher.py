"""The launcher: a ModelDeployment role -> its EngineLaunch -> the exact sglang.launch_server argv
(golden files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from factories.model_deployments import spec_of
from kvgate.api.models import ModelDeploymentSpec, Role
from kvgate.objects.engine_launch import engine_launch
from kvgate_engine.launcher import engine_argv as launcher_argv
from kvgate_engine.launcher import engine_env as launcher_env
from kvgate_engine.launcher import image_version

GOLDEN = Path(__file__).parents[1] / "golden" / "launcher"
CASES = sorted(GOLDEN.glob("*.json"))


def engine_argv(spec: ModelDeploymentSpec, role: Role) -> list[str]:
    """The argv the operator puts in the pod: the spec mapped to the launcher's input, launched."""
    return launcher_argv(engine_launch(spec, role))


def test_golden_cases_exist() -> None:
    assert len(CASES) >= 6


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_argv_matches_golden_file(case: Path) -> None:
    golden = json.loads(case.read_text())
    spec = ModelDeploymentSpec.model_validate(golden["spec"])
    assert engine_argv(spec, Role(golden["role"])) == golden["argv"]
    # The environment kvgate gives the engine container, beside the argv.
    assert engine_env(spec, Role(golden["role"])) == golden["env"]


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_mem_fraction_static_is_always_explicit() -> None:
    argv = engine_argv(spec_of(), Role.DECODE)
    assert flag_value(argv, "--mem-fraction-static") == "0.85"


def test_each_role_gets_its_own_sizing() -> None:
    spec = spec_of(
        prefill={"tensorParallel": 4, "memFractionStatic": 0.8},
        decode={"tensorParallel": 2, "memFractionStatic": 0.9, "maxTotalTokens": 200000},
    )
    prefill, decode = engine_argv(spec, Role.PREFILL), engine_argv(spec, Role.DECODE)
    assert (flag_value(prefill, "--tp-size"), flag_value(prefill, "--mem-fraction-static")) == (
        "4",
        "0.8",
    )
    assert (flag_value(decode, "--tp-size"), flag_value(decode, "--mem-fraction-static")) == (
        "2",
        "0.9",
    )
    assert "--max-total-tokens" not in prefill
    assert flag_value(decode, "--max-total-tokens") == "200000"


def test_only_prefill_gets_the_bootstrap_port() -> None:
    spec = spec_of(engine={"image": "lmsysorg/sglang:v0.5.23", "bootstrapPort": 9100})
    assert flag_value(engine_argv(spec, Role.PREFILL), "--disaggregation-bootstrap-port") == "9100"
    assert "--disaggregation-bootstrap-port" not in engine_argv(spec, Role.DECODE)


def test_user_args_come_last_so_they_can_override() -> None:
    spec = spec_of(
        engine={
            "image": "lmsysorg/sglang:v0.5.23",
            "args": ["--page-size", "64", "--trust-remote-code"],
        }
    )
    argv = engine_argv(spec, Role.DECODE)
    assert argv[-3:] == ["--page-size", "64", "--trust-remote-code"]


def test_argv_starts_with_the_launch_module() -> None:
    assert engine_argv(spec_of(), Role.PREFILL)[:5] == [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/m",
    ]


@pytest.mark.parametrize(
    ("image", "checksum", "canary"),
    [
        ("lmsysorg/sglang:v0.5.23", True, True),
        ("lmsysorg/sglang:v0.5.22", True, True),
        ("lmsysorg/sglang:v0.5.21", True, True),
        ("lmsysorg/sglang:v0.5.20", False, True),
        ("lmsysorg/sglang:v0.5.19-cu129", False, True),
        ("lmsysorg/sglang:v0.5.18", False, False),
        ("lmsysorg/sglang:latest", True, True),
        ("lmsysorg/sglang@sha256:" + "a" * 64, True, True),
    ],
)
def test_version_gated_safety_flags(image: str, checksum: bool, canary: bool) -> None:
    argv = engine_argv(
        spec_of(engine={"image": image}, safety={"kvCanary": True, "kvChecksum": True}),
        Role.DECODE,
    )
    assert ("--disaggregation-enable-kv-checksum" in argv) is checksum
    assert ("--kv-canary" in argv) is canary
    if canary:
        assert flag_value(argv, "--kv-canary") == "log"


def test_safety_flags_off_when_not_asked() -> None:
    argv = engine_argv(spec_of(safety={"kvCanary": False, "kvChecksum": False}), Role.PREFILL)
    assert "--disaggregation-enable-kv-checksum" not in argv
    assert "--kv-canary" not in argv


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("lmsysorg/sglang:v0.5.23", "0.5.23"),
        ("lmsysorg/sglang:0.5.22", "0.5.22"),
        ("lmsysorg/sglang:v0.5.19-cu129", "0.5.19"),
        ("lmsysorg/sglang:v0.5.23.post1", "0.5.23.post1"),
        ("lmsysorg/sglang:v0.6.0rc1-cu130", "0.6.0rc1"),
        ("registry.local:5000/lmsysorg/sglang:v0.5.23", "0.5.23"),
        ("lmsysorg/sglang:v0.5.23@sha256:" + "b" * 64, "0.5.23"),
        ("lmsysorg/sglang:latest", None),
        ("lmsysorg/sglang:latest-cu130", None),
        ("lmsysorg/sglang@sha256:" + "c" * 64, None),
        ("registry.local:5000/sglang", None),
        ("lmsysorg/sglang", None),
        ("lmsysorg/sglang:dev", None),
    ],
)
def test_image_version(image: str, version: str | None) -> None:
    assert image_version(image) == version


# (transfer section, expected flags) — sglang/srt/arg_groups/fields/disagg.py
TRANSFER_ARGV = [
    ({}, ["--disaggregation-transfer-backend", "mooncake"]),
    (
        {
            "rdma": {"resourceName": "rdma/hca_shared_devices_a"},
            "ibDevices": ["mlx5_0", "mlx5_1"],
        },
        [
            "--disaggregation-transfer-backend",
            "mooncake",
            "--disaggregation-ib-device",
            "mlx5_0,mlx5_1",
        ],
    ),
    ({"backend": "mooncake_tcp"}, ["--disaggregation-transfer-backend", "mooncake_tcp"]),
    (
        {"backend": "nixl", "rdma": {"hostPath": "/dev/infiniband"}, "ibDevices": ["mlx5_2"]},
        ["--disaggregation-transfer-backend", "nixl", "--disaggregation-ib-device", "mlx5_2"],
    ),
]


@pytest.mark.parametrize(("transfer", "flags"), TRANSFER_ARGV)
def test_transfer_section_gives_the_backend_and_ib_device_flags(
    transfer: dict[str, Any], flags: list[str]
) -> None:
    for role in Role:
        argv = engine_argv(
            spec_of(engine={"image": "lmsysorg/sglang:v0.5.23", "transfer": transfer}), role
        )
        start = argv.index("--disaggregation-transfer-backend")
        assert argv[start : start + len(flags)] == flags
        assert argv.count("--disaggregation-ib-device") == flags.count("--disaggregation-ib-device")


def test_deprecated_transfer_backend_still_selects_the_backend() -> None:
    spec = spec_of(engine={"image": "lmsysorg/sglang:v0.5.23", "transferBackend": "nixl"})
    assert flag_value(engine_argv(spec, Role.DECODE), "--disaggregation-transfer-backend") == "nixl"


def test_api_key_is_an_environment_reference_never_the_key() -> None:
    spec = spec_of(
        engine={
            "image": "lmsysorg/sglang:v0.5.23",
            "apiKeySecretRef": {"name": "engine-key", "key": "token"},
        }
    )
    for role in Role:
        argv = engine_argv(spec, role)
        assert flag_value(argv, "--api-key") == "$(KVGATE_ENGINE_API_KEY)"
    assert "--api-key" not in engine_argv(spec_of(), Role.DECODE)


DEFERRED_RELEASE = "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE"


def engine_env(spec: ModelDeploymentSpec, role: Role) -> dict[str, str]:
    return launcher_env(engine_launch(spec, role))


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        # 0.5.19 and 0.5.20 read it with default False; 0.5.21-0.5.23 with default True.
        ("lmsysorg/sglang:v0.5.23", {DEFERRED_RELEASE: "true"}),
        ("lmsysorg/sglang:v0.5.22", {DEFERRED_RELEASE: "true"}),
        ("lmsysorg/sglang:v0.5.21", {DEFERRED_RELEASE: "true"}),
        ("lmsysorg/sglang:v0.5.20", {DEFERRED_RELEASE: "true"}),
        ("lmsysorg/sglang:v0.5.19-cu129", {DEFERRED_RELEASE: "true"}),
        ("lmsysorg/sglang:v0.5.18", {}),
        ("lmsysorg/sglang:latest", {DEFERRED_RELEASE: "true"}),
    ],
)
@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE])
def test_deferred_decode_kv_release_is_on_by_default_where_the_release_reads_it(
    image: str, expected: dict[str, str], role: Role
) -> None:
    # Both roles: the prefill side holds its ABORT_ACK until the transfer drained only when it
    # reads the variable too (mooncake/conn.py MooncakeKVManager.start_prefill_thread).
    assert engine_env(spec_of(engine={"image": image}), role) == expected


def test_deferred_decode_kv_release_off_is_written_false_where_the_release_defaults_on() -> None:
    off = spec_of(
        engine={"image": "lmsysorg/sglang:v0.5.23"}, safety={"deferredDecodeKvRelease": False}
    )
    assert engine_env(off, Role.DECODE) == {DEFERRED_RELEASE: "false"}
