"""Table tests: spec.engine.args flags kvgate owns or cannot verify, and spec.engine.transfer
combinations that cannot work (kvgate.admission.engine_args), through check_document."""

from __future__ import annotations

from typing import Any

import pytest
from kvgate.admission import check_document

from .conftest import mutated

RDMA = {"resourceName": "rdma/hca_shared_devices_a", "count": 1}

# (case id, changes to the safe sample, denied field, words the message must hold)
DENIED: list[tuple[str, dict[str, Any], str, list[str]]] = [
    (
        "--dp-size (sglang runtime_context.num_dp_ranks_of)",
        {"spec.engine.args": ["--log-level", "info", "--dp-size", "4"]},
        "spec.engine.args[2]",
        ["--dp-size 4", "nvidia.com/gpu", "spec.prefill.replicas"],
    ),
    (
        "--data-parallel-size=2 alias",
        {"spec.engine.args": ["--data-parallel-size=2"]},
        "spec.engine.args[0]",
        ["--data-parallel-size 2", "spec.decode.replicas"],
    ),
    (
        "--enable-dp-attention (sglang parallel_hook.handle_deprecated_dp_attention)",
        {"spec.engine.args": ["--enable-dp-attention"]},
        "spec.engine.args[0]",
        ["attn_dp_size", "tensorParallel"],
    ),
    (
        "--attn-dp-size",
        {"spec.engine.args": ["--attn-dp-size", "8"]},
        "spec.engine.args[0]",
        ["--attn-dp-size 8", "not support"],
    ),
    (
        "an abbreviation of --attn-dp-size",
        {"spec.engine.args": ["--attn-dp", "8"]},
        "spec.engine.args[0]",
        ["a prefix of --attn-dp-size"],
    ),
    (
        "--enable-pd-role-switch",
        {"spec.engine.args": ["--enable-pd-role-switch"]},
        "spec.engine.args[0]",
        ["/pd_role_switch", "spec.prefill.replicas"],
    ),
    (
        "--api-key (sglang utils/auth.py would refuse the probe)",
        {"spec.engine.args": ["--api-key", "hunter2"]},
        "spec.engine.args[0]",
        ["spec.engine.apiKeySecretRef", "plain text"],
    ),
    (
        "--api-key=...",
        {"spec.engine.args": ["--api-key=hunter2"]},
        "spec.engine.args[0]",
        ["spec.engine.apiKeySecretRef"],
    ),
    (
        "a literal --admin-api-key",
        {"spec.engine.args": ["--admin-api-key", "hunter2"]},
        "spec.engine.args[0]",
        ["plain text", "secretKeyRef", "$("],
    ),
    (
        "--disaggregation-transfer-backend",
        {"spec.engine.args": ["--disaggregation-transfer-backend", "nixl"]},
        "spec.engine.args[0]",
        ["spec.engine.transfer.backend"],
    ),
    (
        "--disaggregation-ib-device",
        {"spec.engine.args": ["--disaggregation-ib-device", "mlx5_0"]},
        "spec.engine.args[0]",
        ["spec.engine.transfer.ibDevices"],
    ),
    (
        "--disaggregation-mode",
        {"spec.engine.args": ["--disaggregation-mode", "decode"]},
        "spec.engine.args[0]",
        ["pod's role"],
    ),
    (
        "mooncake_tcp with an RDMA device",
        {"spec.engine.transfer": {"backend": "mooncake_tcp", "rdma": RDMA}},
        "spec.engine.transfer.rdma",
        ["MC_FORCE_TCP", "transfer.backend mooncake"],
    ),
    (
        "mooncake_tcp with ib devices",
        {"spec.engine.transfer": {"backend": "mooncake_tcp", "ibDevices": ["mlx5_0"]}},
        "spec.engine.transfer.ibDevices",
        ["1 device(s)", "mooncake_tcp"],
    ),
    (
        "ib devices without an RDMA device",
        {"spec.engine.transfer": {"ibDevices": ["mlx5_0", "mlx5_1"]}},
        "spec.engine.transfer.ibDevices",
        ["2 RDMA device(s)", "mlx5_0, mlx5_1", "transfer.rdma.resourceName"],
    ),
    (
        "the RDMA resource also set by hand",
        {
            "spec.engine.transfer": {"rdma": RDMA},
            "spec.decode.resources": {"limits": {"rdma/hca_shared_devices_a": 2}},
        },
        "spec.decode.resources.limits",
        ["rdma/hca_shared_devices_a (2)", "rdma.count (1)"],
    ),
    (
        "rdma with both sources",
        {"spec.engine.transfer": {"rdma": {**RDMA, "hostPath": "/dev/infiniband"}}},
        "spec.engine.transfer.rdma",
        ["exactly one of resourceName", "hostPath"],
    ),
    (
        "rdma with neither source",
        {"spec.engine.transfer": {"rdma": {"count": 2}}},
        "spec.engine.transfer.rdma",
        ["exactly one of resourceName"],
    ),
    (
        "an ib device name with a comma",
        {"spec.engine.transfer": {"rdma": RDMA, "ibDevices": ["mlx5_0,mlx5_1"]}},
        "spec.engine.transfer.ibDevices[0]",
        [],
    ),
    (
        "shm size not a quantity",
        {"spec.engine.transfer": {"shmSize": "lots"}},
        "spec.engine.transfer.shmSize",
        [],
    ),
    (
        "unknown backend",
        {"spec.engine.transfer": {"backend": "carrier-pigeon"}},
        "spec.engine.transfer.backend",
        [],
    ),
    (
        "deprecated transferBackend contradicting transfer.backend",
        {"spec.engine.transferBackend": "nixl", "spec.engine.transfer": {"backend": "mooncake"}},
        "spec.engine",
        ["transferBackend nixl", "transfer.backend mooncake", "disagree"],
    ),
]


@pytest.mark.parametrize(
    ("changes", "field", "words"), [c[1:] for c in DENIED], ids=[c[0] for c in DENIED]
)
def test_denied_with_the_field_and_the_way_out(
    changes: dict[str, Any], field: str, words: list[str]
) -> None:
    result = check_document(mutated(changes))
    assert not result.allowed
    fields = [p.field for p in result.denials]
    assert field in fields, result.denials
    message = next(p.message for p in result.denials if p.field == field)
    for word in words:
        assert word in message, message


def test_a_denied_api_key_is_never_echoed() -> None:
    result = check_document(mutated({"spec.engine.args": ["--api-key", "hunter2"]}))
    assert "hunter2" not in " ".join(p.message for p in result.denials)


# (case id, changes, warned field or None for no warning from these checks)
ALLOWED: list[tuple[str, dict[str, Any], str | None]] = [
    ("the default transfer (mooncake, no RDMA section)", {}, None),
    ("mooncake_tcp", {"spec.engine.transfer": {"backend": "mooncake_tcp"}}, None),
    ("nixl over TCP", {"spec.engine.transfer": {"backend": "nixl"}}, None),
    (
        "mooncake over RDMA from a device plugin",
        {
            "spec.engine.transfer": {
                "rdma": {"resourceName": "nvidia.com/hostdev", "count": 2},
                "ibDevices": ["mlx5_0", "mlx5_1"],
                "shmSize": "32Gi",
                "hostNetwork": True,
            }
        },
        None,
    ),
    (
        # The API server writes transfer.backend: mooncake (its default) into every
        # ModelDeployment: no warning on it, or every apply would get one.
        "transfer.backend mooncake, as the API server defaults it, does not warn",
        {"spec.engine.transfer": {"backend": "mooncake"}},
        None,
    ),
    (
        "mooncake asked for by name (deprecated transferBackend) without a device warns",
        {"spec.engine.transferBackend": "mooncake"},
        "spec.engine.transfer",
    ),
    (
        "a hostPath device warns that the engine runs privileged",
        {"spec.engine.transfer": {"rdma": {"hostPath": "/dev/infiniband"}}},
        "spec.engine.transfer.rdma.hostPath",
    ),
    (
        "an admin key from the environment",
        {"spec.engine.args": ["--admin-api-key", "$(ADMIN_KEY)"]},
        None,
    ),
    ("an allowed flag that starts like a denied one", {"spec.engine.args": ["--dp-lm-head"]}, None),
    (
        "the engine API key from a Secret",
        {"spec.engine.apiKeySecretRef": {"name": "engine-key", "key": "token"}},
        None,
    ),
]


@pytest.mark.parametrize(
    ("changes", "warned"), [c[1:] for c in ALLOWED], ids=[c[0] for c in ALLOWED]
)
def test_allowed(changes: dict[str, Any], warned: str | None) -> None:
    result = check_document(mutated(changes))
    assert result.allowed, result.denials
    transfer_warnings = [p.field for p in result.warnings if p.field.startswith("spec.engine")]
    assert transfer_warnings == ([warned] if warned else [])
