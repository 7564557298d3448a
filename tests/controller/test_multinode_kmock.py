"""Multi-node engines through the handlers, against the kmock API emulator: the reconciler writes
a LeaderWorkerSet per multi-node role (or says why it cannot), and a leader pod's gate turns True
only with a safe pool AND every rank of its group running (a real probe of a fake engine)."""

from __future__ import annotations

from typing import Any

import kmock
import pytest
from factories.fake_engine import FakeEngine, running
from factories.kmock_world import NS, RESOURCES, VERBS, put_md, requests
from factories.model_deployments import make_md
from kvgate.api import labels, multinode
from kvgate.api.models import Role
from kvgate.api.revision import revision_of
from kvgate.controller import engine_pods, group_verify, modeldeployment
from kvgate.controller.modeldeployment import Reconciler
from kvgate.controller.runtime import Runtime
from kvgate.objects import lws_builders

MULTI = {"decode__nodes": 2, "decode__tensorParallel": 2, "model__contextLength": 131_072}
LWS_RESOURCE = {
    "leaderworkerset.x-k8s.io/v1/leaderworkersets": {"kind": "LeaderWorkerSet"},
    "apps/v1/statefulsets": {"kind": "StatefulSet"},
}


def declare(km: kmock.KubernetesEmulator, *, lws: bool) -> None:
    for resource, info in {**RESOURCES, **(LWS_RESOURCE if lws else {})}.items():
        km.resources[resource] = {"namespaced": True, "verbs": VERBS, **info}


def _created(km: kmock.KubernetesEmulator) -> set[tuple[str, str]]:
    return {(r.data["kind"], r.data["metadata"].get("name")) for r in requests(km, "POST")}


async def test_multi_node_role_is_created_as_a_leader_worker_set(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    declare(kmock, lws=True)
    put_md(kmock, **MULTI)
    rev = revision_of(make_md(**MULTI).spec)
    await Reconciler(rt, NS, "llama").reconcile()
    created = _created(kmock)
    assert ("LeaderWorkerSet", f"llama-{rev}-decode") in created
    assert ("Deployment", f"llama-{rev}-prefill") in created  # nodes 1 keeps its Deployment
    assert ("Deployment", f"llama-{rev}-decode") not in created
    (post,) = [r for r in requests(kmock, "POST") if r.data["kind"] == "LeaderWorkerSet"]
    assert (
        str(post.url.path) == f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{NS}/leaderworkersets"
    )
    assert post.data["spec"]["leaderWorkerTemplate"]["size"] == 2
    status = requests(kmock, "PATCH", "/status")[0].data["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded.get("reason") != "LeaderWorkerSetUnavailable"


async def test_multi_node_model_deployment_without_leader_worker_set_says_why_and_how(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    declare(kmock, lws=False)
    put_md(kmock, **MULTI)
    rev = revision_of(make_md(**MULTI).spec)
    await Reconciler(rt, NS, "llama").reconcile()
    created = _created(kmock)
    assert not any(kind == "LeaderWorkerSet" for kind, _ in created)
    assert ("Deployment", f"llama-{rev}-decode") not in created  # never a single-pod stand-in
    status = requests(kmock, "PATCH", "/status")[0].data["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "LeaderWorkerSetUnavailable"
    for words in (
        "spec.decode.nodes 2",
        "leaderworkerset.x-k8s.io/v1",
        "install LeaderWorkerSet",
        "leaderWorkerSet.enabled=true",
        "set spec.decode.nodes to 1",
    ):
        assert words in degraded["message"], degraded["message"]
    events = [r.data for r in requests(kmock, "POST", "/events")]
    assert any(e["reason"] == "LeaderWorkerSetUnavailable" for e in events)


async def test_an_unserved_leader_worker_set_api_is_asked_again_only_after_a_while(
    kmock: kmock.KubernetesEmulator, rt: Runtime
) -> None:
    """Without LeaderWorkerSet every pass of every ModelDeployment asked for them (a request a
    pass at 1,000 ModelDeployments); the 404 is reused across the fleet for a while."""
    declare(kmock, lws=False)
    put_md(kmock)
    for _ in range(3):
        await Reconciler(rt, NS, "llama").reconcile()
    assert len(requests(kmock, "GET", "/leaderworkersets")) == 1
    memory = rt.owned(modeldeployment.LwsMemory)
    assert memory.unavailable is not None
    # Installed since: seen once the answer has aged out.
    declare(kmock, lws=True)
    memory.unavailable = (memory.unavailable[0] - modeldeployment.LWS_RECHECK_SECONDS, 404)
    await Reconciler(rt, NS, "llama").reconcile()
    assert len(requests(kmock, "GET", "/leaderworkersets")) == 2
    assert memory.unavailable is None


# ---------------------------------------------------------------------- the leader's gate


def _ref(api: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api, "kind": kind, "name": name, "uid": uid, "controller": True}


def group_world(km: kmock.KubernetesEmulator, port: int, *, worker: str) -> dict[str, Any]:
    """The MD, its decode LeaderWorkerSet, the leader StatefulSet and pod (engine on ``port``)
    and, by ``worker``: "running", "missing" or "restarted", rank 1."""
    declare(km, lws=True)
    put_md(km, **MULTI)
    md = make_md(**MULTI)
    rev = revision_of(md.spec)
    lws = lws_builders.leader_worker_set(md, rev, Role.DECODE, replicas=1)
    name = lws["metadata"]["name"]
    lws["metadata"].update(uid="lws-uid", namespace=NS)
    km.objects[km.resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"), NS, name] = lws
    stss = km.resource("apps", "v1", "statefulsets")
    km.objects[stss, NS, name] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": "leader-sts",
            "ownerReferences": [
                _ref(multinode.LWS_API_VERSION, "LeaderWorkerSet", name, "lws-uid")
            ],
        },
    }
    km.objects[stss, NS, f"{name}-0"] = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": f"{name}-0",
            "namespace": NS,
            "uid": "worker-sts",
            "ownerReferences": [_ref("v1", "Pod", f"{name}-0", "leader-uid")],
        },
    }
    template = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]
    template["spec"]["containers"][0]["ports"][0]["containerPort"] = port
    group_labels = {multinode.LWS_NAME_LABEL: name, multinode.GROUP_INDEX_LABEL: "0"}
    leader = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **template["metadata"],
            "labels": {
                **template["metadata"]["labels"],
                **group_labels,
                multinode.WORKER_INDEX_LABEL: "0",
            },
            "name": f"{name}-0",
            "namespace": NS,
            "uid": "leader-uid",
            "ownerReferences": [_ref("apps/v1", "StatefulSet", name, "leader-sts")],
        },
        "spec": template["spec"],
        "status": {
            "podIP": "127.0.0.1",
            "phase": "Running",
            "containerStatuses": [{"name": "engine", "ready": True, "restartCount": 0}],
        },
    }
    pods = km.resource("", "v1", "pods")
    km.objects[pods, NS, leader["metadata"]["name"]] = leader
    if worker != "missing":
        wt = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
        km.objects[pods, NS, f"{name}-0-1"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "labels": {
                    **wt["metadata"]["labels"],
                    **group_labels,
                    multinode.WORKER_INDEX_LABEL: "1",
                },
                "name": f"{name}-0-1",
                "namespace": NS,
                "uid": "worker-uid",
                "ownerReferences": [_ref("apps/v1", "StatefulSet", f"{name}-0", "worker-sts")],
            },
            "spec": wt["spec"],
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "engine",
                        "ready": True,
                        "restartCount": 1 if worker == "restarted" else 0,
                        "state": {"running": {"startedAt": "2026-11-05T11:00:00Z"}},
                    }
                ],
            },
        }
    return leader


@pytest.mark.parametrize(
    ("worker", "status", "reason", "words"),
    [
        ("running", "True", "EngineVerified", ["KV pool 200,000 tokens", "all 2 ranks run"]),
        ("missing", "False", "EngineGroupIncomplete", ["1 of 2 ranks run", "rank 1 has no pod"]),
        ("restarted", "False", "EngineGroupIncomplete", ["restarted its engine", "cannot rejoin"]),
    ],
    ids=["every rank runs", "a worker is missing", "a worker restarted"],
)
async def test_leader_is_verified_only_with_a_safe_pool_and_every_rank_running(
    kmock: kmock.KubernetesEmulator,
    rt: Runtime,
    worker: str,
    status: str,
    reason: str,
    words: list[str],
) -> None:
    async with running(FakeEngine("decode", 131_072, 200_000)) as engine:
        leader = group_world(kmock, engine.port, worker=worker)
        condition = await engine_pods.check_pod(rt, leader)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == (status, reason), condition
    for word in words:
        assert word in condition["message"], condition["message"]
    (patch,) = requests(kmock, "PATCH", "/status")
    assert patch.data["status"]["conditions"][0]["status"] == status


async def test_a_worker_event_wakes_its_leader_for_an_immediate_check(rt: Runtime) -> None:
    name = "llama-x-decode"
    group_labels = {multinode.LWS_NAME_LABEL: name, multinode.GROUP_INDEX_LABEL: "0"}
    leader = {
        "metadata": {
            "uid": "leader-uid",
            "namespace": NS,
            "labels": {**group_labels, multinode.WORKER_INDEX_LABEL: "0", labels.ROLE: "decode"},
        }
    }
    rt.pods["leader-uid"] = leader
    before = engine_pods.fingerprint(leader)
    worker = {
        "metadata": {
            "namespace": NS,
            "labels": {**group_labels, multinode.WORKER_INDEX_LABEL: "1"},
        }
    }
    group_verify.on_worker_event(rt, "MODIFIED", worker)
    assert rt.pod_wake("leader-uid").is_set()
    assert engine_pods.fingerprint(leader) != before  # the verifier checks at once
    group_verify.forget("leader-uid")


@pytest.mark.parametrize(
    ("worker", "deleting", "reason", "words"),
    [
        ("restarted", False, "EngineGroupIncomplete", ["1 of 2 ranks run", "restarted its engine"]),
        ("missing", True, "EngineGroupIncomplete", ["rank 1 has no pod"]),
        ("running", False, "EngineNotReady", ["engine container is not ready"]),
    ],
    ids=["a worker restarted", "the group is being recreated", "only the leader's engine"],
)
async def test_a_verified_leader_whose_engine_went_down_with_a_lost_rank_names_the_group(
    kmock: kmock.KubernetesEmulator,
    rt: Runtime,
    worker: str,
    deleting: bool,
    reason: str,
    words: list[str],
) -> None:
    """A lost rank takes rank 0 down with it (the reference engine exits, SGLang's leader fails;
    LeaderWorkerSet deletes the leader to recreate the group). The gate named only the leader's
    symptom (EngineNotReady) then, never the lost rank docs/multinode.md promises (seen on the real
    API server: e2e/tests/test_scenario_multinode.py)."""
    leader = group_world(kmock, 1, worker=worker)
    leader["status"]["containerStatuses"][0]["ready"] = False
    leader["status"]["conditions"] = [
        {"type": "kvgate.io/engine-verified", "status": "True", "reason": "EngineVerified"}
    ]
    if worker == "restarted" and deleting is False:
        # the leader's engine was seen down first, the worker's restart after: named then
        seen_down = dict(
            leader,
            status={
                **leader["status"],
                "conditions": [
                    {
                        "type": "kvgate.io/engine-verified",
                        "status": "False",
                        "reason": "EngineNotReady",
                    }
                ],
            },
        )
        later = await engine_pods.check_pod(rt, seen_down)
        assert later is not None and later["reason"] == "EngineGroupIncomplete", later
    if deleting:
        leader["metadata"]["deletionTimestamp"] = "2026-11-05T11:00:00Z"
    condition = await engine_pods.check_pod(rt, leader)
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("False", reason), condition
    for word in words:
        assert word in condition["message"], condition["message"]
