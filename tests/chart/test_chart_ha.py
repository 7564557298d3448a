"""The chart's high-availability defaults: two leader-elected controller replicas and
the admission webhook in its own Deployment (2 replicas, PodDisruptionBudget, RollingUpdate), so
neither a controller crash nor `helm upgrade` leaves the API server without an admission answer."""

from __future__ import annotations

import math
from typing import Any

import pytest
from helm_runner import Helm, Rendered

FULLNAME = "kvgate"  # release "kvgate" (helm_runner's default) already says kvgate


@pytest.fixture(scope="module")
def default(helm: Helm) -> Rendered:
    return helm.template()


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def test_the_webhook_is_its_own_two_replica_deployment_that_rolls_without_a_gap(
    default: Rendered,
) -> None:
    webhook = default.webhook()
    assert webhook["metadata"]["name"] == f"{FULLNAME}-webhook"
    spec = webhook["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    container = _container(webhook)
    assert container["command"] == ["kvgate", "webhook"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--shutdown-delay-seconds=5" in container["args"]
    # SIGTERM -> still answering for the delay -> the linger for open connections -> in-flight
    # requests: the grace period must cover all three.
    from kvgate.webhook.app import LINGER_SECONDS

    assert pod["terminationGracePeriodSeconds"] >= 5 + LINGER_SECONDS + 5
    assert {m["mountPath"]: m["readOnly"] for m in container["volumeMounts"] if m.get("readOnly")}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # The webhook calls no Kubernetes API: no token in its pods at all.
    assert pod["automountServiceAccountToken"] is False
    account = default.one("ServiceAccount", f"{FULLNAME}-webhook")
    assert account["automountServiceAccountToken"] is False
    bound = {s["name"] for b in default.all("RoleBinding") for s in b["subjects"]}
    bound |= {s["name"] for b in default.all("ClusterRoleBinding") for s in b["subjects"]}
    assert f"{FULLNAME}-webhook" not in bound


def test_the_webhook_arguments_are_accepted_by_the_kvgate_cli(default: Rendered) -> None:
    from kvgate.cmd.cli import build_parser

    container = _container(default.webhook())
    args = build_parser().parse_args(["webhook", *container["args"]])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"webhook": 9443, "metrics": 8080, "health": 8081}
    assert (args.port, args.health_port, args.metrics_port) == (9443, 8081, 8080)
    assert args.tls_dir == "/tls"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KVGATE_MIN_ENGINE_VERSION_FLOOR"] == "0.5.22"


def test_the_webhook_service_and_budget_select_webhook_pods_and_never_the_controller(
    default: Rendered,
) -> None:
    webhook_labels = default.webhook()["spec"]["template"]["metadata"]["labels"]
    controller_labels = default.controller()["spec"]["template"]["metadata"]["labels"]
    service = default.one("Service", f"{FULLNAME}-webhook")
    budget = default.one("PodDisruptionBudget", f"{FULLNAME}-webhook")
    assert _disruptions_allowed(budget, 2) == 1
    for selector in (service["spec"]["selector"], budget["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= webhook_labels.items()
        assert not selector.items() <= controller_labels.items()
    # And the controller's own selector does not adopt webhook pods.
    controller_selector = default.controller()["spec"]["selector"]["matchLabels"]
    assert not controller_selector.items() <= webhook_labels.items()
    webhook_config = default.one("ValidatingWebhookConfiguration")["webhooks"][0]
    assert webhook_config["clientConfig"]["service"]["name"] == service["metadata"]["name"]


def test_the_controller_runs_leader_election_on_a_lease_it_may_only_touch_by_name(
    default: Rendered,
) -> None:
    env = {e["name"]: e for e in _container(default.controller())["env"]}
    assert env["KVGATE_LEADER_ELECTION_LEASE"]["value"] == FULLNAME
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    timings = {
        k: env[k]["value"]
        for k in (
            "KVGATE_LEADER_LEASE_DURATION_SECONDS",
            "KVGATE_LEADER_RENEW_DEADLINE_SECONDS",
            "KVGATE_LEADER_RETRY_PERIOD_SECONDS",
        )
    }
    assert timings == {
        "KVGATE_LEADER_LEASE_DURATION_SECONDS": "10",
        "KVGATE_LEADER_RENEW_DEADLINE_SECONDS": "7",
        "KVGATE_LEADER_RETRY_PERIOD_SECONDS": "2",
    }
    role = default.one("Role", f"{FULLNAME}-leader-election")
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [FULLNAME],
            "verbs": ["get", "update"],
        },
    ]
    binding = default.one("RoleBinding", f"{FULLNAME}-leader-election")
    assert binding["subjects"][0]["name"] == FULLNAME


def test_a_single_replica_without_leader_election_renders_without_lease_rbac(helm: Helm) -> None:
    rendered = helm.template("replicas=1", "leaderElection.enabled=false")
    assert "--leader-elect" not in _container(rendered.controller())["args"]
    assert rendered.all("Role") == []


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ("replicas=2", "leaderElection.enabled=false"),
            "replicas: 2 with leaderElection.enabled=false would run 2 operators that all "
            "reconcile the same ModelDeployments; set leaderElection.enabled=true (the default) "
            "or replicas: 1",
        ),
        (
            ("leaderElection.renewDeadlineSeconds=10",),
            "leaderElection: need leaseDurationSeconds (10) > renewDeadlineSeconds (10) > "
            "retryPeriodSeconds (2)",
        ),
    ],
)
def test_settings_that_would_run_two_active_operators_fail_the_install_with_the_way_out(
    helm: Helm, values: tuple[str, ...], message: str
) -> None:
    result = helm.template_result(*values)
    assert result.returncode != 0
    assert message in result.stderr


def test_the_lease_requests_of_the_operator_go_to_the_leader_election_priority_level(
    default: Rendered, helm: Helm
) -> None:
    """Without the FlowSchema the operator's Lease renewals wait in its own flow
    (service-accounts, workload-low) behind its reconcile traffic: at 1,000 ModelDeployments a
    leader missed its renew deadline that way (docs/design/scale.md)."""
    (schema,) = default.all("FlowSchema")
    spec = schema["spec"]
    assert spec["priorityLevelConfiguration"] == {"name": "leader-election"}
    assert spec["matchingPrecedence"] < 9000  # the built-in service-accounts schema
    (rule,) = spec["rules"]
    assert rule["subjects"] == [
        {
            "kind": "ServiceAccount",
            "serviceAccount": {"name": FULLNAME, "namespace": "kvgate-system"},
        }
    ]
    assert rule["resourceRules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
            "namespaces": ["kvgate-system"],
        }
    ]
    assert helm.template("leaderElection.flowSchema=false").all("FlowSchema") == []
    single = helm.template("replicas=1", "leaderElection.enabled=false")
    assert single.all("FlowSchema") == []


# --- disruption budgets: a drain keeps one replica and is never blocked -----------------------


def _disruptions_allowed(budget: dict[str, Any], healthy: int) -> int:
    """How many of ``healthy`` pods (all expected) the eviction API lets go at once: the
    disruption controller's arithmetic, percentages of the expected count rounded up."""
    spec = budget["spec"]

    def scaled(value: int | str) -> int:
        if isinstance(value, str):
            return math.ceil(int(value.rstrip("%")) * healthy / 100)
        return value

    if "maxUnavailable" in spec:
        assert "minAvailable" not in spec  # the API refuses both
        desired_healthy = healthy - scaled(spec["maxUnavailable"])
    else:
        desired_healthy = scaled(spec["minAvailable"])
    return max(0, healthy - desired_healthy)


def test_the_controller_has_a_budget_that_selects_its_pods_only(default: Rendered) -> None:
    budget = default.component("PodDisruptionBudget", "operator")
    assert budget["apiVersion"] == "policy/v1"
    assert budget["metadata"]["name"] == FULLNAME
    assert budget["spec"]["maxUnavailable"] == 1
    selector = budget["spec"]["selector"]["matchLabels"]
    controller_labels = default.controller()["spec"]["template"]["metadata"]["labels"]
    webhook_labels = default.webhook()["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= controller_labels.items()
    assert not selector.items() <= webhook_labels.items()


@pytest.mark.parametrize(
    ("component", "replicas_value", "extra"),
    [
        ("operator", "replicas", ()),
        ("operator", "replicas", ("podDisruptionBudget.minAvailable=1",)),
        ("operator", "replicas", ("podDisruptionBudget.maxUnavailable=50%",)),
        ("webhook", "webhook.replicas", ()),
        ("webhook", "webhook.replicas", ("webhook.podDisruptionBudget.minAvailable=50%",)),
    ],
    ids=["operator", "operator-min-1", "operator-max-50pct", "webhook", "webhook-min-50pct"],
)
@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_a_drain_is_never_blocked_and_keeps_a_replica_where_there_are_two(
    helm: Helm, component: str, replicas_value: str, extra: tuple[str, ...], replicas: int
) -> None:
    sets = (f"{replicas_value}={replicas}", *extra)
    if component == "operator" and replicas == 1:
        sets += ("leaderElection.enabled=false",)
    result = helm.template_result(*sets)
    if result.returncode != 0:
        # Only a budget that would block every drain is refused, and it says how to fix it.
        assert "would block every node drain" in result.stderr, result.stderr
        return
    budget = helm.template(*sets).component("PodDisruptionBudget", component)
    allowed = _disruptions_allowed(budget, replicas)
    assert allowed >= 1, f"{sets}: no pod may be evicted, so drains wait forever"
    if replicas >= 2:
        assert allowed <= replicas - 1, f"{sets}: a drain may take every replica"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ("podDisruptionBudget.minAvailable=2",),
            "podDisruptionBudget.minAvailable=2 with replicas: 2 would block every node drain",
        ),
        (
            ("podDisruptionBudget.maxUnavailable=0",),
            "podDisruptionBudget.maxUnavailable=0 with replicas: 2 would block every node drain",
        ),
        (
            ("podDisruptionBudget.minAvailable=100%",),
            "podDisruptionBudget.minAvailable=100% with replicas: 2 would block every node drain",
        ),
        (
            ("webhook.replicas=1", "webhook.podDisruptionBudget.minAvailable=1"),
            "webhook.podDisruptionBudget.minAvailable=1 with webhook.replicas: 1 would block "
            "every node drain",
        ),
    ],
)
def test_a_budget_that_would_block_every_drain_fails_with_the_way_out(
    helm: Helm, sets: tuple[str, ...], message: str
) -> None:
    result = helm.template_result(*sets)
    assert result.returncode != 0, f"{sets} rendered"
    assert message in result.stderr
    assert "maxUnavailable: 1" in result.stderr


def test_the_controller_budget_can_be_left_out(helm: Helm) -> None:
    rendered = helm.template("podDisruptionBudget.enabled=false")
    assert [b["metadata"]["name"] for b in rendered.all("PodDisruptionBudget")] == [
        f"{FULLNAME}-webhook"
    ]


# --- where the webhook pods run ---------------------------------------------------------------


def _scheduling(deployment: dict[str, Any]) -> dict[str, Any]:
    pod = deployment["spec"]["template"]["spec"]
    return {k: pod.get(k) for k in ("nodeSelector", "tolerations", "affinity")}


def test_the_webhook_follows_the_operators_node_selector_and_tolerations_by_default(
    helm: Helm,
) -> None:
    rendered = helm.template(
        "nodeSelector.pool=system", "tolerations[0].key=dedicated", "tolerations[0].operator=Exists"
    )
    webhook, controller = _scheduling(rendered.webhook()), _scheduling(rendered.controller())
    assert webhook["nodeSelector"] == controller["nodeSelector"] == {"pool": "system"}
    assert webhook["tolerations"] == controller["tolerations"]
    # Each keeps its own anti-affinity: one replica per node, of its own kind.
    assert webhook["affinity"] != controller["affinity"]


def test_the_webhook_has_its_own_node_selector_tolerations_and_affinity(helm: Helm) -> None:
    affinity = "webhook.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    rendered = helm.template(
        "nodeSelector.pool=system",
        "webhook.nodeSelector.pool=edge",
        "webhook.tolerations[0].key=edge",
        "webhook.tolerations[0].operator=Exists",
        f"{affinity}.nodeSelectorTerms[0].matchExpressions[0].key=zone",
        f"{affinity}.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    )
    webhook, controller = _scheduling(rendered.webhook()), _scheduling(rendered.controller())
    assert webhook["nodeSelector"] == {"pool": "edge"}
    assert webhook["tolerations"] == [{"key": "edge", "operator": "Exists"}]
    assert list(webhook["affinity"]) == ["nodeAffinity"]
    assert controller["nodeSelector"] == {"pool": "system"}
    assert controller["tolerations"] is None
    assert list(controller["affinity"]) == ["podAntiAffinity"]
