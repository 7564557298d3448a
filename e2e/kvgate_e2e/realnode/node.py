"""One real node of the e2e world: ``with RealNode(cluster, spec) as node: ...``.

containerd (its CRI plugin, runc, the CNI bridge) and Kubernetes' own kubelet run inside the
world's network namespace and in a mount namespace of their own, held by a ``sleep`` started for
it with ``unshare --mount --propagation slave``: the kubelet's and containerd's mounts (the
containers' root filesystems, the pods' volumes, the pinned pod network namespaces) live and die
there, and the fixed paths they write whatever their flags (``/run/containerd``,
``/var/lib/kubelet/device-plugins``, ``/var/log/containers``) are tmpfs there, never the
machine's. The node registers itself with the API server, is given ``nvidia.com/gpu`` capacity
and the simulated GPU memory the loopback nodes carry (label and annotation
``kvgate.io/gpu-memory-gib``, pool label ``kvgate.io/pool``), and runs pods from the images
imported into its containerd: the shipped image from ``make image`` and the sandbox image.
What it changes outside its directories (its cgroup subtree, the kernel sysctls the kubelet
sets) is recorded for the stale-world reaper and undone on exit (``machine``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from kvgate_e2e.cluster import Cluster
from kvgate_e2e.kubelet.node import GPU_MEMORY_KEY, GPU_RESOURCE, POOL_LABEL, format_gib
from kvgate_e2e.lifecycle import Started
from kvgate_e2e.pki import issue_kubelet_serving, load_ca
from kvgate_e2e.polling import poll_until
from kvgate_e2e.realnode import artifacts, machine
from kvgate_e2e.realnode.config import (
    REAL_POD_CIDR,
    KubeletSettings,
    RuntimePaths,
    cni_conflist_text,
    containerd_config,
    kubelet_config,
)

NODE_TYPE_LABEL = "type"  # the loopback nodes say kvgate-loopback
# Paths containerd 1.6 and the kubelet write whatever their flags say: tmpfs in the node's mount
# namespace. A mount point the machine lacks is created for it and removed afterwards.
PRIVATE_PATHS = (Path("/run/containerd"), Path("/var/lib/kubelet"), Path("/var/log/containers"))
CONTAINERD_START_DEADLINE_S = 60.0  # its socket opens in ~1 s; a minute means it is broken
NODE_READY_DEADLINE_S = 120.0  # registered and Ready in ~10 s when quiet; 120 s at half speed
STOP_GRACE_S = 15.0
IMAGE_IMPORT_TIMEOUT_S = 300.0  # ctr images import of an image archive (the engine image's GiB)
HOLDER_WAIT_TIMEOUT_S = 10.0  # the killed namespace holder reaped: at once


class RealNodeError(RuntimeError):
    """The real node did not come up; the message carries its components' logs."""


@dataclass(frozen=True)
class RealNodeSpec:
    name: str = "kvgate-real-node-0"
    pool: str = "realnode"
    gpus: int = 8
    gpu_memory_gib: float = 80.0


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class RealNode(Started):
    """containerd + runc + CNI + kubelet for one Node of ``cluster``."""

    def __init__(self, cluster: Cluster, spec: RealNodeSpec | None = None) -> None:
        self.cluster = cluster
        self.spec = spec or RealNodeSpec()
        self.images: dict[str, str] = {}  # archive name -> image ref, as imported
        self._dir = cluster.run_dir / f"realnode-{self.spec.name}"
        self._holder: subprocess.Popen[str] | None = None
        self._containerd: subprocess.Popen[bytes] | None = None
        self._kubelet: subprocess.Popen[bytes] | None = None
        self._logs: list[IO[bytes]] = []
        self._record: machine.NodeRecord | None = None
        self._created_mount_points: list[Path] = []
        self.node_ip = ""
        self.started_in = 0.0

    # ------------------------------------------------------------------ paths
    @property
    def socket(self) -> Path:
        return self._dir / "c.sock"

    @property
    def cgroup_root(self) -> str:
        return self.cluster.netns_name

    def _paths(self, found: artifacts.NodeArtifacts) -> RuntimePaths:
        return RuntimePaths(
            root=self._dir / "containerd-root",
            state=self._dir / "containerd-state",
            socket=self.socket,
            runc_root=self._dir / "runc",
            runc=found.runtime_bin / "runc",
            cni_bin=found.cni_bin,
            cni_conf=self._dir / "cni",
            ipam=self._dir / "ipam",
        )

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        started = time.monotonic()
        found = artifacts.require()
        pause = artifacts.pause_archive()
        self._dir.mkdir(parents=True)
        paths = self._paths(found)
        for d in (paths.root, paths.state, paths.runc_root, paths.cni_conf, paths.ipam):
            d.mkdir(parents=True, exist_ok=True)
        (self._dir / "containerd.toml").write_text(containerd_config(paths))
        (paths.cni_conf / "10-kvgate-e2e.conflist").write_text(
            cni_conflist_text(REAL_POD_CIDR, paths.ipam)
        )
        node_ip = self.cluster.add_node_ip()
        self.node_ip = str(node_ip)
        pki = self.cluster.pki
        serving = issue_kubelet_serving(
            load_ca(pki.ca_cert, pki.ca_key),
            self._dir / "pki",
            node_names=[self.spec.name],
            node_ips=[self.node_ip],
        )
        settings = KubeletSettings(
            node_ip=node_ip,
            cgroup_root=f"/{self.cgroup_root}",
            runtime_socket=self.socket,
            pod_logs=self._dir / "pod-logs",
            ca_cert=pki.ca_cert,
            serving_cert=serving.cert,
            serving_key=serving.key,
            cluster_domain=self.cluster.cluster_domain,
        )
        (self._dir / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(settings)))

        machine.keep_sysctls_before_kubelet()
        machine.create_cgroup_root(self.cgroup_root)
        self._start_holder()
        assert self._holder is not None
        self._record = machine.NodeRecord(
            name=self.cluster.netns_name,
            cgroup_root=self.cgroup_root,
            mount_namespace=machine.mount_namespace(self._holder.pid) or "",
            created_dirs=tuple(str(p) for p in self._created_mount_points),
        )
        machine.record_node(self.cluster.run_dir, self._record)

        env = {"PATH": f"{found.runtime_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self._containerd = self._spawn(
            "containerd",
            [str(found.runtime_bin / "containerd"), "--config", str(self._dir / "containerd.toml")],
            env,
        )
        poll_until(
            "containerd's socket",
            lambda: self._ctr("version", check=False).returncode == 0,
            CONTAINERD_START_DEADLINE_S,
            guard=lambda: self._exited("containerd", self._containerd),
            error=RealNodeError,
            details=lambda: self.log("containerd"),
        )
        for archive in (pause, found.image_archive):
            self._ctr("images", "import", str(archive), timeout=IMAGE_IMPORT_TIMEOUT_S)
            self.images[archive.name] = artifacts.image_ref(archive)

        labels = {
            POOL_LABEL: self.spec.pool,
            GPU_MEMORY_KEY: format_gib(self.spec.gpu_memory_gib),
            "nvidia.com/gpu.count": str(self.spec.gpus),
            NODE_TYPE_LABEL: "kvgate-real",
        }
        self._kubelet = self._spawn(
            "kubelet",
            [
                str(found.kubelet),
                f"--config={self._dir / 'kubelet.yaml'}",
                f"--kubeconfig={self.cluster.kubeconfig}",
                f"--root-dir={self._dir / 'kubelet'}",
                f"--hostname-override={self.spec.name}",
                f"--node-ip={self.node_ip}",
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
                "--v=2",
            ],
            env,
        )
        poll_until(
            f"node {self.spec.name} Ready",
            self._node_ready,
            NODE_READY_DEADLINE_S,
            period=0.5,
            guard=lambda: self._exited("kubelet", self._kubelet),
            error=RealNodeError,
            details=lambda: self.log("kubelet"),
        )
        self._advertise_gpus()
        self.started_in = time.monotonic() - started

    def stop(self) -> None:
        """Stop the kubelet, the containers, containerd; undo what the node changed outside its
        directories. Idempotent."""
        if self._kubelet is not None:
            self._terminate(self._kubelet)
            self._kubelet = None
        if self._record is not None:
            machine.kill_cgroup(self._record.cgroup_root)
        if self._containerd is not None:
            self._terminate(self._containerd)
            self._containerd = None
        problems: list[str] = []
        if self._record is not None:
            problems = machine.undo(self._record)  # also removes the mount points it made
            (self.cluster.run_dir / machine.RECORD_NAME).unlink(missing_ok=True)
            self._record = None
        if self._holder is not None:
            with contextlib.suppress(ProcessLookupError):
                self._holder.kill()  # only when start failed before the record was written
            self._holder.wait(timeout=HOLDER_WAIT_TIMEOUT_S)
            self._holder = None
        for point in reversed(self._created_mount_points):
            with contextlib.suppress(OSError):
                point.rmdir()
        self._created_mount_points.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        if problems:
            raise RealNodeError("; ".join(problems))

    # ------------------------------------------------------------------ parts
    def _start_holder(self) -> None:
        """The process that holds the node's mount namespace, with its private paths mounted."""
        for point in PRIVATE_PATHS:
            if not point.exists():
                point.mkdir(parents=True)
                self._created_mount_points.append(point)
        mounts = " && ".join(f"mount -t tmpfs -o mode=0755 kvgate-e2e {p}" for p in PRIVATE_PATHS)
        self._holder = subprocess.Popen(
            [
                "nsenter",
                f"--net={self.cluster.netns.path}",
                "unshare",
                "--mount",
                "--propagation",
                "slave",
                "sh",
                "-c",
                f"{mounts} && echo ready && exec sleep infinity",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self._holder.stdout is not None
        line = self._holder.stdout.readline().strip()
        if line != "ready":
            raise RealNodeError(f"the node's mount namespace did not come up: {line}")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        assert self._holder is not None
        log = (self._dir / f"{name}.log").open("ab")
        self._logs.append(log)
        return subprocess.Popen(
            ["nsenter", "-t", str(self._holder.pid), "--mount", "--net", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
        )

    def _exited(self, name: str, proc: subprocess.Popen[bytes] | None) -> None:
        """Raise if ``proc`` has exited (a wait for it would only time out)."""
        if proc is not None and proc.poll() is not None:
            raise RealNodeError(
                f"{name} exited with {proc.returncode}:\n{_tail(self._dir / f'{name}.log')}"
            )

    def _ctr(
        self, *args: str, check: bool = True, timeout: float = 30.0
    ) -> subprocess.CompletedProcess[str]:
        found = artifacts.require()
        argv = [str(found.runtime_bin / "ctr"), "--address", str(self.socket), "-n", "k8s.io"]
        proc = subprocess.run(
            [*argv, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise RealNodeError(f"ctr {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    def _terminate(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def node(self) -> dict[str, Any] | None:
        proc = self.cluster.kubectl("get", "node", self.spec.name, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def _node_ready(self) -> bool:
        node = self.node()
        for cond in ((node or {}).get("status") or {}).get("conditions") or []:
            if cond.get("type") == "Ready":
                return bool(cond.get("status") == "True")
        return False

    def _advertise_gpus(self) -> None:
        """GPUs as an extended resource (the documented status patch: no device plugin here)
        and the simulated GPU memory as the loopback nodes carry it."""
        gpus = str(self.spec.gpus)
        patch = {"status": {"capacity": {GPU_RESOURCE: gpus}}}
        self.cluster.kubectl(
            "patch",
            "node",
            self.spec.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps(patch),
        )
        self.cluster.kubectl(
            "annotate",
            "node",
            self.spec.name,
            "--overwrite",
            f"{GPU_MEMORY_KEY}={format_gib(self.spec.gpu_memory_gib)}",
        )

        def allocatable() -> bool:
            node = self.node() or {}
            return bool(node.get("status", {}).get("allocatable", {}).get(GPU_RESOURCE) == gpus)

        poll_until(
            f"{GPU_RESOURCE} allocatable on {self.spec.name}",
            allocatable,
            NODE_READY_DEADLINE_S,
            period=0.5,
            error=RealNodeError,
        )

    def log(self, component: str, lines: int = 40) -> str:
        """The tail of ``kubelet`` or ``containerd``'s log."""
        return _tail(self._dir / f"{component}.log", lines)

    def remove_dir(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
