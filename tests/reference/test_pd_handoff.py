"""A real prefill→decode KV handoff between two reference engine processes on loopback."""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING

import aiohttp

if TYPE_CHECKING:
    from conftest import EngineLauncher, RunningEngine

SMALL_GPU = {"KVGATE_GPU_MEMORY_GIB": "0.001"}  # tiny-llama: 2,474-token pool, context 2,048


async def start_pair(engines: EngineLauncher, *flags: str) -> tuple[RunningEngine, RunningEngine]:
    prefill = engines.spawn("--mem-fraction-static", "0.85", *flags, role="prefill", env=SMALL_GPU)
    decode = engines.spawn("--mem-fraction-static", "0.85", *flags, role="decode", env=SMALL_GPU)
    await engines.wait_healthy(prefill, decode)
    return prefill, decode


async def metric(engine: RunningEngine, name: str) -> float:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{engine.url}/metrics") as response,
    ):
        text = await response.text()
    match = re.search(rf"^sglang:{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, f"sglang:{name} missing from /metrics"
    return float(match.group(1))


async def test_decode_answers_the_known_function_through_a_real_handoff(
    engines: EngineLauncher,
) -> None:
    prefill, decode = await start_pair(engines, "--enable-metrics")
    prompt = [1, 2, 3, *range(400, 440), 4]
    prefill_leg, decode_leg = await engines.route_pd(prefill, decode, prompt, 20, room=4242)

    assert decode_leg.status == 200, decode_leg.body
    assert decode_leg.body["output_ids"] == prompt[:20]
    assert decode_leg.body["meta_info"]["prompt_tokens"] == len(prompt)
    assert prefill_leg.status == 200, prefill_leg.body
    assert prefill_leg.body["output_ids"] == [1]
    # Both engines gave their pages back.
    assert await metric(decode, "num_used_tokens") == 0
    assert await metric(prefill, "num_used_tokens") == 0
    assert await metric(decode, "num_transfer_failed_reqs_total") == 0


async def test_handoff_with_kv_checksums_on_both_roles(engines: EngineLauncher) -> None:
    prefill, decode = await start_pair(engines, "--disaggregation-enable-kv-checksum")
    prompt = list(range(100, 164))
    rooms = range(10, 14)
    legs = await asyncio.gather(
        *(engines.route_pd(prefill, decode, prompt, 8, room=room) for room in rooms)
    )
    for _, decode_leg in legs:
        assert decode_leg.status == 200, decode_leg.body
        assert decode_leg.body["output_ids"] == prompt[:8]


async def test_prefill_bootstrap_port_answers_http_health(engines: EngineLauncher) -> None:
    prefill = await engines.start(role="prefill", env=SMALL_GPU)
    status, body = await engines.get_json(f"http://{prefill.host}:{prefill.bootstrap_port}/health")
    assert (status, body) == (200, "OK")


async def test_dropped_decode_connection_aborts_and_frees_its_pages(
    engines: EngineLauncher,
) -> None:
    prefill, decode = await start_pair(engines, "--enable-metrics")
    body = {
        "input_ids": [5] * 500,
        "sampling_params": {"max_new_tokens": 4},
        "bootstrap_host": prefill.host,
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": 77,
    }
    # Only the decode leg: it reserves pages and waits for a prefill that never comes.
    async with aiohttp.ClientSession() as session:
        request = asyncio.ensure_future(session.post(f"{decode.url}/generate", json=body))
        deadline = time.monotonic() + 10
        while await metric(decode, "num_used_tokens") < 500:
            assert time.monotonic() < deadline, "decode never reserved the prompt's pages"
            await asyncio.sleep(0.05)
        request.cancel()  # the client goes away: the only cancel a router sends
    deadline = time.monotonic() + 10
    while await metric(decode, "num_used_tokens") != 0:
        assert time.monotonic() < deadline, "decode kept the pages of an aborted request"
        await asyncio.sleep(0.05)
