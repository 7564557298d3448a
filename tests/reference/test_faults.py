"""Injected generation failures: the engine stays healthy and verified, generation fails."""

from __future__ import annotations

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
