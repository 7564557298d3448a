"""``kvgate guard``: the pod-local second key beside every engine (a native sidecar).

The readiness gate ``kvgate.io/engine-verified`` is data the operator writes; while the operator
is down nobody re-checks it, so an engine that restarts on a smaller pool would keep its gate
True. The guard closes that hole without the operator: it runs in the engine's pod, as an init
container with ``restartPolicy: Always`` (Kubernetes native sidecar), reads the live engine on the
pod's own localhost every ``--period`` seconds with the same code the operator uses
(``kvgate_engine.probe.verify``), and serves

- ``GET /ready``: 200 only while the last verdict is SAFE and fresh (read no more than
  2 × period ago); otherwise 503 with one line saying why, in numbers. The sidecar's
  readinessProbe is this endpoint, so the kubelet itself turns the pod NotReady (pod Ready needs
  every container ready, sidecars included) and the pod leaves Service endpoints and smg's workers;
- ``GET /healthz``: 200 while the read loop runs (the livenessProbe restarts a guard whose loop
  died).

The requirement comes from the guard's own arguments, written into the pod template by the
operator from the ModelDeployment (``kvgate.objects.builders.guard_container``), never from anything
the
engine says about itself. The gate stays the operator's: it proves, explains, emits Events and
metrics; the guard only says "this engine still meets this revision's requirement" and fails
closed: no verdict yet (engine starting), unreachable, unreadable, unsafe, or a verdict gone stale
are all "not ready".

Kept lean because it runs beside every engine: no kopf, no Kubernetes client, no metrics library;
aiohttp (already the probe's client) serves the two endpoints. Existing revisions keep the guard
image they were created with across operator upgrades (see
``kvgate.objects.builders.template_hash``), so
the argument contract below only ever grows: never rename or drop a flag.

An engine started with ``--api-key`` (``spec.engine.apiKeySecretRef``) is read with
``Authorization: Bearer`` and the key from ``$KVGATE_ENGINE_API_KEY``, which the pod template fills
from that Secret (never an argument: arguments show in the pod spec and ``ps``).

The decision (``readiness``) is pure; ``Guard`` is the loop and ``main`` the thin I/O around it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from kvgate_engine.probe import verify
from kvgate_engine.verdict import Outcome, Requirement, Verdict, requirement_problem
from packaging.version import InvalidVersion, Version

log = logging.getLogger("kvgate.cmd.guard")

READY_PATH = "/ready"
HEALTH_PATH = "/healthz"
# A verdict is fresh for this many periods: one late read is tolerated, two are not.
FRESH_PERIODS = 2
# Reasons are one line; a verdict with many findings is cut here.
MAX_REASON_CHARS = 600
MIN_PERIOD_SECONDS = 0.1
MAX_PERIOD_SECONDS = 3600.0  # an engine read at least once an hour; longer is a typo
# The engine API key, from the Secret named by spec.engine.apiKeySecretRef
# (kvgate.objects.builders).
API_KEY_ENV = "KVGATE_ENGINE_API_KEY"


# ---------------------------------------------------------------------------------------------
# The decision (pure)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Observation:
    """One completed read of the engine: when it began (monotonic seconds) and its verdict."""

    started_at: float
    verdict: Verdict


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str  # one line, numbers included

    @property
    def status(self) -> int:
        return 200 if self.ready else 503


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_REASON_CHARS else flat[: MAX_REASON_CHARS - 1] + "…"


def readiness(
    last: Observation | None,
    *,
    now: float,
    period: float,
    requirement: Requirement,
    engine: str,
) -> Readiness:
    """Is the pod's engine fit to take traffic, as far as the guard knows at ``now``? Pure.

    Ready only when the last read gave SAFE and began at most ``FRESH_PERIODS`` × ``period``
    before ``now`` (the age counts from when the read began, so a slow read never looks fresher
    than it is)."""
    if last is None:
        return Readiness(
            False,
            f"no verdict yet: the engine at {engine} has not been read since the guard started "
            f"(it may still be loading; the guard reads it every {period:g} s)",
        )
    verdict = last.verdict
    if verdict.outcome is not Outcome.SAFE:
        return Readiness(
            False, _one_line(f"engine {verdict.outcome.value}: {verdict.reason}: {verdict.message}")
        )
    age = max(0.0, now - last.started_at)
    limit = FRESH_PERIODS * period
    if age > limit:
        return Readiness(
            False,
            f"stale: the last verdict (Safe) is {age:.1f} s old, older than {FRESH_PERIODS} × "
            f"the {period:g} s period ({limit:g} s); reads of {engine} are too slow or stopped "
            f"(see this container's log)",
        )
    report = verdict.report
    pool = f"KV pool {report.kv_pool_tokens:,} tokens" if report and report.kv_pool_tokens else ""
    return Readiness(
        True,
        f"engine verified {age:.1f} s ago: {pool} >= {requirement.required_pool_tokens:,} "
        f"required (context length {requirement.context_length:,} × headroom "
        f"{requirement.headroom:g}), role {requirement.role}, version >= "
        f"{requirement.min_version}",
    )


def next_start(previous_start: float, period: float, now: float) -> float:
    """When the next read begins: one period after the last began, or now if that has passed
    (a slow read is not followed by a burst of catch-up reads). Pure."""
    return max(previous_start + period, now)


# ---------------------------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------------------------


class Guard:
    """Reads the engine every ``period`` seconds; ``state()`` is the current readiness."""

    def __init__(
        self,
        engine_url: str,
        requirement: Requirement,
        *,
        period: float,
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
        api_key: str | None = None,
    ) -> None:
        self.engine_url = engine_url
        self.api_key = api_key
        self.requirement = requirement
        self.period = period
        self.timeout = timeout
        self.clock = clock
        self.last: Observation | None = None
        self.reads = 0
        self._loop_task: asyncio.Task[None] | None = None
        self._shown: tuple[bool, str] | None = None

    def state(self) -> Readiness:
        return readiness(
            self.last,
            now=self.clock(),
            period=self.period,
            requirement=self.requirement,
            engine=self.engine_url,
        )

    @property
    def alive(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    async def read_once(self, session: aiohttp.ClientSession) -> Observation:
        started = self.clock()
        # One quick retry absorbs a dropped connection; a slow or failing engine is reported at
        # once (the verdict is CANNOT_TELL, never SAFE).
        verdict = await verify(
            self.engine_url,
            self.requirement,
            timeout=self.timeout,
            retries=1,
            session=session,
            api_key=self.api_key,
        )
        self.last = Observation(started, verdict)
        self.reads += 1
        self._log_transition()
        return self.last

    def _log_transition(self) -> None:
        state = self.state()
        verdict = self.last.verdict if self.last else None
        key = (state.ready, verdict.reason if verdict else "")
        if key != self._shown:
            self._shown = key
            word = "READY" if state.ready else "NOT READY"
            log.info("%s: %s", word, state.reason)

    async def run(self, stop: asyncio.Event) -> None:
        """Read until ``stop`` is set."""
        self._loop_task = asyncio.current_task()
        connector = aiohttp.TCPConnector(force_close=True, limit=4)
        async with aiohttp.ClientSession(connector=connector) as session:
            start = self.clock()
            while not stop.is_set():
                try:
                    await self.read_once(session)
                except Exception:  # verify never raises on engine output; keep guarding anyway
                    log.exception("guard read failed")
                start = next_start(start, self.period, self.clock())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, start - self.clock()))


# ---------------------------------------------------------------------------------------------
# HTTP and the command (thin)
# ---------------------------------------------------------------------------------------------


def app_for(guard: Guard) -> web.Application:
    async def ready(_: web.Request) -> web.Response:
        state = guard.state()
        return web.Response(status=state.status, text=state.reason + "\n")

    async def healthz(_: web.Request) -> web.Response:
        if guard.alive:
            return web.Response(text="ok\n")
        return web.Response(status=500, text="the guard's read loop is not running\n")

    app = web.Application()
    app.router.add_get(READY_PATH, ready)
    app.router.add_get(HEALTH_PATH, healthz)
    return app


def requirement_of(args: argparse.Namespace) -> Requirement:
    """The requirement from the command line, refused with the way out when unusable."""
    problem = requirement_problem(
        args.context_length,
        args.headroom,
        context_name="--context-length",
        headroom_name="--headroom",
    )
    if problem is not None:
        raise ValueError(f"{problem[0]} {problem[1]}")
    for flag, seconds in (("--period", args.period), ("--timeout", args.timeout)):
        if seconds is not None and not MIN_PERIOD_SECONDS <= seconds <= MAX_PERIOD_SECONDS:
            raise ValueError(
                f"{flag} {seconds:g} must be between {MIN_PERIOD_SECONDS:g} and "
                f"{MAX_PERIOD_SECONDS:g} s, e.g. 2"
            )
    try:
        Version(args.min_version)
    except InvalidVersion as exc:
        raise ValueError(
            f"--min-version {args.min_version!r} is not a PEP 440 version; use e.g. 0.5.22"
        ) from exc
    return Requirement(
        context_length=args.context_length,
        headroom=args.headroom,
        role=args.role,
        min_version=args.min_version,
    )


def engine_api_key(environ: Mapping[str, str]) -> str | None:
    """The engine API key the pod template put in the environment, if any."""
    return environ.get(API_KEY_ENV) or None


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(args: argparse.Namespace, requirement: Requirement) -> None:
    guard = Guard(
        _url(args.engine_host, args.engine_port),
        requirement,
        period=args.period,
        timeout=args.timeout if args.timeout is not None else max(1.0, args.period),
        api_key=engine_api_key(os.environ),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(app_for(guard), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    log.info(
        "guarding %s every %g s against: context length %s × headroom %g (pool >= %s tokens), "
        "role %s, version >= %s; /ready and /healthz on %s",
        guard.engine_url,
        guard.period,
        f"{requirement.context_length:,}",
        requirement.headroom,
        f"{requirement.required_pool_tokens:,}",
        requirement.role,
        requirement.min_version,
        _url(args.host, args.port),
    )
    try:
        await guard.run(stop)
    finally:
        await runner.cleanup()


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s kvgate-guard %(message)s", stream=sys.stdout
    )
    try:
        requirement = requirement_of(args)
    except ValueError as exc:
        print(f"kvgate guard: {exc}", file=sys.stderr)
        return 2
    asyncio.run(serve(args, requirement))
    return 0
