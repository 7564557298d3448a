"""The GLM incident, reproduced: an over-length prompt's decode reads another request's KV.

Prefill runs on a GPU whose pool (692 tokens) is below the 2,048-token context, as in the
incident (681,280 < 1,048,576); decode's pool (2,474) holds the context. Request A carries a
canary. Request B is longer than prefill's max_req_input_len (686) but within the context, so it
passes the tokenizer check and fails only the scheduler's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conftest import EngineLauncher, Leg, RunningEngine

CANARY = [1001, 1002, 1003, 1004, 1005, 1006, 1007, 1008, 1009, 1010, 1011, 1012]
REQUEST_A = [1, 2, 3, 4, *CANARY, *range(20, 300)]  # 296 tokens
REQUEST_B = [7] * 800  # >= prefill's max_req_input_len 686, < context 2,048
PREFILL_GPU = {"KVGATE_GPU_MEMORY_GIB": "0.0005"}  # 692-token pool
DECODE_GPU = {"KVGATE_GPU_MEMORY_GIB": "0.001"}  # 2,474-token pool
EMULATE = {"KVGATE_EMULATE_INCIDENT": "1"}


async def start_pair(
    engines: EngineLauncher, prefill_env: dict[str, str], decode_env: dict[str, str]
) -> tuple[RunningEngine, RunningEngine]:
    flags = ("--mem-fraction-static", "0.85", "--context-length", "2048")
    prefill = engines.spawn(*flags, role="prefill", env={**PREFILL_GPU, **prefill_env})
    decode = engines.spawn(*flags, role="decode", env={**DECODE_GPU, **decode_env})
    await engines.wait_healthy(prefill, decode)
    return prefill, decode


def contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack)))


async def a_then_b(
    engines: EngineLauncher, prefill: RunningEngine, decode: RunningEngine, stream: bool = False
) -> tuple[Leg, Leg, Leg]:
    _, a_decode = await engines.route_pd(prefill, decode, REQUEST_A, 4, room=1)
    assert a_decode.status == 200, a_decode.body
    assert a_decode.body["output_ids"] == REQUEST_A[:4]
    b_prefill, b_decode = await engines.route_pd(prefill, decode, REQUEST_B, 40, 2, stream)
    return a_decode, b_prefill, b_decode


async def test_pre_fix_engines_leak_one_requests_canary_into_anothers_response(
    engines: EngineLauncher,
) -> None:
    prefill, decode = await start_pair(engines, EMULATE, EMULATE)
    _, b_prefill, b_decode = await a_then_b(engines, prefill, decode)

    assert b_prefill.status == 400  # prefill knew the request was aborted...
    assert b_decode.status == 200  # ...but the client sees decode's answer
    assert contains(b_decode.body["output_ids"], CANARY), b_decode.body["output_ids"]
    assert "placeholder" in prefill.log()


async def test_fixed_engines_reject_the_over_length_request_and_leak_nothing(
    engines: EngineLauncher,
) -> None:
    prefill, decode = await start_pair(engines, {}, {})
    _, b_prefill, b_decode = await a_then_b(engines, prefill, decode)

    assert b_prefill.status == 400
    assert b_decode.status == 400
    message = b_decode.body["error"]["message"]
    assert message == (
        "Input length (800 tokens) exceeds the maximum allowed length (686 tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )
    assert "output_ids" not in b_decode.body


async def test_fixed_decode_refuses_an_incomplete_transfer_from_an_old_prefill(
    engines: EngineLauncher,
) -> None:
    prefill, decode = await start_pair(engines, EMULATE, {})
    _, b_prefill, b_decode = await a_then_b(engines, prefill, decode)

    assert b_prefill.status == 400
    assert b_decode.status == 500
    assert "received 1 of 800 reserved tokens" in b_decode.body["error"]["message"]
    assert "output_ids" not in b_decode.body


async def test_streamed_over_length_request_is_rejected_in_band_behind_a_200_head(
    engines: EngineLauncher,
) -> None:
    """SGLang commits a stream's 200 head before the scheduler runs, so the prefill's rejection
    travels inside the stream. A gateway that checks only the legs' heads relays decode's stream:
    with pre-fix engines it carries request A's canary, every head saying 200."""
    prefill, decode = await start_pair(engines, EMULATE, EMULATE)
    _, b_prefill, b_decode = await a_then_b(engines, prefill, decode, stream=True)

    assert (b_prefill.status, b_decode.status) == (200, 200)
    assert "exceeds the maximum allowed length" in b_prefill.body["error"]["message"]
    assert contains(b_decode.body["output_ids"], CANARY), b_decode.body


async def test_fixed_engines_reject_a_streamed_over_length_request_without_output(
    engines: EngineLauncher,
) -> None:
    prefill, decode = await start_pair(engines, {}, {})
    _, b_prefill, b_decode = await a_then_b(engines, prefill, decode, stream=True)

    assert b_decode.body["error"]["code"] == 400
    assert "output_ids" not in b_decode.body
    assert "output_ids" not in b_prefill.body
