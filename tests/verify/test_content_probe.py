"""The content check at maximum length (pure): which probes, how answers are judged, the record."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from factories.local_http import serving_app
from factories.model_configs import model_config
from factories.model_deployments import spec_of
from kvgate.api.models import ContentProbeSpec
from kvgate.controller.content_check import parse_stream, send_probe
from kvgate.verify.content_probe import (
    REASON_FAILED,
    REASON_INCONCLUSIVE,
    REASON_PASSED,
    ContentCheck,
    Expect,
    ProbeAnswer,
    ProbeRequest,
    bounds_of,
    checks_in,
    judge,
    longest_full_answer,
    plan_probes,
    prompt_ids,
    record_of,
    updated_records,
    verdict,
    vocab_size_of,
)
from kvgate_engine.request_limits import RequestBounds

CONTEXT = 131_072
SETTINGS = ContentProbeSpec()  # 50 % and 100 %, 8 new tokens


def test_the_longest_full_answer_follows_sglangs_bounds() -> None:
    # n + m <= context - 2 (max_req_len - n - 1 new tokens) and n <= context - 7.
    assert longest_full_answer(CONTEXT, 8) == CONTEXT - 10
    assert longest_full_answer(CONTEXT, 1) == CONTEXT - 7
    assert longest_full_answer(CONTEXT, 5) == CONTEXT - 7


def test_probes_cover_half_and_full_length_then_over_the_pool_and_over_the_context() -> None:
    probes = plan_probes(CONTEXT, 470_000, SETTINGS)
    assert [(p.prompt_tokens, p.expect) for p in probes] == [
        ((CONTEXT - 10) // 2, Expect.ANSWER),
        (CONTEXT - 10, Expect.ANSWER),
        (470_001, Expect.REFUSAL),
        (CONTEXT + 1, Expect.REFUSAL),
    ]
    assert all(p.max_new_tokens == 8 for p in probes)


@pytest.mark.parametrize(
    ("pool", "over"),
    [
        (CONTEXT, [CONTEXT + 1]),  # the pool is the context: one over-range probe
        (None, [CONTEXT + 1]),  # pool unknown: only the context is a known limit
        (CONTEXT + 5, [CONTEXT + 6, CONTEXT + 1]),
    ],
)
def test_over_range_probes_are_one_when_pool_and_context_are_the_same(
    pool: int | None, over: list[int]
) -> None:
    probes = plan_probes(CONTEXT, pool, SETTINGS)
    assert [p.prompt_tokens for p in probes if p.expect is Expect.REFUSAL] == over


def test_lengths_and_new_tokens_come_from_the_spec() -> None:
    settings = ContentProbeSpec(lengths=[100, 10, 100], max_new_tokens=32)
    probes = plan_probes(4096, 8192, settings)
    assert [(p.prompt_tokens, p.max_new_tokens) for p in probes if p.expect is Expect.ANSWER] == [
        ((4096 - 34) * 10 // 100, 32),
        (4096 - 34, 32),
    ]


def sglang_new_tokens(n: int, m: int, context: int, pool: int, page: int, reserved: int) -> int:
    """What SGLang 0.5.23 does with a prompt of n tokens asking for m: HTTP 400 (-1) from the
    tokenizer (managers/tokenizer_manager.py: input + num_reserved_tokens >= context_len, or
    + max_new_tokens > context_len) or the scheduler (n >= max_req_input_len), else the new
    tokens after init_req_max_new_tokens' clips (max_req_len - n - 1; the allocator's
    max_new_tokens_for_memory: pool - ceil_page(n) - page - 1)."""
    if n + reserved >= context or n + reserved + m > context:
        return -1
    max_req_len = min(context - 1, pool - 1)
    if n >= max_req_len - 5:
        return -1
    paged = -(-n // page) * page
    return max(0, min(m, max_req_len - n - 1, pool - paged - page - 1))


DSA_CONFIG = model_config("deepseek-v3.2")
LLAMA_CONFIG = model_config("llama-3.1-8b")


@pytest.mark.parametrize(
    ("name", "spec_overrides", "page", "reserved"),
    [
        ("DSA forces a 64-token page", {"config": DSA_CONFIG}, 64, 0),
        ("EAGLE on Llama: auto (5 steps, topk 4, 8 drafts)", {"config": LLAMA_CONFIG}, 1, 20),
        ("EAGLE with explicit steps", {"config": LLAMA_CONFIG}, 1, 6),
        ("page 16 from the spec", {}, 16, 0),
    ],
)
def test_the_full_length_probe_is_answered_in_full_at_capacity(
    name: str, spec_overrides: dict[str, Any], page: int, reserved: int
) -> None:
    """A healthy engine whose pool is exactly the context answers the 100 % probe with every
    token asked, and the 50 % one too: DSA's forced page and EAGLE's reserved tokens included."""
    engine: dict[str, Any] = {"image": "lmsysorg/sglang:v0.5.23"}
    if "EAGLE" in name:
        engine["args"] = ["--speculative-algorithm", "EAGLE"]
        if "explicit" in name:
            engine["args"] += [
                "--speculative-num-steps=2",
                "--speculative-eagle-topk",
                "3",
                "--speculative-num-draft-tokens",
                "4",
            ]
    if page == 16:
        engine["pageSize"] = 16
    model = {"name": "m", "path": "/models/m", "contextLength": CONTEXT, **spec_overrides}
    spec = spec_of(model=model, engine=engine)
    bounds = bounds_of(spec)
    assert (bounds.page_size, bounds.reserved_tokens) == (page, reserved)
    probes = plan_probes(CONTEXT, CONTEXT, SETTINGS, bounds)
    answered = [p for p in probes if p.expect is Expect.ANSWER]
    for probe in answered:
        granted = sglang_new_tokens(probe.prompt_tokens, 8, CONTEXT, CONTEXT, page, reserved)
        assert granted == 8, (probe.name, probe.prompt_tokens, granted)
    longest = answered[-1].prompt_tokens
    # the longest such prompt: one more token (or page) is not answered in full
    assert sglang_new_tokens(longest + page, 8, CONTEXT, CONTEXT, page, reserved) != 8
    for probe in probes[len(answered) :]:
        assert sglang_new_tokens(probe.prompt_tokens, 8, CONTEXT, CONTEXT, page, reserved) == -1


def test_dsa_full_length_probe_length_by_hand() -> None:
    """pool 131,072, page 64, 8 new tokens: ceil_page(n) <= 131,072 - 64 - 1 - 8 = 130,999, so
    n = 2,046 pages = 130,944 tokens (page 1 would allow 131,062)."""
    page_64 = RequestBounds(page_size=64)
    assert longest_full_answer(CONTEXT, 8, pool_tokens=CONTEXT, bounds=page_64) == 130_944
    assert longest_full_answer(CONTEXT, 8, pool_tokens=CONTEXT) == CONTEXT - 10


IN = ProbeRequest("100%", CONTEXT - 10, 8, Expect.ANSWER)
OVER = ProbeRequest("over contextLength 131,072", CONTEXT + 1, 8, Expect.REFUSAL)


@pytest.mark.parametrize(
    ("request_", "answer", "passed"),
    [
        (IN, ProbeAnswer(200, 8), True),
        (IN, ProbeAnswer(200, 6), False),  # clipped: not the full answer
        (IN, ProbeAnswer(200, 8, error="aborted"), False),
        (IN, ProbeAnswer(400, 0, error="too long"), False),
        (IN, ProbeAnswer(None, transport_error="deadline after 600.0 s"), False),
        (OVER, ProbeAnswer(400, 0, error="The input is longer than the context"), True),
        (OVER, ProbeAnswer(200, 0, error="Input length exceeds"), True),  # in-band, stream
        (OVER, ProbeAnswer(200, 8), False),  # the incident's signature
        (OVER, ProbeAnswer(200, 3, error="late abort"), False),  # tokens reached the client
        (OVER, ProbeAnswer(503, 0, error="no workers"), False),  # not a refusal
        (OVER, ProbeAnswer(None, transport_error="ClientConnectorError"), False),
    ],
)
def test_each_answer_is_judged_as_a_safe_engine_would_answer(
    request_: ProbeRequest, answer: ProbeAnswer, passed: bool
) -> None:
    assert judge(request_, answer).passed is passed


def test_a_leak_fails_the_check_naming_the_lengths_and_the_answers() -> None:
    result = verdict(
        "bbbbbbbbbb", [judge(IN, ProbeAnswer(200, 8)), judge(OVER, ProbeAnswer(200, 8))]
    )
    assert not result.passed and result.reason == REASON_FAILED
    assert "131,073 tokens (over contextLength 131,072): HTTP 200, 8 tokens generated" in (
        result.message
    )
    assert "incident's signature" in result.message
    assert "safety.contentProbe.enabled" in result.message  # the way out


def test_all_safe_answers_pass() -> None:
    result = verdict(
        "bbbbbbbbbb", [judge(IN, ProbeAnswer(200, 8)), judge(OVER, ProbeAnswer(400, 0, "no"))]
    )
    assert result.passed and result.reason == REASON_PASSED


def test_no_answer_is_inconclusive_never_a_pass_nor_a_refusal() -> None:
    result = verdict(
        "bbbbbbbbbb",
        [judge(IN, ProbeAnswer(503, 0, "no_available_workers")), judge(OVER, ProbeAnswer(400))],
    )
    assert not result.passed and result.reason == REASON_INCONCLUSIVE and not result.conclusive
    assert verdict("bbbbbbbbbb", []).reason == REASON_INCONCLUSIVE
    # One definite failure decides, whatever else timed out.
    mixed = verdict(
        "bbbbbbbbbb",
        [judge(IN, ProbeAnswer(None, transport_error="x")), judge(OVER, ProbeAnswer(200, 8))],
    )
    assert mixed.reason == REASON_FAILED


def test_the_record_round_trips_and_keeps_only_running_revisions() -> None:
    result = verdict("bbbbbbbbbb", [judge(OVER, ProbeAnswer(200, 8, error="x" * 500))])
    item = record_of("bbbbbbbbbb", result, "2026-11-05T12:00:00Z")
    assert item["probes"][0]["httpStatus"] == 200 and len(item["probes"][0]["error"]) <= 160
    previous = {
        "contentChecks": [
            {"revision": "aaaaaaaaaa", "passed": True, "message": "ok"},
            {"revision": "gone000000", "passed": True, "message": "ok"},
            {"revision": "bbbbbbbbbb", "passed": True, "message": "stale"},
        ]
    }
    records = updated_records(previous, item, keep={"aaaaaaaaaa", "bbbbbbbbbb"})
    assert [r["revision"] for r in records] == ["bbbbbbbbbb", "aaaaaaaaaa"]
    assert checks_in({"contentChecks": records}) == (
        ContentCheck("bbbbbbbbbb", False, result.message),
        ContentCheck("aaaaaaaaaa", True, "ok"),
    )
    assert checks_in({"contentChecks": [{"revision": 3}, "x"]}) == ()


def test_prompt_ids_are_deterministic_ordinary_tokens() -> None:
    ids = prompt_ids(100_000)
    assert ids == prompt_ids(100_000) and len(ids) == 100_000
    assert min(ids) >= 1000 and max(ids) < 31_000
    assert prompt_ids(100, 128_256) == prompt_ids(100)  # a real vocabulary: the default range


@pytest.mark.parametrize("vocab", [384, 1000, 8000, 30_999])
def test_prompt_ids_stay_inside_a_small_vocabulary(vocab: int) -> None:
    # An id >= vocab_size crashed the released SGLang's scheduler (IndexError in the embedding)
    # when kvgate probed the e2e world's tiny Llama (384 tokens) with ids from [1,000, 31,000).
    ids = prompt_ids(10_000, vocab)
    assert max(ids) < vocab - vocab // 8 and min(ids) >= vocab // 4
    assert len(set(ids)) > min(50, vocab // 2)  # not one token repeated


def test_vocab_size_is_read_from_the_model_config() -> None:
    assert vocab_size_of({"vocab_size": 384}) == 384
    assert vocab_size_of({"text_config": {"vocab_size": 262_208}, "vocab_size": 1}) == 262_208
    for config in (None, {}, {"vocab_size": 0}, {"vocab_size": "384"}, {"vocab_size": True}):
        assert vocab_size_of(config) is None


@pytest.mark.parametrize(
    ("status", "raw", "tokens", "error"),
    [
        (
            200,
            b'data: {"output_ids": [1,2], "meta_info": {"completion_tokens": 2}}\n\n'
            b'data: {"output_ids": [1,2,3], "meta_info": {"completion_tokens": 3}}\n\n'
            b"data: [DONE]\n\n",
            3,
            None,
        ),
        (200, b'data: {"error": {"message": "Input length (9 tokens) exceeds"}}\n\n', 0, "Input"),
        (400, b'{"error": {"message": "The input (9 tokens) is longer"}}', 0, "The input"),
        (
            200,
            b'data: {"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", '
            b'"message": "too long"}}}\n\n',
            0,
            "too long",
        ),
        (502, b"bad gateway", 0, "bad gateway"),
    ],
)
def test_stream_answers_are_read_as_a_client_sees_them(
    status: int, raw: bytes, tokens: int, error: str | None
) -> None:
    answer = parse_stream(status, raw, False, 0.1)
    assert answer.generated_tokens == tokens
    assert (answer.error or "").startswith(error or "") and (error is None) == (
        answer.error is None
    )


async def test_a_probe_sends_only_token_ids_of_the_models_vocabulary() -> None:
    # An engine that dies on an out-of-vocabulary id, as the released SGLang 0.5.23 did on the
    # e2e world's 384-token tiny Llama (the scheduler's embedding lookup raised IndexError).
    seen: list[list[int]] = []

    async def generate(request: web.Request) -> web.StreamResponse:
        ids = (await request.json())["input_ids"]
        seen.append(ids)
        if max(ids) >= 384:
            return web.Response(status=500, text="Scheduler hit an exception: IndexError")
        return web.Response(
            text='data: {"output_ids": [1, 2], "meta_info": {"completion_tokens": 2}}\n\n',
            content_type="text/event-stream",
        )

    app = web.Application()
    app.router.add_post("/generate", generate)
    request = ProbeRequest("50%", 2000, 2, Expect.ANSWER)
    answers: dict[Any, ProbeAnswer] = {}
    async with serving_app(app) as url, aiohttp.ClientSession() as session:
        for vocab in (None, 384):
            answers[vocab] = await send_probe(
                session, url, "tiny", request, timeout=10, vocab_size=vocab
            )
    assert answers[None].http_status == 500  # the default range is too wide for 384 tokens
    assert answers[384].http_status == 200 and answers[384].generated_tokens == 2
    assert len(seen[1]) == 2000 and max(seen[1]) < 384


async def test_a_streamed_answer_is_read_to_its_end_not_only_its_first_event() -> None:
    # The released SGLang streams a PD answer one token at a time; the content check read only
    # what had arrived when it first looked (one event: "HTTP 200, 1 tokens generated") and
    # refused a healthy revision of the real engine. The reference engine's burst hid it.
    async def generate(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for n in range(1, 9):
            event = {"output_ids": list(range(n)), "meta_info": {"completion_tokens": n}}
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
            await asyncio.sleep(0.02)
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/generate", generate)
    async with serving_app(app) as url, aiohttp.ClientSession() as session:
        answer = await send_probe(
            session, url, "tiny", ProbeRequest("50%", 100, 8, Expect.ANSWER), timeout=10
        )
    assert answer.http_status == 200 and answer.generated_tokens == 8, answer
    assert judge(ProbeRequest("50%", 100, 8, Expect.ANSWER), answer).passed
