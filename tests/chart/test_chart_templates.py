"""What `helm template` / `helm lint` of charts/kvgate give a user, checked with the real helm."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from factories.model_deployments import make_md
from helm_runner import CHART, KUBE_VERSION, ROOT, Helm, Rendered, render_notes
from kvgate.cmd.cli import build_parser
from kvgate.gen.chartgen import TEMPLATE_NAME, chart_crd_template, escape_template_delimiters
from kvgate.gen.rbac import Scope, granted, rules
from kvgate.objects import builders

NAMESPACE = "kvgate-system"
FULLNAME = "kvgate"
OPERATOR_CLUSTER_ROLE = f"{FULLNAME}-{NAMESPACE}"  # kvgate.clusterName
CERT_MANAGER = ("cert-manager.io/v1/Certificate", "cert-manager.io/v1/Issuer")
MONITORING = ("monitoring.coreos.com/v1/ServiceMonitor", "monitoring.coreos.com/v1/PrometheusRule")
POD_MONITOR = ("monitoring.coreos.com/v1/PodMonitor",)

# Exactly what the operator calls: the table the chart's rules are generated from (kvgate.gen.rbac);
# (apiGroup, resource) -> verbs. tests/gen/test_rbac_generation.py checks the generated files.
NAMESPACED_RULES = granted(rules(Scope.NAMESPACED))
CRD_RULE = granted(rules(Scope.CLUSTER))
# kopf's namespace observer lists namespaces unless it runs cluster-wide.
NAMESPACE_RULE = granted(rules(Scope.CLUSTER_WHEN_NAMESPACED))
ROUTER_KEY_SEED = f"{FULLNAME}-router-key-seed"


@pytest.fixture(scope="module")
def default(helm: Helm) -> Rendered:
    return helm.template()


def _rules(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                granted.setdefault((group, resource), set()).update(rule["verbs"])
    return granted


def _walk_rbac_lists(rendered: Rendered) -> Iterator[tuple[str, str, list[str]]]:
    for kind in ("ClusterRole", "Role"):
        for role in rendered.all(kind):
            for rule in role["rules"]:
                for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                    yield role["metadata"]["name"], field, rule.get(field, [])


def _operator_container(rendered: Rendered) -> dict[str, Any]:
    deployment = rendered.one("Deployment", FULLNAME)
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    container: dict[str, Any] = containers[0]
    return container


# --- lint -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sets",
    [
        (),
        ("watchNamespaces={team-a,team-b}", "networkPolicy.enabled=true"),
        ("webhook.enabled=false", "crds.install=false"),
        (
            "routerKeySeed.existingSecret=seed",
            "webhook.existingSecret=webhook-tls",
            "webhook.caBundle=-----BEGIN CERTIFICATE-----",
        ),
        ("runAsUser=null", "runAsGroup=null", "podDisruptionBudget.minAvailable=1"),
    ],
    ids=[
        "defaults",
        "namespaced-with-networkpolicy",
        "no-webhook-no-crd",
        "existing-secrets",
        "openshift-min-available",
    ],
)
def test_helm_lint_passes(helm: Helm, sets: tuple[str, ...]) -> None:
    args = [
        "lint",
        str(CHART),
        "--strict",
        "--namespace",
        NAMESPACE,
        "--kube-version",
        KUBE_VERSION,
    ]
    for value in sets:
        args += ["--set", value]
    result = helm.run(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


# --- the operator pod -------------------------------------------------------------------------


def test_operator_runs_non_root_read_only_without_privileges(default: Rendered) -> None:
    pod = default.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = _operator_container(default)["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] != 0
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}


def test_run_as_user_and_group_can_be_left_to_the_platform(helm: Helm) -> None:
    # OpenShift's restricted SCC assigns a uid and gid from the namespace's range and refuses a
    # pod that names others; runAsNonRoot stays (the assigned uid is never 0).
    rendered = helm.template("runAsUser=null", "runAsGroup=null")
    for deployment in (rendered.controller(), rendered.webhook()):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        for context in (pod["securityContext"], container["securityContext"]):
            assert context["runAsNonRoot"] is True
            assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(context)
    pinned = helm.template().webhook()["spec"]["template"]["spec"]["securityContext"]
    assert (pinned["runAsUser"], pinned["runAsGroup"], pinned["fsGroup"]) == (65532,) * 3


def test_operator_deployment_is_two_leader_elected_replicas_rolled_with_graceful_shutdown(
    default: Rendered,
) -> None:
    spec = default.one("Deployment", FULLNAME)["spec"]
    assert spec["replicas"] == 2
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert "--leader-elect" in _operator_container(default)["args"]
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= 10
    assert spec["template"]["spec"]["serviceAccountName"] == FULLNAME
    resources = _operator_container(default)["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]


def test_operator_arguments_are_accepted_by_the_kvgate_cli(default: Rendered) -> None:
    container = _operator_container(default)
    assert container["image"] == "ghcr.io/kvgate/kvgate-operator:" + _app_version()
    args = build_parser().parse_args(["operator", *container["args"]])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": 8080, "health": 8081}
    assert (args.metrics_port, args.health_port) == (8080, 8081)
    # The webhook is its own Deployment (test_chart_ha.py); the controller serves none.
    assert args.no_webhook is True and args.tls_dir is None
    assert args.standalone is True and args.leader_elect is True
    assert args.namespace == []
    assert {m["name"] for m in container["volumeMounts"]} == {"tmp"}


def test_liveness_and_readiness_probe_healthz_on_the_health_port(default: Rendered) -> None:
    container = _operator_container(default)
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe


def test_metrics_service_targets_the_metrics_port(default: Rendered) -> None:
    service = default.one("Service", f"{FULLNAME}-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod_labels = default.one("Deployment", FULLNAME)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


# --- RBAC -------------------------------------------------------------------------------------


@pytest.mark.parametrize("sets", [(), ("watchNamespaces={team-a,team-b}",)], ids=["cluster", "ns"])
def test_rbac_has_no_wildcards(helm: Helm, sets: tuple[str, ...]) -> None:
    rendered = helm.template(*sets)
    checked = 0
    for role, field, values in _walk_rbac_lists(rendered):
        assert "*" not in values, f"{role}: wildcard in {field}"
        checked += 1
    assert checked > 0


def test_cluster_wide_rbac_grants_exactly_what_the_operator_uses(default: Rendered) -> None:
    role = default.one("ClusterRole", OPERATOR_CLUSTER_ROLE)
    assert _rules(role) == {**NAMESPACED_RULES, **CRD_RULE}
    binding = default.one("ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}
    ]
    # The only Role: the Lease of leader election, in the release namespace.
    (lease_role,) = default.all("Role")
    assert lease_role["metadata"]["namespace"] == NAMESPACE
    assert _rules(lease_role) == {("coordination.k8s.io", "leases"): {"create", "get", "update"}}
    assert default.one("ServiceAccount", FULLNAME)


def test_watch_namespaces_gives_roles_per_namespace_and_scopes_the_webhook(helm: Helm) -> None:
    rendered = helm.template("watchNamespaces={team-a,team-b}")
    roles = {
        r["metadata"]["namespace"]: r
        for r in rendered.all("Role")
        if not r["metadata"]["name"].endswith("-leader-election")
    }
    assert set(roles) == {"team-a", "team-b"}
    for role in roles.values():
        assert _rules(role) == NAMESPACED_RULES
    bindings = {
        b["metadata"]["namespace"]
        for b in rendered.all("RoleBinding")
        if not b["metadata"]["name"].endswith("-leader-election")
    }
    assert bindings == {"team-a", "team-b"}
    assert _rules(rendered.one("ClusterRole", OPERATOR_CLUSTER_ROLE)) == {
        **CRD_RULE,
        **NAMESPACE_RULE,
    }
    args = build_parser().parse_args(["operator", *_operator_container(rendered)["args"]])
    assert args.namespace == ["team-a", "team-b"]
    webhook = rendered.one("ValidatingWebhookConfiguration")["webhooks"][0]
    assert webhook["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]


# --- CRD --------------------------------------------------------------------------------------


def test_chart_crd_template_is_generated_from_the_api_models() -> None:
    template = CHART / "templates" / TEMPLATE_NAME
    assert template.read_text() == chart_crd_template(), (
        "the chart's CRD drifted from the API models: run `python -m kvgate.gen.chartgen`"
    )


def test_rendered_crd_is_identical_to_crds_dir(default: Rendered) -> None:
    committed = yaml.safe_load((ROOT / "crds" / "modeldeployment.yaml").read_text())
    rendered = default.one("CustomResourceDefinition", "modeldeployments.kvgate.io")
    metadata = dict(rendered["metadata"])
    # The chart adds only Helm bookkeeping around the generated CRD.
    assert metadata.pop("annotations") == {"helm.sh/resource-policy": "keep"}
    assert metadata.pop("labels")["app.kubernetes.io/managed-by"] == "Helm"
    assert {**rendered, "metadata": metadata} == committed


def test_template_delimiters_in_the_crd_would_print_literally(helm: Helm, tmp_path: Path) -> None:
    # A CEL rule or description with "{{" must not break (or be executed by) the chart.
    text = "rule: self.a == '{{ x }}' && '}}{{' != ''"
    chart = tmp_path / "delimiters"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: delimiters\nversion: 0.0.1\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: delimiters\ndata:\n  text: |\n    "
        + escape_template_delimiters(text)
        + "\n"
    )
    rendered = helm.template(chart=chart).one("ConfigMap")
    assert rendered["data"]["text"] == text + "\n"


def test_crd_can_be_left_to_the_user(helm: Helm) -> None:
    assert helm.template("crds.install=false").all("CustomResourceDefinition") == []


# --- webhook ----------------------------------------------------------------------------------


def test_webhook_calls_the_operator_service_for_modeldeployments_only(default: Rendered) -> None:
    config = default.one("ValidatingWebhookConfiguration")
    [webhook] = config["webhooks"]
    assert webhook["clientConfig"]["service"] == {
        "name": f"{FULLNAME}-webhook",
        "namespace": NAMESPACE,
        "path": "/validate-modeldeployment",
        "port": 443,
    }
    assert webhook["rules"] == [
        {
            "apiGroups": ["kvgate.io"],
            "apiVersions": ["v1alpha1"],
            "resources": ["modeldeployments"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["sideEffects"] == "None"
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert 1 <= webhook["timeoutSeconds"] <= 30
    service = default.one("Service", f"{FULLNAME}-webhook")
    assert service["spec"]["ports"][0]["port"] == 443
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"


def test_webhook_matches_the_operators_own_registration_builder(default: Rendered) -> None:
    # kvgate.admission.registration builds the same configuration for e2e and the demo.
    from kvgate.admission.registration import validating_webhook_configuration

    built = validating_webhook_configuration(
        ca_bundle=b"unused", service_name=f"{FULLNAME}-webhook", service_namespace=NAMESPACE
    )["webhooks"][0]
    rendered = copy.deepcopy(default.one("ValidatingWebhookConfiguration")["webhooks"][0])
    for webhook in (built, rendered):
        del webhook["clientConfig"]["caBundle"]
    assert rendered == built


def _verify_signed_by(cert: x509.Certificate, issuer: x509.Certificate) -> None:
    key = issuer.public_key()
    assert cert.signature_hash_algorithm is not None
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(
            cert.signature,
            cert.tbs_certificate_bytes,
            padding.PKCS1v15(),
            cert.signature_hash_algorithm,
        )
    elif isinstance(key, ec.EllipticCurvePublicKey):
        key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )
    else:
        raise AssertionError(f"unexpected CA key type {type(key).__name__}")


def test_default_mode_ca_bundle_signs_the_mounted_serving_certificate(default: Rendered) -> None:
    webhook = default.one("ValidatingWebhookConfiguration")["webhooks"][0]
    ca = x509.load_pem_x509_certificate(base64.b64decode(webhook["clientConfig"]["caBundle"]))
    secret = default.one("Secret", f"{FULLNAME}-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert x509.load_pem_x509_certificate(data["ca.crt"]) == ca
    serving = x509.load_pem_x509_certificate(data["tls.crt"])
    _verify_signed_by(serving, ca)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"{FULLNAME}-webhook.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    assert serving.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=3000)
    assert b"PRIVATE KEY" in data["tls.key"]
    assert "cert-manager.io/inject-ca-from" not in default.one("ValidatingWebhookConfiguration")[
        "metadata"
    ].get("annotations", {})
    annotations = default.webhook()["spec"]["template"]["metadata"]
    assert "checksum/webhook-tls" in annotations["annotations"]
    assert default.all("Certificate") == []


def test_cert_manager_mode_renders_a_certificate_and_the_cainjector_annotation(
    helm: Helm,
) -> None:
    rendered = helm.template("webhook.certManager.enabled=true", api_versions=CERT_MANAGER)
    config = rendered.one("ValidatingWebhookConfiguration")
    certificate = rendered.one("Certificate", f"{FULLNAME}-webhook")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/{FULLNAME}-webhook"
    )
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    assert certificate["spec"]["secretName"] == f"{FULLNAME}-webhook-tls"
    assert f"{FULLNAME}-webhook.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    issuer = rendered.one("Issuer")
    assert issuer["spec"] == {"selfSigned": {}}
    assert certificate["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
    assert _names(rendered.all("Secret")) == [ROUTER_KEY_SEED]  # no webhook Secret


def test_cert_manager_mode_uses_a_given_cluster_issuer(helm: Helm) -> None:
    rendered = helm.template(
        "webhook.certManager.enabled=true",
        "webhook.certManager.issuerRef.name=corp-ca",
        "webhook.certManager.issuerRef.kind=ClusterIssuer",
        api_versions=CERT_MANAGER,
    )
    assert rendered.all("Issuer") == []
    assert rendered.one("Certificate")["spec"]["issuerRef"] == {
        "name": "corp-ca",
        "kind": "ClusterIssuer",
        "group": "cert-manager.io",
    }


def test_cert_manager_mode_without_cert_manager_fails_with_the_way_out(helm: Helm) -> None:
    result = helm.template_result("webhook.certManager.enabled=true")
    assert result.returncode != 0
    assert "cert-manager.io/v1/Certificate" in result.stderr
    assert "webhook.certManager.enabled=false" in result.stderr


def test_webhook_disabled_renders_no_webhook_and_tells_the_operator(helm: Helm) -> None:
    rendered = helm.template("webhook.enabled=false")
    assert rendered.all("ValidatingWebhookConfiguration") == []
    assert _names(rendered.all("Secret")) == [ROUTER_KEY_SEED]  # no webhook Secret
    assert "--no-webhook" in _operator_container(rendered)["args"]


# --- monitoring and network -------------------------------------------------------------------


def test_service_monitor_and_alerts_for_refused_rollouts_and_low_headroom(helm: Helm) -> None:
    rendered = helm.template(
        "metrics.serviceMonitor.enabled=true",
        "metrics.prometheusRule.enabled=true",
        api_versions=MONITORING,
    )
    monitor = rendered.one("ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    # It scrapes the controller's metrics Service and the webhook's (kvgate_admission_*), and no
    # other Service of the release.
    selector = monitor["spec"]["selector"]["matchLabels"]
    scraped = {
        s["metadata"]["name"]
        for s in rendered.all("Service")
        if selector.items() <= s["metadata"]["labels"].items()
    }
    assert scraped == {f"{FULLNAME}-metrics", f"{FULLNAME}-webhook-metrics"}
    for name in scraped:
        ports = rendered.one("Service", name)["spec"]["ports"]
        assert [p["name"] for p in ports] == ["metrics"]
    alerts = {r["alert"]: r for r in rendered.one("PrometheusRule")["spec"]["groups"][0]["rules"]}
    # A refusal counts from its series' first sample (a new series is scraped at 1). Only the
    # operator's own scrape job counts (the ServiceMonitor's <namespace>/<Service>).
    job = '{job="kvgate-system/kvgate-metrics"}'
    assert " ".join(alerts["KvgateRolloutRefused"]["expr"].split()) == (
        "( sum by (namespace, deployment, reason) ( "
        f"increase(kvgate_rollouts_refused_total{job}[15m]) ) > 0 ) or "
        f"( sum by (namespace, deployment, reason) ( kvgate_rollouts_refused_total{job} unless "
        f"kvgate_rollouts_refused_total{job} offset 15m ) > 0 )"
    )
    assert alerts["KvgateEngineHeadroomLow"]["expr"] == (
        f"min by (namespace, deployment, pod, role) (kvgate_engine_headroom_ratio{job}) < 1.1"
    )
    assert alerts["KvgateEngineHeadroomLow"]["for"] == "5m"
    assert "{{ $labels.pod }}" in alerts["KvgateEngineHeadroomLow"]["annotations"]["description"]


@pytest.mark.parametrize("watch", [(), ("team-a", "team-b")], ids=["cluster", "namespaced"])
def test_pod_monitors_select_kvgates_engines_and_routers_on_their_metrics_ports(
    helm: Helm, watch: tuple[str, ...]
) -> None:
    sets = ["metrics.enginePodMonitor.enabled=true", "metrics.routerPodMonitor.enabled=true"]
    if watch:
        sets.append(f"watchNamespaces={{{','.join(watch)}}}")
    monitors = {
        m["metadata"]["name"]: m
        for m in helm.template(*sets, api_versions=POD_MONITOR).all("PodMonitor")
    }
    assert set(monitors) == {f"{FULLNAME}-engines", f"{FULLNAME}-routers"}
    md = make_md()
    pods = {
        component: builders.deployment(md, "abc123", component, replicas=1)["spec"]["template"]
        for component in ("prefill", "decode", "router")
    }
    for name, components in (("engines", {"prefill", "decode"}), ("routers", {"router"})):
        monitor = monitors[f"{FULLNAME}-{name}"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        selected = {
            c for c, pod in pods.items() if selector.items() <= pod["metadata"]["labels"].items()
        }
        assert selected == components, (name, selected)
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        for component in components:
            ports = [
                p["name"]
                for c in pods[component]["spec"]["containers"]
                for p in c.get("ports") or []
            ]
            assert endpoint["port"] in ports, (component, ports)
        assert endpoint["interval"] == "30s" and endpoint["path"] == "/metrics"
        expected = {"matchNames": list(watch)} if watch else {"any": True}
        assert monitor["spec"]["namespaceSelector"] == expected
    router_endpoint = monitors[f"{FULLNAME}-routers"]["spec"]["podMetricsEndpoints"][0]
    assert router_endpoint["port"] == "metrics"


def test_router_pod_monitor_without_the_monitoring_api_fails_with_the_way_out(helm: Helm) -> None:
    result = helm.template_result("metrics.routerPodMonitor.enabled=true")
    assert result.returncode != 0
    assert "metrics.routerPodMonitor.enabled is true but the cluster does not serve" in (
        result.stderr
    )
    assert "set metrics.routerPodMonitor.enabled=false" in result.stderr


def test_network_policy_opens_webhook_and_metrics_only(helm: Helm) -> None:
    rendered = helm.template("networkPolicy.enabled=true")
    controller = rendered.component("NetworkPolicy", "operator")
    webhook = rendered.component("NetworkPolicy", "webhook")
    for policy, expected in ((controller, ["metrics"]), (webhook, ["webhook", "metrics"])):
        ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
        assert ports == expected
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert webhook["spec"]["podSelector"]["matchLabels"].items() <= (
        rendered.webhook()["spec"]["template"]["metadata"]["labels"].items()
    )


# --- values schema ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("replicas=-1", "'/replicas': minimum: got -1, want 0"),
        ("replicas=11", "'/replicas': maximum: got 11, want 10"),
        ("webhook.replicas=0", "'/webhook/replicas': minimum: got 0, want 1"),
        ("leaderElection.retryPeriodSeconds=0", "'/leaderElection/retryPeriodSeconds'"),
        ("image.tag=5", "'/image/tag': got number, want string"),
        ("webhook.failurePolicy=Maybe", "'/webhook/failurePolicy': value must be one of"),
        ("webhook.timeoutSeconds=31", "'/webhook/timeoutSeconds'"),
        ("runAsUser=0", "'/runAsUser': minimum: got 0, want 1"),
        ("podDisruptionBudget.maxUnavailable=half", "'/podDisruptionBudget/maxUnavailable'"),
        ("webhook.existingSecret=Not_A_Name", "'/webhook/existingSecret'"),
        ("guard.resources.requets.cpu=1", "additional properties 'requets' not allowed"),
        ("ports.webhook=70000", "'/ports/webhook'"),
        ("watchNamespaces={Team_A}", "'/watchNamespaces/0'"),
        ("replica=1", "additional properties 'replica' not allowed"),
        ("logLevel=VERBOSE", "'/logLevel': value must be one of"),
    ],
)
def test_bad_values_fail_and_name_the_field(helm: Helm, value: str, message: str) -> None:
    result = helm.template_result(value)
    assert result.returncode != 0, f"{value} was accepted"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr


def test_extra_env_reaches_the_operator_container_after_the_charts_own(helm: Helm) -> None:
    rendered = helm.template(
        "extraEnv[0].name=NO_PROXY",
        "extraEnv[0].value=.svc",
        "extraEnv[1].name=KVGATE_BIND_ADDRESS",
        "extraEnv[1].valueFrom.fieldRef.fieldPath=status.podIP",
    )
    (container,) = rendered.controller()["spec"]["template"]["spec"]["containers"]
    env = container["env"]
    assert env[-2:] == [
        {"name": "NO_PROXY", "value": ".svc"},
        {"name": "KVGATE_BIND_ADDRESS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    assert [e["name"] for e in env[:2]] == ["POD_NAMESPACE", "POD_NAME"]


def test_extra_env_without_a_name_fails_and_names_the_field(helm: Helm) -> None:
    result = helm.template_result("extraEnv[0].value=2")
    assert result.returncode != 0
    assert "'/extraEnv/0': missing property 'name'" in result.stderr


def _app_version() -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version: str = chart["appVersion"]
    return version


def test_chart_notes_tell_the_user_what_to_apply_next(helm: Helm, tmp_path: Path) -> None:
    notes = render_notes(helm, tmp_path / "default")
    assert f"kubectl -n {NAMESPACE} rollout status deployment/{FULLNAME}" in notes
    assert "kvgate validate my-model.yaml" in notes
    assert "kubectl apply -f my-model.yaml" in notes
    assert "keeps the CRD and every ModelDeployment" in notes
    notes = render_notes(helm, tmp_path / "no-crd", "crds.install=false", "webhook.enabled=false")
    assert "kubectl apply --server-side -f crds/modeldeployment.yaml" in notes
    assert "webhook is DISABLED" in notes


def test_every_value_is_documented_in_values_yaml() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    undocumented = []
    # Children of a `resources:` key (at any depth) are Kubernetes' own ResourceRequirements.
    free_form_indent: int | None = None
    for number, line in enumerate(lines, start=1):
        match = re.match(r"^(\s*)([A-Za-z][\w.-]*):\s*(.*)$", line)
        if not match:
            continue
        indent, key, value = match.groups()
        if free_form_indent is not None and len(indent) <= free_form_indent:
            free_form_indent = None
        if free_form_indent is not None:
            continue
        if key == "resources":
            free_form_indent = len(indent)
        if value == "":
            continue
        previous = next(p for p in reversed(lines[: number - 1]) if p.strip())
        if not previous.strip().startswith("#"):
            undocumented.append(f"line {number}: {line.strip()}")
    assert not undocumented, "values without a comment above them:\n" + "\n".join(undocumented)


def _names(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def test_router_key_seed_is_generated_kept_on_uninstall_and_reaches_the_operator(
    default: Rendered,
) -> None:
    secret = default.one("Secret", ROUTER_KEY_SEED)
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(secret["data"]["seed"])) == 48
    env = {e["name"]: e for e in _operator_container(default)["env"]}
    ref = env["KVGATE_ROUTER_KEY_SEED"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": ROUTER_KEY_SEED, "key": "seed"}
