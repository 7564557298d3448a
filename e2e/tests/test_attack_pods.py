"""Engine pods a tenant could forge or edit, as a tenant would try it: a namespace editor (the
built-in ``edit`` role bound to a ServiceAccount, used through ``kubectl --as``) attacks a serving
ModelDeployment with pods, labels, annotations and edits of kvgate's objects. The chart's
ValidatingAdmissionPolicies (``charts/kvgate/templates/admission-policy.yaml``) deny every attempt
in the API server itself, with a message that names the label or field and the way out, while
known-answer requests keep flowing through the ``<md>`` Service and the invariant sampler checks
every traffic path.

Each attack test fails when the policies are not installed (``admissionPolicy.enabled=false``):
the attack is then admitted.

Run: ``.venv/bin/pytest -m e2e e2e/tests/test_attack_pods.py -v -s`` (root).
"""

from __future__ import annotations

import json

import pytest
from attack_helpers import (
    MD,
    assert_bound_and_type_checked,
    assert_denied,
    copy_of,
    serve,
    under_attack,
)
from kvgate_e2e.deadlines import PASS_DEADLINE
from kvgate_e2e.sampler import InvariantSampler
from kvgate_e2e.world import World, is_ready, manifest_text, ready_endpoints
from scenario_helpers import deadline_loop, make_tenant

pytestmark = pytest.mark.e2e

NOWHERE = {"kvgate.io/pool": "nowhere"}  # a tenant pod that is never scheduled


def revision_pods(world: World, namespace: str, revision: str) -> list[str]:
    selector = f"kvgate.io/deployment={MD},kvgate.io/revision={revision}"
    return sorted(p["metadata"]["name"] for p in world.list("pods", namespace, selector))


# ------------------------------------------------------------------------------------ attacks
def test_tenant_pod_with_engine_labels_is_denied_without_the_gate_and_with_a_forged_owner(
    world: World, namespace: str
) -> None:
    s = serve(world, namespace)
    before = revision_pods(world, namespace, s.revision)
    with under_attack(world, namespace, "rogue-engine-pods"):
        # The copy of a verified prefill pod without the readiness gate: it would turn Ready
        # on its container alone and smg would route to it.
        rogue = copy_of(s.prefill, "rogue-prefill", gate=False)
        assert_denied(
            s.tenant.create(rogue),
            "pod-creation",
            "pod rogue-prefill carries kvgate engine labels",
            "readiness gate kvgate.io/engine-verified",
            "remove the kvgate.io/* and app.kubernetes.io/managed-by=kvgate labels",
        )
        # With the gate and a forged controller reference to the revision's ReplicaSet (so it
        # looks like the operator's own pod): denied for who created it.
        (owner,) = s.prefill["metadata"]["ownerReferences"]
        forged = copy_of(s.prefill, "forged-prefill", gate=True, ownerReferences=[owner])
        assert_denied(
            s.tenant.create(forged),
            "pod-creation",
            "may be created only by the ReplicaSet controller",
            f"not by {s.tenant.user}",
        )
        # A decode copy with the gate but no owner: denied for the missing ReplicaSet.
        assert_denied(
            s.tenant.create(copy_of(s.decode, "gated-decode", gate=True)),
            "pod-creation",
            "no controller ownerReference to a ReplicaSet",
        )
        # The policy is about kvgate's labels, not about pods: the same pod under the tenant's
        # own labels is admitted (server-side dry run, so nothing runs).
        own = copy_of(s.prefill, "my-engine", gate=False)
        own["metadata"]["labels"] = {"app": "my-engine"}
        admitted = s.tenant.create(own, "--dry-run=server")
        assert admitted.returncode == 0, admitted.stderr
    assert revision_pods(world, namespace, s.revision) == before


def test_tenant_pod_labelled_as_the_serving_router_is_denied_and_the_service_keeps_its_router(
    world: World, namespace: str
) -> None:
    s = serve(world, namespace)
    router_ip = s.router["status"]["podIP"]
    with under_attack(world, namespace, "rogue-router-pod"):
        # The <md> Service selects routers by deployment, component=router and revision: a pod
        # with those labels would receive the Service's traffic and route it anywhere.
        rogue = copy_of(s.router, "rogue-router", gate=False)
        assert_denied(
            s.tenant.create(rogue),
            "pod-creation",
            "pod rogue-router carries kvgate labels",
            "no controller ownerReference to a ReplicaSet",
        )
        assert world.get("pod", "rogue-router", namespace) is None
    assert ready_endpoints(world, namespace, MD) == {router_ip}


def test_relabelling_reannotating_orphaning_or_debugging_kvgate_pods_is_denied(
    world: World, namespace: str
) -> None:
    s = serve(world, namespace)
    prefill, decode = s.prefill["metadata"]["name"], s.decode["metadata"]["name"]
    # The tenant's own pod, never scheduled: the one to move into the revision.
    stray = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "stray", "labels": {"app": "stray"}},
        "spec": {
            "nodeSelector": NOWHERE,
            "containers": [{"name": "engine", "image": s.decode["spec"]["containers"][0]["image"]}],
        },
    }
    created = s.tenant.create(stray)
    assert created.returncode == 0, created.stderr
    undersized = json.dumps({"contextLength": 1, "headroom": 1.0, "role": "decode"})
    with under_attack(world, namespace, "pod-metadata"):
        assert_denied(
            s.tenant.kubectl(
                "label", "pod", prefill, "kvgate.io/revision=0000000000", "--overwrite"
            ),
            "pod-metadata",
            f"pod {prefill}: label(s) kvgate.io/revision cannot be added, changed or removed",
            "Change the ModelDeployment instead",
        )
        assert_denied(
            s.tenant.kubectl("label", "pod", decode, "kvgate.io/role-"),
            "pod-metadata",
            "label(s) kvgate.io/role cannot be",
        )
        assert_denied(
            s.tenant.kubectl(
                "label",
                "pod",
                "stray",
                f"kvgate.io/deployment={MD}",
                f"kvgate.io/revision={s.revision}",
                "kvgate.io/role=decode",
                "kvgate.io/component=engine",
            ),
            "pod-metadata",
            "pod stray: label(s)",
            "kvgate.io/revision",
        )
        assert_denied(
            s.tenant.kubectl(
                "annotate", "pod", decode, f"kvgate.io/requirement={undersized}", "--overwrite"
            ),
            "pod-metadata",
            f"pod {decode}: annotation(s) kvgate.io/requirement cannot be added, changed",
        )
        assert_denied(
            s.tenant.kubectl(
                "annotate", "pod", prefill, "sglang.ai/bootstrap-port=9999", "--overwrite"
            ),
            "pod-metadata",
            "annotation(s) sglang.ai/bootstrap-port",
        )
        assert_denied(
            s.tenant.kubectl("annotate", "pod", prefill, "smg.ai/worker-ports=30000,8998"),
            "pod-metadata",
            "annotation(s) smg.ai/worker-ports",
        )
        # The operator's scale-down marks are its alone: a drain mark decides which pod its
        # ReplicaSet removes (kvgate.rollout.scaling).
        assert_denied(
            s.tenant.kubectl("annotate", "pod", decode, "kvgate.io/drained=2026-01-01T00:00:00Z"),
            "pod-metadata",
            "annotation(s) kvgate.io/drained",
        )
        # Orphaning: the pod would keep its labels (and traffic) outside its ReplicaSet.
        assert_denied(
            s.tenant.kubectl(
                "patch",
                "pod",
                prefill,
                "--type=json",
                "-p",
                '[{"op": "remove", "path": "/metadata/ownerReferences"}]',
            ),
            "pod-metadata",
            "metadata.ownerReferences of a kvgate pod may be changed only by",
        )
        # The policy guards kvgate's keys only: a label of the tenant's own is admitted.
        mine = s.tenant.kubectl("label", "pod", prefill, "team=search")
        assert mine.returncode == 0, mine.stderr
    live = world.get("pod", prefill, namespace)
    assert live is not None
    labels = live["metadata"]["labels"]
    assert labels["kvgate.io/revision"] == s.revision and labels["team"] == "search"
    assert live["metadata"]["annotations"] == s.prefill["metadata"]["annotations"]
    assert live["metadata"]["ownerReferences"] == s.prefill["metadata"]["ownerReferences"]
    stray_now = world.get("pod", "stray", namespace)
    assert stray_now is not None and stray_now["metadata"]["labels"] == {"app": "stray"}


def test_ephemeral_debug_container_in_an_engine_pod_is_denied_even_to_a_cluster_admin(
    world: World, namespace: str
) -> None:
    """``kubectl debug POD --target=engine`` adds an ephemeral container that shares the engine's
    network and process view. ``edit`` does not grant pods/ephemeralcontainers, and the
    pod-metadata policy refuses it to everyone, the cluster admin included."""
    s = serve(world, namespace)
    prefill = s.prefill["metadata"]["name"]
    rbac = s.tenant.kubectl("auth", "can-i", "update", "pods", "--subresource=ephemeralcontainers")
    assert rbac.stdout.strip() == "no", rbac.stdout
    pod = world.get("pod", prefill, namespace)
    assert pod is not None
    # What `kubectl debug` sends: the pod with one more ephemeral container.
    pod["spec"]["ephemeralContainers"] = [
        {
            "name": "debugger",
            "image": s.prefill["spec"]["containers"][0]["image"],
            "targetContainerName": "engine",
        }
    ]
    replace = ("replace", "--subresource=ephemeralcontainers", "-f", "-")
    with under_attack(world, namespace, "ephemeral-container"):
        tenant = s.tenant.kubectl(*replace, input=manifest_text(pod))
        assert tenant.returncode != 0 and "cannot update resource" in tenant.stderr, tenant.stderr
        print(f"DENIED (RBAC): {tenant.stderr.strip()}")
        admin = world.kubectl(
            *replace, f"--namespace={namespace}", input=manifest_text(pod), check=False
        )
        assert_denied(
            admin,
            "pod-metadata",
            f"pod {prefill}: ephemeral containers cannot be added to a kvgate pod",
            "kubectl debug POD --copy-to=NAME",
        )
    live = world.get("pod", prefill, namespace)
    assert live is not None and not live["spec"].get("ephemeralContainers")


def test_editing_kvgate_deployments_service_or_forging_owned_objects_is_denied(
    world: World, namespace: str
) -> None:
    s = serve(world, namespace)
    rev, t = s.revision, s.tenant
    prefill, decode, router = (f"{MD}-{rev}-{c}" for c in ("prefill", "decode", "router"))
    managed = "is kvgate's"
    way_out = "Change the ModelDeployment instead"
    md = world.get_md(MD, namespace)
    assert md is not None
    md_owner = {
        "apiVersion": "kvgate.io/v1alpha1",
        "kind": "ModelDeployment",
        "name": MD,
        "uid": md["metadata"]["uid"],
        "controller": True,
    }
    template = world.get("deployment", prefill, namespace)
    assert template is not None
    with under_attack(world, namespace, "managed-objects"):
        # Drop the readiness gate from the revision's template (`kubectl edit` sends the same).
        assert_denied(
            t.kubectl(
                "patch",
                "deployment",
                prefill,
                "--type=json",
                "-p",
                '[{"op": "remove", "path": "/spec/template/spec/readinessGates"}]',
            ),
            "managed-objects",
            f"Deployment {prefill} {managed}",
            f"not {t.user}",
            way_out,
        )
        # Change the engine's flags.
        args = s.decode["spec"]["containers"][0]["args"] + ["--context-length", "1"]
        patch = {"spec": {"template": {"spec": {"containers": [{"name": "engine", "args": args}]}}}}
        assert_denied(
            t.kubectl("patch", "deployment", decode, "-p", json.dumps(patch)),
            "managed-objects",
            f"Deployment {decode} {managed}",
        )
        # Remove the managed-by label to slip out of the policy: the old object still counts.
        assert_denied(
            t.kubectl("label", "deployment", router, "app.kubernetes.io/managed-by-"),
            "managed-objects",
            f"Deployment {router} {managed}",
        )
        assert_denied(
            t.kubectl("rollout", "restart", f"deployment/{prefill}"),
            "managed-objects",
            "to restart an engine, delete its pod",
        )
        (rs,) = world.list(
            "replicasets.apps", namespace, f"kvgate.io/revision={rev},kvgate.io/role=prefill"
        )
        assert_denied(
            t.kubectl(
                "patch", "replicaset", rs["metadata"]["name"], "-p", '{"spec": {"replicas": 3}}'
            ),
            "managed-objects",
            f"ReplicaSet {rs['metadata']['name']} {managed}",
        )
        # Point the <md> Service at other pods.
        assert_denied(
            t.kubectl("patch", "service", MD, "-p", '{"spec": {"selector": {"app": "mine"}}}'),
            "managed-objects",
            f"Service {MD} {managed}",
        )
        # The tenant's own Deployment whose pods would carry the serving revision's labels (and
        # the gate, so the pod policy alone would let its ReplicaSet create them).
        own = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "lookalike"},
            "spec": {
                "replicas": 1,
                "selector": template["spec"]["selector"],
                "template": template["spec"]["template"],
            },
        }
        assert_denied(t.create(own), "managed-objects", f"Deployment lookalike {managed}")
        # A Service claiming the ModelDeployment as its controller (ownership is by reference).
        forged = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": f"{MD}-copy", "ownerReferences": [md_owner]},
            "spec": {"selector": {"app": "mine"}, "ports": [{"port": 80}]},
        }
        assert_denied(t.create(forged), "managed-objects", f"Service {MD}-copy {managed}")
    live = world.get("deployment", prefill, namespace)
    assert live is not None and live["spec"]["template"] == template["spec"]["template"]
    service = world.get("service", MD, namespace)
    assert service is not None and service["spec"]["selector"]["kvgate.io/revision"] == rev
    assert world.get("deployment", "lookalike", namespace) is None


def test_scaling_a_kvgate_deployment_is_admitted_and_the_operator_scales_it_back(
    world: World, namespace: str
) -> None:
    """The Scale subresource carries no labels, so no policy can single out kvgate's
    Deployments; extra pods are gated like any other and the operator restores the spec's count."""
    s = serve(world, namespace)
    router = f"{MD}-{s.revision}-router"
    with InvariantSampler(world.cluster, namespace, name="scale"):
        scaled = s.tenant.kubectl("scale", f"deployment/{router}", "--replicas=3")
        assert scaled.returncode == 0, scaled.stderr

        def restored() -> bool:
            d = world.get("deployment", router, namespace)
            return d is not None and d["spec"]["replicas"] == 1

        deadline_loop("the operator to scale the router back to 1", restored, PASS_DEADLINE)
    md = world.get_md(MD, namespace)
    assert md is not None and is_ready(md)


def test_admission_policies_are_installed_bound_and_type_check_cleanly(world: World) -> None:
    """The chart's three pod and object policies and their bindings exist, and the API server's
    type checking of their CEL against the Pod, Deployment, ... schemas found nothing to warn
    about (the address and key policies: test_attack_tenant_addresses.py)."""
    for policy in ("pod-creation", "pod-metadata", "managed-objects"):
        binding = assert_bound_and_type_checked(world, policy)
        assert binding["spec"]["validationActions"] == ["Deny"]


def test_the_edit_role_cannot_write_what_the_gate_relies_on(world: World, namespace: str) -> None:
    """What the policies leave to RBAC, checked on the built-in ``edit`` role as this API server
    ships it: a namespace editor cannot set a pod's conditions (the gate), write endpoints
    behind a Service, impersonate the operator or the controllers, or add ephemeral containers;
    it can apply ModelDeployments (the chart's aggregated roles)."""
    tenant = make_tenant(world, namespace)

    def can_i(*args: str) -> str:
        return str(tenant.kubectl("auth", "can-i", *args).stdout.strip())

    assert can_i("patch", "pods", "--subresource=status") == "no"
    assert can_i("create", "endpointslices.discovery.k8s.io") == "no"
    assert can_i("update", "endpoints") == "no"
    # `edit` may impersonate the ServiceAccounts of its own namespace, never the operator's or
    # the controllers' (install kvgate in a namespace no tenant edits).
    assert can_i("impersonate", "serviceaccounts") == "yes"
    for ns, account in (("kvgate-system", "kvgate"), ("kube-system", "replicaset-controller")):
        assert can_i("impersonate", f"serviceaccounts/{account}", f"--namespace={ns}") == "no"
    assert can_i("update", "pods", "--subresource=ephemeralcontainers") == "no"
    assert can_i("create", "modeldeployments.kvgate.io") == "yes"
    assert can_i("patch", "deployments.apps") == "yes"  # hence the managed-objects policy
    assert can_i("create", "pods", "--subresource=exec") == "yes"  # see the threat model
