"""Multi-node engines in the chart: the operator may manage LeaderWorkerSets (and read the
StatefulSets of their controller chains) only when leaderWorkerSet.enabled; by default it may not
touch either, cluster-wide or per watched namespace. With it, the admission policies admit the
groups' StatefulSet pods (gated leaders and workers only) and let the LeaderWorkerSet controller
write kvgate's StatefulSets."""

from __future__ import annotations

from typing import Any

import pytest
from helm_runner import Helm
from kvgate.gen.rbac import Scope, granted, rules

LWS = ("leaderworkerset.x-k8s.io", "leaderworkersets")
STS = ("apps", "statefulsets")


def _operator_role(roles: list[dict[str, Any]]) -> dict[str, Any]:
    """The operator's own (Cluster)Role: the one that may patch pod status (the gate)."""
    (role,) = [r for r in roles if ("", "pods/status") in _granted(r)]
    return role


def _granted(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role.get("rules") or []:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


@pytest.mark.parametrize("namespaces", [(), ("team-a",)], ids=["cluster-wide", "namespaced"])
def test_leader_worker_set_rules_only_when_enabled(helm: Helm, namespaces: tuple[str, ...]) -> None:
    sets = [f"watchNamespaces[{i}]={ns}" for i, ns in enumerate(namespaces)]
    kind = "Role" if namespaces else "ClusterRole"
    off = _granted(_operator_role(helm.template(*sets).all(kind)))
    assert LWS not in off and STS not in off
    on = _granted(_operator_role(helm.template(*sets, "leaderWorkerSet.enabled=true").all(kind)))
    want = granted(rules(Scope.LEADER_WORKER_SET))
    assert on[LWS] == want[LWS] == {"get", "list", "create", "patch", "delete"}
    assert on[STS] == want[STS] == {"get"}  # read only: the controller chain
    # nothing else changes
    assert {k: v for k, v in on.items() if k not in (LWS, STS)} == off


def test_leader_worker_set_value_is_schema_checked(helm: Helm) -> None:
    result = helm.template_result("leaderWorkerSet.enable=true")
    assert result.returncode != 0 and "enable" in result.stderr


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_gpus_per_node_reaches_the_webhook_and_the_operator_only_when_set(helm: Helm) -> None:
    unset = helm.template()
    for deployment in (unset.controller(), unset.webhook()):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert "KVGATE_GPUS_PER_NODE" not in _env(container)
    eight = helm.template("gpusPerNode=8")
    for deployment in (eight.controller(), eight.webhook()):
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert _env(container)["KVGATE_GPUS_PER_NODE"] == "8"


@pytest.mark.parametrize("value", ["0", "17", "eight"])
def test_gpus_per_node_outside_one_to_sixteen_fails_the_install(helm: Helm, value: str) -> None:
    result = helm.template_result(f"gpusPerNode={value}")
    assert result.returncode != 0 and "gpusPerNode" in result.stderr


def _policy(rendered: Any, suffix: str) -> dict[str, Any]:
    (policy,) = [
        p
        for p in rendered.all("ValidatingAdmissionPolicy")
        if p["metadata"]["name"].endswith(f"-{suffix}")
    ]
    return dict(policy)


def _pod_creation(rendered: Any) -> dict[str, Any]:
    return _policy(rendered, "pod-creation")


def test_with_leader_worker_sets_the_pod_creation_policy_admits_the_groups_pods(
    helm: Helm,
) -> None:
    """A LeaderWorkerSet group's pods are created by the StatefulSet controller, controlled by a
    StatefulSet, and its workers carry no gate: with only the ReplicaSet rules every one of them
    was denied, so no multi-node engine could ever start where the policies are on (found on the
    real API server, e2e/tests/test_scenario_multinode.py)."""
    off = _pod_creation(helm.template())
    on = _pod_creation(helm.template("leaderWorkerSet.enabled=true"))
    off_checks = [v["expression"] for v in off["spec"]["validations"]]
    checks = [v["expression"] for v in on["spec"]["validations"]]
    variables = {v["name"]: v["expression"] for v in on["spec"]["variables"]}
    assert "controlledByStatefulSet" not in {v["name"] for v in off["spec"]["variables"]}
    assert "r.kind == 'StatefulSet'" in variables["controlledByStatefulSet"]
    assert "'engine-worker'" in variables["groupWorker"]
    assert "variables.controlledByStatefulSet" in variables["groupWorker"]
    # the gate: routers, gated pods, and (only) a StatefulSet's engine-worker pods
    assert checks[0] == "variables.router || variables.gated || variables.groupWorker"
    assert checks[1] == "variables.controlledByReplicaSet || variables.controlledByStatefulSet"
    # who creates them: the StatefulSet controller for StatefulSet pods, as before otherwise
    assert checks[2] == (
        "!variables.controlledByStatefulSet || request.userInfo.username in "
        '["system:serviceaccount:kube-system:statefulset-controller",'
        '"system:kube-controller-manager"]'
    )
    assert checks[3] == "variables.controlledByStatefulSet || " + off_checks[2]
    # what a StatefulSet's pod may be: test_..._never_a_router
    assert len(checks) == 5 and len(off_checks) == 3
    # and with LWS off nothing changed
    assert off_checks[:2] == [
        "variables.router || variables.gated",
        "variables.controlledByReplicaSet",
    ]


def test_stateful_set_pod_creators_come_from_values(helm: Helm) -> None:
    on = _pod_creation(
        helm.template(
            "leaderWorkerSet.enabled=true",
            "admissionPolicy.statefulSetPodCreators={system:openshift:controller:statefulset-controller}",
        )
    )
    assert (
        "system:openshift:controller:statefulset-controller"
        in on["spec"]["validations"][2]["expression"]
    )
    result = helm.template_result("admissionPolicy.statefulSetPodCreators=null")
    assert result.returncode != 0 and "statefulSetPodCreators" in result.stderr


def test_with_leader_worker_sets_a_stateful_sets_pod_must_be_a_gated_engine_or_a_worker(
    helm: Helm,
) -> None:
    """The StatefulSet controller creates the pods of any StatefulSet: without this rule a
    StatefulSet-controlled pod labelled as a serving revision's router (routers carry no gate)
    passed every check, and the <md> Service selected it. Routers come only from ReplicaSets."""
    on = _pod_creation(helm.template("leaderWorkerSet.enabled=true"))
    variables = {v["name"]: v["expression"] for v in on["spec"]["variables"]}
    assert variables["component"] == (
        "'kvgate.io/component' in variables.labels ? variables.labels['kvgate.io/component'] : ''"
    )
    rule = on["spec"]["validations"][-1]
    assert rule["expression"] == (
        "!variables.controlledByStatefulSet || variables.groupWorker || "
        "(variables.component == 'engine' && variables.gated)"
    )
    assert rule["reason"] == "Forbidden"
    message = rule["messageExpression"]
    assert "is controlled by a StatefulSet and labelled" in message
    assert "routers come only from the ReplicaSets" in message
    off = _pod_creation(helm.template())
    assert "component" not in {v["name"] for v in off["spec"]["variables"]}


def test_the_leader_worker_set_controller_may_write_only_stateful_sets_and_only_when_enabled(
    helm: Helm,
) -> None:
    """The LeaderWorkerSet controller creates each group's leader and worker StatefulSets from
    kvgate's LeaderWorkerSet, whose templates carry kvgate's labels; nothing else of kvgate's."""
    off = _policy(helm.template(), "managed-objects")
    (off_check,) = off["spec"]["validations"]
    on = _policy(helm.template("leaderWorkerSet.enabled=true"), "managed-objects")
    (check,) = on["spec"]["validations"]
    assert check["expression"] == (
        off_check["expression"] + " || (request.resource.group == 'apps' && "
        "request.resource.resource == 'statefulsets' && request.userInfo.username in "
        '["system:serviceaccount:lws-system:lws-controller-manager"])'
    )
    assert "for StatefulSets also the LeaderWorkerSet controller" in check["messageExpression"]
    assert "LeaderWorkerSet controller" not in off_check["messageExpression"]


def test_leader_worker_set_controllers_come_from_values(helm: Helm) -> None:
    on = _policy(
        helm.template(
            "leaderWorkerSet.enabled=true",
            "admissionPolicy.leaderWorkerSetControllers={system:serviceaccount:lws:lws-manager}",
        ),
        "managed-objects",
    )
    (check,) = on["spec"]["validations"]
    assert '["system:serviceaccount:lws:lws-manager"]' in check["expression"]
    assert "lws-system:lws-controller-manager" not in check["expression"]
