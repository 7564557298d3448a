"""The pod-local guard: its decision (table), its endpoints against a live fake engine, its
command line."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from factories.fake_engine import FakeEngine, running
from kvgate.cmd import cli, guard
from kvgate.cmd.guard import Guard, Observation, next_start, readiness
from kvgate_engine.report import EngineReport
from kvgate_engine.verdict import Finding, Outcome, Requirement, Verdict, cannot_tell

REQ = Requirement(context_length=131_072, headroom=1.0, role="decode", min_version="0.5.22")
ENGINE = "http://127.0.0.1:30000"
PERIOD = 2.0


def report(pool: int = 200_000) -> EngineReport:
    return EngineReport(
        version="0.5.23",
        role="decode",
        kv_pool_tokens=pool,
        kv_pool_tokens_per_rank=(pool,),
        max_req_input_len=131_066,
        effective_context_length=131_072,
        served_model_name="llama-3.1-8b",
    )


SAFE = Verdict(Outcome.SAFE, (), report())
UNSAFE = Verdict(
    Outcome.UNSAFE,
    (Finding("KvPoolTooSmall", "KV pool 9,000 tokens < context length 131,072 × headroom 1.0"),),
    report(9_000),
)
DOWN = cannot_tell("EngineUnreachable", "engine unreachable: GET x: cannot connect (refused)")


@pytest.mark.parametrize(
    ("last", "now", "ready", "needles"),
    [
        (None, 10.0, False, ["no verdict yet", ENGINE, "every 2 s"]),
        (Observation(10.0, SAFE), 10.5, True, ["200,000", "131,072", "decode", "0.5.22"]),
        # fresh for exactly 2 periods, counted from when the read began
        (Observation(10.0, SAFE), 14.0, True, ["verified 4.0 s ago"]),
        (Observation(10.0, SAFE), 14.1, False, ["stale", "4.1 s old", "2 s period", "(4 s)"]),
        (Observation(10.0, UNSAFE), 10.1, False, ["Unsafe", "KvPoolTooSmall", "9,000 tokens"]),
        (Observation(10.0, DOWN), 10.1, False, ["CannotTell", "EngineUnreachable", "refused"]),
        # an unsafe verdict never becomes acceptable by ageing
        (Observation(10.0, UNSAFE), 100.0, False, ["KvPoolTooSmall"]),
    ],
)
def test_readiness_is_safe_and_fresh_only(
    last: Observation | None, now: float, ready: bool, needles: list[str]
) -> None:
    state = readiness(last, now=now, period=PERIOD, requirement=REQ, engine=ENGINE)
    assert state.ready is ready
    assert state.status == (200 if ready else 503)
    assert "\n" not in state.reason
    for needle in needles:
        assert needle in state.reason, state.reason


def test_a_verdict_with_many_findings_is_one_short_line() -> None:
    many = Verdict(
        Outcome.UNSAFE,
        tuple(Finding("KvPoolTooSmall", f"finding {i}\nwith a break") for i in range(200)),
        None,
    )
    state = readiness(
        Observation(0.0, many), now=0.0, period=PERIOD, requirement=REQ, engine=ENGINE
    )
    assert "\n" not in state.reason and len(state.reason) <= guard.MAX_REASON_CHARS


def test_reads_keep_a_fixed_rate_and_never_burst_after_a_slow_one() -> None:
    assert next_start(10.0, 2.0, 10.3) == 12.0
    assert next_start(10.0, 2.0, 15.0) == 15.0


# ------------------------------------------------------------------ against a live engine
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@asynccontextmanager
async def guarding(
    engine: FakeEngine,
    period: float = 0.2,
    requirement: Requirement = REQ,
    api_key: str | None = None,
) -> AsyncIterator[tuple[Guard, str]]:
    g = Guard(
        f"http://127.0.0.1:{engine.port}",
        requirement,
        period=period,
        timeout=1.0,
        api_key=api_key,
    )
    runner = web.AppRunner(guard.app_for(g))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    stop = asyncio.Event()
    task = asyncio.create_task(g.run(stop))
    try:
        yield g, f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
        await runner.cleanup()


async def get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        return resp.status, await resp.text()


async def until(what: str, check: Callable[[], Any], timeout: float) -> float:
    """Seconds until ``await check()`` is truthy; fails naming ``what`` after ``timeout``."""
    started = time.monotonic()
    while not await check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - started


async def test_ready_only_while_the_live_engine_meets_the_requirement() -> None:
    engine = FakeEngine("decode", context_length=131_072, kv_pool_tokens=200_000, port=free_port())
    async with running(engine), guarding(engine, period=0.2) as (g, url):
        await until("ready", lambda: _status_is(url, 200), 5)
        status, text = await get(f"{url}/ready")
        assert (status, text.count("\n")) == (200, 1)
        assert "KV pool 200,000 tokens >= 131,072 required" in text

        engine.kv_pool_tokens = 50_000  # the engine now reports a smaller pool
        changed_after = g.reads  # one more may be in flight, begun before the change
        await until("not ready", lambda: _not_ready(g), 5)
        # Noticed by the first read that began after the change: counted in the guard's reads,
        # not in seconds, which a loaded machine stretches for the reads and this wait alike.
        assert g.reads <= changed_after + 2, f"noticed after {g.reads - changed_after} reads"
        status, text = await get(f"{url}/ready")
        assert status == 503
        assert "KvPoolTooSmall" in text and "KV pool 50,000 tokens" in text, text
        assert (await get(f"{url}/healthz"))[0] == 200


async def test_a_restarted_engine_is_noticed_within_one_period() -> None:
    period = 0.3
    engine = FakeEngine("decode", context_length=131_072, kv_pool_tokens=200_000, port=free_port())
    async with guarding(engine, period=period) as (g, url):
        # Started before its engine (a sidecar starts first): not ready, and says why.
        status, text = await get(f"{url}/ready")
        assert status == 503 and ("no verdict yet" in text or "EngineUnreachable" in text), text
        async with running(engine):
            await until("ready", lambda: _status_is(url, 200), 5)
        # The engine's process is gone: the next read finds nobody listening (counted in reads,
        # as above; the read in flight at the stop may still have found the engine).
        stopped_after = g.reads
        await until("not ready after the engine stopped", lambda: _not_ready(g), 5)
        assert g.reads <= stopped_after + 2, f"noticed after {g.reads - stopped_after} reads"
        assert "EngineUnreachable" in (await get(f"{url}/ready"))[1]
        # It comes back on the same port with a smaller pool: never ready again.
        engine.kv_pool_tokens = 10_000
        async with running(engine):
            reads = g.reads
            await until("two more reads", lambda: _reads_past(g, reads + 2), 5)
            status, text = await get(f"{url}/ready")
            assert status == 503 and "KV pool 10,000 tokens" in text, text


async def test_a_stopped_read_loop_fails_closed_and_health_says_so() -> None:
    engine = FakeEngine("decode", context_length=131_072, kv_pool_tokens=200_000, port=free_port())
    async with running(engine):
        g = Guard(engine.url, REQ, period=0.1, timeout=1.0)
        runner = web.AppRunner(guard.app_for(g))
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        url = f"http://127.0.0.1:{port}"
        stop = asyncio.Event()
        task = asyncio.create_task(g.run(stop))
        try:
            await until("ready", lambda: _status_is(url, 200), 5)
            stop.set()
            await task
            assert (await get(f"{url}/healthz"))[0] == 500
            await until("stale", lambda: _status_is(url, 503), 2)
            assert "stale" in (await get(f"{url}/ready"))[1]
        finally:
            await runner.cleanup()


async def _status_is(url: str, status: int) -> bool:
    try:
        return (await get(f"{url}/ready"))[0] == status
    except aiohttp.ClientError:
        return False


async def _not_ready(g: Guard) -> bool:
    return not g.state().ready


async def _reads_past(g: Guard, count: int) -> bool:
    return g.reads >= count


# ------------------------------------------------------------------ command line
def guard_args(*extra: str) -> list[str]:
    return [
        "guard",
        "--engine-port",
        "30000",
        "--role",
        "decode",
        "--context-length",
        "131072",
        "--min-version",
        "0.5.22",
        *extra,
    ]


def test_command_line_gives_the_requirement_with_defaults() -> None:
    args = cli.build_parser().parse_args(guard_args("--headroom", "1.2"))
    assert guard.requirement_of(args) == Requirement(131_072, 1.2, "decode", "0.5.22")
    assert (args.engine_host, args.host, args.port, args.period) == (
        "127.0.0.1",
        "0.0.0.0",
        8471,
        2.0,
    )


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--min-version", "latest"], "--min-version 'latest' is not a PEP 440 version; use e.g."),
        (["--headroom", "0.5"], "--headroom must be a finite number >= 1.0 (got 0.5)"),
        (["--headroom", "inf"], "--headroom must be a finite number >= 1.0 (got inf)"),
        (["--headroom", "nan"], "--headroom must be a finite number >= 1.0 (got nan)"),
        (["--context-length", "0"], "--context-length must be 1 or more (got 0)"),
        (["--context-length", "1" + "0" * 30], "--context-length must be at most"),
        (["--period", "0"], "--period 0 must be between 0.1 and 3600 s"),
        (["--period", "nan"], "--period nan must be between 0.1 and 3600 s"),
        (["--period", "inf"], "--period inf must be between 0.1 and 3600 s"),
        (["--timeout", "1e9"], "--timeout 1e+09 must be between 0.1 and 3600 s"),
    ],
)
def test_unusable_arguments_are_refused_with_the_way_out(
    extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(guard_args(*extra)) == 2
    assert needle in capsys.readouterr().err


def test_the_guard_imports_no_kopf() -> None:
    import subprocess
    import sys

    code = "import sys, kvgate.cmd.guard; print('kopf' in sys.modules, 'kubernetes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


async def test_an_engine_behind_an_api_key_is_guarded_with_the_key_from_the_environment() -> None:
    engine = FakeEngine(
        "decode", context_length=131_072, kv_pool_tokens=200_000, port=free_port(), api_key="k"
    )
    key = guard.engine_api_key({guard.API_KEY_ENV: "k"})
    async with running(engine), guarding(engine, period=0.2, api_key=key) as (_, url):
        await until("ready", lambda: _status_is(url, 200), 5)


async def test_without_the_key_an_engine_behind_an_api_key_never_gets_ready() -> None:
    engine = FakeEngine(
        "decode", context_length=131_072, kv_pool_tokens=200_000, port=free_port(), api_key="k"
    )
    assert guard.engine_api_key({}) is None
    assert guard.engine_api_key({guard.API_KEY_ENV: ""}) is None
    async with running(engine), guarding(engine, period=0.2) as (g, url):
        await until("a first read", lambda: _read(g), 5)
        status, text = await get(f"{url}/ready")
        assert status == 503
        assert "EngineUnauthorized" in text and "spec.engine.apiKeySecretRef" in text, text


async def _read(g: Guard) -> bool:
    return g.last is not None
