"""What the chart's README, docs/operating.md and NOTES.txt claim, checked against the chart:
the Kubernetes it needs (Chart.yaml's kubeVersion, which Helm enforces, and what the CRD uses),
the default replica counts, the values they name, and the Deployments NOTES tells a user to wait
for."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_runner import CHART, ROOT, Helm, render_notes

NAMESPACE = "kvgate-system"
CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
DOCS = {
    "charts/kvgate/README.md": (CHART / "README.md").read_text(),
    "docs/operating.md": (ROOT / "docs" / "operating.md").read_text(),
    "README.md": (ROOT / "README.md").read_text(),
}
CERT_MANAGER = ("cert-manager.io/v1/Certificate", "cert-manager.io/v1/Issuer")
NUMBERS = {"one": 1, "two": 2, "three": 3}


def _minimum_kubernetes() -> tuple[int, int]:
    """The lower bound of Chart.yaml's kubeVersion (``>=1.30.0-0``)."""
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)\.0-0", CHART_YAML["kubeVersion"])
    assert match, f"kubeVersion {CHART_YAML['kubeVersion']!r} is not a plain lower bound"
    return int(match.group(1)), int(match.group(2))


def _walk(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found += _walk(value)
    elif isinstance(node, list):
        for value in node:
            found += _walk(value)
    return found


def test_helm_refuses_a_kubernetes_below_the_one_the_chart_needs(helm: Helm) -> None:
    major, minor = _minimum_kubernetes()
    below = helm.template_result(kube_version=f"v{major}.{minor - 1}.15")
    assert below.returncode != 0
    assert f"chart requires kubeVersion: {CHART_YAML['kubeVersion']}" in below.stderr
    at = helm.template_result(kube_version=f"v{major}.{minor}.0")
    assert at.returncode == 0, at.stderr


def test_the_minimum_covers_what_the_crd_uses() -> None:
    """The CRD's name rule needs CEL's optionalOldSelf (CRDValidationRatcheting: beta, on by
    default, from 1.30; before, the field is dropped and the rule does not compile), and the
    admission policies need admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (1.30)."""
    crd = yaml.safe_load((ROOT / "crds" / "modeldeployment.yaml").read_text())
    uses_optional_old_self = any(node.get("optionalOldSelf") for node in _walk(crd))
    assert uses_optional_old_self
    assert _minimum_kubernetes() >= (1, 30)


@pytest.mark.parametrize("doc", list(DOCS))
def test_the_docs_state_the_kubernetes_the_chart_needs(doc: str) -> None:
    major, minor = _minimum_kubernetes()
    stated = re.findall(r"Kubernetes\s+(\d+\.\d+)\s+or\s+newer", DOCS[doc])
    assert stated, f"{doc} does not say which Kubernetes the chart needs"
    assert set(stated) == {f"{major}.{minor}"}, f"{doc} says Kubernetes {stated} or newer"


def test_the_chart_readme_states_the_default_replicas() -> None:
    readme = DOCS["charts/kvgate/README.md"]
    (operator,) = re.findall(r"the operator Deployment\s+\((\w+)\s+replicas", readme)
    (webhook,) = re.findall(r"its\s+own\s+Deployment\s+of\s+(\w+)\s+replicas", readme)
    defaults = (VALUES["replicas"], VALUES["webhook"]["replicas"])
    assert (NUMBERS[operator], NUMBERS[webhook]) == defaults
    table = DOCS["docs/operating.md"]
    (row,) = re.findall(r"^\| `replicas`, `webhook\.replicas` \| (\d+), (\d+) \|", table, re.M)
    assert (int(row[0]), int(row[1])) == defaults


def _value_paths(doc: str) -> set[str]:
    """The values a doc names: dotted names in code spans whose first part is a top-level value
    (`webhook.replicas`, `leaderElection.*`), and every `--set`/`--set-file` key, code blocks
    included."""
    dotted = r"[a-z][A-Za-z]*(?:\.[A-Za-z]+)+"
    paths = set(re.findall(rf"--set(?:-file)?[ =]'?({dotted})=", doc))
    prose = re.sub(r"```.*?```", "", doc, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        paths.update(re.findall(rf"(?<![\w./-])({dotted})", span))
    return {p for p in paths if p.split(".")[0] in VALUES}


def _exists(path: str) -> bool:
    """The value is in values.yaml, or under a free-form map there (`labels: {}`)."""
    node: Any = VALUES
    for part in path.split("."):
        if node == {}:
            return True
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


@pytest.mark.parametrize("doc", ["charts/kvgate/README.md", "docs/operating.md"])
def test_every_value_the_docs_name_is_a_value_of_the_chart(doc: str) -> None:
    paths = _value_paths(DOCS[doc])
    assert len(paths) > 10
    assert sorted(p for p in paths if not _exists(p)) == []


@pytest.mark.parametrize(
    ("sets", "api_versions"),
    [
        ((), ()),
        (("webhook.certManager.enabled=true",), CERT_MANAGER),
        (("webhook.enabled=false",), ()),
        (("webhook.failurePolicy=Ignore",), ()),
    ],
    ids=["defaults", "cert-manager", "no-webhook", "ignore"],
)
def test_notes_wait_for_every_deployment_the_chart_installs(
    helm: Helm, tmp_path: Path, sets: tuple[str, ...], api_versions: tuple[str, ...]
) -> None:
    notes = render_notes(helm, tmp_path / "chart", *sets, api_versions=api_versions)
    waited = set(re.findall(rf"kubectl -n {NAMESPACE} rollout status deployment/(\S+)", notes))
    deployments = helm.template(*sets, api_versions=api_versions).all("Deployment")
    assert waited == {d["metadata"]["name"] for d in deployments}
    if "webhook.enabled=false" in sets:
        assert "webhook is DISABLED" in notes
    elif "webhook.failurePolicy=Ignore" in sets:
        assert "admitted unchecked" in notes
    else:
        assert "Until a webhook pod is Ready, creating or updating a ModelDeployment is" in notes
