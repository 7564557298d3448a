"""A tenant's workload carrying a serving router's labels, as a namespace editor (the built-in
``edit`` role bound to a ServiceAccount, used through ``kubectl --as``) would try it, with
LeaderWorkerSet on (the ``lws`` fixture, which takes a world alone: this file runs in the e2e
tier's second world, ``kvgate_e2e.tier``):

A StatefulSet or LeaderWorkerSet of the tenant's whose pod template carries the serving router's
labels is denied by ``managed-objects``; and where that policy is lifted, the StatefulSet's pod is
still refused by ``pod-creation`` (a StatefulSet's kvgate pod is a gated engine leader or a
worker, never a router), so the ``<md>`` Service keeps its one router.

Split from ``test_attack_tenant_addresses.py`` so that the shared world never waits for it.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_attack_tenant_workloads.py -v -s`` (root).
"""

from __future__ import annotations

from typing import Any

import pytest
from attack_helpers import (
    MD,
    POLICY,
    admitted,
    assert_bound_and_type_checked,
    assert_denied,
    can_i,
    copy_of,
    policy_lifted,
    serve,
    under_attack,
)
from kvgate_e2e.deadlines import POLICY_LIFT_DEADLINE
from kvgate_e2e.world import World, ready_endpoints
from scenario_helpers import Tenant, deadline_loop, events

pytestmark = pytest.mark.e2e

MANAGED_OBJECTS = "managed-objects"  # the chart's policies, after kvgate.clusterName
POD_CREATION = "pod-creation"
# Deadlines, not bounds: only a step that never happens reaches one.
RBAC_DEADLINE = 30  # the API server's authorizer following a new RoleBinding (its watch)
# The StatefulSet controller trying to create the rogue pod and posting its FailedCreate Event.
FAILED_CREATE_DEADLINE = 60


# --------------------------------------------------------------- 3: with LeaderWorkerSet on
def stateful_set_like(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """A StatefulSet of the tenant's whose pods are copies of ``pod`` (labels and all)."""
    copy = copy_of(pod, name, gate=False)
    labels = copy["metadata"]["labels"]
    template = {
        "metadata": {"labels": labels, "annotations": copy["metadata"]["annotations"]},
        "spec": copy["spec"],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": template,
        },
    }


def leader_worker_set_like(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """A one-pod LeaderWorkerSet of the tenant's whose pods are copies of ``pod``."""
    copy = copy_of(pod, name, gate=False)
    template = {"metadata": {"labels": copy["metadata"]["labels"]}, "spec": copy["spec"]}
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 1, "workerTemplate": template}},
    }


def grant_leader_worker_sets(world: World, tenant: Tenant) -> None:
    """What a platform that offers LeaderWorkerSet to its teams adds to `edit` (LeaderWorkerSet's
    own roles are not aggregated into it)."""
    name = "tenant-leaderworkersets"
    world.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name},
            "rules": [
                {
                    "apiGroups": ["leaderworkerset.x-k8s.io"],
                    "resources": ["leaderworkersets"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                }
            ],
        },
        tenant.namespace,
    )
    world.apply(
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [
                {"kind": "ServiceAccount", "name": "tenant", "namespace": tenant.namespace}
            ],
        },
        tenant.namespace,
    )


def failed_create(world: World, namespace: str, owner: str) -> dict[str, Any] | None:
    """The controller's Warning Event that it could not create ``owner``'s pod, if any."""
    for event in events(world, namespace, "FailedCreate"):
        if event["involvedObject"].get("name") == owner:
            return event
    return None


def test_a_tenant_stateful_set_or_leader_worker_set_cannot_run_a_serving_routers_pods(
    lws: World, namespace: str
) -> None:
    world = lws
    for policy in (POD_CREATION, MANAGED_OBJECTS):  # as upgraded with leaderWorkerSet.enabled
        assert_bound_and_type_checked(world, policy)
    s = serve(world, namespace)
    t = s.tenant
    router_ip = s.router["status"]["podIP"]
    grant_leader_worker_sets(world, t)
    assert can_i(t, "create", "statefulsets.apps") == "yes"  # `edit` has them
    deadline_loop(
        "RBAC to let the tenant create LeaderWorkerSets",
        lambda: can_i(t, "create", "leaderworkersets.leaderworkerset.x-k8s.io") == "yes",
        RBAC_DEADLINE,
    )
    rogue = "rogue-routers"
    with under_attack(world, namespace, "rogue-stateful-set"):
        # The StatefulSet controller creates its pods, and with LeaderWorkerSet on it is one of
        # the pod creators kvgate trusts: the set itself must not exist.
        assert_denied(
            t.create(stateful_set_like(s.router, rogue)),
            MANAGED_OBJECTS,
            f"StatefulSet {rogue} is kvgate's",
            f"not {t.user}",
        )
        assert_denied(
            t.create(leader_worker_set_like(s.router, "rogue-group")),
            MANAGED_OBJECTS,
            "LeaderWorkerSet rogue-group is kvgate's",
        )
        # A cluster where such a StatefulSet got in anyway (created before the policy, or the
        # policy lifted): the StatefulSet controller's pod is refused all the same.
        with policy_lifted(world, f"{POLICY}-{MANAGED_OBJECTS}", namespace):
            deadline_loop(
                "the tenant's StatefulSet to be admitted with managed-objects lifted",
                lambda: admitted(t.create(stateful_set_like(s.router, rogue))),
                POLICY_LIFT_DEADLINE,
            )
        event = deadline_loop(
            f"the StatefulSet controller's FailedCreate for {rogue}",
            lambda: failed_create(world, namespace, rogue),
            FAILED_CREATE_DEADLINE,
        )
        message = str(event["message"])
        print(f"Event {event['reason']}: {message}")
        assert f"ValidatingAdmissionPolicy '{POLICY}-{POD_CREATION}'" in message, message
        assert "is controlled by a StatefulSet and labelled kvgate.io/component=router" in message
        owned = [
            p["metadata"]["name"]
            for p in world.list("pods", namespace)
            if any(r.get("kind") == "StatefulSet" for r in p["metadata"].get("ownerReferences", []))
        ]
        assert owned == []
    assert ready_endpoints(world, namespace, MD) == {router_ip}
