"""Network isolation of the engines on the real API server: the per-revision NetworkPolicies
(``kvgate.objects.network_policy``) exist for a Ready ModelDeployment, match the builder, admit the
running
operator pod, and are accepted by the API server; the chart's own NetworkPolicy renders and is
accepted too.

The e2e world has NO CNI that enforces NetworkPolicy (pods share one network namespace; only
kube-proxy's iptables rules run): these tests check the objects, not the packets. Enforcement is
the CNI's (Calico, Cilium, Antrea, ...); ``tests/objects/test_network_policy.py`` checks, with a
small evaluator, which connections the built policies allow.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_network_policies.py -v -s`` (root).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from kvgate.api.models import ModelDeployment
from kvgate.objects.network_policy import RouterEgress, network_policies, policy_names

# Deadlines, not bounds (kvgate_e2e.deadlines); the first revision Ready was 240 s here.
from kvgate_e2e.deadlines import REVISION_DEADLINE
from kvgate_e2e.world import CHART, OPERATOR_NAMESPACE, RELEASE, World, chart_values
from scenario_helpers import sample_md, wait_md_ready

pytestmark = pytest.mark.e2e

MD = "llama"
OPERATOR_SA = f"system:serviceaccount:{OPERATOR_NAMESPACE}:kvgate"


def operator_identity(world: World) -> tuple[str, dict[str, str]]:
    """The namespace and pod labels the chart gives the operator (its environment)."""
    pod = world.operator_pod()
    assert pod is not None
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["KVGATE_NETWORK_POLICIES"]["value"] == "true"
    assert env["KVGATE_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    labels: dict[str, str] = json.loads(env["KVGATE_OPERATOR_POD_LABELS"]["value"])
    return pod["metadata"]["namespace"], labels


def server_dry_run(world: World, objects: list[dict[str, Any]], *as_user: str) -> Any:
    return world.kubectl(
        *as_user,
        "create",
        "--dry-run=server",
        "-f",
        "-",
        input=yaml.safe_dump_all(objects),
        check=False,
    )


def test_the_operators_policy_identity_selects_the_running_operator_pod(world: World) -> None:
    namespace, labels = operator_identity(world)
    pod = world.operator_pod()
    assert pod is not None
    assert labels and labels.items() <= pod["metadata"]["labels"].items()
    ns = world.get("namespace", namespace)
    assert ns is not None and ns["metadata"]["labels"]["kubernetes.io/metadata.name"] == namespace


def test_built_policies_are_accepted_by_the_api_server_for_the_operator_only(
    world: World, namespace: str
) -> None:
    op_ns, op_labels = operator_identity(world)
    doc = sample_md(MD)
    doc["metadata"] = {
        "name": MD,
        "namespace": namespace,
        "uid": "0f6c1e2a-5b7d-4c3e-9a8b-1d2e3f4a5b6c",
    }
    md = ModelDeployment.model_validate(doc)
    built = network_policies(
        md,
        "7c9d0e1f2a",
        operator_namespace=op_ns,
        operator_pod_labels=op_labels,
        router_egress=RouterEgress(),
    )
    # As the operator's ServiceAccount: its RBAC may create them and the admission policy lets it.
    accepted = server_dry_run(world, built, f"--as={OPERATOR_SA}")
    assert accepted.returncode == 0, accepted.stderr
    print(accepted.stdout.strip())
    assert accepted.stdout.count("networkpolicy.networking.k8s.io/") == 3
    # Anyone else (here the cluster admin) is refused: kvgate-managed objects are the operator's.
    refused = server_dry_run(world, built[:1])
    assert refused.returncode != 0
    assert "ValidatingAdmissionPolicy" in refused.stderr and "is kvgate's" in refused.stderr


def test_a_ready_model_deployment_has_its_revisions_policies_as_built(
    world: World, namespace: str
) -> None:
    world.apply(sample_md(MD), namespace)
    wait_md_ready(world, MD, namespace, REVISION_DEADLINE)
    live = world.get_md(MD, namespace)
    assert live is not None
    revision = live["status"]["servingRevision"]
    op_ns, op_labels = operator_identity(world)
    expected = network_policies(
        ModelDeployment.model_validate(live),
        revision,
        operator_namespace=op_ns,
        operator_pod_labels=op_labels,
    )
    selector = f"kvgate.io/deployment={MD},kvgate.io/revision={revision}"
    found = {
        p["metadata"]["name"]: p
        for p in world.list("networkpolicies.networking.k8s.io", namespace, selector)
    }
    assert sorted(found) == sorted(policy_names(MD, revision, router_egress=False)), (
        f"NetworkPolicies of revision {revision}: {sorted(found)} (is network_policies() wired "
        "into the reconciler?)"
    )
    for want in expected:
        got = found[want["metadata"]["name"]]
        assert got["spec"] == want["spec"]
        assert want["metadata"]["labels"].items() <= got["metadata"]["labels"].items()
        assert got["metadata"]["ownerReferences"][0]["uid"] == live["metadata"]["uid"]


def test_chart_network_policy_renders_and_is_accepted_by_the_api_server(world: World) -> None:
    values = json.dumps(chart_values(world.config))
    values_file = world.cluster.run_dir / "np-values.json"
    values_file.write_text(values)
    rendered = world.helm(
        "template",
        RELEASE,
        str(CHART),
        f"--namespace={OPERATOR_NAMESPACE}",
        f"--values={values_file}",
        "--set=networkPolicy.enabled=true",
        "--show-only=templates/networkpolicy.yaml",
    )
    policies = [d for d in yaml.safe_load_all(rendered) if d]
    # The controller's and the webhook Deployment's.
    assert [p["kind"] for p in policies] == ["NetworkPolicy"] * 2
    components = {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in policies}
    assert components == {"operator", "webhook"}
    accepted = server_dry_run(world, policies)
    assert accepted.returncode == 0, accepted.stderr
