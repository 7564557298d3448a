"""Injected generation failures: the engine stays healthy and verified, generation fails."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from kvgate_engine.reference import faults
from test_pd_handoff import SMALL_GPU, metric

if TYPE_CHECKING:
    from conftest import EngineLauncher


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


async def test_after_the_transfer_trigger_decode_ends_streams_with_sglangs_in_band_error_and_counts_them(  # noqa: E501
    engines: EngineLauncher,
) -> None:
    """What SGLang's decode does when a request's KV transfer fails or arrives with a checksum
    mismatch: the stream's 200 head, one in-band error event (status 500), then ``[DONE]``, a
    clean end no gateway counts as a failure; only ``sglang:num_transfer_failed_reqs_total``
    counts it. A non-streamed request gets the 500 as its status."""
    flags = ("--mem-fraction-static", "0.85", "--enable-metrics")
    env = {**SMALL_GPU, faults.ENV: "1"}
    prefill = engines.spawn(*flags, role="prefill", env=env)
    decode = engines.spawn(*flags, role="decode", env=env)
    await engines.wait_healthy(prefill, decode)
    prompt = list(range(100, 132))
    _, healthy = await engines.route_pd(prefill, decode, prompt, 4, room=1, stream=True)
    assert healthy.status == 200 and healthy.body["output_ids"] == prompt[:4], healthy.body
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{decode.url}{faults.FAIL_TRANSFERS_PATH}") as trigger,
    ):
        assert trigger.status == 200

    # post_generate asserts the stream ended with [DONE]: a clean end
    _, streamed = await engines.route_pd(prefill, decode, prompt, 4, room=2, stream=True)
    assert streamed.status == 200
    assert streamed.body["error"]["code"] == 500, streamed.body
    assert "KV checksum mismatch" in streamed.body["error"]["message"]
    _, plain = await engines.route_pd(prefill, decode, prompt, 4, room=3)
    assert plain.status == 500, plain.body
    assert await metric(decode, "num_transfer_failed_reqs_total") == 2
    assert await metric(decode, "num_used_tokens") == 0  # the failed requests' pages came back
    status, _ = await engines.get_json(f"{decode.url}/health")
    assert status == 200
