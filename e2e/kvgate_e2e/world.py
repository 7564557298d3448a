"""The whole kvgate system on the e2e control plane: ``with World() as world: ...``.

Brings up, in order: the ``Cluster`` (etcd, apiserver, controller-manager, scheduler, kube-proxy in
a private network namespace), the loopback kubelet with two GPU node pools (``big``: 32 x 80 GiB,
``small``: 8 x 24 GiB; label ``kvgate.io/pool``), then ``helm install kvgate charts/kvgate`` into
``kvgate-system``. The chart's operator pod runs through the kubelet as ``kvgate operator ...``
with its own ServiceAccount and RBAC and serves the webhook through its Service. ``__enter__``
returns once the operator pod is Ready and the API server gets answers from the webhook. On exit
everything is torn down (release, kubelet and its processes, control plane, namespace), also
after a failed start.

Helpers read like a user's session: ``apply(yaml)``, ``get_md(name, ns)``, ``wait_for(...)``,
``router_request(md, body, ns)``. Everything runs as the cluster admin through the built kubectl,
inside the namespace, except ``get``/``list``, which read the same JSON in-process (see
``api_reader``: they run in every wait loop); the router is reached through its Service ClusterIP
(kube-proxy) via a relay from the test process.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, Self, TypeVar

import yaml

from kvgate_e2e.api_reader import ApiReader
from kvgate_e2e.cluster import Cluster, ClusterConfig
from kvgate_e2e.kubelet.agent import KubeletThread, container_pid
from kvgate_e2e.lifecycle import Started
from kvgate_e2e.lws import LwsController
from kvgate_e2e.pki import ADMIN_USER
from kvgate_e2e.polling import poll_until

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kvgate"
SAMPLES = REPO / "crds" / "samples"
OPERATOR_NAMESPACE = "kvgate-system"
RELEASE = "kvgate"  # also the controller Deployment and its leader Lease
WEBHOOK_DEPLOYMENT = f"{RELEASE}-webhook"
OPERATOR_SELECTOR = "app.kubernetes.io/name=kvgate,app.kubernetes.io/component=operator"
WEBHOOK_SELECTOR = "app.kubernetes.io/name=kvgate,app.kubernetes.io/component=webhook"
BIG_POOL, SMALL_POOL = "big", "small"
BIG_POOL_GPUS = 32
SMALL_NODE = "kvgate-small-0"
# The real SGLang's pool and node (GPUs only for scheduling: the engines run on CPU), apart from
# the big pool, so the real-engine scenarios and the demo change no node another test uses.
REAL_POOL, REAL_NODE = "real", "kvgate-real-0"
REAL_NODE_SPEC = f"{REAL_NODE}:pool={REAL_POOL}:gpus=8:gpu-memory-gib=80"
# Pools of one node each for the scenarios that change a node while other tests share the world:
# the engine-restart scenario shrinks its node's GPU memory, the engine-window attack gives every
# engine its node starts an extra flag, the incident caps its node's pools. No other test pins
# an engine there, so what they do to their node reaches no other test's engines.
RESTART_POOL, RESTART_NODE = "restart", "kvgate-restart-0"
WINDOW_POOL, WINDOW_NODE = "window", "kvgate-window-0"
INCIDENT_POOL, INCIDENT_NODE = "incident", "kvgate-incident-0"
# The incident on the released pre-fix SGLang (test_scenario_real_incident.py): a real-engine
# node of its own, so its pool cap and release annotation reach no other real engine.
REAL_INCIDENT_POOL, REAL_INCIDENT_NODE = "real-incident", "kvgate-real-incident-0"
# The alerts scenario (test_alerts_fire.py) caps its node's pool and loads its engines' KV pools.
ALERTS_POOL, ALERTS_NODE = "alerts", "kvgate-alerts-0"
TEST_NODE_SPECS: tuple[str, ...] = (
    REAL_NODE_SPEC,
    f"{RESTART_NODE}:pool={RESTART_POOL}:gpus=8:gpu-memory-gib=80",
    f"{WINDOW_NODE}:pool={WINDOW_POOL}:gpus=8:gpu-memory-gib=80",
    f"{INCIDENT_NODE}:pool={INCIDENT_POOL}:gpus=8:gpu-memory-gib=24",
    f"{REAL_INCIDENT_NODE}:pool={REAL_INCIDENT_POOL}:gpus=8:gpu-memory-gib=80",
    f"{ALERTS_NODE}:pool={ALERTS_POOL}:gpus=8:gpu-memory-gib=80",
)
GATE = "kvgate.io/engine-verified"
T = TypeVar("T")
# The node directory under which the e2e release lets a ModelDeployment mount weights from a
# hostPath (the chart value hostPaths.modelPrefixes; the chart's default allows none).
MODEL_HOST_PATH_PREFIX = "/var/lib/kvgate-e2e/models"
# The webhook denying an unsafe ModelDeployment after the install: its pod Ready and its Service's
# endpoint programmed for the API server.
WEBHOOK_DEADLINE = 60
# PodTimeline's watch: each request ends after WATCH_SECONDS and is made again (a period, not a
# deadline); the client gives up on one after WATCH_REQUEST_TIMEOUT, above it.
WATCH_SECONDS = 5
WATCH_REQUEST_TIMEOUT = 10

# Operator environment for the e2e world: re-verify every 2 s (the CR default is 30 s) so
# "verification never ends" is observable within a test; reconcile faster while in flight.
E2E_OPERATOR_ENV: dict[str, str] = {
    "KVGATE_REVERIFY_SECONDS": "2",
    "KVGATE_RECONCILE_SECONDS": "1",
    "KVGATE_STEADY_RECONCILE_SECONDS": "5",
}


class WorldError(RuntimeError):
    """The world did not come up, or a wait ran out; the message says what and shows logs."""


@dataclass
class WorldConfig:
    """Knobs for one ``World``."""

    operator_env: dict[str, str] = field(default_factory=lambda: dict(E2E_OPERATOR_ENV))
    helm_values: dict[str, Any] = field(default_factory=dict)  # merged over the world's own
    start_timeout: float = 240.0
    # LeaderWorkerSet (kvgate_e2e.lws) started before kvgate, and the chart's
    # leaderWorkerSet.enabled=true: the world for multi-node engines.
    leaderworkerset: bool = False
    progress: IO[str] | None = None  # where to print start-up steps (the demo uses stdout)
    # More nodes beside the two GPU pools, as kubelet node specs
    # ("<name>:pool=<pool>:gpus=<n>:gpu-memory-gib=<GiB>"; the demo's real-SGLang pool).
    extra_nodes: tuple[str, ...] = ()
    # The control plane's own knobs (e.g. the scale benchmark raises the controllers' API rates).
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


def chart_values(config: WorldConfig) -> dict[str, Any]:
    """The chart values the world installs with (pure)."""
    env: list[dict[str, Any]] = [
        # Every pod shares one network namespace here: bind the operator's listeners to its
        # own pod IP, as a pod in a real cluster effectively does with 0.0.0.0.
        {"name": "KVGATE_BIND_ADDRESS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        *({"name": k, "value": v} for k, v in sorted(config.operator_env.items())),
    ]
    values: dict[str, Any] = {
        "extraEnv": env,
        # The webhook pods bind to their pod IP too.
        "webhook": {"extraEnv": env[:1]},
        # Probe quickly so the world starts fast; the chart's defaults suit a real cluster.
        "readinessProbe": {"initialDelaySeconds": 0, "periodSeconds": 1},
        "logFormat": "text",
        "hostPaths": {"modelPrefixes": [MODEL_HOST_PATH_PREFIX]},
    }
    if config.leaderworkerset:
        values["leaderWorkerSet"] = {"enabled": True}
        # The LeaderWorkerSet controller runs here as the cluster admin (kvgate_e2e.lws), not as
        # its release's ServiceAccount: the admission policy must let that user write the
        # groups' StatefulSets.
        values["admissionPolicy"] = {"leaderWorkerSetControllers": [ADMIN_USER]}
    return _deep_merge(values, config.helm_values)


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


class World(Started):
    """Cluster + loopback kubelet (two GPU pools) + kvgate installed by Helm."""

    def __init__(self, config: WorldConfig | None = None) -> None:
        self.config = config or WorldConfig()
        self._stack = ExitStack()
        self._cluster: Cluster | None = None
        self._kubelet: KubeletThread | None = None
        self._installed = False
        self._forwards: dict[tuple[str, int], int] = {}
        self._deleting: set[str] = set()  # namespaces delete_namespace(wait=False) left going
        self._reader: ApiReader | None = None
        self._lws: LwsController | None = None

    # ------------------------------------------------------------------ lifecycle
    def _say(self, text: str) -> None:
        if self.config.progress is not None:
            self.config.progress.write(f"[world {time.strftime('%H:%M:%S')}] {text}\n")
            self.config.progress.flush()

    def start(self) -> None:
        started = time.monotonic()
        self._say("starting the control plane (etcd, apiserver, controller-manager, ...)")
        self._cluster = self._stack.enter_context(Cluster(self.config.cluster))
        self._say(f"control plane up in network namespace {self._cluster.netns_name}")
        nodes = [
            # 32 GPUs: up to three test files share the pool at once (engines of two revisions
            # each during a rollout, multi-node groups of 4-8), and a pod left Pending for
            # capacity would wait for another file's to end.
            f"{self._cluster.proxy_node_name}:pool={BIG_POOL}:gpus={BIG_POOL_GPUS}:gpu-memory-gib=80",
            f"{SMALL_NODE}:pool={SMALL_POOL}:gpus=8:gpu-memory-gib=24",
            *self.config.extra_nodes,
        ]
        self._kubelet = KubeletThread.for_cluster(
            self._cluster, nodes, backoff_initial=1.0, backoff_max=5.0
        )
        self._stack.enter_context(self._kubelet)
        self._cluster.wait_for_kubernetes_service()
        self._say(
            f"nodes registered: pool big ({BIG_POOL_GPUS} x 80 GiB GPUs), pool small "
            "(8 x 24 GiB GPUs)"
        )
        # Before the kubelet and the control plane stop (LIFO), whenever LWS was started.
        self._stack.callback(self._stop_lws)
        if self.config.leaderworkerset:
            self._lws = LwsController(self._cluster, progress=self.config.progress)
            self._lws.start()
        self.install()
        self._say(f"kvgate installed and serving its webhook ({time.monotonic() - started:.0f}s)")

    def stop(self) -> None:
        """Uninstall (best effort), then stop the kubelet and the control plane."""
        if self._installed and self._cluster is not None:
            try:
                self.helm("uninstall", RELEASE, f"--namespace={OPERATOR_NAMESPACE}", "--wait")
            except Exception as exc:  # the cluster is torn down below anyway
                print(f"world: helm uninstall failed: {exc}", file=sys.stderr)
            self._installed = False
        self._stack.close()
        self._cluster = None
        self._reader = None
        self._kubelet = None
        self._lws = None

    def _stop_lws(self) -> None:
        if self._lws is not None:
            self._lws.stop()

    # ------------------------------------------------------------------ parts
    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            raise WorldError("world not started")
        return self._cluster

    def enable_leaderworkerset(self) -> LwsController:
        """Start LeaderWorkerSet in a running world (CRDs, webhooks, controller: kvgate_e2e.lws)
        and ``helm upgrade`` kvgate with ``leaderWorkerSet.enabled=true``; idempotent. Undo it
        with ``disable_leaderworkerset`` (a test module that enables it on the shared session
        world must, so that later modules see the world as it was)."""
        if self._lws is None:
            self._lws = LwsController(self.cluster, progress=self.config.progress)
            try:
                self._lws.start()
            except BaseException:
                self._lws.stop()
                self._lws = None
                raise
        if not self.config.leaderworkerset:
            self.config.leaderworkerset = True
            self.upgrade()
        return self._lws

    def disable_leaderworkerset(self) -> None:
        """The reverse of ``enable_leaderworkerset``: ``helm upgrade`` kvgate without it, stop
        the controller and delete what it installed (webhook configurations, CRDs and so every
        LeaderWorkerSet left, ``lws-system``). Call it after the namespaces that ran groups are
        gone."""
        if self.config.leaderworkerset:
            self.config.leaderworkerset = False
            self.upgrade()
        if self._lws is not None:
            lws, self._lws = self._lws, None
            lws.uninstall()

    @property
    def leaderworkerset_running(self) -> bool:
        """Whether LeaderWorkerSet runs in this world (namespaces then hold groups to stop)."""
        return self._lws is not None

    @property
    def lws(self) -> LwsController:
        if self._lws is None:
            raise WorldError("world started without LeaderWorkerSet (WorldConfig.leaderworkerset)")
        return self._lws

    @property
    def kubelet(self) -> KubeletThread:
        if self._kubelet is None:
            raise WorldError("world not started")
        return self._kubelet

    # ------------------------------------------------------------------ helm
    def helm(self, *args: str, check: bool = True) -> str:
        return self.cluster.helm(*args, check=check).stdout

    def install(self, extra_values: Mapping[str, Any] | None = None) -> None:
        """``helm install kvgate charts/kvgate`` and wait for the operator and its webhook."""
        self._helm_release("install", extra_values)
        self._installed = True
        self.wait_operator_ready()

    def upgrade(self, extra_values: Mapping[str, Any] | None = None) -> None:
        """``helm upgrade kvgate charts/kvgate`` (same values) and wait for the operator."""
        self._helm_release("upgrade", extra_values)
        self.wait_operator_ready()

    def uninstall(self) -> None:
        self.helm("uninstall", RELEASE, f"--namespace={OPERATOR_NAMESPACE}", "--wait")
        self._installed = False

    def _helm_release(self, verb: str, extra_values: Mapping[str, Any] | None) -> None:
        values = _deep_merge(chart_values(self.config), extra_values or {})
        values_file = self.cluster.run_dir / "kvgate-values.json"
        values_file.write_text(json.dumps(values, indent=2))
        self._say(f"helm {verb} {RELEASE} charts/kvgate --namespace {OPERATOR_NAMESPACE}")
        self.helm(
            verb,
            RELEASE,
            str(CHART),
            f"--namespace={OPERATOR_NAMESPACE}",
            *(["--create-namespace"] if verb == "install" else []),
            f"--values={values_file}",
        )

    def operator_pods(self) -> list[dict[str, Any]]:
        """The controller's live (not terminating) pods: the leader and its standbys."""
        pods = self.list("pods", OPERATOR_NAMESPACE, OPERATOR_SELECTOR)
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def webhook_pods(self) -> list[dict[str, Any]]:
        """The webhook Deployment's live pods."""
        pods = self.list("pods", OPERATOR_NAMESPACE, WEBHOOK_SELECTOR)
        return [p for p in pods if not p["metadata"].get("deletionTimestamp")]

    def leader_name(self) -> str | None:
        """The pod that holds the controller's Lease (``kvgate.kube.leader``), if any holds it."""
        lease = self.get("leases.coordination.k8s.io", RELEASE, OPERATOR_NAMESPACE)
        holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
        return str(holder) if holder else None

    def kill_leader(self) -> str:
        """SIGKILL the leading controller pod (force delete, grace 0): no Lease release.
        Returns its name."""
        leader = self.leader_name()
        assert leader, "no replica holds the controller Lease"
        self.kubectl(
            "delete",
            "pod",
            leader,
            f"--namespace={OPERATOR_NAMESPACE}",
            "--grace-period=0",
            "--force",
            "--wait=false",
            check=False,
        )
        return leader

    def operator_pod(self) -> dict[str, Any] | None:
        """The leading controller pod (the one reconciling); without a leader, any live one."""
        live = self.operator_pods()
        leader = self.leader_name()
        for pod in live:
            if pod["metadata"]["name"] == leader:
                return pod
        return live[0] if live else None

    def wait_operator_ready(self, timeout: float | None = None) -> None:
        """Operator pod Ready, and the API server gets answers from the webhook (a server-side
        dry run of an unsafe ModelDeployment is denied by ``kvgate``)."""
        limit = timeout or self.config.start_timeout
        # The Deployments' rollouts first: after an upgrade the old pods may still look Ready.
        for deployment in (RELEASE, WEBHOOK_DEPLOYMENT):
            self.kubectl(
                "rollout",
                "status",
                f"deployment/{deployment}",
                f"--namespace={OPERATOR_NAMESPACE}",
                f"--timeout={int(limit)}s",
            )

        def leader_ready() -> bool:
            # The Lease is held by a live, Ready controller pod of the current rollout.
            leader = self.leader_name()
            return any(
                p["metadata"]["name"] == leader and is_ready(p) for p in self.operator_pods()
            )

        self.wait_for("a Ready kvgate controller pod to hold the leader Lease", leader_ready, limit)
        probe = unsafe_probe_md()

        def webhook_answers() -> bool:
            proc = self.kubectl(
                "apply", "--dry-run=server", "-f", "-", input=manifest_text(probe), check=False
            )
            return proc.returncode != 0 and "denied the request" in proc.stderr

        self.wait_for(
            "the kvgate webhook to deny an unsafe ModelDeployment",
            webhook_answers,
            WEBHOOK_DEADLINE,
        )

    def operator_log(self, lines: int = 80) -> str:
        pod = self.operator_pod()
        if pod is None:
            return "(no operator pod)"
        path = self.kubelet.kubelet.log_path(
            OPERATOR_NAMESPACE, pod["metadata"]["name"], "operator"
        )
        if path is None or not path.exists():
            return "(no operator log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def operator_tasks(self, wait: float = 5.0) -> str:
        """Where every asyncio task of the leading controller waits: SIGUSR1 to its process
        (kvgate.controller.task_dump), then its log from the dump on. For a wait that timed
        out on a ModelDeployment the operator stopped reconciling."""
        pod = self.operator_pod()
        pid = container_pid(pod, "operator") if pod is not None else None
        path = (
            self.kubelet.kubelet.log_path(OPERATOR_NAMESPACE, pod["metadata"]["name"], "operator")
            if pod is not None
            else None
        )
        if pid is None or path is None or not path.exists():
            return "(no running operator to ask for its tasks)"
        start = path.stat().st_size
        os.kill(pid, signal.SIGUSR1)

        def dumped() -> str | None:
            with path.open(errors="replace") as log:
                log.seek(start)
                text = log.read()
            return text if "asyncio tasks" in text else None

        try:
            return poll_until("the operator's task dump", dumped, wait, period=0.1)[:60_000]
        except AssertionError:
            return f"(the operator, pid {pid}, logged no task dump within {wait:.0f} s)"

    # ------------------------------------------------------------------ kubectl
    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> Any:
        """The built kubectl as the admin; returns the CompletedProcess."""
        return self.cluster.kubectl(*args, input=input, check=check)

    def apply(self, manifest: str | Mapping[str, Any], namespace: str | None = None) -> str:
        """``kubectl apply -f -`` of YAML text or one object; returns kubectl's output."""
        text = manifest if isinstance(manifest, str) else manifest_text(manifest)
        ns = [f"--namespace={namespace}"] if namespace else []
        return str(self.kubectl("apply", *ns, "-f", "-", input=text).stdout)

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """``kubectl get <kind> <name> -o json``, or None if it does not exist (read in-process:
        ``kvgate_e2e.api_reader``; a ``ClusterError`` for any other failure)."""
        return self.reader.get(kind, name, namespace)

    def list(self, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        """The items of ``kubectl get <kind> --namespace=<namespace> [--selector=...] -o json``."""
        return self.reader.list(kind, namespace, selector)

    @property
    def reader(self) -> ApiReader:
        if self._reader is None:
            self._reader = ApiReader.for_cluster(self.cluster)
        return self._reader

    def get_md(self, name: str, namespace: str) -> dict[str, Any] | None:
        return self.get("modeldeployments.kvgate.io", name, namespace)

    def create_namespace(self, name: str) -> None:
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def delete_namespace(self, name: str, timeout: float = 180.0, *, wait: bool = True) -> None:
        """Stop everything a namespace runs, then delete it (with ``wait``, until it is gone).

        ModelDeployments go first (kvgate's finalizer: the operator stops reconciling them), then
        Deployments and ReplicaSets, and with LeaderWorkerSet on its groups and their
        StatefulSets (nothing recreates a pod after that), then the pods with a
        1 s grace period (this is clean-up; smg alone drains 5 s on SIGTERM, and the namespace
        controller, finding pods still terminating, re-checks only after their grace period).
        Returns once the kubelet has stopped every process of the namespace. The namespace
        controller starts on the Namespace itself only 5 s after it is deleted (a fixed delay in
        kube-controller-manager): with ``wait=False`` that part runs on in the background, and
        ``wait_namespaces_deleted`` waits for all such namespaces."""
        ns = f"--namespace={name}"
        workloads = "deployments.apps,replicasets.apps"
        if self.leaderworkerset_running:
            # Multi-node groups too: their StatefulSets recreate a deleted pod until the garbage
            # collector, behind on a loaded machine, has removed them (a group being recreated
            # after a killed worker outlived the 180 s below with two worlds side by side).
            workloads += ",leaderworkersets.leaderworkerset.x-k8s.io,statefulsets.apps"
        for kinds in ("modeldeployments.kvgate.io", workloads):
            self.kubectl(
                "delete", kinds, "--all", ns, "--ignore-not-found", "--timeout=120s", check=False
            )
        self.kubectl("delete", "pods", "--all", ns, "--wait=false", "--grace-period=1", check=False)
        self.wait_for(
            f"the pods of namespace {name} to be stopped",
            lambda: not self.list("pods", name),
            timeout,
        )
        self.kubectl("delete", "namespace", name, "--ignore-not-found", "--wait=false")
        if not wait:
            self._deleting.add(name)
            return
        self.wait_for(
            f"namespace {name} to be deleted",
            lambda: self.get("namespace", name) is None,
            timeout,
        )

    def wait_namespaces_deleted(self, timeout: float = 120.0) -> None:
        """Wait until every namespace ``delete_namespace(wait=False)`` left going is gone; on the
        deadline raise ``WorldError`` naming each one left and what the namespace controller
        says remains in it."""
        wait_namespaces_gone(self.reader, self._deleting, timeout, error=WorldError)
        self._deleting.clear()

    # ------------------------------------------------------------------ waiting
    def wait_for(self, what: str, predicate: Callable[[], T | None], timeout: float = 120.0) -> T:
        """Poll ``predicate`` every 0.2 s until it returns something truthy (returned); on
        timeout raise ``WorldError`` naming ``what``, the last error and the operator log."""
        return poll_until(
            what,
            predicate,
            timeout,
            error=WorldError,
            details=lambda: f"--- operator log (tail) ---\n{self._safe_operator_log()}",
        )

    def _safe_operator_log(self) -> str:
        try:
            pod = self.operator_pod()
            status = json.dumps((pod or {}).get("status"), indent=1)[:3000]
            return f"operator pod status: {status}\n{self.operator_log(40)}"
        except Exception as exc:
            return f"(operator log unavailable: {exc})"

    # ------------------------------------------------------------------ traffic
    def forward(self, host: str, port: int) -> int:
        """A 127.0.0.1 port on the host relaying to ``host:port`` inside the namespace."""
        key = (host, port)
        if key not in self._forwards:
            self._forwards[key] = self.cluster.forward(host, port)
        return self._forwards[key]

    def service_url(self, name: str, namespace: str, port: int | None = None) -> str:
        """``http://127.0.0.1:<relay>`` reaching the Service's ClusterIP (through kube-proxy)."""
        svc = self.get("service", name, namespace)
        if svc is None:
            raise WorldError(f"Service {namespace}/{name} does not exist")
        cluster_ip = svc["spec"]["clusterIP"]
        svc_port = port or int(svc["spec"]["ports"][0]["port"])
        return f"http://127.0.0.1:{self.forward(cluster_ip, svc_port)}"

    def router_request(
        self,
        md_name: str,
        body: Mapping[str, Any],
        namespace: str,
        path: str = "/generate",
        timeout: float = 60.0,
    ) -> tuple[int, Any]:
        """POST ``body`` to the ``<md_name>`` Service (the router); returns (HTTP status, JSON).
        Raises ``OSError`` (connection refused/reset) when the Service has no ready router:
        kube-proxy rejects connections to a ClusterIP without endpoints."""
        return http_json(self.service_url(md_name, namespace) + path, body, timeout=timeout)

    def engine_url(self, pod: Mapping[str, Any], port: int = 30000) -> str:
        return f"http://127.0.0.1:{self.forward(pod['status']['podIP'], port)}"


# ---------------------------------------------------------------------- plain helpers
def manifest_text(obj: Mapping[str, Any]) -> str:
    """One object as ``kubectl -f -`` reads it: JSON, never PyYAML's YAML. PyYAML (YAML 1.1)
    leaves a string such as ``123e4567`` unquoted, and kubectl's YAML reader takes it for a
    number: a copied router pod whose 12-hex-digit key fingerprint reads so is refused with
    "cannot unmarshal number into ... annotations of type string"."""
    return json.dumps(obj)


def http_json(
    url: str,
    body: Any = None,
    timeout: float = 30.0,
    *,
    headers: Mapping[str, str] | None = None,
    method: str | None = None,
) -> tuple[int, Any]:
    """GET (no body) or POST JSON (or ``method``); returns (status, parsed JSON or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url,
        data=data,
        headers={"Content-Type": "application/json", **(headers or {})},
        method=method,
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as err:
        text, status = err.read().decode(), err.code
    try:
        return status, json.loads(text) if text.strip() else None
    except ValueError:
        return status, text


def router_key(world: World, namespace: str, md: str) -> str:
    """The control-plane key of ``md``'s routers (Secret ``<md>-router-control``, read as the
    cluster admin); smg's ``/workers`` answers 401 without it."""
    secret = world.get("secret", f"{md}-router-control", namespace)
    if secret is None:
        raise WorldError(f"no Secret {md}-router-control in {namespace}")
    return base64.b64decode(secret["data"]["admin-key"]).decode()


def wait_namespaces_gone(
    reader: ApiReader,
    names: Iterable[str],
    timeout: float,
    *,
    error: Callable[[str], BaseException] = AssertionError,
) -> None:
    """Wait until none of the namespaces ``names`` exists; on the deadline raise ``error``
    naming each one left and what the namespace controller says remains in it."""
    wanted = set(names)

    def left() -> list[Mapping[str, Any]]:
        return [ns for ns in reader.list("namespaces", None) if ns["metadata"]["name"] in wanted]

    poll_until(
        "the deleted test namespaces to be gone",
        lambda: not left(),
        timeout,
        period=0.5,
        error=error,
        details=lambda: (
            "still there: "
            + "; ".join(namespace_remains(ns) for ns in left())
            + "; see `kubectl get all,events --namespace=<name>` and the "
            "kube-controller-manager log (KVGATE_E2E_KEEP_RUN_DIR=1 keeps it)"
        ),
    )


def namespace_remains(ns: Mapping[str, Any]) -> str:
    """``name (phase: what the namespace controller says remains)`` of a namespace (pure)."""
    status = ns.get("status") or {}
    problems = [
        f"{c.get('type')}: {c.get('message')}"
        for c in status.get("conditions") or []
        if c.get("status") == "True"
    ]
    return f"{ns['metadata']['name']} ({'; '.join([status.get('phase', '?'), *problems])})"


def condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return None


def is_ready(obj: Mapping[str, Any]) -> bool:
    cond = condition(obj, "Ready")
    return cond is not None and cond.get("status") == "True"


class ObjectLister(Protocol):
    """Anything that lists objects like ``World.list`` (the smoke tests' own client does)."""

    def list(self, kind: str, namespace: str, selector: str = "") -> list[Any]: ...


def ready_endpoints(world: ObjectLister, namespace: str, service: str) -> set[str]:
    """Addresses of the Service's ready endpoints, from its EndpointSlices."""
    slices = world.list(
        "endpointslices.discovery.k8s.io", namespace, f"kubernetes.io/service-name={service}"
    )
    return {
        addr
        for s in slices
        for ep in s.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready")
        for addr in ep["addresses"]
    }


def load_sample(name: str) -> dict[str, Any]:
    """A sample ModelDeployment from ``crds/samples/<name>.yaml``."""
    return dict(yaml.safe_load((SAMPLES / f"{name}.yaml").read_text()))


def known_answer_body(served_model: str, max_new_tokens: int = 4) -> dict[str, Any]:
    """A ``/generate`` body whose answer is known: the reference model copies the prompt, so
    ``output_ids`` == the first ``max_new_tokens`` input ids. ``model`` is needed under smg's
    Kubernetes discovery (IGW mode)."""
    return {
        "model": served_model,
        "input_ids": KNOWN_PROMPT_IDS,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0},
    }


KNOWN_PROMPT_IDS = [128000, 791, 4062, 14198, 39935, 35308, 927, 279, 16053, 5679]


def output_ids(answer: Any) -> list[int] | None:
    """``output_ids`` of a /generate answer (dict or one-element list), else None."""
    item = answer[0] if isinstance(answer, list) and answer else answer
    if isinstance(item, dict):
        ids = item.get("output_ids")
        if isinstance(ids, list):
            return [int(x) for x in ids]
    return None


def unsafe_probe_md() -> dict[str, Any]:
    """A ModelDeployment the webhook must deny: the estimated pool on 24 GiB GPUs is far below
    its 131,072-token context (used to check that the webhook answers)."""
    md = load_sample("llama-8b")
    md["metadata"] = {"name": "webhook-probe", "namespace": "default"}
    for role in ("prefill", "decode"):
        md["spec"][role]["gpuMemoryGiB"] = 24
    return md


class PodTimeline:
    """Watches the pods of a namespace from the test process (a real watch, not polling) and
    records, per pod, when its engine container was first seen ready and when its
    ``kvgate.io/engine-verified`` condition was first seen True (monotonic seconds)."""

    def __init__(self, world: World, namespace: str, selector: str = "") -> None:
        self.world, self.namespace, self.selector = world, namespace, selector
        self.container_ready: dict[str, float] = {}
        self.verified: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-timeline", daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(15)

    def _run(self) -> None:
        from kubernetes import client, watch  # lazily: only tests measure

        api = client.CoreV1Api(self.world.cluster.new_api_client())
        watch_type: Any = watch.Watch  # the kubernetes package is untyped
        while not self._stop.is_set():
            stream = watch_type()
            try:
                for event in stream.stream(
                    api.list_namespaced_pod,
                    self.namespace,
                    label_selector=self.selector,
                    timeout_seconds=WATCH_SECONDS,
                    _request_timeout=WATCH_REQUEST_TIMEOUT,
                ):
                    self._record(api.api_client.sanitize_for_serialization(event["object"]))
                    if self._stop.is_set():
                        stream.stop()
            except Exception:  # a dropped watch is re-opened; the timeline stays monotonic
                time.sleep(0.2)

    def _record(self, pod: Mapping[str, Any]) -> None:
        now = time.monotonic()
        name = str(pod["metadata"]["name"])
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        if any(c.get("ready") for c in statuses):
            self.container_ready.setdefault(name, now)
        gate = condition(pod, GATE)
        if gate is not None and gate.get("status") == "True":
            self.verified.setdefault(name, now)

    def ready_to_verified(self) -> dict[str, float]:
        """Seconds from engine container ready to verified, per pod seen both ways."""
        return {
            name: self.verified[name] - self.container_ready[name]
            for name in self.verified
            if name in self.container_ready
        }


def names(items: Iterable[Mapping[str, Any]]) -> list[str]:
    return [str(i["metadata"]["name"]) for i in items]


__all__: Sequence[str] = [
    "BIG_POOL",
    "GATE",
    "KNOWN_PROMPT_IDS",
    "MODEL_HOST_PATH_PREFIX",
    "OPERATOR_NAMESPACE",
    "SMALL_POOL",
    "PodTimeline",
    "World",
    "WorldConfig",
    "WorldError",
    "chart_values",
    "condition",
    "http_json",
    "is_ready",
    "known_answer_body",
    "load_sample",
    "output_ids",
    "ready_endpoints",
]
