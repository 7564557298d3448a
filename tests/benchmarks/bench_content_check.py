"""Content check benchmark: kvgate's probes through the real smg router, honest and lenient engines.

Run: .venv/bin/python tests/benchmarks/bench_content_check.py

For each case a prefill and a decode reference engine (llama-3.1-8b config, 131,072-token
context, 80 GiB simulated GPUs: the e2e sample) and ``smg launch --pd-disaggregation`` with both as
static workers run on loopback. kvgate's own planner, sender and judge
(``kvgate.verify.content_probe``, ``kvgate.controller.content_check.send_probe``) then check the
revision
through the router, as the operator does before a Service switch. Prints each probe's answer and
wall time, and the verdict:

- honest engines: every in-range prompt answered with 8 tokens, over-range prompts refused;
- ``KVGATE_ADMIT_OVER_LENGTH=1`` (a pool large enough, no length admission): the over-context
  prompt answered with HTTP 200 and tokens, so the check fails, as the pool check alone cannot.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from kvgate.api.models import ContentProbeSpec
from kvgate.controller.content_check import send_probe
from kvgate.verify import content_probe

MODEL = "llama-3.1-8b"
CONTEXT = 131_072


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def wait_http(url: str, deadline: float) -> None:
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.3)
    raise TimeoutError(url)


async def run_case(name: str, env: dict[str, str], workdir: Path) -> bool:
    procs: list[subprocess.Popen[bytes]] = []
    p_port, d_port, b_port, r_port = free_port(), free_port(), free_port(), free_port()
    common = ["--model-path", MODEL, "--served-model-name", MODEL, "--host", "127.0.0.1",
              "--mem-fraction-static", "0.85", "--context-length", str(CONTEXT),
              "--skip-tokenizer-init"]  # fmt: skip
    engine_env = {**os.environ, "KVGATE_GPU_MEMORY_GIB": "80", **env}
    try:
        for role, port, extra in (
            ("prefill", p_port, ["--disaggregation-bootstrap-port", str(b_port)]),
            ("decode", d_port, []),
        ):
            log = (workdir / f"{name}-{role}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "kvgate_engine.reference",
                        *common,
                        "--port",
                        str(port),
                        "--disaggregation-mode",
                        role,
                        *extra,
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=engine_env,
                )
            )
        deadline = time.monotonic() + 180
        for port in (p_port, d_port):
            await wait_http(f"http://127.0.0.1:{port}/health", deadline)
        smg = Path(sys.executable).parent / "smg"
        log = (workdir / f"{name}-smg.log").open("wb")
        procs.append(
            subprocess.Popen(
                [
                    str(smg),
                    "launch",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(r_port),
                    "--pd-disaggregation",
                    "--policy",
                    "round_robin",
                    "--prefill",
                    f"http://127.0.0.1:{p_port}",
                    str(b_port),
                    "--decode",
                    f"http://127.0.0.1:{d_port}",
                    "--worker-startup-check-interval",
                    "1",
                    "--health-check-interval-secs",
                    "1",
                    "--disable-circuit-breaker",
                    "--prometheus-port",
                    str(free_port()),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
        await wait_http(f"http://127.0.0.1:{r_port}/readiness", deadline)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{p_port}/server_info") as response:
                pool = int((await response.json())["max_total_num_tokens"])
            probes = content_probe.plan_probes(CONTEXT, pool, ContentProbeSpec())
            findings = []
            for probe in probes:
                answer = await send_probe(
                    session, f"http://127.0.0.1:{r_port}", MODEL, probe, timeout=600
                )
                finding = content_probe.judge(probe, answer)
                findings.append(finding)
                print(f"  [{name}] {finding.summary} ({answer.seconds:.2f} s)")
        verdict = content_probe.verdict("bench", findings)
        total = sum(f.answer.seconds for f in findings)
        print(f"  [{name}] pool {pool:,}: {verdict.reason} in {total:.1f} s")
        return verdict.passed
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


async def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-bench-content-"))
    honest = await run_case("honest", {}, workdir)
    lenient = await run_case("lenient", {"KVGATE_ADMIT_OVER_LENGTH": "1"}, workdir)
    print(f"honest passed={honest}, lenient passed={lenient} (want True, False); logs {workdir}")
    if not honest or lenient:
        raise SystemExit(1)


if __name__ == "__main__":
    asyncio.run(main())
