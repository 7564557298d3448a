"""Pure builders: the NetworkPolicies that fence one revision of a ModelDeployment (plain dicts).

Per revision ``<rev>`` of ModelDeployment ``<md>`` (created with the revision's Deployments,
deleted with them; owned by the ModelDeployment like every other object kvgate builds):

``<md>-<rev>-engines`` (ingress to the revision's prefill and decode pods)
    * from the revision's own engine pods, every port: the prefill<->decode KV handoff. With the
      reference engine that is the prefill's bootstrap port, but SGLang's mooncake/NIXL transfer
      engines open dynamic ports in both directions, and a multi-node engine's ranks talk NCCL,
      so ports cannot be listed. Same-role peers of the same revision are admitted too: they are
      pods of the same operator-built template, as verified as the PD peer.
    * from the revision's router pods, on the engine HTTP port and the bootstrap port (smg 1.13
      TCP-probes the prefill's bootstrap port when it registers a worker);
    * from the kvgate operator's pods (namespace + pod labels), on the engine HTTP port: the live
      verification reads ``/server_info`` and ``/v1/models`` there.

``<md>-<rev>-router`` (ingress to the revision's smg pods)
    * from any pod of the ModelDeployment's namespace (the namespace's clients) and from the
      operator (it reads ``GET /workers``), on the router port only.

``<md>-<rev>-router-egress`` (optional; egress of the revision's smg pods)
    * to the revision's engine pods on the engine HTTP and bootstrap ports, plus the rules the
      cluster admin gives for smg's Kubernetes discovery (the API server). A worker URL injected
      into the router that points anywhere else is then unreachable. It is optional because the
      API server cannot be named portably in a NetworkPolicy: it is not a pod, its address and
      port are cluster-specific, and some CNIs (Cilium) do not match it with an ``ipBlock`` at all
      -- a wrong rule there cuts smg's discovery and so every revision's traffic.

Why per revision: a NetworkPolicy selects peers by labels, and "the same revision as the pod being
protected" is not expressible, so a per-ModelDeployment policy would let revision A's router (or
a worker URL injected into it) reach revision B's engines, the cross-revision pairing kvgate
forbids (their context lengths may differ).

What these need from the cluster: a CNI that enforces NetworkPolicy (Calico, Cilium, Antrea,
...; kindnet before 1.29 and flannel alone do not -- the objects are then accepted and ignored),
and the ``kubernetes.io/metadata.name`` namespace label (set by the API server since 1.22).
NetworkPolicies are allow-lists that add up: anyone who may write NetworkPolicies in the
namespace can open the engines further with a policy of their own (e.g. for Prometheus), and
kubelet probes from the node are allowed by every common CNI regardless of policy.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvgate.api import labels, multinode
from kvgate.api.models import ModelDeployment
from kvgate.objects import builders

Body = dict[str, Any]

NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"

# smg's Kubernetes discovery talks to the API server: 443 (most managed clusters, and the
# `kubernetes` Service) or 6443 (kubeadm, k3s, kind). NetworkPolicies are evaluated after the
# Service's DNAT on common CNIs, so both are listed.
DEFAULT_API_SERVER_EGRESS: tuple[Body, ...] = (
    {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]},
)


@dataclass(frozen=True)
class RouterEgress:
    """Restrict the routers' egress to their revision's engines plus ``allow`` (egress rules,
    ``NetworkPolicyEgressRule`` dicts: at least the API server for smg's discovery)."""

    allow: tuple[Body, ...] = field(default=DEFAULT_API_SERVER_EGRESS)


def engines_policy_name(md_name: str, revision: str) -> str:
    return f"{md_name}-{revision}-engines"


def router_policy_name(md_name: str, revision: str) -> str:
    return f"{md_name}-{revision}-router"


def router_egress_policy_name(md_name: str, revision: str) -> str:
    return f"{md_name}-{revision}-router-egress"


def policy_names(md_name: str, revision: str, *, router_egress: bool) -> list[str]:
    """Names of the policies ``network_policies`` builds for one revision, in the same order."""
    names = [engines_policy_name(md_name, revision), router_policy_name(md_name, revision)]
    if router_egress:
        names.append(router_egress_policy_name(md_name, revision))
    return names


def revision_pods(md_name: str, revision: str, component: str) -> dict[str, str]:
    """Labels of one revision's engine pods (both roles) or router pods."""
    return {
        labels.DEPLOYMENT: md_name,
        labels.REVISION: revision,
        labels.COMPONENT: component,
    }


def network_policies(
    md: ModelDeployment,
    revision: str,
    *,
    operator_namespace: str,
    operator_pod_labels: Mapping[str, str],
    router_egress: RouterEgress | None = None,
) -> list[Body]:
    """The NetworkPolicies of one revision: engines' ingress, routers' ingress and, when
    ``router_egress`` is given, routers' egress."""
    if not operator_namespace or not operator_pod_labels:
        raise ValueError(
            "the operator's namespace and pod labels are required to let it probe engines "
            f"(got namespace {operator_namespace!r}, labels {dict(operator_pod_labels)!r})"
        )
    operator = _OperatorPeer(operator_namespace, operator_pod_labels)
    policies = [
        _engine_ingress_policy(md, revision, operator),
        _router_ingress_policy(md, revision, operator),
    ]
    if router_egress is not None:
        policies.append(_router_egress_policy(md, revision, router_egress))
    return policies


@dataclass(frozen=True)
class _OperatorPeer:
    namespace: str
    pod_labels: Mapping[str, str]

    def peer(self) -> Body:
        """A fresh peer dict for every use: shared ones would come out as YAML anchors."""
        return {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: self.namespace}},
            "podSelector": {"matchLabels": dict(self.pod_labels)},
        }


def _pods(selector: dict[str, str]) -> Body:
    return {"podSelector": {"matchLabels": dict(selector)}}


def _engine_ingress_policy(md: ModelDeployment, revision: str, operator: _OperatorPeer) -> Body:
    """Engines take traffic from their revision's engines, its routers (HTTP and bootstrap)
    and the operator's probes (HTTP)."""
    name, engine = md.metadata.name or "", md.spec.engine
    engines = revision_pods(name, revision, labels.COMPONENT_ENGINE)
    routers = revision_pods(name, revision, labels.COMPONENT_ROUTER)
    policy = _policy(
        md,
        engines_policy_name(name, revision),
        engines,
        ingress=[
            {"from": [_pods(engines)]},
            {"from": [_pods(routers)], "ports": _ports(engine.port, engine.bootstrap_port)},
            {"from": [operator.peer()], "ports": [_tcp(engine.port)]},
        ],
    )
    if any(multinode.is_multi_node(r) for r in (md.spec.prefill, md.spec.decode)):
        # A multi-node engine's workers (component engine-worker) take part in the fence: its
        # ranks meet at the leader's dist-init port and talk NCCL on dynamic ports.
        both = _engines_and_workers(engines)
        policy["spec"]["podSelector"] = both
        policy["spec"]["ingress"][0] = {"from": [{"podSelector": copy.deepcopy(both)}]}
    return policy


def _router_ingress_policy(md: ModelDeployment, revision: str, operator: _OperatorPeer) -> Body:
    """Routers take requests from any pod of the namespace and the operator, and the operator
    reads their response counters."""
    name = md.metadata.name or ""
    return _policy(
        md,
        router_policy_name(name, revision),
        revision_pods(name, revision, labels.COMPONENT_ROUTER),
        ingress=[
            {
                "from": [{"podSelector": {}}, operator.peer()],
                "ports": [_tcp(md.spec.router.port)],
            },
            # The progressive step check reads the routers' response counters.
            {"from": [operator.peer()], "ports": [_tcp(builders.ROUTER_METRICS_PORT)]},
        ],
    )


def _router_egress_policy(md: ModelDeployment, revision: str, egress: RouterEgress) -> Body:
    """Routers reach their revision's engines and what the operator's settings allow."""
    name, engine = md.metadata.name or "", md.spec.engine
    return _policy(
        md,
        router_egress_policy_name(name, revision),
        revision_pods(name, revision, labels.COMPONENT_ROUTER),
        egress=[
            {
                "to": [_pods(revision_pods(name, revision, labels.COMPONENT_ENGINE))],
                "ports": _ports(engine.port, engine.bootstrap_port),
            },
            *(copy.deepcopy(dict(rule)) for rule in egress.allow),
        ],
    )


def _engines_and_workers(engines: dict[str, str]) -> Body:
    """A selector of a revision's engine pods and multi-node workers alike."""
    return {
        "matchLabels": {k: v for k, v in engines.items() if k != labels.COMPONENT},
        "matchExpressions": [
            {
                "key": labels.COMPONENT,
                "operator": "In",
                "values": [labels.COMPONENT_ENGINE, multinode.COMPONENT_WORKER],
            }
        ],
    }


def _tcp(port: int) -> Body:
    return {"port": port, "protocol": "TCP"}


def _ports(*ports: int) -> list[Body]:
    return [_tcp(p) for p in dict.fromkeys(ports)]  # one entry if bootstrap == http port


def _policy(
    md: ModelDeployment,
    name: str,
    pods: dict[str, str],
    *,
    ingress: Sequence[Body] | None = None,
    egress: Sequence[Body] | None = None,
) -> Body:
    spec: Body = {"podSelector": {"matchLabels": dict(pods)}, "policyTypes": []}
    if ingress is not None:
        spec["policyTypes"].append("Ingress")
        spec["ingress"] = list(ingress)
    if egress is not None:
        spec["policyTypes"].append("Egress")
        spec["egress"] = list(egress)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": md.metadata.namespace,
            "labels": {**pods, labels.MANAGED_BY: labels.MANAGED_BY_VALUE},
            "ownerReferences": [builders.owner_reference(md)],
        },
        "spec": spec,
    }
