"""KVGATE_ADMIT_OVER_LENGTH=1: the engine the pool check passes that still answers a prompt
longer than its context (what kvgate's content check at maximum length exists to catch).

Both pools hold more than the 2,048-token context, so /server_info proves everything the pool
check asks for; only sending a prompt over the context shows the difference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvgate.verify.content_probe import Expect, ProbeAnswer, ProbeRequest, judge

if TYPE_CHECKING:
    from conftest import EngineLauncher, RunningEngine

BIG_POOL = {"KVGATE_GPU_MEMORY_GIB": "0.002"}  # a pool well above the context
LENIENT = {"KVGATE_ADMIT_OVER_LENGTH": "1"}
OVER_CONTEXT = [7] * 2049  # contextLength 2,048 + 1
OVER = ProbeRequest("over contextLength 2,048", len(OVER_CONTEXT), 4, Expect.REFUSAL)


async def start_pair(engines: EngineLauncher, env: dict[str, str]) -> tuple[RunningEngine, ...]:
    flags = ("--mem-fraction-static", "0.85", "--context-length", "2048")
    prefill = engines.spawn(*flags, role="prefill", env={**BIG_POOL, **env})
    decode = engines.spawn(*flags, role="decode", env={**BIG_POOL, **env})
    await engines.wait_healthy(prefill, decode)
    return prefill, decode


async def test_lenient_engines_pass_the_pool_check_and_answer_an_over_length_prompt(
    engines: EngineLauncher,
) -> None:
    prefill, decode = await start_pair(engines, LENIENT)
    for engine in (prefill, decode):
        _, info = await engines.get_json(f"{engine.url}/server_info")
        assert info["max_total_num_tokens"] > 2_048 + 4  # the pool check passes
        assert info["max_req_input_len"] == 2_048 - 6
    _, answer = await engines.route_pd(prefill, decode, OVER_CONTEXT, 4, room=1)
    assert answer.status == 200 and len(answer.body["output_ids"]) == 4, answer.body
    verdict = judge(OVER, ProbeAnswer(answer.status, len(answer.body["output_ids"])))
    assert not verdict.passed  # the content check's judge calls it a leak
    assert "KVGATE_ADMIT_OVER_LENGTH=1" in decode.log()


async def test_honest_engines_refuse_the_same_prompt(engines: EngineLauncher) -> None:
    prefill, decode = await start_pair(engines, {})
    _, answer = await engines.route_pd(prefill, decode, OVER_CONTEXT, 4, room=1)
    assert answer.status == 400, answer.body
    assert judge(OVER, ProbeAnswer(answer.status, 0, answer.body["error"]["message"])).passed
