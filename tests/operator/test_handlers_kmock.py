"""Handlers against the kmock API emulator: the exact PATCH content types and bodies kvgate sends.

A real (tiny) SGLang-shaped engine runs on 127.0.0.1 and the real probe reads it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from datetime import timedelta
from typing import Any

import kmock
import pytest
from fake_engine import FakeEngine, running
from kvgate.api import labels
from kvgate.api.revision import revision_of
from kvgate.build import builders
from kvgate.controller import content_check, deployments, engine_pods
from kvgate.controller.main import make_verify
from kvgate.controller.modeldeployment import Reconciler, on_md_event
from kvgate.controller.runtime import Runtime
from kvgate.kube import metrics
from kvgate.kube.informer import Reflector, Watched, per_namespace
from kvgate.kube.k8s import ApiError, Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings
from kvgate.verify import pod_view
from kvgate.verify.content_probe import REASON_FAILED, REASON_PASSED, ContentVerdict
from operator_factories import MD_UID, NOW, make_md, md_doc

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


@pytest.fixture
async def rt(kmock: kmock.KubernetesEmulator) -> AsyncIterator[Runtime]:
    declare_resources(kmock)
    api = KubeApi(Credentials(server=str(kmock.url).rstrip("/")))
    settings = OperatorSettings(probe_timeout_seconds=2.0)
    runtime = Runtime(api=api, settings=settings, verify=make_verify(settings), clock=lambda: NOW)
    yield runtime
    await runtime.shutdown()
    await api.close()


def requests(km: kmock.KubernetesEmulator, method: str, path_suffix: str = "") -> list[Any]:
    return [r for r in km if r.method.value == method and str(r.url.path).endswith(path_suffix)]


def _controller(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


@pytest.fixture
def revision_chain(kmock: kmock.KubernetesEmulator) -> None:
    """The ModelDeployment, its revision Deployments and their ReplicaSets, as the API server
    holds them: an engine pod is verified only through this ownership chain."""
    declare_resources(kmock)
    doc = md_doc(model__contextLength=131_072)
    doc["metadata"]["namespace"] = NS
    kmock.objects[kmock.resource("kvgate.io", "v1alpha1", "modeldeployments"), NS, "llama"] = doc
    md = make_md(model__contextLength=131_072)
    rev = revision_of(md.spec)
    for role in ("prefill", "decode"):
        dep = builders.deployment(md, rev, role, replicas=1)
        name = dep["metadata"]["name"]
        dep["metadata"]["uid"] = f"dep-{role}"
        kmock.objects[kmock.resource("apps", "v1", "deployments"), NS, name] = dep
        rs = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": f"{name}-7f",
                "namespace": NS,
                "uid": f"rs-{role}",
                "ownerReferences": [_controller("Deployment", name, f"dep-{role}")],
            },
        }
        kmock.objects[kmock.resource("apps", "v1", "replicasets"), NS, f"{name}-7f"] = rs


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
            "ownerReferences": [_controller("ReplicaSet", f"{name}-7f", f"rs-{role}")],
        },
        "spec": template["spec"],
        "status": {
            "podIP": "127.0.0.1",
            "containerStatuses": [{"name": "engine", "ready": ready, "restartCount": 0}],
            "conditions": [{"type": "ContainersReady", "status": "True" if ready else "False"}],
        },
    }


@pytest.mark.usefixtures("revision_chain")
async def test_verified_pod_gets_a_strategic_merge_status_patch_with_uid_precondition(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
        pod = engine_pod(engine.port)
        kmock.objects[kmock.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
        await engine_pods.check_pod(rt, pod)
    (patch,) = requests(kmock, "PATCH", "/status")
    assert str(patch.url.path) == f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}/status"
    assert patch.headers["Content-Type"] == "application/strategic-merge-patch+json"
    assert patch.data == {
        "metadata": {"uid": "pod-uid-1"},
        "status": {
            "conditions": [
                {
                    "type": "kvgate.io/engine-verified",
                    "status": "True",
                    "reason": "EngineVerified",
                    "message": f"decode pod {pod['metadata']['name']} reports KV pool 200,000 "
                    "tokens ≥ context length 131,072 × headroom 1.0",
                    "lastTransitionTime": "2026-11-05T12:00:00Z",
                }
            ]
        },
    }


@pytest.mark.usefixtures("revision_chain")
async def test_unchanged_verdict_sends_no_patch(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
        pod = engine_pod(engine.port)
        kmock.objects[kmock.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
        await engine_pods.check_pod(rt, pod)
        await engine_pods.check_pod(rt, pod)
    assert len(requests(kmock, "PATCH")) == 1


@pytest.mark.usefixtures("revision_chain")
async def test_shrunken_pool_turns_the_gate_false_with_events_on_pod_and_deployment(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
        pod = engine_pod(engine.port)
        kmock.objects[kmock.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
        await engine_pods.check_pod(rt, pod)
        engine.kv_pool_tokens = 68_128
        rt.clock = lambda: NOW + timedelta(seconds=30)
        await engine_pods.check_pod(rt, pod)
    patches = requests(kmock, "PATCH", "/status")
    assert len(patches) == 2
    (cond,) = patches[1].data["status"]["conditions"]
    assert cond["status"] == "False" and cond["reason"] == "KvPoolTooSmall"
    assert cond["lastTransitionTime"] == "2026-11-05T12:00:30Z"
    assert "KV pool 68,128 tokens < context length 131,072 × headroom 1.0" in cond["message"]
    events = [r.data for r in requests(kmock, "POST", "/events")]
    assert {(e["involvedObject"]["kind"], e["reason"], e["type"]) for e in events} == {
        ("Pod", "EngineVerificationLost", "Warning"),
        ("ModelDeployment", "EngineVerificationLost", "Warning"),
    }
    # kubectl describe md matches Events by uid: the ModelDeployment's Event carries it.
    (md_event,) = [e for e in events if e["involvedObject"]["kind"] == "ModelDeployment"]
    assert md_event["involvedObject"]["uid"] == MD_UID


@pytest.mark.usefixtures("revision_chain")
async def test_terminating_pod_leaves_traffic_without_a_lost_verification_warning(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
        pod = engine_pod(engine.port)
        kmock.objects[kmock.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
        await engine_pods.check_pod(rt, pod)
    # Deleted: the kubelet stopped the engine container.
    pod["metadata"]["deletionTimestamp"] = "2026-11-05T12:00:20Z"
    pod["status"]["containerStatuses"][0]["ready"] = False
    cond = await engine_pods.check_pod(rt, pod)
    assert cond is not None and cond["status"] == "False"
    assert len(requests(kmock, "PATCH", "/status")) == 2
    assert requests(kmock, "POST", "/events") == []


@pytest.mark.usefixtures("revision_chain")
async def test_engine_restarted_with_a_small_pool_reports_its_numbers_on_pod_and_deployment(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
        pod = engine_pod(engine.port)
        kmock.objects[kmock.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
        await engine_pods.check_pod(rt, pod)
        pod["status"]["containerStatuses"][0].update(ready=False, restartCount=1)
        await engine_pods.check_pod(rt, pod)  # engine down: verification lost
        engine.kv_pool_tokens = 16_731
        pod["status"]["containerStatuses"][0]["ready"] = True
        cond = await engine_pods.check_pod(rt, pod)
    assert cond is not None and cond["reason"] == "KvPoolTooSmall"
    unsafe = [
        r.data for r in requests(kmock, "POST", "/events") if r.data["reason"] == "KvPoolTooSmall"
    ]
    assert {e["involvedObject"]["kind"] for e in unsafe} == {"Pod", "ModelDeployment"}
    assert all("KV pool 16,731 tokens < context length 131,072" in e["message"] for e in unsafe)


@pytest.mark.usefixtures("revision_chain")
async def test_unreachable_engine_is_never_verified(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
        port = engine.port
    pod = engine_pod(port)  # the engine is gone: connection refused
    kmock.objects[kmock.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
    cond = await engine_pods.check_pod(rt, pod)
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "EngineUnreachable"


def put_md(km: kmock.KubernetesEmulator, **spec: Any) -> dict[str, Any]:
    doc = md_doc(**spec)
    doc["metadata"]["namespace"] = NS
    km.objects[km.resource("kvgate.io", "v1alpha1", "modeldeployments"), NS, "llama"] = doc
    return doc


async def test_first_reconcile_creates_the_revision_and_writes_status_as_a_merge_patch(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    doc = put_md(kmock)
    rev = revision_of(make_md().spec)
    await Reconciler(rt, NS, "llama").reconcile()
    created = {(r.data["kind"], r.data["metadata"].get("name")) for r in requests(kmock, "POST")}
    assert {
        ("ServiceAccount", "llama-router"),
        ("Role", "llama-router"),
        ("RoleBinding", "llama-router"),
        ("Deployment", f"llama-{rev}-prefill"),
        ("Deployment", f"llama-{rev}-decode"),
        ("Deployment", f"llama-{rev}-router"),
    } <= created
    assert ("Service", "llama") not in created  # nothing is verified: nothing serves
    (patch,) = requests(kmock, "PATCH", "/status")
    assert (
        str(patch.url.path)
        == f"/apis/kvgate.io/v1alpha1/namespaces/{NS}/modeldeployments/llama/status"
    )
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    status = patch.data["status"]
    assert set(patch.data) == {"status"}
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready == {
        "type": "Ready",
        "status": "False",
        "observedGeneration": doc["metadata"]["generation"],
        "lastTransitionTime": "2026-11-05T12:00:00Z",
        "reason": "AwaitingVerification",
        "message": f"revision {rev} verifying: prefill 0/1 verified, decode 0/1 verified; "
        "nothing serves",
    }
    assert status["targetRevision"] == rev and status["servingRevision"] is None
    deployment = next(
        r.data for r in requests(kmock, "POST") if r.data["metadata"]["name"].endswith("-decode")
    )
    assert deployment["metadata"]["annotations"][labels.VERIFY_STARTED_AT] == "2026-11-05T12:00:00Z"


async def test_the_first_pass_creates_the_router_role_binding_once_its_role_exists(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server resolves a RoleBinding's roleRef when it is created: 404 while the Role
    is not there yet (every new ModelDeployment's first pass failed on it)."""
    put_md(kmock)
    create = rt.api.create
    roles = kmock.resource("rbac.authorization.k8s.io", "v1", "roles")

    async def like_the_api_server(body: dict[str, Any]) -> dict[str, Any] | None:
        if body["kind"] == "Role":
            await asyncio.sleep(0.05)  # the Role's write takes a while
        if body["kind"] == "RoleBinding":
            role = body["roleRef"]["name"]
            if (roles, NS, role) not in kmock.objects:
                path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings"
                raise ApiError(404, "POST", path, f'rolebindings "{role}" not found')
        return await create(body)

    monkeypatch.setattr(rt.api, "create", like_the_api_server)
    step = await Reconciler(rt, NS, "llama").reconcile()
    assert step is not None
    kinds = [r.data["kind"] for r in requests(kmock, "POST")]
    assert kinds.index("Role") < kinds.index("RoleBinding")
    assert requests(kmock, "PATCH", "/status")  # the pass went on to write its status


async def _first_pass_with_a_passing_content_check(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> tuple[Reconciler, str]:
    async def content_check_passes(*_: Any) -> ContentVerdict:
        return ContentVerdict(True, REASON_PASSED, "content check passed", ())

    monkeypatch.setattr(content_check, "run_content_check", content_check_passes)
    put_md(kmock)
    reconciler = Reconciler(rt, NS, "llama")
    await reconciler.reconcile()
    return reconciler, revision_of(make_md().spec)


@pytest.mark.usefixtures("revision_chain")
async def test_revision_serves_once_verified_and_an_unchanged_status_is_not_rewritten(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    reconciler, rev = await _first_pass_with_a_passing_content_check(kmock, rt, monkeypatch)
    # The cluster moves on: both engines verified, the router Ready.
    deployments = kmock.resource("apps", "v1", "deployments")
    kmock.objects[deployments, NS, f"llama-{rev}-router"].patch({"status": {"readyReplicas": 1}})
    pods = kmock.resource("", "v1", "pods")
    for role in ("prefill", "decode"):
        pod = engine_pod(30000, role=role)
        pod["metadata"]["uid"] = f"uid-{role}"
        pod["status"]["conditions"] = [
            {"type": "Ready", "status": "True"},
            {
                "type": labels.ENGINE_VERIFIED,
                "status": "True",
                "reason": "EngineVerified",
                "message": "ok",
            },
        ]
        kmock.objects[pods, NS, pod["metadata"]["name"]] = pod
    # The status written by the first pass, as the API server would now hold it.
    first_status = requests(kmock, "PATCH", "/status")[0].data["status"]
    mds = kmock.resource("kvgate.io", "v1alpha1", "modeldeployments")
    kmock.objects[mds, NS, "llama"].patch({"status": first_status})

    step = await reconciler.reconcile()
    assert step is not None and step.serving_revision == rev
    svc = next(r.data for r in requests(kmock, "POST") if r.data["kind"] == "Service")
    assert svc["spec"]["selector"][labels.REVISION] == rev
    second_status = requests(kmock, "PATCH", "/status")[-1].data["status"]
    ready = next(c for c in second_status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True" and ready["reason"] == "RevisionServing"
    events = [r.data["reason"] for r in requests(kmock, "POST", "/events")]
    assert events.count("RevisionServing") == 1
    assert events.count(REASON_PASSED) == 1
    assert [c["revision"] for c in second_status["contentChecks"]] == [rev]

    kmock.objects[mds, NS, "llama"].patch({"status": second_status})
    kmock.objects[kmock.resource("", "v1", "services"), NS, "llama"] = svc
    before = len(requests(kmock, "PATCH"))
    await reconciler.reconcile()
    assert len(requests(kmock, "PATCH")) == before  # nothing changed: nothing written


async def test_restarted_operator_refuses_a_stalled_rollout_from_cluster_state_alone(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock, rollout__verifyTimeoutSeconds=60)
    await Reconciler(rt, NS, "llama").reconcile()
    rev = revision_of(make_md().spec)
    # A new operator process: fresh memory, 61 s later.
    fresh = Runtime(
        api=rt.api,
        settings=rt.settings,
        verify=rt.verify,
        clock=lambda: NOW + timedelta(seconds=61),
    )
    step = await Reconciler(fresh, NS, "llama").reconcile()
    assert step is not None and step.refusal is not None
    assert step.refusal.reason == "VerificationTimeout"
    scaled = [r for r in requests(kmock, "PATCH") if f"llama-{rev}-" in str(r.url.path)]
    assert scaled and all(
        r.headers["Content-Type"] == "application/merge-patch+json" for r in scaled
    )
    decode = next(r.data for r in scaled if str(r.url.path).endswith("-decode"))
    assert decode["spec"]["replicas"] == 0
    assert decode["metadata"]["annotations"][labels.REFUSED_REASON] == "VerificationTimeout"
    warning = next(
        r.data for r in requests(kmock, "POST", "/events") if r.data["reason"] == "RolloutRefused"
    )
    assert "rollout.verifyTimeoutSeconds=60 s" in warning["message"]
    assert warning["type"] == "Warning"
    assert warning["involvedObject"]["kind"] == "ModelDeployment"
    assert warning["involvedObject"]["name"] == "llama"
    assert warning["involvedObject"]["uid"] == MD_UID


@pytest.mark.usefixtures("revision_chain")
async def test_a_tenant_weakened_requirement_annotation_is_ignored(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    # kubectl annotate pod ... kvgate.io/requirement='{"contextLength": 1}' on an engine whose
    # pool is far below the spec's 131,072 tokens: the verdict still uses the spec.
    async with running(FakeEngine("decode", 131_072, 16_000)) as engine:
        pod = engine_pod(engine.port)
        pod["metadata"]["annotations"][labels.REQUIREMENT] = json.dumps(
            {"contextLength": 1, "headroom": 1.0, "minEngineVersion": "0.0.1", "role": "decode"}
        )
        kmock.objects[kmock.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
        cond = await engine_pods.check_pod(rt, pod)
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "KvPoolTooSmall"
    assert "context length 131,072" in cond["message"]


@pytest.mark.usefixtures("revision_chain")
async def test_a_pod_with_kvgate_labels_but_no_ownership_chain_is_never_verified(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
        pod = engine_pod(engine.port)
        pod["metadata"]["ownerReferences"] = []  # a pod a tenant created with copied labels
        kmock.objects[kmock.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
        cond = await engine_pods.check_pod(rt, pod)
    assert cond is not None and cond["status"] == "False"
    assert cond["reason"] == "NotOwnedByModelDeployment"
    assert "not controlled by a ReplicaSet" in cond["message"]


def _foreign(kind: str, api: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "metadata": {"name": name, "namespace": NS}, **extra}


async def test_a_service_kvgate_did_not_create_is_never_adopted_and_the_status_names_it(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock)
    theirs = _foreign("Service", "v1", "llama", spec={"selector": {"app": "theirs"}})
    kmock.objects[kmock.resource("", "v1", "services"), NS, "llama"] = theirs
    await Reconciler(rt, NS, "llama").reconcile()
    assert [r for r in requests(kmock, "PATCH") if "/services/" in str(r.url.path)] == []
    assert kmock.objects[kmock.resource("", "v1", "services"), NS, "llama"]["spec"] == {
        "selector": {"app": "theirs"}
    }
    status = requests(kmock, "PATCH", "/status")[-1].data["status"]
    conds = {c["type"]: c for c in status["conditions"]}
    for kind, value in (("Ready", "False"), ("Degraded", "True")):
        assert conds[kind]["status"] == value and conds[kind]["reason"] == "Conflict"
        assert "Service llama already exists and kvgate does not own it" in conds[kind]["message"]
    events = [r.data for r in requests(kmock, "POST", "/events")]
    assert [e["reason"] for e in events if e["reason"] == "Conflict"] == ["Conflict"]


async def test_a_pre_existing_router_service_account_is_a_conflict_not_used(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock)
    sa = _foreign("ServiceAccount", "v1", "llama-router")
    kmock.objects[kmock.resource("", "v1", "serviceaccounts"), NS, "llama-router"] = sa
    await Reconciler(rt, NS, "llama").reconcile()
    status = requests(kmock, "PATCH", "/status")[-1].data["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "Conflict"
    assert "ServiceAccount llama-router already exists" in degraded["message"]
    assert "Delete or rename that object" in degraded["message"]


async def test_a_router_key_secret_kvgate_did_not_write_runs_no_router_and_says_why(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    """A tenant created Secret llama-router-control (before the ModelDeployment, or after
    deleting kvgate's): a router started on it would take their key on its worker API."""
    put_md(kmock)
    rev = revision_of(make_md().spec)
    theirs = _foreign("Secret", "v1", "llama-router-control", data={"admin-key": "dGVuYW50"})
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

    from kvgate.verify import router_auth

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


async def test_an_invalid_spec_is_reported_once_however_many_passes_run(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock, model__contextLength=0)  # admission would deny it; stored anyway (no webhook)
    mds = kmock.resource("kvgate.io", "v1alpha1", "modeldeployments")
    for second in (0, 30, 60):
        rt.clock = lambda second=second: NOW + timedelta(seconds=second)
        assert await Reconciler(rt, NS, "llama").reconcile() is None
        for write in requests(kmock, "PATCH", "/status")[-1:]:
            kmock.objects[mds, NS, "llama"].patch({"status": write.data["status"]})
    (write,) = requests(kmock, "PATCH", "/status")
    (ready,) = write.data["status"]["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.model.contextLength" in ready["message"]
    assert ready["lastTransitionTime"] == "2026-11-05T12:00:00Z"
    warnings = [r.data for r in requests(kmock, "POST", "/events")]
    assert [(e["type"], e["reason"]) for e in warnings] == [("Warning", "InvalidSpec")]
    assert warnings[0]["involvedObject"]["uid"] == MD_UID


async def test_each_running_revision_gets_its_network_policies_when_they_are_on(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    from dataclasses import replace

    from kvgate.kube.network_policy_settings import NetworkPolicySettings

    rt.settings = replace(
        rt.settings,
        network_policy=NetworkPolicySettings("kvgate-system", {"app.kubernetes.io/name": "kvgate"}),
    )
    put_md(kmock)
    rev = revision_of(make_md().spec)
    await Reconciler(rt, NS, "llama").reconcile()
    posted = {
        r.data["metadata"].get("name")
        for r in requests(kmock, "POST")
        if r.data.get("kind") == "NetworkPolicy"
    }
    assert posted == {f"llama-{rev}-engines", f"llama-{rev}-router"}


async def test_network_policies_are_not_built_when_they_are_off(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock)
    await Reconciler(rt, NS, "llama").reconcile()
    assert not [r for r in requests(kmock, "POST") if r.data.get("kind") == "NetworkPolicy"]


async def test_with_a_guard_image_engine_pods_carry_the_guard_at_the_cluster_floor(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    from dataclasses import replace

    rt.settings = replace(
        rt.settings,
        guard_image="ghcr.io/kvgate/kvgate-operator:0.2.0",
        min_engine_version_floor="0.5.23",
    )
    put_md(kmock)
    await Reconciler(rt, NS, "llama").reconcile()
    created = {
        r.data["metadata"]["name"].rsplit("-", 1)[-1]: r.data["spec"]["template"]["spec"]
        for r in requests(kmock, "POST")
        if r.data.get("kind") == "Deployment"
    }
    for role in ("prefill", "decode"):
        (sidecar,) = created[role]["initContainers"]
        assert sidecar["image"] == "ghcr.io/kvgate/kvgate-operator:0.2.0"
        assert sidecar["restartPolicy"] == "Always"
        args = sidecar["args"]
        assert args[args.index("--min-version") + 1] == "0.5.23"  # the cluster floor wins
        assert args[args.index("--role") + 1] == role
    assert "initContainers" not in created["router"]


async def test_an_operator_upgrade_that_only_changes_the_guard_image_restarts_no_engine(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    from dataclasses import replace

    rt.settings = replace(rt.settings, guard_image="ghcr.io/kvgate/kvgate-operator:0.2.0")
    put_md(kmock)
    reconciler = Reconciler(rt, NS, "llama")
    await reconciler.reconcile()
    deployments = kmock.resource("apps", "v1", "deployments")
    for r in requests(kmock, "POST"):
        if r.data.get("kind") == "Deployment":
            kmock.objects[deployments, NS, r.data["metadata"]["name"]] = r.data
    before = len(requests(kmock, "PATCH"))

    rt.settings = replace(rt.settings, guard_image="ghcr.io/kvgate/kvgate-operator:0.3.0")
    await reconciler.reconcile()
    assert _template_replacements(requests(kmock, "PATCH")[before:]) == []

    # A changed requirement in the guard's arguments (a raised cluster floor) does roll them.
    rt.settings = replace(rt.settings, min_engine_version_floor="0.5.23")
    await reconciler.reconcile()
    rolled = {
        str(r.url.path).rsplit("/", 1)[-1]
        for r in _template_replacements(requests(kmock, "PATCH")[before:])
    }
    assert {name.rsplit("-", 1)[-1] for name in rolled} == {"prefill", "decode"}


def _template_replacements(patches: list[Any]) -> list[Any]:
    """The PATCHes that replace a Deployment's pod template (a JSON patch, see workload_writes)."""
    return [
        r
        for r in patches
        if r.headers["Content-Type"] == "application/json-patch+json"
        and any(op.get("path") == "/spec/template" for op in r.data)
    ]


def _series_value(name: str, pod: dict[str, Any]) -> float | None:
    return metrics.REGISTRY.get_sample_value(
        name,
        {
            "namespace": NS,
            "deployment": "llama",
            "pod": pod["metadata"]["name"],
            "role": "decode",
        },
    )


@pytest.mark.usefixtures("revision_chain")
async def test_a_safe_verdict_stamps_last_verified_and_an_unsafe_one_does_not(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
        pod = engine_pod(engine.port)
        kmock.objects[kmock.resource("", "v1", "pods"), NS, pod["metadata"]["name"]] = pod
        await engine_pods.check_pod(rt, pod)
        verified = _series_value("kvgate_engine_last_verified_timestamp_seconds", pod)
        assert verified == NOW.timestamp()
        assert _series_value("kvgate_engine_reverify_interval_seconds", pod) == 30.0
        engine.kv_pool_tokens = 68_128
        rt.clock = lambda: NOW + timedelta(seconds=30)
        cond = await engine_pods.check_pod(rt, pod)
    assert cond is not None and cond["reason"] == "KvPoolTooSmall"
    assert _series_value("kvgate_engine_last_verified_timestamp_seconds", pod) == verified


async def test_the_watch_tracks_readiness_seeds_last_verified_and_deletion_forgets(
    rt: Runtime,
) -> None:
    pod = engine_pod(9)
    pod["status"]["conditions"].append({"type": "Ready", "status": "True"})
    engine_pods.on_pod_event(rt, "ADDED", pod)
    assert _series_value("kvgate_engine_pod_ready", pod) == 1.0
    # Not verified by this process yet: the age counts from when it started watching the pod.
    assert _series_value("kvgate_engine_last_verified_timestamp_seconds", pod) == NOW.timestamp()
    assert _series_value("kvgate_engine_reverify_interval_seconds", pod) == 30.0
    later = {
        **pod,
        "status": {**pod["status"], "conditions": [{"type": "Ready", "status": "False"}]},
    }
    rt.clock = lambda: NOW + timedelta(seconds=90)
    engine_pods.on_pod_event(rt, "MODIFIED", later)
    assert _series_value("kvgate_engine_pod_ready", pod) == 0.0
    assert _series_value("kvgate_engine_last_verified_timestamp_seconds", pod) == NOW.timestamp()
    engine_pods.on_pod_event(rt, "DELETED", later)
    for name in (
        "kvgate_engine_pod_ready",
        "kvgate_engine_last_verified_timestamp_seconds",
        "kvgate_engine_reverify_interval_seconds",
    ):
        assert _series_value(name, pod) is None


def _verified_pods() -> list[dict[str, Any]]:
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


def _router_ready(kmock: kmock.KubernetesEmulator, rev: str) -> None:
    deployments = kmock.resource("apps", "v1", "deployments")
    kmock.objects[deployments, NS, f"llama-{rev}-router"].patch({"status": {"readyReplicas": 1}})


async def _verified_and_router_ready(kmock: kmock.KubernetesEmulator, rev: str) -> None:
    _router_ready(kmock, rev)
    pods = kmock.resource("", "v1", "pods")
    for pod in _verified_pods():
        kmock.objects[pods, NS, pod["metadata"]["name"]] = pod


def _listed(rt: Runtime, watched: Watched) -> Reflector:
    """A reflector of ``watched`` past its first complete list (nothing to run)."""
    (reflector,) = per_namespace(rt.api, watched, namespaces=(), store={}, on_event=lambda *_: None)
    reflector.synced = True
    return reflector


def _every_engine_pod_listed(rt: Runtime) -> None:
    """As the operator's engine pod reflector has it after its first complete list."""
    rt.pod_reflectors.append(_listed(rt, engine_pods.ENGINE_PODS))


async def _engines_verified_in_the_store(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> tuple[Reconciler, str]:
    """After the first pass: the router Ready, and both engines verified as the operator's
    engine pod watch holds them, past its first complete list (the API lists none)."""
    reconciler, rev = await _first_pass_with_a_passing_content_check(kmock, rt, monkeypatch)
    _router_ready(kmock, rev)
    first_status = requests(kmock, "PATCH", "/status")[0].data["status"]
    mds = kmock.resource("kvgate.io", "v1alpha1", "modeldeployments")
    kmock.objects[mds, NS, "llama"].patch({"status": first_status})
    for pod in _verified_pods():
        rt.pods[pod["metadata"]["uid"]] = pod_view.slim(pod)
    _every_engine_pod_listed(rt)
    return reconciler, rev


@pytest.mark.usefixtures("revision_chain")
async def test_once_every_engine_pod_is_listed_a_pass_reads_them_from_the_store_and_lists_none(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    reconciler, rev = await _engines_verified_in_the_store(kmock, rt, monkeypatch)
    pod_lists = len(requests(kmock, "GET", f"/namespaces/{NS}/pods"))

    step = await reconciler.reconcile()

    assert step is not None and step.serving_revision == rev
    assert len(requests(kmock, "GET", f"/namespaces/{NS}/pods")) == pod_lists


@pytest.mark.usefixtures("revision_chain")
async def test_until_every_engine_pod_is_listed_a_pass_lists_its_engine_pods(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock)
    for pod in _verified_pods():  # in the store, not yet known to be complete
        rt.pods[pod["metadata"]["uid"]] = pod_view.slim(pod)
    await Reconciler(rt, NS, "llama").reconcile()
    assert requests(kmock, "GET", f"/namespaces/{NS}/pods")


def _plain(value: Any) -> Any:
    """kmock's stored object as the plain JSON data a watch event carries."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _every_deployment_listed(kmock: kmock.KubernetesEmulator, rt: Runtime, rev: str) -> None:
    """The MD's Deployments in the operator's store, as its Deployment reflector delivers them
    (full bodies in, slim ones kept), and that reflector past its first complete list."""
    resource = kmock.resource("apps", "v1", "deployments")
    for component in ("prefill", "decode", "router"):
        body = _plain(kmock.objects[resource, NS, f"llama-{rev}-{component}"])
        body["metadata"].setdefault("uid", f"dep-{component}")
        deployments.on_deployment_event(rt, "ADDED", body)
    rt.deployment_reflectors.append(_listed(rt, deployments.DEPLOYMENTS))


@pytest.mark.usefixtures("revision_chain")
async def test_once_every_deployment_is_listed_a_pass_reads_them_from_the_store_and_lists_none(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    reconciler, rev = await _engines_verified_in_the_store(kmock, rt, monkeypatch)
    _every_deployment_listed(kmock, rt, rev)  # the router's readyReplicas: 1 among them
    assert all("template" not in d["spec"] for d in rt.deployments.values())  # kept slim
    deployment_lists = len(requests(kmock, "GET", f"/namespaces/{NS}/deployments"))
    before = len(list(kmock))

    step = await reconciler.reconcile()

    # Served from the store alone, and the slim bodies asked for no Deployment write.
    assert step is not None and step.serving_revision == rev
    assert len(requests(kmock, "GET", f"/namespaces/{NS}/deployments")) == deployment_lists
    deployment_writes = [
        r
        for r in list(kmock)[before:]
        if r.method.value in ("POST", "PATCH", "DELETE") and "/deployments" in str(r.url.path)
    ]
    assert deployment_writes == []


@pytest.mark.usefixtures("revision_chain")
async def test_until_every_deployment_is_listed_a_pass_lists_its_deployments(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock)
    await Reconciler(rt, NS, "llama").reconcile()
    assert requests(kmock, "GET", f"/namespaces/{NS}/deployments")


@pytest.mark.usefixtures("revision_chain")
async def test_a_deployment_deleted_after_the_store_saw_it_is_not_an_error_of_the_pass(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store is a watch event behind the API: a Deployment it still holds may be gone. The
    pass's patch of it answers 404 and the pass carries on (the deletion wakes the next)."""
    reconciler, rev = await _first_pass_with_a_passing_content_check(kmock, rt, monkeypatch)
    _every_engine_pod_listed(rt)
    _every_deployment_listed(kmock, rt, rev)
    (uid,) = [u for u, d in rt.deployments.items() if d["metadata"]["name"].endswith("-decode")]
    stale = json.loads(json.dumps(rt.deployments[uid]))
    stale["spec"]["replicas"] = 0  # the pass will want to scale it back
    rt.deployments[uid] = stale
    resource = kmock.resource("apps", "v1", "deployments")
    del kmock.objects[resource, NS, f"llama-{rev}-decode"]

    step = await reconciler.reconcile()

    assert step is not None
    patches = requests(kmock, "PATCH", f"/deployments/llama-{rev}-decode")
    assert patches  # it was asked, and the 404 did not fail the pass


async def _content_check_due(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> tuple[Reconciler, str]:
    """A first pass, then both engines verified and the router Ready: the next pass runs the
    target's content check (whatever ``run_content_check`` is patched to answer)."""
    put_md(kmock)
    rev = revision_of(make_md().spec)
    reconciler = Reconciler(rt, NS, "llama")
    await reconciler.reconcile()
    await _verified_and_router_ready(kmock, rev)
    return reconciler, rev


@pytest.mark.usefixtures("revision_chain")
async def test_a_failed_content_check_refuses_the_verified_revision_and_nothing_serves(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    leak = "content check of revision x failed: 131,073 tokens: HTTP 200, 8 tokens generated"

    async def content_check_fails(*_: Any) -> ContentVerdict:
        return ContentVerdict(False, REASON_FAILED, leak, ())

    monkeypatch.setattr(content_check, "run_content_check", content_check_fails)
    reconciler, rev = await _content_check_due(kmock, rt)
    step = await reconciler.reconcile()
    assert step is not None and step.serving_revision is None
    assert step.refusal is not None and step.refusal.reason == "ContentCheckFailed"
    assert not [r for r in requests(kmock, "POST") if r.data.get("kind") == "Service"]
    status = requests(kmock, "PATCH", "/status")[-1].data["status"]
    assert status["rollout"]["refusal"] == {"reason": "ContentCheckFailed", "message": leak}
    assert status["contentChecks"][0]["revision"] == rev
    assert status["contentChecks"][0]["passed"] is False
    events = [(r.data["type"], r.data["reason"]) for r in requests(kmock, "POST", "/events")]
    assert ("Warning", REASON_FAILED) in events and ("Warning", "RolloutRefused") in events


@pytest.mark.usefixtures("revision_chain")
async def test_an_inconclusive_content_check_records_nothing_and_nothing_serves(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_router(*_: Any) -> None:
        return None

    monkeypatch.setattr(content_check, "run_content_check", no_router)
    reconciler, _ = await _content_check_due(kmock, rt)
    step = await reconciler.reconcile()
    assert step is not None and step.serving_revision is None and step.refusal is None
    assert step.content_check_due
    status = requests(kmock, "PATCH", "/status")[-1].data["status"]
    assert status.get("contentChecks", []) == []


@pytest.mark.usefixtures("revision_chain")
async def test_an_inconclusive_checks_backoff_belongs_to_the_runtime_and_ends_with_its_md(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retried RETRY_SECONDS later, not at the next pass; kept by this operator's runtime (a
    new leader starts clean) and dropped when the ModelDeployment is deleted (no leak)."""
    checks: list[str] = []

    async def no_router(*args: Any) -> None:
        checks.append(args[4])  # the revision

    monkeypatch.setattr(content_check, "run_content_check", no_router)
    reconciler, rev = await _content_check_due(kmock, rt)
    await reconciler.reconcile()
    await reconciler.reconcile()
    assert checks == [rev]  # the second pass backed off
    assert list(rt.content_inconclusive) == [(NS, "llama", rev)]
    other = Runtime(api=rt.api, settings=rt.settings, verify=rt.verify)
    assert other.content_inconclusive == {}
    on_md_event(rt, "DELETED", {"metadata": {"namespace": NS, "name": "llama"}})
    assert rt.content_inconclusive == {}


@pytest.mark.usefixtures("revision_chain")
async def test_a_pod_whose_status_patch_finds_it_gone_is_forgotten(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    # Its deletion never reached the watch (kopf re-lists after "410 Gone" without reporting
    # deletions): the verifier's status write finds it gone.
    async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
        pod = engine_pod(engine.port)
        rt.pods["pod-uid-1"] = pod_view.slim(pod)  # as its watch stored it
        assert await engine_pods.check_pod(rt, rt.pods["pod-uid-1"]) is None
    assert "pod-uid-1" not in rt.pods
    assert list(rt.pods.of_md(NS, "llama")) == []
    assert rt.md_wake((NS, "llama")).is_set()
