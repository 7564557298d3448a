"""The operator's probe keeps each engine's connection alive between re-verifications
(kvgate.http_pool; issue 16: opening two TCP connections per read was a fifth of its CPU with
8,000 engines), and keeps no cookies from one engine for another."""

from __future__ import annotations

import resource
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from fake_engine import FakeEngine
from kvgate import http_pool
from kvgate.main import make_verify
from kvgate.settings import OperatorSettings
from kvgate_engine.verdict import Outcome, Requirement


async def test_re_verifying_an_engine_reuses_its_connection() -> None:
    engine = FakeEngine("decode", 131_072, 200_000)
    peers: set[tuple[str, int]] = set()

    def answer(body: dict[str, object]) -> Any:
        async def handler(request: web.Request) -> web.Response:
            assert request.transport is not None
            peers.add(request.transport.get_extra_info("peername"))
            return web.json_response(body)

        return handler

    app = web.Application()
    app.router.add_get("/server_info", answer(engine.server_info()))
    app.router.add_get("/v1/models", answer(engine.models()))
    verify = make_verify(OperatorSettings(probe_timeout_seconds=2.0))
    try:
        async with TestServer(app, host="127.0.0.1") as server:
            url = str(server.make_url("")).rstrip("/")
            for _ in range(5):
                verdict = await verify(url, Requirement(context_length=131_072, role="decode"))
                assert verdict.outcome is Outcome.SAFE, verdict.message
    finally:
        await verify.close()
    # Two reads per probe (/server_info, /v1/models) at once: two connections for five probes
    # (ten requests), not ten.
    assert 1 <= len(peers) <= 2, peers


async def test_the_shared_session_keeps_no_cookies() -> None:
    async def sets_cookie(_: web.Request) -> web.Response:
        response = web.Response(text="ok")
        response.set_cookie("session", "from-engine-a")
        return response

    async def echoes(request: web.Request) -> web.Response:
        return web.Response(text=request.headers.get("Cookie", ""))

    app = web.Application()
    app.router.add_get("/a", sets_cookie)
    app.router.add_get("/b", echoes)
    async with TestServer(app, host="127.0.0.1") as server:
        session = http_pool.new_session()
        try:
            async with session.get(server.make_url("/a")) as first:
                assert first.status == 200
            async with session.get(server.make_url("/b")) as second:
                assert await second.text() == ""
        finally:
            await session.close()


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        assert http_pool.raise_open_files_limit() == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
