"""A real prometheus-adapter in the e2e world: ``custom.metrics.k8s.io`` served from a
``Prometheus`` of the world through the API server's aggregation layer, so the world's own
kube-controller-manager runs the real HPA controller on engine metrics.

The adapter (``sigs.k8s.io/prometheus-adapter``, built from its Go module by
``e2e/prometheus-adapter/build.sh``, cached outside the clone) runs as a host process inside the
world's network namespace, as Prometheus does (``kvgate_e2e.prometheus``): on the control-plane
address, a port of its own, its files (serving certificate, client certificate, kubeconfig, rules,
log) in the run directory, all removed on the way out. Its rules are
``docs/autoscaling/prometheus-adapter-rules.yaml``, the file the docs show users.

How the API server reaches it, as in a cluster: the ``APIService`` objects
``v1beta1.custom.metrics.k8s.io`` and ``v1beta2.custom.metrics.k8s.io`` name the Service
``kvgate-e2e-prometheus-adapter`` in ``kube-system`` (a namespace never deleted, so a next
adapter never meets a terminating one) with the world's CA as ``caBundle``; that Service has no
selector, and an EndpointSlice of our own lists the adapter's address and port (the apiserver
dials the Service's ClusterIP, which kube-proxy DNATs to it). The serving certificate, signed by
the world's CA, names ``kvgate-e2e-prometheus-adapter.kube-system.svc`` (the name the aggregator
verifies). The adapter authenticates the aggregator's front proxy with the world's front-proxy
CA (``--requestheader-*``) and delegates authentication and authorization to the apiserver as
its own user ``kvgate-e2e:prometheus-adapter`` (a client certificate from the world's CA), which
holds exactly the upstream manifests' rights: ``system:auth-delegator``,
``extension-apiserver-authentication-reader`` in ``kube-system``, and read on namespaces, pods,
nodes and services. The HPA controller (``--use-service-account-credentials``: the
``horizontal-pod-autoscaler`` ServiceAccount) reads custom metrics with its bootstrap role.
Everything registered carries the labels ``LABELS`` and is deleted by them on the way out.

The APIService is cluster-wide: one adapter at a time per world. ``PrometheusAdapter`` holds an
exclusive lock (a file in the run directory, shared by the workers of a shared world) from start
to stop; a second one waits for it.

Usage (fixture ``metrics_adapter`` in ``e2e/tests/conftest.py``, module scope)::

    with PrometheusAdapter(world.cluster, prometheus) as adapter:
        adapter.pod_metrics(ns, "sglang_num_queue_reqs")       # -> {pod: value}
        adapter.wait_pod_metrics(ns, "sglang_num_queue_reqs", lambda v: ..., 60)
        adapter.raw("/apis/custom.metrics.k8s.io/v1beta1")        # -> parsed JSON
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any, Protocol

import yaml
from cryptography.x509.oid import ExtendedKeyUsageOID
from kvgate.kube.tls import issue_certificate

from kvgate_e2e.cluster_like import ClusterLike
from kvgate_e2e.deadlines import BUILD_QUERY_TIMEOUT
from kvgate_e2e.lifecycle import Started
from kvgate_e2e.pki import FRONT_PROXY_CLIENT, load_ca
from kvgate_e2e.polling import Deadline, poll_until
from kvgate_e2e.server_process import ServerProcess

E2E_DIR = Path(__file__).resolve().parent.parent
REPO = E2E_DIR.parent
BUILD_SCRIPT = E2E_DIR / "prometheus-adapter" / "build.sh"
RULES_FILE = REPO / "docs" / "autoscaling" / "prometheus-adapter-rules.yaml"
NAMESPACE = "kube-system"
SERVICE = "kvgate-e2e-prometheus-adapter"  # also the prefix of its RBAC objects' names
USER = "kvgate-e2e:prometheus-adapter"
GROUP = "custom.metrics.k8s.io"
VERSIONS = ("v1beta1", "v1beta2")
FIRST_PORT = 16443
PORT_TRIES = 20
RELIST_SECONDS = 2.0
LOCK_SECONDS = 900.0  # how long a second adapter waits for the first to stop
LABELS = {"app.kubernetes.io/name": "prometheus-adapter", "app.kubernetes.io/part-of": "kvgate-e2e"}


class AdapterError(RuntimeError):
    """The adapter is not built, did not come up, or its API answered an error."""


class PrometheusLike(Protocol):
    host: str
    port: int | None


# ---------------------------------------------------------------------------- build artifacts
def adapter_binary() -> Path | None:
    """The built adapter, or None when ``e2e/prometheus-adapter/build.sh`` has not built it."""
    try:
        proc = subprocess.run(
            [str(BUILD_SCRIPT), "--print-path"],
            capture_output=True,
            text=True,
            timeout=BUILD_QUERY_TIMEOUT,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = Path(proc.stdout.strip()) if proc.returncode == 0 else None
    return path if path is not None and path.is_file() else None


def missing_adapter_reason() -> str:
    return (
        f"prometheus-adapter is not built; build it with `{BUILD_SCRIPT}` or "
        "`make prometheus-adapter` (minutes on 2 cores, then cached)"
    )


# ---------------------------------------------------------------------------- config (pure)
def service_host(namespace: str = NAMESPACE, service: str = SERVICE) -> str:
    """The name the aggregator verifies the adapter's serving certificate against."""
    return f"{service}.{namespace}.svc"


def adapter_args(
    directory: Path,
    *,
    host: str,
    port: int,
    prometheus_url: str,
    front_proxy_ca: Path,
    relist_seconds: float = RELIST_SECONDS,
) -> list[str]:
    """The adapter's flags; its files (``serving.crt``/``.key``, ``adapter.kubeconfig``,
    ``rules.yaml``) in ``directory``."""
    kubeconfig = directory / "adapter.kubeconfig"
    relist = f"{int(relist_seconds * 1000)}ms"
    return [
        f"--prometheus-url={prometheus_url}",
        f"--config={directory / 'rules.yaml'}",
        f"--metrics-relist-interval={relist}",
        f"--metrics-max-age={relist}",
        f"--bind-address={host}",
        f"--secure-port={port}",
        f"--tls-cert-file={directory / 'serving.crt'}",
        f"--tls-private-key-file={directory / 'serving.key'}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--requestheader-client-ca-file={front_proxy_ca}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--v=1",
    ]


def kubeconfig(server: str, ca: Path, cert: Path, key: Path) -> dict[str, Any]:
    """A kubeconfig for the adapter's own user (its client certificate files)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "world", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {"name": USER, "user": {"client-certificate": str(cert), "client-key": str(key)}}
        ],
        "contexts": [{"name": "adapter", "context": {"cluster": "world", "user": USER}}],
        "current-context": "adapter",
    }


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(LABELS)}
    if namespace is not None:
        meta["namespace"] = namespace
    return meta


def rbac_objects(user: str = USER, prefix: str = SERVICE) -> list[dict[str, Any]]:
    """The rights the upstream manifests give the adapter, bound to ``user``; the objects'
    names start with ``prefix``."""
    subject = [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]
    reader = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": _meta(f"{prefix}:resource-reader"),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["namespaces", "pods", "nodes", "services"],
                "verbs": ["get", "list", "watch"],
            }
        ],
    }

    def binding(kind: str, name: str, role_kind: str, role: str, ns: str | None) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": kind,
            "metadata": _meta(name, ns),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": subject,
        }

    return [
        reader,
        binding("ClusterRoleBinding", f"{prefix}:resource-reader", "ClusterRole",
                f"{prefix}:resource-reader", None),
        binding("ClusterRoleBinding", f"{prefix}:auth-delegator", "ClusterRole",
                "system:auth-delegator", None),
        binding("RoleBinding", f"{prefix}:auth-reader", "Role",
                "extension-apiserver-authentication-reader", "kube-system"),
    ]  # fmt: skip


def service_objects(
    host: str, port: int, namespace: str = NAMESPACE, service: str = SERVICE
) -> list[dict[str, Any]]:
    """A Service without selector and the EndpointSlice that sends it to ``host:port`` (the
    adapter's process)."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": _meta(service, namespace),
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                **_meta(f"{service}-host", namespace),
                "labels": {**LABELS, "kubernetes.io/service-name": service},
            },
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
        },
    ]


def api_services(
    ca_bundle_pem: bytes, namespace: str = NAMESPACE, service: str = SERVICE
) -> list[dict[str, Any]]:
    """``v1beta1``/``v1beta2.custom.metrics.k8s.io`` served by the adapter's Service, verified
    with the world's CA (no ``insecureSkipTLSVerify``)."""
    import base64

    return [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": _meta(f"{version}.{GROUP}"),
            "spec": {
                "group": GROUP,
                "version": version,
                "service": {"name": service, "namespace": namespace, "port": 443},
                "caBundle": base64.b64encode(ca_bundle_pem).decode(),
                "groupPriorityMinimum": 100,
                "versionPriority": 200 if version == "v1beta2" else 100,
            },
        }
        for version in VERSIONS
    ]


_SUFFIX = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def quantity(text: str) -> float:
    """A Kubernetes quantity as the metrics APIs write values (``"4"``, ``"1500m"``, ``"2k"``)."""
    match = re.fullmatch(r"([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([numkMGT]?)", text.strip())
    if match is None:
        raise AdapterError(f"not a quantity: {text!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def pod_values(answer: Mapping[str, Any]) -> dict[str, float]:
    """``{pod: value}`` of a ``MetricValueList`` for ``pods/*``."""
    return {
        str(item["describedObject"]["name"]): quantity(str(item["value"]))
        for item in answer.get("items") or []
    }


def available(api_service: Mapping[str, Any]) -> tuple[bool, str]:
    """(Available, its reason and message) of an APIService."""
    for cond in (api_service.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Available":
            return cond.get("status") == "True", f"{cond.get('reason')}: {cond.get('message')}"
    return False, "no Available condition yet"


# ---------------------------------------------------------------------------- the process
class PrometheusAdapter(Started):
    """The adapter process, its API registration and RBAC, and a client; a context manager."""

    def __init__(
        self,
        cluster: ClusterLike,
        prometheus: PrometheusLike,
        *,
        relist_seconds: float = RELIST_SECONDS,
        progress: IO[str] | None = None,
    ) -> None:
        self.cluster = cluster
        self.prometheus = prometheus
        self.relist_seconds = relist_seconds
        self.host = "198.18.0.1"  # the control-plane address, as Prometheus
        self.port: int | None = None
        self.dir: Path | None = None
        self._server: ServerProcess | None = None
        self._lock: IO[bytes] | None = None
        self._objects: list[dict[str, Any]] = []
        self._progress = progress

    @property
    def prometheus_url(self) -> str:
        if self.prometheus.port is None:
            raise AdapterError("its Prometheus is not running")
        return f"http://{self.prometheus.host}:{self.prometheus.port}/"

    @property
    def log_path(self) -> Path:
        assert self.dir is not None, "not started"
        return self.dir / "adapter.log"

    def start(self, timeout: float = 120.0) -> None:
        binary = adapter_binary()
        if binary is None:
            raise AdapterError(missing_adapter_reason())
        self._take_lock()
        deadline = Deadline(timeout)
        for port in range(FIRST_PORT, FIRST_PORT + PORT_TRIES):
            directory = self.cluster.run_dir / f"prometheus-adapter-{port}"
            try:
                directory.mkdir()
            except FileExistsError:
                continue
            self.dir, self.port = directory, port
            self._write_files()
            self._launch(binary)
            self._register()
            self._wait_available(deadline)
            return
        raise AdapterError(f"no free port for the adapter in {FIRST_PORT}+{PORT_TRIES}")

    def _take_lock(self) -> None:
        self._lock = (self.cluster.run_dir / "prometheus-adapter.lock").open("wb")

        def locked() -> bool:
            assert self._lock is not None
            try:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        poll_until(
            "the world's other prometheus-adapter to stop (one APIService per world)",
            locked,
            LOCK_SECONDS,
            period=1.0,
            error=AdapterError,
        )

    def _write_files(self) -> None:
        assert self.dir is not None
        pki = self.cluster.pki
        ca = load_ca(pki.ca_cert, pki.ca_key)
        serving = issue_certificate(
            ca,
            common_name=service_host(),
            dns_names=[service_host(), f"{service_host()}.cluster.local"],
            ip_addresses=[self.host],
            valid_days=2,
        )
        client = issue_certificate(
            ca, common_name=USER, usages=[ExtendedKeyUsageOID.CLIENT_AUTH], valid_days=2
        )
        files = {
            "serving.crt": serving.cert_pem,
            "serving.key": serving.key_pem,
            "client.crt": client.cert_pem,
            "client.key": client.key_pem,
        }
        for name, data in files.items():
            (self.dir / name).write_bytes(data)
            (self.dir / name).chmod(0o600)
        config = kubeconfig(
            self.cluster.apiserver_url,
            pki.ca_cert,
            self.dir / "client.crt",
            self.dir / "client.key",
        )
        (self.dir / "adapter.kubeconfig").write_text(json.dumps(config, indent=2))
        shutil.copyfile(RULES_FILE, self.dir / "rules.yaml")

    def _launch(self, binary: Path) -> None:
        assert self.dir is not None and self.port is not None
        args = adapter_args(
            self.dir,
            host=self.host,
            port=self.port,
            prometheus_url=self.prometheus_url,
            front_proxy_ca=self.cluster.pki.front_proxy_ca_cert,
            relist_seconds=self.relist_seconds,
        )
        self._server = ServerProcess(
            "prometheus-adapter", self.log_path, error=AdapterError, stop_seconds=15.0
        )
        self._server.start(self.cluster, [str(binary), *args], cwd=self.dir)
        self._say(f"prometheus-adapter at {self.host}:{self.port} (pid {self._server.pid})")

    def _register(self) -> None:
        assert self.port is not None
        objects = [
            *service_objects(self.host, self.port),
            *rbac_objects(),
            *api_services(self.cluster.pki.ca_cert.read_bytes()),
        ]
        self._objects = objects
        text = yaml.safe_dump_all(objects)
        self.cluster.kubectl("apply", "-f", "-", input=text)

    def _unregister(self) -> None:
        """Delete what ``_register`` created, the APIServices first (the aggregator stops
        sending requests before the process goes)."""
        selector = ",".join(f"{k}={v}" for k, v in LABELS.items())
        for kinds, where in (
            ("apiservice", []),
            ("clusterrolebinding,clusterrole", []),
            ("service,endpointslice,rolebinding", [f"--namespace={NAMESPACE}"]),
        ):
            self.cluster.kubectl(
                "delete", kinds, *where, f"--selector={selector}", "--ignore-not-found",
                check=False,
            )  # fmt: skip
        self._objects = []

    def _wait_available(self, deadline: Deadline) -> None:
        server = self._server
        assert server is not None

        def ready() -> bool:
            for version in VERSIONS:
                proc = self.cluster.kubectl(
                    "get", "apiservice", f"{version}.{GROUP}", "-o", "json", check=False
                )
                if proc.returncode != 0 or not available(json.loads(proc.stdout))[0]:
                    return False
                # An Available condition may be an earlier object's, not yet re-checked: the
                # group must answer through the aggregator too.
                self.raw(f"/apis/{GROUP}/{version}")
            return True

        poll_until(
            f"the {GROUP} APIServices to be Available",
            ready,
            deadline,
            period=0.5,
            retry_on=(ValueError, AdapterError),
            error=AdapterError,
            details=self._story,
            guard=server.check_running,
        )

    def stop(self) -> None:
        if self._objects:
            self._unregister()
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    # -- reading
    def raw(self, path: str) -> dict[str, Any]:
        """``kubectl get --raw <path>`` through the apiserver (the aggregation layer)."""
        proc = self.cluster.kubectl("get", "--raw", path, check=False)
        if proc.returncode != 0:
            raise AdapterError(f"GET {path}: {proc.stderr.strip()}")
        return dict(json.loads(proc.stdout))

    def pod_metrics(
        self, namespace: str, metric: str, selector: str = "", version: str = "v1beta1"
    ) -> dict[str, float]:
        """``{pod: value}`` of ``metric`` for the pods of ``namespace`` (``selector``: a label
        selector), as an HPA's Pods metric reads it."""
        path = f"/apis/{GROUP}/{version}/namespaces/{namespace}/pods/*/{metric}"
        if selector:
            from urllib.parse import quote

            path += f"?labelSelector={quote(selector)}"
        return pod_values(self.raw(path))

    def wait_pod_metrics(
        self,
        namespace: str,
        metric: str,
        accept: Callable[[dict[str, float]], bool],
        timeout: float = 60.0,
        selector: str = "",
    ) -> dict[str, float]:
        """Wait until ``accept(pod_metrics(...))``; returns those values."""

        def probe() -> dict[str, float] | None:
            values = self.pod_metrics(namespace, metric, selector)
            return values if accept(values) else None

        return poll_until(
            f"{metric} in {namespace} from {GROUP}",
            probe,
            timeout,
            period=0.5,
            details=self._story,
        )

    def _story(self) -> str:
        lines = []
        with contextlib.suppress(Exception):
            for version in VERSIONS:
                proc = self.cluster.kubectl("get", "apiservice", f"{version}.{GROUP}", "-o", "json")
                lines.append(f"{version}: {available(json.loads(proc.stdout))[1]}")
        return "\n".join(lines) + "\n" + self.log_tail()

    def log_tail(self, lines: int = 40) -> str:
        if self.dir is None or not self.log_path.exists():
            return "(no prometheus-adapter log)"
        text = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        return "--- prometheus-adapter log (tail) ---\n" + "\n".join(text)

    def _say(self, text: str) -> None:
        if self._progress is not None:
            self._progress.write(f"[prometheus-adapter] {text}\n")
            self._progress.flush()
