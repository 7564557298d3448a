"""Look-alike series change nothing (issue 46, item 7), through Prometheus' own promtool.

A series with the right name and labels from a scrape job that is not one of kvgate's own
monitors (a tenant's ServiceMonitor on a Service named like kvgate's, a tenant's PodMonitor named
like kvgate's engine monitor, an annotation-based scrape of any pod) must move no recorded series,
no custom metric the prometheus-adapter rules serve an HPA, no alert, and must not hold
KvgateOperatorDown off. Prometheus sets ``job`` on every target (a target cannot, without
honorLabels), so the chart's rules and the adapter's read only the jobs of kvgate's monitors, and
recorded series (no job label) only with ``job=""``.

Each look-alike carries the labels of a genuine series (the same instance too) and a hostile
value; the expectations are the genuine ones of test_chart_promtool.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from helm_runner import ROOT
from test_chart_autoscaling_queries import doc_queries, expect, ttft
from test_chart_promtool import (  # the fixtures and helpers of the chart's promtool tests
    ENGINE_LOAD,
    LEADER,
    OPERATOR_POD_SERIES,
    RECORDING_EXPECTATIONS,
    engine,
    groups,
    promtool,
    recording_input,
    run,
    series,
    write_tests,
)

__all__ = ["groups", "promtool"]  # fixtures used by name below
ADAPTER_RULES = ROOT / "docs" / "autoscaling" / "prometheus-adapter-rules.yaml"
# Jobs Prometheus gives to what a tenant may set up: a ServiceMonitor on their own Service named
# like kvgate's (its job is the bare Service name), a PodMonitor in their namespace named like
# kvgate's engine monitor, a PodMonitor of their own, and the cluster's annotation-based scrape.
LOOKALIKE_JOBS = ("kvgate-metrics", "models/kvgate-engines", "models/mine", "kubernetes-pods")
# What a look-alike of each series says: the opposite of the truth, or far from it.
HOSTILE = {
    "kvgate_leader": 1,
    "kvgate_engine_verified": 1,  # the unverified prefill-1 "verified"
    "kvgate_engine_kv_pool_tokens": 7,  # a pool that would set every minimum
    "kvgate_context_length_tokens": 3,
    "sglang:num_used_tokens": 9_000_000,
    "sglang:num_queue_reqs": 1_000,
    "sglang:num_running_reqs": 1_000,
    "sglang:token_usage": 0.99,
}
TOKEN_USAGE = 0.25  # the genuine sglang:token_usage of every engine


def _parse(text: str) -> tuple[str, dict[str, str]]:
    name, _, inner = text.partition("{")
    labels = dict(re.findall(r'(\w+)="([^"]*)"', inner))
    return name, labels


def lookalikes(genuine: list[dict[str, str]]) -> list[dict[str, str]]:
    """Every genuine series again from each look-alike job, with its hostile value."""
    out = []
    for one in genuine:
        name, labels = _parse(one["series"])
        length = len(one["values"].split()) if "x" not in one["values"] else None
        values = f"{HOSTILE[name]}x10" if length is None else f"{HOSTILE[name]}x{length - 1}"
        for job in LOOKALIKE_JOBS:
            out.append(series(name, {**labels, "job": job}, values))
    return out


def recorded_lookalikes() -> list[dict[str, str]]:
    """A scraped series named like each recording rule's output, for every series it records
    (the tenant's job, a hostile value): a reader of recorded series must ignore them."""
    out = []
    for expectation in RECORDING_EXPECTATIONS:
        for sample in expectation["exp_samples"]:
            name, labels = _parse(sample["labels"])
            out.append(series(name, {**labels, "job": "models/mine"}, "1e9x10"))
    return out


def genuine_input() -> list[dict[str, str]]:
    out = recording_input()
    for pod, (role, *_rest) in OPERATOR_POD_SERIES.items():
        labels = {**engine(pod), "engine_type": role, "tp_rank": "0"}
        out.append(series("sglang:token_usage", labels, f"{TOKEN_USAGE}x10"))
    return out


def _on_job_free_records(expectation: dict[str, Any]) -> dict[str, Any]:
    """The expectation read the way every reader of a recorded series reads it: job=""."""
    return {**expectation, "expr": expectation["expr"] + '{job=""}'}


def adapter_queries() -> dict[str, str]:
    """Each custom metric the adapter rules serve an HPA, as the adapter asks Prometheus for the
    four engine pods of ModelDeployment llama in namespace models (its metricsQuery with
    <<.Series>>, <<.LabelMatchers>> and <<.GroupBy>> filled in, as for an HPA Pods metric)."""
    pods = "|".join(OPERATOR_POD_SERIES)
    matchers = f'namespace="models",pod=~"{pods}"'
    queries = {}
    for rule in yaml.safe_load(ADAPTER_RULES.read_text())["rules"]:
        listed = re.search(r'__name__=~"([^"]+)"', rule["seriesQuery"])
        names = (
            [n for n in SERIES_NAMES if re.fullmatch(listed.group(1), n)]
            if listed
            else [rule["seriesQuery"].split("{", 1)[0]]
        )
        for name in names:
            query = rule["metricsQuery"].replace("<<.Series>>", name)
            query = query.replace("<<.LabelMatchers>>", matchers).replace("<<.GroupBy>>", "pod")
            queries[name] = query
    return queries


SERIES_NAMES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:kv_used_tokens",
    "namespace_deployment_pod_role:sglang_num_running_reqs:sum",
    "namespace_deployment_pod_role:sglang_num_queue_reqs:sum",
)
DECODE_1 = {
    "namespace": "models",
    "deployment": "llama",
    "pod": "llama-r1-decode-1",
    "role": "decode",
}
VERIFIED = [p for p, (_role, gate, _pool) in OPERATOR_POD_SERIES.items() if gate == 1]


def _per_pod(query: str, values: dict[str, float]) -> dict[str, Any]:
    samples = [{"labels": f'{{pod="{pod}"}}', "value": v} for pod, v in values.items()]
    return {"expr": query, "eval_time": "5m", "exp_samples": samples}


def adapter_expectations() -> list[dict[str, Any]]:
    queries = adapter_queries()
    assert set(queries) == {
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:kv_used_tokens",
        "sglang:token_usage",
        "namespace_deployment_pod_role:sglang_num_running_reqs:sum",
        "namespace_deployment_pod_role:sglang_num_queue_reqs:sum",
        "namespace_deployment_pod_role:kvgate_kv_usage:ratio",
    }, queries
    queued = {pod: sum(load[1]) for pod, load in ENGINE_LOAD.items()}
    running = {pod: sum(load[2]) for pod, load in ENGINE_LOAD.items()}
    usage = {"llama-r1-decode-0": 0.5, "llama-r1-decode-1": 0.9, "llama-r1-prefill-0": 0.2}
    return [
        # Every engine the HPA's selector matches (the raw SGLang gauges).
        _per_pod(queries["sglang:num_queue_reqs"], queued),
        _per_pod(queries["sglang:num_running_reqs"], running),
        _per_pod(queries["sglang:token_usage"], dict.fromkeys(OPERATOR_POD_SERIES, TOKEN_USAGE)),
        # Verified engines only (the chart's recorded series).
        _per_pod(
            queries["namespace_deployment_pod_role:sglang_num_queue_reqs:sum"],
            {p: queued[p] for p in VERIFIED},
        ),
        _per_pod(
            queries["namespace_deployment_pod_role:sglang_num_running_reqs:sum"],
            {p: running[p] for p in VERIFIED},
        ),
        _per_pod(queries["namespace_deployment_pod_role:kvgate_kv_usage:ratio"], usage),
    ]


def _lookalike_inputs() -> list[dict[str, str]]:
    genuine = genuine_input()
    return genuine + lookalikes(genuine) + recorded_lookalikes()


def _run(promtool: Path, groups: list[dict[str, Any]], tmp_path: Path, test: Any) -> None:
    write_tests(tmp_path, groups, [test])
    result = run(promtool, "test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_lookalike_series_from_another_job_changes_no_recorded_series(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    test = {
        "interval": "1m",
        "input_series": _lookalike_inputs(),
        "promql_expr_test": [_on_job_free_records(e) for e in RECORDING_EXPECTATIONS],
    }
    _run(promtool, groups, tmp_path, test)


def test_a_lookalike_series_from_another_job_moves_no_custom_metric_an_hpa_reads(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    test = {
        "interval": "1m",
        "input_series": _lookalike_inputs(),
        "promql_expr_test": adapter_expectations(),
    }
    _run(promtool, groups, tmp_path, test)


def test_a_lookalike_series_from_another_job_fires_no_engine_alert(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    # Genuinely only decode-1 holds more than 80 % of its verified pool (90 %), and no engine
    # refuses a request or runs short of headroom; the look-alikes use 9,000,000 tokens of a
    # 7-token "pool", answer 400 every minute and report a headroom of 0.01, from their own
    # jobs, for 40 minutes.
    genuine = genuine_input()
    hostile = [
        series(name, {**labels, "job": job}, values)
        for one in genuine
        for name, labels in [_parse(one["series"])]
        if name in ("sglang:num_used_tokens", "kvgate_engine_kv_pool_tokens", "kvgate_leader")
        for job in LOOKALIKE_JOBS
        for values in [f"{HOSTILE[name]}x40"]
    ]
    for pod, (role, *_rest) in OPERATOR_POD_SERIES.items():
        labels = {**engine(pod), "status_code": "400", "method": "POST", "endpoint": "/generate"}
        mine = {"namespace": "models", "deployment": "llama", "pod": pod, "role": role}
        for job in LOOKALIKE_JOBS:
            hostile.append(series("sglang:http_responses_total", {**labels, "job": job}, "0+5x40"))
            headroom = {**mine, "job": job, "instance": LEADER}
            hostile.append(series("kvgate_engine_headroom_ratio", headroom, "0.01x40"))
    genuine = [{**g, "values": g["values"].replace("x10", "x40")} for g in genuine]
    test = {
        "interval": "1m",
        "input_series": genuine + hostile,
        "alert_rule_test": [
            {
                "eval_time": "30m",
                "alertname": "KvgateEngineKvUsageHigh",
                "exp_alerts": [{"exp_labels": {"severity": "warning", **DECODE_1}}],
            },
            {"eval_time": "30m", "alertname": "KvgateEngineRejectingRequests", "exp_alerts": []},
            {"eval_time": "30m", "alertname": "KvgateEngineHeadroomLow", "exp_alerts": []},
        ],
    }
    _run(promtool, groups, tmp_path, test)


def test_a_lookalike_leader_series_cannot_silence_operator_down(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    # kvgate's operator is gone (no series of its job); a tenant's pods say kvgate_leader 1 with
    # the release's namespace and the operator's old instance, from every look-alike job.
    leaders = [
        series(
            "kvgate_leader",
            {"job": job, "namespace": "kvgate-system", "instance": LEADER, "pod": "kvgate-0"},
            "1x20",
        )
        for job in LOOKALIKE_JOBS
    ]
    test = {
        "interval": "1m",
        "input_series": leaders,
        "alert_rule_test": [
            {
                "eval_time": "10m",
                "alertname": "KvgateOperatorDown",
                "exp_alerts": [
                    # absent() of a comparison names no labels
                    {"exp_labels": {"severity": "warning"}}
                ],
            }
        ],
    }
    _run(promtool, groups, tmp_path, test)


def test_the_genuine_operator_holds_operator_down_off(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    # The pin does not lose the real leader: its series (the ServiceMonitor's job, the
    # operator's namespace) keeps the alert quiet.
    leader = series(
        "kvgate_leader",
        {"job": "kvgate-system/kvgate-metrics", "namespace": "kvgate-system", "instance": LEADER},
        "1x20",
    )
    test = {
        "interval": "1m",
        "input_series": [leader],
        "alert_rule_test": [
            {"eval_time": "10m", "alertname": "KvgateOperatorDown", "exp_alerts": []}
        ],
    }
    _run(promtool, groups, tmp_path, test)


def test_a_lookalike_series_from_another_job_moves_no_keda_trigger_of_the_docs(
    promtool: Path, groups: list[dict[str, Any]], tmp_path: Path
) -> None:
    # docs/autoscaling.md's KEDA queries, on the same genuine series as
    # test_chart_autoscaling_queries.py, plus each series again from every look-alike job, and
    # scraped series named like the records (an engine's first tokens taking 20-40 s).
    genuine = recording_input()
    genuine += ttft("llama-r1-decode-0", "1", 60) + ttft("llama-r1-decode-1", "1", 30)
    hostile = lookalikes(recording_input()) + recorded_lookalikes()
    for job in LOOKALIKE_JOBS:
        for one in ttft("llama-r1-decode-0", "40", 600):
            name, labels = _parse(one["series"])
            hostile.append(series(name, {**labels, "job": job}, one["values"]))
    queries = doc_queries()
    test = {
        "interval": "1m",
        "input_series": genuine + hostile,
        "promql_expr_test": [
            expect(queries["queued-per-prefill"], 5),
            expect(queries["ttft-p90"], 0.98),
            expect(queries["kv-usage-decode"], 150_000 / 220_000),
        ],
    }
    _run(promtool, groups, tmp_path, test)
