"""Attacks on what carries a ModelDeployment's traffic besides its pods, as a tenant would try
them: a namespace editor (the built-in ``edit`` role bound to a ServiceAccount, used through
``kubectl --as``) against a serving ModelDeployment, with known-answer requests flowing through
the ``<md>`` Service and the invariant sampler checking every traffic path throughout.

1. Addresses: a Service of the tenant's with ``spec.externalIPs`` set to the ``<md>`` Service's
   ClusterIP or to a verified decode pod's IP (kube-proxy would send that address's traffic to the
   tenant's pods, CVE-2020-8554) is denied by the chart's ``service-external-ips`` policy, created
   or patched in; ``spec.loadBalancerIP`` set to the ClusterIP is admitted and takes nothing
   (kube-proxy programs ``status.loadBalancer``, which ``edit`` cannot write).
2. The router key: deleting Secret ``<md>-router-control`` (so as to create one of their own
   under its name, which the next router would trust) is denied by the ``secret-deletion``
   policy, one by one or as a collection; changing it in place by ``managed-objects``. The
   namespace fixture's own clean-up proves the namespace controller may still delete it.
The third, a tenant's StatefulSet or LeaderWorkerSet carrying a router's labels, is
`test_attack_tenant_workloads.py` (it needs LeaderWorkerSet on, which takes a world alone).

Each attack test fails when the chart's policies are not installed: the attack is then admitted.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_attack_tenant_addresses.py -v -s`` (root).
"""

from __future__ import annotations

import functools
import json
import time
from typing import Any

import pytest
from attack_helpers import (
    MD,
    assert_bound_and_type_checked,
    assert_denied,
    can_i,
    serve,
    under_attack,
)
from kvgate_e2e.deadlines import PASS_DEADLINE, STEP_DEADLINE
from kvgate_e2e.world import World, is_ready
from scenario_helpers import deadline_loop, known_answer

pytestmark = pytest.mark.e2e

EXTERNAL_IPS = "service-external-ips"  # the chart's policies, after kvgate.clusterName
SECRET_DELETION = "secret-deletion"
MANAGED_OBJECTS = "managed-objects"
POD_CREATION = "pod-creation"
TENANT_KEY = "the-tenants-own-router-key"
NAMESPACE_CONTROLLER = "system:serviceaccount:kube-system:namespace-controller"
GARBAGE_COLLECTOR = "system:serviceaccount:kube-system:generic-garbage-collector"
# Known-answer requests that must all succeed after the tenant's loadBalancerIP claim exists
# (kube-proxy syncs at once here: --iptables-min-sync-period=0s).
REQUESTS_AFTER_CLAIM = 20
# Deadlines, not bounds: only a step that never happens reaches one. Shared ones come from
# kvgate_e2e.deadlines.
RBAC_DEADLINE = 30  # the API server's authorizer following a new RoleBinding (its watch)


def tenant_service(name: str, port: int, **spec: Any) -> dict[str, Any]:
    """A Service of the tenant's, selecting pods of their own (``app=hijack``)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": "hijack"},
            "ports": [{"port": port, "targetPort": port, "protocol": "TCP"}],
            **spec,
        },
    }


# ------------------------------------------------------------------------------- 1: addresses
def test_a_tenant_service_cannot_take_the_cluster_ip_or_a_verified_engines_ip_as_external_ip(
    world: World, namespace: str
) -> None:
    s = serve(world, namespace)
    t = s.tenant
    service = world.get("service", MD, namespace)
    assert service is not None
    cluster_ip = service["spec"]["clusterIP"]
    service_port = int(service["spec"]["ports"][0]["port"])
    decode_ip = s.decode["status"]["podIP"]
    engine_port = next(
        int(port["containerPort"])
        for container in s.decode["spec"]["containers"]
        for port in container.get("ports") or []
        if port.get("name") == "http"
    )
    way_out = "Expose your pods with a LoadBalancer or NodePort Service instead"
    exemption = "admissionPolicy.externalIPs.allowedNamespaces"
    with under_attack(world, namespace, "external-ips") as traffic:
        # The <md> Service's ClusterIP: kube-proxy's external-IP rule for it, on every node,
        # would compete with the ClusterIP's own for the ModelDeployment's traffic.
        assert_denied(
            t.create(tenant_service("hijack-router", service_port, externalIPs=[cluster_ip])),
            EXTERNAL_IPS,
            f"Service hijack-router: spec.externalIPs ({cluster_ip}) cannot be set",
            "CVE-2020-8554",
            way_out,
            exemption,
        )
        # A verified decode pod's IP: the router's and kvgate's own probe traffic to it.
        assert_denied(
            t.create(tenant_service("hijack-decode", engine_port, externalIPs=[decode_ip])),
            EXTERNAL_IPS,
            f"Service hijack-decode: spec.externalIPs ({decode_ip}) cannot be set",
        )
        # Nor added later to a Service of the tenant's own, which is otherwise theirs to create.
        mine = t.create(tenant_service("mine", service_port))
        assert mine.returncode == 0, mine.stderr
        patch = {"spec": {"externalIPs": [cluster_ip]}}
        assert_denied(
            t.kubectl("patch", "service", "mine", "-p", json.dumps(patch)),
            EXTERNAL_IPS,
            f"Service mine: spec.externalIPs ({cluster_ip}) cannot be set",
            way_out,
        )
        # spec.loadBalancerIP claims nothing by itself: kube-proxy programs the addresses in
        # status.loadBalancer.ingress, which only a load balancer controller writes
        # (services/status, not in `edit`) and allocates from its own pools.
        claim = tenant_service(
            "lb-claim", service_port, type="LoadBalancer", allocateLoadBalancerNodePorts=False
        )
        claim["spec"]["loadBalancerIP"] = cluster_ip
        created = t.create(claim)
        assert created.returncode == 0, created.stderr
        claimed = time.monotonic()
        deadline_loop(
            f"{REQUESTS_AFTER_CLAIM} known-answer requests after the loadBalancerIP claim",
            lambda: len([r for r in traffic.results if r[0] > claimed]) >= REQUESTS_AFTER_CLAIM,
            STEP_DEADLINE,
        )
    assert can_i(t, "update", "services", "--subresource=status") == "no"
    assert can_i(t, "patch", "services", "--subresource=status") == "no"
    lb = world.get("service", "lb-claim", namespace)
    assert lb is not None and not (lb.get("status") or {}).get("loadBalancer", {}).get("ingress")
    claims = [
        svc["metadata"]["name"]
        for svc in world.list("services", namespace)
        if svc["spec"].get("externalIPs")
    ]
    assert claims == []


# ------------------------------------------------------------------------------ 2: the key
def test_a_tenant_cannot_delete_or_rewrite_the_router_key_secret_but_the_controllers_can(
    world: World, namespace: str
) -> None:
    """Deleting Secret <md>-router-control and creating one of their own under its name would
    put the next router (smg reads the key when it starts) on the tenant's key; the API server
    refuses the delete to everyone but the operator, the namespace controller and the garbage
    collector, and the ModelDeployment keeps serving. The two controllers' deletes (the cluster
    admin impersonating each) are admitted, and the operator writes the same key back."""
    s = serve(world, namespace)
    t = s.tenant
    secret = f"{MD}-router-control"
    before = world.get("secret", secret, namespace)
    assert before is not None
    assert can_i(t, "delete", "secrets") == "yes"  # RBAC alone would let it
    owned = f"Secret {secret} belongs to ModelDeployment {MD}"
    with under_attack(world, namespace, "router-key-secret"):
        assert_denied(
            t.kubectl("delete", "secret", secret, "--wait=false"),
            SECRET_DELETION,
            owned,
            f"not {t.user}",
            "delete and re-apply the ModelDeployment",
        )
        # The collection (what the namespace controller sends): admitted Secret by Secret.
        assert_denied(
            t.kubectl("delete", "--raw", f"/api/v1/namespaces/{namespace}/secrets"),
            SECRET_DELETION,
            owned,
        )
        # Rewriting the key in place is kvgate's alone too.
        rekey = {"stringData": {"admin-key": TENANT_KEY}}
        assert_denied(
            t.kubectl("patch", "secret", secret, "-p", json.dumps(rekey)),
            MANAGED_OBJECTS,
            f"Secret {secret} is kvgate's",
        )
    after = world.get("secret", secret, namespace)
    assert after is not None
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert after["data"] == before["data"]
    md = world.get_md(MD, namespace)
    assert md is not None and is_ready(md)
    ok, detail = known_answer(world, MD, namespace)
    assert ok, detail

    # What deleting the namespace or the ModelDeployment sends, as those controllers.
    def rewritten(gone: str) -> dict[str, Any] | None:
        found = world.get("secret", secret, namespace)
        return found if found is not None and found["metadata"]["uid"] != gone else None

    for controller in (NAMESPACE_CONTROLLER, GARBAGE_COLLECTOR):
        current = world.get("secret", secret, namespace)
        assert current is not None
        deleted = world.kubectl(
            f"--as={controller}", "delete", "secret", secret, f"--namespace={namespace}",
            "--wait=false", check=False,
        )  # fmt: skip
        assert deleted.returncode == 0, deleted.stderr
        restored = deadline_loop(
            f"the operator to write Secret {secret} again after {controller} deleted it",
            functools.partial(rewritten, current["metadata"]["uid"]),
            PASS_DEADLINE,
        )
        assert restored["data"] == before["data"]  # the key is derived: the same one again
    ok, detail = known_answer(world, MD, namespace)
    assert ok, detail


def test_the_address_and_key_policies_are_installed_and_external_ips_bound_everywhere(
    world: World,
) -> None:
    """Both policies type-check cleanly against the Service and Secret schemas; the external-IPs
    binding selects every namespace (kube-proxy's rules are node-global)."""
    binding = assert_bound_and_type_checked(world, EXTERNAL_IPS)
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert "matchResources" not in binding["spec"], binding["spec"]
    binding = assert_bound_and_type_checked(world, SECRET_DELETION)
    assert binding["spec"]["validationActions"] == ["Deny"]
