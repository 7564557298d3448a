"""The router's access objects against the kmock API emulator: the control-plane key Secret,
and the ServiceAccount, Role and RoleBinding whose watch events (kvgate.controller.deployments)
make the next pass restore them.
"""

from __future__ import annotations

import json
from typing import Any

import kmock
from factories.kmock_world import (
    NS,
    foreign,
    put_md,
    requests,
)
from factories.model_deployments import MD_UID, make_md
from kvgate.api.revision import revision_of
from kvgate.controller import deployments
from kvgate.controller.modeldeployment import Reconciler
from kvgate.controller.runtime import Runtime


async def test_a_router_key_secret_kvgate_did_not_write_runs_no_router_and_says_why(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    """A tenant created Secret llama-router-control (before the ModelDeployment, or after
    deleting kvgate's): a router started on it would take their key on its worker API."""
    put_md(kmock)
    rev = revision_of(make_md().spec)
    theirs = foreign("Secret", "v1", "llama-router-control", data={"admin-key": "dGVuYW50"})
    kmock.objects[kmock.resource("", "v1", "secrets"), NS, "llama-router-control"] = theirs
    await Reconciler(rt, NS, "llama").reconcile()
    posted = {
        (r.data["kind"], r.data["metadata"].get("name")): r.data for r in requests(kmock, "POST")
    }
    assert posted[("Deployment", f"llama-{rev}-router")]["spec"]["replicas"] == 0
    assert posted[("Deployment", f"llama-{rev}-decode")]["spec"]["replicas"] == 1
    secret = kmock.objects[kmock.resource("", "v1", "secrets"), NS, "llama-router-control"]
    assert secret["data"] == {"admin-key": "dGVuYW50"}  # never adopted or overwritten
    status = requests(kmock, "PATCH", "/status")[-1].data["status"]
    conds = {c["type"]: c for c in status["conditions"]}
    for kind, value in (("Ready", "False"), ("Degraded", "True")):
        assert conds[kind]["status"] == value and conds[kind]["reason"] == "Conflict"
        assert (
            "Secret llama-router-control already exists and kvgate does not own it"
            in conds[kind]["message"]
        )
        assert "every router of this ModelDeployment at 0 replicas" in conds[kind]["message"]


async def test_router_gets_its_control_plane_key_from_an_owned_secret(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    import base64

    from kvgate.objects import router_auth

    put_md(kmock)
    rev = revision_of(make_md().spec)
    await Reconciler(rt, NS, "llama").reconcile()
    posted = {
        (r.data["kind"], r.data["metadata"].get("name")): r.data for r in requests(kmock, "POST")
    }
    secret = posted[("Secret", "llama-router-control")]
    key = base64.b64decode(secret["data"]["admin-key"]).decode()
    assert key == router_auth.control_key(rt.settings.router_key_seed, NS, "llama", MD_UID)
    assert secret["metadata"]["ownerReferences"][0]["uid"] == MD_UID
    router = posted[("Deployment", f"llama-{rev}-router")]
    container = router["spec"]["template"]["spec"]["containers"][0]
    assert "--control-plane-api-keys" in container["args"]
    assert key not in json.dumps(router)  # only a secretKeyRef and a one-way fingerprint


async def test_an_edited_router_role_is_restored_on_the_pass_its_watch_event_wakes(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock)
    reconciler = Reconciler(rt, NS, "llama")
    await reconciler.reconcile()
    roles = kmock.resource("rbac.authorization.k8s.io", "v1", "roles")
    kmock.objects[roles, NS, "llama-router"].patch({"rules": []})  # a tenant's edit
    # What the Role watch (kvgate.controller.main, label-filtered) delivers for that edit.
    role = dict(kmock.objects[roles, NS, "llama-router"])
    deployments.on_router_access_event(rt, "MODIFIED", role)
    assert rt.md_wake((NS, "llama")).is_set()
    await reconciler.reconcile()
    (restore,) = [r for r in requests(kmock, "PATCH") if "/roles/llama-router" in str(r.url.path)]
    assert restore.data["rules"][0]["resources"] == ["pods"]


async def test_a_pass_no_access_event_woke_reads_the_key_secret_but_not_the_watched_objects(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    """The router's ServiceAccount, Role, RoleBinding and the NetworkPolicies are watched: a
    pass woken by pods or Deployments, or by the ADDED echo of its own creations, does not GET
    them again (kvgate.rollout.access_checks); the key Secret is not watched and is read every
    pass."""
    put_md(kmock)
    reconciler = Reconciler(rt, NS, "llama")
    await reconciler.reconcile()
    roles = kmock.resource("rbac.authorization.k8s.io", "v1", "roles")
    deployments.on_router_access_event(rt, "ADDED", dict(kmock.objects[roles, NS, "llama-router"]))
    before = len(list(kmock))
    await reconciler.reconcile()
    read = sorted(
        str(r.url.path).rsplit("/", 2)[-2]
        for r in list(kmock)[before:]
        if r.method.value == "GET" and "/llama-router" in str(r.url.path)
    )
    assert read == ["secrets"]


async def test_deleted_router_rbac_and_key_secret_come_back_on_the_next_pass(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock)
    reconciler = Reconciler(rt, NS, "llama")
    await reconciler.reconcile()
    lost = {
        ("ServiceAccount", "llama-router"): kmock.resource("", "v1", "serviceaccounts"),
        ("Role", "llama-router"): kmock.resource("rbac.authorization.k8s.io", "v1", "roles"),
        ("RoleBinding", "llama-router"): kmock.resource(
            "rbac.authorization.k8s.io", "v1", "rolebindings"
        ),
        ("Secret", "llama-router-control"): kmock.resource("", "v1", "secrets"),
    }
    for (kind, name), resource in lost.items():
        body = dict(kmock.objects[resource, NS, name])
        del kmock.objects[resource, NS, name]  # e.g. a tenant's kubectl delete
        if kind != "Secret":  # watched: the DELETED event marks and wakes the ModelDeployment
            deployments.on_router_access_event(rt, "DELETED", body)
    before = len(requests(kmock, "POST"))
    await reconciler.reconcile()  # the same operator process: nothing cached survives the loss
    recreated = {
        (r.data["kind"], r.data["metadata"]["name"]) for r in requests(kmock, "POST")[before:]
    }
    assert set(lost) <= recreated
    for (_, name), resource in lost.items():
        assert kmock.objects[resource, NS, name]["metadata"]["ownerReferences"][0]["uid"] == MD_UID
    # Converged: the next pass (no watch event about them) reads only the key Secret, which
    # is not watched, and writes none of them.
    before = len(list(kmock))
    await reconciler.reconcile()
    touched = [
        (r.method.value, str(r.url.path).rsplit("/", 2)[-2])
        for r in list(kmock)[before:]
        if "/llama-router" in str(r.url.path)
        or (isinstance(r.data, dict) and (r.data.get("kind"), _key_of(r.data)) in lost)
    ]
    assert touched == [("GET", "secrets")], touched


def _key_of(body: dict[str, Any]) -> str | None:
    return (body.get("metadata") or {}).get("name")
