"""The reference engine's KV canary (``--kv-canary log``): it checks every slot a decode reads,
and logs SGLang's own violation line when one does not hold what it should."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

import aiohttp
from kvgate.verify import kv_canary

if TYPE_CHECKING:
    from conftest import EngineLauncher, RunningEngine

FLAGS = ("--mem-fraction-static", "0.85", "--context-length", "2048", "--kv-canary", "log")
GPU = {"KVGATE_GPU_MEMORY_GIB": "0.002"}


async def generate(engine: RunningEngine) -> tuple[int, object]:
    body = {"input_ids": list(range(100, 140)), "sampling_params": {"max_new_tokens": 4}}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine.url}/generate", json=body) as response,
    ):
        return response.status, await response.json()


def violations(engine: RunningEngine) -> list[kv_canary.CanaryViolation]:
    found = (kv_canary.parse_line(line) for line in engine.log().splitlines())
    return [v for v in found if v is not None]


async def test_canary_is_quiet_on_honest_decodes_and_reports_a_corrupt_slot(
    engines: EngineLauncher,
) -> None:
    engine = engines.spawn(*FLAGS, env=GPU)
    await engines.wait_healthy(engine)
    for _ in range(3):
        status, answer = await generate(engine)
        assert status == 200, answer
    assert violations(engine) == []

    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine.url}/kvgate/canary/corrupt") as response,
    ):
        assert response.status == 200
    status, _ = await generate(engine)
    assert status == 200  # SGLang's log mode keeps serving; only the log says it
    found = violations(engine)
    assert found, engine.log()[-2000:]
    first = found[0]
    assert (first.launch_tag, first.fail_reason, first.position) == (
        "HEAD_K_FULL",
        "verify_position",
        1_000_003,
    )


async def test_without_the_flag_there_is_no_canary_and_no_corrupt_route(
    engines: EngineLauncher,
) -> None:
    engine = engines.spawn("--mem-fraction-static", "0.85", "--context-length", "2048", env=GPU)
    await engines.wait_healthy(engine)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine.url}/kvgate/canary/corrupt") as response,
    ):
        assert response.status in (404, 405)


# SGLang's record with SGLang's own prefix, as a client would write it into anything the engine
# logs: a request id (with a newline to start a line of its own), a prompt, bootstrap input.
FORGED = (
    "kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=verify_position slot_idx=1 "
    "position=1 stored_token=0 expected_token=0 stored_chain_hash=0x0000000000000000 "
    "expected_aux=0x0000000000000000"
)
FORGED_LINE = f"\n[2026-11-05 12:00:00] {FORGED}"


async def test_client_text_in_the_engines_log_trips_nothing_and_a_real_violation_still_does(
    engines: EngineLauncher,
) -> None:
    engine = engines.spawn(*FLAGS, "--log-requests", env=GPU, skip_tokenizer_init=False)
    prefill = engines.spawn(*FLAGS, env=GPU, role="prefill")
    await engines.wait_healthy(engine)
    await engines.wait_healthy(prefill)
    bodies: list[dict[str, object]] = [
        {"rid": FORGED_LINE, "text": "hello", "sampling_params": {"max_new_tokens": 2}},
        {"rid": "r1", "text": FORGED_LINE, "sampling_params": {"max_new_tokens": 2}},
        {"rid": FORGED, "input_ids": [100, 101], "sampling_params": {"max_new_tokens": 2}},
    ]
    async with aiohttp.ClientSession() as session:
        for body in bodies:
            async with session.post(f"{engine.url}/generate", json=body) as response:
                assert response.status == 200, await response.text()
    assert prefill.bootstrap_port is not None
    for line in (json.dumps({"room": FORGED_LINE}), FORGED_LINE.strip()):
        reader, writer = await asyncio.open_connection(prefill.host, prefill.bootstrap_port)
        writer.write(line.encode() + b"\n")
        await writer.drain()
        await reader.read()  # the engine closes the connection once it has logged the error
        writer.close()
    # The client's text is in both logs, and none of it reads as SGLang's record.
    assert engine.log().count(FORGED) == 3 and "Receive: obj=GenerateReqInput" in engine.log()
    # int()'s error quotes the first 200 characters of the room.
    assert f"'\\n[2026-11-05 12:00:00] {FORGED[:100]}" in prefill.log(), prefill.log()[-2000:]
    assert violations(engine) == [] and violations(prefill) == []

    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{engine.url}/kvgate/canary/corrupt") as response,
    ):
        assert response.status == 200
    status, _ = await generate(engine)
    assert status == 200
    records = [v for v in violations(engine) if v.launch_tag is not None]
    assert records, engine.log()[-2000:]
    assert {(v.launch_tag, v.fail_reason, v.position) for v in records} == {
        ("HEAD_K_FULL", "verify_position", 1_000_003)  # the corrupt slot's, none of the client's
    }
