"""Every manifest the chart renders, for each family of values, is one a strict reader accepts:
no key twice in a mapping (PyYAML and Helm keep the last value silently, `kubectl apply` and the
API server's strict decoding refuse the object), every object named and typed, no object twice."""

from __future__ import annotations

import pytest
import yaml
from helm_runner import Helm, strict_documents

CERT_MANAGER = ("cert-manager.io/v1/Certificate", "cert-manager.io/v1/Issuer")
MONITORING = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
    "monitoring.coreos.com/v1/PodMonitor",
)
CA_PEM = "-----BEGIN CERTIFICATE-----"  # the chart only checks the marker

VALUE_SETS: dict[str, tuple[str, ...]] = {
    "defaults": (),
    "everything-on": (
        "metrics.serviceMonitor.enabled=true",
        "metrics.prometheusRule.enabled=true",
        "metrics.enginePodMonitor.enabled=true",
        "metrics.routerPodMonitor.enabled=true",
        "networkPolicy.enabled=true",
        "leaderWorkerSet.enabled=true",
        "engineNetworkPolicies.routerEgress.enabled=true",
        "gpusPerNode=8",
        "webhook.certManager.enabled=true",
        "imagePullSecrets[0].name=regcred",
        "tolerations[0].key=dedicated",
        "nodeSelector.pool=system",
        "podAnnotations.team=infra",
        "priorityClassName=system-cluster-critical",
    ),
    "namespaced": ("watchNamespaces={team-a,team-b}",),
    "existing-secrets": (
        "routerKeySeed.existingSecret=seed",
        "webhook.existingSecret=webhook-tls",
        f"webhook.caBundle={CA_PEM}",
    ),
    "openshift": ("runAsUser=null", "runAsGroup=null"),
    "single-replica": ("replicas=1", "leaderElection.enabled=false"),
    "minimal": (
        "webhook.enabled=false",
        "crds.install=false",
        "admissionPolicy.enabled=false",
        "podDisruptionBudget.enabled=false",
        "rbac.create=false",
        "serviceAccount.create=false",
        "serviceAccount.name=kvgate-operator",
    ),
}


def test_the_strict_reader_refuses_a_key_given_twice() -> None:
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key 'kind'"):
        strict_documents("apiVersion: v1\nkind: Service\nkind: Service\n")
    assert strict_documents("a: 1\n---\n---\nb: 2\n") == [{"a": 1}, {"b": 2}]


@pytest.mark.parametrize("sets", list(VALUE_SETS.values()), ids=list(VALUE_SETS))
def test_every_rendered_manifest_parses_strictly_and_names_one_object(
    helm: Helm, sets: tuple[str, ...]
) -> None:
    result = helm.template_result(*sets, api_versions=CERT_MANAGER + MONITORING)
    assert result.returncode == 0, result.stderr
    documents = strict_documents(result.stdout)
    assert documents
    seen: set[tuple[str, str, str, str]] = set()
    for document in documents:
        assert document.get("apiVersion") and document.get("kind"), document
        metadata = document["metadata"]
        identity = (
            document["apiVersion"].split("/")[0],
            document["kind"],
            metadata.get("namespace", ""),
            metadata["name"],
        )
        assert identity not in seen, f"{identity} rendered twice"
        seen.add(identity)
