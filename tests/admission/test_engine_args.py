"""Table tests: spec.engine.args flags kvgate owns or cannot verify, and spec.engine.transfer
combinations that cannot work (kvgate.admission.engine_args), through check_document."""

from __future__ import annotations

from typing import Any

import pytest
from factories.admission_reviews import mutated
from kvgate.admission import check_document

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
        ["--data-parallel-size=2", "alias of --dp-size", "spec.decode.replicas"],
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
        ["--attn-dp 8", "reads it as --attn-dp-size", "any unique prefix"],
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
        ["spec.engine.transfer.backend", "devices"],
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


SECRET_WITHOUT_API_KEY: list[tuple[list[str], int, str]] = [
    (["--admin-api-key", "$(ADMIN_KEY)"], 0, "--admin-api-key"),
    (["--tp-size", "1", "--admin-api=$(ADMIN_KEY)"], 2, "--admin-api-key"),
    (["--ssl-keyfile-password", "$(SSL_PASSWORD)"], 0, "--ssl-keyfile-password"),
    (["--ssl-keyfile-pass=$(SSL_PASSWORD)"], 0, "--ssl-keyfile-password"),
]


@pytest.mark.parametrize(
    ("args", "index", "flag"),
    SECRET_WITHOUT_API_KEY,
    ids=[" ".join(c[0]) for c in SECRET_WITHOUT_API_KEY],
)
def test_a_secret_flag_without_an_api_key_is_denied_since_server_info_would_serve_it(
    args: list[str], index: int, flag: str
) -> None:
    result = check_document(mutated({"spec.engine.args": args}))
    assert not result.allowed
    message = next(p.message for p in result.denials if p.field == f"spec.engine.args[{index}]")
    for words in (flag, "/server_info", "spec.engine.apiKeySecretRef", "/get_server_info"):
        assert words in message, message
    assert "$(" not in message


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


@pytest.mark.parametrize(
    "args",
    [
        ["--api-key", "hunter2"],
        ["--api-k=hunter2"],
        ["--admin-api-key", "hunter2"],
        ["--a", "hunter2"],
    ],
)
def test_a_denied_api_key_is_never_echoed(args: list[str]) -> None:
    result = check_document(mutated({"spec.engine.args": args}))
    assert not result.allowed
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
        "an admin key from the environment, beside the API key",
        {
            "spec.engine.args": ["--admin-api-key", "$(ADMIN_KEY)"],
            "spec.engine.apiKeySecretRef": {"name": "engine-keys", "key": "api"},
        },
        None,
    ),
    (
        "an SSL key password from the environment, beside the API key",
        {
            "spec.engine.args": ["--ssl-keyfile-password=$(SSL_PASSWORD)"],
            "spec.engine.apiKeySecretRef": {"name": "engine-keys", "key": "api"},
        },
        None,
    ),
    ("an SSL key file (a path, not a secret)", {"spec.engine.args": ["--ssl-keyfile", "/k"]}, None),
    ("an allowed flag that starts like a denied one", {"spec.engine.args": ["--dp-lm-head"]}, None),
    (
        "the switches kvgate passes, repeated (they cannot be turned off)",
        {"spec.engine.args": ["--enable-metrics", "--disaggregation-enable-kv-checksum"]},
        None,
    ),
    (
        "tuning flags kvgate leaves to the user",
        {
            "spec.engine.args": [
                *("--chunked-prefill-size", "4096", "--max-running-requests=64"),
                *("--schedule-policy", "lpm", "--attention-backend", "fa3"),
                *("--max-prefill-tokens", "16384", "--log-level", "info"),
            ]
        },
        None,
    ),
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


# ------------------------------------------------------------ flags kvgate sets, every spelling

ALIAS = "SGLang's alias of"
PREFIX = "SGLang's parser accepts any unique prefix of a flag"
BOOTSTRAP = "--disaggregation-bootstrap-port"
# (args, the denied item's index, the flag SGLang reads it as, the field to set instead)
KVGATE_FLAG_SPELLINGS: list[tuple[list[str], int, str, str]] = [
    (["--kv-cache-dtype", "float16"], 0, "--kv-cache-dtype", "spec.engine.kvCacheDtype"),
    (["--kv-cache-dt", "float16"], 0, f"--kv-cache-dtype ({PREFIX})", "spec.engine.kvCacheDtype"),
    (["--kv-cache-d=float16"], 0, f"--kv-cache-dtype ({PREFIX})", "spec.engine.kvCacheDtype"),
    (["--kv-canary", "none"], 0, "--kv-canary", "spec.safety.kvCanary"),
    (["--kv-can", "bogus"], 0, f"--kv-canary ({PREFIX})", "spec.safety.kvCanary"),
    (["--context-length", "131072"], 0, "--context-length", "spec.model.contextLength"),
    (["--context-len=131072"], 0, f"--context-length ({PREFIX})", "spec.model.contextLength"),
    (["--log-level", "info", "--context-length=1"], 2, "--context-length", "contextLength"),
    (["--max-total-tokens", "1024"], 0, "--max-total-tokens", "spec.decode.maxTotalTokens"),
    (["--max-total=1024"], 0, f"--max-total-tokens ({PREFIX})", "spec.prefill.maxTotalTokens"),
    (["--mem-fraction-static", "0.9"], 0, "--mem-fraction-static", "memFractionStatic"),
    (["--mem-frac", "0.9"], 0, f"--mem-fraction-static ({PREFIX})", "memFractionStatic"),
    (["--model-path", "/other"], 0, "--model-path", "spec.model.path"),
    (["--model", "/other"], 0, f"--model ({ALIAS} --model-path)", "spec.model.path"),
    (["--served-model-name", "other"], 0, "--served-model-name", "spec.model.name"),
    (["--host", "127.0.0.1"], 0, "--host", "spec.engine.port"),
    (["--port=1"], 0, "--port", "spec.engine.port"),
    (["--tp-size", "8"], 0, "--tp-size", "spec.prefill.tensorParallel"),
    (["--tensor-parallel-size=8"], 0, f"--tensor-parallel-size ({ALIAS} --tp-size)", "Parallel"),
    (["--tensor-p", "8"], 0, f"--tensor-parallel-size ({PREFIX}; {ALIAS} --tp-size)", "Parallel"),
    (["--page-size", "64"], 0, "--page-size", "spec.engine.pageSize"),
    (
        ["--disaggregation-bootstrap-port", "9"],
        0,
        "--disaggregation-b",
        "spec.engine.bootstrapPort",
    ),
    (["--node-r", "1"], 0, f"--node-rank ({PREFIX})", "spec.decode.nodes"),
    (["--config", "/models/m/flags.yaml"], 0, "--config", "spec.engine.args"),
]


def _written(args: list[str], index: int) -> str:
    return args[index] if "=" in args[index] else " ".join(args[index : index + 2])


@pytest.mark.parametrize(
    ("args", "index", "read_as", "field"),
    KVGATE_FLAG_SPELLINGS,
    ids=[" ".join(case[0]) for case in KVGATE_FLAG_SPELLINGS],
)
def test_a_flag_kvgate_sets_is_denied_in_engine_args_under_every_spelling(
    args: list[str], index: int, read_as: str, field: str
) -> None:
    result = check_document(mutated({"spec.engine.args": args}))
    assert not result.allowed
    denial = next(p for p in result.denials if p.field == f"spec.engine.args[{index}]")
    written = _written(args, index)
    assert denial.message.startswith(f"{written}: SGLang reads it as {read_as}"), denial.message
    assert field in denial.message, denial.message
    assert [p.field for p in result.denials if p.field.startswith("spec.engine.args")] == [
        f"spec.engine.args[{index}]"
    ]


def test_a_flag_kvgate_sets_says_why_engine_args_may_not_override_it() -> None:
    result = check_document(mutated({"spec.engine.args": ["--context-length", "131072"]}))
    message = next(p.message for p in result.denials if p.field == "spec.engine.args[0]")
    assert "kvgate appends engine.args after its own flags" in message
    assert "SGLang keeps the last value" in message
    assert "prompts longer than their verified pools hold" in message
    assert message.endswith("remove it and set spec.model.contextLength")


def test_a_prefix_of_several_denied_flags_names_them_all() -> None:
    result = check_document(mutated({"spec.engine.args": ["--kv-ca", "x"]}))
    message = next(p.message for p in result.denials if p.field == "spec.engine.args[0]")
    assert "reads it as --kv-cache-dtype or --kv-canary (a prefix of each" in message
    assert "refuses to start on a prefix of several" in message


def test_end_of_options_is_denied_since_sglang_would_refuse_to_start() -> None:
    result = check_document(mutated({"spec.engine.args": ["--log-level", "info", "--", "x"]}))
    message = next(p.message for p in result.denials if p.field == "spec.engine.args[2]")
    assert "SGLang takes no positional argument" in message
    assert "1 argument(s) after it" in message


def test_one_item_with_a_space_is_a_positional_to_argparse_not_a_flag() -> None:
    """argparse reads "--context-length 131072" as one positional item, not as the flag (and
    SGLang, with no positional argument, refuses to start on it)."""
    result = check_document(mutated({"spec.engine.args": ["--context-length 131072"]}))
    assert not [p for p in result.denials if p.field.startswith("spec.engine.args")]
