"""Lightweight stand-in pods for the scale benchmark: one process plays a whole node of pods.

The loopback kubelet runs every container as a real process (a numpy reference engine, smg,
kvgate guard): right for the scenarios, far too heavy for thousands of pods on a 2-core
machine. This stand-in kubelet registers one Node (pool ``bench`` by default, capacity for
100,000 pods and GPUs), and for every pod bound to it:

* gives it an address from ``--ip-range`` (the whole range is routed to ``lo`` as local, so no
  ``ip addr`` per pod) and reports it Running with every container started and ready, its Ready
  condition computed from container readiness **and its readinessGates** as the kubelet does;
* answers, on that address and each container port, what the operator's probe reads:
  ``/server_info`` (and ``/get_server_info``), ``/v1/models``, ``/health``, from the engine
  container's own flags (``--context-length``, ``--disaggregation-mode``,
  ``--served-model-name``; the version from the image tag) with a KV pool of
  ``--pool-factor`` x the context length (an engine container's env ``KVGATE_STANDIN_POOL_FACTOR``
  overrides it for its pod: below 1, kvgate never verifies it); a router's ``/workers`` lists
  none;
* on deletion, stops at once (removes the pod with grace period 0).

All of it is one asyncio process (one aiohttp application, one wildcard listening socket per
port number, answering for the pod whose address the request came to; a pod gone answers 404).
A control listener on ``--control`` (``host:port``) lets the benchmark restart one engine:
``POST /restart?namespace=NS&pod=NAME&pool=TOKENS`` bumps the engine container's restartCount
(status patch), answers the new pool from then on, and returns the time the patch was
acknowledged; ``GET /stats`` returns probe counts. Nothing here checks what the operator does:
the benchmark reads the cluster.

Run inside the world's network namespace::

    python -m kvgate_e2e.standin --kubeconfig K --node bench-0 --node-ip 198.18.0.200 \
        --ip-range 198.18.128.0/17 --control 198.18.0.200:18999
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import resource
import subprocess
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from kvgate.api.labels import ENGINE_VERIFIED

from kvgate_e2e.kubelet.api import MERGE, ApiError, KubeApi, KubeConfig
from kvgate_e2e.kubelet.images import parse_image
from kvgate_e2e.kubelet.node import (
    LEASE_NAMESPACE,
    NodeSpec,
    lease_manifest,
    node_manifest,
    node_status,
)

log = logging.getLogger("kvgate.standin")
Pod = dict[str, Any]
HEARTBEAT_SECONDS = 10.0
# One page of 500 pods listed from the API server: it answers in well under a second; ends a
# request that hangs.
LIST_PAGE_TIMEOUT = 120


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def flag(args: Sequence[str], name: str) -> str | None:
    """The value of ``--name V`` or ``--name=V`` in an argv (pure)."""
    items = list(args)
    for i, item in enumerate(items):
        if item == name and i + 1 < len(items):
            return items[i + 1]
        if item.startswith(f"{name}="):
            return item.split("=", 1)[1]
    return None


@dataclass
class StandIn:
    """One pod as the stand-in plays it."""

    namespace: str
    name: str
    uid: str
    ip: str
    ports: tuple[int, ...]
    containers: tuple[str, ...]
    role: str | None  # prefill | decode for an engine pod, else None
    context_length: int = 0
    served_model: str = "model"
    version: str = "0.5.23"
    pool_tokens: int = 0
    restart_count: int = 0
    started_at: str = field(default_factory=now_rfc3339)
    ready: bool | None = None  # the Ready condition last written
    gate: bool = False  # kvgate's readiness gate True in the last pod seen from the watch
    probes: int = 0
    sites: list[web.TCPSite] = field(default_factory=list)

    def server_info(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "disaggregation_mode": self.role or "null",
            "served_model_name": self.served_model,
            "context_length": self.context_length,
            "max_total_num_tokens": self.pool_tokens,
            "max_req_input_len": min(self.context_length - 1, self.pool_tokens - 1) - 5,
            "internal_states": [{"memory_usage": {"token_capacity": self.pool_tokens}}],
        }

    def models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.served_model,
                    "object": "model",
                    "owned_by": "sglang",
                    "max_model_len": self.context_length,
                }
            ],
        }


POOL_FACTOR_ENV = "KVGATE_STANDIN_POOL_FACTOR"


def stand_in_for(pod: Pod, ip: str, pool_factor: float) -> StandIn:
    """How the stand-in plays this pod (pure): ports, containers, the engine's report."""
    meta, spec = pod["metadata"], pod.get("spec", {})
    containers = spec.get("containers", [])
    ports = sorted({int(p["containerPort"]) for c in containers for p in c.get("ports", []) or []})
    out = StandIn(
        namespace=meta["namespace"],
        name=meta["name"],
        uid=meta["uid"],
        ip=ip,
        ports=tuple(ports),
        containers=tuple(c["name"] for c in containers),
        role=None,
    )
    engine = next((c for c in containers if c.get("name") == "engine"), None)
    if engine is not None:
        argv = [*(engine.get("command") or []), *(engine.get("args") or [])]
        out.role = flag(argv, "--disaggregation-mode")
        out.context_length = int(flag(argv, "--context-length") or 0)
        out.served_model = flag(argv, "--served-model-name") or "model"
        out.version = (parse_image(engine.get("image", "")).tag or "v0.5.23").lstrip("v")
        env = {e.get("name"): e.get("value") for e in engine.get("env") or []}
        factor = float(env.get(POOL_FACTOR_ENV) or pool_factor)
        out.pool_tokens = int(out.context_length * factor)
    return out


def condition(pod: Pod, kind: str) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def stages(pods: Collection[StandIn]) -> dict[str, int]:
    """Where the pods this node plays are on their way to serving (pure), for the benchmark's
    account of a slow reconcile: bound here (``pods``), engines among them, engines whose
    Running status is written (``engines_running``), verified by kvgate (``engines_verified``,
    the gate seen True on the watch) and Ready (``engines_ready``); ``probes``: engine reads."""
    engines = [p for p in pods if p.role is not None]
    return {
        "pods": len(pods),
        "engines": len(engines),
        "engines_running": sum(1 for p in engines if p.ready is not None),
        "engines_verified": sum(1 for p in engines if p.gate),
        "engines_ready": sum(1 for p in engines if p.ready),
        "probes": sum(p.probes for p in engines),
    }


def needs_write(pod: Pod, s: StandIn) -> bool:
    """Whether the pod's status must be written (pure): its Ready would change, or it does not
    show the stand-in's address yet. Decided before a write slot is taken, so the events that
    need none (kvgate's gate patches, the stand-in's own echoes) never queue behind writes."""
    return ready_of(pod) != s.ready or (pod.get("status") or {}).get("podIP") != s.ip


def ready_of(pod: Pod) -> bool:
    """Ready as the kubelet rules it for a running stand-in: every readinessGate True."""
    gates = [g.get("conditionType") for g in pod.get("spec", {}).get("readinessGates") or []]
    return all(condition(pod, g) == "True" for g in gates)


def pod_status(pod: Pod, s: StandIn, node_ip: str) -> tuple[dict[str, Any], bool]:
    """The status patch for a running stand-in, and its Ready (pure): every container ready,
    and every readinessGate condition True (the kubelet's rule)."""
    ready = ready_of(pod)
    now = now_rfc3339()

    def cond(kind: str, ok: bool) -> dict[str, Any]:
        return {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": now}

    statuses = [
        {
            "name": name,
            "image": next(
                (c.get("image", "") for c in pod["spec"]["containers"] if c["name"] == name), ""
            ),
            "imageID": "",
            "containerID": f"standin://{s.uid}/{name}",
            "ready": True,
            "started": True,
            "restartCount": s.restart_count if name == "engine" else 0,
            "state": {"running": {"startedAt": s.started_at}},
        }
        for name in s.containers
    ]
    status = {
        "phase": "Running",
        "hostIP": node_ip,
        "podIP": s.ip,
        "podIPs": [{"ip": s.ip}],
        "startTime": s.started_at,
        "containerStatuses": statuses,
        "conditions": [
            cond("PodScheduled", True),
            cond("Initialized", True),
            cond("ContainersReady", True),
            cond("Ready", ready),
        ],
    }
    return status, ready


class StandInKubelet:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.node = NodeSpec(
            name=args.node, pool=args.pool, gpus=100_000, pods=100_000, cpu="10000", memory="100Ti"
        )
        net = ipaddress.IPv4Network(args.ip_range)
        self.free = list(net.hosts())[::-1]
        self.pods: dict[str, StandIn] = {}  # uid -> stand-in
        self.by_ip: dict[str, StandIn] = {}
        # One listener per port on every address (requests find their pod by the address they
        # came to): 9,000 pods' ports as ~14,000 sockets each exceeded the open-files limit once
        # the operator kept its connections alive.
        self.port_sites: dict[int, web.TCPSite] = {}
        self.app = web.Application()
        for path in ("/server_info", "/get_server_info"):
            self.app.router.add_get(path, self.server_info)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/workers", self.workers)
        self.app.router.add_route("*", "/{tail:.*}", self.ok)
        self.runner = web.AppRunner(self.app, access_log=None)
        self.api: KubeApi | None = None
        self.latest: dict[str, Pod] = {}  # uid -> newest body not yet written from
        self.writing: set[str] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.slots = asyncio.Semaphore(16)

    # -------------------------------------------------------------- engine answers
    def _pod(self, request: web.Request) -> StandIn | None:
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        return self.by_ip.get(sock[0]) if sock else None

    async def server_info(self, request: web.Request) -> web.Response:
        s = self._pod(request)
        if s is None or s.role is None:
            return web.json_response({"error": "not an engine"}, status=404)
        s.probes += 1
        return web.json_response(s.server_info())

    async def models(self, request: web.Request) -> web.Response:
        s = self._pod(request)
        if s is None or s.role is None:
            return web.json_response({"error": "not an engine"}, status=404)
        return web.json_response(s.models())

    async def workers(self, _: web.Request) -> web.Response:
        return web.json_response({"workers": [], "total": 0})

    async def ok(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    # -------------------------------------------------------------- node
    async def register(self, api: KubeApi) -> None:
        try:
            await api.create("/api/v1/nodes", node_manifest(self.node))
        except ApiError as exc:
            if exc.status != 409:
                raise
        await self.heartbeat_once(api)

    async def heartbeat_once(self, api: KubeApi) -> None:
        now = now_rfc3339()
        await api.patch(
            f"/api/v1/nodes/{self.node.name}/status",
            {"status": node_status(self.node, self.args.node_ip, now, now)},
        )
        node = await api.get(f"/api/v1/nodes/{self.node.name}")
        lease = lease_manifest(self.node.name, node["metadata"]["uid"], now_micro())
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        try:
            await api.create(path, lease)
        except ApiError as exc:
            if exc.status != 409:
                raise
            await api.patch(f"{path}/{self.node.name}", {"spec": lease["spec"]}, MERGE)

    async def heartbeat(self, api: KubeApi) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                await self.heartbeat_once(api)
            except Exception as exc:  # the next beat tries again
                log.warning("heartbeat failed: %s", exc)

    # -------------------------------------------------------------- pods
    async def watch(self, api: KubeApi) -> None:
        """List the node's pods, then watch them, resuming each watch from the last version
        seen (as the kubelet's informer does). It lists again only after 410 Gone: a re-list of
        thousands of pods every time the server ends a watch (240 s) loaded the API server the
        benchmark measures, queued a status check for every pod, and once timed out and ended
        the stand-in (a 1,000-ModelDeployment benchmark run)."""
        path = "/api/v1/pods"
        params = {"fieldSelector": f"spec.nodeName={self.node.name}"}
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self.list_pods(api, path, params)
                async for event in api.watch(path, params, version):
                    obj = event.get("object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        await self.on_pod(event["type"], obj)
            except ApiError as exc:
                if exc.status == 410:
                    version = None  # too old: list again
                else:
                    log.warning("watch failed: %s", exc)
                    await asyncio.sleep(1)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.warning("watch broke (%r): resuming", exc)
                await asyncio.sleep(1)

    async def list_pods(self, api: KubeApi, path: str, params: dict[str, str]) -> str:
        """Every pod bound to the node, in pages of 500; forgets those no longer listed.
        Returns the list's resourceVersion."""
        listed: set[str] = set()
        token = ""
        while True:
            query = {**params, "limit": "500", **({"continue": token} if token else {})}
            page = await api.request("GET", path, params=query, timeout=LIST_PAGE_TIMEOUT)
            for pod in page.get("items", []):
                listed.add(pod["metadata"]["uid"])
                await self.on_pod("ADDED", pod)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                break
        for uid in [uid for uid in self.pods if uid not in listed]:
            await self.forget(uid)
        return str(meta["resourceVersion"])

    async def on_pod(self, kind: str, pod: Pod) -> None:
        assert self.api is not None
        meta = pod["metadata"]
        uid = meta["uid"]
        if kind == "DELETED":
            await self.forget(uid)
            return
        if meta.get("deletionTimestamp"):
            await self.forget(uid)
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
            body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
            try:
                await self.api.delete(path, body)
            except ApiError as exc:
                if exc.status not in (404, 409):
                    log.warning("could not remove %s: %s", meta["name"], exc)
            return
        s = self.pods.get(uid)
        if s is None:
            s = stand_in_for(pod, str(self.free.pop()), self.args.pool_factor)
            self.pods[uid] = s
            self.by_ip[s.ip] = s
            for port in s.ports:
                if port in self.port_sites:
                    continue  # one wildcard listener serves this port for every pod
                try:
                    site = web.TCPSite(self.runner, "0.0.0.0", port, reuse_address=True)
                    await site.start()
                    self.port_sites[port] = site
                except OSError:  # the port is taken on some address: listen per pod
                    site = web.TCPSite(self.runner, s.ip, port, reuse_address=True)
                    await site.start()
                    s.sites.append(site)
        s.gate = condition(pod, ENGINE_VERIFIED) == "True"
        # Status writes run beside the watch (one at a time per pod, with its latest body), so
        # thousands of new pods do not queue behind each other's PATCH.
        self.latest[uid] = pod
        if uid not in self.writing:
            self.writing.add(uid)
            task = asyncio.create_task(self._write_latest(uid))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _write_latest(self, uid: str) -> None:
        try:
            while (pod := self.latest.pop(uid, None)) is not None:
                s = self.pods.get(uid)
                if s is None:
                    return
                if not needs_write(pod, s):  # most events (e.g. kvgate's gate patch) need none
                    continue
                async with self.slots:
                    await self.write_status(pod, s)
        finally:
            self.writing.discard(uid)

    async def write_status(self, pod: Pod, s: StandIn, force: bool = False) -> float | None:
        assert self.api is not None
        if not force and not needs_write(pod, s):
            return None
        status, ready = pod_status(pod, s, self.args.node_ip)
        path = f"/api/v1/namespaces/{s.namespace}/pods/{s.name}/status"
        patch = {"metadata": {"uid": s.uid}, "status": status}
        try:
            await self.api.patch(path, patch)
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("status of %s: %s", s.name, exc)
            return None
        s.ready = ready
        return time.time()

    async def forget(self, uid: str) -> None:
        self.latest.pop(uid, None)
        s = self.pods.pop(uid, None)
        if s is None:
            return
        self.by_ip.pop(s.ip, None)
        for site in s.sites:
            await site.stop()
        self.free.append(ipaddress.IPv4Address(s.ip))

    # -------------------------------------------------------------- control
    async def restart(self, request: web.Request) -> web.Response:
        """Restart one engine: new restartCount (and pool, if given); returns when the status
        patch was acknowledged (epoch seconds)."""
        assert self.api is not None
        ns, name = request.query["namespace"], request.query["pod"]
        s = next((p for p in self.pods.values() if p.namespace == ns and p.name == name), None)
        if s is None:
            return web.json_response({"error": f"no stand-in pod {ns}/{name}"}, status=404)
        pod = await self.api.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        s.restart_count += 1
        s.started_at = now_rfc3339()
        if "pool" in request.query:
            s.pool_tokens = int(request.query["pool"])
        acknowledged = await self.write_status(pod, s, force=True)
        return web.json_response({"acknowledged": acknowledged, "restartCount": s.restart_count})

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response({**stages(self.pods.values()), "writes": len(self.writing)})

    async def run(self) -> None:
        await self.runner.setup()
        control = web.Application()
        control.router.add_post("/restart", self.restart)
        control.router.add_get("/stats", self.stats)
        control_runner = web.AppRunner(control, access_log=None)
        await control_runner.setup()
        host, port = self.args.control.rsplit(":", 1)
        async with KubeApi(KubeConfig(Path(self.args.kubeconfig))) as api:
            self.api = api
            await self.register(api)
            await web.TCPSite(control_runner, host, int(port)).start()
            print(json.dumps({"ready": True, "node": self.node.name}), flush=True)
            await asyncio.gather(self.heartbeat(api), self.watch(api))


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def raise_open_files_limit() -> int:
    """One listening socket per pod port: 1,000 ModelDeployments of 8 engines are ~22,000
    sockets, over a typical hard limit of 20,000. As root (the benchmark's netns), raise the hard
    limit to the kernel's fs.nr_open; otherwise use the hard limit. Returns the limit set."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        wanted = int(Path("/proc/sys/fs/nr_open").read_text().split()[0])
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, wanted))
        return wanted
    except (OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard


def route_range_to_lo(ip_range: str) -> None:
    """Every address of the range is local on ``lo`` (one route, not one address per pod)."""
    subprocess.run(["ip", "route", "replace", "local", ip_range, "dev", "lo"], check=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvgate_e2e.standin")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node", default="kvgate-bench-0")
    parser.add_argument("--pool", default="bench")
    parser.add_argument("--node-ip", required=True)
    parser.add_argument("--ip-range", default="198.18.128.0/17")
    parser.add_argument("--control", required=True, help="host:port of the control listener")
    parser.add_argument("--pool-factor", type=float, default=2.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    raise_open_files_limit()
    route_range_to_lo(args.ip_range)
    asyncio.run(StandInKubelet(args).run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
