"""A real node: the shipped image in real containers under Kubernetes' own kubelet.

The node (``kvgate_e2e.realnode``) is the kubelet of Kubernetes v1.37.2 built from the control
plane's modules, on Debian's containerd 1.6.20 and runc 1.1.5 with the CNI bridge, joined to a
control plane of this module's own. Its pods run from ``make image``'s archive, imported into
its containerd. What these tests show is what the loopback kubelet cannot: the image's own user,
read-only root and dropped capabilities as runc applies them under Pod Security ``restricted``,
and Ready as the real kubelet computes it from container readiness and kvgate's readiness gate.

Run (as root, after ``make real-node-deps``)::

    flock /tmp/kvgate-e2e.lock .venv/bin/pytest -q -s -m e2e e2e/tests/test_real_node.py
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kvgate_e2e.build_artifacts import e2e_required_by, find_binaries, missing_binaries_reason
from kvgate_e2e.cluster import Cluster
from kvgate_e2e.deadlines import SERVICE_ACCOUNT_DEADLINE
from kvgate_e2e.kubelet.node import GPU_MEMORY_KEY, GPU_RESOURCE, POOL_LABEL
from kvgate_e2e.netns import netns_supported
from kvgate_e2e.polling import poll_until
from kvgate_e2e.realnode import artifacts
from kvgate_e2e.realnode.config import REAL_POD_CIDR
from kvgate_e2e.realnode.node import RealNode, RealNodeSpec
from kvgate_e2e.world import GATE, condition

pytestmark = pytest.mark.e2e

SPEC = RealNodeSpec(name="kvgate-real-node-0", pool="realnode", gpus=8, gpu_memory_gib=80)
IMAGE_USER = 65532
# A pod's container starts in ~2-5 s here once its image is imported; 120 s at half speed with
# the node's first sandbox included.
POD_DEADLINE_S = 120.0
# The kubelet re-reads a pod's conditions on its next status sync (~1 s); the EndpointSlice
# controller batches changes for up to 1 s.
READY_DEADLINE_S = 60.0

RESTRICTED_POD = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}

# What the container reports about itself, as the kernel sees it.
SELF_REPORT = """
import errno, json, os
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
try:
    open("/kvgate-write-test", "w")
    root = "writable"
except OSError as exc:
    root = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(),
    "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
    "seccomp": status["Seccomp"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
    "root_write": root,
}), flush=True)
"""


@pytest.fixture(scope="module")
def real_node() -> Iterator[RealNode]:
    lacking = [] if find_binaries() is not None else [missing_binaries_reason()]
    lacking += artifacts.missing()
    reason = netns_supported()
    if reason is not None:
        lacking.append(reason)
    if lacking:
        message = "a real node needs " + "; ".join(lacking) + " (all of it: make real-node-deps)"
        required_by = e2e_required_by(os.environ)
        if required_by is not None:
            pytest.fail(f"{required_by}: {message}")
        pytest.skip(message)
    started = time.monotonic()
    with Cluster() as cluster, RealNode(cluster, SPEC) as node:
        print(
            f"\nMEASURED real node Ready in {node.started_in:.1f}s "
            f"(control plane + node {time.monotonic() - started:.1f}s)"
        )
        yield node


def kubectl_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def restricted_namespace(cluster: Cluster, name: str) -> None:
    """A namespace enforcing Pod Security ``restricted``, its default ServiceAccount there."""
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    poll_until(
        f"ServiceAccount {name}/default",
        lambda: cluster.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
        SERVICE_ACCOUNT_DEADLINE,
    )


def pod_manifest(name: str, image: str, command: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {POOL_LABEL: SPEC.pool},
            "securityContext": RESTRICTED_POD,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": command,
                    "securityContext": RESTRICTED_CONTAINER,
                }
            ],
            **spec,
        },
    }


def shipped_image(node: RealNode) -> str:
    archive = artifacts.image_archive()
    assert archive is not None
    return node.images[archive.name]


def test_real_node_is_ready_with_gpus_as_an_extended_resource(real_node: RealNode) -> None:
    node = real_node.node()
    assert node is not None
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["containerRuntimeVersion"].startswith("containerd://1.6.20"), info
    assert node["status"]["allocatable"][GPU_RESOURCE] == str(SPEC.gpus)
    assert node["metadata"]["labels"][POOL_LABEL] == SPEC.pool
    assert node["metadata"]["annotations"][GPU_MEMORY_KEY] == "80"
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == real_node.node_ip


def test_shipped_image_runs_as_65532_read_only_without_capabilities_under_restricted(
    real_node: RealNode,
) -> None:
    cluster, ns = real_node.cluster, "restricted-run"
    restricted_namespace(cluster, ns)
    image = shipped_image(real_node)
    # The namespace enforces `restricted`: the same pod without its security context is denied.
    bare = pod_manifest("bare", image, ["python3", "-c", "pass"])
    bare["spec"].pop("securityContext")
    bare["spec"]["containers"][0].pop("securityContext")
    denied = cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(bare), check=False)
    assert denied.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in denied.stderr, denied.stderr

    pod = pod_manifest("report", image, ["python3", "-c", SELF_REPORT], restartPolicy="Never")
    applied = time.monotonic()
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(pod))
    done = poll_until(
        "pod report Succeeded on the real node",
        lambda: (
            (p := kubectl_json(cluster, "get", "pod", "report", "-n", ns))["status"].get("phase")
            in ("Succeeded", "Failed")
            and p
        ),
        POD_DEADLINE_S,
        period=0.5,
        details=lambda: real_node.log("kubelet"),
    )
    print(
        f"\nMEASURED pod applied -> its container ran and exited: {time.monotonic() - applied:.1f}s"
    )
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["spec"]["nodeName"] == SPEC.name
    assert ipaddress.IPv4Address(done["status"]["podIP"]) in REAL_POD_CIDR
    status = done["status"]["containerStatuses"][0]
    assert status["containerID"].startswith("containerd://")
    report = json.loads(cluster.kubectl("logs", "report", "-n", ns).stdout.strip())
    print(f"\nMEASURED the shipped image in its container: {report} ({status['imageID']})")
    assert report["uid"] == IMAGE_USER and report["gid"] == IMAGE_USER
    assert report["root_write"] == "EROFS"
    assert int(report["cap_eff"], 16) == 0 and int(report["cap_bnd"], 16) == 0
    assert report["seccomp"] == "2"  # filtered: RuntimeDefault, applied by runc
    assert report["no_new_privs"] == "1"


def test_readiness_gate_keeps_a_ready_engine_container_out_of_ready_and_endpoints(
    real_node: RealNode,
) -> None:
    cluster, ns, name = real_node.cluster, "gate", "engine"
    restricted_namespace(cluster, ns)
    # An engine-like container: it answers HTTP on 30000 and its readiness probe passes at
    # once, so only kvgate's gate stands between it and Ready.
    pod = pod_manifest(
        name,
        shipped_image(real_node),
        ["python3", "-m", "http.server", "30000", "--directory", "/opt"],
        readinessGates=[{"conditionType": GATE}],
    )
    container = pod["spec"]["containers"][0]
    container["readinessProbe"] = {
        "httpGet": {"path": "/", "port": 30000},
        "periodSeconds": 1,
    }
    container["resources"] = {"limits": {GPU_RESOURCE: "1"}}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": 30000}]},
    }
    applied = time.monotonic()
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all([pod, service]))

    def get() -> dict[str, Any]:
        return dict(kubectl_json(cluster, "get", "pod", name, "-n", ns))

    def slice_addresses(ready: bool) -> set[str]:
        slices = kubectl_json(
            cluster, "get", "endpointslices", "-n", ns, "-l", f"kubernetes.io/service-name={name}"
        )["items"]
        return {
            address
            for s in slices
            for ep in s.get("endpoints") or []
            if bool((ep.get("conditions") or {}).get("ready")) == ready
            for address in ep["addresses"]
        }

    # The container is ready (its probe passed, the real kubelet says so) and the EndpointSlice
    # controller has seen the pod: listed, but not ready.
    started = poll_until(
        "the engine container Ready and the pod in its EndpointSlice as not ready",
        lambda: (
            (p := get())["status"].get("podIP") in slice_addresses(ready=False)
            and (condition(p, "ContainersReady") or {}).get("status") == "True"
            and p
        ),
        POD_DEADLINE_S,
        period=0.5,
        details=lambda: real_node.log("kubelet"),
    )
    print(
        "\nMEASURED pod applied -> container ready, in its slice: "
        f"{time.monotonic() - applied:.1f}s"
    )
    pod_ip = started["status"]["podIP"]
    assert started["status"]["containerStatuses"][0]["ready"] is True
    ready = condition(started, "Ready") or {}
    assert ready.get("status") == "False", ready
    assert ready.get("reason") == "ReadinessGatesNotReady", ready
    assert pod_ip not in slice_addresses(ready=True)
    # The engine answers on its pod address from the world's network (the bridge's gateway).
    with cluster.connect(pod_ip, 30000) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.0 200")

    def set_gate(status: str) -> None:
        patch = {"status": {"conditions": [{"type": GATE, "status": status}]}}
        cluster.kubectl(
            "patch",
            "pod",
            name,
            "-n",
            ns,
            "--subresource=status",
            "--type=strategic",
            "-p",
            json.dumps(patch),
        )

    t0 = time.monotonic()
    set_gate("True")
    poll_until(
        "pod Ready and a ready endpoint once the gate is True",
        lambda: (
            (condition(get(), "Ready") or {}).get("status") == "True"
            and pod_ip in slice_addresses(ready=True)
        ),
        READY_DEADLINE_S,
        period=0.2,
    )
    print(f"\nMEASURED gate True -> Ready and a ready endpoint in {time.monotonic() - t0:.1f}s")

    t0 = time.monotonic()
    set_gate("False")
    poll_until(
        "pod not Ready and no ready endpoint once the gate is False again",
        lambda: (
            (condition(get(), "Ready") or {}).get("status") == "False"
            and pod_ip not in slice_addresses(ready=True)
        ),
        READY_DEADLINE_S,
        period=0.2,
    )
    print(f"\nMEASURED gate False -> not Ready, no endpoint in {time.monotonic() - t0:.1f}s")
    # The container itself stayed ready all along: only the gate moved the pod.
    assert get()["status"]["containerStatuses"][0]["ready"] is True
