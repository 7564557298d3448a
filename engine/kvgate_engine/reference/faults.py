"""Injected generation failures (tests only): a verified engine that starts failing requests.

``KVGATE_REFERENCE_FAULTS=1`` adds ``POST /kvgate/faults/fail-generation``; once it was called,
every generation request (``/generate``, ``/v1/completions``, ``/v1/chat/completions``) gets
HTTP 500 while ``/health``, ``/server_info`` and the KV pool stay as they were, so kvgate keeps
the engine verified. It is what a progressive rollout's step check must catch: a revision that
passed every check before traffic and then fails the requests it is given.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

ENV = "KVGATE_REFERENCE_FAULTS"
TRIGGER_PATH = "/kvgate/faults/fail-generation"
GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
FAILING: web.AppKey[list[bool]] = web.AppKey("kvgate_faults_failing", list[bool])


def enabled(env: Mapping[str, str] | None = None) -> bool:
    return (env if env is not None else os.environ).get(ENV, "") == "1"


def install(app: web.Application) -> None:
    """Add the trigger route and the middleware that fails generation once triggered."""
    app[FAILING] = [False]

    async def trigger(request: web.Request) -> web.Response:
        request.app[FAILING][0] = True
        return web.json_response({"failing": True})

    @web.middleware
    async def fail_generation(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.app[FAILING][0] and request.path in GENERATION_PATHS:
            return web.json_response(
                {"error": {"message": "injected failure (KVGATE_REFERENCE_FAULTS)", "code": 500}},
                status=500,
            )
        return await handler(request)

    app.router.add_post(TRIGGER_PATH, trigger)
    app.middlewares.append(fail_generation)
