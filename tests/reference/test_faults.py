"""Injected generation failures: the engine stays healthy and verified, generation fails."""

from __future__ import annotations

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kvgate_engine.reference import faults


async def ok(request: web.Request) -> web.StreamResponse:
    return web.json_response({"ok": True})


def app_with_faults() -> web.Application:
    app = web.Application()
    for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
        app.router.add_post(path, ok)
    app.router.add_get("/server_info", ok)
    app.router.add_get("/health", ok)
    faults.install(app)
    return app


async def test_generation_fails_only_after_the_trigger_and_health_and_report_stay_200() -> None:
    async with TestClient(TestServer(app_with_faults())) as client:
        assert (await client.post("/generate", json={})).status == 200
        assert (await client.post(faults.TRIGGER_PATH)).status == 200
        for path in ("/generate", "/v1/completions", "/v1/chat/completions"):
            answer = await client.post(path, json={})
            assert answer.status == 500
            assert "injected failure" in (await answer.json())["error"]["message"]
        assert (await client.get("/health")).status == 200
        assert (await client.get("/server_info")).status == 200


def test_faults_are_off_unless_the_variable_is_exactly_1() -> None:
    assert faults.enabled({faults.ENV: "1"})
    assert not faults.enabled({})
    assert not faults.enabled({faults.ENV: "true"})


async def test_after_the_break_trigger_streams_get_a_200_head_and_then_lose_the_connection() -> (
    None
):
    """What SGLang does when a request fails after its stream's 200 head went out (a PD KV
    transfer that aborts, a scheduler that dies): the client got 200 and the body breaks. Here
    the connection is cut without the stream's end; non-streamed requests still answer."""
    async with TestClient(TestServer(app_with_faults())) as client:
        assert (await client.post(faults.BREAK_STREAMS_PATH)).status == 200
        answer = await client.post("/generate", json={"stream": True})
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/event-stream")
        first = await answer.content.readline()
        assert first.startswith(b"data: {")
        try:
            rest = await answer.content.read()
        except aiohttp.ClientPayloadError:
            rest = None  # the body broke: what the gateway sees
        assert rest is None or b"[DONE]" not in rest
        assert (await client.post("/generate", json={})).status == 200
        assert (await client.get("/health")).status == 200
