"""The alerts on a ModelDeployment's life through Prometheus' own promtool (``promtool test
rules``, the same rendered rules as test_chart_promtool.py): a refused rollout and a KV canary
violation fire from the first count of a new series, and an engine pod unverified for longer
than its verify timeout fires on the leading replica only; each resolves when its cause goes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_chart_promtool import (  # the fixtures and helpers of the chart's promtool tests
    groups,
    operator_series,
    promtool,
    run,
    write_tests,
)

__all__ = ["groups", "promtool"]  # fixtures used by name below
LEADER, STANDBY = "10.0.0.9:8080", "10.0.0.8:8080"
POD = {"namespace": "models", "deployment": "llama", "pod": "llama-r2-decode-0", "role": "decode"}


def _run(promtool: Path, groups: list[dict[str, Any]], tmp_path: Path, test: Any) -> str:
    write_tests(tmp_path, groups, [test])
    result = run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _alerts(name: str, *labels: dict[str, str]) -> list[dict[str, Any]]:
    return [{"exp_labels": {"severity": "warning", **one}} for one in labels]


REFUSED = {"namespace": "models", "deployment": "llama", "reason": "KvPoolTooSmall"}


def test_the_first_refusal_of_a_model_deployment_fires_and_resolves_after_the_window(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    # The operator creates a refusal's series at its first count: it is scraped at 1, never 0.
    refused = operator_series("kvgate_rollouts_refused_total", LEADER, "_ _ _ 1x60", **REFUSED)
    # Another ModelDeployment's series, there from the start, counts a second refusal at 25m.
    later = {**REFUSED, "deployment": "other"}
    again = operator_series("kvgate_rollouts_refused_total", LEADER, "1x24 2x40", **later)
    test = {
        "interval": "1m",
        "input_series": [refused, again],
        "alert_rule_test": [
            {
                "eval_time": "2m",
                "alertname": "KvgateRolloutRefused",
                "exp_alerts": _alerts("KvgateRolloutRefused", later),
            },
            {
                "eval_time": "4m",
                "alertname": "KvgateRolloutRefused",
                "exp_alerts": _alerts("KvgateRolloutRefused", REFUSED, later),
            },
            # No refusal within refusedRolloutWindow (15m): resolved.
            {"eval_time": "20m", "alertname": "KvgateRolloutRefused", "exp_alerts": []},
            # A second refusal of a series that was already there: counted by increase().
            {
                "eval_time": "27m",
                "alertname": "KvgateRolloutRefused",
                "exp_alerts": _alerts("KvgateRolloutRefused", later),
            },
            {"eval_time": "45m", "alertname": "KvgateRolloutRefused", "exp_alerts": []},
        ],
    }
    _run(promtool, groups, tmp_path, test)


def test_a_kv_canary_violation_fires_for_its_pod_and_resolves_after_the_window(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    violation = operator_series("kvgate_kv_canary_violations_total", LEADER, "_ _ _ 1x40", **POD)
    test = {
        "interval": "1m",
        "input_series": [violation],
        "alert_rule_test": [
            {"eval_time": "2m", "alertname": "KvgateKvCanaryViolation", "exp_alerts": []},
            {
                "eval_time": "4m",
                "alertname": "KvgateKvCanaryViolation",
                "exp_alerts": _alerts("KvgateKvCanaryViolation", POD),
            },
            {"eval_time": "30m", "alertname": "KvgateKvCanaryViolation", "exp_alerts": []},
        ],
    }
    _run(promtool, groups, tmp_path, test)


def test_an_engine_unverified_past_its_verify_timeout_fires_on_the_leader_only(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    # Unverified since t=0 (Unix time 0 is promtool's start), verify timeout 5 minutes; the pod
    # turns verified at minute 15 (its since-series ends). The standby still reports an old since.
    since = "kvgate_engine_unverified_since_timestamp_seconds"
    timeout = "kvgate_engine_verify_timeout_seconds"
    other = {**POD, "pod": "llama-r2-decode-1"}
    test = {
        "interval": "1m",
        "input_series": [
            operator_series(since, LEADER, "0x14 stale", **POD),
            operator_series(timeout, LEADER, "300x40", **POD),
            # Unverified since minute 10: within its timeout until minute 15.
            operator_series(since, LEADER, "_x9 600x30", **other),
            operator_series(timeout, LEADER, "300x40", **other),
            operator_series(since, STANDBY, "0x40", **{**POD, "pod": "llama-r1-decode-0"}),
            operator_series(timeout, STANDBY, "300x40", **{**POD, "pod": "llama-r1-decode-0"}),
            operator_series("kvgate_leader", LEADER, "1x40"),
            operator_series("kvgate_leader", STANDBY, "0x40"),
        ],
        "alert_rule_test": [
            # 5 minutes unverified, then unverifiedFor (1m): nothing before minute 6.
            {"eval_time": "5m", "alertname": "KvgateEngineUnverified", "exp_alerts": []},
            {
                "eval_time": "7m",
                "alertname": "KvgateEngineUnverified",
                "exp_alerts": _alerts("KvgateEngineUnverified", POD),
            },
            {
                "eval_time": "14m",
                "alertname": "KvgateEngineUnverified",
                "exp_alerts": _alerts("KvgateEngineUnverified", POD),
            },
            # The first pod verified; the second unverified for 5 min 30 s... and 1m more.
            {
                "eval_time": "18m",
                "alertname": "KvgateEngineUnverified",
                "exp_alerts": _alerts("KvgateEngineUnverified", other),
            },
        ],
    }
    _run(promtool, groups, tmp_path, test)
