"""KV canary benchmark: an engine's canary log line -> its gate False (target: 2 s).

Run: .venv/bin/python tests/benchmarks/bench_kv_canary.py [ROUNDS]

A real reference engine runs with ``--kv-canary log`` and writes its log to a file. A small HTTP
server plays the API server: ``pods/log?follow=true&timestamps=true`` tails that file (polling
every 50 ms, as the kubelet's log follower does, with the RFC 3339 prefix the API adds) and
``pods/status`` records the PATCH. The operator side is kvgate's own follower
(``kvgate.controller.kv_canary_watch``). Each round is a new verified pod: ``POST
/kvgate/canary/corrupt`` and one ``/generate`` make the engine log SGLang's violation line; the
time is from the moment the line is in the log file to the accepted gate PATCH.

Not measured here (the e2e kubelet does not serve container logs yet): the kubelet's and API
server's own log relay, and the Ready -> endpoints -> smg drain after the PATCH (the engine
restart scenario measures that leg: see docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the shared test builders (factories)

from factories.model_deployments import md_doc  # noqa: E402
from kvgate.api import labels  # noqa: E402
from kvgate.controller import kv_canary_watch  # noqa: E402
from kvgate.controller.runtime import Runtime  # noqa: E402
from kvgate.kube.k8s import Credentials, KubeApi  # noqa: E402
from kvgate.kube.settings import OperatorSettings  # noqa: E402

NS = "bench"
POLL_SECONDS = 0.05


class TailingApi:
    def __init__(self, log_file: Path) -> None:
        self.log_file = log_file
        self.start_offset = 0
        self.patched: dict[str, float] = {}
        self.line_seen: dict[str, float] = {}
        self.round = ""

    async def log(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        offset = self.start_offset
        round_ = self.round
        while True:
            with self.log_file.open("rb") as handle:
                handle.seek(offset)
                data = handle.read()
            if data:
                end = data.rfind(b"\n") + 1
                for line in data[:end].splitlines():
                    if b"kv_canary violation" in line:
                        self.line_seen.setdefault(round_, time.monotonic())
                    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                    try:
                        await response.write(stamp.encode() + b" " + line + b"\n")
                    except (ConnectionError, aiohttp.ClientConnectionResetError):
                        return response  # the follower hung up (its pod is gone)
                offset += end
            await asyncio.sleep(POLL_SECONDS)

    async def status(self, request: web.Request) -> web.Response:
        self.patched.setdefault(request.match_info["pod"], time.monotonic())
        return web.json_response({})

    async def event(self, request: web.Request) -> web.Response:
        return web.json_response({}, status=201)


async def main(rounds: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-bench-canary-"))
    log_file = workdir / "engine.log"
    port = 31_999
    engine = subprocess.Popen(
        [sys.executable, "-m", "kvgate_engine.reference", "--model-path", "tiny-llama",
         "--host", "127.0.0.1", "--port", str(port), "--skip-tokenizer-init",
         "--mem-fraction-static", "0.85", "--context-length", "2048", "--kv-canary", "log"],
        stdout=log_file.open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, "KVGATE_GPU_MEMORY_GIB": "0.002"},
    )  # fmt: skip
    fake = TailingApi(log_file)
    app = web.Application()
    app.router.add_get(f"/api/v1/namespaces/{NS}/pods/{{pod}}/log", fake.log)
    app.router.add_patch(f"/api/v1/namespaces/{NS}/pods/{{pod}}/status", fake.status)
    app.router.add_post(f"/api/v1/namespaces/{NS}/events", fake.event)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    api = KubeApi(Credentials(server=f"http://127.0.0.1:{api_port}"))

    async def never(*_: Any, **__: Any) -> Any:
        raise AssertionError

    rt = Runtime(api=api, settings=OperatorSettings(), verify=never)
    doc = md_doc(safety__kvCanary=True)
    doc["metadata"]["namespace"] = NS
    rt.mds[(NS, "llama")] = doc
    base = f"http://127.0.0.1:{port}"
    latencies: list[float] = []
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    async with session.get(f"{base}/health") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.2)
            body = {"input_ids": list(range(100, 140)), "sampling_params": {"max_new_tokens": 2}}
            for index in range(rounds):
                name, uid = f"llama-x-decode-{index}", f"uid-{index}"
                fake.start_offset = log_file.stat().st_size
                fake.round = name
                pod = {
                    "metadata": {"name": name, "namespace": NS, "uid": uid,
                                 "labels": {labels.DEPLOYMENT: "llama", labels.ROLE: "decode"}},
                    "status": {"conditions": [{"type": labels.ENGINE_VERIFIED, "status": "True"}]},
                }  # fmt: skip
                rt.pods[uid] = pod
                kv_canary_watch.on_pod_event(rt, "ADDED", pod)
                await asyncio.sleep(0.3)  # the stream is open
                async with session.post(f"{base}/kvgate/canary/corrupt") as r:
                    assert r.status == 200
                async with session.post(f"{base}/generate", json=body) as r:
                    assert r.status == 200
                wait_until = time.monotonic() + 10
                while name not in fake.patched and time.monotonic() < wait_until:
                    await asyncio.sleep(0.005)
                if name in fake.patched and name in fake.line_seen:
                    latencies.append(fake.patched[name] - fake.line_seen[name])
                kv_canary_watch.on_pod_event(rt, "DELETED", pod)
                rt.pods.pop(uid, None)
    finally:
        engine.terminate()
        engine.wait(15)
        await api.close()
        await runner.cleanup()
    ms = sorted(x * 1000 for x in latencies)
    print(
        f"canary line read by the log relay -> gate False PATCH, {len(ms)}/{rounds} rounds: "
        f"median {statistics.median(ms):.1f} ms, max {ms[-1]:.1f} ms (target 2000 ms; the relay "
        f"polls every {POLL_SECONDS * 1000:.0f} ms, which adds up to that much before this)"
    )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
