"""Tenant-controlled fetches, from the operator's side: what it reads from engines and routers is
bounded (no redirects, capped bodies, one deadline, bounded concurrency) and never echoed.

Every server here is a real HTTP server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import pytest
from aiohttp import web
from factories.local_http import serving_app
from factories.model_deployments import NOW
from kvgate.api import labels
from kvgate.controller.gateway_watch import read_workers
from kvgate.controller.main import make_verify
from kvgate.kube.settings import OperatorSettings
from kvgate.verify import gate
from kvgate.verify.gateway import GATEWAY_IGNORED_NOT_READY, Action, EnginePod, decide
from kvgate_engine.verdict import Outcome, Requirement

SECRET = "SECRET-7f3a9c"  # stands for whatever the operator's network position could read
CTX = 131_072
POD = EnginePod(name="llama-7c9d-decode-x2", uid="uid-a", ip="10.0.0.6", port=30000, role="decode")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(routes: dict[str, Handler]) -> AsyncIterator[str]:
    """An HTTP server on 127.0.0.1 answering ``routes``; yields its base URL."""
    app = web.Application()
    for path, handler in routes.items():
        app.router.add_get(path, handler)
    async with serving_app(app) as url:
        yield url


def body(payload: bytes, status: int = 200) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(body=payload, status=status, content_type="application/json")

    return handler


def smg_worker(i: int, uid: str | None = None, status: str = "ready") -> dict[str, Any]:
    """A worker as smg 1.13 lists it (the shape of a real /workers entry, ~0.9 KB)."""
    return {
        "id": f"01a22eae-6f59-7493-b2f0-{i:012x}",
        "model_id": "llama-3.1-8b",
        "url": f"http://10.1.{i // 250}.{i % 250}:30000",
        "models": [
            {
                "id": "llama-3.1-8b",
                "model_type": ["chat", "completions", "responses", "tools"],
                "hf_model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "context_length": CTX,
                "tokenizer_path": "meta-llama/Llama-3.1-8B-Instruct",
            }
        ],
        "worker_type": "decode",
        "connection_mode": "http",
        "runtime_type": "sglang",
        "labels": {
            "served_model_name": "llama-3.1-8b",
            "version": "0.5.23",
            "dp_size": "1",
            "tp_size": "8",
            "model_path": "meta-llama/Llama-3.1-8B-Instruct",
            "max_model_len": str(CTX),
            "smg.ai/pod-name": f"llama-7c9d-decode-{i}",
            "smg.ai/pod-uid": uid or f"3f1b7a52-0d4e-4c8a-9b61-{i:012x}",
        },
        "priority": 50,
        "cost": 1.0,
        "is_healthy": True,
        "status": status,
        "load": 0,
        "http2": False,
    }


def workers_doc(workers: list[dict[str, Any]]) -> bytes:
    return json.dumps({"workers": workers, "total": len(workers)}).encode()


def ignores_not_ready(answer: Any) -> Any:
    """The decision on POD, past the grace period, with this router answer."""
    return decide(
        POD,
        gate_false_since=NOW,
        now=NOW + timedelta(seconds=60),
        routers=[answer],
        grace_seconds=15,
    )


# ---------------------------------------------------------------------------------------------
# The router's GET /workers
# ---------------------------------------------------------------------------------------------


async def test_a_router_with_thousands_of_workers_is_read() -> None:
    workers = [smg_worker(i) for i in range(4_000)]
    payload = workers_doc(workers)
    assert 3 * 2**20 < len(payload) < 4 * 2**20  # ~0.8 KB a worker, under the 4 MiB cap
    async with serving({"/workers": body(payload)}) as url:
        answer = await read_workers("router-a", url, timeout=10.0)
    assert answer.error is None
    assert answer.workers is not None and len(answer.workers) == 4_000


async def test_read_workers_does_not_follow_a_redirect() -> None:
    # The redirect target says the pod is routed to: following it would delete the pod on the
    # word of a server that is not the router, and read whatever the Location points at.
    routed = workers_doc([smg_worker(0, uid=POD.uid)])
    async with serving({"/workers": body(routed)}) as elsewhere:
        hits = 0

        async def redirect(_: web.Request) -> web.StreamResponse:
            nonlocal hits
            hits += 1
            return web.Response(status=302, headers={"Location": f"{elsewhere}/workers?{SECRET}"})

        async with serving({"/workers": redirect}) as router:
            answer = await read_workers("router-a", router)
    assert hits == 1
    assert answer.workers is None
    assert (
        answer.error
        == f"GET {router}/workers: HTTP 302 redirect, not followed (kvgate follows none)"
    )
    assert ignores_not_ready(answer).action is Action.KEEP


async def test_read_workers_refuses_a_body_over_4_mib() -> None:
    payload = workers_doc([smg_worker(0)]).replace(
        b'"total"', b'"pad": "' + b"x" * 4 * 2**20 + b'", "total"'
    )
    async with serving({"/workers": body(payload)}) as url:
        answer = await read_workers("router-a", url, timeout=10.0)
    assert answer.workers is None
    assert (
        answer.error
        == f"GET {url}/workers: body larger than the 4 MiB cap; kvgate reads no further"
    )


async def test_read_workers_refuses_a_json_bomb_unparsed() -> None:
    payload = b'{"workers": [' + b"{}," * (3 * 2**20 // 3) + b"{}]}"
    async with serving({"/workers": body(payload)}) as url:
        answer = await read_workers("router-a", url, timeout=10.0)
    assert answer.workers is None and answer.error is not None
    assert "refused unparsed" in answer.error and "above the cap of 262,144" in answer.error


async def test_read_workers_cuts_off_a_trickled_body_at_the_deadline() -> None:
    stop = asyncio.Event()

    async def slowloris(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 10_000
        await response.prepare(request)
        while not stop.is_set():
            await response.write(b" ")
            await asyncio.sleep(0.05)
        return response

    async with serving({"/workers": slowloris}) as url:
        started = time.monotonic()
        try:
            answer = await asyncio.wait_for(read_workers("router-a", url, timeout=0.5), 10)
        finally:
            stop.set()
        elapsed = time.monotonic() - started
    assert answer.error == f"GET {url}/workers: no answer within 0.5 s"
    assert elapsed < 3.0


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        (f"<pre>{SECRET}</pre>".encode(), 500),
        (f"<pre>{SECRET}</pre>".encode(), 403),
        (f"root:x:0:0:{SECRET}".encode(), 200),
        (json.dumps({"workers": SECRET}).encode(), 200),
    ],
    ids=["500", "403", "not JSON", "no workers list"],
)
async def test_read_workers_never_echoes_what_the_router_sent(payload: bytes, status: int) -> None:
    async with serving({"/workers": body(payload, status)}) as url:
        answer = await read_workers("router-a", url)
    assert answer.workers is None and answer.error is not None
    assert SECRET not in answer.error
    decision = ignores_not_ready(answer)
    assert decision.action is Action.KEEP and SECRET not in decision.message


async def test_a_broken_status_line_from_a_router_is_never_echoed() -> None:
    async def answer_badly(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(f"HTTPX {SECRET}\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_badly, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        answer = await read_workers("router-a", f"http://127.0.0.1:{port}")
    finally:
        server.close()
        await server.wait_closed()
    assert answer.error is not None and "not a valid HTTP response" in answer.error
    assert SECRET not in answer.error


async def test_a_listed_worker_keeps_only_short_printable_fields() -> None:
    # The pod's own worker, still routed to, with odd text in the fields the decision quotes.
    worker = smg_worker(0, uid=POD.uid, status=f"ready\n{SECRET}")
    worker["url"] = f"http://10.0.0.6:30000/\n{SECRET} " + "x" * 1_000
    async with serving({"/workers": body(workers_doc([worker]))}) as url:
        answer = await read_workers("router-a", url)
    decision = ignores_not_ready(answer)
    assert decision.action is Action.DELETE and decision.reason == GATEWAY_IGNORED_NOT_READY
    assert SECRET not in decision.message
    assert "worker (unreadable) status (unreadable)" in decision.message


async def test_an_odd_pod_uid_label_never_matches_by_url_instead() -> None:
    # Before the projection, an odd uid label meant "another pod's worker"; it still must.
    worker = smg_worker(0, uid=f"{SECRET}\n")
    worker["url"] = f"http://{POD.ip}:{POD.port}"
    async with serving({"/workers": body(workers_doc([worker]))}) as url:
        answer = await read_workers("router-a", url)
    assert ignores_not_ready(answer).action is Action.KEEP


# ---------------------------------------------------------------------------------------------
# The engine probe as the operator runs it
# ---------------------------------------------------------------------------------------------


def engine_pod() -> dict[str, Any]:
    return {
        "metadata": {"name": "llama-7c9d-decode-x2", "labels": {labels.ROLE: "decode"}},
        "status": {},
    }


@pytest.mark.parametrize("status", [200, 302, 403, 500])
async def test_an_engine_error_body_never_reaches_the_pod_condition(status: int) -> None:
    headers = {"Location": f"http://169.254.169.254/latest/{SECRET}"} if status == 302 else {}

    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(text=f"<pre>{SECRET}</pre>", status=status, headers=headers)

    async with serving({"/server_info": handler, "/v1/models": handler}) as url:
        verdict = await make_verify(OperatorSettings(probe_timeout_seconds=2.0))(
            url, Requirement(CTX, role="decode")
        )
    condition = gate.condition_for_verdict(engine_pod(), verdict, Requirement(CTX), NOW)
    assert condition is not None and condition["status"] == "False"
    assert verdict.outcome is Outcome.CANNOT_TELL
    assert f"GET {url}/server_info: " in condition["message"]
    assert SECRET not in json.dumps(condition)


class CountingEngine:
    """A safe engine that counts the /server_info requests in flight at once."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0
        self.served = 0

    async def server_info(self, _: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(0.05)  # long enough for every waiting probe to pile up
            return web.json_response(
                {
                    "version": "0.5.23",
                    "disaggregation_mode": "decode",
                    "max_total_num_tokens": CTX,
                    "max_req_input_len": CTX - 6,
                    "internal_states": [{"memory_usage": {"token_capacity": CTX}}],
                }
            )
        finally:
            self.in_flight -= 1
            self.served += 1

    async def models(self, _: web.Request) -> web.StreamResponse:
        return web.json_response({"data": [{"id": "m", "max_model_len": CTX}]})


@pytest.mark.parametrize(("bound", "pods"), [(1, 10), (4, 60), (16, 200)])
async def test_concurrent_verifications_never_exceed_the_bound(bound: int, pods: int) -> None:
    engine = CountingEngine()
    async with serving({"/server_info": engine.server_info, "/v1/models": engine.models}) as url:
        verify = make_verify(OperatorSettings(max_concurrent_probes=bound))
        verdicts = await asyncio.gather(
            *(verify(url, Requirement(CTX, role="decode")) for _ in range(pods))
        )
    assert [v.outcome for v in verdicts] == [Outcome.SAFE] * pods
    assert engine.served == pods
    assert engine.peak == bound  # reached, never exceeded


def test_the_probe_bound_defaults_to_16_and_reads_its_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert OperatorSettings().max_concurrent_probes == 16
    args = argparse_namespace()
    monkeypatch.setenv("KVGATE_NETWORK_POLICIES", "false")  # not what this test is about
    monkeypatch.setenv("KVGATE_MAX_CONCURRENT_PROBES", "8")
    assert OperatorSettings.from_args(args).max_concurrent_probes == 8
    for bad in ("0", "-3", "many", "2.5"):
        monkeypatch.setenv("KVGATE_MAX_CONCURRENT_PROBES", bad)
        with pytest.raises(SystemExit, match=r"KVGATE_MAX_CONCURRENT_PROBES=.* whole number >= 1"):
            OperatorSettings.from_args(args)


def argparse_namespace() -> Any:
    from kvgate.cmd.cli import build_parser

    return build_parser().parse_args(["operator", "--no-webhook"])
