"""Latency of ``kvgate_engine.probe.verify()`` against an engine, median and p99 over N runs.

    .venv/bin/python tests/benchmarks/bench_verify.py      # against a local engine-shaped server
    .venv/bin/python tests/benchmarks/bench_verify.py --url http://127.0.0.1:30000 \
        --context-length 131072                             # against a running (reference) engine

Without --url it starts an aiohttp server on 127.0.0.1 that answers /server_info and /v1/models
with the SGLang 0.5.23 fixture, so the number is the probe's own cost (two GETs, JSON parse,
verdict). Each run opens a fresh connection, as the operator's first probe of a pod does;
--reuse-session measures the steady state with one kept-alive session.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from kvgate_engine.probe import verify
from kvgate_engine.verdict import Outcome, Requirement

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "engine"


def _handler(payload: Any) -> Any:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(payload)

    return handler


async def start_local_engine() -> tuple[web.AppRunner, str]:
    info = json.loads((FIXTURES / "server_info_0.5.23_decode.json").read_text())
    models = json.loads((FIXTURES / "models_131072.json").read_text())
    app = web.Application()
    app.router.add_get("/server_info", _handler(info))
    app.router.add_get("/v1/models", _handler(models))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
    return ordered[index]


async def bench(args: argparse.Namespace) -> int:
    runner: web.AppRunner | None = None
    url = args.url
    if url is None:
        runner, url = await start_local_engine()
    requirement = Requirement(context_length=args.context_length)
    session = aiohttp.ClientSession() if args.reuse_session else None
    samples: list[float] = []
    outcomes: set[Outcome] = set()
    try:
        for _ in range(args.warmup):
            await verify(url, requirement, session=session)
        for _ in range(args.runs):
            started = time.perf_counter()
            verdict = await verify(url, requirement, session=session)
            samples.append((time.perf_counter() - started) * 1000)
            outcomes.add(verdict.outcome)
    finally:
        if session is not None:
            await session.close()
        if runner is not None:
            await runner.cleanup()
    print(
        f"verify() against {url if args.url else 'local engine-shaped server'}: "
        f"{args.runs} runs, {'one session' if args.reuse_session else 'new session each run'}"
    )
    print(f"  outcome(s): {', '.join(sorted(str(o) for o in outcomes))}")
    print(
        f"  median {statistics.median(samples):.2f} ms, p99 {percentile(samples, 0.99):.2f} ms, "
        f"min {min(samples):.2f} ms, max {max(samples):.2f} ms"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=None, help="a running engine; default: a local stub")
    parser.add_argument("--context-length", type=int, default=131072)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--reuse-session", action="store_true")
    return asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
