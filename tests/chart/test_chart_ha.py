"""The chart's high-availability defaults: two leader-elected controller replicas and
the admission webhook in its own Deployment (2 replicas, PodDisruptionBudget, RollingUpdate), so
neither a controller crash nor `helm upgrade` leaves the API server without an admission answer."""

from __future__ import annotations

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
    from kvgate.admission.app import LINGER_SECONDS

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
    assert budget["spec"]["minAvailable"] == 1
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
