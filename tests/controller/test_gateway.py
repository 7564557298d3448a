"""A gateway that keeps routing to an engine pod after its gate turned False gets the pod deleted.

Table tests for the pure decision (kvgate.verify.gateway.decide), then the wiring against the kmock
API
emulator with a fake smg router serving ``GET /workers`` on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import kmock
import pytest
from aiohttp import web
from factories.kmock_world import NS, engine_pod, requests
from factories.model_deployments import NOW, make_md
from kvgate.api import labels
from kvgate.api.revision import revision_of
from kvgate.controller import engine_pods
from kvgate.controller.gateway_watch import GatewayWatch, read_workers
from kvgate.controller.runtime import Runtime
from kvgate.kube import metrics
from kvgate.objects import builders
from kvgate.verify.gateway import (
    GATEWAY_HONOURED_NOT_READY,
    GATEWAY_IGNORED_NOT_READY,
    GATEWAY_UNREACHABLE,
    NO_ROUTERS,
    WITHIN_GRACE,
    Action,
    EnginePod,
    RouterWorkers,
    decide,
    worker_address,
)

POD = EnginePod(name="llama-7c9d-decode-x2", uid="uid-a", ip="10.0.0.6", port=30000, role="decode")


def worker(
    url: str = "http://10.0.0.6:30000", status: str = "ready", uid: str | None = "uid-a"
) -> dict[str, Any]:
    worker_labels = {"smg.ai/pod-name": POD.name}
    if uid is not None:
        worker_labels["smg.ai/pod-uid"] = uid
    return {
        "id": url,
        "url": url,
        "worker_type": "decode",
        "status": status,
        "labels": worker_labels,
    }


def seen(*workers: dict[str, Any], router: str = "llama-7c9d-router-a") -> RouterWorkers:
    return RouterWorkers(router, workers=tuple(workers) if workers else (worker(),))


UNREACHABLE = RouterWorkers("llama-7c9d-router-b", error="GET /workers failed: timed out")


@pytest.mark.parametrize(
    ("after_seconds", "routers", "action", "reason"),
    [
        pytest.param(20, [seen()], Action.DELETE, GATEWAY_IGNORED_NOT_READY, id="still-ready"),
        pytest.param(20, [seen(worker(status="pending"))], Action.DELETE,
                     GATEWAY_IGNORED_NOT_READY, id="re-registered-pending"),
        pytest.param(20, [seen(worker(uid=None))], Action.DELETE, GATEWAY_IGNORED_NOT_READY,
                     id="matched-by-url-without-uid-label"),
        pytest.param(20, [seen(worker(url="http://10.0.0.9:30000", uid="uid-a"))],
                     Action.DELETE, GATEWAY_IGNORED_NOT_READY, id="matched-by-uid-label"),
        pytest.param(20, [seen(worker(url="10.0.0.6:30000", uid=None))], Action.DELETE,
                     GATEWAY_IGNORED_NOT_READY, id="url-without-scheme"),
        pytest.param(20, [seen(), UNREACHABLE], Action.DELETE, GATEWAY_IGNORED_NOT_READY,
                     id="one-router-routes-other-unreachable"),
        pytest.param(15, [seen()], Action.DELETE, GATEWAY_IGNORED_NOT_READY,
                     id="grace-just-over"),
        pytest.param(20, [seen(worker(status="draining"))], Action.KEEP,
                     GATEWAY_HONOURED_NOT_READY, id="draining"),
        pytest.param(20, [seen(worker(status="not_ready")), seen(worker(status="failed"))],
                     Action.KEEP, GATEWAY_HONOURED_NOT_READY, id="not-ready-and-failed"),
        pytest.param(20, [seen(worker(url="http://10.0.0.7:30000", uid="uid-b"))],
                     Action.KEEP, GATEWAY_HONOURED_NOT_READY, id="dropped"),
        pytest.param(20, [seen(worker(uid="uid-b"))], Action.KEEP, GATEWAY_HONOURED_NOT_READY,
                     id="ip-reused-by-another-pod-uid"),
        pytest.param(20, [seen(worker(url="http://10.0.0.6:30001", uid=None))], Action.KEEP,
                     GATEWAY_HONOURED_NOT_READY, id="same-ip-other-port"),
        pytest.param(14.9, [seen()], Action.KEEP, WITHIN_GRACE, id="within-grace"),
        pytest.param(20, [UNREACHABLE], Action.KEEP, GATEWAY_UNREACHABLE, id="router-unreachable"),
        pytest.param(20, [], Action.KEEP, NO_ROUTERS, id="no-router-pods"),
    ],
)  # fmt: skip
def test_decision_table(
    after_seconds: float, routers: list[RouterWorkers], action: Action, reason: str
) -> None:
    decision = decide(
        POD,
        gate_false_since=NOW,
        now=NOW + timedelta(seconds=after_seconds),
        routers=routers,
        grace_seconds=15,
    )
    assert (decision.action, decision.reason) == (action, reason)


def test_delete_message_names_the_router_the_pod_and_the_seconds() -> None:
    decision = decide(
        POD, gate_false_since=NOW, now=NOW + timedelta(seconds=15.2), routers=[seen()]
    )
    assert decision.message == (
        "gateway llama-7c9d-router-a still routes to decode pod llama-7c9d-decode-x2 (worker "
        "http://10.0.0.6:30000 status ready) 15.2 s after it turned NotReady (grace 15.0 s); "
        "deleting the pod so no request reaches an unverified engine"
    )


def test_unreachable_router_is_reported_and_never_deletes() -> None:
    decision = decide(
        POD, gate_false_since=NOW, now=NOW + timedelta(seconds=60), routers=[UNREACHABLE]
    )
    assert decision.action is Action.KEEP
    assert decision.unreachable == ("llama-7c9d-router-b",)
    assert "llama-7c9d-router-b: GET /workers failed: timed out" in decision.message
    assert "60.0 s after it turned NotReady" in decision.message


def test_ipv6_worker_url_matches_the_pod_ip_in_any_spelling() -> None:
    pod = EnginePod(name="p", uid="u", ip="fd00:0:0::6", port=30000)
    routes = seen(worker(url="http://[fd00::6]:30000", uid=None))
    decision = decide(pod, gate_false_since=NOW, now=NOW + timedelta(seconds=20), routers=[routes])
    assert decision.action is Action.DELETE


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://198.18.0.7:30000", ("198.18.0.7", 30000)),
        ("198.18.0.7:30000", ("198.18.0.7", 30000)),
        ("http://[fd00::6]:30000", ("fd00::6", 30000)),
        # smg reads these as another host (WHATWG: backslash ends the authority, user info,
        # octal), or they are not the form discovery writes: no pod's worker.
        ("http://10.9.9.9:30001\\@198.18.0.7:30000", None),
        ("http://10.9.9.9@198.18.0.7:30000", None),
        ("http://198.18.0.07:30000", None),
        ("http://198.18.0.7:30000/", None),
        ("http://198.18.0.7:+30000", None),
        ("http://198.18.0.7:99999", None),
        ("http://[fd00:0::6]:30000", None),
        ("http://pod.example:30000", None),
        ("http://198.18.0.7:３0000", None),
        ("", None),
    ],
)
def test_a_worker_is_a_pod_address_only_in_the_exact_form_discovery_writes(
    url: str, address: tuple[str, int] | None
) -> None:
    assert worker_address(url) == address


def test_a_backslash_url_naming_the_pod_after_it_is_not_the_pods_worker() -> None:
    routes = seen(worker(url=f"http://10.9.9.9:30001\\@{POD.ip}:{POD.port}", uid=None))
    decision = decide(POD, gate_false_since=NOW, now=NOW + timedelta(seconds=60), routers=[routes])
    assert decision.action is Action.KEEP


# --- wiring: kmock API + a fake router on 127.0.0.1 ---------------------------------------------


@dataclass
class FakeRouter:
    workers: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    hits: int = 0


@asynccontextmanager
async def serving(router: FakeRouter) -> AsyncIterator[FakeRouter]:
    async def list_workers(_: web.Request) -> web.Response:
        router.hits += 1
        return web.json_response({"workers": router.workers, "total": len(router.workers)})

    app = web.Application()
    app.router.add_get("/workers", list_workers)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    router.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield router
    finally:
        await runner.cleanup()


@dataclass
class Clock:
    now: Any = NOW

    def __call__(self) -> Any:
        return self.now


ENGINE_PORT = 30000


def unverified_pod(turned_false_at: Any = NOW) -> dict[str, Any]:
    """A decode pod whose gate turned False at ``turned_false_at`` (engine container down)."""
    pod = engine_pod(ENGINE_PORT, ready=False)
    pod["status"]["conditions"].append(
        {
            "type": labels.ENGINE_VERIFIED,
            "status": "False",
            "reason": "KvPoolTooSmall",
            "message": "decode pod reports KV pool 68,128 tokens < context length 131,072",
            "lastTransitionTime": turned_false_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )
    return pod


def router_pod(port: int, name: str = "router-a") -> dict[str, Any]:
    md = make_md(model__contextLength=131_072)
    rev = revision_of(md.spec)
    template = builders.deployment(md, rev, "router", replicas=1)["spec"]["template"]
    template["spec"]["containers"][0]["ports"][0]["containerPort"] = port
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": template["spec"],
        "status": {"podIP": "127.0.0.1", "phase": "Running"},
    }


def put(km: kmock.KubernetesEmulator, pod: dict[str, Any]) -> None:
    km.objects[km.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod


def engine_worker(status: str, uid: str = "pod-uid-1") -> dict[str, Any]:
    url = f"http://127.0.0.1:{ENGINE_PORT}"
    return {
        "id": url,
        "url": url,
        "worker_type": "decode",
        "status": status,
        "labels": {"smg.ai/pod-uid": uid},
    }


def forced_deletions() -> float:
    value = metrics.REGISTRY.get_sample_value(
        "kvgate_gateway_forced_deletions_total",
        {"namespace": NS, "deployment": "llama", "role": "decode"},
    )
    return value or 0.0


def later(rt: Runtime, seconds: float) -> None:
    rt.clock = Clock(NOW + timedelta(seconds=seconds))


async def test_gateway_still_routing_after_grace_gets_the_pod_deleted_with_events_and_metric(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    pod = unverified_pod()
    put(kmock, pod)
    before = forced_deletions()
    async with serving(FakeRouter([engine_worker("ready")])) as router:
        put(kmock, router_pod(router.port))
        later(rt, 15.2)
        due = await GatewayWatch(rt).step(pod)
    assert due == math.inf  # deleted: nothing left to watch
    (delete,) = requests(kmock, "DELETE")
    assert str(delete.url.path) == f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}"
    assert delete.data["preconditions"] == {"uid": "pod-uid-1"}
    events = [r.data for r in requests(kmock, "POST", "/events")]
    assert {(e["involvedObject"]["kind"], e["reason"], e["type"]) for e in events} == {
        ("Pod", "GatewayIgnoredNotReady", "Warning"),
        ("ModelDeployment", "GatewayIgnoredNotReady", "Warning"),
    }
    assert all(
        e["message"].startswith(
            f"gateway router-a still routes to decode pod {pod['metadata']['name']}"
        )
        and "15.2 s after it turned NotReady" in e["message"]
        for e in events
    )
    assert forced_deletions() == before + 1


@pytest.mark.parametrize("status", ["draining", "not_ready", "failed"])
async def test_gateway_that_drains_the_pod_leaves_it_alone(
    kmock: kmock.KubernetesEmulator, rt: Runtime, status: str
) -> None:
    pod = unverified_pod()
    put(kmock, pod)
    async with serving(FakeRouter([engine_worker(status)])) as router:
        put(kmock, router_pod(router.port))
        later(rt, 20)
        due = await GatewayWatch(rt, check_seconds=3.0).step(pod)
        assert router.hits == 1
    assert due == 3.0  # it looks again in a few seconds
    assert requests(kmock, "DELETE") == [] and requests(kmock, "POST", "/events") == []


async def test_routers_are_not_asked_within_the_grace_period(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    pod = unverified_pod()
    put(kmock, pod)
    async with serving(FakeRouter([engine_worker("ready")])) as router:
        put(kmock, router_pod(router.port))
        later(rt, 5)
        due = await GatewayWatch(rt).step(pod)
        assert router.hits == 0
    assert due == pytest.approx(10.0)
    assert requests(kmock, "DELETE") == []


async def test_checks_are_spaced_by_the_check_interval(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    pod = unverified_pod()
    put(kmock, pod)
    async with serving(FakeRouter([engine_worker("draining")])) as router:
        put(kmock, router_pod(router.port))
        later(rt, 20)
        watch = GatewayWatch(rt, check_seconds=3.0)
        await watch.step(pod)
        due = await watch.step(pod)  # woken again at once (e.g. a pod event)
        assert router.hits == 1
    assert 0 < due <= 3.0


async def test_unreachable_router_never_deletes_the_pod(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    async with serving(FakeRouter()) as router:
        closed_port = router.port  # the router is gone: connection refused
    pod = unverified_pod()
    put(kmock, pod)
    put(kmock, router_pod(closed_port))
    later(rt, 60)
    watch = GatewayWatch(rt)
    await watch.step(pod)
    assert watch.last_decision is not None
    assert watch.last_decision.reason == GATEWAY_UNREACHABLE
    assert watch.last_decision.unreachable == ("router-a",)
    assert requests(kmock, "DELETE") == []


async def test_worker_of_a_new_pod_on_the_reused_ip_keeps_the_old_pod(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    pod = unverified_pod()
    put(kmock, pod)
    async with serving(FakeRouter([engine_worker("ready", uid="another-pod")])) as router:
        put(kmock, router_pod(router.port))
        later(rt, 20)
        await GatewayWatch(rt).step(pod)
        assert router.hits == 1
    assert requests(kmock, "DELETE") == []


async def test_verified_or_terminating_pod_is_not_watched(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    async with serving(FakeRouter([engine_worker("ready")])) as router:
        put(kmock, router_pod(router.port))
        later(rt, 60)
        verified = engine_pod(ENGINE_PORT)
        verified["status"]["conditions"].append(
            {"type": labels.ENGINE_VERIFIED, "status": "True", "lastTransitionTime": "x"}
        )
        terminating = unverified_pod()
        terminating["metadata"]["deletionTimestamp"] = "2026-11-05T12:00:30Z"
        assert await GatewayWatch(rt).step(verified) == math.inf
        assert await GatewayWatch(rt).step(terminating) == math.inf
        assert router.hits == 0
    assert requests(kmock, "DELETE") == []


async def test_read_workers_reports_a_non_json_answer_as_unreadable() -> None:
    async def garbage(_: web.Request) -> web.Response:
        return web.Response(text="<html>")

    app = web.Application()
    app.router.add_get("/workers", garbage)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        answer = await read_workers("router-a", f"http://127.0.0.1:{port}", timeout=2.0)
    finally:
        await runner.cleanup()
    assert answer.workers is None and answer.error is not None


async def wait_for(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met before the deadline"
        await asyncio.sleep(0.02)


async def test_verifier_loop_deletes_a_pod_the_gateway_ignores_and_stops_with_the_pod(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    pod = unverified_pod()
    put(kmock, pod)
    later(rt, 20)
    async with serving(FakeRouter([engine_worker("ready")])) as router:
        put(kmock, router_pod(router.port))
        engine_pods.on_pod_event(rt, "ADDED", pod)
        await wait_for(lambda: len(requests(kmock, "DELETE")) == 1)
        engine_pods.on_pod_event(rt, "DELETED", pod)
        task = rt.verifiers.get("pod-uid-1")
        assert task is None  # forgotten: the loop was cancelled with the pod
    assert requests(kmock, "DELETE")[0].data["preconditions"] == {"uid": "pod-uid-1"}
