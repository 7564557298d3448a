"""Every KVGATE_* variable OperatorSettings reads: unset or empty gives the default, a value is
taken as written (an explicit 0 is a value, never "unset"), and one outside its range stops the
operator with a message naming the variable, the value and the range.

KVGATE_NETWORK_POLICIES and the variables it brings in are read by network_policy_settings
(test_network_policy_settings.py); an unreadable KVGATE_MIN_ENGINE_VERSION_FLOOR is refused by
`kvgate operator` itself (tests/admission/test_inputs.py, exit 2 naming engineVersionFloor).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from kvgate.cmd.cli import build_parser
from kvgate.kube.settings import OperatorSettings

UNSET = None


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("KVGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KVGATE_NETWORK_POLICIES", "false")  # not what these tests are about


def settings_with(monkeypatch: pytest.MonkeyPatch, name: str, raw: str | None) -> OperatorSettings:
    if raw is not None:
        monkeypatch.setenv(name, raw)
    return OperatorSettings.from_args(build_parser().parse_args(["operator", "--no-webhook"]))


ACCEPTED: list[tuple[str, str | None, str, Any]] = [
    # variable, value (None: unset), attribute, what it becomes
    ("KVGATE_RECONCILE_SECONDS", UNSET, "reconcile_seconds", 5.0),
    ("KVGATE_OPTIMISTIC_DRIFT_PERCENT", UNSET, "optimistic_drift_percent", 10.0),
    ("KVGATE_OPTIMISTIC_DRIFT_PERCENT", "25", "optimistic_drift_percent", 25.0),
    ("KVGATE_RECONCILE_SECONDS", "", "reconcile_seconds", 5.0),
    ("KVGATE_RECONCILE_SECONDS", "1", "reconcile_seconds", 1.0),
    ("KVGATE_RECONCILE_SECONDS", "0.1", "reconcile_seconds", 0.1),
    ("KVGATE_STEADY_RECONCILE_SECONDS", UNSET, "steady_reconcile_seconds", 36_000.0),
    ("KVGATE_STEADY_RECONCILE_SECONDS", "5", "steady_reconcile_seconds", 5.0),
    ("KVGATE_REVERIFY_SECONDS", UNSET, "reverify_seconds", None),
    ("KVGATE_REVERIFY_SECONDS", "2", "reverify_seconds", 2.0),
    ("KVGATE_PROBE_TIMEOUT_SECONDS", UNSET, "probe_timeout_seconds", 5.0),
    ("KVGATE_PROBE_TIMEOUT_SECONDS", "2.5", "probe_timeout_seconds", 2.5),
    ("KVGATE_GATEWAY_GRACE_SECONDS", UNSET, "gateway_grace_seconds", 15.0),
    ("KVGATE_GATEWAY_GRACE_SECONDS", "3", "gateway_grace_seconds", 3.0),
    # No grace: a pod a gateway still routes to while NotReady is deleted at once.
    ("KVGATE_GATEWAY_GRACE_SECONDS", "0", "gateway_grace_seconds", 0.0),
    ("KVGATE_WORKER_AUDIT_SECONDS", UNSET, "worker_audit_seconds", 2.0),
    ("KVGATE_WORKER_AUDIT_SECONDS", "0.5", "worker_audit_seconds", 0.5),
    ("KVGATE_WORKER_AUDIT_READS_PER_SECOND", UNSET, "worker_audit_reads_per_second", 50.0),
    ("KVGATE_WORKER_AUDIT_READS_PER_SECOND", "0.5", "worker_audit_reads_per_second", 0.5),
    ("KVGATE_REVERIFY_READS_PER_SECOND", UNSET, "reverify_reads_per_second", 100.0),
    ("KVGATE_REVERIFY_READS_PER_SECOND", "250", "reverify_reads_per_second", 250.0),
    ("KVGATE_MAX_CONCURRENT_PROBES", UNSET, "max_concurrent_probes", 16),
    ("KVGATE_MAX_CONCURRENT_PROBES", "8", "max_concurrent_probes", 8),
    ("KVGATE_MAX_CONCURRENT_RECONCILES", UNSET, "max_concurrent_reconciles", 32),
    ("KVGATE_MAX_CONCURRENT_RECONCILES", "1", "max_concurrent_reconciles", 1),
    ("KVGATE_BIND_ADDRESS", UNSET, "bind_address", "0.0.0.0"),
    ("KVGATE_BIND_ADDRESS", "", "bind_address", "0.0.0.0"),
    ("KVGATE_BIND_ADDRESS", "127.0.0.1", "bind_address", "127.0.0.1"),
    ("KVGATE_BIND_ADDRESS", "::1", "bind_address", "::1"),
    ("KVGATE_BIND_ADDRESS", "localhost", "bind_address", "localhost"),
    ("KVGATE_MIN_ENGINE_VERSION_FLOOR", UNSET, "min_engine_version_floor", None),
    ("KVGATE_MIN_ENGINE_VERSION_FLOOR", "", "min_engine_version_floor", None),
    ("KVGATE_MIN_ENGINE_VERSION_FLOOR", "0.5.23", "min_engine_version_floor", "0.5.23"),
    ("KVGATE_ROUTER_KEY_SEED", "0123456789abcdef", "router_key_seed", b"0123456789abcdef"),
    ("KVGATE_GUARD_IMAGE", UNSET, "guard_image", None),
    ("KVGATE_GUARD_IMAGE", "", "guard_image", None),
    (
        "KVGATE_GUARD_IMAGE",
        "ghcr.io/kvgate/kvgate-operator:0.2.0",
        "guard_image",
        "ghcr.io/kvgate/kvgate-operator:0.2.0",
    ),
    ("KVGATE_GUARD_RESOURCES", UNSET, "guard_resources", None),
    ("KVGATE_GUARD_RESOURCES", "", "guard_resources", None),
    (
        "KVGATE_GUARD_RESOURCES",
        '{"requests": {"cpu": "20m", "memory": "96Mi"}, "limits": {"memory": 268435456}}',
        "guard_resources",
        {"requests": {"cpu": "20m", "memory": "96Mi"}, "limits": {"memory": "268435456"}},
    ),
    ("KVGATE_ENGINE_IMAGE_PULL_SECRETS", UNSET, "engine_pull_secrets", ()),
    ("KVGATE_ENGINE_IMAGE_PULL_SECRETS", "[]", "engine_pull_secrets", ()),
    (
        "KVGATE_ENGINE_IMAGE_PULL_SECRETS",
        '[{"name": "regcred"}, {"name": "mirror"}]',
        "engine_pull_secrets",
        ("regcred", "mirror"),
    ),
    ("KVGATE_LOG_FORMAT", UNSET, "log_format", "json"),
    ("KVGATE_LOG_FORMAT", "text", "log_format", "text"),
    ("KVGATE_LOG_LEVEL", UNSET, "log_level", "INFO"),
    ("KVGATE_LOG_LEVEL", "DEBUG", "log_level", "DEBUG"),
    ("KVGATE_LOG_LEVEL", "warning", "log_level", "WARNING"),
]


@pytest.mark.parametrize(
    ("name", "raw", "attribute", "expected"),
    ACCEPTED,
    ids=[f"{name}={'unset' if raw is None else repr(raw)}" for name, raw, *_ in ACCEPTED],
)
def test_an_accepted_value_is_taken_as_written(
    monkeypatch: pytest.MonkeyPatch, name: str, raw: str | None, attribute: str, expected: Any
) -> None:
    assert getattr(settings_with(monkeypatch, name, raw), attribute) == expected


def test_without_a_seed_each_process_draws_its_own() -> None:
    args = build_parser().parse_args(["operator", "--no-webhook"])
    first, second = OperatorSettings.from_args(args), OperatorSettings.from_args(args)
    assert len(first.router_key_seed) == 32
    assert first.router_key_seed != second.router_key_seed


def _seconds(name: str, raw: str, minimum: str, unset: str) -> tuple[str, str, str]:
    return (
        name,
        raw,
        f"{name}={raw!r}: must be a number of seconds >= {minimum}; unset it for {unset}",
    )


PERIODS = [
    ("KVGATE_RECONCILE_SECONDS", "the default, 5 s"),
    ("KVGATE_STEADY_RECONCILE_SECONDS", "the default, 36000 s"),
    ("KVGATE_REVERIFY_SECONDS", "each ModelDeployment's rollout.reverifyIntervalSeconds"),
    ("KVGATE_PROBE_TIMEOUT_SECONDS", "the default, 5 s"),
    ("KVGATE_WORKER_AUDIT_SECONDS", "the default, 2 s"),
]
REFUSED: list[tuple[str, str, str]] = [
    # A period or timeout of 0 s is a busy loop or a probe that always fails.
    *(
        _seconds(name, raw, "0.1", unset)
        for name, unset in PERIODS
        for raw in ("0", "0.05", "-1", "soon", "nan", "inf")
    ),
    *(
        _seconds("KVGATE_GATEWAY_GRACE_SECONDS", raw, "0", "the default, 15 s")
        for raw in ("-1", "-0.5", "soon", "nan", "inf")
    ),
    *(
        (
            "KVGATE_WORKER_AUDIT_READS_PER_SECOND",
            raw,
            f"KVGATE_WORKER_AUDIT_READS_PER_SECOND={raw!r}: must be a number of reads per second "
            "> 0; unset it for the default, 50",
        )
        for raw in ("0", "-1", "fast", "nan", "inf")
    ),
    *(
        (
            "KVGATE_REVERIFY_READS_PER_SECOND",
            raw,
            f"KVGATE_REVERIFY_READS_PER_SECOND={raw!r}: must be a number of reads per second "
            "> 0; unset it for the default, 100",
        )
        for raw in ("0", "-1", "fast", "nan", "inf")
    ),
    *(
        (
            "KVGATE_MAX_CONCURRENT_PROBES",
            raw,
            f"KVGATE_MAX_CONCURRENT_PROBES={raw!r}: must be a whole number >= 1; unset it for "
            "the default, 16",
        )
        for raw in ("0", "-3", "many", "2.5")
    ),
    *(
        (
            "KVGATE_BIND_ADDRESS",
            raw,
            f"KVGATE_BIND_ADDRESS={raw!r}: must be an IP address or a host name; unset it for "
            "the default, 0.0.0.0 (every interface)",
        )
        for raw in ("-1", "0.0.0.0:8080", "not an address", "http://localhost")
    ),
    *(
        (
            "KVGATE_ROUTER_KEY_SEED",
            raw,
            f"KVGATE_ROUTER_KEY_SEED has {len(raw)} characters; use at least 16 random ones "
            "(the chart generates 48)",
        )
        for raw in ("0", "-1", "short-seed")
    ),
    (
        "KVGATE_GUARD_IMAGE",
        "kvgate operator",
        "KVGATE_GUARD_IMAGE='kvgate operator': must be an image reference without spaces, e.g. "
        "ghcr.io/kvgate/kvgate-operator:0.1.0; unset it for engine pods without a guard",
    ),
    *(
        (
            "KVGATE_GUARD_RESOURCES",
            raw,
            f"KVGATE_GUARD_RESOURCES={raw!r}: must be a JSON object with requests and/or "
            "limits, each naming resources and quantities, e.g. "
            '{"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}; '
            "unset it for the default",
        )
        for raw in (
            "64Mi",
            "[]",
            '{"request": {"memory": "64Mi"}}',
            '{"limits": "128Mi"}',
            '{"limits": {"memory": ""}}',
            '{"limits": {"memory": true}}',
            '{"limits": {"": "1"}}',
        )
    ),
    (
        "KVGATE_ENGINE_IMAGE_PULL_SECRETS",
        '[{"name": "Reg Cred"}]',
        'KVGATE_ENGINE_IMAGE_PULL_SECRETS=\'[{"name": "Reg Cred"}]\' (the chart value '
        'imagePullSecrets): must be a JSON list of Secret names or {"name": ...} objects, '
        'e.g. [{"name": "regcred"}]; unset it for none',
    ),
    *(
        (
            "KVGATE_OPTIMISTIC_DRIFT_PERCENT",
            raw,
            f"KVGATE_OPTIMISTIC_DRIFT_PERCENT={raw!r} (the chart value "
            "estimator.optimisticDriftPercent): must be a percentage between 0 and 100, e.g. 10; "
            "unset it for the default, 10",
        )
        for raw in ("0", "100", "-5", "ten", "nan", "inf")
    ),
    *(
        (
            "KVGATE_LOG_FORMAT",
            raw,
            f"KVGATE_LOG_FORMAT={raw!r}: must be one of json, text; unset it for the default, json",
        )
        for raw in ("0", "-1", "yaml", "JSON")
    ),
    *(
        (
            "KVGATE_LOG_LEVEL",
            raw,
            f"KVGATE_LOG_LEVEL={raw!r}: must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL; "
            "unset it for the default, INFO",
        )
        for raw in ("0", "-1", "10", "LOUD")
    ),
]


@pytest.mark.parametrize(
    ("name", "raw", "message"), REFUSED, ids=[f"{name}={raw!r}" for name, raw, _ in REFUSED]
)
def test_a_value_out_of_range_stops_the_operator_naming_it(
    monkeypatch: pytest.MonkeyPatch, name: str, raw: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        settings_with(monkeypatch, name, raw)
    assert str(exit_.value) == message


LEADER: list[tuple[str, str | None, str, Any]] = [
    # --leader-elect: variable, value (None: unset), LeaderConfig attribute, what it becomes
    ("KVGATE_LEADER_ELECTION_NAMESPACE", UNSET, "namespace", "from-pod-namespace"),
    ("KVGATE_LEADER_ELECTION_NAMESPACE", "ops", "namespace", "ops"),
    ("KVGATE_LEADER_ELECTION_LEASE", UNSET, "name", "kvgate-operator"),
    ("KVGATE_LEADER_ELECTION_LEASE", "kvgate-a", "name", "kvgate-a"),
    ("KVGATE_LEADER_LEASE_DURATION_SECONDS", UNSET, "lease_duration_seconds", 10.0),
    ("KVGATE_LEADER_LEASE_DURATION_SECONDS", "15", "lease_duration_seconds", 15.0),
    ("KVGATE_LEADER_RENEW_DEADLINE_SECONDS", UNSET, "renew_deadline_seconds", 7.0),
    ("KVGATE_LEADER_RENEW_DEADLINE_SECONDS", "5", "renew_deadline_seconds", 5.0),
    ("KVGATE_LEADER_RETRY_PERIOD_SECONDS", UNSET, "retry_period_seconds", 2.0),
    ("KVGATE_LEADER_RETRY_PERIOD_SECONDS", "1", "retry_period_seconds", 1.0),
]


def leader_settings(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> OperatorSettings:
    monkeypatch.setenv("POD_NAMESPACE", "from-pod-namespace")
    monkeypatch.setenv("POD_NAME", "kvgate-7d9f-abcde")
    for name, raw in env.items():
        monkeypatch.setenv(name, raw)
    args = build_parser().parse_args(["operator", "--no-webhook", "--leader-elect"])
    return OperatorSettings.from_args(args)


@pytest.mark.parametrize(
    ("name", "raw", "attribute", "expected"),
    LEADER,
    ids=[f"{name}={raw!r}" for name, raw, *_ in LEADER],
)
def test_leader_election_reads_its_lease_and_timings_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, name: str, raw: str | None, attribute: str, expected: Any
) -> None:
    config = leader_settings(monkeypatch, {} if raw is None else {name: raw}).leader_election
    assert config is not None and config.identity == "kvgate-7d9f-abcde"
    assert getattr(config, attribute) == expected


def test_without_leader_elect_no_lease_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    assert settings_with(monkeypatch, "KVGATE_LOG_LEVEL", None).leader_election is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"KVGATE_LEADER_RENEW_DEADLINE_SECONDS": "10"},
            "leader election: KVGATE_LEADER_LEASE_DURATION_SECONDS=10 must be greater than "
            "KVGATE_LEADER_RENEW_DEADLINE_SECONDS=10: a leader that cannot renew must stop "
            "before another replica may take over",
        ),
        (
            {"KVGATE_LEADER_RETRY_PERIOD_SECONDS": "0"},
            "KVGATE_LEADER_RETRY_PERIOD_SECONDS='0': must be a number of seconds >= 0.1; unset "
            "it for the default, 2 s",
        ),
    ],
)
def test_leader_timings_that_could_overlap_two_leaders_stop_the_operator(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        leader_settings(monkeypatch, env)
    assert str(exit_.value) == message


def test_leader_election_without_a_namespace_says_which_variable_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    with pytest.raises(SystemExit) as exit_:
        OperatorSettings.from_args(
            build_parser().parse_args(["operator", "--no-webhook", "--leader-elect"])
        )
    assert "KVGATE_LEADER_ELECTION_NAMESPACE or POD_NAMESPACE" in str(exit_.value)


def test_every_kvgate_variable_settings_reads_is_in_the_tables() -> None:
    source = (Path(__file__).resolve().parents[2] / "operator/kvgate/kube/settings.py").read_text()
    read = set(re.findall(r'"(KVGATE_[A-Z_]+)"', source)) - {"KVGATE_NETWORK_POLICIES"}
    tested = (
        {name for name, *_ in ACCEPTED}
        | {name for name, *_ in REFUSED}
        | {name for name, *_ in LEADER}
    )
    assert read == tested


def test_the_measured_gpu_reserves_reach_the_operator_and_a_wrong_table_stops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """KVGATE_GPU_RESERVED_GIB_BY_PRODUCT (the chart value estimator.gpuReservedGiBByProduct,
    read by kvgate.admission.gpu_reserve) is what the drift report and the embedded webhook use."""
    name = "KVGATE_GPU_RESERVED_GIB_BY_PRODUCT"
    assert settings_with(monkeypatch, name, None).gpu_reserved_gib_by_product == {}
    table = settings_with(monkeypatch, name, '{"NVIDIA-H100-80GB-HBM3": 2.5}')
    assert table.gpu_reserved_gib_by_product == {"NVIDIA-H100-80GB-HBM3": 2.5}
    with pytest.raises(SystemExit) as exit_:
        settings_with(monkeypatch, name, '{"NVIDIA-H100-80GB-HBM3": -1}')
    assert "estimator.gpuReservedGiBByProduct" in str(exit_.value)
