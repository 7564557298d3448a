"""The per-revision NetworkPolicies: golden files, and who may reach an engine or a router.

``reachable`` below is a small NetworkPolicy evaluator (matchLabels selectors, the
``kubernetes.io/metadata.name`` namespace label, numbered ports), enough to check the built
policies against a table of connections the way an enforcing CNI would decide them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from factories.golden import check_golden
from factories.model_deployments import MD_UID, make_md
from kvgate.api import labels
from kvgate.objects import network_policy
from kvgate.objects.network_policy import RouterEgress, network_policies

REV, OLD = "7c9d0e1f2a", "1a2b3c4d5e"
OPERATOR_NS = "kvgate-system"
OPERATOR_LABELS = {
    "app.kubernetes.io/name": "kvgate",
    "app.kubernetes.io/instance": "kvgate",
    "app.kubernetes.io/component": "operator",
}
NS = "models"  # make_md's namespace


def _policies(md: Any = None, revision: str = REV, **kwargs: Any) -> list[dict[str, Any]]:
    return network_policies(
        md or make_md(),
        revision,
        operator_namespace=OPERATOR_NS,
        operator_pod_labels=OPERATOR_LABELS,
        **kwargs,
    )


# --- a small NetworkPolicy evaluator ----------------------------------------------------------


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]


def _selects(selector: dict[str, Any], labels_: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"evaluator handles matchLabels only: {selector}"
    return all(labels_.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_matches(peer: dict[str, Any], policy_ns: str, pod: Pod) -> bool:
    assert "ipBlock" not in peer
    if "namespaceSelector" in peer:
        ns_ok = _selects(peer["namespaceSelector"], {"kubernetes.io/metadata.name": pod.namespace})
    else:
        ns_ok = pod.namespace == policy_ns
    return ns_ok and _selects(peer.get("podSelector", {}), pod.labels)


def _rule_allows(rule: dict[str, Any], peers_key: str, policy_ns: str, pod: Pod, port: int) -> bool:
    peers = rule.get(peers_key)
    port_ok = "ports" not in rule or any(p["port"] == port for p in rule["ports"])
    peer_ok = peers is None or any(_peer_matches(p, policy_ns, pod) for p in peers)
    return port_ok and peer_ok


def reachable(policies: list[dict[str, Any]], src: Pod, dst: Pod, port: int) -> bool:
    """Would an enforcing CNI let ``src`` open a TCP connection to ``dst:port``?"""

    def direction(kind: str, subject: Pod, other: Pod, rules_key: str, peers_key: str) -> bool:
        applying = [
            p
            for p in policies
            if p["metadata"]["namespace"] == subject.namespace
            and kind in p["spec"]["policyTypes"]
            and _selects(p["spec"]["podSelector"], subject.labels)
        ]
        if not applying:
            return True  # no policy selects the pod in this direction: everything is allowed
        return any(
            _rule_allows(rule, peers_key, subject.namespace, other, port)
            for p in applying
            for rule in p["spec"].get(rules_key, [])
        )

    return direction("Egress", src, dst, "egress", "to") and direction(
        "Ingress", dst, src, "ingress", "from"
    )


def _pod(component: str, role: str = "", revision: str = REV, md: str = "llama") -> Pod:
    pod_labels = {
        labels.DEPLOYMENT: md,
        labels.REVISION: revision,
        labels.COMPONENT: component,
        labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
    }
    if role:
        pod_labels[labels.ROLE] = role
    return Pod(NS, pod_labels)


PREFILL, DECODE, ROUTER = _pod("engine", "prefill"), _pod("engine", "decode"), _pod("router")
OLD_ROUTER, OLD_DECODE = _pod("router", revision=OLD), _pod("engine", "decode", revision=OLD)
OTHER_MD_ROUTER = _pod("router", md="other")
CLIENT = Pod(NS, {"app": "chat-frontend"})
OPERATOR = Pod(OPERATOR_NS, {**OPERATOR_LABELS, "pod-template-hash": "5d8f7"})
OPERATOR_LOOKALIKE = Pod("team-b", dict(OPERATOR_LABELS))  # right labels, wrong namespace
OTHER_NS_CLIENT = Pod("team-b", {"app": "chat-frontend"})
HTTP, BOOTSTRAP, TRANSFER, ROUTER_PORT = 30000, 8998, 17_000, 8000


# --- golden files -----------------------------------------------------------------------------


def test_policies_of_a_revision_match_golden_files() -> None:
    engines, router = _policies()
    check_golden("networkpolicy-engines", engines)
    check_golden("networkpolicy-router", router)


def test_router_egress_policy_matches_golden_file() -> None:
    *_, egress = _policies(router_egress=RouterEgress())
    check_golden("networkpolicy-router-egress", egress)


# --- who may connect --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("src", "dst", "port", "allowed"),
    [
        # the PD handoff: bootstrap port and the transfer engine's dynamic ports, both directions
        (DECODE, PREFILL, BOOTSTRAP, True),
        (DECODE, PREFILL, TRANSFER, True),
        (PREFILL, DECODE, TRANSFER, True),
        # the revision's router: HTTP and the bootstrap probe, nothing else
        (ROUTER, PREFILL, HTTP, True),
        (ROUTER, DECODE, HTTP, True),
        (ROUTER, PREFILL, BOOTSTRAP, True),
        (ROUTER, PREFILL, TRANSFER, False),
        # the operator probes the engine's HTTP port only
        (OPERATOR, PREFILL, HTTP, True),
        (OPERATOR, DECODE, HTTP, True),
        (OPERATOR, PREFILL, BOOTSTRAP, False),
        # everyone else: never an engine
        (OLD_ROUTER, PREFILL, HTTP, False),
        (OLD_DECODE, PREFILL, BOOTSTRAP, False),
        (OTHER_MD_ROUTER, DECODE, HTTP, False),
        (CLIENT, PREFILL, HTTP, False),
        (CLIENT, DECODE, BOOTSTRAP, False),
        (OPERATOR_LOOKALIKE, PREFILL, HTTP, False),
        # routers: the namespace's clients and the operator, on the router port
        (CLIENT, ROUTER, ROUTER_PORT, True),
        (OPERATOR, ROUTER, ROUTER_PORT, True),
        (CLIENT, ROUTER, 9000, False),
        (OTHER_NS_CLIENT, ROUTER, ROUTER_PORT, False),
        (OPERATOR_LOOKALIKE, ROUTER, ROUTER_PORT, False),
    ],
)
def test_engines_admit_only_their_revisions_router_pd_peers_and_the_operator(
    src: Pod, dst: Pod, port: int, allowed: bool
) -> None:
    policies = _policies() + _policies(revision=OLD)
    assert reachable(policies, src, dst, port) is allowed


@pytest.mark.parametrize(
    ("dst", "port", "allowed"),
    [
        (PREFILL, HTTP, True),
        (DECODE, HTTP, True),
        (PREFILL, BOOTSTRAP, True),
        (OLD_DECODE, HTTP, False),  # a worker URL injected into the router: another revision
        (CLIENT, HTTP, False),  # ... or a tenant's pod
        (Pod("kube-system", {"component": "kube-apiserver"}), 6443, True),
        (Pod("default", {}), 443, True),
    ],
)
def test_router_egress_reaches_only_its_revisions_engines_and_the_api_server(
    dst: Pod, port: int, allowed: bool
) -> None:
    policies = _policies(router_egress=RouterEgress()) + _policies(revision=OLD)
    assert reachable(policies, ROUTER, dst, port) is allowed


def test_router_egress_is_not_restricted_unless_asked() -> None:
    assert reachable(_policies(), ROUTER, CLIENT, HTTP)  # the ingress side is the client's
    assert [p["spec"]["policyTypes"] for p in _policies()] == [["Ingress"], ["Ingress"]]


def test_router_egress_rules_for_the_api_server_come_from_the_caller() -> None:
    api_server = {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"port": 6443}]}
    *_, egress = _policies(router_egress=RouterEgress(allow=(api_server,)))
    assert egress["spec"]["egress"][1:] == [api_server]
    assert egress["spec"]["egress"][1] is not api_server  # copied, not shared


def test_ports_follow_the_model_deployment_spec() -> None:
    md = make_md(engine__port=31000, engine__bootstrapPort=9100, router__port=8080)
    engines, router = _policies(md)
    router_rule = engines["spec"]["ingress"][1]
    assert router_rule["ports"] == [
        {"port": 31000, "protocol": "TCP"},
        {"port": 9100, "protocol": "TCP"},
    ]
    assert engines["spec"]["ingress"][2]["ports"] == [{"port": 31000, "protocol": "TCP"}]
    assert router["spec"]["ingress"][0]["ports"] == [{"port": 8080, "protocol": "TCP"}]


# --- identity of the objects ------------------------------------------------------------------


def test_policies_are_owned_by_the_model_deployment_and_named_after_the_revision() -> None:
    built = _policies(router_egress=RouterEgress())
    assert [p["metadata"]["name"] for p in built] == network_policy.policy_names(
        "llama", REV, router_egress=True
    )
    assert network_policy.policy_names("llama", REV, router_egress=False) == [
        f"llama-{REV}-engines",
        f"llama-{REV}-router",
    ]
    for policy in built:
        meta = policy["metadata"]
        assert meta["namespace"] == NS
        assert meta["labels"][labels.MANAGED_BY] == labels.MANAGED_BY_VALUE
        assert meta["labels"][labels.DEPLOYMENT] == "llama"
        assert meta["labels"][labels.REVISION] == REV
        (owner,) = meta["ownerReferences"]
        assert owner["kind"] == "ModelDeployment" and owner["uid"] == MD_UID
        assert owner["controller"] is True


def test_built_policies_share_no_objects_so_they_serialise_without_yaml_anchors() -> None:
    text = yaml.safe_dump_all(_policies(router_egress=RouterEgress()))
    assert "&id" not in text and "*id" not in text


def test_without_the_operators_identity_the_builder_refuses_with_what_is_missing() -> None:
    with pytest.raises(ValueError, match="operator's namespace and pod labels are required"):
        network_policies(make_md(), REV, operator_namespace="", operator_pod_labels={})
