"""The loopback kubelet: simulated GPU Nodes whose pods run as local processes.

Runs inside the e2e network namespace with the admin kubeconfig. It registers Nodes (GPU capacity,
a node-pool label and a simulated GPU memory size), heartbeats their Leases, and for every pod
bound to them allocates a pod IP, runs the containers as local processes bound to that IP (images
map to programs, see ``kubelet_images``), probes them, computes Ready from container readiness and
every readiness gate exactly as the kubelet does (``kubelet_readiness``), restarts per
restartPolicy with back-off, and on deletion stops the processes and finishes the deletion.

Container logs: each container instance's stdout and stderr are framed into a CRI log per
restart (``kubelet_logs``, ``kubelet_processes``) and, when the config names the run's CA, served
as the kubelet serves them on each node's InternalIP, port 10250, over HTTPS with a client
certificate required (``kubelet_log_server``), so ``kubectl logs [-f] [--previous]`` and the
``pods/log`` API work.

Three ways to run it:

* ``python -m kvgate_e2e.kubelet --kubeconfig K --node big:gpus=8:gpu-memory-gib=80 ...``
  (inside the namespace, e.g. ``cluster.popen_in_netns([...])``); prints ``kvgate-kubelet: ready``
  once its Nodes are registered; SIGTERM/SIGINT stop every pod process and exit.
* ``KubeletThread(config, addresses, netns_path)``: the same in a background thread of the test
  process whose network namespace is switched (only that thread's) with ``setns(2)``.
* ``await LoopbackKubelet(config, addresses).run()`` in an event loop already in the namespace.

Simulating an engine restart with different GPU memory (``restart_container``): set the node's
``kvgate.io/gpu-memory-gib`` annotation, then kill the container's process; the kubelet restarts
it per restartPolicy and the new process reads the node's new value. From outside, the same works
with ``kubectl annotate node N kvgate.io/gpu-memory-gib=16 --overwrite`` and a SIGKILL to the PID
in ``containerStatuses[].containerID`` (``loopback://<pid>``, see ``container_pid``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from kvgate_e2e.cluster_like import ClusterLike
from kvgate_e2e.kubelet.api import MERGE, ApiError, KubeApi, KubeConfig
from kvgate_e2e.kubelet.hosts import PodHosts
from kvgate_e2e.kubelet.log_server import KUBELET_PORT, KubeletServer, server_ssl_context
from kvgate_e2e.kubelet.mounts import MountPoints
from kvgate_e2e.kubelet.node import (
    GPU_MEMORY_KEY,
    LEASE_NAMESPACE,
    NodeSpec,
    NodeSpecError,
    format_gib,
    gpu_memory_from_node,
    lease_manifest,
    node_manifest,
    node_status,
    parse_node_spec,
)
from kvgate_e2e.kubelet.pod_status import now_micro, now_rfc3339
from kvgate_e2e.kubelet.runtime import AddressPool, PodWorker, RuntimeSettings
from kvgate_e2e.netns import IP_COMMAND_TIMEOUT, enter_netns_thread
from kvgate_e2e.pki import issue_kubelet_serving, load_ca

log = logging.getLogger("kvgate_e2e.kubelet")

BACKOFF_ENV = "KVGATE_KUBELET_BACKOFF_SECONDS"
BACKOFF_MAX_ENV = "KVGATE_KUBELET_BACKOFF_MAX_SECONDS"
READY_LINE = "kvgate-kubelet: ready"
KEEP_RUN_DIR_ENV = "KVGATE_E2E_KEEP_RUN_DIR"
# Every pod worker ended once the kubelet stops: the 5 s grace _stop_pods gives, then the kill.
PODS_STOP_TIMEOUT = 30


class Addresses(AddressPool, Protocol):
    """Pod and node addresses on the namespace's ``lo`` (``kvgate_e2e.cluster.Cluster`` has
    these methods)."""

    def add_node_ip(self) -> ipaddress.IPv4Address: ...


class LocalAddresses:
    """Allocates from inclusive ranges and adds/removes /32s on ``lo`` of the *current* network
    namespace (for the CLI, which runs inside the e2e namespace)."""

    def __init__(
        self,
        pod_range: tuple[ipaddress.IPv4Address, ipaddress.IPv4Address],
        node_range: tuple[ipaddress.IPv4Address, ipaddress.IPv4Address],
    ) -> None:
        self._ranges = {"pod": pod_range, "node": node_range}
        self._next = {"pod": int(pod_range[0]), "node": int(node_range[0])}
        self._free: dict[str, list[ipaddress.IPv4Address]] = {"pod": [], "node": []}
        self._lock = threading.Lock()

    def _allocate(self, kind: str) -> ipaddress.IPv4Address:
        with self._lock:
            if self._free[kind]:
                addr = self._free[kind].pop(0)
            else:
                while True:
                    if self._next[kind] > int(self._ranges[kind][1]):
                        raise RuntimeError(
                            f"{kind} IP range {self._ranges[kind][0]}-{self._ranges[kind][1]} "
                            "is exhausted; widen --pod-ip-range/--node-ip-range"
                        )
                    addr = ipaddress.IPv4Address(self._next[kind])
                    self._next[kind] += 1
                    if int(addr) & 0xFF not in (0, 255):
                        break
        _ip(["addr", "add", f"{addr}/32", "dev", "lo"])
        return addr

    def add_pod_ip(self) -> ipaddress.IPv4Address:
        return self._allocate("pod")

    def add_node_ip(self) -> ipaddress.IPv4Address:
        return self._allocate("node")

    def release_pod_ip(self, addr: ipaddress.IPv4Address) -> None:
        _ip(["addr", "del", f"{addr}/32", "dev", "lo"], check=False)
        with self._lock:
            self._free["pod"].append(addr)


def _ip(args: Sequence[str], check: bool = True) -> None:
    proc = subprocess.run(
        ["ip", *args], capture_output=True, text=True, check=False, timeout=IP_COMMAND_TIMEOUT
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")


@dataclass
class KubeletConfig:
    kubeconfig: Path
    nodes: Sequence[NodeSpec]
    run_dir: Path | None = None
    python: str = sys.executable
    venv_bin: str = str(Path(sys.executable).parent)
    backoff_initial: float = field(default_factory=lambda: float(os.environ.get(BACKOFF_ENV, 10)))
    backoff_max: float = field(default_factory=lambda: float(os.environ.get(BACKOFF_MAX_ENV, 300)))
    lease_interval: float = 10.0
    node_status_interval: float = 60.0
    mount_namespaces: bool = True
    # The run's CA: the kubelet's HTTPS port (containerLogs) serves with a certificate it signs
    # for the nodes' InternalIPs and accepts client certificates it signed. None: no port.
    ca_cert: Path | None = None
    ca_key: Path | None = None
    kubelet_port: int = KUBELET_PORT


def container_pid(pod: Mapping[str, Any], container: str) -> int | None:
    """PID of a running container from ``containerStatuses[].containerID`` (``loopback://<pid>``)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == container and "running" in (status.get("state") or {}):
            cid = str(status.get("containerID") or "")
            if cid.startswith("loopback://") and cid[len("loopback://") :].isdigit():
                return int(cid[len("loopback://") :])
    return None


class LoopbackKubelet:
    """Registers ``config.nodes`` and runs the pods bound to them until ``stop()``."""

    def __init__(self, config: KubeletConfig, addresses: Addresses) -> None:
        self.config = config
        self._addresses = addresses
        self._run_dir_owned = config.run_dir is None
        self.run_dir = config.run_dir or Path(tempfile.mkdtemp(prefix="kvgate-kubelet-"))
        self.workers: dict[str, PodWorker] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._node_ips: dict[str, str] = {}
        self._node_uids: dict[str, str] = {}
        self._specs = {n.name: n for n in config.nodes}
        self._stop = asyncio.Event()
        self.ready = asyncio.Event()
        self._api: KubeApi | None = None
        self._probe_session: aiohttp.ClientSession | None = None
        self._registered_at = now_rfc3339()
        self._side_tasks: set[asyncio.Task[None]] = set()
        self._settings: RuntimeSettings | None = None
        self._server: KubeletServer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    # ------------------------------------------------------------ PodHost
    @property
    def addresses(self) -> Addresses:
        return self._addresses

    @property
    def api(self) -> KubeApi:
        if self._api is None:
            raise RuntimeError("kubelet not running")
        return self._api

    @property
    def settings(self) -> RuntimeSettings:
        if self._settings is None:
            raise RuntimeError("kubelet not running")
        return self._settings

    @property
    def probe_session(self) -> aiohttp.ClientSession:
        if self._probe_session is None:
            raise RuntimeError("kubelet not running")
        return self._probe_session

    async def gpu_memory_gib(self, node: str) -> float:
        default = self._specs[node].gpu_memory_gib
        try:
            return gpu_memory_from_node(await self.api.get(f"/api/v1/nodes/{node}"), default)
        except (ApiError, aiohttp.ClientError, TimeoutError):
            return default

    def node_ip(self, node: str) -> str:
        return self._node_ips[node]

    def worker_done(self, uid: str) -> None:
        self.workers.pop(uid, None)
        self._tasks.pop(uid, None)

    # ------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        """Register the nodes, run pods until ``stop()``; then stop every pod process."""
        self.loop = asyncio.get_running_loop()
        cfg = KubeConfig(self.config.kubeconfig)
        async with (
            KubeApi(cfg) as api,
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True, limit=0)
            ) as probes,
        ):
            self._api = api
            self._probe_session = probes
            self._settings = RuntimeSettings(
                run_dir=self.run_dir,
                python=self.config.python,
                venv_bin=self.config.venv_bin,
                ca_pem=cfg.ca_pem,
                service_env=await self._service_env(),
                backoff_initial=self.config.backoff_initial,
                backoff_max=self.config.backoff_max,
                mount_namespaces=self.config.mount_namespaces,
                mount_points=MountPoints(),
                pod_hosts=(
                    PodHosts(self.run_dir / "hosts") if self.config.mount_namespaces else None
                ),
            )
            background: list[asyncio.Task[None]] = []
            try:
                for spec in self.config.nodes:
                    await self._register(spec)
                await self._start_server(api)
                for spec in self.config.nodes:
                    background.append(asyncio.create_task(self._heartbeat(spec)))
                    background.append(asyncio.create_task(self._watch_pods(spec.name)))
                self.ready.set()
                log.info("registered nodes %s", ", ".join(self._node_ips))
                await self._stop.wait()
            finally:
                for task in background:
                    task.cancel()
                await asyncio.gather(*background, return_exceptions=True)
                if self._server is not None:
                    await self._server.stop()
                    self._server = None
                await self._stop_pods()
                self.settings.mount_points.cleanup()
                self._api = None
                if self._run_dir_owned and not os.environ.get(KEEP_RUN_DIR_ENV):
                    shutil.rmtree(self.run_dir, ignore_errors=True)

    async def _start_server(self, api: KubeApi) -> None:
        """The HTTPS port of every node (``containerLogs``), when the config names the CA."""
        if self.config.ca_cert is None or self.config.ca_key is None:
            return
        ca = await asyncio.to_thread(load_ca, self.config.ca_cert, self.config.ca_key)
        files = await asyncio.to_thread(
            issue_kubelet_serving,
            ca,
            self.run_dir / "pki",
            node_names=list(self._node_ips),
            node_ips=list(self._node_ips.values()),
        )
        server = KubeletServer(
            api,
            self.find_node_worker,
            server_ssl_context(files.cert, files.key, self.config.ca_cert),
            self.config.kubelet_port,
        )
        await server.start(self._node_ips)
        self._server = server

    def find_node_worker(self, node: str, namespace: str, name: str) -> PodWorker | None:
        """The worker of pod ``namespace/name`` on ``node`` (the one not being deleted first)."""
        found = [
            w
            for w in self.workers.values()
            if w.node == node and w.namespace == namespace and w.name == name
        ]
        found.sort(key=lambda w: bool(w.pod["metadata"].get("deletionTimestamp")))
        return found[0] if found else None

    def stop(self) -> None:
        """Ask ``run()`` to finish (thread-safe)."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._stop.set)

    async def _stop_pods(self) -> None:
        for worker in list(self.workers.values()):
            worker.deleted(grace=5.0)
        tasks = list(self._tasks.values())
        if tasks:
            await asyncio.wait(tasks, timeout=PODS_STOP_TIMEOUT)

    async def _service_env(self) -> dict[str, str]:
        svc = await self.api.get("/api/v1/namespaces/default/services/kubernetes")
        ip = str(svc["spec"]["clusterIP"])
        port = str(svc["spec"]["ports"][0]["port"])
        return {
            "KUBERNETES_SERVICE_HOST": ip,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{ip}:{port}",
            f"KUBERNETES_PORT_{port}_TCP": f"tcp://{ip}:{port}",
            f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp",
            f"KUBERNETES_PORT_{port}_TCP_ADDR": ip,
            f"KUBERNETES_PORT_{port}_TCP_PORT": port,
        }

    # ------------------------------------------------------------ nodes
    async def _register(self, spec: NodeSpec) -> None:
        manifest = node_manifest(spec)
        try:
            node = await self.api.create("/api/v1/nodes", manifest)
        except ApiError as exc:
            if exc.status != 409:
                raise
            node = await self.api.patch(
                f"/api/v1/nodes/{spec.name}", {"metadata": manifest["metadata"]}, MERGE
            )
        self._node_uids[spec.name] = node["metadata"]["uid"]
        existing = [
            a["address"]
            for a in (node.get("status") or {}).get("addresses") or []
            if a.get("type") == "InternalIP"
        ]
        if spec.name not in self._node_ips:
            self._node_ips[spec.name] = str(await asyncio.to_thread(self.addresses.add_node_ip))
        if existing and existing[0] != self._node_ips[spec.name]:
            log.info(
                "node %s: InternalIP %s -> %s", spec.name, existing[0], self._node_ips[spec.name]
            )
        self._registered_at = now_rfc3339()
        await self._patch_node_status(spec)
        lease = lease_manifest(spec.name, self._node_uids[spec.name], now_micro())
        try:
            await self.api.create(
                f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases", lease
            )
        except ApiError as exc:
            if exc.status != 409:
                raise
            await self._renew_lease(spec.name)

    async def _patch_node_status(self, spec: NodeSpec) -> None:
        status = node_status(spec, self._node_ips[spec.name], self._registered_at, now_rfc3339())
        await self.api.patch(f"/api/v1/nodes/{spec.name}/status", {"status": status})

    async def _renew_lease(self, node: str) -> None:
        body = {"spec": {"holderIdentity": node, "renewTime": now_micro()}}
        await self.api.patch(
            f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node}", body, MERGE
        )

    async def _heartbeat(self, spec: NodeSpec) -> None:
        since_status = 0.0
        while True:
            await asyncio.sleep(self.config.lease_interval)
            since_status += self.config.lease_interval
            try:
                await self._renew_lease(spec.name)
                if since_status >= self.config.node_status_interval:
                    since_status = 0.0
                    await self._patch_node_status(spec)
            except ApiError as exc:
                if exc.status == 404:
                    log.warning("node %s or its lease vanished; registering again", spec.name)
                    with contextlib.suppress(ApiError, aiohttp.ClientError):
                        await self._register(spec)
                else:
                    log.warning("node %s heartbeat failed: %s", spec.name, exc)
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("node %s heartbeat failed: %s", spec.name, exc)

    async def set_gpu_memory(self, node: str, gib: float) -> None:
        """Change a node's simulated GPU memory (read by every container started afterwards)."""
        value = format_gib(gib)
        body = {
            "metadata": {"annotations": {GPU_MEMORY_KEY: value}, "labels": {GPU_MEMORY_KEY: value}}
        }
        await self.api.patch(f"/api/v1/nodes/{node}", body, MERGE)

    # ------------------------------------------------------------ pods
    async def _watch_pods(self, node: str) -> None:
        params = {"fieldSelector": f"spec.nodeName={node}"}
        delay = 0.5
        while True:
            try:
                listing = await self.api.get("/api/v1/pods", params)
                seen = set()
                for pod in listing.get("items") or []:
                    seen.add(pod["metadata"]["uid"])
                    self._on_pod("MODIFIED", pod)
                for uid, worker in list(self.workers.items()):
                    if worker.node == node and uid not in seen:
                        worker.deleted()
                rv = str(listing["metadata"]["resourceVersion"])
                while True:
                    async for event in self.api.watch("/api/v1/pods", params, rv):
                        obj = event["object"]
                        rv = str(obj["metadata"].get("resourceVersion") or rv)
                        if event["type"] != "BOOKMARK":
                            self._on_pod(event["type"], obj)
                    delay = 0.5
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not (isinstance(exc, ApiError) and exc.status == 410):
                    log.warning("pod watch on %s: %s; relisting in %.1fs", node, exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if kind == "DELETED":
            if worker is not None:
                worker.deleted()
            return
        if worker is not None:
            worker.update(pod)
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            if pod["metadata"].get("deletionTimestamp"):
                self._spawn_side_task(self._delete_now(pod))
            return
        if pod["metadata"].get("deletionTimestamp"):
            # Nothing of it runs here: finish the deletion at once (as kwok does).
            self._spawn_side_task(self._delete_now(pod))
            return
        worker = PodWorker(self, pod)
        self.workers[uid] = worker
        self._tasks[uid] = asyncio.create_task(worker.run(), name=f"pod-{worker.key}")

    def _spawn_side_task(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    async def _delete_now(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        with contextlib.suppress(ApiError, aiohttp.ClientError):
            await self.api.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body
            )

    def find_worker(self, namespace: str, name: str) -> PodWorker | None:
        for worker in self.workers.values():
            if worker.namespace == namespace and worker.name == name:
                return worker
        return None

    async def restart_container(
        self, namespace: str, pod: str, container: str, *, gpu_memory_gib: float | None = None
    ) -> int | None:
        """Simulate an engine crash: optionally change the node's GPU memory first, then SIGKILL
        the container; restartPolicy restarts it (reading the new GPU memory). Returns the killed
        PID, or None if the container was not running."""
        worker = self.find_worker(namespace, pod)
        if worker is None:
            raise LookupError(f"pod {namespace}/{pod} does not run on this kubelet")
        if gpu_memory_gib is not None:
            await self.set_gpu_memory(worker.node, gpu_memory_gib)
        return worker.kill_container(container)

    def log_path(self, namespace: str, pod: str, container: str) -> Path | None:
        worker = self.find_worker(namespace, pod)
        return worker.log_path(container) if worker is not None else None


class KubeletThread:
    """Runs a ``LoopbackKubelet`` on its own event loop in a thread that has joined the network
    namespace at ``netns_path`` (``setns`` changes only that thread; processes it starts inherit
    it). ``with KubeletThread(...) as kubelet:``; ``call(coro)`` runs a coroutine on its loop."""

    def __init__(
        self, config: KubeletConfig, addresses: Addresses, netns_path: Path | None
    ) -> None:
        self.kubelet = LoopbackKubelet(config, addresses)
        self._netns_path = netns_path
        self._thread = threading.Thread(target=self._main, name="loopback-kubelet", daemon=True)
        self._started = threading.Event()
        self._error: BaseException | None = None

    @classmethod
    def for_cluster(
        cls,
        cluster: ClusterLike,
        nodes: Sequence[NodeSpec | str],
        *,
        backoff_initial: float | None = None,
        backoff_max: float | None = None,
    ) -> KubeletThread:
        """A kubelet for ``cluster``'s nodes ``nodes`` (``NodeSpec`` or ``--node`` syntax), with
        its run dir under the cluster's and pod/node IPs from the cluster's allocators."""
        config = KubeletConfig(
            kubeconfig=cluster.kubeconfig,
            nodes=[n if isinstance(n, NodeSpec) else parse_node_spec(n) for n in nodes],
            run_dir=cluster.run_dir / "kubelet",
            ca_cert=cluster.pki.ca_cert,
            ca_key=cluster.pki.ca_key,
        )
        if backoff_initial is not None:
            config.backoff_initial = backoff_initial
        if backoff_max is not None:
            config.backoff_max = backoff_max
        return cls(config, cluster, Path("/run/netns") / cluster.netns_name)

    def _main(self) -> None:
        try:
            if self._netns_path is not None:
                enter_netns_thread(self._netns_path)
            asyncio.run(self._run())
        except BaseException as exc:
            self._error = exc
            self._started.set()

    async def _run(self) -> None:
        task = asyncio.create_task(self.kubelet.run())
        ready = asyncio.create_task(self.kubelet.ready.wait())
        await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if task.done() and not ready.done():
            # run() ended before the nodes were registered: record why before start() looks,
            # or start() could return on a dead kubelet (the world then waited for pods that
            # no kubelet would ever run, and timed out on the operator's rollout).
            ready.cancel()
            exc = task.exception() if not task.cancelled() else None
            self._error = exc or RuntimeError("loopback kubelet exited before registering")
            self._started.set()
            return
        self._started.set()
        await task

    def start(self, timeout: float = 60.0) -> None:
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"loopback kubelet did not register its nodes within {timeout:.0f}s")
        if self._error is not None:
            raise RuntimeError(f"loopback kubelet failed to start: {self._error}") from self._error
        if not self._thread.is_alive():
            raise RuntimeError("loopback kubelet exited during start-up")

    def stop(self, timeout: float = 60.0) -> None:
        self.kubelet.stop()
        self._thread.join(timeout)

    def call(self, coro: Any, timeout: float = 30.0) -> Any:
        """Run ``coro`` on the kubelet's loop and return its result."""
        loop = self.kubelet.loop
        if loop is None:
            raise RuntimeError("kubelet not running")
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    def __enter__(self) -> KubeletThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _ip_range(text: str) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    first, sep, last = text.partition("-")
    if not sep:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected FIRST-LAST, e.g. 198.18.1.0-198.18.255.254"
        )
    return ipaddress.IPv4Address(first), ipaddress.IPv4Address(last)


def _node(text: str) -> NodeSpec:
    try:
        return parse_node_spec(text)
    except NodeSpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kvgate_e2e.kubelet",
        description="Loopback kubelet: simulated GPU nodes whose pods run as local processes.",
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument(
        "--node",
        type=_node,
        action="append",
        required=True,
        help="NAME[:gpus=N][:gpu-memory-gib=G][:pool=P][:cpu=C][:memory=M][:pods=N] (repeatable)",
    )
    parser.add_argument("--run-dir", type=Path, help="pod logs and volumes (default: a temp dir)")
    parser.add_argument(
        "--pod-ip-range", type=_ip_range, default=_ip_range("198.18.1.0-198.18.255.254")
    )
    parser.add_argument(
        "--node-ip-range", type=_ip_range, default=_ip_range("198.18.0.10-198.18.0.254")
    )
    parser.add_argument(
        "--ca-cert", type=Path, help="the cluster CA: serve containerLogs on port 10250"
    )
    parser.add_argument("--ca-key", type=Path, help="the cluster CA's key (with --ca-cert)")
    parser.add_argument("--log-level", default="INFO")
    opts = parser.parse_args(argv)
    logging.basicConfig(
        level=opts.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    names = [n.name for n in opts.node]
    if len(set(names)) != len(names):
        parser.error(f"--node names must be unique: {', '.join(names)}")
    if (opts.ca_cert is None) != (opts.ca_key is None):
        parser.error("--ca-cert and --ca-key go together")
    config = KubeletConfig(
        kubeconfig=opts.kubeconfig,
        nodes=opts.node,
        run_dir=opts.run_dir,
        ca_cert=opts.ca_cert,
        ca_key=opts.ca_key,
    )
    kubelet = LoopbackKubelet(config, LocalAddresses(opts.pod_ip_range, opts.node_ip_range))

    async def amain() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, kubelet.stop)
        task = asyncio.create_task(kubelet.run())
        ready = asyncio.create_task(kubelet.ready.wait())
        await asyncio.wait({task, ready}, return_when=asyncio.FIRST_COMPLETED)
        if ready.done():
            print(READY_LINE, flush=True)
        await task

    asyncio.run(amain())
    return 0


if __name__ == "__main__":
    sys.exit(main())
