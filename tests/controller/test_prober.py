"""The operator's probe (kvgate.controller.main.Prober): one client session for every read, but
never a connection kept between reads, and nothing one engine sets reaches another
(docs/design/scale.md)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from factories.fake_engine import FakeEngine
from factories.local_http import serving_app
from kvgate.controller.main import Prober
from kvgate.kube.settings import OperatorSettings
from kvgate_engine.verdict import Outcome, Requirement

REQUIREMENT = Requirement(context_length=131_072, headroom=1.0, role="decode", min_version="0.5.22")


def engine_app(seen: list[dict[str, Any]]) -> web.Application:
    """An SGLang-shaped engine that sets a cookie and records each request's connection."""
    engine = FakeEngine("decode", 131_072, 200_000)

    def record(request: web.Request) -> None:
        seen.append(
            {
                "peer": request.transport.get_extra_info("peername") if request.transport else None,
                "cookie": request.headers.get("Cookie"),
                "keep_alive": request.keep_alive,
            }
        )

    async def server_info(request: web.Request) -> web.Response:
        record(request)
        response = web.json_response(engine.server_info())
        response.set_cookie("session", "engine-a-secret")
        return response

    async def models(request: web.Request) -> web.Response:
        record(request)
        return web.json_response(engine.models())

    app = web.Application()
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/v1/models", models)
    return app


async def test_every_read_opens_its_own_connection_and_none_is_kept_alive() -> None:
    prober = Prober(OperatorSettings(probe_timeout_seconds=2.0))
    seen: list[dict[str, Any]] = []
    try:
        async with serving_app(engine_app(seen)) as url:
            verdicts = [await prober(url, REQUIREMENT) for _ in range(5)]
            session = prober.session()
            assert session.connector is not None
            # Nothing pooled: an engine restarted at the same address starts from a new socket.
            assert not session.connector._conns  # type: ignore[attr-defined]
    finally:
        await prober.close()
    assert [v.outcome for v in verdicts] == [Outcome.SAFE] * 5
    assert len(seen) == 10  # /server_info and /v1/models per read
    assert len({entry["peer"] for entry in seen}) == 10  # a new connection for every request
    assert not any(entry["keep_alive"] for entry in seen)  # each asked to close after its answer


async def test_a_cookie_one_engine_sets_is_never_sent_to_another_or_back() -> None:
    prober = Prober(OperatorSettings(probe_timeout_seconds=2.0))
    seen_a: list[dict[str, Any]] = []
    seen_b: list[dict[str, Any]] = []
    try:
        async with (
            serving_app(engine_app(seen_a)) as engine_a,
            serving_app(engine_app(seen_b)) as engine_b,
        ):
            # By name: a cookie jar keeps no cookie for a bare IP address, and cookies are not
            # scoped by port, so two engines on one host share whatever a jar would keep.
            engine_a, engine_b = (u.replace("127.0.0.1", "localhost") for u in (engine_a, engine_b))
            await prober(engine_a, REQUIREMENT)
            await prober(engine_b, REQUIREMENT)
            await prober(engine_a, REQUIREMENT)
    finally:
        await prober.close()
    assert [entry["cookie"] for entry in seen_a + seen_b] == [None] * 6


async def test_closing_the_prober_closes_its_session_and_a_later_read_opens_a_new_one() -> None:
    prober = Prober(OperatorSettings(probe_timeout_seconds=2.0))
    seen: list[dict[str, Any]] = []
    async with serving_app(engine_app(seen)) as url:
        first = prober.session()
        await prober.close()
        assert first.closed
        verdict = await prober(url, REQUIREMENT)
        await prober.close()
    assert verdict.outcome is Outcome.SAFE
