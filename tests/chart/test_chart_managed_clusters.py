"""Managed control planes that cannot reach the webhook where it listens by default: a private
GKE cluster's control plane reaches nodes only on 443 and 10250 (`ports.webhook=10250`), and
EKS with a custom CNI cannot reach pod IPs at all (`webhook.hostNetwork=true`, the webhook on a
node port that is free)."""

from __future__ import annotations

from typing import Any

import pytest
from helm_runner import Helm


def _webhook_pod(helm: Helm, *sets: str) -> dict[str, Any]:
    webhook = helm.template(*sets).webhook()
    return webhook


def test_the_webhook_stays_on_the_pod_network_by_default(helm: Helm) -> None:
    pod = _webhook_pod(helm)["spec"]["template"]["spec"]
    assert not pod.get("hostNetwork")
    assert "dnsPolicy" not in pod


def test_host_network_puts_the_webhook_on_the_nodes_network_at_the_port_given(helm: Helm) -> None:
    webhook = _webhook_pod(
        helm,
        "webhook.hostNetwork=true",
        "ports.webhook=10260",
        "ports.metrics=10261",
        "ports.health=10262",
    )
    pod = webhook["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    # Cluster DNS stays the pod's resolver (the default on the host network is the node's).
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    (container,) = pod["containers"]
    assert "--port=10260" in container["args"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"webhook": 10260, "metrics": 10261, "health": 10262}
    # A node holds one webhook pod (its ports are the node's): a rollout replaces one pod at a
    # time instead of surging a pod no node could take.
    assert webhook["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_the_webhook_service_still_targets_the_webhook_port(helm: Helm) -> None:
    rendered = helm.template("webhook.hostNetwork=true", "ports.webhook=10260")
    service = next(s for s in rendered.all("Service") if s["metadata"]["name"] == "kvgate-webhook")
    (port,) = service["spec"]["ports"]
    assert port["port"] == 443 and port["targetPort"] in ("webhook", 10260)


@pytest.mark.parametrize(
    ("port_value", "port"),
    [("ports.webhook", 10250), ("ports.metrics", 10249), ("ports.health", 10248)],
)
def test_host_network_on_a_port_a_node_component_holds_fails_naming_it(
    helm: Helm, port_value: str, port: int
) -> None:
    result = helm.template_result("webhook.hostNetwork=true", f"{port_value}={port}")
    assert result.returncode != 0, f"{port_value}={port} with hostNetwork was accepted"
    assert f"{port_value}={port}" in result.stderr
    assert "webhook.hostNetwork" in result.stderr


def test_port_10250_on_the_pod_network_is_allowed_for_private_gke(helm: Helm) -> None:
    pod = _webhook_pod(helm, "ports.webhook=10250")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--port=10250" in container["args"]
    assert not pod.get("hostNetwork")
