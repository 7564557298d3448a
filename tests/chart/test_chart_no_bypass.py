"""The chart's cluster-side protections, as `helm template` renders them: the
ValidatingAdmissionPolicies and their bindings, the ModelDeployment roles aggregated into
`edit`/`view`, and the identity the operator gives its NetworkPolicies. What the policies deny is
proven on the real API server in e2e/tests/test_attack_pods.py and
e2e/tests/test_attack_tenant_addresses.py (no CEL is evaluated here: these tests pin what the
chart renders and which values reach it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helm_runner import Helm, Rendered

NAMESPACE = "kvgate-system"
PREFIX = f"kvgate-{NAMESPACE}"  # kvgate.clusterName
POLICIES = (
    "pod-creation",
    "pod-metadata",
    "managed-objects",
    "secret-deletion",
    "role-scales",
    "service-external-ips",
)
OPERATOR = f"system:serviceaccount:{NAMESPACE}:kvgate"
EXTERNAL_IPS = f"{PREFIX}-service-external-ips"
SECRET_DELETION = f"{PREFIX}-secret-deletion"
ROLE_SCALES = f"{PREFIX}-role-scales"
CONTROLLERS = (
    '["system:serviceaccount:kube-system:deployment-controller",'
    '"system:serviceaccount:kube-system:replicaset-controller",'
    '"system:serviceaccount:kube-system:generic-garbage-collector",'
    '"system:kube-controller-manager"]'
)


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
        "leaderworkersets",
        "networkpolicies",
        "replicasets",
        "rolebindings",
        "roles",
        "secrets",
        "serviceaccounts",
        "services",
        "statefulsets",
    ]
    (validation,) = policy["spec"]["validations"]
    assert f'request.userInfo.username == "{OPERATOR}"' in validation["expression"]
    assert "system:serviceaccount:kube-system:generic-garbage-collector" in validation["expression"]
    # Without leaderWorkerSet.enabled the LeaderWorkerSet controller writes none of them.
    assert "lws-controller-manager" not in _expressions(policy)


def test_managed_objects_cover_stateful_sets_and_leader_worker_sets_and_read_their_templates(
    default: Rendered,
) -> None:
    """A tenant's StatefulSet (or LeaderWorkerSet) whose pod template carries a serving
    revision's router labels would have its pods created by the StatefulSet controller, which
    the pod policy trusts with leaderWorkerSet.enabled: the sets themselves are kvgate's when
    their templates carry kvgate.io/* labels. Covered whether or not LeaderWorkerSet is on."""
    policy = default.one("ValidatingAdmissionPolicy", f"{PREFIX}-managed-objects")
    rules = {
        (group, resource): r
        for r in policy["spec"]["matchConstraints"]["resourceRules"]
        for group in r["apiGroups"]
        for resource in r["resources"]
    }
    assert rules[("apps", "statefulsets")]["apiVersions"] == ["v1"]
    lws = rules[("leaderworkerset.x-k8s.io", "leaderworkersets")]
    assert lws["apiVersions"] == ["v1"] and lws["operations"] == ["CREATE", "UPDATE"]
    (condition,) = policy["spec"]["matchConditions"]
    text = condition["expression"]
    assert "request.kind.group == 'apps' && has(o.spec.template)" in text
    assert "request.kind.group == 'leaderworkerset.x-k8s.io'" in text
    for template in ("leaderTemplate", "workerTemplate"):
        assert f"k in o.spec.leaderWorkerTemplate.{template}.metadata.labels" in text
        assert f"has(o.spec.leaderWorkerTemplate.{template}.metadata.labels)" in text


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
    deletion = rendered.one("ValidatingAdmissionPolicy", SECRET_DELETION)
    assert f"system:serviceaccount:{NAMESPACE}:kvgate-operator" in _expressions(deletion)
    bindings = {b["metadata"]["name"]: b for b in rendered.all("ValidatingAdmissionPolicyBinding")}
    assert EXTERNAL_IPS in bindings
    for name, binding in bindings.items():
        if name == EXTERNAL_IPS:
            continue  # node-global: test_the_external_ips_binding_stays_cluster_wide_...
        selector = binding["spec"]["matchResources"]["namespaceSelector"]
        assert selector["matchExpressions"] == [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
        ]


def test_services_with_external_ips_are_denied_in_every_namespace_by_default(
    default: Rendered,
) -> None:
    """CVE-2020-8554: a Service whose spec.externalIPs name a kvgate Service's ClusterIP or a
    verified engine pod's IP takes their traffic on every node (kube-proxy)."""
    policy = default.one("ValidatingAdmissionPolicy", EXTERNAL_IPS)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["services"],
        }
    ]
    conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    assert conditions == {
        "has-external-ips": "has(object.spec.externalIPs) && size(object.spec.externalIPs) > 0",
        # An unchanged spec passes (finalizers, owner references, labels): a Service that had
        # external IPs before the policy can still be garbage-collected and deleted.
        "creates-or-changes-the-spec": (
            "request.operation == 'CREATE' || oldObject == null || object.spec != oldObject.spec"
        ),
    }
    (validation,) = spec["validations"]
    assert validation["expression"] == (
        "request.namespace in [] || request.userInfo.username in []"
    )
    message = validation["messageExpression"]
    for phrase in (
        "spec.externalIPs (",
        "object.spec.externalIPs.join(', ')",
        "CVE-2020-8554",
        "LoadBalancer or NodePort Service",
        "admissionPolicy.externalIPs.allowedNamespaces",
        "admissionPolicy.externalIPs.allowedUsers",
    ):
        assert phrase in message, phrase
    binding = default.one("ValidatingAdmissionPolicyBinding", EXTERNAL_IPS)
    assert binding["spec"] == {"policyName": EXTERNAL_IPS, "validationActions": ["Deny"]}


def test_the_external_ips_binding_stays_cluster_wide_when_watch_namespaces_restricts_the_others(
    helm: Helm,
) -> None:
    """kube-proxy's rules are node-global: a Service in a namespace kvgate does not watch can
    take over the addresses of the namespaces it does."""
    rendered = helm.template("watchNamespaces={team-a}")
    binding = rendered.one("ValidatingAdmissionPolicyBinding", EXTERNAL_IPS)
    assert "matchResources" not in binding["spec"]
    others = rendered.one("ValidatingAdmissionPolicyBinding", f"{PREFIX}-pod-creation")
    assert "matchResources" in others["spec"]


def test_external_ips_exemptions_come_from_values_and_the_policy_can_be_left_out(
    helm: Helm,
) -> None:
    rendered = helm.template(
        "admissionPolicy.externalIPs.allowedNamespaces={edge,ingress-system}",
        "admissionPolicy.externalIPs.allowedUsers={system:serviceaccount:gitops:applier}",
    )
    (validation,) = rendered.one("ValidatingAdmissionPolicy", EXTERNAL_IPS)["spec"]["validations"]
    assert validation["expression"] == (
        'request.namespace in ["edge","ingress-system"] || '
        'request.userInfo.username in ["system:serviceaccount:gitops:applier"]'
    )
    # Where the API server runs DenyServiceExternalIPs, or another release installs it.
    off = helm.template("admissionPolicy.externalIPs.enabled=false")
    names = {p["metadata"]["name"] for p in off.all("ValidatingAdmissionPolicy")}
    assert EXTERNAL_IPS not in names and len(names) == len(POLICIES) - 1
    assert EXTERNAL_IPS not in {
        b["metadata"]["name"] for b in off.all("ValidatingAdmissionPolicyBinding")
    }


def test_deleting_a_secret_a_model_deployment_owns_is_left_to_the_operator_and_the_controllers(
    default: Rendered,
) -> None:
    """Deleted and created again under its name, the router key Secret would put the next router
    on a tenant's key. In a DELETE request the Secret is oldObject (object is null); the
    namespace controller and the garbage collector must still delete it."""
    policy = default.one("ValidatingAdmissionPolicy", SECRET_DELETION)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["DELETE"],
            "resources": ["secrets"],
        }
    ]
    (condition,) = spec["matchConditions"]
    assert condition["expression"] == (
        "oldObject != null && has(oldObject.metadata.ownerReferences) && "
        "oldObject.metadata.ownerReferences.exists(r, r.apiVersion.startsWith('kvgate.io/'))"
    )
    assert "object." not in _expressions(policy).replace("oldObject.", "")  # never the null one
    (validation,) = spec["validations"]
    assert validation["expression"] == (
        f'request.userInfo.username == "{OPERATOR}" || request.userInfo.username in '
        '["system:serviceaccount:kube-system:namespace-controller",'
        '"system:serviceaccount:kube-system:generic-garbage-collector",'
        '"system:kube-controller-manager"]'
    )
    assert "delete and re-apply the ModelDeployment" in validation["messageExpression"]
    assert "admissionPolicy.secretDeleters" in validation["messageExpression"]


def test_secret_deleters_come_from_values(helm: Helm) -> None:
    rendered = helm.template(
        "admissionPolicy.secretDeleters={system:openshift:controller:namespace-controller}"
    )
    (validation,) = rendered.one("ValidatingAdmissionPolicy", SECRET_DELETION)["spec"][
        "validations"
    ]
    assert '["system:openshift:controller:namespace-controller"]' in validation["expression"]
    assert "generic-garbage-collector" not in validation["expression"]


def test_role_scales_are_kvgates_but_for_the_count_and_their_scale_subresource_is_not_matched(
    default: Rendered,
) -> None:
    """Without their labels kvgate's watch once missed a RoleScale's new count; without their
    owner reference they were a Conflict. Only the operator and the controllers may create one
    or change more than spec.replicas; kubectl scale, an HPA and KEDA write rolescales/scale
    (an autoscaling/v1 Scale, only the count), which the policy does not match, and a DELETE
    (the way out of a Conflict) is not matched either."""
    policy = default.one("ValidatingAdmissionPolicy", ROLE_SCALES)
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["kvgate.io"],
            "apiVersions": ["v1alpha1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["rolescales"],
        }
    ]
    assert "matchConditions" not in spec  # every RoleScale: kvgate's kind, labelled or not
    variables = {v["name"]: v["expression"] for v in spec["variables"]}
    assert variables["trusted"] == (
        f'request.userInfo.username == "{OPERATOR}" || request.userInfo.username in ' + CONTROLLERS
    )
    changed = variables["changed"]
    for field in ("labels", "ownerReferences", "finalizers"):
        assert f"['metadata.{field}']" in changed, field
        assert f"oldObject.metadata.{field}" in changed, field
    for field in ("modelDeployment", "role", "minReplicas", "maxReplicas"):
        assert f"object.spec.{field} != oldObject.spec.{field}" in changed, field
    assert "spec.replicas" not in changed  # the count stays the autoscaler's
    assert "annotations" not in changed
    create, update = spec["validations"]
    assert create["expression"] == "variables.trusted || request.operation != 'CREATE'"
    # On CREATE oldObject is null: the short-circuit keeps variables.changed unevaluated.
    assert update["expression"] == (
        "variables.trusted || request.operation == 'CREATE' || size(variables.changed) == 0"
    )
    for phrase in ("variables.changed.join(', ')", "kubectl scale rolescale", "not by "):
        assert phrase in update["messageExpression"], phrase
    assert "spec.<role>.autoscaling" in create["messageExpression"]
    binding = default.one("ValidatingAdmissionPolicyBinding", ROLE_SCALES)
    assert binding["spec"] == {"policyName": ROLE_SCALES, "validationActions": ["Deny"]}


def test_policies_can_be_turned_off(helm: Helm) -> None:
    rendered = helm.template("admissionPolicy.enabled=false")
    assert rendered.all("ValidatingAdmissionPolicy") == []
    assert rendered.all("ValidatingAdmissionPolicyBinding") == []


@pytest.mark.parametrize(
    "sets", [(), ("admissionPolicy.enabled=false", "leaderElection.flowSchema=false")]
)
def test_a_cluster_without_the_policy_api_is_refused_whatever_the_values(
    helm: Helm, sets: tuple[str, ...]
) -> None:
    # Below 1.30 the CRD itself is refused too (test_chart_docs.py), so turning the policies
    # off is no way out: Helm refuses the install by Chart.yaml's kubeVersion.
    result = helm.template_result(*sets, kube_version="v1.29.4")
    assert result.returncode != 0
    assert "chart requires kubeVersion: >=1.30.0-0" in result.stderr
    assert "incompatible with Kubernetes v1.29.4" in result.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("admissionPolicy.podCreators=null", "missing property 'podCreators'"),
        ("admissionPolicy.controllers[0]=has space", "'/admissionPolicy/controllers/0'"),
        ("admissionPolicy.secretDeleters=null", "missing property 'secretDeleters'"),
        ("admissionPolicy.secretDeleters[0]=has space", "'/admissionPolicy/secretDeleters/0'"),
        (
            "admissionPolicy.leaderWorkerSetControllers=null",
            "missing property 'leaderWorkerSetControllers'",
        ),
        ("admissionPolicy.externalIPs.enabled=yes", "'/admissionPolicy/externalIPs/enabled'"),
        (
            "admissionPolicy.externalIPs.allowedNamespaces={Team_A}",
            "'/admissionPolicy/externalIPs/allowedNamespaces/0'",
        ),
        (
            "admissionPolicy.externalIPs.allowedUsers[0]=has space",
            "'/admissionPolicy/externalIPs/allowedUsers/0'",
        ),
        ("admissionPolicy.externalIPs.allowedIPs={1.2.3.4}", "allowedIPs"),
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
