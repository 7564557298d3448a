"""The chart's PrometheusRule, rendered by the real helm and read with a real PromQL parser
(promql-parser: Prometheus' grammar and function signatures, in Rust): every expression
parses and type-checks, selects only metrics the operator exports, and the annotations use only
labels the expression yields; the rule groups have the structure Prometheus and the Prometheus
Operator accept."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser as promql
import pytest
from helm_runner import ROOT, Helm
from kvgate.kube import metrics

MONITORING = ("monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule")
ENABLED = ("metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true")
NAMESPACE = "kvgate-system"
# Labels every scraped series has, whatever the scrape config (Prometheus adds them).
TARGET_LABELS = frozenset({"job", "instance"})
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
GROUP_KEYS = {"name", "rules", "interval", "labels", "limit", "partial_response_strategy"}
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}
# The template actions kvgate's annotations may use (Prometheus' alert template data).
ACTION = re.compile(
    r"^\s*(?:\$labels\.(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)"
    r"|\$externalLabels\.[a-zA-Z_][a-zA-Z0-9_]*"
    r'|\$value(?:\s*\|\s*(?:printf\s+"[^"]*"|humanize|humanizePercentage|humanizeDuration))?)\s*$'
)


@pytest.fixture(scope="module")
def spec(helm: Helm) -> dict[str, Any]:
    rule: dict[str, Any] = helm.template(*ENABLED, api_versions=MONITORING).one("PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    return dict(rule["spec"])


# --- what the operator exports ----------------------------------------------------------------


def exported_series() -> dict[str, frozenset[str]]:
    """Every series name kvgate.kube.metrics.REGISTRY serves, with its label names."""
    label_names = {
        collector._name: frozenset(collector._labelnames)  # prometheus_client keeps them here
        for collector in vars(metrics).values()
        if hasattr(collector, "_labelnames") and hasattr(collector, "_name")
    }
    for collector in vars(metrics).values():  # a collector serving several families
        for name, labels in getattr(collector, "families", {}).items():
            label_names[name] = frozenset(labels)
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
    }
    series: dict[str, frozenset[str]] = {}
    for family in metrics.REGISTRY.collect():
        assert family.name in label_names, f"{family.name} is not a kvgate.kube.metrics attribute"
        own = label_names[family.name]
        for suffix in suffixes[family.type]:
            series[family.name + suffix] = own | ({"le"} if suffix == "_bucket" else set())
    return series


EXPORTED = exported_series()
# What the engine PodMonitor scrapes that the engine rules read: SGLang 0.5.23's names and label
# names (srt/observability/metrics_collector.py: the scheduler collector's labels;
# http_request_metrics.py), plus the target labels the Prometheus Operator adds to a PodMonitor's
# series (namespace, pod, container, endpoint).
POD_TARGET = frozenset({"namespace", "pod", "container", "endpoint"})
ENGINE_SERIES = {
    "sglang:num_used_tokens": POD_TARGET
    | {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"},
    "sglang:http_responses_total": POD_TARGET | {"status_code", "method"},
    "sglang:num_queue_reqs": POD_TARGET
    | {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"},
    "sglang:num_running_reqs": POD_TARGET
    | {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"},
}


# --- what an expression yields ----------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    type: str  # vector, scalar, matrix, string
    labels: frozenset[str] | None  # None: unknown (an unknown metric was reported already)


def _unknown(shape: Shape) -> bool:
    return shape.labels is None


def selected_metric(selector: Any) -> tuple[str | None, str | None]:
    """(metric name, problem) of a vector selector."""
    if selector.name:
        return selector.name, None
    for matcher in selector.matchers.matchers:
        if matcher.name == "__name__":
            if matcher.op != promql.MatchOp.Equal:
                return None, f"selects metrics by a pattern ({matcher}); name them"
            return matcher.value, None
    return None, f"selector {selector} names no metric"


class Analysis:
    """Walks one parsed expression: the metrics it selects and the labels of its result
    (the way Prometheus' engine builds result labels: aggregation grouping, one-to-one
    matching with on/ignoring, group_left/right, set operators, absent)."""

    def __init__(self, available: dict[str, frozenset[str]]) -> None:
        self.available = available
        self.problems: list[str] = []
        self.metrics: set[str] = set()

    def selector(self, selector: Any) -> frozenset[str] | None:
        name, problem = selected_metric(selector)
        if problem is not None:
            self.problems.append(problem)
            return None
        assert name is not None
        self.metrics.add(name)
        if name not in self.available:
            self.problems.append(f"metric {name!r} is not exported by the kvgate operator")
            return None
        matched = {m.name for m in selector.matchers.matchers if m.name != "__name__"}
        return self.available[name] | TARGET_LABELS | matched

    def shape(self, node: Any) -> Shape:
        if isinstance(node, promql.VectorSelector):
            return Shape("vector", self.selector(node))
        if isinstance(node, promql.MatrixSelector):
            return Shape("matrix", self.selector(node.vector_selector))
        if isinstance(node, promql.NumberLiteral):
            return Shape("scalar", frozenset())
        if isinstance(node, promql.StringLiteral):
            return Shape("string", frozenset())
        if isinstance(node, promql.ParenExpr | promql.UnaryExpr):
            return self.shape(node.expr)
        if isinstance(node, promql.SubqueryExpr):
            return Shape("matrix", self.shape(node.expr).labels)
        if isinstance(node, promql.AggregateExpr):
            return self.aggregate(node)
        if isinstance(node, promql.Call):
            return self.call(node)
        if isinstance(node, promql.BinaryExpr):
            return self.binary(node)
        raise AssertionError(f"unhandled PromQL node {type(node).__name__}: {node}")

    def aggregate(self, node: Any) -> Shape:
        inner = self.shape(node.expr)
        if node.param is not None:
            self.shape(node.param)
        op = str(node.op)
        if _unknown(inner):
            return Shape("vector", None)
        assert inner.labels is not None
        if op in ("topk", "bottomk", "limitk", "limit_ratio"):
            return Shape("vector", inner.labels)
        modifier = node.modifier
        if modifier is None:
            grouped: frozenset[str] = frozenset()
        elif modifier.type == promql.AggModifierType.By:
            grouped = inner.labels & set(modifier.labels)
        else:
            grouped = inner.labels - set(modifier.labels)
        if op == "count_values" and isinstance(node.param, promql.StringLiteral):
            grouped |= {node.param.val}
        return Shape("vector", grouped)

    def call(self, node: Any) -> Shape:
        name = node.func.name
        args = [self.shape(arg) for arg in node.args]
        result_type = str(node.func.return_type).rsplit(".", 1)[-1].lower()
        if result_type != "vector":
            return Shape(result_type, frozenset())
        if name in ("absent", "absent_over_time"):
            # Prometheus: the equality matchers of a plain selector argument, else none.
            (arg,) = node.args
            selector = arg.vector_selector if isinstance(arg, promql.MatrixSelector) else arg
            if not isinstance(selector, promql.VectorSelector):
                return Shape("vector", frozenset())
            return Shape(
                "vector",
                frozenset(
                    m.name
                    for m in selector.matchers.matchers
                    if m.op == promql.MatchOp.Equal and m.name != "__name__"
                ),
            )
        inputs = [a for a in args if a.type in ("vector", "matrix")]
        if not inputs:
            return Shape("vector", frozenset())  # vector(s), time-based functions
        labels = inputs[0].labels
        if labels is None:
            return Shape("vector", None)
        if name in ("label_replace", "label_join"):
            destination = node.args[1]
            labels |= {destination.val} if isinstance(destination, promql.StringLiteral) else set()
        if name == "histogram_quantile":
            labels -= {"le"}
        return Shape("vector", labels)

    def binary(self, node: Any) -> Shape:
        lhs, rhs = self.shape(node.lhs), self.shape(node.rhs)
        op = str(node.op)
        if lhs.type == "scalar" and rhs.type == "scalar":
            return Shape("scalar", frozenset())
        if lhs.type == "scalar":
            return Shape("vector", rhs.labels)
        if rhs.type == "scalar":
            return Shape("vector", lhs.labels)
        if _unknown(lhs) or _unknown(rhs):
            return Shape("vector", None)
        assert lhs.labels is not None and rhs.labels is not None
        if op in ("and", "unless"):
            return Shape("vector", lhs.labels)
        if op == "or":  # a result series comes from either side
            return Shape("vector", lhs.labels & rhs.labels)
        modifier = node.modifier
        card = modifier.card if modifier is not None else promql.VectorMatchCardinality.OneToOne
        matching = modifier.matching if modifier is not None else None
        if card == promql.VectorMatchCardinality.ManyToOne:
            return Shape("vector", lhs.labels | set(modifier.group_labels or []))
        if card == promql.VectorMatchCardinality.OneToMany:
            return Shape("vector", rhs.labels | set(modifier.group_labels or []))
        if matching is None:
            return Shape("vector", lhs.labels)
        if matching.type == promql.LabelModifierType.Include:  # on (...): only those remain
            return Shape("vector", lhs.labels & set(matching.labels))
        return Shape("vector", lhs.labels - set(matching.labels))


def _duration_problem(where: str, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"{where}: duration {value!r} is not a string"
    try:
        promql.parse_duration(value)
    except ValueError as error:
        return f"{where}: duration {value!r} does not parse: {error}"
    return None


def _label_map_problems(where: str, value: Any) -> Iterator[str]:
    if not isinstance(value, dict):
        yield f"{where}: not a map"
        return
    for key, text in value.items():
        if not isinstance(key, str) or not LABEL_NAME.match(key):
            yield f"{where}: {key!r} is not a label name"
        if not isinstance(text, str):
            yield f"{where}.{key}: {text!r} is not a string"


def _annotation_problems(where: str, text: str, labels: frozenset[str] | None) -> Iterator[str]:
    if text.count("{{") != text.count("}}"):
        yield f"{where}: unbalanced template delimiters"
    for action in re.findall(r"\{\{(.*?)\}\}", text, flags=re.S):
        found = ACTION.match(action)
        if found is None:
            yield f"{where}: template action {{{{{action}}}}} is not one kvgate's rules use"
            continue
        label = found.group("label")
        if label is not None and labels is not None and label not in labels:
            yield (
                f"{where}: $labels.{label} is not a label of the expression's result "
                f"(it yields {sorted(labels)})"
            )


def rule_problems(spec: dict[str, Any]) -> list[str]:
    """Everything wrong with a PrometheusRule spec; [] when Prometheus would load it as meant."""
    problems: list[str] = []
    if set(spec) != {"groups"} or not isinstance(spec["groups"], list) or not spec["groups"]:
        return ["spec must hold exactly a non-empty list of groups"]
    available = dict(EXPORTED) | ENGINE_SERIES
    for group in spec["groups"]:
        for rule in group.get("rules") or []:
            if isinstance(rule, dict) and isinstance(rule.get("record"), str):
                available[rule["record"]] = frozenset()  # refined below; names are what count
    group_names: set[str] = set()
    for g, group in enumerate(spec["groups"]):
        where = f"groups[{g}]"
        if not isinstance(group, dict):
            problems.append(f"{where}: not a map")
            continue
        if extra := set(group) - GROUP_KEYS:
            problems.append(f"{where}: unknown keys {sorted(extra)}")
        name = group.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}: no name")
        elif name in group_names:
            problems.append(f"{where}: duplicate group name {name!r}")
        group_names.add(str(name))
        if "interval" in group and (p := _duration_problem(f"{where}.interval", group["interval"])):
            problems.append(p)
        rules = group.get("rules")
        if not isinstance(rules, list) or not rules:
            problems.append(f"{where}: no rules")
            continue
        alerts: set[str] = set()
        for r, rule in enumerate(rules):
            problems.extend(_one_rule(f"{where}.rules[{r}]", rule, available, alerts))
    return problems


def _one_rule(
    where: str, rule: Any, available: dict[str, frozenset[str]], alerts: set[str]
) -> Iterator[str]:
    if not isinstance(rule, dict):
        yield f"{where}: not a map"
        return
    if extra := set(rule) - RULE_KEYS:
        yield f"{where}: unknown keys {sorted(extra)}"
    alert, record = rule.get("alert"), rule.get("record")
    if (alert is None) == (record is None):
        yield f"{where}: needs exactly one of alert and record"
        return
    name = str(alert or record)
    where = f"{where} ({name})"
    if record is not None:
        if not METRIC_NAME.match(name):
            yield f"{where}: record {name!r} is not a metric name"
        for key in ("for", "keep_firing_for", "annotations"):
            if key in rule:
                yield f"{where}: a recording rule has no {key}"
    else:
        if not LABEL_NAME.match(name):
            yield f"{where}: alert name {name!r} is not CamelCase identifier-like"
        if name in alerts:
            yield f"{where}: duplicate alert"
        alerts.add(name)
    for key in ("for", "keep_firing_for"):
        if key in rule and (p := _duration_problem(f"{where}.{key}", rule[key])):
            yield p
    labels = rule.get("labels", {})
    yield from _label_map_problems(f"{where}.labels", labels)
    annotations = rule.get("annotations", {})
    yield from _label_map_problems(f"{where}.annotations", annotations)
    expr = rule.get("expr")
    if not isinstance(expr, str) or not expr.strip():
        yield f"{where}: no expr"
        return
    try:
        parsed = promql.parse(expr)
    except ValueError as error:
        yield f"{where}: expr does not parse: {error}: {expr}"
        return
    analysis = Analysis(available)
    shape = analysis.shape(parsed)
    yield from (f"{where}: {p}" for p in analysis.problems)
    if shape.type != "vector":
        yield f"{where}: expr yields a {shape.type}, not an instant vector"
    if alert is not None:
        if not isinstance(labels, dict) or not str(labels.get("severity", "")).strip():
            yield f"{where}: no severity label"
        if isinstance(annotations, dict):
            for key in ("summary", "description"):
                if not str(annotations.get(key, "")).strip():
                    yield f"{where}: no {key} annotation"
            for key, text in annotations.items():
                yield from _annotation_problems(
                    f"{where}.annotations.{key}", str(text), shape.labels
                )


def _alert(spec: dict[str, Any], name: str) -> dict[str, Any]:
    (rule,) = [r for g in spec["groups"] for r in g["rules"] if r.get("alert") == name]
    return dict(rule)


# --- the chart's rules ------------------------------------------------------------------------


def test_every_rule_parses_selects_exported_metrics_and_annotates_with_its_labels(
    spec: dict[str, Any],
) -> None:
    assert rule_problems(spec) == []
    names = [r["alert"] for g in spec["groups"] for r in g["rules"] if "alert" in r]
    assert names == [
        "KvgateRolloutRefused",
        "KvgateEngineHeadroomLow",
        "KvgateOperatorDown",
        "KvgateVerificationStale",
        "KvgateKvCanaryViolation",
        "KvgateEngineUnverified",
        "KvgateKvPoolEstimateOptimistic",
        "KvgateEngineKvUsageHigh",
        "KvgateEngineRejectingRequests",
    ]


def test_operator_down_fires_when_no_replica_of_this_release_leads(spec: dict[str, Any]) -> None:
    rule = _alert(spec, "KvgateOperatorDown")
    parsed = promql.parse(rule["expr"])
    assert isinstance(parsed, promql.Call) and parsed.func.name == "absent"
    (inner,) = parsed.args
    assert isinstance(inner, promql.BinaryExpr) and str(inner.op) == "=="
    assert isinstance(inner.lhs, promql.VectorSelector)
    assert inner.lhs.name == "kvgate_leader"
    # The operator's own scrape job (the ServiceMonitor's <namespace>/<Service>) in this
    # release's namespace: a kvgate_leader of any other job cannot hold the alert off.
    assert [(m.name, m.value) for m in inner.lhs.matchers.matchers] == [
        ("job", f"{NAMESPACE}/kvgate-metrics"),
        ("namespace", NAMESPACE),
    ]
    assert isinstance(inner.rhs, promql.NumberLiteral) and inner.rhs.val == 1
    assert rule["for"] == "5m"
    assert rule["labels"] == {"severity": "warning"}


def test_verification_stale_joins_age_interval_readiness_and_the_leader(
    spec: dict[str, Any],
) -> None:
    rule = _alert(spec, "KvgateVerificationStale")
    analysis = Analysis(EXPORTED)
    shape = analysis.shape(promql.parse(rule["expr"]))
    assert analysis.metrics == {
        "kvgate_engine_last_verified_timestamp_seconds",
        "kvgate_engine_reverify_interval_seconds",
        "kvgate_engine_pod_ready",
        "kvgate_leader",
    }
    assert shape.labels is not None and {"namespace", "deployment", "pod", "role"} <= shape.labels
    job = '{job="kvgate-system/kvgate-metrics"}'
    assert " ".join(rule["expr"].split()) == (
        f"( time() - kvgate_engine_last_verified_timestamp_seconds{job} > 3 * "
        f"kvgate_engine_reverify_interval_seconds{job} ) and on (namespace, deployment, pod, role, "
        f"instance) (kvgate_engine_pod_ready{job} == 1) and on (instance) (kvgate_leader{job} == 1)"
    )
    assert "{{ $labels.pod }}" in rule["annotations"]["description"]
    assert "{{ $value | humanizeDuration }}" in rule["annotations"]["description"]
    assert rule["for"] == "1m"


def test_alert_durations_are_values(helm: Helm) -> None:
    spec = helm.template(
        *ENABLED,
        "metrics.prometheusRule.operatorDownFor=10m",
        "metrics.prometheusRule.verificationStaleFor=2m",
        "metrics.prometheusRule.severity=critical",
        api_versions=MONITORING,
    ).one("PrometheusRule")["spec"]
    assert rule_problems(spec) == []
    assert _alert(spec, "KvgateOperatorDown")["for"] == "10m"
    assert _alert(spec, "KvgateVerificationStale")["for"] == "2m"
    severities = {
        r["labels"]["severity"] for g in spec["groups"] for r in g["rules"] if "alert" in r
    }
    assert severities == {"critical"}
    bad = helm.template_result(
        *ENABLED, "metrics.prometheusRule.operatorDownFor=5 minutes", api_versions=MONITORING
    )
    assert bad.returncode != 0 and "operatorDownFor" in bad.stderr


def test_the_service_monitor_keeps_the_engine_pods_labels_and_never_honors_a_targets(
    helm: Helm,
) -> None:
    # honorLabels would let a target choose its own job; without it Prometheus renames the
    # series' namespace and pod exported_*, and the monitor puts them back (the alerts name the
    # engine pod, not the operator's). The job is <namespace>/<Service>.
    (endpoint,) = helm.template(*ENABLED, api_versions=MONITORING).one("ServiceMonitor")["spec"][
        "endpoints"
    ]
    assert endpoint.get("honorLabels", False) is False
    assert endpoint["relabelings"] == [
        {
            "sourceLabels": ["__meta_kubernetes_namespace", "__meta_kubernetes_service_name"],
            "separator": "/",
            "targetLabel": "job",
        }
    ]
    assert [r.get("targetLabel") for r in endpoint["metricRelabelings"]] == [
        "namespace",
        "pod",
        None,
    ]


def test_every_exported_metric_is_documented() -> None:
    doc = (ROOT / "docs" / "operating.md").read_text()
    operating = doc.split("## What kvgate reports", 1)[1].split("\n## ", 1)[0]
    families = {
        f.name + ("_total" if f.type == "counter" else "") for f in metrics.REGISTRY.collect()
    }
    assert sorted(f for f in families if f"`{f}`" not in operating) == []


# --- the checker catches what it must ---------------------------------------------------------


def _mutated(spec: dict[str, Any], alert: str, **changes: Any) -> dict[str, Any]:
    copied = copy.deepcopy(spec)
    for group in copied["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                for key, value in changes.items():
                    if value is None:
                        rule.pop(key, None)
                    else:
                        rule[key] = value
    return copied


@pytest.mark.parametrize(
    ("alert", "changes", "expected"),
    [
        (
            "KvgateEngineHeadroomLow",
            {"expr": "min by (namespace) (kvgate_engine_headroom_ratio < 1.1"},
            "expr does not parse: unclosed left parenthesis",
        ),
        (
            "KvgateVerificationStale",
            {"expr": "time() - kvgate_engine_last_verifed_timestamp_seconds > 90"},
            "metric 'kvgate_engine_last_verifed_timestamp_seconds' is not exported",
        ),
        (
            "KvgateRolloutRefused",
            {"expr": "increase(kvgate_rollouts_refused_total) > 0"},
            "expected type matrix in call to function 'increase'",
        ),
        (
            "KvgateRolloutRefused",
            {"expr": "sum(rate(kvgate_rollouts_refused_total[5m]))"},
            "$labels.namespace is not a label of the expression's result",
        ),
        (
            "KvgateOperatorDown",
            {"annotations": {"summary": "down", "description": "{{ $labels.pod }} is down"}},
            "$labels.pod is not a label of the expression's result (it yields [])",
        ),
        ("KvgateOperatorDown", {"for": "5 minutes"}, "duration '5 minutes' does not parse"),
        ("KvgateOperatorDown", {"labels": {"team": "ml"}}, "no severity label"),
        ("KvgateOperatorDown", {"record": "kvgate:down"}, "needs exactly one of alert and record"),
        ("KvgateOperatorDown", {"expr": None}, "no expr"),
        ("KvgateOperatorDown", {"expr": "time()"}, "yields a scalar, not an instant vector"),
        ("KvgateOperatorDown", {"fore": "5m"}, "unknown keys ['fore']"),
        (
            "KvgateEngineHeadroomLow",
            {"annotations": {"summary": "x", "description": "{{ $labels.pod | toUpper }}"}},
            "is not one kvgate's rules use",
        ),
        (
            "KvgateEngineHeadroomLow",
            {"expr": '{__name__=~"kvgate_.*"} < 1'},
            "selects metrics by a pattern",
        ),
    ],
)
def test_the_checker_reports_a_broken_rule(
    spec: dict[str, Any], alert: str, changes: dict[str, Any], expected: str
) -> None:
    problems = rule_problems(_mutated(spec, alert, **changes))
    assert any(expected in p for p in problems), problems


def test_the_label_analysis_follows_prometheus_matching() -> None:
    def labels(expr: str) -> set[str]:
        found = Analysis(EXPORTED).shape(promql.parse(expr)).labels
        assert found is not None
        return set(found)

    pod = {"namespace", "deployment", "pod", "role", "job", "instance"}
    assert labels("kvgate_engine_headroom_ratio") == pod
    assert labels("kvgate_engine_headroom_ratio > on (pod) kvgate_engine_kv_pool_tokens") == {"pod"}
    assert labels(
        "kvgate_engine_headroom_ratio > ignoring (role) kvgate_engine_kv_pool_tokens"
    ) == (pod - {"role"})
    assert labels("sum without (pod) (kvgate_engine_headroom_ratio)") == pod - {"pod"}
    assert labels("kvgate_engine_headroom_ratio and on (instance) kvgate_leader") == pod
    assert labels(
        "kvgate_leader * on (instance) group_left (pod) kvgate_engine_headroom_ratio"
    ) == {
        "job",
        "instance",
        "pod",
    }
    assert labels(
        "histogram_quantile(0.9, rate(kvgate_reconcile_duration_seconds_bucket[5m]))"
    ) == {
        "job",
        "instance",
    }
    assert labels('absent(kvgate_leader{namespace="x", job=~"k.*"})') == {"namespace"}
    assert Path(promql.__file__).exists()  # the compiled parser, not a stand-in


def test_the_rules_read_the_jobs_the_values_name(helm: Helm) -> None:
    # For a Prometheus that scrapes the operator and the engines with its own scrape configs:
    # the rules then read those jobs, and still no other.
    spec = helm.template(
        *ENABLED,
        "metrics.prometheusRule.operatorJob=platform/kvgate",
        "metrics.prometheusRule.engineJob=platform/engines",
        api_versions=MONITORING,
    ).one("PrometheusRule")["spec"]
    exprs = " ".join(r["expr"] for g in spec["groups"] for r in g["rules"])
    assert "kvgate-system/kvgate-" not in exprs
    assert 'kvgate_leader{job="platform/kvgate", namespace="kvgate-system"}' in exprs
    assert 'sglang:num_queue_reqs{job="platform/engines"}' in exprs
    assert rule_problems(spec) == []
    bad = helm.template_result(
        *ENABLED, 'metrics.prometheusRule.operatorJob=a"b', api_versions=MONITORING
    )
    assert bad.returncode != 0 and "operatorJob" in bad.stderr
