"""kvgate_api_requests_total: every request of kvgate's client counted by verb and resource
(the scale benchmark reads it to show API traffic follows changes, not fleet size)."""

from __future__ import annotations

import kmock
import pytest
from kvgate.kube import metrics
from kvgate.kube.k8s import Credentials, KubeApi, resource_of


@pytest.mark.parametrize(
    ("path", "resource"),
    [
        ("/api/v1/namespaces/ns/pods/p/status", "pods/status"),
        ("/api/v1/namespaces/ns/pods", "pods"),
        ("/apis/apps/v1/namespaces/ns/deployments/d", "deployments"),
        (
            "/apis/kvgate.io/v1alpha1/namespaces/ns/modeldeployments/m/status",
            "modeldeployments/status",
        ),
        ("/apis/kvgate.io/v1alpha1/modeldeployments", "modeldeployments"),
        ("/apis/coordination.k8s.io/v1/namespaces/kvgate-system/leases/kvgate", "leases"),
        ("/api/v1/namespaces/ns", "namespaces"),
        ("/api/v1/nodes?limit=1", "nodes"),
    ],
)
def test_resource_of_names_the_resource_and_subresource(path: str, resource: str) -> None:
    assert resource_of(path) == resource


def _count(verb: str, resource: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "kvgate_api_requests_total", {"verb": verb, "resource": resource}
    )
    return value or 0.0


async def test_each_request_is_counted_once(kmock: kmock.KubernetesEmulator) -> None:
    kmock.resources["v1/services"] = {"kind": "Service", "namespaced": True, "verbs": ["get"]}
    api = KubeApi(Credentials(server=str(kmock.url).rstrip("/")))
    before = _count("GET", "services")
    try:
        await api.get("Service", "ns", "missing")
        await api.get("Service", "ns", "missing")
    finally:
        await api.close()
    assert _count("GET", "services") == before + 2
