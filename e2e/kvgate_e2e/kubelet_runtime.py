"""One pod on the loopback kubelet: its IP, volumes, processes, probes, restarts and status.

A ``PodWorker`` owns everything of one pod UID. Containers are local processes (see
``kubelet_images``), each in its own mount namespace (``unshare --mount``) where the pod's volumes
(the projected service-account volume the ServiceAccount admission plugin adds, secrets, config
maps, emptyDirs) are bind-mounted at their ``mountPath``. Status is written with a strategic-merge
patch on ``pods/status`` holding only what the kubelet owns; readiness-gate conditions are read,
never written.

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
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import aiohttp

from kvgate_e2e.kubelet_api import ApiError, KubeApi
from kvgate_e2e.kubelet_images import ImageError, expand_vars, launch_for
from kvgate_e2e.kubelet_podspec import (
    PodSpecError,
    ProbeSettings,
    field_ref_value,
    probe_settings,
    resolve_port,
)
from kvgate_e2e.kubelet_readiness import (
    INITIALIZED,
    KUBELET_CONDITIONS,
    POD_READY_TO_START_CONTAINERS,
    Condition,
    containers_ready_condition,
    initialized_condition,
    merge_conditions,
    pod_ready_condition,
)
from kvgate_e2e.kubelet_status import (
    RUNNING,
    TERMINATED,
    WAITING,
    ContainerRecord,
    container_status,
    exit_code_of,
    pod_phase,
    restart_delay,
    should_restart,
)

log = logging.getLogger("kvgate_e2e.kubelet")

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MOUNT_SCRIPT = (
    'while [ "$1" != "--" ]; do '
    '[ -e "$2" ] || mkdir -p "$2"; '
    'mount --bind "$1" "$2" || { echo "kvgate-kubelet: cannot mount $1 at $2" >&2; exit 127; }; '
    'shift 2; done; shift; exec "$@"'
)
# Where this checkout's packages and virtualenv live: pod processes run from them.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
KEEP_STAGE = "/run/kvgate-e2e-keep"  # staging mount points, see keep_visible()
MIN_GRACE_SECONDS = 2.0  # minimumGracePeriodInSeconds of the kubelet's killContainer


def order_mounts(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """Bind-mount order in which no mount hides a later mount's source: the pod's volume
    material lives under the run dir (often in /tmp), so an emptyDir at ``/tmp`` must be
    mounted after every volume whose source is below /tmp. Otherwise parents before children."""

    def covers(dst: str, path: str) -> bool:
        return path == dst or path.startswith(dst.rstrip("/") + "/")

    def shadows(pair: tuple[str, str]) -> bool:
        return any(covers(pair[1], other[0]) for other in pairs if other is not pair)

    return sorted(pairs, key=lambda p: (shadows(p), p[1].count("/")))


def keep_visible(
    pairs: Sequence[tuple[str, str]], paths: Sequence[str], stage: str
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Bind mounts (before, after the pod's own) that keep host paths visible under a volume.

    Pod processes run from this checkout and its virtualenv. If the checkout lives under a
    volume's mountPath (a clone in /tmp, an emptyDir at /tmp), that mount would hide it. So each
    hidden path is first bound to a staging directory ``<stage>/<n>`` (before the pod's mounts)
    and bound back from there afterwards. (Binding from ``/proc/<pid>/root`` instead does not
    work: mount(8) canonicalizes the path, and the kernel refuses a bind from another mount
    namespace.)"""

    def covers(dst: str, path: str) -> bool:
        return path == dst or path.startswith(dst.rstrip("/") + "/")

    hidden = [p for p in dict.fromkeys(paths) if any(covers(dst, p) for _, dst in pairs)]
    outermost = [p for p in hidden if not any(q != p and covers(q, p) for q in hidden)]
    before = [(path, f"{stage}/{i}") for i, path in enumerate(outermost)]
    return before, [(staged, path) for path, staged in before]


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AddressPool(Protocol):
    """Pod addresses on the namespace's ``lo`` (``Cluster`` implements this)."""

    def add_pod_ip(self) -> ipaddress.IPv4Address: ...

    def release_pod_ip(self, addr: ipaddress.IPv4Address) -> None: ...


class MountPoints:
    """Creates missing mount-point directories on the host; the last kubelet to stop removes them.

    Directories are never removed while any loopback kubelet on this machine may still run pods:
    since Linux 3.18, ``rmdir`` of a directory that is a mount point in *another* mount namespace
    detaches that mount, which would pull a running pod's token out from under it. Kubelets
    register in ``registry`` (one file per kubelet, named by PID); created directories are listed
    in ``registry/created``; whoever leaves last (no live PID left) removes them.
    """

    def __init__(self, registry: Path = Path("/run/kvgate-e2e-kubelets")) -> None:
        self._registry = registry
        self._me = registry / f"kubelet-{os.getpid()}-{id(self)}"
        self._lock = threading.Lock()

    def ensure(self, path: Path) -> None:
        with self._lock:
            if not self._me.exists():
                self._registry.mkdir(parents=True, exist_ok=True)
                self._me.touch()
            missing: list[Path] = []
            probe = path
            while not probe.exists():
                missing.append(probe)
                probe = probe.parent
            with (self._registry / "created").open("a") as created:
                for item in reversed(missing):
                    item.mkdir(exist_ok=True)
                    created.write(f"{item}\n")

    def cleanup(self) -> None:
        with self._lock:
            if not self._me.exists():
                return
            self._me.unlink()
            for other in self._registry.glob("kubelet-*"):
                pid = other.name.split("-")[1]
                if pid.isdigit() and Path(f"/proc/{pid}").exists():
                    return  # another kubelet still runs; it cleans up when it leaves
                other.unlink(missing_ok=True)
            created = self._registry / "created"
            paths = created.read_text().split() if created.exists() else []
            for item in sorted(set(paths), key=len, reverse=True):
                with contextlib.suppress(OSError):
                    Path(item).rmdir()
            created.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                self._registry.rmdir()


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


def _wait_in_thread(popen: subprocess.Popen[bytes]) -> asyncio.Future[int]:
    """Future for the exit code, resolved by a small thread (no executor slot held)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[int] = loop.create_future()

    def resolve(code: int) -> None:
        if not fut.done():
            fut.set_result(code)

    def waiter() -> None:
        code = popen.wait()
        with contextlib.suppress(RuntimeError):  # the loop may be closed by now
            loop.call_soon_threadsafe(resolve, code)

    threading.Thread(target=waiter, name=f"wait-{popen.pid}", daemon=True).start()
    return fut


@dataclass
class _Proc:
    popen: subprocess.Popen[bytes]
    exited: asyncio.Future[int]
    log_file: IO[bytes]
    started_monotonic: float


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
        self.procs: dict[str, _Proc] = {}
        self._dirty = asyncio.Event()
        self._terminate = asyncio.Event()
        self._grace: float = float(pod["spec"].get("terminationGracePeriodSeconds", 30))
        # A later, shorter grace period: every process still running is killed by then
        # (monotonic seconds); _grace_cut is set (and replaced) each time it moves earlier.
        self._kill_by = math.inf
        self._grace_cut = asyncio.Event()
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
        self._kill_by = min(self._kill_by, time.monotonic() + max(grace, 0.0))
        cut, self._grace_cut = self._grace_cut, asyncio.Event()
        cut.set()

    def kill_container(self, name: str, sig: int = signal.SIGKILL) -> int | None:
        """Signal one container's process group (tests use it to simulate an engine crash)."""
        proc = self.procs.get(name)
        if proc is None or proc.popen.poll() is not None:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, sig)
        return proc.popen.pid

    def log_path(self, container: str) -> Path:
        return self.dir / f"{container}.log"

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
                await asyncio.wait([*loops, *self._sidecar_tasks], timeout=10)
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

    def _cleanup(self) -> None:
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
                    await asyncio.wait_for(self._terminate.wait(), 1.0)
        return False

    async def _setup_volumes(self) -> None:
        root = self.dir / "volumes"
        for volume in self.pod["spec"].get("volumes") or []:
            target = root / volume["name"]
            files = await self._volume_files(volume)
            if files is None:  # emptyDir and friends: a plain directory
                target.mkdir(parents=True, exist_ok=True)
                continue
            self._write_files(target, files)

    @staticmethod
    def _write_files(target: Path, files: Mapping[str, bytes]) -> None:
        target.mkdir(parents=True, exist_ok=True)
        for rel, data in files.items():
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(data)
            tmp.chmod(0o644)
            tmp.replace(path)

    async def _volume_files(self, volume: Mapping[str, Any]) -> dict[str, bytes] | None:
        if "emptyDir" in volume:
            return None
        if "secret" in volume:
            src = volume["secret"]
            return await self._object_files("secrets", src.get("secretName", ""), src)
        if "configMap" in volume:
            src = volume["configMap"]
            return await self._object_files("configmaps", src.get("name", ""), src)
        if "downwardAPI" in volume:
            return self._downward_files(volume["downwardAPI"].get("items") or [])
        if "projected" in volume:
            files: dict[str, bytes] = {}
            for source in volume["projected"].get("sources") or []:
                if "serviceAccountToken" in source:
                    sat = source["serviceAccountToken"]
                    token = await self._request_token(
                        sat.get("audience"), int(sat.get("expirationSeconds") or 3607)
                    )
                    files[sat.get("path", "token")] = token.encode()
                elif "configMap" in source:
                    src = source["configMap"]
                    files |= await self._object_files("configmaps", src.get("name", ""), src)
                elif "secret" in source:
                    src = source["secret"]
                    files |= await self._object_files("secrets", src.get("name", ""), src)
                elif "downwardAPI" in source:
                    files |= self._downward_files(source["downwardAPI"].get("items") or [])
            return files
        if "hostPath" in volume:
            return None
        raise PodSpecError(
            f"volume {volume.get('name')!r} uses a source the loopback kubelet does not support "
            "(supported: emptyDir, secret, configMap, downwardAPI, projected, hostPath)"
        )

    async def _object_files(self, kind: str, name: str, src: Mapping[str, Any]) -> dict[str, bytes]:
        try:
            obj = await self.host.api.get(f"/api/v1/namespaces/{self.namespace}/{kind}/{name}")
        except ApiError as exc:
            if exc.status == 404 and src.get("optional"):
                return {}
            raise
        data: dict[str, bytes] = {}
        for key, value in (obj.get("data") or {}).items():
            data[key] = base64.b64decode(value) if kind == "secrets" else str(value).encode()
        for key, value in (obj.get("binaryData") or {}).items():
            data[key] = base64.b64decode(value)
        items = src.get("items")
        if not items:
            return data
        return {item["path"]: data[item["key"]] for item in items if item["key"] in data}

    def _downward_files(self, items: Sequence[Mapping[str, Any]]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for item in items:
            ref = item.get("fieldRef")
            if ref:
                out[item["path"]] = field_ref_value(self.pod, ref["fieldPath"]).encode()
        return out

    async def _request_token(self, audience: str | None, expiration: int) -> str:
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {
            "expirationSeconds": expiration,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": self.name,
                "uid": self.uid,
            },
        }
        if audience:
            spec["audiences"] = [audience]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        result = await self.host.api.create(
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{sa}/token", body
        )
        return str(result["status"]["token"])

    def _mount_pairs(self, container: Mapping[str, Any]) -> list[tuple[str, str]]:
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes") or []}
        pairs: list[tuple[str, str]] = []
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"])
            if volume is None:
                raise PodSpecError(f"volumeMount {mount['name']!r} names no volume of the pod")
            if "hostPath" in volume:
                src = Path(volume["hostPath"]["path"])
            else:
                src = self.dir / "volumes" / mount["name"]
            if mount.get("subPath"):
                src = src / mount["subPath"]
            dst = Path(os.path.realpath(mount["mountPath"]))
            if src.is_dir():
                self.host.settings.mount_points.ensure(dst)
            else:
                self.host.settings.mount_points.ensure(dst.parent)
                if not dst.exists():
                    dst.touch()
            pairs.append((str(src), str(dst)))
        return order_mounts(pairs)

    # ------------------------------------------------------------ environment
    async def _container_env(self, container: Mapping[str, Any]) -> dict[str, str]:
        settings = self.host.settings
        env: dict[str, str] = {
            "PATH": f"{settings.venv_bin}:{BASE_PATH}",
            "HOME": "/root",
            "HOSTNAME": self.name,
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
        }
        env |= dict(settings.service_env)
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, key in (("configmaps", "configMapRef"), ("secrets", "secretRef")):
                if key in source:
                    ref = source[key]
                    files = await self._object_files(kind, ref.get("name", ""), ref)
                    env |= {prefix + k: v.decode() for k, v in files.items()}
        view = self._status_view()
        for item in container.get("env") or []:
            name = item["name"]
            if "value" in item:
                env[name] = expand_vars(str(item["value"]), env)
                continue
            ref = item.get("valueFrom") or {}
            if "fieldRef" in ref:
                env[name] = field_ref_value(view, ref["fieldRef"]["fieldPath"])
            elif "secretKeyRef" in ref or "configMapKeyRef" in ref:
                kind, key = (
                    ("secrets", "secretKeyRef")
                    if "secretKeyRef" in ref
                    else ("configmaps", "configMapKeyRef")
                )
                sel = ref[key]
                files = await self._object_files(kind, sel["name"], sel)
                if sel["key"] in files:
                    env[name] = files[sel["key"]].decode()
                elif not sel.get("optional"):
                    raise PodSpecError(
                        f"env {name}: key {sel['key']!r} not in {kind} {sel['name']}"
                    )
            elif "resourceFieldRef" in ref:
                env[name] = "0"
            else:
                env.setdefault(name, "")
        return env

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
    async def _spawn(self, container: Mapping[str, Any], rec: ContainerRecord) -> _Proc:
        settings = self.host.settings
        env = await self._container_env(container)
        command = [expand_vars(str(a), env) for a in container.get("command") or []]
        args = [expand_vars(str(a), env) for a in container.get("args") or []]
        launch = launch_for(
            container.get("image", ""),
            command,
            args,
            pod_ip=self._ip(),
            python=settings.python,
            venv_bin=settings.venv_bin,
            gpu_memory_gib=await self.host.gpu_memory_gib(self.node),
        )
        env |= dict(launch.env)
        argv = list(launch.argv)
        mounts = self._mount_pairs(container)
        before, after = keep_visible(
            mounts, [str(PROJECT_ROOT), str(Path(settings.venv_bin).parent)], stage=KEEP_STAGE
        )
        for _, staged in before:
            settings.mount_points.ensure(Path(staged))
        mounts = before + mounts + after
        if settings.mount_namespaces:
            flat = [p for pair in mounts for p in pair]
            argv = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "/bin/sh",
                "-c",
                _MOUNT_SCRIPT,
                "kvgate-pod",
                *flat,
                "--",
                *argv,
            ]
        workdir = container.get("workingDir")
        cwd = workdir if workdir and Path(workdir).is_dir() else str(self.dir)
        log_file = self.log_path(rec.name).open("ab")
        header = f"\n===== {now_rfc3339()} start #{rec.restart_count}: {' '.join(launch.argv)}\n"
        log_file.write(header.encode())
        log_file.flush()
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        log.info("pod %s: container %s started as pid %d", self.key, rec.name, popen.pid)
        return _Proc(popen, _wait_in_thread(popen), log_file, time.monotonic())

    async def _stop_proc(self, name: str, grace: float) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.exited.done():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + max(grace, 0.0)
        while not proc.exited.done():
            cut = self._grace_cut
            left = min(deadline, self._kill_by) - time.monotonic()
            if left <= 0:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                await proc.exited
                break
            # Until the process exits (reported at once), the grace runs out, or is shortened.
            shortened = asyncio.ensure_future(cut.wait())
            either: list[asyncio.Future[Any]] = [proc.exited, shortened]
            try:
                await asyncio.wait(either, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                shortened.cancel()
        # The group may hold children that outlived the leader.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGKILL)

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

    def _mark_running(self, rec: ContainerRecord, proc: _Proc, *, started: bool) -> None:
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

    def _mark_exited(self, rec: ContainerRecord, proc: _Proc, returncode: int) -> None:
        proc.log_file.close()
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
        self, container: Mapping[str, Any], rec: ContainerRecord, proc: _Proc
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
        proc: _Proc,
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
        handler = settings.handler
        try:
            if settings.kind == "httpGet":
                port = resolve_port(handler["port"], container)
                host = handler.get("host") or self._ip()
                scheme = str(handler.get("scheme") or "HTTP").lower()
                path = handler.get("path") or "/"
                headers = {h["name"]: h["value"] for h in handler.get("httpHeaders") or []}
                url = f"{scheme}://{host}:{port}{path}"
                async with self.host.probe_session.get(
                    url,
                    headers=headers,
                    ssl=False,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=settings.timeout),
                ) as resp:
                    await resp.read()
                    return 200 <= resp.status < 400
            if settings.kind == "tcpSocket":
                port = resolve_port(handler["port"], container)
                host = handler.get("host") or self._ip()
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), settings.timeout
                )
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
                return True
            if settings.kind == "exec":
                env = await self._container_env(container)
                child = await asyncio.create_subprocess_exec(
                    *handler.get("command", []),
                    env=env,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                try:
                    return await asyncio.wait_for(child.wait(), settings.timeout) == 0
                except TimeoutError:
                    child.kill()
                    await child.wait()
                    return False
            log.warning("pod %s: %s probes are not supported; failing", self.key, settings.kind)
            return False
        except (OSError, TimeoutError, aiohttp.ClientError, PodSpecError, ValueError):
            return False

    # ------------------------------------------------------------ status
    def _conditions(self, phase: str) -> list[Condition]:
        spec = self.pod["spec"]
        # Init containers' statuses first, then the regular ones (generateAPIPodStatus).
        statuses = [container_status(r) for r in self.init_records.values()]
        statuses += [container_status(r) for r in self.records.values()]
        sandbox = self.pod_ip is not None or self.host_network
        conditions = list((self.pod.get("status") or {}).get("conditions") or [])
        return [
            Condition(POD_READY_TO_START_CONTAINERS, "True" if sandbox else "False"),
            initialized_condition(spec, statuses, phase)
            if self.init_records
            else Condition(INITIALIZED, "True"),
            containers_ready_condition(spec, statuses, phase),
            pod_ready_condition(spec, conditions, statuses, phase),
        ]

    def status_patch(self) -> dict[str, Any]:
        """The strategic-merge patch for ``pods/status``: kubelet-owned fields only."""
        policy = self.pod["spec"].get("restartPolicy", "Always")
        records = list(self.records.values())
        sidecars = [self.init_records[n] for n in self._sidecars]
        phase = pod_phase(policy, records, initialized=self._initialized, sidecars=sidecars)
        current = (self.pod.get("status") or {}).get("conditions") or []
        generation = self.pod["metadata"].get("generation")
        conditions = merge_conditions(current, self._conditions(phase), now_rfc3339(), generation)
        host_ip = self.host.node_ip(self.node)
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "containerStatuses": [container_status(r) for r in records],
        }
        if generation is not None:
            status["observedGeneration"] = generation
        if self.start_time:
            status["startTime"] = self.start_time
        if self.pod_ip is not None or self.host_network:
            status["podIP"] = self._ip()
            status["podIPs"] = [{"ip": self._ip()}]
        if self.init_records:
            status["initContainerStatuses"] = [
                container_status(r) for r in self.init_records.values()
            ]
        return {"metadata": {"uid": self.uid}, "status": status}

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
        if isinstance(latest, dict) and latest.get("metadata", {}).get("uid") == self.uid:
            self.pod = latest

    async def _write_status(self, force: bool = False) -> None:
        if self._force:
            return
        patch = self.status_patch()
        text = json.dumps(patch, sort_keys=True)
        if text == self._last_patch and not force:
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
            if isinstance(result, dict) and result.get("metadata", {}).get("uid") == self.uid:
                self.pod = result
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


def kubelet_owned(conditions: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The subset of ``conditions`` the kubelet writes."""
    return [c for c in conditions if c.get("type") in KUBELET_CONDITIONS]


HostFactory = Callable[[], PodHost]
