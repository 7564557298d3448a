"""A real Kubernetes control plane for the e2e tier, inside a private network namespace.

``Cluster`` is a context manager. On entry it

1. creates a network namespace ``kvgate-e2e-<random>`` (see ``netns.py``), brings ``lo`` up, adds
   the control-plane address 198.18.0.1/32 to ``lo`` and routes the Service CIDR to ``lo``;
2. generates a per-run PKI (``pki.py``) and writes two admin kubeconfigs;
3. starts, each as its own process via ``ip netns exec <ns> kvgate-k8s <subcommand>``, logging to
   ``<run dir>/logs/<name>.log``: embedded etcd, kube-apiserver (``Node,RBAC``), kube-controller-
   manager, kube-scheduler and kube-proxy (iptables mode);
4. waits, each with a deadline, for etcd ``/health``, apiserver ``/readyz``, controller-manager and
   scheduler ``/healthz`` and the ``default`` ServiceAccount in ``default``.

On exit (also after an exception, or if start-up itself fails) it stops every process (SIGTERM,
wait, SIGKILL), kills anything else left in the namespace (e.g. pods a loopback kubelet started),
deletes the namespace and removes the run directory. If a run dies without that (SIGKILL, a CI
timeout), the next ``Cluster.start`` reaps its namespace, processes and run directory through the
owner record in ``/run/kvgate-e2e`` (``netns.reap_stale_namespaces``); live runs are left alone.
Set ``KVGATE_E2E_KEEP_RUN_DIR=1`` to keep the run directory (logs) for debugging.

Addresses and why (all inside the private namespace; nothing is routable out of it):

* Service CIDR ``198.19.0.0/16``, routed to ``lo``. The ``kubernetes`` Service gets
  198.19.0.1, and kube-proxy DNATs it to the apiserver, so in-cluster clients
  (``KUBERNETES_SERVICE_HOST=198.19.0.1``) work exactly as in a real cluster. It is in the same
  never-routed RFC 2544 range as everything else here, so no 10.x (or other possibly real)
  address is ever used, not even inside the namespace.
* Control plane ``198.18.0.1``: the apiserver binds and advertises it. Because it is not
  loopback, the default ``lease`` endpoint reconciler can publish it in the ``kubernetes``
  Endpoints/EndpointSlice (127/8 is rejected there), so ``--endpoint-reconciler-type=none`` is
  not needed and kube-proxy has an endpoint to DNAT to. Inside the namespace
  ``https://198.18.0.1:6443`` is the apiserver; fixed ports are fine because the namespace is
  ours alone.
* Nodes ``198.18.0.10-198.18.0.254`` (``add_node_ip``) and pods from ``198.18.1.0`` up to
  ``198.18.239.254`` (``add_pod_ip``): /32s on ``lo``, in the RFC 2544 range that passes
  EndpointSlice validation. Real nodes' pods take 198.18.240.0/20 from their CNI bridge
  (``kvgate_e2e.realnode``).

How the test process (which stays in the host namespace) reaches the cluster:

* ``kubectl()``, ``helm()``, ``run_in_netns()``, ``popen_in_netns()`` run commands inside the
  namespace with the in-namespace kubeconfig ``kubeconfig``.
* ``host_kubeconfig`` points at ``https://127.0.0.1:<port>``: a small TCP relay (``TcpRelay``)
  in the test process listens on host loopback and pipes to 198.18.0.1:6443, using sockets created
  inside the namespace by one thread that ``setns``-ed into it. So Python clients in the test
  process work unchanged, and no other thread or test changes namespace. ``forward(host, port)``
  does the same for any in-namespace address (e.g. a router pod).

kube-proxy: one instance serves the whole namespace (several would fight over the same iptables
chains). It runs as ``--hostname-override=<proxy_node_name>``; the loopback kubelet should register
a node with that name (and keep its InternalIP stable). kube-proxy exits by design when its Node
appears, changes IPs or is deleted after start-up; ``Cluster`` restarts it then, as a DaemonSet
would, and its iptables rules persist across restarts. Until the node exists kube-proxy waits up to
30 s before it programs rules; ``wait_for_kubernetes_service()`` waits for that.
"""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from kvgate_e2e.build_artifacts import Binaries, require_binaries
from kvgate_e2e.netns import NetNamespace, TcpRelay, reap_stale_namespaces
from kvgate_e2e.pki import FRONT_PROXY_CLIENT, PkiPaths, generate_pki
from kvgate_e2e.polling import Deadline, poll_until

KEEP_RUN_DIR_ENV = "KVGATE_E2E_KEEP_RUN_DIR"
_PROXY_ENV = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
# One GET /readyz through the kubernetes Service while waiting for it (polled again on a failure).
READYZ_PROBE_TIMEOUT = 2.0
KILLED_WAIT_TIMEOUT = 10  # a component reaped after SIGKILL: at once; ends a wait that hangs
# kubectl's words when its discovery did not list a resource type it was asked for.
DISCOVERY_MISS = "the server doesn't have a resource type"
KUBECTL_DISCOVERY_ATTEMPTS = 3


DEFAULT_SERVICE_CIDR = ipaddress.IPv4Network("198.19.0.0/16")
DEFAULT_CONTROL_PLANE_IP = ipaddress.IPv4Address("198.18.0.1")
DEFAULT_NODE_IPS = (ipaddress.IPv4Address("198.18.0.10"), ipaddress.IPv4Address("198.18.0.254"))
# The loopback kubelet's pod addresses end below 198.18.240.0/20, the real nodes' pod network.
DEFAULT_POD_IPS = (ipaddress.IPv4Address("198.18.1.0"), ipaddress.IPv4Address("198.18.239.254"))


class ClusterError(RuntimeError):
    """The control plane failed to start or misbehaved; the message carries the log tail."""


def _check_exit(argv: Sequence[str], proc: subprocess.CompletedProcess[str]) -> None:
    """``ClusterError`` with the command, its exit status and its output if it failed."""
    if proc.returncode != 0:
        raise ClusterError(
            f"`{' '.join(argv)}` exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )


@dataclass(frozen=True)
class ClusterConfig:
    """Knobs for one ``Cluster``; the defaults suit the e2e tier."""

    service_cidr: ipaddress.IPv4Network = DEFAULT_SERVICE_CIDR
    control_plane_ip: ipaddress.IPv4Address = DEFAULT_CONTROL_PLANE_IP
    node_ips: tuple[ipaddress.IPv4Address, ipaddress.IPv4Address] = DEFAULT_NODE_IPS
    pod_ips: tuple[ipaddress.IPv4Address, ipaddress.IPv4Address] = DEFAULT_POD_IPS
    apiserver_port: int = 6443
    etcd_client_port: int = 2379
    etcd_peer_port: int = 2380
    controller_manager_port: int = 10257
    scheduler_port: int = 10259
    proxy_healthz_port: int = 10256
    proxy_metrics_port: int = 10249
    cluster_name: str = "kvgate-e2e"
    cluster_domain: str = "cluster.local"
    proxy_node_name: str = "kvgate-node-0"
    start_proxy: bool = True
    node_monitor_grace_period: str = "40s"
    # The HPA controller's loop (default 15 s): an HPA on the world's custom metrics
    # (kvgate_e2e.prometheus_adapter) acts within seconds of a metric's change.
    hpa_sync_period: str = "2s"
    start_timeout: float = 180.0
    stop_grace: float = 10.0
    extra_apiserver_args: tuple[str, ...] = ()
    extra_controller_manager_args: tuple[str, ...] = ()
    extra_scheduler_args: tuple[str, ...] = ()

    @property
    def kubernetes_service_ip(self) -> ipaddress.IPv4Address:
        """The ``kubernetes`` Service's ClusterIP: the first address of the Service CIDR."""
        return self.service_cidr.network_address + 1


class IpAllocator:
    """Hands out addresses from an inclusive range, skipping x.y.z.0 and x.y.z.255."""

    def __init__(self, first: ipaddress.IPv4Address, last: ipaddress.IPv4Address) -> None:
        self._next = int(first)
        self._last = int(last)
        self._free: list[ipaddress.IPv4Address] = []
        self._lock = threading.Lock()

    def allocate(self) -> ipaddress.IPv4Address:
        with self._lock:
            if self._free:
                return self._free.pop(0)
            while self._next <= self._last:
                addr = ipaddress.IPv4Address(self._next)
                self._next += 1
                if int(addr) & 0xFF not in (0, 255):
                    return addr
        raise ClusterError(f"IP range exhausted (last {ipaddress.IPv4Address(self._last)})")

    def release(self, addr: ipaddress.IPv4Address) -> None:
        with self._lock:
            self._free.append(addr)


@dataclass
class _Component:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen[bytes]
    log_file: IO[bytes]

    def alive(self) -> bool:
        return self.popen.poll() is None


def _tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_bytes()[-64 * 1024 :].decode("utf-8", "replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    return "\n".join(data.splitlines()[-lines:])


class Cluster:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kube-proxy in a private
    network namespace. Use as ``with Cluster() as cluster: ...``."""

    def __init__(
        self, config: ClusterConfig | None = None, binaries: Binaries | None = None
    ) -> None:
        self.config = config or ClusterConfig()
        self._binaries = binaries
        self.netns = NetNamespace()
        self._run_dir: Path | None = None
        self._pki: PkiPaths | None = None
        self._components: list[_Component] = []
        self._relays: list[TcpRelay] = []
        self._api_relay_port: int | None = None
        self._node_ips = IpAllocator(*self.config.node_ips)
        self._pod_ips = IpAllocator(*self.config.pod_ips)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._started = False

    # ----------------------------------------------------------------- public properties
    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            self._binaries = require_binaries()
        return self._binaries

    @property
    def run_dir(self) -> Path:
        """Per-run directory: PKI, kubeconfigs, etcd data, logs. Removed on exit."""
        if self._run_dir is None:
            raise ClusterError("cluster not started")
        return self._run_dir

    @property
    def log_dir(self) -> Path:
        return self.run_dir / "logs"

    @property
    def pki(self) -> PkiPaths:
        """CA cert/key, apiserver serving cert/key, admin client cert/key, SA key pair."""
        if self._pki is None:
            raise ClusterError("cluster not started")
        return self._pki

    @property
    def netns_name(self) -> str:
        return self.netns.name

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig for processes *inside* the namespace (server 198.18.0.1:6443)."""
        return self.run_dir / "admin.kubeconfig"

    @property
    def host_kubeconfig(self) -> Path:
        """Admin kubeconfig for the test process (server https://127.0.0.1:<relay port>)."""
        return self.run_dir / "admin-host.kubeconfig"

    @property
    def apiserver_url(self) -> str:
        return f"https://{self.config.control_plane_ip}:{self.config.apiserver_port}"

    @property
    def host_apiserver_url(self) -> str:
        if self._api_relay_port is None:
            raise ClusterError("cluster not started")
        return f"https://127.0.0.1:{self._api_relay_port}"

    @property
    def kubernetes_service_ip(self) -> ipaddress.IPv4Address:
        return self.config.kubernetes_service_ip

    @property
    def kubernetes_service_port(self) -> int:
        return 443

    @property
    def control_plane_ip(self) -> ipaddress.IPv4Address:
        return self.config.control_plane_ip

    @property
    def proxy_node_name(self) -> str:
        """Node name kube-proxy runs as; the loopback kubelet should register this node."""
        return self.config.proxy_node_name

    @property
    def cluster_domain(self) -> str:
        return self.config.cluster_domain

    def component_pids(self) -> dict[str, int]:
        """PID of each control-plane process (as started; kube-proxy's changes on restart)."""
        with self._lock:
            return {c.name: c.popen.pid for c in self._components}

    # ----------------------------------------------------------------- context manager
    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and self._run_dir is not None:
            self.dump_logs(sys.stderr)
        self.stop()

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        """Bring the control plane up; on any failure tear down everything and re-raise."""
        if self._started:
            raise ClusterError("cluster already started")
        self._started = True
        deadline = Deadline(self.config.start_timeout)
        try:
            binaries = self.binaries
            for name in reap_stale_namespaces():
                print(f"kvgate-e2e: reaped stale namespace {name} of a dead run", file=sys.stderr)
            self._run_dir = Path(tempfile.mkdtemp(prefix=f"{self.netns.name}-"))
            self.log_dir.mkdir()
            self._setup_netns()
            self.netns.record_owner(self._run_dir)
            cfg = self.config
            self._pki = generate_pki(
                self.run_dir / "pki",
                service_ip=cfg.kubernetes_service_ip,
                apiserver_ips=[cfg.control_plane_ip],
                cluster_domain=cfg.cluster_domain,
            )
            relay = TcpRelay(
                lambda: self.netns.connect(str(cfg.control_plane_ip), cfg.apiserver_port),
                name="apiserver-relay",
            )
            self._relays.append(relay)
            self._api_relay_port = relay.port
            self._write_kubeconfig(self.kubeconfig, self.apiserver_url)
            self._write_kubeconfig(self.host_kubeconfig, self.host_apiserver_url)

            self._spawn("etcd", binaries.k8s, self._etcd_args())
            self._wait("etcd /health", deadline, self._etcd_healthy)
            self._spawn("kube-apiserver", binaries.k8s, self._apiserver_args())
            self._wait("kube-apiserver /readyz", deadline, lambda: self._apiserver_ok("/readyz"))
            self._spawn("kube-controller-manager", binaries.k8s, self._controller_manager_args())
            self._spawn("kube-scheduler", binaries.k8s, self._scheduler_args())
            if cfg.start_proxy:
                self._spawn("kube-proxy", binaries.k8s, self._proxy_args())
                self._supervisor = threading.Thread(
                    target=self._supervise_proxy, name="kube-proxy-supervisor", daemon=True
                )
                self._supervisor.start()
            self._wait(
                "kube-controller-manager /healthz",
                deadline,
                lambda: self._component_healthy(cfg.controller_manager_port),
            )
            self._wait(
                "kube-scheduler /healthz",
                deadline,
                lambda: self._component_healthy(cfg.scheduler_port),
            )
            self._wait(
                "ServiceAccount default/default",
                deadline,
                lambda: self._apiserver_ok("/api/v1/namespaces/default/serviceaccounts/default"),
            )
        except BaseException:
            if self._run_dir is not None:
                self.dump_logs(sys.stderr)
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process, delete the namespace, remove the run directory. Idempotent."""
        self._stopping.set()
        errors: list[str] = []
        for relay in self._relays:
            with contextlib.suppress(Exception):
                relay.close()
        self._relays.clear()
        if self._supervisor is not None:
            self._supervisor.join(timeout=self.config.stop_grace + 5)
            self._supervisor = None
        with self._lock:
            components = list(reversed(self._components))
        for comp in components:
            self._terminate(comp, self.config.stop_grace)
        try:
            self.netns.delete()
        except Exception as exc:
            errors.append(str(exc))
        with self._lock:
            for comp in self._components:
                comp.log_file.close()
            self._components.clear()
        if self._run_dir is not None:
            if os.environ.get(KEEP_RUN_DIR_ENV):
                print(f"kvgate-e2e: kept run directory {self._run_dir}", file=sys.stderr)
            else:
                shutil.rmtree(self._run_dir, ignore_errors=True)
            self._run_dir = None
        if errors:
            raise ClusterError("; ".join(errors))

    # ----------------------------------------------------------------- helpers for tests
    def restart_apiserver(self, *, down_seconds: float = 0.0, timeout: float = 90.0) -> float:
        """Stop kube-apiserver (SIGTERM, as a rolling control-plane upgrade does), keep it down
        ``down_seconds``, start it again with the same flags and wait for /readyz. Every client
        (operator watches, kubelet, controllers) sees its connections drop. Returns the seconds
        from the stop until /readyz answered again."""
        with self._lock:
            comp = next(c for c in self._components if c.name == "kube-apiserver")
        began = time.monotonic()
        self._terminate(comp, self.config.stop_grace)
        if down_seconds > 0:
            time.sleep(down_seconds)  # the outage itself is what is being simulated
        with self._lock:
            self._respawn(comp, "kube-apiserver restarted by a test")
        self._wait(
            "kube-apiserver /readyz after its restart",
            Deadline(timeout),
            lambda: self._apiserver_ok("/readyz"),
        )
        return time.monotonic() - began

    def popen_in_netns(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, **kwargs: Any
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the namespace (``KUBECONFIG`` set to the admin kubeconfig)."""
        return subprocess.Popen(self.netns.exec_argv(argv), env=self._env(env), **kwargs)

    def run_in_netns(
        self,
        argv: Sequence[str],
        *,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120.0,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the namespace; raise ``ClusterError`` with stderr if it fails."""
        proc = subprocess.run(
            self.netns.exec_argv(argv),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self._env(env),
            check=False,
        )
        if check:
            _check_exit(argv, proc)
        return proc

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """The built kubectl, inside the namespace, as the admin user, with its discovery cache
        in the run dir (not ~/.kube: every world has the same server address). A command that
        fails because discovery lacked a resource type is run again, at most
        ``KUBECTL_DISCOVERY_ATTEMPTS`` times, and each miss is printed: a loaded API server can
        answer discovery without a CRD it serves."""
        argv = [
            str(self.binaries.k8s),
            "kubectl",
            f"--kubeconfig={self.kubeconfig}",
            f"--cache-dir={self.run_dir / 'kubectl-cache'}",
            *args,
        ]
        for attempt in range(1, KUBECTL_DISCOVERY_ATTEMPTS + 1):
            proc = self.run_in_netns(argv, input=input, check=False, timeout=timeout)
            missed = proc.returncode != 0 and DISCOVERY_MISS in proc.stderr
            if not missed or attempt == KUBECTL_DISCOVERY_ATTEMPTS:
                break
            print(
                f"MEASURED kubectl discovery miss, attempt {attempt}: {proc.stderr.strip()[:200]}"
            )
            time.sleep(attempt)  # a backoff between attempts, not a wait for a condition
        if check:
            _check_exit(argv, proc)
        return proc

    def helm(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 300.0
    ) -> subprocess.CompletedProcess[str]:
        """The built helm, inside the namespace, with its config/cache/data in the run dir."""
        home = self.run_dir / "helm"
        env = {
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        argv = [str(self.binaries.helm), f"--kubeconfig={self.kubeconfig}", *args]
        return self.run_in_netns(argv, input=input, check=check, timeout=timeout, env=env)

    def add_pod_ip(self) -> ipaddress.IPv4Address:
        """Allocate a pod address and add it as /32 to the namespace's ``lo``."""
        addr = self._pod_ips.allocate()
        self.netns.add_address(addr)
        return addr

    def release_pod_ip(self, addr: ipaddress.IPv4Address) -> None:
        self.netns.del_address(addr)
        self._pod_ips.release(addr)

    def add_node_ip(self) -> ipaddress.IPv4Address:
        """Allocate a node InternalIP and add it as /32 to the namespace's ``lo``."""
        addr = self._node_ips.allocate()
        self.netns.add_address(addr)
        return addr

    def connect(self, host: str, port: int, timeout: float = 5.0) -> socket.socket:
        """A TCP socket connected to ``host:port`` from inside the namespace."""
        return self.netns.connect(host, port, timeout)

    def forward(self, host: str, port: int) -> int:
        """Relay 127.0.0.1:<returned port> on the host to ``host:port`` inside the namespace."""
        relay = TcpRelay(lambda: self.netns.connect(host, port), name=f"relay-{host}:{port}")
        self._relays.append(relay)
        return relay.port

    def api_get(self, path: str, *, host: str | None = None, port: int | None = None) -> Any:
        """GET ``path`` from the apiserver as admin (from inside the namespace); parsed JSON."""
        status, body = self._https_get(
            host or str(self.config.control_plane_ip),
            port or self.config.apiserver_port,
            path,
            self._admin_tls(),
        )
        if status != 200:
            raise ClusterError(f"GET {path}: HTTP {status}: {body[:500]!r}")
        return json.loads(body)

    def new_api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for the test process (via the host relay)."""
        from kubernetes import config as k8s_config  # imported lazily: optional for callers

        new_client: Any = k8s_config.new_client_from_config
        return new_client(config_file=str(self.host_kubeconfig))

    def wait_for(
        self, description: str, predicate: Callable[[], bool], timeout: float = 60.0
    ) -> None:
        """Poll ``predicate`` until true; fail with the component logs after ``timeout``."""
        self._wait(description, Deadline(timeout), predicate)

    def wait_for_kubernetes_service(self, timeout: float = 90.0) -> None:
        """Wait until kube-proxy serves the ``kubernetes`` Service ClusterIP (198.19.0.1:443)."""

        def ok() -> bool:
            status, _ = self._https_get(
                str(self.kubernetes_service_ip),
                self.kubernetes_service_port,
                "/readyz",
                self._admin_tls(),
                timeout=READYZ_PROBE_TIMEOUT,
            )
            return status == 200

        self.wait_for("kube-proxy to serve the kubernetes Service ClusterIP", ok, timeout)

    def dump_logs(self, out: IO[str], lines: int = 40) -> None:
        """Write the tail of every component log to ``out`` (called on failure)."""
        if self._run_dir is None or not self.log_dir.is_dir():
            return
        for log in sorted(self.log_dir.glob("*.log")):
            out.write(f"----- {log.name} (last {lines} lines) -----\n{_tail(log, lines)}\n")
        out.flush()

    # ----------------------------------------------------------------- internals
    def _setup_netns(self) -> None:
        self.netns.create()
        self.netns.add_address(self.config.control_plane_ip)
        self.netns.route_to_lo(self.config.service_cidr)

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_ENV}
        env.pop("KUBECONFIG", None)
        if self._run_dir is not None:
            env["KUBECONFIG"] = str(self.kubeconfig)
        env.update(extra or {})
        return env

    def _write_kubeconfig(self, path: Path, server: str) -> None:
        kc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": self.config.cluster_name,
                    "cluster": {
                        "server": server,
                        "certificate-authority": str(self.pki.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": "kvgate-admin",
                    "user": {
                        "client-certificate": str(self.pki.admin_cert),
                        "client-key": str(self.pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "kvgate-e2e",
                    "context": {"cluster": self.config.cluster_name, "user": "kvgate-admin"},
                }
            ],
            "current-context": "kvgate-e2e",
        }
        path.write_text(json.dumps(kc, indent=2) + "\n")
        path.chmod(0o600)

    def _etcd_args(self) -> list[str]:
        c = self.config
        return [
            "etcd",
            f"--data-dir={self.run_dir / 'etcd'}",
            f"--listen-client-url=http://127.0.0.1:{c.etcd_client_port}",
            f"--listen-peer-url=http://127.0.0.1:{c.etcd_peer_port}",
            "--log-level=warn",
        ]

    def _apiserver_args(self) -> list[str]:
        c, p = self.config, self.pki
        return [
            "apiserver",
            f"--etcd-servers=http://127.0.0.1:{c.etcd_client_port}",
            f"--bind-address={c.control_plane_ip}",
            f"--advertise-address={c.control_plane_ip}",
            f"--secure-port={c.apiserver_port}",
            f"--cert-dir={self.run_dir / 'apiserver-certs'}",
            f"--tls-cert-file={p.apiserver_cert}",
            f"--tls-private-key-file={p.apiserver_key}",
            f"--client-ca-file={p.ca_cert}",
            f"--service-account-issuer=https://kubernetes.default.svc.{c.cluster_domain}",
            f"--service-account-key-file={p.sa_pub}",
            f"--service-account-signing-key-file={p.sa_key}",
            f"--service-cluster-ip-range={c.service_cidr}",
            f"--requestheader-client-ca-file={p.front_proxy_ca_cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={p.front_proxy_client_cert}",
            f"--proxy-client-key-file={p.front_proxy_client_key}",
            # pods/log (and exec/portforward) go to the loopback kubelet's HTTPS port on the
            # node's InternalIP, with the apiserver's own client certificate.
            f"--kubelet-client-certificate={p.kubelet_client_cert}",
            f"--kubelet-client-key={p.kubelet_client_key}",
            f"--kubelet-certificate-authority={p.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            "--profiling=false",
            *c.extra_apiserver_args,
        ]

    def _controller_manager_args(self) -> list[str]:
        c, p = self.config, self.pki
        kc = str(self.kubeconfig)
        return [
            "controller-manager",
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={p.sa_key}",
            f"--root-ca-file={p.ca_cert}",
            f"--cluster-signing-cert-file={p.ca_cert}",
            f"--cluster-signing-key-file={p.ca_key}",
            f"--cluster-name={c.cluster_name}",
            "--bind-address=127.0.0.1",
            f"--secure-port={c.controller_manager_port}",
            f"--cert-dir={self.run_dir / 'controller-manager-certs'}",
            f"--node-monitor-grace-period={c.node_monitor_grace_period}",
            f"--horizontal-pod-autoscaler-sync-period={c.hpa_sync_period}",
            "--profiling=false",
            *c.extra_controller_manager_args,
        ]

    def _scheduler_args(self) -> list[str]:
        c = self.config
        kc = str(self.kubeconfig)
        return [
            "scheduler",
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={c.scheduler_port}",
            f"--cert-dir={self.run_dir / 'scheduler-certs'}",
            "--profiling=false",
            *c.extra_scheduler_args,
        ]

    def _proxy_args(self) -> list[str]:
        c = self.config
        return [
            "proxy",
            f"--kubeconfig={self.kubeconfig}",
            "--proxy-mode=iptables",
            f"--hostname-override={c.proxy_node_name}",
            # Fallback node IP while the Node doesn't exist (instead of "assuming loopback").
            f"--bind-address={c.control_plane_ip}",
            f"--healthz-bind-address=127.0.0.1:{c.proxy_healthz_port}",
            f"--metrics-bind-address=127.0.0.1:{c.proxy_metrics_port}",
            # 0 = leave conntrack sysctls alone; nf_conntrack_max is read-only in a netns.
            "--conntrack-max-per-core=0",
            "--conntrack-min=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--nodeport-addresses=primary",
            "--iptables-min-sync-period=0s",
            "--profiling=false",
        ]

    def _spawn(self, name: str, binary: Path, args: list[str]) -> _Component:
        log_path = self.log_dir / f"{name}.log"
        log_file = log_path.open("ab")
        argv = self.netns.exec_argv([str(binary), *args])
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.run_dir,
            env=self._env(),
            start_new_session=True,
        )
        comp = _Component(name=name, argv=argv, log_path=log_path, popen=popen, log_file=log_file)
        with self._lock:
            self._components.append(comp)
        return comp

    def _supervise_proxy(self) -> None:
        """Restart kube-proxy when it exits on its own (it does so by design on Node changes)."""
        backoff = 1.0
        while not self._stopping.wait(0.5):
            with self._lock:
                comp = next((c for c in self._components if c.name == "kube-proxy"), None)
            if comp is None or comp.alive():
                continue
            if self._stopping.wait(backoff):
                return
            code = comp.popen.returncode
            with self._lock:
                if self._stopping.is_set():
                    return
                self._respawn(comp, f"kube-proxy exited with {code}; restarting")
            backoff = min(backoff * 2, 10.0)

    def _respawn(self, comp: _Component, why: str) -> None:
        """Start a stopped component again with its own argv and log (caller holds the lock)."""
        comp.log_file.write(f"\n===== kvgate-e2e: {why} =====\n".encode())
        comp.log_file.flush()
        comp.popen = subprocess.Popen(
            comp.argv,
            stdin=subprocess.DEVNULL,
            stdout=comp.log_file,
            stderr=subprocess.STDOUT,
            cwd=self.run_dir,
            env=self._env(),
            start_new_session=True,
        )

    @staticmethod
    def _terminate(comp: _Component, grace: float) -> None:
        if not comp.alive():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(comp.popen.pid, signal.SIGTERM)
        try:
            comp.popen.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(comp.popen.pid, signal.SIGKILL)
            comp.popen.wait(timeout=KILLED_WAIT_TIMEOUT)

    def _wait(self, description: str, deadline: Deadline, predicate: Callable[[], bool]) -> None:
        def no_component_died() -> None:
            with self._lock:
                dead = [c for c in self._components if not c.alive() and c.name != "kube-proxy"]
            if dead:
                c = dead[0]
                raise ClusterError(
                    f"{c.name} exited with code {c.popen.returncode} while waiting for "
                    f"{description}; last lines of {c.log_path}:\n{_tail(c.log_path)}"
                )

        poll_until(
            description,
            predicate,
            deadline,
            period=0.25,
            retry_on=(OSError, http.client.HTTPException, ValueError),
            error=ClusterError,
            guard=no_component_died,
        )

    def _admin_tls(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def _https_get(
        self,
        host: str,
        port: int,
        path: str,
        tls: ssl.SSLContext | None,
        *,
        timeout: float = 5.0,
    ) -> tuple[int, bytes]:
        sock = self.netns.connect(host, port, timeout)
        try:
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
            conn = http.client.HTTPConnection(host, port, timeout=timeout)
            conn.sock = sock
            conn.request("GET", path, headers={"Accept": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            sock.close()

    def _etcd_healthy(self) -> bool:
        status, body = self._https_get("127.0.0.1", self.config.etcd_client_port, "/health", None)
        return status == 200 and json.loads(body).get("health") == "true"

    def _apiserver_ok(self, path: str) -> bool:
        status, _ = self._https_get(
            str(self.config.control_plane_ip), self.config.apiserver_port, path, self._admin_tls()
        )
        return status == 200

    def _component_healthy(self, port: int) -> bool:
        # Self-signed serving certs; /healthz is in the default always-allow paths.
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        status, _ = self._https_get("127.0.0.1", port, "/healthz", ctx)
        return status == 200


@contextlib.contextmanager
def running_cluster(config: ClusterConfig | None = None) -> Iterator[Cluster]:
    """``with running_cluster() as c:`` — the same as ``with Cluster(config) as c:``."""
    with Cluster(config) as cluster:
        yield cluster
