"""Fixtures that run reference engines as real subprocesses on loopback, and always stop them."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

STARTUP_DEADLINE = 300.0  # at nice 15 beside the e2e tier, a start can take minutes
STOP_DEADLINE = 15.0
# Small timeouts so a broken handoff fails a test in seconds, not SGLang's 300 s.
TEST_ENV = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "15",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "15",
}
_hosts = itertools.cycle(range(20, 250))


def loopback_host() -> str:
    """A 127.0.0.x address for one engine (distinct addresses prove --host is honoured)."""
    return f"127.0.0.{next(_hosts)}"


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningEngine:
    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    bootstrap_port: int | None = None
    argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class EngineLauncher:
    """Starts engines with sglang.launch_server flags; stop_all() ends every one it started."""

    def __init__(self, workdir: Path) -> None:
        self._workdir = workdir
        self._engines: list[RunningEngine] = []

    def spawn(
        self,
        *flags: str,
        env: Mapping[str, str] | None = None,
        host: str | None = None,
        role: str = "null",
        skip_tokenizer_init: bool = True,
    ) -> RunningEngine:
        host = host or loopback_host()
        port = free_port(host)
        argv = ["--model-path", "tiny-llama", "--host", host, "--port", str(port)]
        argv += ["--disaggregation-mode", role]
        if skip_tokenizer_init:
            argv.append("--skip-tokenizer-init")
        bootstrap_port = None
        if role == "prefill":
            bootstrap_port = free_port(host)
            argv += ["--disaggregation-bootstrap-port", str(bootstrap_port)]
        argv += list(flags)
        log_path = self._workdir / f"engine-{host}-{port}.log"
        with log_path.open("wb") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "kvgate_engine.reference", *argv],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, **TEST_ENV, **(env or {})},
            )
        engine = RunningEngine(host, port, process, log_path, bootstrap_port, argv)
        self._engines.append(engine)
        return engine

    async def start(self, *flags: str, **kwargs: Any) -> RunningEngine:
        engine = self.spawn(*flags, **kwargs)
        await wait_healthy(engine)
        return engine

    async def wait_healthy(self, *engines: RunningEngine) -> None:
        """Wait for engines spawned together (they start in parallel)."""
        await asyncio.gather(*(wait_healthy(engine) for engine in engines))

    async def stop_all(self) -> None:
        for engine in self._engines:  # signal all first: they shut down in parallel
            if engine.process.poll() is None:
                engine.process.send_signal(signal.SIGTERM)
        for engine in self._engines:
            stop(engine)

    # Client helpers, here so tests need nothing but the fixture.
    async def route_pd(
        self,
        prefill: RunningEngine,
        decode: RunningEngine,
        input_ids: list[int],
        max_new_tokens: int,
        room: int,
        stream: bool = False,
    ) -> tuple[Leg, Leg]:
        return await route_pd(prefill, decode, input_ids, max_new_tokens, room, stream)

    async def get_json(self, url: str) -> tuple[int, Any]:
        return await get_json(url)

    async def generate(self, engine: RunningEngine, body: object) -> Leg:
        return await post_one(engine, body)

    def stop(self, engine: RunningEngine) -> int:
        return stop(engine)


async def wait_healthy(engine: RunningEngine) -> None:
    deadline = time.monotonic() + STARTUP_DEADLINE
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if engine.process.poll() is not None:
                raise AssertionError(
                    f"engine exited with {engine.process.returncode} before /health:\n"
                    f"{engine.log()}"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(
                    f"{engine.url}/health", timeout=aiohttp.ClientTimeout(total=2)
                ) as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise AssertionError(f"engine not healthy within {STARTUP_DEADLINE} s:\n{engine.log()}")


def stop(engine: RunningEngine) -> int:
    """SIGTERM, then SIGKILL after the deadline; returns the exit code."""
    process = engine.process
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return int(process.returncode)


@pytest.fixture
async def engines(tmp_path: Path) -> AsyncIterator[EngineLauncher]:
    launcher = EngineLauncher(tmp_path)
    try:
        yield launcher
    finally:
        await launcher.stop_all()


@dataclass(frozen=True)
class Leg:
    status: int
    body: dict[str, Any]


async def post_generate(session: aiohttp.ClientSession, engine: RunningEngine, body: object) -> Leg:
    """POST /generate; a streamed answer's body is its first `data:` event."""
    async with session.post(f"{engine.url}/generate", json=body) as response:
        if response.content_type != "text/event-stream":
            return Leg(response.status, await response.json())
        text = await response.text()
        events = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", text
        # /generate streams a token an event: the answer is their output_ids in order, with the
        # last event's meta_info (or the one error event).
        parsed = [json.loads(e) for e in events[:-1]]
        body = dict(parsed[-1])
        if "output_ids" in body:
            body["output_ids"] = [i for e in parsed for i in e.get("output_ids", [])]
        return Leg(response.status, body)


async def route_pd(
    prefill: RunningEngine,
    decode: RunningEngine,
    input_ids: list[int],
    max_new_tokens: int,
    room: int,
    stream: bool = False,
) -> tuple[Leg, Leg]:
    """Act as the PD router: send the same body to both legs at once; decode answers the client."""
    body = {
        "stream": stream,
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens},
        "bootstrap_host": prefill.host,
        "bootstrap_port": prefill.bootstrap_port,
        "bootstrap_room": room,
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        prefill_leg, decode_leg = await asyncio.gather(
            post_generate(session, prefill, body), post_generate(session, decode, body)
        )
    return prefill_leg, decode_leg


async def get_json(url: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(url) as response,
    ):
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text


async def post_one(engine: RunningEngine, body: object) -> Leg:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        return await post_generate(session, engine, body)
