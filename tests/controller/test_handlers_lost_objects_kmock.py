"""A Ready ModelDeployment loses a derived object (its Service, its serving router Deployment)
and is then updated to a revision that is refused: what kvgate sends to the API server (kmock).

The planner's table tests cover every combination; these prove the handler reads the durable
record from the status, writes the Service back and never deletes the serving revision.
"""

from __future__ import annotations

from typing import Any

import kmock
import pytest
from factories.kmock_world import NS, requests
from factories.model_deployments import make_md, md_doc
from kvgate.api import labels
from kvgate.api.revision import revision_of
from kvgate.controller.modeldeployment import Reconciler
from kvgate.controller.runtime import Runtime
from kvgate.objects import builders

OLD_SPEC: dict[str, Any] = {}
NEW_SPEC: dict[str, Any] = {"model__contextLength": 65_536}
UNSAFE = (
    "decode pod llama-{rev}-decode-x2 reports KV pool 16,731 tokens < context length 65,536 × "
    "headroom 1.0"
)


def _resource(km: kmock.KubernetesEmulator, kind: str) -> Any:
    return {
        "Deployment": km.resource("apps", "v1", "deployments"),
        "Pod": km.resource("", "v1", "pods"),
        "Service": km.resource("", "v1", "services"),
        "ModelDeployment": km.resource("kvgate.io", "v1alpha1", "modeldeployments"),
    }[kind]


def _pod(rev: str, role: str, gate: dict[str, str]) -> dict[str, Any]:
    deployment = builders.component_name("llama", rev, role)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"llama-{rev}-{role}-x2",
            "namespace": NS,
            "uid": f"pod-{rev}-{role}",
            "labels": builders.object_labels("llama", rev, role),
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{deployment}-7f",
                    "uid": f"rs-{rev}-{role}",
                    "controller": True,
                }
            ],
        },
        "status": {
            "conditions": [
                {"type": "Ready", "status": gate["status"]},
                {"type": labels.ENGINE_VERIFIED, **gate},
            ]
        },
    }


VERIFIED = {"status": "True", "reason": "EngineVerified", "message": "ok"}


def put_running_revision(
    km: kmock.KubernetesEmulator, spec: dict[str, Any], *, router: bool = True
) -> str:
    """A revision's Deployments (router Ready) and verified engine pods, as the cluster holds
    them once it serves."""
    md = make_md(**spec)
    rev = revision_of(md.spec)
    for component in builders.COMPONENTS:
        if component == labels.ROLE_ROUTER and not router:
            continue
        dep = builders.deployment(md, rev, component, replicas=1)
        dep["status"] = {"readyReplicas": 1}
        km.objects[_resource(km, "Deployment"), NS, dep["metadata"]["name"]] = dep
    for role in ("prefill", "decode"):
        pod = _pod(rev, role, VERIFIED)
        km.objects[_resource(km, "Pod"), NS, pod["metadata"]["name"]] = pod
    return rev


def put_md(km: kmock.KubernetesEmulator, spec: dict[str, Any], status: dict[str, Any]) -> None:
    doc = md_doc(**spec)
    doc["metadata"]["namespace"] = NS
    doc["status"] = status
    km.objects[_resource(km, "ModelDeployment"), NS, "llama"] = doc


def served(rev: str) -> dict[str, Any]:
    """The status kvgate wrote while ``rev`` served (the fields the next pass reads back)."""
    return {
        "servingRevision": rev,
        "targetRevision": rev,
        "rollout": {"verifyStartedAt": "2026-11-05T07:00:00Z"},
    }


def deletes(km: kmock.KubernetesEmulator) -> list[str]:
    return [str(r.url.path).rsplit("/", 1)[-1] for r in requests(km, "DELETE")]


def events(km: kmock.KubernetesEmulator, reason: str) -> list[dict[str, Any]]:
    return [r.data for r in requests(km, "POST", "/events") if r.data["reason"] == reason]


@pytest.mark.usefixtures("kmock")
async def test_lost_service_then_refused_update_recreates_the_service_for_the_old_revision(
    kmock: kmock.KubernetesEmulator,
    rt: Runtime,
) -> None:
    old = put_running_revision(kmock, OLD_SPEC)
    # `kubectl delete service llama` happened; then the spec moves to a new revision.
    put_md(kmock, NEW_SPEC, served(old))
    new = revision_of(make_md(**NEW_SPEC).spec)
    reconciler = Reconciler(rt, NS, "llama")

    step = await reconciler.reconcile()
    assert step is not None and step.serving_revision == old and step.target_revision == new
    assert deletes(kmock) == []
    (svc,) = [r.data for r in requests(kmock, "POST") if r.data["kind"] == "Service"]
    assert svc["spec"]["selector"][labels.REVISION] == old
    (recreated,) = events(kmock, "ServiceRecreated")
    assert recreated["type"] == "Warning"
    assert f"recreated it selecting revision {old}'s routers" in recreated["message"]
    assert "recorded in status.servingRevision" in recreated["message"]

    # The new revision's decode engine reports a pool below the context: refused.
    status = requests(kmock, "PATCH", "/status")[-1].data["status"]
    kmock.objects[_resource(kmock, "ModelDeployment"), NS, "llama"].patch({"status": status})
    unsafe = _pod(
        new,
        "decode",
        {"status": "False", "reason": "KvPoolTooSmall", "message": UNSAFE.format(rev=new)},
    )
    kmock.objects[_resource(kmock, "Pod"), NS, unsafe["metadata"]["name"]] = unsafe
    step = await reconciler.reconcile()
    assert step is not None and step.refusal is not None and step.serving_revision == old
    assert deletes(kmock) == []
    assert len(events(kmock, "ServiceRecreated")) == 1  # on the transition only
    status = requests(kmock, "PATCH", "/status")[-1].data["status"]
    assert status["servingRevision"] == old
    assert status["rollout"]["refusal"]["reason"] == "EngineUnsafe"
    for component in builders.COMPONENTS:
        assert await rt.api.get("Deployment", NS, f"llama-{old}-{component}") is not None


@pytest.mark.usefixtures("kmock")
async def test_lost_router_of_the_serving_revision_is_rebuilt_without_the_targets_notes(
    kmock: kmock.KubernetesEmulator,
    rt: Runtime,
) -> None:
    old = put_running_revision(kmock, OLD_SPEC, router=False)  # router Deployment deleted
    new = revision_of(make_md(**NEW_SPEC).spec)
    refused = {"reason": "EngineUnsafe", "message": UNSAFE.format(rev=new)}
    status = {**served(old), "targetRevision": new}
    status["rollout"] = {"verifyStartedAt": "2026-11-05T11:00:00Z", "refusal": refused}
    put_md(kmock, NEW_SPEC, status)
    # The refused revision, scaled down; its refusal annotations were stripped.
    new_md = make_md(**NEW_SPEC)
    for component in builders.COMPONENTS:
        dep = builders.deployment(new_md, new, component, replicas=0)
        kmock.objects[_resource(kmock, "Deployment"), NS, dep["metadata"]["name"]] = dep
    service = builders.service(make_md(), old)
    kmock.objects[_resource(kmock, "Service"), NS, "llama"] = service

    step = await Reconciler(rt, NS, "llama").reconcile()
    assert step is not None and step.refusal is not None and not step.new_refusal
    posted = {r.data["metadata"].get("name"): r.data for r in requests(kmock, "POST")}
    router = posted[f"llama-{old}-router"]
    assert router["metadata"]["labels"][labels.REVISION] == old
    notes = router["metadata"]["annotations"]
    assert labels.REFUSED_REASON not in notes and labels.VERIFY_STARTED_AT not in notes
    assert deletes(kmock) == []
    assert [r for r in requests(kmock, "PATCH") if "/services/" in str(r.url.path)] == []
    (event,) = events(kmock, "ServingDeploymentRecreated")
    assert f"router Deployment of serving revision {old} was missing" in event["message"]
