"""``/metrics`` in SGLang's Prometheus names (``sglang:*``), read from the engine's live state."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvgate_engine.reference.engine import ReferenceEngine

GIB = 2**30


class SGLangCollector(Collector):
    def __init__(self, engine: ReferenceEngine, model_name: str) -> None:
        self._engine = engine
        role = engine.settings.role
        self._labels = {
            "model_name": model_name,
            "engine_type": "unified" if role == "null" else role,
            "tp_rank": "0",
            "pp_rank": "0",
            "moe_ep_rank": "0",
        }

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(f"sglang:{name}", doc, labels=list(self._labels))
        family.add_metric(list(self._labels.values()), value)
        return family

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(f"sglang:{name}", doc, labels=list(self._labels))
        family.add_metric(list(self._labels.values()), value)
        return family

    def collect(self) -> Iterator[Metric]:
        engine = self._engine
        limits = engine.limits
        counters = engine.counters
        pool = engine.pool
        used = pool.used_tokens
        capacity = limits.kv_pool_tokens
        yield self._gauge("max_total_num_tokens", "KV pool size in tokens.", capacity)
        yield self._gauge("context_len", "Effective context length.", limits.context_length)
        yield self._gauge("page_size", "KV page size in tokens.", limits.page_size)
        yield self._gauge("num_pages", "KV pool pages.", limits.num_pages)
        yield self._gauge("weight_memory_usage_gb", "Weights per GPU (GB).", limits.weights_gib)
        yield self._gauge("kv_cache_memory_usage_gb", "KV cache per GPU (GB).", limits.kv_cache_gib)
        yield self._gauge(
            "startup_available_gpu_memory_gb", "Simulated GPU memory.", limits.gpu_memory_gib
        )
        yield self._gauge("num_running_reqs", "Running requests.", counters.num_running_reqs)
        yield self._gauge("num_queue_reqs", "Queued requests.", counters.num_queue_reqs)
        yield self._gauge("num_used_tokens", "KV tokens in use.", used)
        yield self._gauge("kv_used_tokens", "KV tokens in use.", used)
        yield self._gauge("kv_available_tokens", "KV tokens free.", capacity - used)
        yield self._gauge("token_usage", "KV pool usage fraction.", used / max(capacity, 1))
        yield self._gauge("full_token_usage", "KV pool usage fraction.", used / max(capacity, 1))
        yield self._gauge(
            "gen_throughput", "Tokens/s of the last request.", counters.last_gen_throughput
        )
        yield self._gauge(
            "num_prefill_bootstrap_queue_reqs",
            "Prefill requests waiting for KV pages.",
            counters.num_prefill_bootstrap_queue_reqs,
        )
        yield self._gauge(
            "num_prefill_inflight_queue_reqs",
            "Prefill requests whose forward is done and whose KV the decode has not collected.",
            counters.num_prefill_inflight_queue_reqs,
        )
        yield self._gauge(
            "num_decode_prealloc_queue_reqs",
            "Decode requests waiting for KV pages.",
            counters.num_decode_prealloc_queue_reqs,
        )
        yield self._gauge(
            "num_decode_transfer_queue_reqs",
            "Decode requests waiting for their KV transfer.",
            counters.num_decode_transfer_queue_reqs,
        )
        yield self._counter("num_requests", "Requests received.", counters.num_requests)
        yield self._counter(
            "num_aborted_requests", "Requests aborted.", counters.num_aborted_requests
        )
        yield self._counter("prompt_tokens", "Prompt tokens.", counters.prompt_tokens)
        yield self._counter("generation_tokens", "Generated tokens.", counters.generation_tokens)
        yield self._counter(
            "num_transfer_failed_reqs", "Failed KV transfers.", counters.num_transfer_failed_reqs
        )
        yield self._counter(
            "num_bootstrap_failed_reqs", "Failed bootstraps.", counters.num_bootstrap_failed_reqs
        )
        yield self._time_to_first_token()

    def _time_to_first_token(self) -> HistogramMetricFamily:
        """SGLang's tokenizer-side histogram: labels model_name, engine_type, is_streaming (no
        ranks); a series appears at its first observation, and a prefill never observes one."""
        labels = ["model_name", "engine_type", "is_streaming"]
        family = HistogramMetricFamily(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels=labels,
        )
        for stream, histogram in sorted(self._engine.counters.time_to_first_token.items()):
            values = [self._labels["model_name"], self._labels["engine_type"], str(stream).lower()]
            buckets = [
                (_go_float(bound), count)
                for bound, count in zip(histogram.buckets, histogram.counts, strict=True)
            ]
            buckets.append(("+Inf", histogram.count))
            family.add_metric(values, buckets, histogram.total)
        return family


def _go_float(value: float) -> str:
    """A bucket bound as Prometheus writes ``le``: 0.1 → "0.1", 1 → "1.0"."""
    return repr(float(value))


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def build_registry(engine: ReferenceEngine, model_name: str) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SGLangCollector(engine, model_name))
    return registry
