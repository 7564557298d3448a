"""The ModelDeployment reconcile pass against the kmock API emulator
(kvgate.controller.modeldeployment): the objects it creates, the status it writes as a merge
patch, the conflicts it reports, and when it reads the informer stores instead of listing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import kmock
import pytest
from factories.kmock_world import (
    NS,
    content_check_ran,
    engine_pod,
    foreign,
    put_md,
    requests,
    router_ready,
    verified_pods,
)
from factories.model_deployments import MD_UID, NOW, make_md
from kvgate.api import labels
from kvgate.api.revision import revision_of
from kvgate.controller import content_check, deployments, engine_pods, modeldeployment
from kvgate.controller.modeldeployment import Reconciler
from kvgate.controller.runtime import Runtime
from kvgate.kube.informer import Reflector, Watched, per_namespace
from kvgate.kube.k8s import ApiError
from kvgate.rollout import scaling
from kvgate.verify import pod_view
from kvgate.verify.content_probe import REASON_PASSED, ContentVerdict


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
    await content_check_ran(reconciler, rt)
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


async def test_a_service_kvgate_did_not_create_is_never_adopted_and_the_status_names_it(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    put_md(kmock)
    theirs = foreign("Service", "v1", "llama", spec={"selector": {"app": "theirs"}})
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
    sa = foreign("ServiceAccount", "v1", "llama-router")
    kmock.objects[kmock.resource("", "v1", "serviceaccounts"), NS, "llama-router"] = sa
    await Reconciler(rt, NS, "llama").reconcile()
    status = requests(kmock, "PATCH", "/status")[-1].data["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "Conflict"
    assert "ServiceAccount llama-router already exists" in degraded["message"]
    assert "Delete or rename that object" in degraded["message"]


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
    router_ready(kmock, rev)
    first_status = requests(kmock, "PATCH", "/status")[0].data["status"]
    mds = kmock.resource("kvgate.io", "v1alpha1", "modeldeployments")
    kmock.objects[mds, NS, "llama"].patch({"status": first_status})
    for pod in verified_pods():
        rt.pods[pod["metadata"]["uid"]] = pod_view.slim(pod)
    _every_engine_pod_listed(rt)
    await content_check_ran(reconciler, rt)
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
    for pod in verified_pods():  # in the store, not yet known to be complete
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


@pytest.mark.usefixtures("revision_chain")
async def test_a_drained_engine_is_announced_once_when_the_next_pass_comes_before_the_watch(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass woken (by its one-second drain timer, another pod) between kvgate's own
    ``drained`` patch and that patch's watch event must not read the pod as still draining and
    announce it again: a pass reads what kvgate itself wrote, whatever the watch has
    delivered."""
    reconciler, rev = await _engines_verified_in_the_store(kmock, rt, monkeypatch)
    step = await reconciler.reconcile()
    assert step is not None and step.serving_revision == rev
    mds = kmock.resource("kvgate.io", "v1alpha1", "modeldeployments")
    kmock.objects[mds, NS, "llama"].patch(
        {"status": requests(kmock, "PATCH", "/status")[-1].data["status"]}
    )
    # decode 2 -> 1: its Deployment still runs 2; the second engine left traffic 10 s ago and
    # its engine reads idle.
    deployments = kmock.resource("apps", "v1", "deployments")
    kmock.objects[deployments, NS, f"llama-{rev}-decode"].patch({"spec": {"replicas": 2}})
    pod = engine_pod(30000, role="decode")
    name = pod["metadata"]["name"] = f"{pod['metadata']['name']}b"
    pod["metadata"]["uid"] = "uid-decode-2"
    pod["metadata"]["annotations"] = {
        **(pod["metadata"].get("annotations") or {}),
        labels.DRAINING_SINCE: (NOW - timedelta(seconds=10)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    pod["status"]["conditions"] = [
        {"type": "Ready", "status": "False"},
        {"type": labels.ENGINE_VERIFIED, "status": "False", "reason": "ScalingDown"},
    ]
    kmock.objects[kmock.resource("", "v1", "pods"), NS, name] = pod
    rt.pods["uid-decode-2"] = pod_view.slim(pod)

    async def idle(pods: list[Any]) -> dict[str, scaling.EngineLoad | None]:
        return {
            p["metadata"]["name"]: scaling.EngineLoad()
            for p in pods
            if p["metadata"]["name"] == name
        }

    monkeypatch.setattr(modeldeployment, "_drain_loads", idle)

    await reconciler.reconcile()  # drained: the pod marked, the Event posted
    await reconciler.reconcile()  # before the watch brings the marked pod back

    drained = [r.data["message"] for r in requests(kmock, "POST", "/events")]
    drained = [m for m in drained if "drained in" in m]
    assert len(drained) == 1, drained
    assert f"decode pod {name} drained in 10.0 s" in drained[0], drained
    decode = kmock.objects[deployments, NS, f"llama-{rev}-decode"]
    assert decode["spec"]["replicas"] == 1  # the second pass removes exactly that pod


async def test_a_refusal_whose_status_write_failed_is_still_counted_and_announced_once(
    kmock: kmock.KubernetesEmulator, rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pass that decides a refusal writes the revision's Deployments (scaled down, annotated
    with the reason) before its status. When the status write fails, the next pass finds the
    refusal standing on the Deployments: the refusal must still reach
    kvgate_rollouts_refused_total and the RolloutRefused Event, once (the KvgateRolloutRefused
    alert never fired in CI when a pass was cut there)."""
    from kvgate.kube import metrics

    put_md(kmock, rollout__verifyTimeoutSeconds=60)
    await Reconciler(rt, NS, "llama").reconcile()
    stored = kmock.objects[kmock.resource("kvgate.io", "v1alpha1", "modeldeployments"), NS, "llama"]
    stored.patch({"status": requests(kmock, "PATCH", "/status")[-1].data["status"]})
    counted = metrics.ROLLOUTS_REFUSED.labels(NS, "llama", "VerificationTimeout")
    before = counted._value.get()
    later = Runtime(
        api=rt.api,
        settings=rt.settings,
        verify=rt.verify,
        clock=lambda: NOW + timedelta(seconds=61),
    )
    patch_status = rt.api.patch_md_status

    async def status_write_fails(*_: Any) -> None:
        path = f"/apis/kvgate.io/v1alpha1/namespaces/{NS}/modeldeployments/llama/status"
        raise ApiError(500, "PATCH", path, "etcdserver: request timed out")

    monkeypatch.setattr(rt.api, "patch_md_status", status_write_fails)
    with pytest.raises(ApiError):
        await Reconciler(later, NS, "llama").reconcile()
    monkeypatch.setattr(rt.api, "patch_md_status", patch_status)
    for _ in range(2):  # the retry, then a pass over the recorded refusal
        step = await Reconciler(later, NS, "llama").reconcile()
        assert step is not None and step.refusal is not None
        status = requests(kmock, "PATCH", "/status")[-1].data["status"]
        stored.patch({"status": status})
    assert status["refusedRevision"] == revision_of(make_md().spec)
    assert counted._value.get() - before == 1
    warnings = [
        r.data for r in requests(kmock, "POST", "/events") if r.data["reason"] == "RolloutRefused"
    ]
    assert len(warnings) == 1, [w["message"] for w in warnings]


async def test_after_a_restart_the_role_scale_of_a_role_no_longer_autoscaled_is_deleted(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    """docs/autoscaling.md: without ``spec.<role>.autoscaling`` there is no RoleScale. A role
    whose autoscaling was removed while the operator was down (or before its first pass) still
    has one in the API; the restarted operator, which only ever saw it through its watch, must
    delete it, not leave it for an autoscaler to keep scaling nothing."""
    kmock.resources["kvgate.io/v1alpha1/rolescales"] = {
        "namespaced": True,
        "verbs": ["get", "list", "watch", "create", "patch", "update", "delete"],
        "kind": "RoleScale",
        "subresources": ["status", "scale"],
    }
    put_md(kmock, decode__autoscaling={"minReplicas": 1, "maxReplicas": 4})
    await Reconciler(rt, NS, "llama").reconcile()
    role_scale = await rt.api.get("RoleScale", NS, "llama-decode")  # created by the first run
    assert role_scale is not None
    assert role_scale["metadata"]["ownerReferences"][0]["uid"] == MD_UID

    put_md(kmock)  # autoscaling removed while no operator runs
    restarted = Runtime(api=rt.api, settings=rt.settings, verify=rt.verify, clock=rt.clock)
    # The restarted operator's watch lists every RoleScale before or after the first pass.
    deployments.on_role_scale_event(restarted, role_scale)
    await Reconciler(restarted, NS, "llama").reconcile()

    deleted = [
        str(r.url.path) for r in requests(kmock, "DELETE") if "rolescales" in str(r.url.path)
    ]
    assert deleted == [f"/apis/kvgate.io/v1alpha1/namespaces/{NS}/rolescales/llama-decode"]
    assert await rt.api.get("RoleScale", NS, "llama-decode") is None

    # Its deletion's watch event: later passes no longer read it.
    deployments.on_role_scale_event(restarted, role_scale, "DELETED")
    reads = len([r for r in requests(kmock, "GET") if "rolescales" in str(r.url.path)])
    await Reconciler(restarted, NS, "llama").reconcile()
    assert len([r for r in requests(kmock, "GET") if "rolescales" in str(r.url.path)]) == reads
