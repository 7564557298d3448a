"""Hostile mode: the reference engine as the attacker of kvgate's probe.

Whoever writes a ModelDeployment chooses its engine's image and ``spec.engine.env``, so the
engine is tenant-controlled: what its ``/server_info`` answers is the tenant's choice. These modes
let the e2e tier play that tenant with nothing but an environment variable:

==================  ============================================================================
``redirect:<url>``  HTTP 302 to ``<url>`` (``{path}`` in it becomes the request path): read-back
                    SSRF, e.g. the API server, the operator's metrics, or a sibling engine
                    whose big pool should then "verify" this one
``huge-body``       200 and a 16 MiB JSON document (``[{},{},...]``, chunked, no
                    Content-Length): what kvgate must stop reading at its cap
``json-bomb``       200 and a 3.5 MiB JSON document of ~1.2 million values (under the 4 MiB byte
                    cap): what kvgate must refuse to parse
``slow-body``       200 and the honest document, trickled one byte every 0.5 s: what one
                    deadline per request must cut off
``echo:<text>``     HTTP 500 with ``<text>`` in its JSON error body: what kvgate must never copy
                    into a condition, an Event or a log
==================  ============================================================================

``KVGATE_REFERENCE_HOSTILE=<mode>`` turns it on for every role;
``KVGATE_REFERENCE_HOSTILE_PREFILL`` / ``_DECODE`` / ``_NULL`` for one role (it wins). Only
``/server_info``, ``/get_server_info`` and ``/v1/models`` change: ``/health`` stays 200, so the
pod's container is Ready and kvgate probes it, and everything else (generation, metrics) is the
honest engine's. Every body a mode writes carries :data:`MARKER`, so a test can prove none of it
reached anything kvgate wrote.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from aiohttp import web

ENV = "KVGATE_REFERENCE_HOSTILE"
MODES = ("redirect:<url>", "huge-body", "json-bomb", "slow-body", "echo:<text>")
MARKER = "kvgate-reference-hostile-body"
MiB = 2**20
HUGE_BODY_BYTES = 16 * MiB  # exactly the cap the probe had before its limits were tightened
BOMB_BYTES = 3 * MiB + MiB // 2  # under the 4 MiB /server_info byte cap
CHUNK_BYTES = 64 * 1024
TRICKLE_SECONDS = 0.5
# Filler of the body modes: one JSON value per 3 bytes, the cheapest bytes to make a parser spend
# memory on (CPython's json spends ~27x their size).
FILLER = b"{},"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HostileModeError(ValueError):
    """The environment names no mode this engine knows; the message says which exist."""


@dataclass(frozen=True)
class Hostile:
    """One hostile mode: ``kind`` is ``redirect``, ``huge-body``, ``json-bomb``, ``slow-body`` or
    ``echo``; ``argument`` is the URL or the text of ``redirect`` and ``echo``."""

    kind: str
    argument: str = ""
    variable: str = ENV  # where it was read from, for the start-up log

    def describe(self) -> str:
        if self.kind == "redirect":
            return f"HTTP 302 to {self.argument}"
        if self.kind == "huge-body":
            return f"a {HUGE_BODY_BYTES // MiB} MiB JSON body"
        if self.kind == "json-bomb":
            return f"a {BOMB_BYTES / MiB:g} MiB JSON body of tiny values"
        if self.kind == "slow-body":
            return f"the honest body, one byte every {TRICKLE_SECONDS:g} s"
        return "HTTP 500 whose body carries the given text"

    def wrap(self, honest: Handler) -> Handler:
        """The route's handler in this mode (``honest`` serves the document ``slow-body``
        trickles)."""

        async def handler(request: web.Request) -> web.StreamResponse:
            return await respond(self, request, honest)

        return handler


def parse_mode(value: str, variable: str = ENV) -> Hostile:
    """``redirect:<url>`` → Hostile("redirect", url); raises HostileModeError. Pure."""
    kind, sep, argument = value.strip().partition(":")
    if kind in ("redirect", "echo"):
        if not sep or not argument:
            raise HostileModeError(
                f"{variable}={value!r}: {kind} needs its argument, e.g. "
                + ("redirect:http://10.0.0.5:30000{path}" if kind == "redirect" else "echo:text")
            )
        return Hostile(kind, argument, variable)
    if kind in ("huge-body", "json-bomb", "slow-body") and not sep:
        return Hostile(kind, "", variable)
    raise HostileModeError(
        f"{variable}={value!r} is not a hostile mode; use one of {', '.join(MODES)}, or unset it"
    )


def from_env(env: Mapping[str, str], role: str) -> Hostile | None:
    """The mode for this engine's role (``KVGATE_REFERENCE_HOSTILE_<ROLE>`` first), or None."""
    for variable in (f"{ENV}_{role.upper()}", ENV):
        value = env.get(variable, "")
        if value.strip():
            return parse_mode(value, variable)
    return None


def filler_document(size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes: the marker, then ``[{},{},...]``. Pure."""
    head = b'{"version":"' + MARKER.encode() + b'","pad":['
    tail = b"{}]}"
    count, rest = divmod(size - len(head) - len(tail), len(FILLER))
    return head + FILLER * count + b" " * rest + tail


async def respond(hostile: Hostile, request: web.Request, honest: Handler) -> web.StreamResponse:
    if hostile.kind == "redirect":
        location = hostile.argument.replace("{path}", request.path_qs)
        return web.Response(status=302, headers={"Location": location}, text=MARKER)
    if hostile.kind == "echo":
        return web.json_response(
            {"error": {"message": hostile.argument, "marker": MARKER}}, status=500
        )
    if hostile.kind == "slow-body":
        answer = await honest(request)
        body = answer.body if isinstance(answer, web.Response) else None
        return await trickle(request, bytes(body) if isinstance(body, bytes) else b"{}")
    size = HUGE_BODY_BYTES if hostile.kind == "huge-body" else BOMB_BYTES
    return await stream(request, filler_document(size))


async def stream(request: web.Request, document: bytes) -> web.StreamResponse:
    """``document`` chunked, as fast as the client reads, without a Content-Length."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    view = memoryview(document)
    for start in range(0, len(view), CHUNK_BYTES):
        await response.write(view[start : start + CHUNK_BYTES])
    await response.write_eof()
    return response


async def trickle(request: web.Request, document: bytes) -> web.StreamResponse:
    """Headers at once, then ``document`` one byte every TRICKLE_SECONDS (a client that hangs
    up ends it: the server cancels the handler)."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    for index in range(len(document)):
        await response.write(document[index : index + 1])
        await asyncio.sleep(TRICKLE_SECONDS)
    await response.write_eof()
    return response
