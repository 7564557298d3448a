"""The chart's alert rules through Prometheus' own promtool: ``promtool check rules`` loads the
rendered PrometheusRule (PromQL and annotation templates, Prometheus' parser), and ``promtool
test rules`` evaluates the engine alerts on recorded series and says when they fire.

promtool is built from the Go module proxy into a cache outside the clone
(tests/chart/promtool/build.sh; ``make promtool``, which ``make test`` runs first). Without it the
module is skipped, except under CI or KVGATE_REQUIRE_PROMTOOL=1, where that is a failure.

``promtool test rules`` compares annotations too, so the firing tests run on the same rules with
the annotations dropped; ``check rules`` has already loaded and parsed every annotation template.
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_runner import ROOT, Helm

BUILD = ROOT / "tests" / "chart" / "promtool" / "build.sh"
MONITORING = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
    "monitoring.coreos.com/v1/PodMonitor",
)
ENABLED = (
    "metrics.serviceMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "metrics.enginePodMonitor.enabled=true",
)
POOL = 100_000  # the verified KV pool of every pod in the series below
# The jobs of the chart's monitors (release kvgate in kvgate-system): the ServiceMonitor's is
# <namespace>/<Service>, the engine PodMonitor's <namespace>/<name>. The rules read no other job.
OPERATOR_JOB = "kvgate-system/kvgate-metrics"
ENGINE_JOB = "kvgate-system/kvgate-engines"


def _promtool_path() -> Path:
    out = subprocess.run(["bash", str(BUILD), "--print-path"], capture_output=True, text=True)
    return Path(out.stdout.strip())


@pytest.fixture(scope="module")
def promtool() -> Path:
    path = _promtool_path()
    if not os.access(path, os.X_OK):
        reason = (
            f"promtool not built at {path}: run `make promtool` (tests/chart/promtool/build.sh)"
        )
        if os.environ.get("CI") or os.environ.get("KVGATE_REQUIRE_PROMTOOL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def groups(helm: Helm) -> list[dict[str, Any]]:
    rule = helm.template(*ENABLED, api_versions=MONITORING).one("PrometheusRule")
    return list(rule["spec"]["groups"])


def run(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def without_annotations(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    bare = copy.deepcopy(groups)
    for group in bare:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    return bare


def engine(pod: str) -> dict[str, str]:
    """Labels of a series scraped by the engine PodMonitor (SGLang's own plus the target's)."""
    return {
        "namespace": "models",
        "pod": pod,
        "container": "engine",
        "endpoint": "http",
        "job": ENGINE_JOB,
        "instance": f"{pod}:30000",
        "model_name": "llama-3.1-8b",
    }


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def pool(pod: str) -> dict[str, str]:
    """kvgate's verified pool for the pod, from the operator's target (the ServiceMonitor
    puts the engine pod's namespace and pod back from exported_namespace and exported_pod)."""
    return series(
        "kvgate_engine_kv_pool_tokens",
        {
            "namespace": "models",
            "deployment": "llama",
            "pod": pod,
            "role": "decode",
            "job": OPERATOR_JOB,
            "instance": "10.0.0.9:8080",
        },
        f"{POOL}x30",
    )


def used(pod: str, values: str) -> dict[str, str]:
    return series("sglang:num_used_tokens", {**engine(pod), "tp_rank": "0", "pp_rank": "0"}, values)


def usage_alert(pod: str) -> dict[str, Any]:
    return {
        "exp_labels": {
            "severity": "warning",
            "namespace": "models",
            "deployment": "llama",
            "pod": pod,
            "role": "decode",
        }
    }


USAGE_TESTS: dict[str, Any] = {
    "interval": "1m",
    "input_series": [
        pool("llama-r1-decode-0"),
        pool("llama-r1-decode-1"),
        pool("llama-r1-decode-2"),
        used("llama-r1-decode-0", "50000x4 85000x25"),  # 85 % from minute 5 on
        used("llama-r1-decode-1", "79000x29"),  # 79 %: under the threshold
        used("llama-r1-decode-2", "50000x4 95000x6 50000x19"),  # 95 % for 7 minutes only
    ],
    "alert_rule_test": [
        # 85 % since minute 5: pending until it has held for kvUsageFor (10m).
        {"eval_time": "14m", "alertname": "KvgateEngineKvUsageHigh", "exp_alerts": []},
        {
            "eval_time": "16m",
            "alertname": "KvgateEngineKvUsageHigh",
            "exp_alerts": [usage_alert("llama-r1-decode-0")],
        },
    ],
}


def responses(pod: str, code: str, values: str) -> dict[str, str]:
    labels = {**engine(pod), "status_code": code, "method": "POST"}
    labels["endpoint"] = "/generate"  # SGLang's own label (the target's is renamed on scrape)
    return series("sglang:http_responses_total", labels, values)


REJECTION_TESTS: dict[str, Any] = {
    "interval": "1m",
    "input_series": [
        responses("llama-r1-prefill-0", "400", "0 0 0 1 2 2x25"),  # two refusals at minutes 3-4
        responses("llama-r1-prefill-0", "200", "0+10x30"),
        responses("llama-r1-prefill-1", "200", "0+10x30"),  # only answers
    ],
    "alert_rule_test": [
        {
            "eval_time": "5m",
            "alertname": "KvgateEngineRejectingRequests",
            "exp_alerts": [
                {
                    "exp_labels": {
                        "severity": "warning",
                        "namespace": "models",
                        "pod": "llama-r1-prefill-0",
                    }
                }
            ],
        },
        # Nothing refused in the last rejectedRequestsWindow (10m): resolved.
        {"eval_time": "20m", "alertname": "KvgateEngineRejectingRequests", "exp_alerts": []},
    ],
}


def write_tests(directory: Path, groups: list[dict[str, Any]], tests: list[Any]) -> Path:
    (directory / "rules.yaml").write_text(yaml.safe_dump({"groups": without_annotations(groups)}))
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    path = directory / "tests.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_promtool_loads_every_rendered_rule_and_template(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    result = run(promtool, "check", "rules", "rules.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_kv_usage_fires_only_when_it_stays_above_80_percent_of_the_verified_pool(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    write_tests(tmp_path, groups, [USAGE_TESTS])
    result = run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_length_rejections_fire_and_resolve(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    write_tests(tmp_path, groups, [REJECTION_TESTS])
    result = run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_rejects_a_wrong_expectation(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    # The runner evaluates for real: the 79 % pod does not fire, so expecting it fails.
    wrong = copy.deepcopy(USAGE_TESTS)
    wrong["alert_rule_test"][1]["exp_alerts"].append(usage_alert("llama-r1-decode-1"))
    write_tests(tmp_path, groups, [wrong])
    result = run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "llama-r1-decode-1" in result.stdout + result.stderr


def operator_series(name: str, instance: str, values: str, **labels: str) -> dict[str, str]:
    """A series from an operator replica's metrics target."""
    return series(name, {"job": OPERATOR_JOB, "instance": instance, **labels}, values)


def drift(role: str, instance: str, values: str, deployment: str = "llama") -> dict[str, str]:
    return operator_series(
        "kvgate_kv_pool_estimate_drift_ratio",
        instance,
        values,
        namespace="models",
        deployment=deployment,
        role=role,
    )


LEADER, STANDBY = "10.0.0.9:8080", "10.0.0.10:8080"
DRIFT_TESTS: dict[str, Any] = {
    "interval": "1m",
    "input_series": [
        operator_series("kvgate_leader", LEADER, "1x60"),
        operator_series("kvgate_leader", STANDBY, "0x60"),
        drift("decode", LEADER, "-0.15x60"),  # 15 % below the estimate: optimistic
        drift("prefill", LEADER, "-0.05x60"),  # 5 % below: within the 10 % default
        drift("decode", LEADER, "-0.02x9 -0.12x10 -0.02x40", "short"),  # 10 minutes only
        # A replica that led before keeps its last series; only the leader's count.
        drift("decode", STANDBY, "-0.5x60", "stale"),
    ],
    "alert_rule_test": [
        # Pending until it has held for estimateOptimisticFor (30m).
        {"eval_time": "29m", "alertname": "KvgateKvPoolEstimateOptimistic", "exp_alerts": []},
        {
            "eval_time": "31m",
            "alertname": "KvgateKvPoolEstimateOptimistic",
            "exp_alerts": [
                {
                    "exp_labels": {
                        "severity": "warning",
                        "namespace": "models",
                        "deployment": "llama",
                        "role": "decode",
                    }
                }
            ],
        },
    ],
}


def test_an_optimistic_estimate_fires_for_the_role_below_the_threshold_on_the_leader_only(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    write_tests(tmp_path, groups, [DRIFT_TESTS])
    result = run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alert_threshold_is_the_operators_drift_setting(helm: Helm) -> None:
    rule = helm.template(
        *ENABLED, "estimator.optimisticDriftPercent=25", api_versions=MONITORING
    ).one("PrometheusRule")
    (alert,) = [
        r
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if r.get("alert") == "KvgateKvPoolEstimateOptimistic"
    ]
    assert alert["expr"].endswith("< -25 / 100")


# --- the recording rules ------------------------------------------------------------------------

OPERATOR_POD_SERIES = {
    # pod: (role, gate True, verified pool); prefill-1 is not verified (its pool too small).
    "llama-r1-decode-0": ("decode", 1, 120_000),
    "llama-r1-decode-1": ("decode", 1, 100_000),
    "llama-r1-prefill-0": ("prefill", 1, 150_000),
    "llama-r1-prefill-1": ("prefill", 0, 50_000),
}
# pod: (KV tokens in use, queued requests per DP rank, running requests per DP rank)
ENGINE_LOAD = {
    "llama-r1-decode-0": (60_000, (2,), (10,)),
    "llama-r1-decode-1": (90_000, (1, 2), (6, 8)),  # two DP ranks: summed
    "llama-r1-prefill-0": (30_000, (5,), (1,)),
    "llama-r1-prefill-1": (40_000, (7,), (3,)),  # unverified: in no recorded series
}


def pod_series(name: str, instance: str, pod: str, role: str, value: float) -> dict[str, str]:
    labels = {"namespace": "models", "deployment": "llama", "pod": pod, "role": role}
    return operator_series(name, instance, f"{value}x10", **labels)


def recording_input() -> list[dict[str, str]]:
    out = [
        operator_series("kvgate_leader", LEADER, "1x10"),
        operator_series("kvgate_leader", STANDBY, "0x10"),
        operator_series(
            "kvgate_context_length_tokens",
            LEADER,
            "100000x10",
            namespace="models",
            deployment="llama",
        ),
        # A former leader's last series: never counted.
        operator_series(
            "kvgate_context_length_tokens",
            STANDBY,
            "999x10",
            namespace="models",
            deployment="llama",
        ),
        pod_series("kvgate_engine_verified", STANDBY, "llama-r0-decode-9", "decode", 1),
        pod_series("kvgate_engine_kv_pool_tokens", STANDBY, "llama-r0-decode-9", "decode", 10),
    ]
    for pod, (role, gate, pool) in OPERATOR_POD_SERIES.items():
        out.append(pod_series("kvgate_engine_verified", LEADER, pod, role, gate))
        out.append(pod_series("kvgate_engine_kv_pool_tokens", LEADER, pod, role, pool))
    for pod, (in_use, queued, running) in ENGINE_LOAD.items():
        role = OPERATOR_POD_SERIES[pod][0]
        for rank, (waiting, busy) in enumerate(zip(queued, running, strict=True)):
            labels = {**engine(pod), "engine_type": role, "tp_rank": "0", "dp_rank": str(rank)}
            out.append(series("sglang:num_used_tokens", labels, f"{in_use}x10"))
            out.append(series("sglang:num_queue_reqs", labels, f"{waiting}x10"))
            out.append(series("sglang:num_running_reqs", labels, f"{busy}x10"))
    return out


def _md(**labels: str) -> str:
    return ",".join(
        f'{k}="{v}"' for k, v in {"namespace": "models", "deployment": "llama", **labels}.items()
    )


def per_role(record: str, decode: float, prefill: float) -> dict[str, Any]:
    return {
        "expr": record,
        "eval_time": "5m",
        "exp_samples": [
            {"labels": f"{record}{{{_md(role='decode')}}}", "value": decode},
            {"labels": f"{record}{{{_md(role='prefill')}}}", "value": prefill},
        ],
    }


def per_pod(record: str, values: dict[str, float]) -> dict[str, Any]:
    samples = [
        {
            "labels": f"{record}{{{_md(pod=pod, role=OPERATOR_POD_SERIES[pod][0])}}}",
            "value": value,
        }
        for pod, value in values.items()
    ]
    return {"expr": record, "eval_time": "5m", "exp_samples": samples}


def per_md(record: str, value: float) -> dict[str, Any]:
    return {
        "expr": record,
        "eval_time": "5m",
        "exp_samples": [{"labels": f"{record}{{{_md()}}}", "value": value}],
    }


VERIFIED = ("llama-r1-decode-0", "llama-r1-decode-1", "llama-r1-prefill-0")
RECORDING_EXPECTATIONS = [
    per_pod("namespace_deployment_pod_role:kvgate_engine_verified:max", dict.fromkeys(VERIFIED, 1)),
    per_pod(
        "namespace_deployment_pod_role:kvgate_verified_kv_pool_tokens:max",
        {p: OPERATOR_POD_SERIES[p][2] for p in VERIFIED},
    ),
    per_role("namespace_deployment_role:kvgate_verified_kv_pool_tokens:min", 100_000, 150_000),
    per_role("namespace_deployment_role:kvgate_verified_kv_pool_tokens:sum", 220_000, 150_000),
    per_role("namespace_deployment_role:kvgate_verified_replicas:count", 2, 1),
    per_md("namespace_deployment:kvgate_context_length_tokens:max", 100_000),
    per_role("namespace_deployment_role:kvgate_headroom:ratio", 1.0, 1.5),
    per_md("namespace_deployment:kvgate_headroom:ratio", 1.0),
    per_pod(
        "namespace_deployment_pod_role:sglang_num_used_tokens:max",
        {p: ENGINE_LOAD[p][0] for p in VERIFIED},
    ),
    per_role("namespace_deployment_role:sglang_num_used_tokens:sum", 150_000, 30_000),
    per_pod(
        "namespace_deployment_pod_role:kvgate_kv_usage:ratio",
        {"llama-r1-decode-0": 0.5, "llama-r1-decode-1": 0.9, "llama-r1-prefill-0": 0.2},
    ),
    per_role("namespace_deployment_role:kvgate_kv_usage:ratio", 150_000 / 220_000, 0.2),
    per_pod(
        "namespace_deployment_pod_role:sglang_num_queue_reqs:sum",
        {"llama-r1-decode-0": 2, "llama-r1-decode-1": 3, "llama-r1-prefill-0": 5},
    ),
    per_pod(
        "namespace_deployment_pod_role:sglang_num_running_reqs:sum",
        {"llama-r1-decode-0": 10, "llama-r1-decode-1": 14, "llama-r1-prefill-0": 1},
    ),
    per_role("namespace_deployment_role:sglang_num_queue_reqs:sum", 5, 5),
    per_role("namespace_deployment_role:sglang_num_running_reqs:sum", 24, 1),
    # Per verified replica: decode (2 + 3) / 2 and (10 + 14) / 2; the unverified prefill-1
    # (7 queued, 3 running) is in neither the sum nor the count.
    per_role("namespace_deployment_role:sglang_num_queue_reqs:avg", 2.5, 5),
    per_role("namespace_deployment_role:sglang_num_running_reqs:avg", 12, 1),
]
RECORDING_TESTS: dict[str, Any] = {
    "interval": "1m",
    "input_series": recording_input(),
    "promql_expr_test": RECORDING_EXPECTATIONS,
}


def test_every_recording_rule_has_an_expectation(groups: list[dict[str, Any]]) -> None:
    records = [r["record"] for g in groups for r in g["rules"] if "record" in r]
    assert records, "the chart records nothing"
    assert sorted(records) == sorted(e["expr"] for e in RECORDING_EXPECTATIONS)


def test_recording_rules_count_only_verified_engines_of_the_leading_replica(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    write_tests(tmp_path, groups, [RECORDING_TESTS])
    result = run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_recording_rule_that_counted_an_unverified_engine_would_fail(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    wrong = copy.deepcopy(RECORDING_TESTS)
    # As if prefill-1 (gate False, pool 50,000) counted: the role's smallest pool would be it.
    wrong["promql_expr_test"][2] = per_role(
        "namespace_deployment_role:kvgate_verified_kv_pool_tokens:min", 100_000, 50_000
    )
    write_tests(tmp_path, groups, [wrong])
    result = run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "kvgate_verified_kv_pool_tokens:min" in result.stdout + result.stderr
