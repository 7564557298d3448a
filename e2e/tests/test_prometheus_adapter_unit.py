"""The pure parts of the e2e world's prometheus-adapter (``kvgate_e2e.prometheus_adapter``): its
flags, API registration, Service wiring and RBAC, the answers it parses, and the rules file the
docs show users (docs/autoscaling/prometheus-adapter-rules.yaml)."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kvgate_e2e.prometheus_adapter import (
    RULES_FILE,
    AdapterError,
    adapter_args,
    api_services,
    available,
    pod_values,
    quantity,
    rbac_objects,
    service_host,
    service_objects,
)

SGLANG_GAUGES = ("num_running_reqs", "num_queue_reqs", "kv_used_tokens", "token_usage")


def flags(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in args)


def test_the_adapter_authenticates_only_the_apiservers_front_proxy_and_serves_on_its_port() -> None:
    args = flags(
        adapter_args(
            Path("/run/a"),
            host="198.18.0.1",
            port=16443,
            prometheus_url="http://198.18.0.1:19090/",
            front_proxy_ca=Path("/pki/front-proxy-ca.crt"),
        )
    )
    assert args["requestheader-client-ca-file"] == "/pki/front-proxy-ca.crt"
    assert args["requestheader-allowed-names"] == "front-proxy-client"
    assert args["requestheader-username-headers"] == "X-Remote-User"
    assert (args["bind-address"], args["secure-port"]) == ("198.18.0.1", "16443")
    assert (args["tls-cert-file"], args["tls-private-key-file"]) == (
        "/run/a/serving.crt",
        "/run/a/serving.key",
    )
    assert args["prometheus-url"] == "http://198.18.0.1:19090/"
    assert args["config"] == "/run/a/rules.yaml"
    for delegated in ("lister-kubeconfig", "authentication-kubeconfig", "authorization-kubeconfig"):
        assert args[delegated] == "/run/a/adapter.kubeconfig"


def test_the_relist_interval_is_the_one_asked_for_in_go_duration_form() -> None:
    args = flags(
        adapter_args(
            Path("/d"),
            host="h",
            port=1,
            prometheus_url="u",
            front_proxy_ca=Path("/ca"),
            relist_seconds=2.5,
        )
    )
    assert args["metrics-relist-interval"] == "2500ms"
    assert args["metrics-max-age"] == "2500ms"


def test_both_custom_metrics_versions_point_at_the_adapters_service_verified_by_the_ca() -> None:
    services = api_services(b"-----BEGIN CERTIFICATE-----\nCA\n", "ns", "svc")
    assert [s["metadata"]["name"] for s in services] == [
        "v1beta1.custom.metrics.k8s.io",
        "v1beta2.custom.metrics.k8s.io",
    ]
    for s in services:
        spec = s["spec"]
        assert spec["service"] == {"name": "svc", "namespace": "ns", "port": 443}
        assert base64.b64decode(spec["caBundle"]).startswith(b"-----BEGIN CERTIFICATE-----")
        assert "insecureSkipTLSVerify" not in spec
    # The HPA controller's discovery prefers v1beta2.
    by_version = {s["spec"]["version"]: s["spec"]["versionPriority"] for s in services}
    assert by_version["v1beta2"] > by_version["v1beta1"]


def test_the_service_has_no_selector_and_its_endpoint_slice_names_the_adapters_address() -> None:
    service, slice_ = service_objects("198.18.0.1", 16444, "ns", "svc")
    assert (service["metadata"]["namespace"], slice_["metadata"]["namespace"]) == ("ns", "ns")
    assert "selector" not in service["spec"]
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": 16444}]
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "svc"
    assert slice_["ports"] == [{"name": "https", "port": 16444, "protocol": "TCP"}]
    assert slice_["endpoints"] == [{"addresses": ["198.18.0.1"], "conditions": {"ready": True}}]
    assert service_host("ns", "svc") == "svc.ns.svc"


def test_the_adapters_user_gets_the_upstream_manifests_rights_and_no_more() -> None:
    objects = rbac_objects("adapter-user", "pa")
    roles = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    reader = roles[("ClusterRole", "pa:resource-reader")]
    assert reader["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["namespaces", "pods", "nodes", "services"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    bound = {
        (o["kind"], o["metadata"].get("namespace"), o["roleRef"]["name"])
        for o in objects
        if o["kind"].endswith("Binding")
    }
    assert bound == {
        ("ClusterRoleBinding", None, "pa:resource-reader"),
        ("ClusterRoleBinding", None, "system:auth-delegator"),
        ("RoleBinding", "kube-system", "extension-apiserver-authentication-reader"),
    }
    for o in objects:
        if o["kind"].endswith("Binding"):
            assert o["subjects"] == [
                {"kind": "User", "name": "adapter-user", "apiGroup": "rbac.authorization.k8s.io"}
            ]


@pytest.mark.parametrize(
    ("text", "value"), [("4", 4.0), ("1500m", 1.5), ("0", 0.0), ("2k", 2000.0), ("250u", 2.5e-4)]
)
def test_metric_values_are_read_as_kubernetes_quantities(text: str, value: float) -> None:
    assert quantity(text) == pytest.approx(value)


def test_a_value_that_is_no_quantity_is_refused_naming_it() -> None:
    with pytest.raises(AdapterError, match="'four'"):
        quantity("four")


def test_a_metric_value_list_gives_each_pods_value() -> None:
    answer = {
        "kind": "MetricValueList",
        "items": [
            {"describedObject": {"kind": "Pod", "name": "a"}, "value": "6"},
            {"describedObject": {"kind": "Pod", "name": "b"}, "value": "500m"},
        ],
    }
    assert pod_values(answer) == {"a": 6.0, "b": 0.5}
    assert pod_values({"items": None}) == {}


def test_an_api_service_is_available_only_with_available_true() -> None:
    assert available({"status": {"conditions": [{"type": "Available", "status": "True"}]}})[0]
    down = {
        "status": {
            "conditions": [
                {
                    "type": "Available",
                    "status": "False",
                    "reason": "FailedDiscoveryCheck",
                    "message": "no route",
                }
            ]
        }
    }
    assert available(down) == (False, "FailedDiscoveryCheck: no route")
    assert available({}) == (False, "no Available condition yet")


# ---------------------------------------------------------------------------- the rules file
def rules() -> list[dict[str, Any]]:
    return list(yaml.safe_load(RULES_FILE.read_text())["rules"])


def custom_name(rule: dict[str, Any], series: str) -> str | None:
    """The custom metric a rule makes of ``series`` (the adapter's ``name`` regex, Go's
    ``${1}`` as Python's ``\\1``), or None if its seriesQuery does not select it."""
    query = rule["seriesQuery"]
    listed = re.search(r'__name__=~"([^"]+)"', query)
    selects = re.fullmatch(listed.group(1), series) if listed else query.startswith(series + "{")
    if not selects:
        return None
    name = rule["name"]
    return re.sub(name["matches"], name["as"].replace("${1}", r"\1"), series)


@pytest.mark.parametrize("gauge", SGLANG_GAUGES)
def test_each_sglang_gauge_is_one_per_pod_custom_metric_named_with_an_underscore(
    gauge: str,
) -> None:
    made = [n for r in rules() if (n := custom_name(r, f"sglang:{gauge}")) is not None]
    assert made == [f"sglang_{gauge}"]


def test_every_rule_maps_the_series_namespace_and_pod_labels_to_those_resources() -> None:
    for rule in rules():
        assert rule["resources"]["overrides"] == {
            "namespace": {"resource": "namespace"},
            "pod": {"resource": "pod"},
        }
        assert 'namespace!=""' in rule["seriesQuery"] and 'pod!=""' in rule["seriesQuery"]
        assert "by (<<.GroupBy>>)" in rule["metricsQuery"]


def test_a_pods_counts_add_up_over_its_ranks_and_its_usage_is_the_fullest_ranks() -> None:
    queries = {
        custom_name(r, f"sglang:{g}"): r["metricsQuery"] for r in rules() for g in SGLANG_GAUGES
    }
    queries.pop(None, None)
    assert queries["sglang_num_queue_reqs"].startswith("sum by")
    assert queries["sglang_kv_used_tokens"].startswith("sum by")
    assert queries["sglang_token_usage"].startswith("max by")


@pytest.mark.parametrize(
    ("recorded", "metric"),
    [
        (
            "namespace_deployment_pod_role:sglang_num_queue_reqs:sum",
            "kvgate_verified_num_queue_reqs",
        ),
        (
            "namespace_deployment_pod_role:sglang_num_running_reqs:sum",
            "kvgate_verified_num_running_reqs",
        ),
        ("namespace_deployment_pod_role:kvgate_kv_usage:ratio", "kvgate_kv_usage_ratio"),
    ],
)
def test_the_charts_verified_engine_records_are_per_pod_custom_metrics(
    recorded: str, metric: str
) -> None:
    assert [n for r in rules() if (n := custom_name(r, recorded)) is not None] == [metric]
    chart_rules = (
        RULES_FILE.parents[2] / "charts/kvgate/templates/prometheusrule.yaml"
    ).read_text()
    assert f"- record: {recorded}\n" in chart_rules


def test_a_role_wide_record_is_no_per_pod_metric() -> None:
    for recorded in (
        "namespace_deployment_role:sglang_num_queue_reqs:sum",
        "namespace_deployment_role:kvgate_kv_usage:ratio",
    ):
        assert all(custom_name(r, recorded) is None for r in rules())
