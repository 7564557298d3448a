"""Start-up: flags → model config → limits → engine → HTTP (+ bootstrap) servers → SIGTERM.

Environment:
- ``KVGATE_GPU_MEMORY_GIB`` simulated memory of each GPU (default 80, one H100-80GB);
- ``KVGATE_WEIGHTS_GIB`` weight size of one replica, for configs the estimator cannot size;
- ``KVGATE_ENGINE_VERSION`` the SGLang version to report, whose flag choices the engine parses
  with (default 0.5.23);
- ``KVGATE_EMULATE_INCIDENT=1`` (or a version below 0.5.20) turns on SGLang <= 0.5.19's
  rejection path that leaked stale KV across requests;
- ``KVGATE_ADMIT_OVER_LENGTH=1`` no length admission (tokenizer and scheduler checks off) with an
  honest pool: over-length prompts are answered (what the content check must catch);
- ``KVGATE_REFERENCE_LOAD_SECONDS`` seconds to wait before listening, as a real engine loading its
  weights does (default 0);
- ``KVGATE_REFERENCE_STALE_KV_AFTER_ABORT=1`` a decode engine whose aborted requests' KV
  transfers are never cancelled: each lands in the aborted request's freed pages after the next
  request's own KV (what the content check's abort step must catch; ``engine.py``);
- ``KVGATE_REFERENCE_HOSTILE`` (``_PREFILL``, ``_DECODE``) a hostile answer to kvgate's probe
  (tests only, ``hostile.py``);
- ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``, ``SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT``,
  ``SGLANG_DISAGGREGATION_WAITING_TIMEOUT`` as in SGLang.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvgate_engine.reference.args import DEFAULT_VERSION, LaunchArgs, parse_launch_args
from kvgate_engine.reference.hostile import Hostile, HostileModeError
from kvgate_engine.reference.hostile import from_env as hostile_from_env
from kvgate_engine.reference.sizing import (
    ALLOW_LONGER_CONTEXT_ENV,
    DEFAULT_GPU_MEMORY_GIB,
    EngineLimits,
    ModelConfig,
    StartupError,
    compute_limits,
    resolve_model_config,
)

if TYPE_CHECKING:
    from kvgate_engine.reference.engine import EngineSettings
    from kvgate_engine.reference.ranks import RankServer

SHUTDOWN_GRACE_SECONDS = 10.0
# Seconds the engine waits before it listens, as a real engine loading its weights (default 0).
LOAD_SECONDS = "KVGATE_REFERENCE_LOAD_SECONDS"
log = logging.getLogger("kvgate_engine.reference")


def _env_float(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise StartupError(f"{name}={raw!r} is not a number; set it to e.g. 80") from None
    if value <= 0:
        raise StartupError(f"{name}={raw} must be > 0")
    return value


def startup_limits(
    launch: LaunchArgs, env: Mapping[str, str], version: str
) -> tuple[ModelConfig, EngineLimits]:
    """The model config and the limits an engine of SGLang ``version`` starts with (raises
    StartupError)."""
    model = resolve_model_config(launch["model_path"])
    gpu_memory = _env_float(env, "KVGATE_GPU_MEMORY_GIB", DEFAULT_GPU_MEMORY_GIB)
    assert gpu_memory is not None
    limits = compute_limits(
        model,
        gpu_memory_gib=gpu_memory,
        tp=launch["tp_size"],
        pp=launch["pp_size"],
        mem_fraction_static=launch["mem_fraction_static"],
        kv_cache_dtype=launch["kv_cache_dtype"],
        page_size=launch["page_size"],
        context_length=launch["context_length"],
        max_total_tokens=launch["max_total_tokens"],
        max_running_requests=launch["max_running_requests"],
        weights_gib=_env_float(env, "KVGATE_WEIGHTS_GIB", None),
        allow_longer_context=env.get(ALLOW_LONGER_CONTEXT_ENV) == "1",
        release=version,
    )
    return model, limits


def main(argv: Sequence[str] | None = None) -> int:
    started = time.monotonic()
    # The flags are parsed as the emulated release's parser does (its choices of values).
    version = os.environ.get("KVGATE_ENGINE_VERSION") or DEFAULT_VERSION
    launch = parse_launch_args(sys.argv[1:] if argv is None else argv, version)
    # SGLang's own format (srt/utils/common.py:configure_logger): kvgate reads the KV canary's
    # record only right after this prefix, so the reference engine's lines must carry it.
    logging.basicConfig(
        level=launch["log_level"].upper(),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stderr,
    )
    env = os.environ
    if launch["nnodes"] > 1 and launch["node_rank"] > 0:
        # A rank >= 1 of a multi-node engine serves nothing: it joins rank 0 and holds on.
        return asyncio.run(serve_rank(launch))
    try:
        hostile = hostile_from_env(env, launch["disaggregation_mode"])
        model, limits = startup_limits(launch, env, version)
        timeouts = (
            _env_float(env, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0),
            _env_float(env, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0),
        )
        # kvgate_engine.reference.engine.DECODE_STEP_SECONDS (not imported: it imports numpy)
        step_seconds = _env_float(env, "KVGATE_REFERENCE_DECODE_STEP_SECONDS", None) or 0.0
        load_seconds = _env_float(env, LOAD_SECONDS, None) or 0.0
    except (StartupError, HostileModeError) as error:
        log.error("%s", error)
        print(f"error: {error}", file=sys.stderr)
        return 1
    for warning in limits.warnings:
        log.warning("%s", warning)
    # One BLAS/OpenMP thread per engine process (many share a node's cores): numpy's BLAS
    # reads these when it is first imported, which is below (engine, model, kv_pool).
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    os.environ["OMP_NUM_THREADS"] = "1"
    from kvgate_engine.reference.admission import emulates_incident
    from kvgate_engine.reference.engine import STALE_KV_AFTER_ABORT, EngineSettings

    settings = EngineSettings(
        role=launch["disaggregation_mode"],
        version=version,
        incident=emulates_incident(version, env.get("KVGATE_EMULATE_INCIDENT") == "1"),
        kv_checksum=launch["disaggregation_enable_kv_checksum"],
        vocab_size=model.vocab_size,
        bootstrap_timeout=timeouts[0] or 300.0,
        waiting_timeout=timeouts[1] or 300.0,
        admit_over_length=env.get("KVGATE_ADMIT_OVER_LENGTH") == "1",
        kv_canary=launch["kv_canary"] in ("log", "raise"),
        stale_kv_after_abort=env.get(STALE_KV_AFTER_ABORT) == "1",
        decode_step_seconds=step_seconds,
    )
    if settings.stale_kv_after_abort and settings.role == "decode":
        log.warning(
            "%s=1: an aborted request's KV transfer is not cancelled; it lands in the freed "
            "pages after the next request's own KV, which then decodes the aborted prompt",
            STALE_KV_AFTER_ABORT,
        )
    if settings.admit_over_length:
        log.warning(
            "KVGATE_ADMIT_OVER_LENGTH=1: no length admission; prompts longer than the context "
            "(%d tokens) are answered while the pool fits them",
            limits.context_length,
        )
    if settings.incident:
        log.warning(
            "emulating SGLang <= 0.5.19 (version %s): over-length prompts are swapped for a "
            "placeholder and still handed off; decode does not check what arrived",
            version,
        )
    if hostile is not None:
        log.warning(
            "HOSTILE (%s): /server_info, /get_server_info and /v1/models answer %s; /health and "
            "everything else are the honest engine's",
            hostile.variable,
            hostile.describe(),
        )
    if load_seconds > 0:
        # A real engine loads its weights before it listens (SGLang: tens of seconds and more);
        # until then its port refuses connections, as here.
        log.info(
            "%s=%g: loading the weights (simulated) before listening", LOAD_SECONDS, load_seconds
        )
        time.sleep(load_seconds)
    try:
        return asyncio.run(serve(launch, model, limits, settings, started, hostile))
    except OSError as error:
        log.error("cannot serve on %s:%s: %s", launch["host"], launch["port"], error)
        return 1


async def serve(
    launch: LaunchArgs,
    model: ModelConfig,
    limits: EngineLimits,
    settings: EngineSettings,
    started: float,
    hostile: Hostile | None = None,
) -> int:
    from aiohttp import web

    from kvgate_engine.reference.engine import ReferenceEngine
    from kvgate_engine.reference.server import ServerState, build_app, now
    from kvgate_engine.reference.transfer import BootstrapServer

    engine = ReferenceEngine(settings, limits)
    state = ServerState(engine=engine, launch=launch, model=model, started_at=now())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    group = await _gather_ranks(launch, stop)
    state.extra["ranks"] = group  # POST /kvgate/canary/corrupt {"rank": r} reaches rank r
    if group is not None and not group.joined.is_set():
        await group.close()
        return 0 if stop.is_set() else 1

    bootstrap: BootstrapServer | None = None
    if settings.role == "prefill":
        bootstrap = BootstrapServer(engine.rendezvous, wait_timeout=settings.waiting_timeout)
        await bootstrap.start(launch["host"], launch["disaggregation_bootstrap_port"])
    runner = web.AppRunner(
        build_app(state, hostile),
        handler_cancellation=True,  # a dropped client connection aborts its request
        shutdown_timeout=SHUTDOWN_GRACE_SECONDS,
        access_log=None,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, launch["host"], launch["port"]).start()
        if not launch["skip_server_warmup"] and not engine.health_forward():
            log.error("warm-up forward pass gave a wrong answer")
            return 1
        state.startup_seconds = round(time.monotonic() - started, 3)
        state.phase = "ready"
        log.info(
            "max_total_num_tokens=%d, max_req_input_len=%d, context_len=%d, page_size=%d, "
            "disaggregation_mode=%s, version=%s",
            limits.kv_pool_tokens,
            limits.max_req_input_len,
            limits.context_length,
            limits.page_size,
            settings.role,
            settings.version,
        )
        log.info(
            "The server is fired up and ready to roll! http://%s:%d", launch["host"], launch["port"]
        )
        if group is not None:
            # The engine lives only while every rank does (ranks.py).
            await _first(stop.wait(), group.lost.wait())
            if not stop.is_set():
                log.error("%s: the engine cannot serve without it; exiting", group.lost_reason)
                state.phase = "exiting"
                return 1
        await stop.wait()
        log.info("SIGTERM: draining in-flight requests (up to %g s)", SHUTDOWN_GRACE_SECONDS)
        state.phase = "exiting"
        return 0
    finally:
        if bootstrap is not None:
            await bootstrap.close()
        await runner.cleanup()
        if group is not None:
            await group.close()


async def _first(*waits: Any) -> None:
    """Return when the first of these awaitables is done; cancel the rest."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()


async def _gather_ranks(launch: LaunchArgs, stop: asyncio.Event) -> RankServer | None:
    """Rank 0 of a multi-node engine: listen at --dist-init-addr's port and wait until every
    rank joined (None for a single-node engine). Nothing serves before that, as in SGLang."""
    from kvgate_engine.reference.ranks import RankServer, split_addr

    if launch["nnodes"] == 1:
        return None
    _, port = split_addr(launch["dist_init_addr"])
    group = RankServer(nnodes=launch["nnodes"], tp_size=launch["tp_size"])
    await group.start(launch["host"], port)
    try:
        await asyncio.wait_for(
            _first(group.joined.wait(), stop.wait()), timeout=launch["watchdog_timeout"]
        )
    except TimeoutError:
        log.error(
            "ranks %s of %d did not join within --watchdog-timeout %g s",
            sorted(set(range(1, launch["nnodes"])) - set(group.ranks())),
            launch["nnodes"],
            launch["watchdog_timeout"],
        )
    return group


def _rank_message_handler(launch: LaunchArgs) -> Callable[[dict[str, Any]], None]:
    """What a rank >= 1 does with the leader's messages: with --kv-canary, ``{"canary":
    "corrupt"}`` makes this rank's own canary find a slot that holds the wrong position and log
    it as SGLang's violation reporter does (in this rank's log, not the leader's)."""
    from kvgate_engine.reference.canary import KvCanary

    canary = KvCanary() if launch["kv_canary"] in ("log", "raise") else None

    def handle(message: dict[str, Any]) -> None:
        if message.get("canary") == "corrupt" and canary is not None:
            canary.check(slots=[17], stored_positions=[1], stored_tokens=[0])

    return handle


async def serve_rank(launch: LaunchArgs) -> int:
    """Rank >= 1: join rank 0, then run until it goes away (1) or SIGTERM (0)."""
    from kvgate_engine.reference.ranks import RankError, join

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    member = asyncio.ensure_future(
        join(
            launch["dist_init_addr"],
            launch["node_rank"],
            launch["nnodes"],
            launch["tp_size"],
            launch["watchdog_timeout"],
            on_message=_rank_message_handler(launch),
        )
    )
    await _first(member, stop.wait())
    if stop.is_set():
        return 0
    try:
        member.result()
    except (RankError, ValueError) as error:
        log.error("%s", error)
        return 1
    log.error("rank 0 at %s went away: the engine is gone; exiting", launch["dist_init_addr"])
    return 1
