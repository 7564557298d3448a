"""The content check's abort step against real reference engines behind a PD router.

``KVGATE_REFERENCE_STALE_KV_AFTER_ABORT=1`` on the decode engine: an aborted request's KV
transfer lands in its freed pages after the next request's own KV, so the request after an abort
decodes the aborted prompt (HTTP 200, wrong tokens). Every length probe still passes on it; only
the abort step (a known-answer request, a request dropped mid-flight, the known answer again)
sees it. The router here does what smg does with a client's disconnect: it closes both legs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from factories.model_deployments import spec_of
from kvgate.controller.content_check import Sender, abort_step, check_through, metrics_reader
from kvgate.controller.step_check import fetch_text
from kvgate.verify import abort_probe, content_probe
from kvgate.verify.content_probe import REASON_FAILED, REASON_PASSED, Expect
from kvgate_engine.reference.engine import DECODE_STEP_SECONDS, STALE_KV_AFTER_ABORT

if TYPE_CHECKING:
    from conftest import EngineLauncher, RunningEngine

# The e2e sample's model and context: the longest probe takes long enough (~2 s here) that a
# drop half way through it lands while the engines hold the request.
CONTEXT = 131_072
GPU = {"KVGATE_GPU_MEMORY_GIB": "40"}  # a pool a little over the context
SPEC = spec_of(
    model={"name": "llama-3.1-8b", "path": "/models/llama-3.1-8b", "contextLength": CONTEXT},
    safety={"contentProbe": {"lengths": [100]}},
)
FIELDS = {"namespace": "t", "deployment": "tiny", "revision": "r1"}
PACED_STEP_SECONDS = 0.2  # a decode step: 64 tokens take 12.8 s


@contextlib.asynccontextmanager
async def pd_router(prefill: RunningEngine, decode: RunningEngine) -> AsyncIterator[str]:
    """A PD router on loopback: both legs at once, decode's answer relayed; the client's
    disconnect cancels the handler, which closes both legs' connections."""
    rooms = itertools.count(1)

    async def generate(request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = await request.json()
        body.update(
            bootstrap_host=prefill.host,
            bootstrap_port=prefill.bootstrap_port,
            bootstrap_room=next(rooms),
        )
        async with aiohttp.ClientSession() as session:
            prefill_leg = asyncio.create_task(_drain(session, f"{prefill.url}/generate", body))
            try:
                async with session.post(f"{decode.url}/generate", json=body) as leg:
                    out = web.StreamResponse(status=leg.status)
                    out.content_type = leg.content_type
                    await out.prepare(request)
                    async for chunk in leg.content.iter_any():
                        await out.write(chunk)
                    await out.write_eof()
                await prefill_leg
            finally:
                prefill_leg.cancel()
        return out

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _drain(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with session.post(url, json=body) as leg:
        await leg.read()


async def pair(engines: EngineLauncher, decode_env: dict[str, str]) -> tuple[RunningEngine, ...]:
    flags = ("--model-path", "llama-3.1-8b", "--mem-fraction-static", "0.85", "--enable-metrics")
    flags += ("--context-length", str(CONTEXT))
    prefill = engines.spawn(*flags, role="prefill", env=GPU)
    decode = engines.spawn(*flags, role="decode", env={**GPU, **decode_env})
    await engines.wait_healthy(prefill, decode)
    return prefill, decode


def reader(prefill: RunningEngine, decode: RunningEngine) -> Any:
    """The two engines' /metrics, as the operator reads the revision's verified engines."""
    return metrics_reader([("prefill-0", prefill.url), ("decode-0", decode.url)], fetch_text)


async def content_check(engines: EngineLauncher, decode_env: dict[str, str]) -> Any:
    prefill, decode = await pair(engines, decode_env)
    _, info = await engines.get_json(f"{decode.url}/server_info")
    pool = info["max_total_num_tokens"]
    async with pd_router(prefill, decode) as url:
        return await check_through(url, "r1", SPEC, pool, {}, FIELDS, reader(prefill, decode))


async def test_a_decode_that_lands_an_aborted_transfer_in_the_next_request_fails_the_check(
    engines: EngineLauncher,
) -> None:
    verdict = await content_check(engines, {STALE_KV_AFTER_ABORT: "1"})
    assert verdict.reason == REASON_FAILED, verdict.message
    by_expect = {f.request.expect: f for f in verdict.findings}
    # Every length probe passed: the pool and length admission are honest.
    lengths = [f for f in verdict.findings if f.request.expect in (Expect.ANSWER, Expect.REFUSAL)]
    assert len(lengths) == 3 and all(f.passed for f in lengths), verdict.message
    assert by_expect[Expect.ABORT].passed, verdict.message  # it was dropped mid-flight
    before, *after = [f for f in verdict.findings if f.request.expect is Expect.KNOWN_ANSWER]
    # The reference model copies the prompt: the known answer is its first 8 ids; the request
    # the aborted KV landed on decodes the aborted prompt, which starts one id later.
    prompt = content_probe.prompt_ids(9)
    assert before.passed and before.answer.output_ids == tuple(prompt[:8])
    wrong = [f for f in after if not f.passed]
    assert len(after) == 2 and wrong, verdict.message
    assert all(f.answer.http_status == 200 and not f.undecided for f in wrong)
    assert all(f.answer.output_ids == tuple(prompt[1:9]) for f in wrong), verdict.message
    assert "abort-path contamination" in verdict.message, verdict.message
    assert f"want output_ids [{', '.join(map(str, prompt[:8]))}]" in verdict.message
    assert "release their KV cleanly" in verdict.message


async def test_honest_engines_give_the_known_answer_after_an_abort(
    engines: EngineLauncher,
) -> None:
    verdict = await content_check(engines, {})
    assert verdict.reason == REASON_PASSED, verdict.message
    expects = [f.request.expect for f in verdict.findings]
    assert expects[-4:] == [Expect.KNOWN_ANSWER, Expect.ABORT] + [Expect.KNOWN_ANSWER] * 2
    assert "connection closed" in verdict.findings[-3].summary
    # The engines counted the drop as an abort (SGLang's tokenizer counts a request whose client
    # went away), and the last known answer went once they held no request.
    assert "the engines counted" in verdict.findings[-3].summary, verdict.findings[-3].summary
    known = verdict.findings[-4].answer.output_ids
    assert known is not None and len(known) == 8
    assert all(f.answer.output_ids == known for f in verdict.findings[-2:])


async def test_a_drop_planned_after_the_answer_is_tried_again_sooner_and_finds_the_stale_kv(
    engines: EngineLauncher,
) -> None:
    """On a loaded machine the longest probe can take over twice as long as the dropped
    request, whose full answer then comes before its drop: nothing is aborted. The request goes
    again, dropped at half its own answer's time, and the abort lands.

    The decode is paced (DECODE_STEP_SECONDS): its 64 tokens take 12.8 s, most of the dropped
    request's life, so half of try 1's time falls inside try 2 even when the machine's load
    changes between the tries. Unpaced, try 2 can be over on the engines before its drop while
    this process's router still relays its tail, and then nothing is aborted."""
    paced = {STALE_KV_AFTER_ABORT: "1", DECODE_STEP_SECONDS: str(PACED_STEP_SECONDS)}
    prefill, decode = await pair(engines, paced)
    _, info = await engines.get_json(f"{decode.url}/server_info")
    settings = SPEC.safety.content_probe
    bounds = content_probe.bounds_of(SPEC)
    plan = abort_probe.plan_abort(CONTEXT, info["max_total_num_tokens"], settings, bounds)
    vocab = content_probe.vocab_size_of(SPEC.model.config)
    async with pd_router(prefill, decode) as url, aiohttp.ClientSession() as session:
        sender = Sender(url, SPEC.model.name, {}, vocab)
        # As if the longest probe had taken 120 s: the first drop is planned 60 s in.
        findings = await abort_step(
            session, sender, plan, 120.0, settings.timeout_seconds, FIELDS, reader(prefill, decode)
        )
    dropped = next(f for f in findings if f.request.expect is Expect.ABORT)
    assert "try 1: answered in full in" in dropped.summary, dropped.summary
    assert "before its drop at 60.00 s" in dropped.summary, dropped.summary
    assert "connection closed" in dropped.summary, dropped.summary
    after = [f for f in findings if f.request.expect is Expect.KNOWN_ANSWER][1:]
    assert after and not all(f.passed for f in after), [f.summary for f in findings]
