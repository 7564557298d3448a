"""The chart's cluster-side protections (issue 11 items 3 and 7), as `helm template` renders them:
the ValidatingAdmissionPolicies and their bindings, the ModelDeployment roles aggregated into
`edit`/`view`, and the identity the operator gives its NetworkPolicies. What the policies deny is
proven on the real API server in e2e/tests/test_attack_pods.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helm_runner import CHART, Helm, Rendered

NAMESPACE = "kvgate-system"
PREFIX = f"kvgate-{NAMESPACE}"  # kvgate.clusterName
POLICIES = ("pod-creation", "pod-metadata", "managed-objects")
OPERATOR = f"system:serviceaccount:{NAMESPACE}:kvgate"


@pytest.fixture(scope="module")
def default(helm: Helm) -> Rendered:
    return helm.template()


def _expressions(policy: dict[str, Any]) -> str:
    spec = policy["spec"]
    parts = [c["expression"] for c in spec.get("matchConditions", [])]
    parts += [v["expression"] for v in spec.get("variables", [])]
    parts += [v["expression"] for v in spec["validations"]]
    return "\n".join(parts)


def _env(rendered: Rendered) -> dict[str, dict[str, Any]]:
    (container,) = rendered.controller()["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in container["env"]}


def test_policies_are_on_by_default_bound_cluster_wide_and_deny(default: Rendered) -> None:
    policies = {p["metadata"]["name"]: p for p in default.all("ValidatingAdmissionPolicy")}
    assert sorted(policies) == sorted(f"{PREFIX}-{p}" for p in POLICIES)
    for policy in policies.values():
        assert policy["spec"]["failurePolicy"] == "Fail"
    bindings = {b["metadata"]["name"]: b for b in default.all("ValidatingAdmissionPolicyBinding")}
    assert sorted(bindings) == sorted(policies)
    for name, binding in bindings.items():
        assert binding["spec"]["policyName"] == name
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert "matchResources" not in binding["spec"]  # every namespace, like the operator


def test_pod_creation_requires_the_gate_a_replicaset_owner_and_the_replicaset_controller(
    default: Rendered,
) -> None:
    policy = default.one("ValidatingAdmissionPolicy", f"{PREFIX}-pod-creation")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    ]
    validations = [v["expression"] for v in policy["spec"]["validations"]]
    assert validations[0] == "variables.router || variables.gated"  # the gate's message first
    assert validations[1] == "variables.controlledByReplicaSet"
    assert validations[2] == (
        'request.userInfo.username in ["system:serviceaccount:kube-system:replicaset-controller",'
        '"system:kube-controller-manager"]'
    )
    assert "'kvgate.io/engine-verified'" in _expressions(policy)


def test_pod_metadata_covers_status_and_ephemeral_container_updates(default: Rendered) -> None:
    policy = default.one("ValidatingAdmissionPolicy", f"{PREFIX}-pod-metadata")
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["UPDATE"]
    assert rule["resources"] == ["pods", "pods/status", "pods/ephemeralcontainers"]
    text = _expressions(policy)
    for key in ("'kvgate.io/'", "'sglang.ai/'", "'smg.ai/'", "'app.kubernetes.io/managed-by'"):
        assert key in text


def test_managed_objects_are_the_operators_and_the_controllers_and_deletes_stay_allowed(
    default: Rendered,
) -> None:
    policy = default.one("ValidatingAdmissionPolicy", f"{PREFIX}-managed-objects")
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {op for r in rules for op in r["operations"]} == {"CREATE", "UPDATE"}
    assert sorted(res for r in rules for res in r["resources"]) == [
        "deployments",
        "networkpolicies",
        "replicasets",
        "rolebindings",
        "roles",
        "secrets",
        "serviceaccounts",
        "services",
    ]
    (validation,) = policy["spec"]["validations"]
    assert f'request.userInfo.username == "{OPERATOR}"' in validation["expression"]
    assert "system:serviceaccount:kube-system:generic-garbage-collector" in validation["expression"]


def test_identities_come_from_values_and_bindings_follow_watched_namespaces(helm: Helm) -> None:
    rendered = helm.template(
        "admissionPolicy.podCreators={system:openshift:controller:replicaset-controller}",
        "serviceAccount.name=kvgate-operator",
        "watchNamespaces={team-a,team-b}",
    )
    creation = rendered.one("ValidatingAdmissionPolicy", f"{PREFIX}-pod-creation")
    assert "system:openshift:controller:replicaset-controller" in _expressions(creation)
    managed = rendered.one("ValidatingAdmissionPolicy", f"{PREFIX}-managed-objects")
    assert f"system:serviceaccount:{NAMESPACE}:kvgate-operator" in _expressions(managed)
    for binding in rendered.all("ValidatingAdmissionPolicyBinding"):
        selector = binding["spec"]["matchResources"]["namespaceSelector"]
        assert selector["matchExpressions"] == [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]


def test_policies_can_be_turned_off(helm: Helm) -> None:
    rendered = helm.template("admissionPolicy.enabled=false")
    assert rendered.all("ValidatingAdmissionPolicy") == []
    assert rendered.all("ValidatingAdmissionPolicyBinding") == []


def test_a_cluster_without_the_policy_api_fails_with_the_way_out(helm: Helm) -> None:
    result = helm.run(
        "template", "kvgate", str(CHART), "--namespace", NAMESPACE, "--kube-version", "v1.29.4"
    )
    assert result.returncode != 0
    assert "(Kubernetes v1.29.4) does not serve admissionregistration.k8s.io/v1" in result.stderr
    assert "set admissionPolicy.enabled=false" in result.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("admissionPolicy.podCreators=null", "missing property 'podCreators'"),
        ("admissionPolicy.controllers[0]=has space", "'/admissionPolicy/controllers/0'"),
        ("engineNetworkPolicies.enabled=yes", "'/engineNetworkPolicies/enabled'"),
        (
            "engineNetworkPolicies.routerEgress.allow=x",
            "'/engineNetworkPolicies/routerEgress/allow'",
        ),
    ],
)
def test_bad_values_fail_and_name_the_field(helm: Helm, value: str, message: str) -> None:
    result = helm.template_result(value)
    assert result.returncode != 0, f"{value} was accepted"
    assert message in result.stderr, result.stderr


def test_edit_and_view_cover_model_deployments(default: Rendered) -> None:
    edit = default.one("ClusterRole", f"{PREFIX}-edit")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert edit["rules"] == [
        {
            "apiGroups": ["kvgate.io"],
            "resources": ["modeldeployments"],
            "verbs": [
                "get",
                "list",
                "watch",
                "create",
                "update",
                "patch",
                "delete",
                "deletecollection",
            ],
        }
    ]
    view = default.one("ClusterRole", f"{PREFIX}-view")
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert {v for r in view["rules"] for v in r["verbs"]} == {"get", "list", "watch"}


def test_the_operator_gets_its_network_policy_identity_and_switches(helm: Helm) -> None:
    default = helm.template()
    env = _env(default)
    assert env["KVGATE_NETWORK_POLICIES"]["value"] == "true"
    assert env["KVGATE_OPERATOR_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.namespace"
    )
    labels = json.loads(env["KVGATE_OPERATOR_POD_LABELS"]["value"])
    pod_labels = default.controller()["spec"]["template"]["metadata"]["labels"]
    assert labels and labels.items() <= pod_labels.items()  # selects the operator's own pods
    assert "KVGATE_ROUTER_EGRESS_POLICY" not in env

    egress = _env(
        helm.template(
            "engineNetworkPolicies.enabled=false", "engineNetworkPolicies.routerEgress.enabled=true"
        )
    )
    assert egress["KVGATE_NETWORK_POLICIES"]["value"] == "false"
    assert egress["KVGATE_ROUTER_EGRESS_POLICY"]["value"] == "true"
    assert json.loads(egress["KVGATE_ROUTER_EGRESS_ALLOW"]["value"]) == [
        {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}
    ]
