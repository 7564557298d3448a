"""The reference engine's hostile mode (``kvgate_engine.reference.hostile``): each mode answers as
the tenant's attacker would, only on the routes kvgate's probe reads, and kvgate's probe refuses
every one of them without echoing a byte of it.

The mode table runs the hostile handlers in a small aiohttp app (no engine); one test runs the
real engine to show the switch, the role override and that ``/health`` stays 200.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import aiohttp
import pytest
from aiohttp import web
from kvgate_engine.probe import verify
from kvgate_engine.reference.hostile import (
    BOMB_BYTES,
    HUGE_BODY_BYTES,
    MARKER,
    Handler,
    Hostile,
    HostileModeError,
    filler_document,
    from_env,
    parse_mode,
)
from kvgate_engine.untrusted import BodyLimits, MiB, count_values
from kvgate_engine.verdict import Outcome, Requirement, Verdict

if TYPE_CHECKING:
    from conftest import EngineLauncher

CANARY = "CANARY-hostile-5b1e"
HONEST_INFO = {
    "version": "0.5.23",
    "disaggregation_mode": "decode",
    "max_total_num_tokens": 200_000,
    "max_req_input_len": 131_066,
    "internal_states": [{"memory_usage": {"token_capacity": 200_000}}],
}
HONEST_MODELS = {"object": "list", "data": [{"id": "m", "max_model_len": 131_072}]}
REQUIREMENT = Requirement(131_072, role="decode")


# -- parsing the switch (pure) -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "redirect:http://10.0.0.5:30000{path}",
            Hostile("redirect", "http://10.0.0.5:30000{path}"),
        ),
        ("huge-body", Hostile("huge-body")),
        (" json-bomb ", Hostile("json-bomb")),
        ("slow-body", Hostile("slow-body")),
        ("echo:a:b c", Hostile("echo", "a:b c")),
    ],
)
def test_every_mode_parses(value: str, expected: Hostile) -> None:
    assert parse_mode(value) == expected


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("redirect", "redirect needs its argument, e.g. redirect:http://10.0.0.5:30000{path}"),
        ("echo:", "echo needs its argument"),
        ("huge", "is not a hostile mode; use one of redirect:<url>, huge-body, json-bomb"),
        ("slow-body:3", "is not a hostile mode"),
    ],
)
def test_an_unknown_or_incomplete_mode_is_refused_naming_the_modes(value: str, words: str) -> None:
    with pytest.raises(HostileModeError, match="KVGATE_REFERENCE_HOSTILE=") as caught:
        parse_mode(value)
    assert words in str(caught.value)


def test_the_role_variable_wins_over_the_common_one_and_empty_means_honest() -> None:
    env = {"KVGATE_REFERENCE_HOSTILE": "huge-body", "KVGATE_REFERENCE_HOSTILE_DECODE": "slow-body"}
    assert from_env(env, "decode") == Hostile("slow-body", "", "KVGATE_REFERENCE_HOSTILE_DECODE")
    assert from_env(env, "prefill") == Hostile("huge-body", "", "KVGATE_REFERENCE_HOSTILE")
    assert from_env({"KVGATE_REFERENCE_HOSTILE": " "}, "decode") is None
    assert from_env({}, "null") is None


@pytest.mark.parametrize("size", [1000, 1001, 1002])
def test_filler_documents_are_json_of_exactly_their_size_with_the_marker(size: int) -> None:
    document = filler_document(size)
    assert len(document) == size
    parsed = json.loads(document)
    assert parsed["version"] == MARKER and parsed["pad"][-1] == {}


def test_the_huge_body_is_16_mib_of_the_same_shape() -> None:
    document = filler_document(HUGE_BODY_BYTES)  # not parsed here: ~430 MiB in CPython
    assert len(document) == HUGE_BODY_BYTES == 16 * MiB  # the body, the old probe's cap
    head = b'{"version":"' + MARKER.encode() + b'","pad":[{},{},'
    assert document.startswith(head) and document.endswith(b"{}]}")


def test_the_bomb_is_under_the_byte_cap_and_far_over_the_value_cap() -> None:
    limits = BodyLimits.for_bytes(4 * MiB)  # kvgate's /server_info limits
    bomb = filler_document(BOMB_BYTES)
    assert len(bomb) < limits.max_bytes
    assert count_values(bomb) > 4 * limits.max_values


# -- each mode against kvgate's probe (no engine) ------------------------------------------------


async def honest_info(request: web.Request) -> web.StreamResponse:
    return web.json_response(HONEST_INFO)


async def honest_models(request: web.Request) -> web.StreamResponse:
    return web.json_response(HONEST_MODELS)


async def health(request: web.Request) -> web.StreamResponse:
    return web.Response()


class Site:
    """An aiohttp app on 127.0.0.1: an honest engine's probe routes, or (``hostile``) the same
    routes in a hostile mode, as ``build_app`` wires them; ``/health`` is always 200."""

    def __init__(self, hostile: Hostile | None = None) -> None:
        self.hostile = hostile
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> Site:
        info: Handler = honest_info
        models: Handler = honest_models
        if self.hostile is not None:
            info, models = self.hostile.wrap(info), self.hostile.wrap(models)
        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/server_info", info)
        app.router.add_get("/get_server_info", info)
        app.router.add_get("/v1/models", models)
        self.runner = web.AppRunner(app, shutdown_timeout=1.0, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def honest() -> AsyncIterator[Site]:
    """A safe engine elsewhere: where a redirect would have the operator look instead."""
    async with Site() as site:
        yield site


def assert_nothing_echoed(verdict: Verdict, *secrets: str) -> None:
    for secret in (MARKER, CANARY, *secrets):
        assert secret not in verdict.message, (secret, verdict.message)


async def test_the_honest_engine_behind_the_test_site_is_safe(honest: Site) -> None:
    verdict = await verify(honest.url, REQUIREMENT)
    assert verdict.outcome is Outcome.SAFE, verdict.message


async def test_redirect_answers_302_to_the_target_with_the_path_and_is_not_followed(
    honest: Site,
) -> None:
    async with Site(parse_mode("redirect:" + honest.url + "{path}")) as site:
        async with (
            aiohttp.ClientSession() as session,
            session.get(site.url + "/server_info", allow_redirects=False) as answer,
        ):
            assert answer.status == 302
            assert answer.headers["Location"] == honest.url + "/server_info"
        # Followed, the redirect would show the honest engine's safe report for this one.
        async with (
            aiohttp.ClientSession() as session,
            session.get(site.url + "/v1/models") as followed,
        ):
            assert await followed.json() == HONEST_MODELS
        verdict = await verify(site.url, REQUIREMENT)
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "ReportUnreadable"
    assert f"GET {site.url}/server_info: HTTP 302 redirect, not followed" in verdict.message
    assert_nothing_echoed(verdict, honest.url)


async def test_huge_body_streams_16_mib_without_a_length_and_is_cut_at_the_cap() -> None:
    async with Site(parse_mode("huge-body")) as site:
        async with (
            aiohttp.ClientSession() as session,
            session.get(site.url + "/get_server_info") as answer,
        ):
            assert answer.content_length is None
            assert len(await answer.read()) == HUGE_BODY_BYTES
        verdict = await verify(site.url, REQUIREMENT)
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "ReportUnreadable"
    assert "body larger than the 4 MiB cap; kvgate reads no further" in verdict.message
    assert_nothing_echoed(verdict)


async def test_json_bomb_is_refused_unparsed_naming_the_value_cap() -> None:
    async with Site(parse_mode("json-bomb")) as site:
        verdict = await verify(site.url, REQUIREMENT)
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "ReportUnreadable"
    assert f"refused unparsed: {count_values(filler_document(BOMB_BYTES)):,} JSON values" in (
        verdict.message
    )
    assert "above the cap of 262,144" in verdict.message
    assert_nothing_echoed(verdict)


async def test_slow_body_trickles_the_honest_document_and_meets_the_deadline() -> None:
    async with Site(parse_mode("slow-body")) as site:
        async with (
            aiohttp.ClientSession() as session,
            session.get(site.url + "/server_info") as answer,
        ):
            assert answer.status == 200
            first = await asyncio.wait_for(answer.content.read(1), 2)
            assert first == b"{"
        started = time.monotonic()
        verdict = await verify(site.url, REQUIREMENT, timeout=1.0, retries=0)
        elapsed = time.monotonic() - started
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "EngineUnreachable"
    assert f"GET {site.url}/server_info: no answer within 1 s" in verdict.message
    assert elapsed < 3.0


async def test_echo_puts_the_text_in_a_500_body_and_only_the_status_is_named() -> None:
    async with Site(parse_mode(f"echo:{CANARY}")) as site:
        async with aiohttp.ClientSession() as session, session.get(site.url + "/v1/models") as a:
            assert a.status == 500 and CANARY in await a.text()
        verdict = await verify(site.url, REQUIREMENT, retries=0)
    assert verdict.outcome is Outcome.CANNOT_TELL and verdict.reason == "EngineUnreachable"
    assert verdict.message.endswith(f"GET {site.url}/server_info: HTTP 500")
    assert_nothing_echoed(verdict)


# -- the real engine -----------------------------------------------------------------------------


def test_an_unknown_mode_stops_the_engine_at_start_with_the_modes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "kvgate_engine.reference", "--model-path", "tiny-llama"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KVGATE_REFERENCE_HOSTILE_NULL": "bomb"},
    )
    assert result.returncode == 1
    assert "KVGATE_REFERENCE_HOSTILE_NULL='bomb' is not a hostile mode; use one of" in (
        result.stderr
    )


async def test_a_hostile_engine_stays_healthy_and_only_its_probe_routes_are_hostile(
    engines: EngineLauncher,
) -> None:
    env = {
        "KVGATE_REFERENCE_HOSTILE": "huge-body",
        "KVGATE_REFERENCE_HOSTILE_DECODE": f"echo:{CANARY}",  # the role's own wins
    }
    decode = await engines.start(role="decode", env=env)
    for path in ("/server_info", "/get_server_info", "/v1/models"):
        status, body = await engines.get_json(decode.url + path)
        assert status == 500 and body["error"]["message"] == CANARY, (path, body)
    assert (await engines.get_json(decode.url + "/health"))[0] == 200
    assert (await engines.get_json(decode.url + "/model_info"))[0] == 200
    leg = await engines.generate(
        decode,
        {
            "input_ids": [5, 6, 7],
            "sampling_params": {"max_new_tokens": 2},
            "bootstrap_host": "2.2.2.2",  # no transfer: the decode computes the prompt itself
            "bootstrap_room": 1,
        },
    )
    assert leg.status == 200 and leg.body["output_ids"] == [5, 6]
    assert "HOSTILE (KVGATE_REFERENCE_HOSTILE_DECODE): /server_info" in decode.log()
    verdict = await verify(decode.url, Requirement(1024, role="decode"), retries=0)
    assert verdict.reason == "EngineUnreachable" and CANARY not in verdict.message
