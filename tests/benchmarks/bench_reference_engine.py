"""Benchmark the reference engine: start-up time and generation tokens/s (medians over runs).

    .venv/bin/python tests/benchmarks/bench_reference_engine.py [--runs 3] [--model llama-3.1-8b]
        [--startup-only]

Start-up = process start → first ``/health`` 200, in wall seconds and in the CPU seconds (user +
system, from ``/proc/<pid>/stat``) the engine process had spent by then. Generation = completion
tokens / wall time of one non-streamed ``/generate`` (unified engine), and of a prefill→decode
handoff (two engines, the client sending the same body to both, as the PD router does).
Everything runs on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import aiohttp

HOST = "127.0.0.9"


@dataclass
class Engine:
    process: subprocess.Popen[bytes]
    url: str
    bootstrap_port: int | None


@dataclass(frozen=True)
class Startup:
    wall_seconds: float
    cpu_seconds: float  # user + system of the engine process until its first /health 200


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a live process has used (Linux /proc/<pid>/stat, fields 14-15)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


async def start(model: str, role: str, gpu_gib: str) -> tuple[Engine, Startup]:
    port = free_port()
    argv = ["--model-path", model, "--host", HOST, "--port", str(port)]
    argv += ["--skip-tokenizer-init", "--disaggregation-mode", role]
    argv += ["--mem-fraction-static", "0.85"]
    bootstrap = None
    if role == "prefill":
        bootstrap = free_port()
        argv += ["--disaggregation-bootstrap-port", str(bootstrap)]
    began = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "kvgate_engine.reference", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "KVGATE_GPU_MEMORY_GIB": gpu_gib},
    )
    engine = Engine(process, f"http://{HOST}:{port}", bootstrap)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while time.monotonic() - began < 120:
            if process.poll() is not None:
                raise RuntimeError(f"engine exited with {process.returncode}")
            try:
                async with session.get(f"{engine.url}/health") as response:
                    if response.status == 200:
                        wall = time.monotonic() - began
                        return engine, Startup(wall, cpu_seconds(process.pid))
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.02)
    stop(engine)
    raise RuntimeError("engine did not become healthy within 120 s")


def stop(engine: Engine) -> None:
    if engine.process.poll() is None:
        engine.process.send_signal(signal.SIGTERM)
        try:
            engine.process.wait(15)
        except subprocess.TimeoutExpired:
            engine.process.kill()
            engine.process.wait()


async def timed_generate(urls: list[str], body: dict[str, object]) -> tuple[float, int]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        began = time.monotonic()
        responses = await asyncio.gather(
            *(session.post(f"{url}/generate", json=body) for url in urls)
        )
        payloads = [await response.json() for response in responses]
        elapsed = time.monotonic() - began
    answer = payloads[-1]
    if "output_ids" not in answer:
        raise RuntimeError(f"generation failed: {answer}")
    return elapsed, len(answer["output_ids"])


async def run(
    runs: int, model: str, gpu_gib: str, prompt_len: int, new_tokens: int, startup_only: bool
) -> None:
    startups: list[Startup] = []
    unified_tps: list[float] = []
    pd_tps: list[float] = []
    prompt = [(i * 7) % 1000 + 1 for i in range(prompt_len)]
    for run_index in range(runs):
        engine, startup = await start(model, "null", gpu_gib)
        startups.append(startup)
        if startup_only:
            stop(engine)
            continue
        try:
            body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": new_tokens}}
            await timed_generate([engine.url], body)  # warm-up: first-call allocations
            elapsed, produced = await timed_generate([engine.url], body)
            unified_tps.append(produced / elapsed)
        finally:
            stop(engine)
        (prefill, _), (decode, _) = await asyncio.gather(
            start(model, "prefill", gpu_gib), start(model, "decode", gpu_gib)
        )
        try:
            body = {
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": new_tokens},
                "bootstrap_host": HOST,
                "bootstrap_port": prefill.bootstrap_port,
                "bootstrap_room": 2 * run_index + 1,
            }
            await timed_generate([prefill.url, decode.url], body)  # warm-up
            body["bootstrap_room"] = 2 * run_index + 2
            elapsed, produced = await timed_generate([prefill.url, decode.url], body)
            pd_tps.append(produced / elapsed)
        finally:
            stop(prefill)
            stop(decode)
    print(f"model {model}, KVGATE_GPU_MEMORY_GIB={gpu_gib}, {runs} runs, prompt {prompt_len:,}")
    walls = [s.wall_seconds for s in startups]
    cpus = [s.cpu_seconds for s in startups]
    print(
        f"start-up (process start → /health 200): median {statistics.median(walls):.2f} s wall, "
        f"{statistics.median(cpus):.2f} CPU s (user + system); runs: "
        + ", ".join(f"{s.wall_seconds:.2f} s / {s.cpu_seconds:.2f} CPU s" for s in startups)
    )
    if startup_only:
        return
    print(
        f"unified generation, {new_tokens} tokens: median {statistics.median(unified_tps):,.0f} t/s"
    )
    print(
        f"PD handoff + generation, {new_tokens} tokens: median {statistics.median(pd_tps):,.0f} t/s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu-memory-gib", default="80")
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--startup-only", action="store_true", help="measure start-up only")
    args = parser.parse_args()
    asyncio.run(
        run(
            args.runs,
            args.model,
            args.gpu_memory_gib,
            args.prompt_len,
            args.new_tokens,
            args.startup_only,
        )
    )


if __name__ == "__main__":
    main()
