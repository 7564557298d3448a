"""kvgate's API client: at most ``max_requests`` requests in flight, a request marked urgent (a
pass somebody asked for, a gate's write) goes before the others waiting, and a watch or a
pods/log stream holds no request slot.

Before, the only bound was the aiohttp session's connection pool (32 connections, one FIFO
queue, watches and log streams included). In the fairness benchmark, while one tenant's 200
never-Ready ModelDeployments were refused together, 126 requests waited for a connection and
another namespace's passes waited 0.8-7.8 s for one read behind them. And 32 open streams
(watches, the KV canary's log follows of 32 verified engines) took every connection: no request
answered at all (the last test, against the old client).

A loopback HTTP server stands in for the API server: it answers each GET when the test lets it,
and records the order requests reached it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from kvgate.kube import k8s
from kvgate.kube.k8s import Credentials, KubeApi, Urgency

# Generous for the two loaded cores this suite shares: each wait is for one local round trip.
DEADLINE_SECONDS = 10.0


@dataclass
class Server:
    url: str
    arrived: list[str] = field(default_factory=list)  # Service names, in arrival order
    answer: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(0))
    streams: int = 0  # watches open now


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server(url="")

    async def service(request: web.Request) -> web.Response:
        state.arrived.append(request.match_info["name"])
        await state.answer.acquire()  # held until the test lets one through
        return web.json_response({"kind": "Service", "metadata": {"name": "x"}})

    async def watch(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        state.streams += 1
        try:
            await asyncio.sleep(3600)  # a watch with nothing to say
        finally:
            state.streams -= 1
        return response

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/services/{name}", service)
    app.router.add_get("/api/v1/namespaces/ns/pods", watch)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        await runner.cleanup()


async def until(predicate: object, what: str) -> None:
    async def wait() -> None:
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(wait(), DEADLINE_SECONDS)
    except TimeoutError:
        raise AssertionError(f"{what}: not within {DEADLINE_SECONDS} s") from None


async def get(api: KubeApi, name: str, *, urgent: bool = False) -> None:
    token = k8s.URGENT.set(Urgency(urgent))
    try:
        await api.get("Service", "ns", name)
    finally:
        k8s.URGENT.reset(token)


async def test_an_urgent_request_goes_before_every_request_waiting_for_a_slot(
    server: Server,
) -> None:
    api = KubeApi(Credentials(server=server.url), max_requests=2)
    held = [asyncio.ensure_future(get(api, f"held-{i}")) for i in range(2)]
    await until(lambda: len(server.arrived) == 2, "two requests in flight")
    queued = [asyncio.ensure_future(get(api, f"queued-{i}")) for i in range(5)]
    await asyncio.sleep(0.05)
    asked = asyncio.ensure_future(get(api, "asked", urgent=True))
    await asyncio.sleep(0.05)
    assert server.arrived == ["held-0", "held-1"]  # the slots hold the rest back
    try:
        server.answer.release()  # one slot turns over
        await until(lambda: len(server.arrived) == 3, "the next request")
        assert server.arrived[2] == "asked"
        for _ in range(7):
            server.answer.release()
        await asyncio.wait_for(asyncio.gather(*held, *queued, asked), DEADLINE_SECONDS)
        assert server.arrived[3:] == [f"queued-{i}" for i in range(5)]  # then first come
    finally:
        await api.close()


async def test_a_pass_raised_to_urgent_while_it_runs_sends_its_next_request_first(
    server: Server,
) -> None:
    api = KubeApi(Credentials(server=server.url), max_requests=1)
    urgency = Urgency(False)  # a settled ModelDeployment's pass, running

    async def running_pass() -> None:
        token = k8s.URGENT.set(urgency)
        try:
            await api.get("Service", "ns", "pass-read")
        finally:
            k8s.URGENT.reset(token)

    holder = asyncio.ensure_future(get(api, "held"))
    await until(lambda: server.arrived == ["held"], "one request in flight")
    queued = [asyncio.ensure_future(get(api, f"tenant-{i}")) for i in range(3)]
    await asyncio.sleep(0.05)
    urgency.urgent = True  # a rollback annotation arrived: this pass now goes first
    read = asyncio.ensure_future(running_pass())
    await asyncio.sleep(0.05)
    try:
        server.answer.release()
        await until(lambda: len(server.arrived) == 2, "the next request")
        assert server.arrived[1] == "pass-read"
        for _ in range(4):
            server.answer.release()
        await asyncio.wait_for(asyncio.gather(holder, read, *queued), DEADLINE_SECONDS)
    finally:
        await api.close()


async def test_open_watches_beyond_the_request_bound_leave_requests_answering(
    server: Server,
) -> None:
    api = KubeApi(Credentials(server=server.url))
    streams = 40  # more than the 32 requests in flight the client allows

    async def watch() -> None:
        async for _ in api.watch("/api/v1/namespaces/ns/pods", {}, read_timeout=3600):
            pass

    watches = [asyncio.ensure_future(watch()) for _ in range(streams)]
    try:
        await until(lambda: server.streams == streams, f"{streams} watches open")
        server.answer.release()
        await asyncio.wait_for(get(api, "while-watching"), DEADLINE_SECONDS)
        assert server.arrived == ["while-watching"]
    finally:
        for task in watches:
            task.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await api.close()
