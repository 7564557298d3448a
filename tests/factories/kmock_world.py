"""The kmock API emulator as the operator's handlers meet it: the resources kvgate reads and
writes, a ModelDeployment with its ownership chain, its engine pods, and the requests kvgate sent.

Plain functions of a ``kmock.KubernetesEmulator``; the fixtures built on them (``rt``,
``revision_chain``) are in tests/factories/kmock_runtime.py.
"""

from __future__ import annotations

from typing import Any

import kmock
from kvgate.api import labels
from kvgate.api.revision import revision_of
from kvgate.controller import content_check
from kvgate.controller.modeldeployment import Reconciler
from kvgate.controller.runtime import Runtime
from kvgate.objects import builders

from factories.model_deployments import make_md, md_doc

NS = "models"
VERBS = ["get", "list", "watch", "create", "patch", "update", "delete"]
RESOURCES = {
    "v1/pods": {"kind": "Pod", "subresources": ["status"]},
    "v1/services": {"kind": "Service"},
    "v1/secrets": {"kind": "Secret"},
    "v1/serviceaccounts": {"kind": "ServiceAccount"},
    "v1/events": {"kind": "Event"},
    "apps/v1/deployments": {"kind": "Deployment", "subresources": ["status"]},
    "apps/v1/replicasets": {"kind": "ReplicaSet"},
    "rbac.authorization.k8s.io/v1/roles": {"kind": "Role"},
    "rbac.authorization.k8s.io/v1/rolebindings": {"kind": "RoleBinding"},
    "kvgate.io/v1alpha1/modeldeployments": {"kind": "ModelDeployment", "subresources": ["status"]},
}


def declare_resources(km: kmock.KubernetesEmulator) -> None:
    for resource, info in RESOURCES.items():
        km.resources[resource] = {"namespaced": True, "verbs": VERBS, **info}


def requests(km: kmock.KubernetesEmulator, method: str, path_suffix: str = "") -> list[Any]:
    return [r for r in km if r.method.value == method and str(r.url.path).endswith(path_suffix)]


def controller_ref(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


def put_revision_chain(km: kmock.KubernetesEmulator) -> None:
    """The ModelDeployment, its revision Deployments and their ReplicaSets, as the API server
    holds them: an engine pod is verified only through this ownership chain."""
    declare_resources(km)
    doc = md_doc(model__contextLength=131_072)
    doc["metadata"]["namespace"] = NS
    km.objects[km.resource("kvgate.io", "v1alpha1", "modeldeployments"), NS, "llama"] = doc
    md = make_md(model__contextLength=131_072)
    rev = revision_of(md.spec)
    for role in ("prefill", "decode"):
        put_deployment_and_replica_set(km, builders.deployment(md, rev, role, replicas=1), role)


def put_deployment_and_replica_set(
    km: kmock.KubernetesEmulator, deployment: dict[str, Any], role: str
) -> None:
    """A revision Deployment (uid ``dep-<role>``) and its ReplicaSet ``<name>-7f`` (uid
    ``rs-<role>``), the chain an engine pod of that role is proven through."""
    name = deployment["metadata"]["name"]
    deployment["metadata"]["uid"] = f"dep-{role}"
    km.objects[km.resource("apps", "v1", "deployments"), NS, name] = deployment
    rs = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": f"{name}-7f",
            "namespace": NS,
            "uid": f"rs-{role}",
            "ownerReferences": [controller_ref("Deployment", name, f"dep-{role}")],
        },
    }
    km.objects[km.resource("apps", "v1", "replicasets"), NS, f"{name}-7f"] = rs


def engine_pod(port: int, *, role: str = "decode", ready: bool = True) -> dict[str, Any]:
    md = make_md(model__contextLength=131_072)
    rev = revision_of(md.spec)
    template = builders.deployment(md, rev, role, replicas=1)["spec"]["template"]
    template["spec"]["containers"][0]["ports"][0]["containerPort"] = port
    name = builders.component_name("llama", rev, role)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "name": f"llama-{rev}-{role}-x2",
            "namespace": NS,
            "uid": "pod-uid-1",
            "ownerReferences": [controller_ref("ReplicaSet", f"{name}-7f", f"rs-{role}")],
        },
        "spec": template["spec"],
        "status": {
            "podIP": "127.0.0.1",
            "containerStatuses": [{"name": "engine", "ready": ready, "restartCount": 0}],
            "conditions": [{"type": "ContainersReady", "status": "True" if ready else "False"}],
        },
    }


def put_md(km: kmock.KubernetesEmulator, **spec: Any) -> dict[str, Any]:
    doc = md_doc(**spec)
    doc["metadata"]["namespace"] = NS
    km.objects[km.resource("kvgate.io", "v1alpha1", "modeldeployments"), NS, "llama"] = doc
    return doc


def foreign(kind: str, api: str, name: str, **extra: Any) -> dict[str, Any]:
    """An object kvgate did not create (no owner, no kvgate labels), as a tenant would."""
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": NS}, **extra}


def verified_pods() -> list[dict[str, Any]]:
    """The prefill and decode engine pods, Ready and with their gate True."""
    out = []
    for role in ("prefill", "decode"):
        pod = engine_pod(30000, role=role)
        pod["metadata"]["uid"] = f"uid-{role}"
        pod["status"]["conditions"] = [
            {"type": "Ready", "status": "True"},
            {"type": labels.ENGINE_VERIFIED, "status": "True", "reason": "EngineVerified"},
        ]
        out.append(pod)
    return out


def router_ready(km: kmock.KubernetesEmulator, rev: str) -> None:
    deployments = km.resource("apps", "v1", "deployments")
    km.objects[deployments, NS, f"llama-{rev}-router"].patch({"status": {"readyReplicas": 1}})


async def content_check_ran(reconciler: Reconciler, rt: Runtime) -> None:
    """A pass that starts the target's content check (a task of its own), then the check's end:
    the next pass reads its verdict, records it and acts on it."""
    await reconciler.reconcile()
    await content_check.idle(rt)
