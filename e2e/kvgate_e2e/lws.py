"""LeaderWorkerSet (sigs.k8s.io/lws) in the e2e world: its CRDs, webhooks and controller.

The controller is built from its Go module by ``e2e/controlplane/build-lws.sh`` (cached outside
the clone, like the control plane) and runs as one more control-plane process in the world's
network namespace, as the cluster admin (like kube-controller-manager), logging to
``<run dir>/logs/lws-controller.log``. What a release's kustomize tree would install is applied
from the module's own ``config/`` in the Go module cache:

* both CRDs of ``config/crd/bases`` (LeaderWorkerSet and DisaggregatedSet: the controller starts
  a reconciler for each and fails without the kind), server-side (they exceed the client-side
  apply annotation limit);
* ``config/webhook/manifests.yaml`` with the release's kustomize edits (``namePrefix: lws-``,
  namespace ``lws-system``, the pod webhooks' ``objectSelector`` patches), so the Mutating/
  ValidatingWebhookConfigurations are the ones a release installs;
* the Service ``lws-webhook-service`` (443 -> 9443) in ``lws-system``. The controller is not a
  pod, so the Service has no selector: an EndpointSlice names the address the controller's
  webhook server listens on (a pod-range address on the namespace's ``lo``), and kube-proxy
  DNATs the ClusterIP to it as for any pod.

TLS is LWS's own: its internal cert management (open-policy-agent/cert-controller's rotator,
``pkg/cert``) generates a CA and a serving cert for ``lws-webhook-service.lws-system.svc``,
stores them in the Secret ``lws-webhook-server-cert`` and injects the CA into both webhook
configurations. In a cluster the controller's pod mounts that Secret at its cert dir and the
rotator waits for the files to appear there (``ensureCertsMounted``); the controller is no pod
here, so ``LwsController`` plays the kubelet's Secret volume: it copies the Secret's keys into
the cert dir once the rotator has filled it (without that the webhook server never starts and
every LeaderWorkerSet is refused). The API server reaches the webhooks
through the Service's ClusterIP (aggregator routing off) and checks that name. Nothing is
disabled: the pod webhook is what gives every group's pods ``LWS_LEADER_ADDRESS``,
``LWS_WORKER_INDEX`` and the worker-index label, so a world without it would not be LWS.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import ipaddress
import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import yaml

from kvgate_e2e.cluster_like import ClusterLike
from kvgate_e2e.lifecycle import Started
from kvgate_e2e.polling import Deadline, poll_until
from kvgate_e2e.server_process import ServerProcess

E2E_DIR = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = E2E_DIR / "controlplane" / "build-lws.sh"
NAMESPACE = "lws-system"
SERVICE = "lws-webhook-service"
# The build script asked for a path: --print-module-dir runs `go mod download`, which downloads the
# module when it is missing (longer than kvgate_e2e.deadlines.BUILD_QUERY_TIMEOUT for that).
SCRIPT_TIMEOUT = 120
SECRET = "lws-webhook-server-cert"
WEBHOOK_PORT = 9443
HEALTH_PORT = 8081
CRD_NAMES = (
    "leaderworkersets.leaderworkerset.x-k8s.io",
    "disaggregatedsets.disaggregatedset.x-k8s.io",
)


class LwsError(RuntimeError):
    """The LeaderWorkerSet controller is not built, or did not come up."""


# ---------------------------------------------------------------------------- build artifacts
def _script(arg: str) -> str:
    try:
        proc = subprocess.run(
            [str(BUILD_SCRIPT), arg],
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LwsError(f"{BUILD_SCRIPT} {arg} failed: {exc}") from exc
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise LwsError(f"{BUILD_SCRIPT} {arg} exited {proc.returncode}: {proc.stderr.strip()}")
    return lines[-1]


def controller_binary() -> Path | None:
    """The built controller, or None when ``build-lws.sh`` has not built it."""
    path = Path(_script("--print-path"))
    return path if path.is_file() else None


def missing_controller_reason() -> str:
    return (
        f"LeaderWorkerSet controller not built ({_script('--print-path')} is missing); build it "
        f"with `{BUILD_SCRIPT}` (minutes on 2 cores, then cached) or `make e2e-deps`"
    )


def module_config_dir() -> Path:
    """``config/`` of the sigs.k8s.io/lws module in the Go module cache."""
    config = Path(_script("--print-module-dir")) / "config"
    if not (config / "crd" / "bases").is_dir():
        raise LwsError(f"{config}/crd/bases not found: is sigs.k8s.io/lws in the module cache?")
    return config


# ---------------------------------------------------------------------------- manifests (pure)
def _replace(doc: dict[str, Any], pointer: str, value: Any) -> None:
    """RFC 6902 ``replace`` (the only op LWS's kustomize patches use)."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.lstrip("/").split("/")]
    target: Any = doc
    for part in parts[:-1]:
        target = target[int(part)] if isinstance(target, list) else target[part]
    last = parts[-1]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value


def webhook_configurations(
    manifests: str, patches: Mapping[str, Sequence[Mapping[str, Any]]]
) -> list[dict[str, Any]]:
    """``config/webhook/manifests.yaml`` as ``config/default`` renders it: each configuration's
    kustomize patches applied (``patches``: kind -> JSON patch ops), the name prefixed ``lws-``,
    and every webhook's Service moved to ``lws-webhook-service`` in ``lws-system``."""
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        doc = copy.deepcopy(doc)
        for op in patches.get(doc["kind"], ()):
            if op.get("op") != "replace":
                raise LwsError(f"unsupported patch op in LWS's webhook config: {op}")
            _replace(doc, str(op["path"]), copy.deepcopy(op["value"]))
        doc["metadata"]["name"] = f"lws-{doc['metadata']['name']}"
        for hook in doc.get("webhooks") or []:
            service = hook["clientConfig"]["service"]
            service["name"] = SERVICE
            service["namespace"] = NAMESPACE
        out.append(doc)
    return out


def controller_config(host: str, cert_dir: Path) -> dict[str, Any]:
    """The controller's ``--config`` (config.lws.x-k8s.io/v1alpha1 Configuration): internal cert
    management on (as released), no leader election (one instance), the webhook and health
    listeners on its own address, metrics off."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False, "resourceNamespace": NAMESPACE},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": SERVICE,
            "webhookSecretName": SECRET,
        },
        "webhook": {"host": host, "port": WEBHOOK_PORT, "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"{host}:{HEALTH_PORT}"},
        "metrics": {"bindAddress": "0"},
    }


def webhook_service_objects(address: str) -> list[dict[str, Any]]:
    """Namespace, the (empty) cert Secret the rotator fills, the selector-less webhook Service and
    the EndpointSlice naming the controller's address."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE},
            "spec": {"ports": [{"port": 443, "protocol": "TCP", "targetPort": WEBHOOK_PORT}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{SERVICE}-controller",
                "namespace": NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": SERVICE,
                    "endpointslice.kubernetes.io/managed-by": "kvgate-e2e",
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
            "ports": [{"port": WEBHOOK_PORT, "protocol": "TCP", "name": ""}],
        },
    ]


def secret_files(secret: Mapping[str, Any]) -> dict[str, bytes]:
    """A Secret's keys as the files its volume would hold (base64-decoded ``data``)."""
    return {
        key: base64.b64decode(value)
        for key, value in (secret.get("data") or {}).items()
        if value and "/" not in key and key not in (".", "..")
    }


def project_files(directory: Path, files: Mapping[str, bytes]) -> None:
    """Write ``files`` into ``directory``, each replaced atomically (rename) and only when its
    content changed, so a reader sees an old or a new file, never half of one."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name, content in files.items():
        target = directory / name
        if target.exists() and target.read_bytes() == content:
            continue
        tmp = directory / f".{name}.tmp"
        tmp.write_bytes(content)
        tmp.chmod(0o600)
        tmp.replace(target)


PROBE_LWS: dict[str, Any] = {
    "apiVersion": "leaderworkerset.x-k8s.io/v1",
    "kind": "LeaderWorkerSet",
    "metadata": {"name": "kvgate-e2e-probe", "namespace": "default"},
    "spec": {
        "replicas": 1,
        "leaderWorkerTemplate": {
            "size": 2,
            "workerTemplate": {
                "spec": {"containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}
            },
        },
    },
}


# ---------------------------------------------------------------------------- the controller
class LwsController(Started):
    """CRDs + webhook configurations + the controller process; a context manager."""

    def __init__(self, cluster: ClusterLike, *, progress: IO[str] | None = None) -> None:
        self.cluster = cluster
        self._progress = progress
        self._server = ServerProcess(
            "lws-controller", self.log_path, error=LwsError, stop_seconds=10.0
        )
        self._address: ipaddress.IPv4Address | None = None

    @property
    def log_path(self) -> Path:
        return self.cluster.log_dir / "lws-controller.log"

    def start(self, timeout: float = 120.0) -> None:
        deadline = Deadline(timeout)
        binary = controller_binary()
        if binary is None:
            raise LwsError(missing_controller_reason())
        config = module_config_dir()
        for crd in sorted((config / "crd" / "bases").glob("*.yaml")):
            self.cluster.kubectl("apply", "--server-side", "-f", str(crd))
        # Not `kubectl wait --for=condition=Established`: right after the apply a CRD may have
        # no status.conditions yet, and kubectl wait then fails instead of waiting.
        poll_until(
            "the LeaderWorkerSet CRDs to be Established",
            lambda: all(self._established(name) for name in CRD_NAMES),
            deadline,
            period=0.2,
            error=LwsError,
        )
        webhook = config / "webhook"
        patches = {
            "MutatingWebhookConfiguration": yaml.safe_load(
                (webhook / "mutating-patch.yaml").read_text()
            ),
            "ValidatingWebhookConfiguration": yaml.safe_load(
                (webhook / "validating-patch.yaml").read_text()
            ),
        }
        self._address = self.cluster.add_pod_ip()
        objects = [
            *webhook_service_objects(str(self._address)),
            *webhook_configurations((webhook / "manifests.yaml").read_text(), patches),
        ]
        self.cluster.kubectl(
            "apply", "-f", "-", input="\n---\n".join(yaml.safe_dump(o) for o in objects)
        )
        cfg_path = self.cluster.run_dir / "lws-config.yaml"
        cert_dir = self.cluster.run_dir / "lws-certs"
        cfg_path.write_text(yaml.safe_dump(controller_config(str(self._address), cert_dir)))
        self._server.start(
            self.cluster,
            [str(binary), f"--config={cfg_path}", "--zap-log-level=info"],
            cwd=self.cluster.run_dir,
        )
        self._say(f"LeaderWorkerSet controller started (pid {self._server.pid}) at {self._address}")
        # Ready when the API server admits a LeaderWorkerSet through both webhooks (failurePolicy
        # Fail: until the rotator has injected its CA and the server serves, this is refused).
        probe = yaml.safe_dump(PROBE_LWS)
        poll_until(
            "the LeaderWorkerSet webhooks to admit a LeaderWorkerSet (server-side dry run)",
            lambda: self._alive() and self._project_certs(cert_dir) and self._dry_run_ok(probe),
            deadline,
            period=0.5,
            error=LwsError,
            details=lambda: self.log_tail(),
        )
        self._say("LeaderWorkerSet webhooks serving (internal cert rotation)")

    def _project_certs(self, cert_dir: Path) -> bool:
        """Write the rotator's Secret into the cert dir, as a Secret volume would (True once
        the serving cert is there)."""
        proc = self.cluster.kubectl(
            "get", "secret", SECRET, f"--namespace={NAMESPACE}", "-o", "json", check=False
        )
        if proc.returncode != 0:
            return False
        files = secret_files(json.loads(proc.stdout))
        if "tls.crt" not in files or "tls.key" not in files:
            return False
        project_files(cert_dir, files)
        return True

    def _established(self, crd: str) -> bool:
        proc = self.cluster.kubectl("get", "crd", crd, "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        conditions = (json.loads(proc.stdout).get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    def _alive(self) -> bool:
        self._server.check_running()
        return True

    def _dry_run_ok(self, probe: str) -> bool:
        proc = self.cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-", input=probe, check=False
        )
        # failurePolicy Fail on both webhooks: a create passes only once both answered over TLS.
        return proc.returncode == 0 and json.loads(proc.stdout).get("kind") == "LeaderWorkerSet"

    def log_tail(self, lines: int = 40) -> str:
        return self._server.log_tail(lines)

    def uninstall(self) -> None:
        """Stop the controller and delete what ``start`` applied: the webhook configurations
        (first: with the controller gone they would refuse every LWS pod), the CRDs (the API
        server deletes every LeaderWorkerSet with them) and ``lws-system``."""
        self.stop()
        for kind, name in (
            ("mutatingwebhookconfiguration", "lws-mutating-webhook-configuration"),
            ("validatingwebhookconfiguration", "lws-validating-webhook-configuration"),
        ):
            self.cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        self.cluster.kubectl(
            "delete", "crd", *CRD_NAMES, "--ignore-not-found", "--timeout=120s", check=False
        )
        self.cluster.kubectl(
            "delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=90s", check=False
        )
        self._say("LeaderWorkerSet uninstalled")

    def stop(self) -> None:
        self._server.stop()
        if self._address is not None:
            with contextlib.suppress(Exception):  # the namespace goes with the cluster anyway
                self.cluster.release_pod_ip(self._address)
            self._address = None

    def _say(self, text: str) -> None:
        if self._progress is not None:
            self._progress.write(f"[lws] {text}\n")
            self._progress.flush()
