"""The loopback kubelet on the real control plane: nodes, pods, probes, readiness gates,
service accounts, Services through kube-proxy, and smg's Kubernetes discovery.

Run (as root, after ``e2e/controlplane/build.sh``)::

    .venv/bin/pytest -m e2e e2e/tests/test_kubelet_smoke.py -v -s

Measured numbers are printed with the prefix ``MEASURED``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

import pytest
from kvgate_e2e.api_reader import ApiReader
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.cluster import Cluster, ClusterError
from kvgate_e2e.deadlines import (
    ENGINE_POD_DEADLINE,
    EVENT_DEADLINE,
    GENERATE_TIMEOUT,
    HTTP_GET_TIMEOUT,
    NAMESPACES_GONE_DEADLINE,
    RESTART_DEADLINE,
    STEP_DEADLINE,
)
from kvgate_e2e.kubelet.agent import READY_LINE, KubeletThread, container_pid
from kvgate_e2e.netns import netns_supported
from kvgate_e2e.polling import poll_until
from kvgate_e2e.sampler import live_host
from kvgate_e2e.world import condition, is_ready, ready_endpoints, wait_namespaces_gone
from scenario_helpers import requests_served

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]

GATE = "kvgate.io/engine-verified"
ENGINE_IMAGE = "lmsysorg/sglang:v0.5.23"
SMG_IMAGE = "ghcr.io/lightseekorg/smg:1.13.0"
SMALL_NODE = "kvgate-small-0"
T = TypeVar("T")
SMG_ARGS = (
    "--host 0.0.0.0 --port 8000 --pd-disaggregation --policy round_robin"
    " --service-discovery --service-discovery-port 30000"
    " --prefill-selector app=pd role=prefill --decode-selector app=pd role=decode"
    " --worker-startup-check-interval 1 --health-check-interval-secs 1"
    " --disable-circuit-breaker --shutdown-grace-period-secs 1"
)
# Deadlines, not bounds (nothing here asserts how fast the kubelet is; the run prints what it
# measured): only a step that never happens reaches one. Shared ones come from kvgate_e2e.deadlines.
WAIT_DEADLINE = 90  # a wait given none of its own: a ServiceAccount, one engine pod Ready
# The node lease renewed: the kubelet renews it every lease_interval (10 s, a sleep, not CPU
# work), so two and a half periods; a machine at half speed renews on the same schedule.
LEASE_RENEW_DEADLINE = 25
# Two reference engine pods from apply to Ready at once: both start and load (4 s each) on the
# same CPUs, then their 1 s readiness probes; seconds in make test (the run prints it).
ENGINES_READY_DEADLINE = 180
# A small python:3.11-slim pod scheduled and its process running (or started again after a kill).
POD_START_DEADLINE = 60
# A python:3.11 pod that imports the kubernetes client, calls the API and exits.
SCRIPT_POD_DEADLINE = 90
# The CLI kubelet's node Ready once it printed its ready line (its first status patch).
NODE_READY_DEADLINE = 30
# The CLI kubelet exiting on SIGTERM: it stops its pods (a 2 s grace period) and deregisters.
KUBELET_STOP_DEADLINE = 60
# Lines the ticker writes every 0.3 s reaching kubectl logs, or a follow stream ending once the
# instance exited: the kubelet's log reader wakes at least every second (FORCE_CHECK_SECONDS).
LOG_DEADLINE = 30
KUBECTL_TIMEOUT = 30  # one kubectl logs call: the apiserver relays a single kubelet request
KUBELET_REQUEST_TIMEOUT = 10  # one GET of the kubelet port: it answers or refuses at once


def wait_until(what: str, probe: Callable[[], T | None], timeout: float = WAIT_DEADLINE) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    return poll_until(what, probe, timeout)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    reason = netns_supported()
    if reason is not None:
        pytest.fail(f"the e2e tier needs network namespaces: {reason}")
    with Cluster() as c:
        yield c


@pytest.fixture(scope="module")
def kubelet(cluster: Cluster) -> Iterator[KubeletThread]:
    nodes = [
        f"{cluster.proxy_node_name}:pool=big:gpus=8:gpu-memory-gib=80",
        f"{SMALL_NODE}:pool=small:gpus=8:gpu-memory-gib=24",
    ]
    kubelet = KubeletThread.for_cluster(cluster, nodes, backoff_initial=1.0, backoff_max=5.0)
    with kubelet as thread:
        cluster.wait_for_kubernetes_service()
        yield thread


class Kube:
    """kubectl as the admin, with JSON in and out (reads in-process, as ``World`` reads)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.reader = ApiReader.for_cluster(cluster)

    def apply(self, *objects: dict[str, Any]) -> None:
        doc = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
        self.cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))

    def get(self, kind: str, name: str, namespace: str | None = None) -> Any:
        """``kubectl get <kind> <name> -o json``; a ``ClusterError`` if it does not exist."""
        obj = self.reader.get(kind, name, namespace)
        if obj is None:
            raise ClusterError(f'{kind} "{name}" not found in namespace {namespace}')
        return obj

    def list(self, kind: str, namespace: str, selector: str = "") -> list[Any]:
        return self.reader.list(kind, namespace, selector)

    def patch_gate(self, namespace: str, pod: str, status: str) -> None:
        patch = {"status": {"conditions": [{"type": GATE, "status": status, "reason": "Test"}]}}
        self.cluster.kubectl(
            "patch",
            "pod",
            pod,
            f"--namespace={namespace}",
            "--subresource=status",
            "--type=strategic",
            f"--patch={json.dumps(patch)}",
        )


@pytest.fixture
def kube(cluster: Cluster, kubelet: KubeletThread) -> Kube:
    return Kube(cluster)


@pytest.fixture(scope="module")
def deleted_namespaces(cluster: Cluster, kubelet: KubeletThread) -> Iterator[set[str]]:
    """The test namespaces deleted so far. Deleting a namespace deletes its pods: the kubelet must
    stop them and finish their deletion before the namespace can go. That takes 5 s and more per
    namespace (the namespace controller starts 5 s after the request), so it runs on while the
    next test runs (no test here reads another's namespace or labels), and every one of them must
    be gone, within a deadline, before the kubelet and the cluster stop."""
    names: set[str] = set()
    yield names
    wait_namespaces_gone(ApiReader.for_cluster(cluster), names, NAMESPACES_GONE_DEADLINE)


@pytest.fixture
def namespace(
    request: pytest.FixtureRequest, kube: Kube, deleted_namespaces: set[str]
) -> Iterator[str]:
    name = "t-" + request.node.name.removeprefix("test_").replace("_", "-")[:40].rstrip("-")
    assert name not in deleted_namespaces, (
        f"namespace {name} of an earlier test may still be terminating: give this test a name "
        "whose first 40 characters differ"
    )
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    kube.cluster.kubectl("delete", "namespace", name, "--wait=false")
    deleted_namespaces.add(name)


def http_json(url: str, body: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
            return resp.status, json.loads(text) if text.strip() else None
    except urllib.error.HTTPError as err:
        text = err.read().decode()
        try:
            return err.code, json.loads(text)
        except ValueError:
            return err.code, text


def engine_container(role: str = "null", port: int = 30000) -> dict[str, Any]:
    args = [
        "--model-path",
        "tiny-llama",
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--enable-metrics",
    ]
    if role != "null":
        args += ["--disaggregation-mode", role, "--disaggregation-bootstrap-port", "8998"]
    return {
        "name": "engine",
        "image": ENGINE_IMAGE,
        "command": ["python3", "-m", "sglang.launch_server"],
        "args": args,
        "ports": [{"name": "http", "containerPort": port}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }


def service(namespace: str, name: str, selector: dict[str, str], target: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": selector, "ports": [{"port": 80, "targetPort": target}]},
    }


# ------------------------------------------------------------------------------------ tests
def test_simulated_gpu_nodes_are_ready_and_heartbeat(cluster: Cluster, kube: Kube) -> None:
    out = cluster.kubectl("get", "nodes", "-L", "kvgate.io/pool").stdout
    print(out)
    for name, pool, gib in ((cluster.proxy_node_name, "big", "80"), (SMALL_NODE, "small", "24")):
        node = kube.get("node", name)
        assert is_ready(node), f"node {name} not Ready: {node['status'].get('conditions')}"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node["metadata"]["labels"]["kvgate.io/pool"] == pool
        assert node["metadata"]["annotations"]["kvgate.io/gpu-memory-gib"] == gib
        assert f"{name} " in out and " Ready " in out
    first = kube.get("lease", SMALL_NODE, "kube-node-lease")["spec"]["renewTime"]
    wait_until(
        "the node lease to be renewed",
        lambda: kube.get("lease", SMALL_NODE, "kube-node-lease")["spec"]["renewTime"] != first,
        timeout=LEASE_RENEW_DEADLINE,
    )


def test_deployment_pods_run_get_ready_and_serve_through_the_service_cluster_ip(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    labels = {"app": "engines"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "engines", "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [engine_container()], "terminationGracePeriodSeconds": 5},
            },
        },
    }
    started = time.monotonic()
    kube.apply(deployment, service(namespace, "engines", labels, 30000))

    def two_ready() -> list[Any] | None:
        pods = kube.list("pods", namespace, "app=engines")
        return pods if len(pods) == 2 and all(is_ready(p) for p in pods) else None

    pods = wait_until("two Ready engine pods", two_ready, timeout=ENGINES_READY_DEADLINE)
    print(f"MEASURED deployment of 2 reference engines Ready in {time.monotonic() - started:.1f}s")
    ips = set()
    for pod in pods:
        status = pod["status"]
        assert status["phase"] == "Running"
        assert status["podIP"].startswith("198.1")
        assert status["hostIP"] and status["startTime"]
        (cs,) = status["containerStatuses"]
        assert cs["ready"] and cs["started"] and "running" in cs["state"]
        assert cs["restartCount"] == 0
        ips.add(status["podIP"])
    wait_until(
        "both pod IPs as ready endpoints",
        lambda: ready_endpoints(kube, namespace, "engines") == ips,
        timeout=STEP_DEADLINE,
    )
    # The Deployment controller counts them after the ReplicaSet controller did: a moment later.
    wait_until(
        "the Deployment to count 2 ready replicas",
        lambda: kube.get("deployment", "engines", namespace)["status"].get("readyReplicas") == 2,
        timeout=EVENT_DEADLINE,
    )

    cluster_ip = kube.get("service", "engines", namespace)["spec"]["clusterIP"]
    port = cluster.forward(cluster_ip, 80)
    code, models = wait_until(
        "the Service ClusterIP to answer",
        lambda: http_json(f"http://127.0.0.1:{port}/v1/models", timeout=HTTP_GET_TIMEOUT),
        timeout=STEP_DEADLINE,
    )
    assert code == 200 and models["data"][0]["owned_by"] == "sglang"
    answered_by = set()
    for _ in range(20):
        _, info = http_json(f"http://127.0.0.1:{port}/server_info", timeout=HTTP_GET_TIMEOUT)
        answered_by.add(info["host"])
    assert answered_by <= ips and answered_by, answered_by

    # Deleting a pod: SIGTERM, the process is gone, the pod object is removed, a new one comes.
    victim = pods[0]
    pid = container_pid(victim, "engine")
    assert pid is not None
    cluster.kubectl(
        "delete", "pod", victim["metadata"]["name"], f"--namespace={namespace}", "--wait=true"
    )
    wait_until("the deleted pod's process to exit", lambda: not _alive(pid), timeout=EVENT_DEADLINE)
    wait_until(
        "the ReplicaSet's replacement to be Ready",
        lambda: (
            (p := two_ready()) is not None
            and victim["metadata"]["uid"] not in {x["metadata"]["uid"] for x in p}
        ),
        timeout=ENGINE_POD_DEADLINE,
    )


def test_readiness_gate_nobody_sets_keeps_pod_unready_until_patched_true(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    labels = {"app": "gated"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gated", "namespace": namespace, "labels": labels},
        "spec": {
            "readinessGates": [{"conditionType": GATE}],
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "web",
                    "image": "python:3.11-slim",
                    "command": ["python3", "-m", "http.server", "--bind", "$(POD_IP)", "8080"],
                    "env": [
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
                    ],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                }
            ],
        },
    }
    kube.apply(pod, service(namespace, "gated", labels, 8080))

    def containers_ready() -> Any:
        p = kube.get("pod", "gated", namespace)
        cr = condition(p, "ContainersReady")
        return p if cr and cr["status"] == "True" else None

    current = wait_until(
        "the gated pod's containers to be ready", containers_ready, timeout=POD_START_DEADLINE
    )
    ready = condition(current, "Ready")
    assert ready is not None
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "ReadinessGatesNotReady",
        f'corresponding condition of pod readiness gate "{GATE}" does not exist.',
    )
    assert condition(current, GATE) is None, "the kubelet must never set a gate condition"
    pod_ip = current["status"]["podIP"]
    # The EndpointSlice lists it, but not as ready, so no traffic goes to it.
    wait_until(
        "the pod to be published as a not-ready endpoint",
        lambda: any(
            pod_ip in ep["addresses"] and not ep["conditions"]["ready"]
            for s in kube.list(
                "endpointslices.discovery.k8s.io", namespace, "kubernetes.io/service-name=gated"
            )
            for ep in s.get("endpoints") or []
        ),
        timeout=STEP_DEADLINE,
    )
    assert pod_ip not in ready_endpoints(kube, namespace, "gated")

    flipped = time.monotonic()
    kube.patch_gate(namespace, "gated", "True")
    after = wait_until(
        "Ready=True after the gate turned True",
        lambda: (p := kube.get("pod", "gated", namespace)) and is_ready(p) and p,
        timeout=EVENT_DEADLINE,
    )
    print(f"MEASURED gate True -> pod Ready: {time.monotonic() - flipped:.2f}s")
    assert condition(after, GATE)["status"] == "True"  # type: ignore[index]
    wait_until(
        "the pod as a ready endpoint",
        lambda: pod_ip in ready_endpoints(kube, namespace, "gated"),
        timeout=EVENT_DEADLINE,
    )
    ready_since = condition(after, "Ready")["lastTransitionTime"]  # type: ignore[index]
    ready_cond = condition(after, "ContainersReady")
    assert ready_cond is not None

    kube.patch_gate(namespace, "gated", "False")
    back = wait_until(
        "Ready=False after the gate turned False",
        lambda: (p := kube.get("pod", "gated", namespace)) and not is_ready(p) and p,
        timeout=EVENT_DEADLINE,
    )
    ready = condition(back, "Ready")
    assert ready is not None
    assert ready["message"] == f'the status of pod readiness gate "{GATE}" is not "True", but False'
    assert ready["lastTransitionTime"] >= ready_since
    # ContainersReady did not flip, so its transition time stayed put.
    still = condition(back, "ContainersReady")
    assert still is not None and still["status"] == "True"
    assert still["lastTransitionTime"] == ready_cond["lastTransitionTime"]
    wait_until(
        "the pod out of the ready endpoints",
        lambda: pod_ip not in ready_endpoints(kube, namespace, "gated"),
        timeout=EVENT_DEADLINE,
    )


SA_SCRIPT = """
import base64, json, os
from kubernetes import client, config
path = "/var/run/secrets/kubernetes.io/serviceaccount"
out = {"mounted": os.path.exists(path + "/token")}
if out["mounted"]:
    config.load_incluster_config()
    v1 = client.CoreV1Api()
    ns = open(path + "/namespace").read()
    token = open(path + "/token").read()
    out["claims"] = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    out["pods"] = sorted(p.metadata.name for p in v1.list_namespaced_pod(ns).items)
    try:
        v1.list_namespaced_secret(ns)
        out["secrets"] = "allowed"
    except client.ApiException as exc:
        out["secrets"] = exc.status
print("RESULT " + json.dumps(out), flush=True)
"""


def test_pod_reads_its_own_token_in_cluster_and_is_held_to_its_rbac(
    cluster: Cluster, kube: Kube, kubelet: KubeletThread, namespace: str
) -> None:
    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    ]
    for obj in rbac:
        obj["metadata"]["namespace"] = namespace

    def script_pod(name: str, automount: bool) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "serviceAccountName": "reader",
                "automountServiceAccountToken": automount,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "python:3.11",
                        "command": ["python3", "-c", SA_SCRIPT],
                    }
                ],
            },
        }

    kube.apply(*rbac)
    wait_until("the ServiceAccount", lambda: kube.get("serviceaccount", "reader", namespace))
    kube.apply(script_pod("client", True), script_pod("no-token", False))

    def result(name: str) -> dict[str, Any] | None:
        pod = kube.get("pod", name, namespace)
        if pod["status"].get("phase") not in ("Succeeded", "Failed"):
            return None
        assert pod["status"]["phase"] == "Succeeded", _log(kubelet, namespace, name)
        for line in _log(kubelet, namespace, name).splitlines():
            if line.startswith("RESULT "):
                return dict(json.loads(line[len("RESULT ") :]))
        raise AssertionError(f"no RESULT line in the log of {name}")

    got = wait_until(
        "the in-cluster client pod to finish", lambda: result("client"), timeout=SCRIPT_POD_DEADLINE
    )
    assert got["mounted"] is True
    assert got["claims"]["sub"] == f"system:serviceaccount:{namespace}:reader"
    assert got["claims"]["kubernetes.io"]["pod"]["name"] == "client"  # bound to this pod
    assert "client" in got["pods"]
    assert got["secrets"] == 403
    none = wait_until(
        "the no-token pod to finish", lambda: result("no-token"), timeout=SCRIPT_POD_DEADLINE
    )
    assert none == {"mounted": False}
    pod = kube.get("pod", "client", namespace)
    ready = condition(pod, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("False", "PodCompleted")


def test_engine_restart_with_smaller_gpu_memory_shrinks_the_pool(
    cluster: Cluster, kube: Kube, kubelet: KubeletThread, namespace: str
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "engine", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kvgate.io/pool": "small"},
            "terminationGracePeriodSeconds": 2,
            "containers": [engine_container()],
        },
    }
    kube.apply(pod)
    first = wait_until(
        "the engine to be Ready",
        lambda: (p := kube.get("pod", "engine", namespace)) and is_ready(p) and p,
    )
    ip = first["status"]["podIP"]
    port = cluster.forward(ip, 30000)
    _, before = http_json(f"http://127.0.0.1:{port}/server_info")
    try:
        pid = kubelet.call(
            kubelet.kubelet.restart_container(namespace, "engine", "engine", gpu_memory_gib=20)
        )
        assert pid is not None
        restarted = wait_until(
            "the engine to be restarted and Ready again",
            lambda: (
                (p := kube.get("pod", "engine", namespace))
                and p["status"]["containerStatuses"][0]["restartCount"] == 1
                and is_ready(p)
                and p
            ),
            timeout=RESTART_DEADLINE,
        )
        (cs,) = restarted["status"]["containerStatuses"]
        assert cs["lastState"]["terminated"]["exitCode"] == 137
        assert container_pid(restarted, "engine") != pid
        assert restarted["status"]["podIP"] == ip
        _, after = http_json(f"http://127.0.0.1:{port}/server_info")
        pool = "max_total_num_tokens"
        print(
            f"MEASURED engine pool at 24 GiB: {before[pool]:,} tokens, at 20 GiB: {after[pool]:,}"
        )
        assert after[pool] < before[pool]
    finally:
        kubelet.call(kubelet.kubelet.set_gpu_memory(SMALL_NODE, 24))


def test_smg_discovers_pd_engines_by_label_and_drops_a_worker_whose_pod_turns_not_ready(
    cluster: Cluster, kube: Kube, kubelet: KubeletThread, namespace: str
) -> None:
    app = {"app": "pd"}

    def engine_pod(role: str) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": role,
            "namespace": namespace,
            "labels": app | {"role": role},
        }
        if role == "prefill":
            meta["annotations"] = {"sglang.ai/bootstrap-port": "8998"}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "readinessGates": [{"conditionType": GATE}],
                "terminationGracePeriodSeconds": 2,
                "containers": [engine_container(role)],
            },
        }

    rbac = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "router"}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-watcher"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "router"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-watcher",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "router", "namespace": namespace}],
        },
    ]
    for obj in rbac:
        obj["metadata"]["namespace"] = namespace
    router = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "router", "namespace": namespace, "labels": {"app": "router"}},
        "spec": {
            "serviceAccountName": "router",
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "smg",
                    "image": SMG_IMAGE,
                    "command": ["smg", "launch"],
                    "args": [
                        *SMG_ARGS.split(),
                        f"--service-discovery-namespace={namespace}",
                    ],
                    "readinessProbe": {
                        "httpGet": {"path": "/readiness", "port": 8000},
                        "periodSeconds": 1,
                    },
                }
            ],
        },
    }
    kube.apply(*rbac)
    wait_until("the ServiceAccount", lambda: kube.get("serviceaccount", "router", namespace))
    kube.apply(engine_pod("prefill"), engine_pod("decode"), router)
    for role in ("prefill", "decode"):
        wait_until(
            f"{role} containers ready",
            lambda r=role: (
                (c := condition(kube.get("pod", r, namespace), "ContainersReady"))
                and c["status"] == "True"
            ),
            timeout=ENGINE_POD_DEADLINE,
        )
        kube.patch_gate(namespace, role, "True")  # acting as the operator
    router_pod = wait_until(
        "the router pod to be Ready (a ready prefill and decode discovered)",
        lambda: (p := kube.get("pod", "router", namespace)) and is_ready(p) and p,
        timeout=ENGINE_POD_DEADLINE,
    )
    port = cluster.forward(router_pod["status"]["podIP"], 8000)
    decode_ip = kube.get("pod", "decode", namespace)["status"]["podIP"]
    _, workers = http_json(f"http://127.0.0.1:{port}/workers")
    urls = {w["worker_type"]: w["url"] for w in workers["workers"]}
    assert live_host({"url": urls["decode"]}) == decode_ip, urls
    engine_ports = {
        role: cluster.forward(kube.get("pod", role, namespace)["status"]["podIP"], 30000)
        for role in ("prefill", "decode")
    }
    before = {role: served_at(p) for role, p in engine_ports.items()}
    body = {"text": "Hello", "model": "tiny-llama", "sampling_params": {"max_new_tokens": 4}}
    code, answer = http_json(f"http://127.0.0.1:{port}/generate", body, timeout=GENERATE_TIMEOUT)
    assert code == 200, answer
    assert "text" in answer
    # One PD request: both legs reached their engine (smg sends the same body to each).
    assert {role: served_at(p) - before[role] for role, p in engine_ports.items()} == {
        "prefill": 1,
        "decode": 1,
    }

    flipped = time.monotonic()
    kube.patch_gate(namespace, "decode", "False")
    wait_until(
        "the decode pod to turn NotReady",
        lambda: not is_ready(kube.get("pod", "decode", namespace)),
        timeout=EVENT_DEADLINE,
    )
    not_ready_after = time.monotonic() - flipped

    def decode_gone() -> bool:
        _, current = http_json(f"http://127.0.0.1:{port}/workers", timeout=HTTP_GET_TIMEOUT)
        return not any(
            w["worker_type"] == "decode" and w.get("status") not in ("draining",)
            for w in current["workers"]
        )

    wait_until(
        "smg to stop routing to the NotReady decode worker", decode_gone, timeout=STEP_DEADLINE
    )
    draining_after = time.monotonic() - flipped

    def decode_removed() -> bool:
        _, current = http_json(f"http://127.0.0.1:{port}/workers", timeout=HTTP_GET_TIMEOUT)
        return not any(w["worker_type"] == "decode" for w in current["workers"])

    wait_until("smg to remove the decode worker", decode_removed, timeout=STEP_DEADLINE)
    removed_after = time.monotonic() - flipped
    print(
        f"MEASURED decode gate False -> pod NotReady {not_ready_after:.2f}s, "
        f"-> smg worker draining {draining_after:.2f}s, -> removed {removed_after:.2f}s"
    )
    code, _ = http_json(f"http://127.0.0.1:{port}/generate", body, timeout=GENERATE_TIMEOUT)
    assert code >= 500


def test_cli_kubelet_in_the_namespace_runs_its_own_node_and_stops_its_pods_on_sigterm(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    argv = [
        sys.executable, "-m", "kvgate_e2e.kubelet", "--kubeconfig", str(cluster.kubeconfig),
        "--node", "cli-0:pool=cli:gpus=2:gpu-memory-gib=40",
        "--run-dir", str(cluster.run_dir / "cli-kubelet"),
        # Its own address ranges (the in-process kubelet allocates from 198.18.1.0 upwards).
        "--pod-ip-range", "198.18.250.1-198.18.250.254",
        "--node-ip-range", "198.18.251.1-198.18.251.254",
    ]  # fmt: skip
    log_path = cluster.run_dir / "cli-kubelet.log"
    with log_path.open("wb") as log_file:
        proc = cluster.popen_in_netns(argv, stdout=subprocess.PIPE, stderr=log_file, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.strip() == READY_LINE, log_path.read_text()
        wait_until(
            "node cli-0 Ready",
            lambda: is_ready(kube.get("node", "cli-0")),
            timeout=NODE_READY_DEADLINE,
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "cli-engine", "namespace": namespace},
            "spec": {
                "nodeSelector": {"kvgate.io/pool": "cli"},
                "terminationGracePeriodSeconds": 2,
                "containers": [engine_container()],
            },
        }
        kube.apply(pod)
        running = wait_until(
            "the engine on the CLI kubelet to be Ready",
            lambda: (p := kube.get("pod", "cli-engine", namespace)) and is_ready(p) and p,
        )
        assert running["status"]["podIP"].startswith("198.18.250.")
        port = cluster.forward(running["status"]["podIP"], 30000)
        _, info = http_json(f"http://127.0.0.1:{port}/server_info")
        assert info["host"] == running["status"]["podIP"]
        pid = container_pid(running, "engine")
        assert pid is not None
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=KUBELET_STOP_DEADLINE)
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0
    assert not _alive(pid), "the CLI kubelet left its pod process running"
    # Nothing runs the pod any more (as after a node loss): remove it and the node by force.
    cluster.kubectl(
        "delete", "pod", "cli-engine", f"--namespace={namespace}", "--force", "--grace-period=0"
    )
    cluster.kubectl("delete", "node", "cli-0", "--wait=true")


def served_at(port: int) -> float:
    return requests_served(f"http://127.0.0.1:{port}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes once reaped or defunct.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except OSError:
        return False


def _log(kubelet: KubeletThread, namespace: str, pod: str) -> str:
    path = kubelet.kubelet.log_path(namespace, pod, "main")
    return path.read_text() if path is not None and path.exists() else ""


# ------------------------------------------------------------------------ container logs
TICKER = (
    "import os, sys, time\n"
    "pid = os.getpid()\n"
    "print(f'started {pid}', file=sys.stderr, flush=True)\n"
    "n = 0\n"
    "while True:\n"
    "    print(f'instance {pid} tick {n}', flush=True)\n"
    "    n += 1\n"
    "    time.sleep(0.3)\n"
)


def _ticker_pod(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ticker", "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "main", "image": "python:3.11-slim", "command": ["python3", "-c", TICKER]}
            ],
        },
    }


def _stamped(text: str) -> list[tuple[str, str]]:
    """``kubectl logs --timestamps`` lines -> (timestamp, text)."""
    out = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        out.append((stamp, rest))
    return out


def _read_lines(stream: IO[str] | None, into: list[str]) -> None:
    for line in iter(stream.readline if stream else str, ""):
        into.append(line)


def _ticks(text: str) -> list[int]:
    return [int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if " tick " in line]


def test_kubectl_logs_reads_the_container_log_through_the_apiserver_and_the_kubelet(
    cluster: Cluster, kube: Kube, kubelet: KubeletThread, namespace: str
) -> None:
    from kvgate_e2e.kubelet.logs import parse_timestamp

    ns = f"--namespace={namespace}"
    kube.apply(_ticker_pod(namespace))

    def logs(*flags: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return cluster.kubectl("logs", "ticker", ns, *flags, check=check, timeout=KUBECTL_TIMEOUT)

    def pod_running() -> bool:
        pod = kube.get("pod", "ticker", namespace)
        return container_pid(pod, "main") is not None

    wait_until("the ticker to run", pod_running, timeout=POD_START_DEADLINE)
    full = wait_until(
        "five ticks in kubectl logs",
        lambda: (out := logs(check=False)).returncode == 0 and len(_ticks(out.stdout)) >= 5 and out,
        timeout=LOG_DEADLINE,
    ).stdout
    pid = container_pid(kube.get("pod", "ticker", namespace), "main")
    assert full.splitlines()[0] == f"started {pid}"  # stderr and stdout, in order
    assert _ticks(full) == list(range(len(_ticks(full))))
    assert "=====" not in full  # the raw log's header lines are the kubelet's, not the container's

    # --timestamps: the kubelet's RFC3339NanoFixed prefix, in order.
    stamped = _stamped(logs("--timestamps").stdout)
    stamps = [parse_timestamp(s) for s, _ in stamped]
    assert stamps == sorted(stamps) and len(stamped) >= 6
    assert all(len(s) == len("2026-01-01T00:00:00.000000000Z") for s, _ in stamped)

    # --tail: the last N lines only.
    tail = logs("--tail=2").stdout.splitlines()
    assert len(tail) == 2 and _ticks("\n".join(tail))[1] == _ticks("\n".join(tail))[0] + 1
    assert _ticks("\n".join(tail))[0] >= _ticks(full)[-1] - 1

    # --since-time (RFC 3339, whole seconds on the wire): lines at or after it.
    whole = {s[:19] for s, _ in stamped}
    cut = sorted(whole)[1] + "Z"
    since = _stamped(logs("--timestamps", f"--since-time={cut}").stdout)
    assert since and all(parse_timestamp(s) >= parse_timestamp(cut) for s, _ in since)
    before = [s for s, _ in stamped if parse_timestamp(s) < parse_timestamp(cut)]
    assert before and since[0][0] == next(s for s, _ in stamped if s not in before)

    # --limit-bytes: exactly that many bytes of the log.
    limited = logs("--limit-bytes=12").stdout
    assert limited == full[:12]

    # --previous before any restart: the kubelet's own error.
    none = logs("--previous", check=False)
    assert none.returncode != 0
    assert 'previous terminated container "main" in pod "ticker" not found' in none.stderr

    # -f: a line written after the stream started arrives; the stream ends when the instance
    # exits (the container is killed; the kubelet restarts it).
    last_before = _ticks(logs().stdout)[-1]
    follow = cluster.popen_in_netns(
        [str(cluster.binaries.k8s), "kubectl", f"--kubeconfig={cluster.kubeconfig}", "logs", "-f",
         "--timestamps", "ticker", ns],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=_read_lines, args=(follow.stdout, lines), daemon=True)
    reader.start()
    try:
        newer = wait_until(
            "a tick written after kubectl logs -f started",
            lambda: [t for t in _ticks("".join(lines)) if t > last_before + 1],
            timeout=LOG_DEADLINE,
        )
        print(
            f"MEASURED kubectl logs -f: tick {newer[0]} arrived (last before the stream: "
            f"{last_before})"
        )
        killed = kubelet.call(kubelet.kubelet.restart_container(namespace, "ticker", "main"))
        assert killed == pid
        code = wait_until(
            "kubectl logs -f to end once the container instance exited",
            lambda: follow.poll() is not None and (follow.returncode,),
            timeout=LOG_DEADLINE,
        )
        assert code == (0,), follow.stderr.read() if follow.stderr else ""
    finally:
        if follow.poll() is None:
            follow.kill()
        follow.wait(10)
        reader.join(10)
    assert all(f"instance {pid} " in line for line in lines if " tick " in line)

    # After the restart: --previous is the killed instance, the default the new one.
    def restarted() -> int | None:
        pod = kube.get("pod", "ticker", namespace)
        (cs,) = pod["status"]["containerStatuses"]
        new = container_pid(pod, "main")
        return new if cs["restartCount"] == 1 and new and new != pid else None

    new_pid = wait_until("the ticker restarted", restarted, timeout=POD_START_DEADLINE)
    wait_until(
        "the new instance's first tick in kubectl logs",
        lambda: f"instance {new_pid} tick 0" in logs(check=False).stdout,
        timeout=LOG_DEADLINE,
    )
    current = logs().stdout
    assert f"instance {pid} " not in current and current.startswith(f"started {new_pid}")
    previous = logs("--previous").stdout
    assert previous.startswith(f"started {pid}") and f"instance {new_pid}" not in previous
    assert _ticks(previous)[-1] >= newer[0]


def test_kubelet_port_refuses_requests_without_the_apiservers_client_certificate(
    cluster: Cluster, kube: Kube, kubelet: KubeletThread, namespace: str
) -> None:
    import ssl

    from cryptography.x509.oid import ExtendedKeyUsageOID
    from kvgate.kube.tls import issue_certificate
    from kvgate_e2e.pki import load_ca

    kube.apply(_ticker_pod(namespace))
    pod = wait_until(
        "the ticker to run",
        lambda: (p := kube.get("pod", "ticker", namespace)) and container_pid(p, "main") and p,
        timeout=POD_START_DEADLINE,
    )
    node = kube.get("node", pod["spec"]["nodeName"])
    ip = next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")
    assert node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250
    port = cluster.forward(ip, 10250)
    url = f"https://127.0.0.1:{port}/containerLogs/{namespace}/ticker/main?tailLines=1"
    stranger = issue_certificate(
        load_ca(cluster.pki.ca_cert, cluster.pki.ca_key),
        common_name="not-the-apiserver",
        usages=[ExtendedKeyUsageOID.CLIENT_AUTH],
        valid_days=1,
    )
    (cluster.run_dir / "stranger.crt").write_bytes(stranger.cert_pem)
    (cluster.run_dir / "stranger.key").write_bytes(stranger.key_pem)

    def get(cert: tuple[Path, Path] | None) -> tuple[int, str]:
        ctx = ssl.create_default_context(cafile=str(cluster.pki.ca_cert))
        ctx.check_hostname = False  # reached through a relay on 127.0.0.1; the CA is verified
        if cert is not None:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        try:
            with urllib.request.urlopen(url, timeout=KUBELET_REQUEST_TIMEOUT, context=ctx) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    assert get(None) == (401, "Unauthorized")
    code, text = get((cluster.run_dir / "stranger.crt", cluster.run_dir / "stranger.key"))
    assert code == 403 and "user=not-the-apiserver" in text, text
    code, text = wait_until(
        "a tick through the kubelet port with the apiserver's certificate",
        lambda: (
            (r := get((cluster.pki.kubelet_client_cert, cluster.pki.kubelet_client_key)))
            and " tick " in r[1]
            and r
        ),
        timeout=LOG_DEADLINE,
    )
    assert code == 200 and len(text.splitlines()) == 1
