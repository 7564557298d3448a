"""The per-engine signals an autoscaler and a scale-down drain read from ``/metrics``.

The names, kinds and labels are SGLang 0.5.23's (``srt/observability/metrics_collector.py``);
the values must be true counts of requests in flight, because kvgate removes an engine only when
its running, queued and PD-queue gauges all read 0. Engines run in this process (the same
``ReferenceEngine`` and app the engine binary serves), so a test can hold a request at an exact
point and read ``/metrics`` there.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request
from kvgate_engine.reference.args import DEFAULT_VERSION, parse_launch_args
from kvgate_engine.reference.engine import EngineSettings, GenerateRequest, ReferenceEngine
from kvgate_engine.reference.main import startup_limits
from kvgate_engine.reference.metrics import build_registry, render
from kvgate_engine.reference.server import ServerState, build_app, handle_generate, now
from kvgate_engine.reference.transfer import BootstrapServer, receive_kv
from multidict import CIMultiDict
from prometheus_client.parser import text_string_to_metric_families

DEADLINE = 10.0
# SGLang 0.5.23's TokenizerMetricsCollector default buckets for time_to_first_token_seconds.
SGLANG_TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
PROMPT = list(range(300, 340))


def make_state(
    role: str, gpu_memory_gib: str = "80", decode_step_seconds: float = 0.0
) -> ServerState:
    argv = ["--model-path", "tiny-llama", "--served-model-name", "tiny", "--enable-metrics"]
    launch = parse_launch_args([*argv, "--disaggregation-mode", role], DEFAULT_VERSION)
    model, limits = startup_limits(
        launch, {"KVGATE_GPU_MEMORY_GIB": gpu_memory_gib}, DEFAULT_VERSION
    )
    settings = EngineSettings(
        role=role,
        version=DEFAULT_VERSION,
        incident=False,
        kv_checksum=False,
        vocab_size=model.vocab_size,
        bootstrap_timeout=DEADLINE,
        waiting_timeout=DEADLINE,
        decode_step_seconds=decode_step_seconds,
    )
    engine = ReferenceEngine(settings, limits)
    return ServerState(engine=engine, launch=launch, model=model, started_at=now(), phase="ready")


def scrape(engine: ReferenceEngine) -> dict[str, list[tuple[dict[str, str], float]]]:
    """What GET /metrics answers, as {sample name: [(labels, value)]}."""
    text = render(build_registry(engine, "tiny")).decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def gauge(engine: ReferenceEngine, name: str) -> float:
    (_, value), *others = scrape(engine)[f"sglang:{name}"]
    assert not others, f"sglang:{name} has more than one series"
    return value


def drain_gauges(engine: ReferenceEngine) -> dict[str, float]:
    names = [
        "num_running_reqs",
        "num_queue_reqs",
        "num_prefill_bootstrap_queue_reqs",
        "num_prefill_inflight_queue_reqs",
        "num_decode_prealloc_queue_reqs",
        "num_decode_transfer_queue_reqs",
    ]
    return {name: gauge(engine, name) for name in names}


class SlowClient(AbstractStreamWriter):
    """The HTTP connection of a client that takes the answer's last bytes only when let: every
    chunk before them goes through, the one that carries the finish reason waits."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.last_bytes_pending = asyncio.Event()
        self.let_through = asyncio.Event()

    async def _take(self, chunk: bytes) -> None:
        if b'"finish_reason": {' in chunk:
            self.last_bytes_pending.set()
            await self.let_through.wait()
        self.chunks.append(bytes(chunk))

    async def write(self, chunk: bytes | bytearray | memoryview) -> None:
        await self._take(bytes(chunk))

    async def write_eof(self, chunk: bytes = b"") -> None:
        if chunk:
            await self._take(chunk)

    async def drain(self) -> None:
        return None

    def enable_compression(self, encoding: str = "deflate", strategy: int | None = None) -> None:
        return None

    def enable_chunking(self) -> None:
        return None

    async def write_headers(self, status_line: str, headers: CIMultiDict[str]) -> None:
        return None


def post(app: web.Application, body: dict[str, Any], client: SlowClient) -> web.Request:
    reader = StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop())
    raw = json.dumps(body).encode()
    reader.feed_data(raw)
    reader.feed_eof()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(raw))}
    return make_mocked_request(
        "POST", "/generate", headers=headers, app=app, writer=client, payload=reader
    )


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
async def test_a_request_counts_as_running_until_its_last_bytes_are_written(stream: bool) -> None:
    """A drain that reads num_running_reqs 0 deletes the pod: an answer still being written to
    a slow client must keep the gauge at 1, or its last tokens are cut."""
    state = make_state("null")
    client = SlowClient()
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8}, "stream": stream}
    answering = asyncio.create_task(handle_generate(post(build_app(state), body, client)))
    try:
        await asyncio.wait_for(client.last_bytes_pending.wait(), DEADLINE)
    except TimeoutError as error:
        answering.cancel()
        raise AssertionError("the handler never wrote the answer's last bytes") from error
    assert gauge(state.engine, "num_running_reqs") == 1
    client.let_through.set()
    await asyncio.wait_for(answering, DEADLINE)
    answer = b"".join(client.chunks)
    assert b'"finish_reason": {' in answer
    assert answer.endswith(b"data: [DONE]\n\n") == stream
    assert drain_gauges(state.engine) == dict.fromkeys(drain_gauges(state.engine), 0)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_prefill_whose_kv_is_not_yet_collected_counts_in_the_inflight_queue() -> None:
    """SGLang's prefill moves a request to its inflight queue once its forward is done and its
    KV is being sent; it leaves it when the decode has the KV. A drain must wait for it."""
    prefill = make_state("prefill").engine
    port = free_port()
    bootstrap = BootstrapServer(prefill.rendezvous, wait_timeout=DEADLINE)
    await bootstrap.start("127.0.0.1", port)
    try:
        request = GenerateRequest(
            rid="r1",
            input_ids=tuple(PROMPT),
            max_new_tokens=4,
            bootstrap_host="127.0.0.1",
            bootstrap_port=port,
            bootstrap_room=99,
        )
        leg = asyncio.create_task(prefill.generate(request))
        deadline = time.monotonic() + DEADLINE
        while gauge(prefill, "num_prefill_inflight_queue_reqs") != 1:
            assert time.monotonic() < deadline, drain_gauges(prefill)
            await asyncio.sleep(0.01)
        assert gauge(prefill, "num_running_reqs") == 0  # its forward is done
        payload = await receive_kv("127.0.0.1", port, 99, len(PROMPT), timeout=DEADLINE)
        assert payload.num_tokens == len(PROMPT)
        result = await asyncio.wait_for(leg, DEADLINE)
        assert result.output_ids == PROMPT[:1]
        assert drain_gauges(prefill) == dict.fromkeys(drain_gauges(prefill), 0)
    finally:
        await bootstrap.close()


def ttft_series(engine: ReferenceEngine) -> dict[str, list[tuple[dict[str, str], float]]]:
    name = "sglang:time_to_first_token_seconds"
    samples = scrape(engine)
    return {suffix: samples.get(name + suffix, []) for suffix in ("_bucket", "_count", "_sum")}


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "not-streamed"])
async def test_time_to_first_token_is_a_histogram_with_sglangs_buckets_and_labels(
    stream: bool,
) -> None:
    state = make_state("null")
    client = SlowClient()
    client.let_through.set()
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4}, "stream": stream}
    started = time.monotonic()
    await handle_generate(post(build_app(state), body, client))
    elapsed = time.monotonic() - started
    series = ttft_series(state.engine)
    labels = {"model_name": "tiny", "engine_type": "unified", "is_streaming": str(stream).lower()}
    assert series["_count"] == [(labels, 1.0)]
    ((_, seconds),) = series["_sum"]
    assert 0 < seconds <= elapsed
    buckets = {float(lb["le"]): value for lb, value in series["_bucket"]}
    assert sorted(buckets) == [*SGLANG_TTFT_BUCKETS, float("inf")]
    assert buckets[float("inf")] == 1
    assert all(value == (1 if le >= seconds else 0) for le, value in buckets.items())


async def test_a_prefill_engine_never_observes_time_to_first_token() -> None:
    """As SGLang 0.5.23: "PD prefill workers never observe TTFT"; decode does, for the client."""
    prefill = make_state("prefill").engine
    request = GenerateRequest(
        rid="r2", input_ids=tuple(PROMPT), max_new_tokens=4, bootstrap_host="2.2.2.2"
    )
    assert (await prefill.generate(request)).output_ids == PROMPT[:1]
    assert ttft_series(prefill) == {"_bucket": [], "_count": [], "_sum": []}


async def test_a_decode_waiting_for_kv_pages_is_in_the_prealloc_queue_only() -> None:
    """SGLang's decode keeps a request that waits for pages in its prealloc queue; its waiting
    queue (num_queue_reqs) holds requests whose KV arrived. Counted in both, a decode autoscaler
    on queued requests would see pool pressure SGLang does not report there."""
    decode = make_state("decode", gpu_memory_gib="0.001").engine  # a 1,006-token pool
    prefill = make_state("prefill").engine
    port = free_port()
    bootstrap = BootstrapServer(prefill.rendezvous, wait_timeout=DEADLINE)
    await bootstrap.start("127.0.0.1", port)
    legs: list[asyncio.Task[object]] = []
    try:
        for room, length in ((1, 600), (2, 500)):  # the second does not fit beside the first
            request = GenerateRequest(
                rid=f"r{room}",
                input_ids=tuple([7] * length),
                max_new_tokens=4,
                bootstrap_host="127.0.0.1",
                bootstrap_port=port,
                bootstrap_room=room,
            )
            legs.append(asyncio.create_task(decode.generate(request)))
        deadline = time.monotonic() + DEADLINE
        while gauge(decode, "num_decode_prealloc_queue_reqs") != 1:
            assert time.monotonic() < deadline, drain_gauges(decode)
            await asyncio.sleep(0.01)
        assert drain_gauges(decode) == {
            "num_running_reqs": 0,
            "num_queue_reqs": 0,
            "num_prefill_bootstrap_queue_reqs": 0,
            "num_prefill_inflight_queue_reqs": 0,
            "num_decode_prealloc_queue_reqs": 1,
            "num_decode_transfer_queue_reqs": 1,
        }
    finally:
        for leg in legs:
            leg.cancel()
        await asyncio.gather(*legs, return_exceptions=True)
        await bootstrap.close()


class FastClient(SlowClient):
    """A connection that takes every chunk at once (writes never suspend)."""

    async def _take(self, chunk: bytes) -> None:
        self.chunks.append(bytes(chunk))


@pytest.mark.parametrize("pace", [0.0, 0.002], ids=["unpaced", "paced"])
async def test_metrics_are_served_while_a_long_stream_decodes(pace: float) -> None:
    """A streamed answer whose writes never suspend must still let /metrics (and health checks)
    run while it decodes, and show it running: an autoscaler read 0 running requests throughout
    a 4,096-token stream before."""
    state = make_state("null", decode_step_seconds=pace)
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1024}, "stream": True}
    answering = asyncio.create_task(handle_generate(post(build_app(state), body, FastClient())))
    seen: list[float] = []
    while not answering.done():
        seen.append(gauge(state.engine, "num_running_reqs"))
        await asyncio.sleep(0)
    answer = await answering
    assert answer.status == 200
    assert 1.0 in seen[1:], f"num_running_reqs read {set(seen)} in {len(seen)} reads"


async def test_a_paced_decode_takes_its_step_time_per_token() -> None:
    state = make_state("null", decode_step_seconds=0.01)
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 50}, "stream": True}
    client = FastClient()
    started = time.monotonic()
    await handle_generate(post(build_app(state), body, client))
    assert time.monotonic() - started >= 0.5
    assert b'"error"' not in b"".join(client.chunks)
