"""The chart's Grafana dashboards (charts/kvgate/dashboards, templates/dashboards.yaml): shipped
as sidecar ConfigMaps only when enabled, valid Grafana JSON, every query parsed by Prometheus'
promtool and by a PromQL parser that says which labels it yields, every variable defined, and
every metric one kvgate, SGLang, smg or the chart's recording rules provide."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_runner import CHART, Helm
from kvgate.gen import dashboards as gen
from kvgate.kube import metrics as operator_metrics
from kvgate.webhook import metrics as admission_metrics
from kvgate_e2e import dashboards
from test_chart_alert_rules import ENGINE_SERIES, POD_TARGET, Analysis, promql
from test_chart_promtool import ENABLED, MONITORING, promtool, run  # noqa: F401 (fixture)

BOARDS = dashboards.load()
VALUES = {"namespace": "models", "deployment": "llama-8b", "role": ".*"}
# The labels the ServiceMonitor's targets add to kvgate's series (honorLabels: kvgate's own win).
SERVICE_TARGET = frozenset({"namespace", "service", "pod", "container", "endpoint"})
ENGINE_LABELS = POD_TARGET | {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
SGLANG_QUEUES = (
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
)
# smg's PD time-to-first-token histogram (smg 1.13; a PodMonitor on the routers' metrics port
# adds the pod target labels).
ROUTER_SERIES = {"smg_pd_ttft_seconds_bucket": POD_TARGET | {"le"}}


def registry_series(module: Any) -> dict[str, frozenset[str]]:
    """Every series name a kvgate metrics module's REGISTRY serves, with its label names."""
    label_names = {
        c._name: frozenset(c._labelnames)
        for c in vars(module).values()
        if hasattr(c, "_labelnames") and hasattr(c, "_name")
    }
    for c in vars(module).values():  # a collector serving several families
        label_names.update({n: frozenset(ls) for n, ls in getattr(c, "families", {}).items()})
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count"),
    }
    out: dict[str, frozenset[str]] = {}
    for family in module.REGISTRY.collect():
        for suffix in suffixes[family.type]:
            extra = {"le"} if suffix == "_bucket" else set()
            out[family.name + suffix] = label_names[family.name] | extra | SERVICE_TARGET
    return out


@pytest.fixture(scope="module")
def rendered_rules(helm: Helm) -> list[dict[str, Any]]:
    rule = helm.template(*ENABLED, api_versions=MONITORING).one("PrometheusRule")
    return list(rule["spec"]["groups"])


@pytest.fixture(scope="module")
def available(rendered_rules: list[dict[str, Any]]) -> dict[str, frozenset[str]]:
    """Every series a dashboard may read, with its labels: kvgate's (operator and webhook),
    SGLang's, smg's, and each recording rule's result (analysed in the order Prometheus
    evaluates them)."""
    series = registry_series(operator_metrics) | registry_series(admission_metrics)
    series |= ENGINE_SERIES | dict.fromkeys(SGLANG_QUEUES, ENGINE_LABELS) | ROUTER_SERIES
    for group in rendered_rules:
        for rule in group["rules"]:
            if "record" in rule:
                analysis = Analysis(series)
                shape = analysis.shape(promql.parse(rule["expr"]))
                assert not analysis.problems, (rule["record"], analysis.problems)
                assert shape.labels is not None
                series[rule["record"]] = shape.labels
    return series


# --- the chart ---------------------------------------------------------------------------------


def test_no_dashboard_is_shipped_unless_enabled(helm: Helm) -> None:
    assert [c for c in helm.template().all("ConfigMap") if "dashboard" in str(c)] == []


def test_enabled_each_dashboard_is_a_configmap_the_grafana_sidecar_finds(helm: Helm) -> None:
    maps = helm.template("dashboards.enabled=true").all("ConfigMap")
    assert sorted(m["metadata"]["name"] for m in maps) == [
        "kvgate-dashboard-fleet",
        "kvgate-dashboard-modeldeployment",
        "kvgate-dashboard-operator",
    ]
    for configmap in maps:
        assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert "annotations" not in configmap["metadata"]
        ((name, text),) = configmap["data"].items()
        assert json.loads(text) == BOARDS[name]  # the file, byte for byte through YAML


def test_the_sidecar_label_namespace_and_folder_are_values(helm: Helm) -> None:
    maps = helm.template(
        "dashboards.enabled=true",
        "dashboards.label=team_dashboard",
        "dashboards.labelValue=yes",
        "dashboards.namespace=monitoring",
        "dashboards.folder=Inference",
        "dashboards.folderAnnotation=k8s-sidecar-target-directory",
    ).all("ConfigMap")
    assert len(maps) == 3
    for configmap in maps:
        meta = configmap["metadata"]
        assert meta["namespace"] == "monitoring"
        assert meta["labels"]["team_dashboard"] == "yes"
        assert "grafana_dashboard" not in meta["labels"]
        assert meta["annotations"] == {"k8s-sidecar-target-directory": "Inference"}


def test_a_bad_sidecar_label_fails_and_names_the_field(helm: Helm) -> None:
    result = helm.template_result("dashboards.enabled=true", "dashboards.label=not a label")
    assert result.returncode != 0
    assert "'/dashboards/label'" in result.stderr


def test_the_files_are_what_the_generator_writes() -> None:
    assert sorted(BOARDS) == sorted(gen.dashboards())
    for name, board in gen.dashboards().items():
        assert (CHART / "dashboards" / name).read_text() == gen.render(board), (
            f"{name} is out of date: run `python -m kvgate.gen.dashboards`"
        )


# --- the dashboards ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_each_dashboard_is_grafana_json_with_unique_panels_each_with_a_query(name: str) -> None:
    board = BOARDS[name]
    assert board["schemaVersion"] >= 39 and board["uid"] and board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), f"{name}: panel ids repeat: {ids}"
    titles = [p["title"] for p in board["panels"]]
    assert len(titles) == len(set(titles)), f"{name}: panel titles repeat"
    (source,) = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
    assert (source["type"], source["query"]) == ("datasource", "prometheus")
    for panel in board["panels"]:
        assert panel["targets"], f"{name}: panel {panel['title']!r} has no query"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"] == panel["datasource"]


@pytest.mark.parametrize("name", sorted(BOARDS))
def test_every_variable_a_query_uses_is_defined_before_it(name: str) -> None:
    board = BOARDS[name]
    defined: list[str] = []
    for variable in board["templating"]["list"]:
        used = dashboards.variables_used(json.dumps(variable.get("query", "")))
        assert used <= set(defined), f"{name}: {variable['name']} uses {used - set(defined)}"
        defined.append(variable["name"])
    for panel in board["panels"]:
        for target in panel["targets"]:
            used = dashboards.variables_used(target["expr"]) - set(dashboards.BUILTIN)
            assert used <= set(defined), f"{name} {panel['title']!r}: {used - set(defined)}"


def test_a_query_with_an_undefined_variable_cannot_be_run() -> None:
    with pytest.raises(KeyError, match="tenant"):
        dashboards.substitute('up{namespace="$tenant"}', VALUES)


def test_every_query_selects_known_series_and_yields_the_labels_its_legend_shows(
    available: dict[str, frozenset[str]],
) -> None:
    problems = []
    for query in dashboards.panel_queries(BOARDS, VALUES):
        analysis = Analysis(available)
        shape = analysis.shape(promql.parse(query.expr))
        problems += [f"{query.where()}: {p}" for p in analysis.problems]
        if shape.type != "vector":
            problems.append(f"{query.where()}: yields a {shape.type}")
        elif shape.labels is not None and not query.legend_labels <= shape.labels:
            missing = sorted(query.legend_labels - shape.labels)
            problems.append(f"{query.where()}: the legend shows {missing}, the query drops them")
    assert problems == []


def test_the_legend_check_catches_a_label_the_query_aggregates_away(
    available: dict[str, frozenset[str]],
) -> None:
    analysis = Analysis(available)
    shape = analysis.shape(promql.parse("sum by (role) (kvgate_engine_kv_pool_tokens)"))
    assert shape.labels is not None and "pod" not in shape.labels


def test_every_query_is_valid_promql_to_prometheus(promtool: Path, tmp_path: Path) -> None:  # noqa: F811
    queries = list(dashboards.panel_queries(BOARDS, VALUES))
    rules = [
        {"record": f"dashboard:query_{i}:check", "expr": q.expr} for i, q in enumerate(queries)
    ]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]})
    )
    result = run(promtool, "check", "rules", "queries.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_each_query_variable_offers_the_label_values_of_a_known_series(
    available: dict[str, frozenset[str]],
) -> None:
    for board in BOARDS.values():
        for variable in board["templating"]["list"]:
            if variable["type"] != "query":
                continue
            selector, label = dashboards.label_values(variable["definition"])
            assert label == variable["name"], variable
            analysis = Analysis(available)
            shape = analysis.shape(promql.parse(dashboards.substitute(selector, VALUES)))
            assert analysis.problems == [] and shape.labels is not None, variable
            assert label in shape.labels, f"{board['title']}: {selector} has no label {label}"
