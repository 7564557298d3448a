"""Pure parts of the LeaderWorkerSet world (kvgate_e2e.lws) and the kubelet's pod hostnames
(kvgate_e2e.kubelet.hosts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kvgate_e2e.kubelet.hosts import PodHosts, pod_host_names, render_hosts
from kvgate_e2e.lws import (
    NAMESPACE,
    SERVICE,
    controller_config,
    project_files,
    secret_files,
    webhook_configurations,
    webhook_service_objects,
)

MANIFESTS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- name: mlws.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-lws}}
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- name: vlws.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate-lws}}
"""
POD_PATCH: list[dict[str, Any]] = [
    {
        "op": "replace",
        "path": "/webhooks/1",
        "value": {
            "name": "mpod.kb.io",
            "clientConfig": {
                "service": {"name": "webhook-service", "namespace": "system", "path": "/p"}
            },
            "objectSelector": {
                "matchExpressions": [
                    {"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}
                ]
            },
        },
    }
]


def test_webhook_configurations_are_renamed_patched_and_point_at_the_world_service() -> None:
    docs = webhook_configurations(MANIFESTS, {"MutatingWebhookConfiguration": POD_PATCH})
    assert [d["metadata"]["name"] for d in docs] == [
        "lws-mutating-webhook-configuration",
        "lws-validating-webhook-configuration",
    ]
    services = [h["clientConfig"]["service"] for d in docs for h in d["webhooks"]]
    assert {(s["name"], s["namespace"]) for s in services} == {(SERVICE, NAMESPACE)}
    pod_hook = docs[0]["webhooks"][1]
    assert pod_hook["objectSelector"]["matchExpressions"][0]["operator"] == "Exists"
    assert docs[0]["webhooks"][0]["clientConfig"]["service"]["path"] == "/mutate-lws"


def test_an_unknown_patch_op_is_refused() -> None:
    with pytest.raises(RuntimeError, match="unsupported patch op"):
        webhook_configurations(
            MANIFESTS, {"ValidatingWebhookConfiguration": [{"op": "add", "path": "/x"}]}
        )


def test_the_controller_serves_its_webhook_on_its_own_address_with_internal_certs() -> None:
    cfg = controller_config("198.18.0.9", Path("/run/x/certs"))
    assert cfg["webhook"] == {"host": "198.18.0.9", "port": 9443, "certDir": "/run/x/certs"}
    assert cfg["internalCertManagement"]["enable"] is True
    assert cfg["leaderElection"]["leaderElect"] is False
    assert cfg["metrics"]["bindAddress"] == "0"


def test_the_webhook_service_routes_to_the_controller_address() -> None:
    objs = {o["kind"]: o for o in webhook_service_objects("198.18.0.9")}
    assert "selector" not in objs["Service"]["spec"]
    slice_ = objs["EndpointSlice"]
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == SERVICE
    assert slice_["endpoints"][0]["addresses"] == ["198.18.0.9"]
    assert slice_["ports"][0]["port"] == objs["Service"]["spec"]["ports"][0]["targetPort"]


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        (
            {"hostname": "md-0", "subdomain": "md"},
            ["md-0.md.ns.svc.cluster.local", "md-0.md.ns.svc", "md-0.md.ns"],
        ),
        ({"hostname": "md-0"}, []),  # no subdomain: Kubernetes publishes no name either
        ({}, []),
    ],
)
def test_pod_host_names(spec: dict[str, str], names: list[str]) -> None:
    assert pod_host_names({"metadata": {"namespace": "ns"}, "spec": spec}) == names


def test_the_hosts_file_keeps_the_host_entries_and_is_rewritten_in_place(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.write_text("127.0.0.1 localhost\n")
    hosts = PodHosts(tmp_path / "hosts", base=base)
    # A container's bind mount holds the file's inode, as this open file does: every change
    # must be visible through it.
    with hosts.path.open() as mounted:
        hosts.add("ns/a-0", "198.18.0.5", ["a-0.a.ns"])
        mounted.seek(0)
        seen = mounted.read()
        assert seen.startswith("127.0.0.1 localhost\n")
        assert "198.18.0.5 a-0.a.ns" in seen
        hosts.remove("ns/a-0")
        mounted.seek(0)
        assert "a-0.a.ns" not in mounted.read()


def test_render_hosts_without_a_base_still_has_localhost() -> None:
    text = render_hosts("", {"ns/b": ("198.18.0.6", ["b-0.b.ns"])})
    assert text.splitlines()[0] == "127.0.0.1 localhost"


def test_the_hosts_file_is_made_in_a_run_dir_that_does_not_exist_yet(tmp_path: Path) -> None:
    # The kubelet's run dir (<cluster run dir>/kubelet) is made only when its first pod starts.
    hosts = PodHosts(tmp_path / "kubelet" / "hosts", base=tmp_path / "no-base")
    assert hosts.path.read_text().startswith("127.0.0.1 localhost\n")


def test_the_rotators_secret_is_projected_into_the_cert_dir_as_a_secret_volume_would(
    tmp_path: Path,
) -> None:
    # The rotator (cert-controller) waits for tls.crt in its cert dir, which only a Secret
    # volume would write: without this the LWS webhook server never started.
    secret = {"data": {"tls.crt": "Y2VydA==", "tls.key": "a2V5", "ca.crt": "Y2E=", "../x": "eA=="}}
    files = secret_files(secret)
    assert files == {"tls.crt": b"cert", "tls.key": b"key", "ca.crt": b"ca"}
    certs = tmp_path / "certs"
    project_files(certs, files)
    assert (certs / "tls.crt").read_bytes() == b"cert"
    before = (certs / "tls.key").stat().st_ino
    project_files(certs, {**files, "tls.crt": b"new"})  # a rotation
    assert (certs / "tls.crt").read_bytes() == b"new"
    assert (certs / "tls.key").stat().st_ino == before  # unchanged files are left alone
    assert sorted(p.name for p in certs.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert secret_files({}) == {}
