"""Every cluster-wide object the chart renders is named where a user reads it: in the notes
`helm install` prints and in the chart README's "Cluster-wide objects" table, with the value
that turns it off (which really does). A new cluster-scoped object cannot be added silently."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helm_runner import CHART, Helm, Rendered, render_notes

README = CHART / "README.md"
FULLNAME, NAMESPACE = "kvgate", "kvgate-system"  # what Helm.template installs

# The kinds the chart renders, by scope. A kind in neither set fails the test: classify it.
CLUSTER_SCOPED = {
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "FlowSchema",
    "PriorityLevelConfiguration",
    "PriorityClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "Namespace",
    "APIService",
    "StorageClass",
    "IngressClass",
    "RuntimeClass",
    "ClusterIssuer",
}
NAMESPACED = {
    "ConfigMap",
    "Deployment",
    "Certificate",
    "Issuer",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "PodMonitor",
    "PrometheusRule",
    "Role",
    "RoleBinding",
    "Secret",
    "Service",
    "ServiceAccount",
    "ServiceMonitor",
}

OPTIONAL_APIS = (
    "cert-manager.io/v1/Certificate",
    "cert-manager.io/v1/Issuer",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
    "leaderworkerset.x-k8s.io/v1/LeaderWorkerSet",
)
EVERY_OPTION = (
    "leaderWorkerSet.enabled=true",
    "webhook.certManager.enabled=true",
    "metrics.serviceMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "metrics.enginePodMonitor.enabled=true",
    "metrics.routerPodMonitor.enabled=true",
    "dashboards.enabled=true",
    "networkPolicy.enabled=true",
    "engineNetworkPolicies.routerEgress.enabled=true",
    "webhook.hostNetwork=true",
)
CONFIGS = {
    "defaults": (),
    "every optional feature": EVERY_OPTION,
    "watched namespaces": ("watchNamespaces={team-a,team-b}",),
}


def _cluster_objects(rendered: Rendered) -> set[tuple[str, str]]:
    kinds = {d["kind"] for d in rendered.documents}
    unknown = kinds - CLUSTER_SCOPED - NAMESPACED
    assert not unknown, f"classify {sorted(unknown)} as cluster-scoped or namespaced in this test"
    return {
        (d["kind"], d["metadata"]["name"])
        for d in rendered.documents
        if d["kind"] in CLUSTER_SCOPED
    }


def _readme_rows() -> list[tuple[set[str], set[str], list[str]]]:
    """(kinds, names, --set values) of each row of the README's table, names as installed."""
    section = README.read_text().split("## Cluster-wide objects", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or cells[0] in ("kind", "---"):
            continue
        kinds = {k.strip() for k in cells[0].split(",")}
        names = {
            n.replace("<fullname>", FULLNAME).replace("<namespace>", NAMESPACE)
            for n in re.findall(r"`([^`]+)`", cells[1])
        }
        values = re.findall(r"`([^`]+=[^`]+)`", cells[4])
        rows.append((kinds, names, values))
    assert rows, "the chart README has no Cluster-wide objects table"
    return rows


@pytest.mark.parametrize("config", list(CONFIGS))
def test_every_cluster_scoped_object_is_named_in_the_notes_and_the_readme(
    helm: Helm, tmp_path: Path, config: str
) -> None:
    sets = CONFIGS[config]
    found = _cluster_objects(helm.template(*sets, api_versions=OPTIONAL_APIS))
    assert found, "the chart renders no cluster-scoped object: this test checks nothing"
    notes = render_notes(helm, tmp_path / "chart", *sets, api_versions=OPTIONAL_APIS)
    listed = notes.split("Cluster-wide objects", 1)[1]
    rows = _readme_rows()
    for kind, name in sorted(found):
        assert re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w.-])", listed), (
            f"{kind} {name} is not named in NOTES.txt's cluster-wide list"
        )
        assert kind in listed, f"NOTES.txt's cluster-wide list does not say {name} is a {kind}"
        assert any(kind in kinds and name in names for kinds, names, _ in rows), (
            f"{kind} {name} is not in the chart README's Cluster-wide objects table"
        )


def test_each_value_the_readme_names_turns_its_cluster_objects_off(helm: Helm) -> None:
    everything = _cluster_objects(helm.template(*EVERY_OPTION, api_versions=OPTIONAL_APIS))
    for kinds, names, values in _readme_rows():
        assert values, f"the README names no value that turns off {sorted(names)}"
        row = {(k, n) for k, n in everything if k in kinds and n in names}
        assert row, f"the README lists {sorted(names)}, which the chart does not render"
        left = _cluster_objects(helm.template(*EVERY_OPTION, *values, api_versions=OPTIONAL_APIS))
        assert not row & left, f"{values} leaves {sorted(row & left)}"
