"""Webhook latency under concurrency: real HTTPS on loopback, kopf's admission machinery.

    .venv/bin/python tests/benchmarks/bench_webhook.py [--requests 2000] [--concurrency 50]

The webhook runs in a child process (as the operator would, apart from the API server that calls
it); this process sends AdmissionReview v1 requests — a mix of allowed, denied and warned
ModelDeployments — over `--concurrency` keep-alive connections and prints p50/p90/p99/max.
Target: p99 <= 20 ms. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
import yaml

SAMPLE = Path(__file__).resolve().parents[2] / "crds" / "samples" / "llama-8b.yaml"
WEBHOOK_PATH = "/validate-modeldeployment"


async def serve(port: int, tls_dir: str) -> None:
    from kvgate.admission.server import build_webhook_server
    from kvgate.admission.standalone import serve_webhook

    server = build_webhook_server(tls_dir=tls_dir, port=port, addr="127.0.0.1")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with serve_webhook(server):
        print("ready", flush=True)
        await stop.wait()


def _bodies() -> list[bytes]:
    doc = yaml.safe_load(SAMPLE.read_text())
    denied = copy.deepcopy(doc)
    denied["spec"]["decode"]["gpuMemoryGiB"] = 24
    warned = copy.deepcopy(doc)
    warned["spec"]["engine"]["image"] = "lmsysorg/sglang:latest"
    bodies = []
    for obj in (doc, denied, warned):
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": str(uuid.uuid4()),
                "kind": {"group": "kvgate.io", "version": "v1alpha1", "kind": "ModelDeployment"},
                "resource": {
                    "group": "kvgate.io",
                    "version": "v1alpha1",
                    "resource": "modeldeployments",
                },
                "name": "llama-8b",
                "namespace": "default",
                "operation": "CREATE",
                "userInfo": {"username": "bench"},
                "object": obj,
                "oldObject": None,
                "dryRun": False,
            },
        }
        bodies.append(json.dumps(review).encode())
    return bodies


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_listening(port: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"webhook did not listen on 127.0.0.1:{port}")


async def run(requests: int, concurrency: int, warmup: int) -> dict[str, float]:
    from kvgate.tls import make_ca, make_serving_cert, write_tls_dir

    with tempfile.TemporaryDirectory() as tls_dir:
        files = write_tls_dir(tls_dir, make_serving_cert(make_ca()))
        port = _free_port()
        child = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--port", str(port), "--tls-dir", tls_dir],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stderr=subprocess.DEVNULL,  # kopf logs every denial; the bench needs none of it
        )
        try:
            await _wait_listening(port, time.monotonic() + 30)
            client_ssl = ssl.create_default_context(cafile=str(files.ca_file))
            url = f"https://127.0.0.1:{port}{WEBHOOK_PATH}"
            bodies = _bodies()
            latencies: list[float] = []
            statuses: dict[str, int] = {}
            queue: asyncio.Queue[int] = asyncio.Queue()
            for index in range(warmup):
                queue.put_nowait(index)
            connector = aiohttp.TCPConnector(limit=concurrency, ssl=client_ssl)
            async with aiohttp.ClientSession(connector=connector) as session:

                async def worker() -> None:
                    while True:
                        try:
                            index = queue.get_nowait()
                        except asyncio.QueueEmpty:
                            return
                        body = bodies[index % len(bodies)]
                        started = time.perf_counter()
                        async with session.post(
                            url, data=body, headers={"Content-Type": "application/json"}
                        ) as response:
                            answer = await response.json()
                        elapsed = time.perf_counter() - started
                        if index >= warmup:
                            latencies.append(elapsed)
                            key = f"{response.status}/allowed={answer['response']['allowed']}"
                            statuses[key] = statuses.get(key, 0) + 1

                await asyncio.gather(*(worker() for _ in range(min(concurrency, warmup))))
                for index in range(warmup, warmup + requests):
                    queue.put_nowait(index)
                cpu = _cpu_seconds(child.pid)
                wall = time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(concurrency)))
                wall = time.perf_counter() - wall
                cpu = _cpu_seconds(child.pid) - cpu
        finally:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    latencies.sort()
    ms = [x * 1000 for x in latencies]

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, round(p / 100 * (len(ms) - 1)))]

    print(f"responses: {statuses}")
    return {
        "requests": float(len(ms)),
        "concurrency": float(concurrency),
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "max_ms": ms[-1],
        "mean_ms": statistics.fmean(ms),
        "throughput_rps": len(ms) / wall,
        "server_cpu_ms_per_request": cpu / len(ms) * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tls-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.port, args.tls_dir))
        return 0
    result = asyncio.run(run(args.requests, args.concurrency, args.warmup))
    print(
        f"webhook latency over HTTPS, {int(result['requests']):,} requests, "
        f"{int(result['concurrency'])} concurrent: p50 {result['p50_ms']:.1f} ms, "
        f"p90 {result['p90_ms']:.1f} ms, p99 {result['p99_ms']:.1f} ms, "
        f"max {result['max_ms']:.1f} ms, {result['throughput_rps']:,.0f} req/s; webhook "
        f"process CPU {result['server_cpu_ms_per_request']:.2f} ms per request"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
