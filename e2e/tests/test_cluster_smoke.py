"""Smoke tests for the e2e control plane: it starts, serves, and leaves nothing behind.

Run (as root, after ``e2e/controlplane/build.sh``)::

    PYTHONPATH=e2e .venv/bin/pytest -m e2e e2e/tests/test_cluster_smoke.py -v
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from kvgate_e2e.build_artifacts import find_binaries, missing_binaries_reason
from kvgate_e2e.cluster import Cluster, ClusterError
from kvgate_e2e.deadlines import SERVICE_ACCOUNT_DEADLINE
from kvgate_e2e.netns import list_namespaces, netns_supported, reap_stale_namespaces
from kvgate_e2e.polling import poll_until

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_binaries() is None, reason=missing_binaries_reason()),
]
# Deadlines, not bounds: only a step that never happens reaches one.
# kube-proxy serving the kubernetes Service's ClusterIP once the cluster started.
KUBERNETES_SERVICE_DEADLINE = 120
# A killed process gone (the cluster's shutdown, the owner's kill, the reaped namespace's orphan):
# the kill is at once, this only ends a wait for a process that survived.
KILLED_EXIT_DEADLINE = 10
# The start with a bad apiserver flag: the apiserver exits at once; the start gives up after this.
FAILED_START_TIMEOUT = 60

CRD_YAML = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.kvgate.io
spec:
  group: smoke.kvgate.io
  scope: Namespaced
  names:
    plural: widgets
    singular: widget
    kind: Widget
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          properties:
            spec:
              type: object
              properties:
                size:
                  type: integer
                  minimum: 1
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    reason = netns_supported()
    if reason is not None:
        pytest.fail(f"the e2e tier needs network namespaces: {reason}")
    with Cluster() as c:
        yield c


def test_apiserver_reports_ready(cluster: Cluster) -> None:
    out = cluster.kubectl("get", "--raw", "/readyz").stdout
    assert out.strip() == "ok"


def test_kubectl_and_server_report_the_pinned_release(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "--output=json").stdout)
    assert version["clientVersion"]["gitVersion"] == "v1.37.2"
    assert version["serverVersion"]["gitVersion"] == "v1.37.2"
    assert version["serverVersion"]["minor"] == "37"


def test_rbac_is_enforced_for_service_accounts(cluster: Cluster) -> None:
    allowed = cluster.kubectl(
        "auth",
        "can-i",
        "list",
        "secrets",
        "--as=system:serviceaccount:default:default",
        check=False,
    )
    assert allowed.stdout.strip() == "no"
    assert cluster.kubectl("auth", "can-i", "*", "*").stdout.strip() == "yes"


def test_applied_crd_becomes_established(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", "-", input=CRD_YAML)
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/widgets.smoke.kvgate.io",
    )
    created = cluster.kubectl(
        "create",
        "-f",
        "-",
        "-o",
        "name",
        input="apiVersion: smoke.kvgate.io/v1\nkind: Widget\n"
        "metadata: {name: w1, namespace: default}\nspec: {size: 2}\n",
    )
    assert created.stdout.strip() == "widget.smoke.kvgate.io/w1"
    rejected = cluster.kubectl(
        "create",
        "-f",
        "-",
        check=False,
        input="apiVersion: smoke.kvgate.io/v1\nkind: Widget\n"
        "metadata: {name: w0, namespace: default}\nspec: {size: 0}\n",
    )
    assert rejected.returncode != 0
    assert "spec.size" in rejected.stderr


def test_controller_manager_creates_default_service_account_token_path(cluster: Cluster) -> None:
    cluster.kubectl("create", "namespace", "smoke")
    poll_until(
        "ServiceAccount smoke/default",
        lambda: cluster.kubectl("get", "sa", "default", "-n", "smoke", check=False).returncode == 0,
        SERVICE_ACCOUNT_DEADLINE,
    )
    token = cluster.kubectl("create", "token", "default", "-n", "smoke").stdout.strip()
    assert token.count(".") == 2


def test_host_process_reaches_apiserver_through_relay(cluster: Cluster) -> None:
    from kubernetes import client

    api = client.VersionApi(cluster.new_api_client())
    assert api.get_code().git_version == "v1.37.2"


def test_kube_proxy_serves_kubernetes_service_cluster_ip(cluster: Cluster) -> None:
    cluster.wait_for_kubernetes_service(timeout=KUBERNETES_SERVICE_DEADLINE)
    eps = cluster.api_get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices")
    addresses = [a for item in eps["items"] for ep in item["endpoints"] for a in ep["addresses"]]
    assert str(cluster.control_plane_ip) in addresses
    # In-cluster style access: https://198.19.0.1:443 from inside the namespace.
    out = cluster.kubectl(
        f"--server=https://{cluster.kubernetes_service_ip}:443", "get", "--raw", "/readyz"
    ).stdout
    assert out.strip() == "ok"


def test_pod_ip_allocator_adds_addresses_inside_the_namespace_only(cluster: Cluster) -> None:
    ip = cluster.add_pod_ip()
    assert ip.is_private and str(ip).startswith("198.18.")
    assert ip not in cluster.config.service_cidr
    inside = cluster.run_in_netns(["ip", "-4", "addr", "show", "dev", "lo"]).stdout
    assert f"{ip}/32" in inside
    # The namespace has no route out: only lo and the Service CIDR.
    routes = cluster.run_in_netns(["ip", "-4", "route"]).stdout
    assert "default" not in routes


def test_helm_runs_against_the_cluster(cluster: Cluster) -> None:
    out = cluster.helm("list", "--all-namespaces", "--output=json").stdout
    assert json.loads(out) == []


def test_shutdown_leaves_no_process_namespace_or_directory() -> None:
    reason = netns_supported()
    if reason is not None:
        pytest.fail(reason)
    c = Cluster()
    with c:
        pids = list(c.component_pids().values())
        run_dir: Path = c.run_dir
        name = c.netns_name
        assert name in list_namespaces()
        # Something a kubelet would start: a stray process inside the namespace.
        stray = c.popen_in_netns(["sleep", "300"])
    assert stray.wait(timeout=KILLED_EXIT_DEADLINE) is not None
    for pid in pids:
        assert not _alive(pid), f"process {pid} survived cluster shutdown"
    assert name not in list_namespaces()
    assert not run_dir.exists()


def test_failed_start_cleans_up() -> None:
    from kvgate_e2e.cluster import ClusterConfig

    c = Cluster(
        ClusterConfig(extra_apiserver_args=("--no-such-flag",), start_timeout=FAILED_START_TIMEOUT)
    )
    with pytest.raises(ClusterError, match="kube-apiserver exited"):
        c.start()
    assert c.netns_name not in list_namespaces()


def test_namespace_of_a_killed_run_is_reaped_by_the_next_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "dead-run"
    run_dir.mkdir()
    script = (
        "import subprocess, sys, time\n"
        "from pathlib import Path\n"
        "from kvgate_e2e.netns import NetNamespace\n"
        "ns = NetNamespace(); ns.create(); ns.record_owner(Path(sys.argv[1]))\n"
        "p = subprocess.Popen(ns.exec_argv(['sleep', '300']), start_new_session=True)\n"
        "print(ns.name, p.pid, flush=True); time.sleep(300)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    owner = subprocess.Popen(
        [sys.executable, "-c", script, str(run_dir)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert owner.stdout is not None
    name, pid = owner.stdout.readline().split()
    owner.kill()  # dies without cleaning up, like a run killed by a CI timeout
    owner.wait(timeout=KILLED_EXIT_DEADLINE)
    assert name in list_namespaces()

    assert name in reap_stale_namespaces()
    assert name not in list_namespaces()
    assert not run_dir.exists()
    poll_until(
        "the orphan inside the namespace to exit",
        lambda: not _alive(int(pid)),
        KILLED_EXIT_DEADLINE,
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); check its state.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"
