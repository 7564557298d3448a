"""Injected generation failures (tests only): a verified engine that starts failing requests.

``KVGATE_REFERENCE_FAULTS=1`` adds three triggers; ``/health``, ``/server_info`` and the KV pool
stay as they were, so kvgate keeps the engine verified. They are what a progressive rollout's
step check must catch: a revision that passed every check before traffic and then fails the
requests it is given.

- ``POST /kvgate/faults/fail-generation``: every generation request (``/generate``,
  ``/v1/completions``, ``/v1/chat/completions``) gets HTTP 500;
- ``POST /kvgate/faults/break-streams``: every *streamed* generation request gets its 200 head
  and a first event, and 0.2 s later the connection is cut without the stream's end, as when SGLang
  fails a request after the head went out (a PD KV transfer that aborts, a scheduler that dies
  mid-request). Non-streamed requests still answer. A gateway sees a 200 whose body broke;
- ``POST /kvgate/faults/fail-transfers`` (a decode engine): every KV transfer that arrives fails
  its checksum, as SGLang's decode fails one (``KV checksum mismatch``, status 500): it counts
  ``sglang:num_transfer_failed_reqs_total``, a streamed request gets its 200 head, one in-band
  ``{"error": ...}`` event and ``[DONE]`` (a clean end: smg counts a plain 200), a non-streamed
  one a 500.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

ENV = "KVGATE_REFERENCE_FAULTS"
TRIGGER_PATH = "/kvgate/faults/fail-generation"
BREAK_STREAMS_PATH = "/kvgate/faults/break-streams"
FAIL_TRANSFERS_PATH = "/kvgate/faults/fail-transfers"
BREAK_AFTER_SECONDS = 0.2  # a broken stream's life after its first event
GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
FAILING: web.AppKey[list[bool]] = web.AppKey("kvgate_faults_failing", list[bool])
BREAKING: web.AppKey[list[bool]] = web.AppKey("kvgate_faults_breaking", list[bool])


def enabled(env: Mapping[str, str] | None = None) -> bool:
    return (env if env is not None else os.environ).get(ENV, "") == "1"


async def _streamed(request: web.Request) -> bool:
    try:
        body = await request.json()  # aiohttp keeps the body: the handler reads it again
    except ValueError:
        return False
    return isinstance(body, dict) and bool(body.get("stream"))


async def _break_stream(request: web.Request) -> web.StreamResponse:
    """A 200 head, one event, then the connection cut (no terminating chunk, no [DONE])."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    event = {"text": "", "output_ids": [], "meta_info": {"finish_reason": None}}
    await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    # Some tokens' time, as a request that fails mid-decode: smg 1.13 has then relayed the head
    # and the first event (cut at once, smg may still answer its own 502 for it).
    await asyncio.sleep(BREAK_AFTER_SECONDS)
    if request.transport is not None:
        request.transport.close()
    return response


def install(app: web.Application, fail_transfers: Callable[[], None] | None = None) -> None:
    """Add the trigger routes and the middleware that fails generation once triggered;
    ``fail_transfers`` (a decode engine's) makes every arriving KV transfer fail."""
    app[FAILING] = [False]
    app[BREAKING] = [False]

    async def trigger(request: web.Request) -> web.Response:
        request.app[FAILING][0] = True
        return web.json_response({"failing": True})

    async def trigger_break(request: web.Request) -> web.Response:
        request.app[BREAKING][0] = True
        return web.json_response({"breaking_streams": True})

    @web.middleware
    async def fail_generation(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in GENERATION_PATHS:
            if request.app[FAILING][0]:
                return web.json_response(
                    {
                        "error": {
                            "message": "injected failure (KVGATE_REFERENCE_FAULTS)",
                            "code": 500,
                        }
                    },
                    status=500,
                )
            if request.app[BREAKING][0] and await _streamed(request):
                return await _break_stream(request)
        return await handler(request)

    if fail_transfers is not None:
        turn_on = fail_transfers

        async def trigger_transfers(request: web.Request) -> web.Response:
            turn_on()
            return web.json_response({"failing_transfers": True})

        app.router.add_post(FAIL_TRANSFERS_PATH, trigger_transfers)
    app.router.add_post(TRIGGER_PATH, trigger)
    app.router.add_post(BREAK_STREAMS_PATH, trigger_break)
    app.middlewares.append(fail_generation)
