"""One pod's lifecycle on the loopback kubelet: start, restart, probe and stop its containers.

A ``PodWorker`` owns everything of one pod UID and drives it; each seam has its own module:
the volume material (``kubelet_volumes``), the bind mounts of a container's mount namespace
(``kubelet_mounts``), its environment (``kubelet_env``), its process (``kubelet_processes``), one
probe (``kubelet_probes``) and the ``pods/status`` patch (``kubelet_pod_status``, written here
conditionally on the pod's resourceVersion). Containers are local processes (see
``kubelet_images``), each in its own mount namespace (``unshare --mount``) where the pod's volumes
(the projected service-account volume the ServiceAccount admission plugin adds, secrets, config
maps, emptyDirs, hostPaths and claims of local PersistentVolumes) are bind-mounted at their
``mountPath``.

Init containers run in order, as ``computeInitContainerActions``
(``pkg/kubelet/kuberuntime/kuberuntime_container.go``) runs them: a regular one to completion; a
restartable one (``restartPolicy: Always``, a native sidecar, KEP-753) is started, and the next
init container starts once it has started (its startupProbe passed, when it has one). Sidecars are
probed like regular containers, restarted whenever they exit (with the crash-loop back-off, also
under a pod restartPolicy of Never), their readiness counts toward ContainersReady and Ready, and
on termination they are stopped after every regular container, in reverse order, within what is
left of the grace period (at least 2 s), as ``kuberuntime_termination_order.go`` does. A process
that exits on SIGTERM is reported at once; a later deletion with a shorter grace period (``kubectl
delete --grace-period=1`` of a terminating pod) moves the SIGKILL of every process still running to
that many seconds from then, as the kubelet's pod workers do (a grace period only ever decreases).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import shutil
import signal
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from kvgate_e2e.kubelet.api import ApiError, KubeApi
from kvgate_e2e.kubelet.env import container_env
from kvgate_e2e.kubelet.hosts import PodHosts, pod_host_names
from kvgate_e2e.kubelet.images import ImageError, expand_vars, image_kind, launch_for
from kvgate_e2e.kubelet.logs import ContainerLogError, container_id_for_logs
from kvgate_e2e.kubelet.mounts import (
    MountPoints,
    container_mounts,
    in_mount_namespace,
    order_mounts,
    read_only_targets,
)
from kvgate_e2e.kubelet.pod_status import now_rfc3339, pod_status_patch
from kvgate_e2e.kubelet.podspec import PodSpecError, ProbeSettings, probe_settings
from kvgate_e2e.kubelet.probes import probe_once
from kvgate_e2e.kubelet.processes import (
    ContainerLog,
    ContainerProcess,
    KillDeadline,
    signal_group,
    start_process,
    stop_process,
)
from kvgate_e2e.kubelet.readiness import kubelet_conditions_differ
from kvgate_e2e.kubelet.status import (
    RUNNING,
    TERMINATED,
    WAITING,
    ContainerRecord,
    container_status,
    exit_code_of,
    restart_delay,
    should_restart,
)
from kvgate_e2e.kubelet.volumes import write_volumes

log = logging.getLogger("kvgate_e2e.kubelet")

MIN_GRACE_SECONDS = 2.0  # minimumGracePeriodInSeconds of the kubelet's killContainer
# A pod's container loops and sidecar tasks ending once its processes were stopped (their grace
# period already waited): at once; ends a wait for a loop that hangs.
LOOPS_STOP_TIMEOUT = 10
VOLUME_RETRY_SECONDS = 1.0  # a period, not a deadline: a volume not ready is tried again


class AddressPool(Protocol):
    """Pod addresses on the namespace's ``lo`` (``Cluster`` implements this)."""

    def add_pod_ip(self) -> ipaddress.IPv4Address: ...

    def release_pod_ip(self, addr: ipaddress.IPv4Address) -> None: ...


@dataclass
class RuntimeSettings:
    """What every pod worker of one kubelet shares."""

    run_dir: Path
    python: str
    venv_bin: str
    ca_pem: bytes
    service_env: Mapping[str, str]
    backoff_initial: float = 10.0
    backoff_max: float = 300.0
    mount_namespaces: bool = True
    mount_points: MountPoints = field(default_factory=MountPoints)
    pod_hosts: PodHosts | None = None  # pods' hostnames, at /etc/hosts (kubelet_hosts)


class PodHost(Protocol):
    """What a pod worker needs from its kubelet."""

    @property
    def api(self) -> KubeApi: ...

    @property
    def settings(self) -> RuntimeSettings: ...

    @property
    def addresses(self) -> AddressPool: ...

    @property
    def probe_session(self) -> aiohttp.ClientSession: ...

    async def gpu_memory_gib(self, node: str) -> float: ...

    def node_ip(self, node: str) -> str: ...

    def worker_done(self, uid: str) -> None: ...


class PodWorker:
    """Runs one pod until it is deleted (or, for restartPolicy Never/OnFailure, completes)."""

    def __init__(self, host: PodHost, pod: dict[str, Any]) -> None:
        self.host = host
        self.pod = pod
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta["namespace"]
        self.name: str = meta["name"]
        self.node: str = pod["spec"]["nodeName"]
        self.dir = host.settings.run_dir / "pods" / f"{self.namespace}_{self.name}_{self.uid}"
        self.pod_ip: ipaddress.IPv4Address | None = None
        self.host_network = bool(pod["spec"].get("hostNetwork"))
        self.start_time: str | None = None
        self.records: dict[str, ContainerRecord] = {}
        self.init_records: dict[str, ContainerRecord] = {}
        self.procs: dict[str, ContainerProcess] = {}
        self.container_logs: dict[str, list[ContainerLog]] = {}  # every instance, oldest first
        self._dirty = asyncio.Event()
        self._terminate = asyncio.Event()
        self._grace: float = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        # A later, shorter grace period: every process still running is killed by then.
        self._kill_deadline = KillDeadline()
        self._force = False
        self._initialized = False
        self._last_patch: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._mounts: list[tuple[str, str]] = []
        self._volume_error: str = ""
        self._sidecars = [
            str(c["name"]) for c in pod["spec"].get("initContainers") or [] if is_sidecar(c)
        ]
        self._started_changed = asyncio.Event()
        self._sidecar_tasks: list[asyncio.Task[None]] = []
        for c in pod["spec"].get("initContainers") or []:
            self.init_records[c["name"]] = ContainerRecord(
                c["name"], c.get("image", ""), waiting_reason="PodInitializing"
            )
        for c in pod["spec"]["containers"]:
            self.records[c["name"]] = ContainerRecord(c["name"], c.get("image", ""))
        self._initialized = not self.init_records

    # ------------------------------------------------------------ events from the kubelet
    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def update(self, pod: dict[str, Any]) -> None:
        """A watch event for this pod: keep the newest view; gate changes re-evaluate Ready."""
        meta = pod["metadata"]
        if not _older(meta.get("resourceVersion"), self.pod["metadata"].get("resourceVersion")):
            self.pod = pod
        grace = meta.get("deletionGracePeriodSeconds")
        if meta.get("deletionTimestamp") and not self._terminate.is_set():
            if grace is not None:
                self._grace = float(grace)
            log.info("pod %s: deletion requested (grace %.0fs)", self.key, self._grace)
            self._terminate.set()
        elif meta.get("deletionTimestamp") and grace is not None:
            self._shorten_grace(float(grace))
        self._dirty.set()

    def deleted(self, grace: float = 0.0) -> None:
        """The pod object is gone (force delete) or the kubelet shuts down: stop the processes
        (SIGKILL after ``grace`` seconds, or sooner if a shorter grace is already running) and
        write nothing more to the API."""
        self._force = True
        if self._terminate.is_set():
            self._shorten_grace(grace)
        else:
            self._grace = grace
        self._terminate.set()

    def _shorten_grace(self, grace: float) -> None:
        """A deletion with a shorter grace period while the pod is terminating: as the kubelet's
        pod workers do (a grace period can only decrease), every process still running gets
        SIGKILL ``grace`` seconds from now, however long its first grace period was."""
        if grace >= self._grace:
            return
        if any(not proc.exited.done() for proc in self.procs.values()):
            log.info("pod %s: grace period shortened to %.0fs", self.key, grace)
        self._grace = grace
        self._kill_deadline.move_to(time.monotonic() + max(grace, 0.0))

    def kill_container(self, name: str, sig: int = signal.SIGKILL) -> int | None:
        """Signal one container's process group (tests use it to simulate an engine crash)."""
        proc = self.procs.get(name)
        if proc is None or proc.popen.poll() is not None:
            return None
        signal_group(proc, sig)
        return proc.popen.pid

    def log_path(self, container: str) -> Path:
        """Every instance's output, each after a ``=====`` header line (raw, untimed)."""
        return self.dir / f"{container}.log"

    def cri_log_path(self, container: str, restart_count: int) -> Path:
        """One instance's CRI log (timestamped records), named as the kubelet names it."""
        return self.dir / "logs" / container / f"{restart_count}.log"

    def has_container(self, name: str) -> bool:
        return name in self.records or name in self.init_records

    def container_log(self, container: str, *, previous: bool) -> ContainerLog:
        """The instance whose log ``kubectl logs [--previous]`` reads, picked from the container's
        status as the kubelet picks it; ContainerLogError with the kubelet's message if none."""
        rec = self.records.get(container) or self.init_records.get(container)
        status = container_status(rec) if rec is not None else None
        cid = container_id_for_logs(status, container, self.name, previous=previous)
        pid = cid.removeprefix("loopback://")
        for log_ in reversed(self.container_logs.get(container, [])):
            if str(log_.pid) == pid:
                return log_
        raise ContainerLogError(f"unable to retrieve container logs for {cid}")

    # ------------------------------------------------------------ main
    async def run(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._tasks.append(asyncio.create_task(self._status_loop(), name=f"status-{self.key}"))
            await self._setup_network()
            self.start_time = now_rfc3339()
            self._dirty.set()
            if not await self._setup_volumes_until_ready():
                return
            policy = self.pod["spec"].get("restartPolicy", "Always")
            if not await self._run_init_containers():
                await self._terminate.wait()
            else:
                loops = [
                    asyncio.create_task(
                        self._container_loop(c, self.records[c["name"]], policy),
                        name=f"ctr-{self.key}-{c['name']}",
                    )
                    for c in self.pod["spec"]["containers"]
                ]
                self._tasks += loops
                # Runs until deletion, also after every container finished for good.
                await self._terminate.wait()
                await self._stop_all(self._grace)
                await asyncio.wait([*loops, *self._sidecar_tasks], timeout=LOOPS_STOP_TIMEOUT)
            await self._stop_all(self._grace)
            if not self._force:
                await self._write_status(force=True)
                await self._finish_deletion()
        except asyncio.CancelledError:
            await self._stop_all(0)
            raise
        except Exception:
            log.exception("pod %s: worker failed", self.key)
            await self._stop_all(0)
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            self._cleanup()
            self.host.worker_done(self.uid)

    async def _finish_deletion(self) -> None:
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": self.uid}}
        try:
            await self.host.api.delete(
                f"/api/v1/namespaces/{self.namespace}/pods/{self.name}", body
            )
            log.info("pod %s: containers stopped, pod deleted", self.key)
        except ApiError as exc:
            if exc.status not in (404, 409):
                log.warning("pod %s: final delete failed: %s", self.key, exc)

    async def _setup_network(self) -> None:
        if self.host_network:
            return
        self.pod_ip = await asyncio.to_thread(self.host.addresses.add_pod_ip)
        log.info("pod %s: IP %s", self.key, self.pod_ip)
        hosts = self.host.settings.pod_hosts
        if hosts is not None:
            hosts.add(self.key, str(self.pod_ip), pod_host_names(self.pod))

    def _has_hostname(self) -> bool:
        return not self.host_network and bool(pod_host_names(self.pod))

    def _cleanup(self) -> None:
        hosts = self.host.settings.pod_hosts
        if hosts is not None:
            hosts.remove(self.key)
        if self.pod_ip is not None:
            with contextlib.suppress(Exception):
                self.host.addresses.release_pod_ip(self.pod_ip)
            self.pod_ip = None
        # Keep logs (they are the evidence); drop volume material (tokens, secrets).
        shutil.rmtree(self.dir / "volumes", ignore_errors=True)

    # ------------------------------------------------------------ volumes
    async def _setup_volumes_until_ready(self) -> bool:
        """Materialise volumes; missing config maps/secrets keep the pod in ContainerCreating
        (retried every second) until the pod is deleted."""
        while not self._terminate.is_set():
            try:
                await self._setup_volumes()
                self._volume_error = ""
                return True
            except (ApiError, PodSpecError) as exc:
                message = f"MountVolume.SetUp failed: {exc}"
                if message != self._volume_error:
                    log.warning("pod %s: %s", self.key, message)
                    self._volume_error = message
                for rec in self.records.values():
                    rec.waiting_message = message[:500]
                self._dirty.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._terminate.wait(), VOLUME_RETRY_SECONDS)
        return False

    async def _setup_volumes(self) -> None:
        await write_volumes(self.host.api, self.pod, self.dir / "volumes")

    # ------------------------------------------------------------ environment
    async def _container_env(self, container: Mapping[str, Any]) -> dict[str, str]:
        settings = self.host.settings
        return await container_env(
            self.host.api,
            self._status_view(),
            container,
            venv_bin=settings.venv_bin,
            service_env=settings.service_env,
        )

    def _status_view(self) -> dict[str, Any]:
        """The pod with the status fields this kubelet has decided (for the downward API)."""
        status = dict(self.pod.get("status") or {})
        ip = self._ip()
        status |= {
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": self.host.node_ip(self.node),
            "hostIPs": [{"ip": self.host.node_ip(self.node)}],
        }
        return {**self.pod, "status": status}

    def _ip(self) -> str:
        if self.pod_ip is not None:
            return str(self.pod_ip)
        return self.host.node_ip(self.node)

    # ------------------------------------------------------------ processes
    async def _spawn(self, container: Mapping[str, Any], rec: ContainerRecord) -> ContainerProcess:
        settings = self.host.settings
        env = await self._container_env(container)
        command = [expand_vars(str(a), env) for a in container.get("command") or []]
        args = [expand_vars(str(a), env) for a in container.get("args") or []]
        image = container.get("image", "")
        node_annotations: dict[str, str] | None = None
        if image_kind(image) == "engine":  # the node chooses the engine runtime (real_engine)
            node = await self.host.api.get(f"/api/v1/nodes/{self.node}")
            node_annotations = dict((node.get("metadata") or {}).get("annotations") or {})
        launch = launch_for(
            image,
            command,
            args,
            pod_ip=self._ip(),
            python=settings.python,
            venv_bin=settings.venv_bin,
            gpu_memory_gib=await self.host.gpu_memory_gib(self.node),
            env=env,
            node_annotations=node_annotations,
        )
        env |= dict(launch.env)
        argv = list(launch.argv)
        mounts = container_mounts(self.pod, container, self.dir / "volumes", settings.mount_points)
        if settings.pod_hosts is not None and self._has_hostname():
            # Only pods with a headless-Service name (StatefulSet pods: LWS groups) get the file;
            # ordered with the pod's own mounts: an emptyDir at /tmp must not hide it.
            mounts = order_mounts([*mounts, (str(settings.pod_hosts.path), "/etc/hosts")])
        if settings.mount_namespaces:
            argv = in_mount_namespace(
                argv,
                mounts,
                settings.venv_bin,
                settings.mount_points,
                read_only_targets(self.pod, container),
            )
        workdir = container.get("workingDir")
        cwd = workdir if workdir and Path(workdir).is_dir() else str(self.dir)
        header = f"\n===== {now_rfc3339()} start #{rec.restart_count}: {' '.join(launch.argv)}\n"
        proc = start_process(
            argv,
            env,
            cwd,
            self.log_path(rec.name),
            header,
            cri_log_path=self.cri_log_path(rec.name, rec.restart_count),
            restart_count=rec.restart_count,
        )
        self.container_logs.setdefault(rec.name, []).append(proc.log)
        log.info("pod %s: container %s started as pid %d", self.key, rec.name, proc.popen.pid)
        return proc

    async def _stop_proc(self, name: str, grace: float) -> None:
        proc = self.procs.get(name)
        if proc is not None:
            await stop_process(proc, grace, self._kill_deadline)

    async def _stop_all(self, grace: float) -> None:
        """Stop every process: regular (and running regular init) containers first, then the
        sidecars in reverse order, each with what is left of ``grace`` (at least 2 s). With no
        grace at all, everything is killed at once."""
        sidecars = [n for n in reversed(self._sidecars) if n in self.procs]
        first = [n for n in self.procs if n not in sidecars] if grace > 0 else list(self.procs)
        began = time.monotonic()
        await asyncio.gather(*(self._stop_proc(n, grace) for n in first), return_exceptions=True)
        if grace > 0:
            for name in sidecars:
                left = grace - (time.monotonic() - began)
                await self._stop_proc(name, max(left, min(MIN_GRACE_SECONDS, grace)))
        for rec in list(self.records.values()) + list(self.init_records.values()):
            rec.ready = False
            if rec.state == WAITING and rec.last_terminated is None and not self._force:
                rec.waiting_reason = "ContainerCreating"
        self._dirty.set()

    async def _run_init_containers(self) -> bool:
        """Init containers in order: a regular one runs to completion, a sidecar is started and
        kept running (the next one starts once it has started). False if the pod is deleted or
        failed for good."""
        policy = self.pod["spec"].get("restartPolicy", "Always")
        for container in self.pod["spec"].get("initContainers") or []:
            rec = self.init_records[container["name"]]
            if is_sidecar(container):
                task = asyncio.create_task(
                    self._container_loop(container, rec, "Always"),
                    name=f"sidecar-{self.key}-{rec.name}",
                )
                self._tasks.append(task)
                self._sidecar_tasks.append(task)
                if not await self._until_started(rec):
                    return False
                continue
            attempt = 0
            while True:
                if self._terminate.is_set():
                    return False
                code = await self._run_once(container, rec)
                if code is None:
                    return False
                if code == 0:
                    rec.ready = True  # the kubelet marks a completed init container ready
                    self._dirty.set()
                    break
                if policy == "Never":
                    return False
                attempt += 1
                if not await self._backoff(rec, attempt):
                    return False
        self._initialized = True
        self._dirty.set()
        return True

    async def _until_started(self, rec: ContainerRecord) -> bool:
        """Wait until a sidecar has started (True), or the pod is being deleted (False)."""
        while not rec.started:
            if self._terminate.is_set():
                return False
            self._started_changed.clear()
            waits = [
                asyncio.ensure_future(self._started_changed.wait()),
                asyncio.ensure_future(self._terminate.wait()),
            ]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waits:
                    waiter.cancel()
        return not self._terminate.is_set()

    async def _run_once(self, container: Mapping[str, Any], rec: ContainerRecord) -> int | None:
        try:
            proc = await self._spawn(container, rec)
        except (ImageError, PodSpecError, ApiError, OSError) as exc:
            self._start_failed(rec, exc)
            return 128
        self._mark_running(rec, proc, started=True)
        code = await proc.exited
        self._mark_exited(rec, proc, code)
        return None if self._terminate.is_set() else rec.exit_code

    def _start_failed(self, rec: ContainerRecord, exc: Exception) -> None:
        log.warning("pod %s: container %s cannot start: %s", self.key, rec.name, exc)
        rec.state = WAITING
        rec.waiting_reason = "CreateContainerConfigError"
        rec.waiting_message = str(exc)[:1000]
        self._dirty.set()

    def _mark_running(self, rec: ContainerRecord, proc: ContainerProcess, *, started: bool) -> None:
        self.procs[rec.name] = proc
        rec.state = RUNNING
        rec.pid = proc.popen.pid
        rec.started_at = now_rfc3339()
        rec.ready = False
        rec.started = started
        if started:
            self._started_changed.set()
        rec.waiting_message = ""
        rec.terminated_message = ""
        self._dirty.set()

    def _mark_exited(self, rec: ContainerRecord, proc: ContainerProcess, returncode: int) -> None:
        proc.log.mark_exited()
        code, sig = exit_code_of(returncode)
        rec.state = TERMINATED
        rec.exit_code = code
        rec.signal = sig
        rec.finished_at = now_rfc3339()
        rec.terminated_reason = "Completed" if code == 0 else "Error"
        rec.ready = False
        rec.started = False
        log.info("pod %s: container %s exited with %d", self.key, rec.name, code)
        self._dirty.set()

    async def _backoff(self, rec: ContainerRecord, restart_number: int) -> bool:
        """Wait the crash-loop back-off before restart ``restart_number``; False if deleted."""
        settings = self.host.settings
        delay = restart_delay(restart_number, settings.backoff_initial, settings.backoff_max)
        rec.last_terminated = rec.terminated_state()
        if delay > 0:
            rec.state = WAITING
            rec.waiting_reason = "CrashLoopBackOff"
            rec.waiting_message = (
                f"back-off {delay:g}s restarting failed container={rec.name} "
                f"pod={self.name}_{self.namespace}({self.uid})"
            )
            self._dirty.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._terminate.wait(), delay)
        if self._terminate.is_set():
            return False
        rec.restart_count += 1
        return True

    async def _container_loop(
        self, container: Mapping[str, Any], rec: ContainerRecord, policy: str
    ) -> None:
        """Run one container (a regular one, or a sidecar with ``policy`` Always) until the pod
        is deleted or ``policy`` says it is done; restarts with the crash-loop back-off."""
        restarts_in_row = 0
        while not self._terminate.is_set():
            try:
                proc = await self._spawn(container, rec)
            except (ImageError, PodSpecError, ApiError, OSError) as exc:
                self._start_failed(rec, exc)
                restarts_in_row += 1
                # Config errors are retried like crashes (the kubelet retries them too).
                delay = restart_delay(
                    restarts_in_row + 1, self.host.settings.backoff_initial, 300.0
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._terminate.wait(), max(delay, 1.0))
                continue
            has_startup = "startupProbe" in container
            self._mark_running(rec, proc, started=not has_startup)
            probes = asyncio.create_task(self._probe_all(container, rec, proc))
            code = await proc.exited
            probes.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probes
            self._mark_exited(rec, proc, code)
            if self._terminate.is_set() or not should_restart(policy, rec.exit_code or 0):
                return
            ran_for = time.monotonic() - proc.started_monotonic
            if ran_for > 2 * self.host.settings.backoff_max:
                restarts_in_row = 0
            restarts_in_row += 1
            if not await self._backoff(rec, restarts_in_row):
                return

    # ------------------------------------------------------------ probes
    async def _probe_all(
        self, container: Mapping[str, Any], rec: ContainerRecord, proc: ContainerProcess
    ) -> None:
        startup = container.get("startupProbe")
        if startup is not None:
            ok = await self._probe_loop(container, rec, proc, "startup", probe_settings(startup))
            if not ok:
                return
            rec.started = True
            self._started_changed.set()
            self._dirty.set()
        loops: list[Awaitable[bool]] = []
        readiness = container.get("readinessProbe")
        if readiness is not None:
            loops.append(
                self._probe_loop(container, rec, proc, "readiness", probe_settings(readiness))
            )
        else:
            rec.ready = True
            self._dirty.set()
        liveness = container.get("livenessProbe")
        if liveness is not None:
            loops.append(
                self._probe_loop(container, rec, proc, "liveness", probe_settings(liveness))
            )
        if loops:
            await asyncio.gather(*loops)

    async def _probe_loop(
        self,
        container: Mapping[str, Any],
        rec: ContainerRecord,
        proc: ContainerProcess,
        kind: str,
        settings: ProbeSettings,
    ) -> bool:
        """Readiness runs forever; startup returns True once it passes; a failed startup or
        liveness probe kills the container (restartPolicy then decides) and returns False."""
        if settings.initial_delay > 0:
            await asyncio.sleep(settings.initial_delay)
        successes = failures = 0
        while not proc.exited.done():
            ok = await self._probe_once(container, settings)
            if ok:
                successes, failures = successes + 1, 0
            else:
                successes, failures = 0, failures + 1
            if kind == "readiness":
                if ok and successes >= settings.success_threshold and not rec.ready:
                    rec.ready = True
                    log.info("pod %s: container %s ready", self.key, rec.name)
                    self._dirty.set()
                elif not ok and failures >= settings.failure_threshold and rec.ready:
                    rec.ready = False
                    log.info("pod %s: container %s failed readiness", self.key, rec.name)
                    self._dirty.set()
            elif kind == "startup" and ok:
                return True
            elif not ok and failures >= settings.failure_threshold:
                log.info("pod %s: container %s failed %s probe; killing", self.key, rec.name, kind)
                rec.terminated_message = f"container failed {kind} probe"
                await self._stop_proc(rec.name, self._grace)
                return False
            await asyncio.sleep(settings.period)
        return False

    async def _probe_once(self, container: Mapping[str, Any], settings: ProbeSettings) -> bool:
        return await probe_once(
            container,
            settings,
            pod_ip=self._ip(),
            session=self.host.probe_session,
            env=lambda: self._container_env(container),
        )

    # ------------------------------------------------------------ status
    def status_patch(self) -> dict[str, Any]:
        """The strategic-merge patch for ``pods/status``: kubelet-owned fields only."""
        sandbox = self.pod_ip is not None or self.host_network
        return pod_status_patch(
            self.pod,
            records=list(self.records.values()),
            init_records=list(self.init_records.values()),
            sidecars=[self.init_records[n] for n in self._sidecars],
            initialized=self._initialized,
            pod_ip=self._ip() if sandbox else None,
            host_ip=self.host.node_ip(self.node),
            start_time=self.start_time,
            now=now_rfc3339(),
        )

    async def _status_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            await asyncio.sleep(0.05)  # coalesce bursts of changes into one patch
            await self._write_status()

    async def _refresh(self) -> None:
        """Re-read the pod after a conflict (the next status patch is computed from it)."""
        try:
            latest = await self.host.api.get(
                f"/api/v1/namespaces/{self.namespace}/pods/{self.name}"
            )
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning("pod %s: re-read after a status conflict failed: %s", self.key, exc)
            return
        self._adopt(latest)

    def _adopt(self, seen: object) -> None:
        """Take ``seen`` (a patch's response, a re-read) as this pod's view unless a watch event
        already brought a newer one: Ready is computed from the view, and an older one would
        undo a gate the operator set meanwhile."""
        if (
            isinstance(seen, dict)
            and seen.get("metadata", {}).get("uid") == self.uid
            and not _older(
                seen["metadata"].get("resourceVersion"),
                self.pod["metadata"].get("resourceVersion"),
            )
        ):
            self.pod = seen

    async def _write_status(self, force: bool = False) -> None:
        if self._force:
            return
        patch = self.status_patch()
        text = json.dumps(patch, sort_keys=True)
        # Skipped only when this kubelet wrote the same status last AND the pod as last seen
        # still holds it: another writer (the node lifecycle controller's MarkPodsNotReady sets
        # Ready=False when a node's Lease is late) is put right, as the real status manager's
        # syncBatch does (needsReconcile: the API's status differs from its cache).
        seen = (self.pod.get("status") or {}).get("conditions") or []
        if (
            text == self._last_patch
            and not force
            and not kubelet_conditions_differ(seen, patch["status"]["conditions"])
        ):
            return
        # Ready is computed from the readiness-gate conditions of the pod as last seen. If the
        # operator flipped a gate since, a patch from that stale view would publish Ready=True
        # with the gate False, for as long as it takes the watch event to arrive. The
        # resourceVersion makes the patch conditional: on a conflict, re-read and recompute.
        path = f"/api/v1/namespaces/{self.namespace}/pods/{self.name}/status"
        conditional = {
            **patch,
            "metadata": {
                **patch["metadata"],
                "resourceVersion": self.pod["metadata"].get("resourceVersion"),
            },
        }
        try:
            result = await self.host.api.patch(path, conditional)
            self._last_patch = text
            # The response is the pod as this patch left it. A watch event may have brought a
            # newer one while it was in flight (the operator set a gate): keep that one, or
            # the next status would be computed from the older view, equal the patch just
            # written, be skipped, and the gate's change would never reach Ready.
            self._adopt(result)
        except ApiError as exc:
            if exc.status == 404:
                return
            if exc.status == 409:
                await self._refresh()
                self._dirty.set()
                return
            log.warning("pod %s: status patch failed: %s", self.key, exc)
            self._last_patch = None
            loop = asyncio.get_running_loop()
            loop.call_later(1.0, self._dirty.set)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("pod %s: status patch failed: %s", self.key, exc)
            loop = asyncio.get_running_loop()
            loop.call_later(1.0, self._dirty.set)


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """A restartable init container (``restartPolicy: Always``): a native sidecar."""
    return container.get("restartPolicy") == "Always"


def _older(candidate: str | None, current: str | None) -> bool:
    """True if ``candidate`` is an older resourceVersion than ``current`` (etcd revisions are
    integers; anything else is treated as newer)."""
    try:
        return int(candidate or "") < int(current or "")
    except ValueError:
        return False
