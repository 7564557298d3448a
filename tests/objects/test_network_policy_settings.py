"""The operator's NetworkPolicy settings: on by default, off on request, and a clear exit when the
operator's identity (which every engine policy must admit) is missing."""

from __future__ import annotations

import pytest
from kvgate.kube.network_policy_settings import NetworkPolicySettings, network_policy_settings
from kvgate.objects.network_policy import DEFAULT_API_SERVER_EGRESS, RouterEgress

LABELS = '{"app.kubernetes.io/name": "kvgate", "app.kubernetes.io/instance": "kvgate"}'
CHART_ENV = {"KVGATE_OPERATOR_NAMESPACE": "kvgate-system", "KVGATE_OPERATOR_POD_LABELS": LABELS}


def test_policies_are_on_by_default_with_the_charts_identity_and_no_egress_policy() -> None:
    assert network_policy_settings(CHART_ENV) == NetworkPolicySettings(
        "kvgate-system",
        {"app.kubernetes.io/name": "kvgate", "app.kubernetes.io/instance": "kvgate"},
        None,
    )


@pytest.mark.parametrize("value", ["false", "False", "0", "no", "off"])
def test_policies_can_be_turned_off_and_then_need_no_identity(value: str) -> None:
    assert network_policy_settings({"KVGATE_NETWORK_POLICIES": value}) is None


def test_namespace_falls_back_to_the_pods_own_namespace() -> None:
    env = {"POD_NAMESPACE": "ops", "KVGATE_OPERATOR_POD_LABELS": LABELS}
    settings = network_policy_settings(env)
    assert settings is not None and settings.operator_namespace == "ops"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KVGATE_OPERATOR_POD_LABELS": LABELS}, "operator's namespace is unknown"),
        ({"KVGATE_OPERATOR_NAMESPACE": "kvgate-system"}, "operator's pod labels is unknown"),
        ({**CHART_ENV, "KVGATE_OPERATOR_POD_LABELS": "app=kvgate"}, "is not valid JSON"),
        ({**CHART_ENV, "KVGATE_OPERATOR_POD_LABELS": '{"a": 1}'}, "JSON object of strings"),
        ({**CHART_ENV, "KVGATE_NETWORK_POLICIES": "maybe"}, "KVGATE_NETWORK_POLICIES='maybe'"),
        (
            {**CHART_ENV, "KVGATE_ROUTER_EGRESS_POLICY": "1", "KVGATE_ROUTER_EGRESS_ALLOW": "{}"},
            "JSON list of NetworkPolicy egress rules",
        ),
    ],
)
def test_a_missing_or_malformed_setting_exits_naming_the_variable_and_the_way_out(
    env: dict[str, str], message: str
) -> None:
    with pytest.raises(SystemExit, match=message):
        network_policy_settings(env)


def test_missing_identity_message_offers_turning_policies_off() -> None:
    with pytest.raises(SystemExit, match="or KVGATE_NETWORK_POLICIES=false"):
        network_policy_settings({})


def test_router_egress_defaults_to_the_api_server_ports_and_takes_the_admins_rules() -> None:
    on = {**CHART_ENV, "KVGATE_ROUTER_EGRESS_POLICY": "true"}
    settings = network_policy_settings(on)
    assert settings is not None
    assert settings.router_egress == RouterEgress(allow=DEFAULT_API_SERVER_EGRESS)
    rule = '[{"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 6443}]}]'
    settings = network_policy_settings({**on, "KVGATE_ROUTER_EGRESS_ALLOW": rule})
    assert settings is not None and settings.router_egress is not None
    assert settings.router_egress.allow == (
        {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 6443}]},
    )
