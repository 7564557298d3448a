"""Operator benchmark: verification latency and memory.

Run: .venv/bin/python tests/benchmarks/bench_operator.py

1. engine ready -> pod verified: a pod's watch event says its engine container turned ready; time
   until the engine-verified=True status PATCH has been accepted by the API (kmock emulator),
   through the real verifier task, the real probe and a real HTTP engine on 127.0.0.1.
2. shrunken pool -> gate False: the engine's pool shrinks; time from the probe's Unsafe verdict to
   the accepted PATCH (target <= 2 s), and from the shrink to the PATCH with a 1 s re-verify.
3. memory: RSS of one operator process (kopf, the kubernetes loader, kvgate imported) holding
   200 ModelDeployments' state (bodies, 2 engine pods each) after a full plan + status pass each.
"""

from __future__ import annotations

import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import kmock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the shared builders (factories)

import kopf  # noqa: F401  (counted in the memory figure, as in the real process)
from factories.fake_engine import FakeEngine, running
from factories.model_deployments import make_md, md_doc
from kvgate.api.revision import revision_of
from kvgate.controller import engine_pods
from kvgate.controller.main import make_verify
from kvgate.controller.modeldeployment import pod_state, workload_state
from kvgate.controller.runtime import Runtime
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings
from kvgate.objects import builders
from kvgate.rollout.planner import ObservedState, plan
from kvgate.rollout.status import compute_status
from kvgate.verify import gate

NS = "bench"


class TimedApi(KubeApi):
    """Records when each pod-condition PATCH was accepted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accepted: list[tuple[float, str]] = []

    async def patch_pod_condition(
        self, namespace: str, name: str, uid: str, condition: dict[str, str]
    ) -> Any:
        result = await super().patch_pod_condition(namespace, name, uid, condition)
        self.accepted.append((time.perf_counter(), condition["status"]))
        return result


def pod_body(i: int, port: int, *, ready: bool) -> dict[str, Any]:
    md = make_md()
    rev = revision_of(md.spec)
    template = builders.deployment(md, rev, "decode", replicas=1)["spec"]["template"]
    template["spec"]["containers"][0]["ports"][0]["containerPort"] = port
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": f"p{i}", "namespace": NS, "uid": f"u{i}"},
        "spec": template["spec"],
        "status": {
            "podIP": "127.0.0.1",
            "containerStatuses": [{"name": "engine", "ready": ready, "restartCount": 0}],
            "conditions": [],
        },
    }


async def wait_for(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.perf_counter() + timeout
    while not predicate():
        if time.perf_counter() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.001)


async def latency(samples: int = 30) -> None:
    async with kmock.KubernetesEmulator() as km, kmock.Server(km):
        km.resources["v1/pods"] = {}
        km.resources["v1/events"] = {}
        api = TimedApi(Credentials(server=str(km.url).rstrip("/")))
        settings = OperatorSettings(reverify_seconds=1.0, probe_timeout_seconds=2.0)
        rt = Runtime(api=api, settings=settings, verify=make_verify(settings))
        ready_ms: list[float] = []
        shrink_probe_ms: list[float] = []
        shrink_total_ms: list[float] = []
        async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
            for i in range(samples):
                engine.kv_pool_tokens = 200_000
                km.objects[km.resource("", "v1", "pods"), NS, f"p{i}"] = pod_body(
                    i, engine.port, ready=False
                )
                engine_pods.on_pod_event(rt, "ADDED", pod_body(i, engine.port, ready=False))
                await asyncio.sleep(0.01)
                before = len(api.accepted)
                t0 = time.perf_counter()
                engine_pods.on_pod_event(rt, "MODIFIED", pod_body(i, engine.port, ready=True))
                await wait_for(lambda n=before: len(api.accepted) > n)
                ready_ms.append((api.accepted[-1][0] - t0) * 1000)

                # Shrink: the next periodic re-verify (1 s) sees it.
                seen: list[float] = []
                real_verify = rt.verify

                async def timed_verify(
                    url: str, req: Any, real: Any = real_verify, seen: list[float] = seen
                ) -> Any:
                    verdict = await real(url, req)
                    seen.append(time.perf_counter())
                    return verdict

                rt.verify = timed_verify
                before = len(api.accepted)
                t_shrink = time.perf_counter()
                engine.kv_pool_tokens = 68_128
                await wait_for(lambda n=before: len(api.accepted) > n, timeout=5)
                t_false, status = api.accepted[-1]
                assert status == "False"
                shrink_probe_ms.append((t_false - seen[-1]) * 1000)
                shrink_total_ms.append((t_false - t_shrink) * 1000)
                rt.verify = real_verify
                engine_pods.on_pod_event(rt, "DELETED", pod_body(i, engine.port, ready=True))
        await rt.shutdown()
        await api.close()

    def show(name: str, values: list[float]) -> None:
        values = sorted(values)
        p50 = statistics.median(values)
        p95 = values[max(0, int(len(values) * 0.95) - 1)]
        print(f"{name:48s} p50 {p50:8.1f} ms   p95 {p95:8.1f} ms   max {values[-1]:8.1f} ms")

    print(f"verification latency ({samples} pods, fake engine + kmock on 127.0.0.1)")
    show("engine ready -> verified (PATCH accepted)", ready_ms)
    show("probe saw shrunken pool -> gate False", shrink_probe_ms)
    show("pool shrank -> gate False (reverify 1 s)", shrink_total_ms)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def memory(count: int = 200) -> None:
    gc.collect()
    base = rss_mib()
    rt_mds: dict[tuple[str, str], dict[str, Any]] = {}
    pods: dict[str, dict[str, Any]] = {}
    statuses: list[dict[str, Any]] = []
    null_rt: Any = _NullRt()
    for i in range(count):
        doc = md_doc(model__name=f"m{i}")
        doc["metadata"].update(name=f"md{i}", namespace=NS, uid=f"uid-{i}")
        rt_mds[(NS, f"md{i}")] = doc
        md = make_md(model__name=f"m{i}")
        rev = revision_of(md.spec)
        deployments = [builders.deployment(md, rev, c, replicas=1) for c in builders.COMPONENTS]
        engine = [pod_body(i * 2 + k, 30000, ready=True) for k in range(2)]
        for k, p in enumerate(engine):
            p["metadata"]["labels"]["kvgate.io/role"] = ("prefill", "decode")[k]
            pods[p["metadata"]["uid"]] = p
        observed = ObservedState(
            spec=md.spec,
            target_revision=rev,
            workloads=tuple(w for w in map(workload_state, deployments) if w),
            pods=tuple(s for s in (pod_state(null_rt, p) for p in engine) if s),
            service_revision=rev,
            now=gate.datetime.now(gate.UTC),
        )
        step = plan(observed)
        statuses.append(
            compute_status(
                step, generation=1, context_length=131072, previous=None, now=observed.now
            )
        )
    gc.collect()
    print(
        f"memory: RSS {rss_mib():.1f} MiB holding {count} ModelDeployments "
        f"(+{rss_mib() - base:.1f} MiB for their state; {base:.1f} MiB with kopf, "
        "aiohttp and kvgate imported)"
    )


class _NullRt:
    def __init__(self) -> None:
        self.engines: dict[str, Any] = {}


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.ERROR)
    asyncio.run(latency())
    memory()
