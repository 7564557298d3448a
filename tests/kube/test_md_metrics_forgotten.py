"""A deleted ModelDeployment leaves no series on the operator's /metrics page (kvgate.kube.metrics):
gauges, counters and histograms alike, per ModelDeployment and per engine pod. Name churn (CI
creating ``pr-1234`` after ``pr-1233``) would otherwise grow the page without bound.

Which metrics are per ModelDeployment comes from the registry itself (every metric with both a
``namespace`` and a ``deployment`` label), so a metric added later is covered without a change
here."""

from __future__ import annotations

from collections.abc import Iterator

from kvgate.kube import metrics
from prometheus_client import generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

MD_LABELS = {"namespace", "deployment"}
GONE = ("forget-ns", "churn-1")  # the ModelDeployment deleted
KEPT = ("forget-ns", "churn-2")  # its neighbour, which keeps every series


def registered() -> list[Collector]:
    return list(metrics.REGISTRY._collector_to_names)  # prometheus_client keeps them here


def per_md(collector: Collector) -> bool:
    return isinstance(collector, MetricWrapperBase) and set(collector._labelnames) >= MD_LABELS


def create_series(metric: MetricWrapperBase, namespace: str, deployment: str) -> None:
    """One series of ``metric`` for the ModelDeployment; other labels get a placeholder."""
    values = {name: "x" for name in metric._labelnames}
    values.update(namespace=namespace, deployment=deployment)
    child = metric.labels(**values)
    kind = metric._type
    if kind == "counter":
        child.inc()  # type: ignore[attr-defined]
    elif kind == "gauge":
        child.set(1)  # type: ignore[attr-defined]
    elif kind == "histogram":
        child.observe(1)  # type: ignore[attr-defined]
    else:
        raise AssertionError(f"{metric._name}: a {kind} metric; teach this test to create one")


def series_of(namespace: str, deployment: str) -> Iterator[str]:
    """Every sample on the /metrics page labelled with the ModelDeployment."""
    text = generate_latest(metrics.REGISTRY).decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("namespace") == namespace and labels.get("deployment") == deployment:
                yield sample.name


def test_every_registered_collector_is_known_to_this_test() -> None:
    # A new custom collector (not a prometheus_client metric) with per-ModelDeployment series
    # would escape the registry walk below: it must be added here, and to forget_md.
    custom = {type(c).__name__ for c in registered() if not isinstance(c, MetricWrapperBase)}
    assert custom == {"_PodGaugeTable", "_Backlog", "_PassSlots"}  # the last two: fleet-wide


def test_a_deleted_model_deployment_leaves_none_of_its_series_on_the_metrics_page() -> None:
    per_md_metrics = [c for c in registered() if per_md(c)]
    per_pod_gauges = [g for g in vars(metrics).values() if isinstance(g, metrics._PodGauge)]
    assert len(per_md_metrics) >= 15 and len(per_pod_gauges) >= 8  # the walk found them
    for namespace, deployment in (GONE, KEPT):
        for metric in per_md_metrics:
            create_series(metric, namespace, deployment)
        for gauge in per_pod_gauges:
            gauge.labels(namespace, deployment, f"{deployment}-r1-decode-0", "decode").set(1)
    names = {m._name for m in per_md_metrics} | {g._name for g in per_pod_gauges}
    before = set(series_of(*GONE))
    # Every per-ModelDeployment metric is on the page before (a histogram as _bucket etc.).
    assert {n for n in names if not any(s.startswith(n) for s in before)} == set()

    metrics.forget_md(*GONE)

    assert sorted(set(series_of(*GONE))) == []
    assert set(series_of(*KEPT)) == before  # the neighbour keeps every one of its series
    metrics.forget_md(*KEPT)
    assert sorted(set(series_of(*KEPT))) == []
