"""The per-engine-pod gauges (kvgate.kube.metrics): one table behind five gauge families, exposed as
labelled gauges, forgotten with the pod, and small enough for 9,000 pods (docs/design/scale.md)."""

from __future__ import annotations

import gc
import tracemalloc

from kvgate.kube import metrics
from prometheus_client import generate_latest

PER_POD = (
    metrics.KV_POOL_TOKENS,
    metrics.HEADROOM_RATIO,
    metrics.LAST_VERIFIED,
    metrics.REVERIFY_INTERVAL,
    metrics.POD_READY,
)
NAMES = (
    "kvgate_engine_kv_pool_tokens",
    "kvgate_engine_headroom_ratio",
    "kvgate_engine_last_verified_timestamp_seconds",
    "kvgate_engine_reverify_interval_seconds",
    "kvgate_engine_pod_ready",
)


def _labels(pod: str) -> dict[str, str]:
    return {"namespace": "metrics-ns", "deployment": "md", "pod": pod, "role": "decode"}


def test_each_per_pod_gauge_is_exposed_with_its_labels_and_forgotten_with_the_pod() -> None:
    series = ("metrics-ns", "md", "p-1", "decode")
    for value, gauge in enumerate(PER_POD, start=1):
        gauge.labels(*series).set(value)
    text = generate_latest(metrics.REGISTRY).decode()
    for value, name in enumerate(NAMES, start=1):
        assert f"# TYPE {name} gauge" in text
        assert metrics.REGISTRY.get_sample_value(name, _labels("p-1")) == value
    metrics.forget_pod(*series)
    assert all(metrics.REGISTRY.get_sample_value(n, _labels("p-1")) is None for n in NAMES)


def test_a_gauge_never_set_for_a_pod_has_no_sample_for_it() -> None:
    metrics.POD_READY.labels("metrics-ns", "md", "p-2", "decode").set(0)
    assert metrics.REGISTRY.get_sample_value("kvgate_engine_pod_ready", _labels("p-2")) == 0
    assert metrics.REGISTRY.get_sample_value("kvgate_engine_kv_pool_tokens", _labels("p-2")) is None
    metrics.forget_pod("metrics-ns", "md", "p-2", "decode")


def test_five_gauges_of_2000_pods_hold_well_under_a_kib_per_pod() -> None:
    """prometheus_client's labelled children cost ~3.5 KiB per pod for these five gauges."""
    pods = [("metrics-ns", "md", f"pod-{i:05d}", "decode") for i in range(2000)]
    gc.collect()
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for series in pods:
            for value, gauge in enumerate(PER_POD):
                gauge.labels(*series).set(value + 0.5)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        for series in pods:
            metrics.forget_pod(*series)
    assert (after - before) / len(pods) < 512
