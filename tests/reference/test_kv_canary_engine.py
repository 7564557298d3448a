"""The reference engine's KV canary (``--kv-canary log``): it checks every slot a decode reads,
and logs SGLang's own violation line when one does not hold what it should."""

from __future__ import annotations

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
