"""NetworkPolicies of a multi-node revision: its workers are fenced like its engine pods, and the
ranks of a group reach each other on every port (dist-init rendezvous, NCCL); single-node
revisions keep exactly the policies they had."""

from __future__ import annotations

from typing import Any

import pytest
from factories.model_deployments import make_md
from kvgate.api import labels, multinode
from kvgate.objects.network_policy import network_policies

REV, OLD = "7c9d0e1f2a", "1a2b3c4d5e"
OPERATOR = {"namespace": "kvgate-system", "labels": {"app.kubernetes.io/name": "kvgate"}}


def _policies(md: Any, revision: str = REV) -> list[dict[str, Any]]:
    return network_policies(
        md,
        revision,
        operator_namespace=OPERATOR["namespace"],
        operator_pod_labels=OPERATOR["labels"],
    )


def _selects(selector: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    """matchLabels and matchExpressions (In), as the API server evaluates a LabelSelector."""
    if any(pod_labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        assert expr["operator"] == "In"
        if pod_labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _pod(component: str, revision: str = REV, role: str = "decode") -> dict[str, str]:
    return {
        labels.DEPLOYMENT: "llama",
        labels.REVISION: revision,
        labels.ROLE: role,
        labels.COMPONENT: component,
    }


LEADER, WORKER = _pod(labels.COMPONENT_ENGINE), _pod(multinode.COMPONENT_WORKER)
PREFILL = _pod(labels.COMPONENT_ENGINE, role="prefill")
OLD_WORKER = _pod(multinode.COMPONENT_WORKER, revision=OLD)
ROUTER = _pod(labels.COMPONENT_ROUTER, role="router")
DIST_INIT, NCCL = multinode.DIST_INIT_PORT, 45123


def _allowed(
    policies: list[dict[str, Any]], src: dict[str, str], dst: dict[str, str], port: int
) -> bool:
    """Same-namespace ingress by an enforcing CNI: no selecting policy = open; else any rule."""
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], dst)]
    if not selecting:
        return True
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            peers = [f["podSelector"] for f in rule["from"] if "namespaceSelector" not in f]
            ports = {p["port"] for p in rule.get("ports", [])}
            if any(_selects(s, src) for s in peers) and (not ports or port in ports):
                return True
    return False


MULTI = make_md(decode__nodes=2, decode__tensorParallel=2)


@pytest.mark.parametrize(
    ("src", "dst", "port", "allowed"),
    [
        (WORKER, LEADER, DIST_INIT, True),  # ranks meet at the leader
        (LEADER, WORKER, NCCL, True),  # and talk NCCL both ways
        (WORKER, WORKER, NCCL, True),
        (PREFILL, WORKER, NCCL, True),  # PD transfer peers of the same revision
        (ROUTER, WORKER, NCCL, False),  # a worker serves no client
        (OLD_WORKER, LEADER, DIST_INIT, False),  # another revision's rank never joins
        (LEADER, OLD_WORKER, NCCL, False),
    ],
)
def test_a_multi_node_revisions_ranks_reach_each_other_and_nobody_else_reaches_them(
    src: dict[str, str], dst: dict[str, str], port: int, allowed: bool
) -> None:
    policies = _policies(MULTI) + _policies(MULTI, OLD)
    assert _allowed(policies, src, dst, port) is allowed


def test_workers_are_selected_by_their_revisions_engines_policy() -> None:
    engines = _policies(MULTI)[0]
    assert _selects(engines["spec"]["podSelector"], WORKER)
    assert not _selects(engines["spec"]["podSelector"], OLD_WORKER)


def test_single_node_revision_policies_are_unchanged() -> None:
    engines = _policies(make_md())[0]
    assert engines["spec"]["podSelector"] == {
        "matchLabels": {
            labels.DEPLOYMENT: "llama",
            labels.REVISION: REV,
            labels.COMPONENT: labels.COMPONENT_ENGINE,
        }
    }
