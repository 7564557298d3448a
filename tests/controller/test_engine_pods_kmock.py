"""The engine pod handler against the kmock API emulator (kvgate.controller.engine_pods): the
exact status PATCHes and Events a verdict sends, and the metrics the pod watch keeps.

A real (tiny) SGLang-shaped engine runs on 127.0.0.1 and the real probe reads it.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import kmock
import pytest
from factories.fake_engine import FakeEngine, running
from factories.kmock_world import (
    NS,
    engine_pod,
    requests,
)
from factories.model_deployments import MD_UID, NOW
from kvgate.api import labels
from kvgate.controller import engine_pods
from kvgate.controller.runtime import Runtime
from kvgate.kube import metrics
from kvgate.verify import pod_view


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
    # kubectl describe kvmd matches Events by uid: the ModelDeployment's Event carries it.
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


async def test_a_watch_event_older_than_kvgates_own_write_does_not_undo_it(rt: Runtime) -> None:
    """The answer to kvgate's own pod patch goes into the store at once (on_own_write); the
    watch's events from before that write, still on their way, do not bring the old pod back."""
    before = engine_pod(9)
    before["metadata"]["resourceVersion"] = "41"
    engine_pods.on_pod_event(rt, "ADDED", before)
    marked = json.loads(json.dumps(before))
    marked["metadata"]["resourceVersion"] = "43"
    marked["metadata"]["annotations"] = {labels.DRAINED: "2026-12-06T00:00:00Z"}
    engine_pods.on_own_write(rt, marked)
    stale = json.loads(json.dumps(before))
    stale["metadata"]["resourceVersion"] = "42"  # e.g. the kubelet's status write before it
    engine_pods.on_pod_event(rt, "MODIFIED", stale)
    assert rt.pods["pod-uid-1"]["metadata"]["annotations"] == {
        labels.DRAINED: "2026-12-06T00:00:00Z"
    }
    engine_pods.on_pod_event(rt, "MODIFIED", marked)  # its own event: the same pod
    newer = json.loads(json.dumps(marked))
    newer["metadata"]["resourceVersion"] = "44"
    newer["metadata"]["annotations"] = {}
    engine_pods.on_pod_event(rt, "MODIFIED", newer)
    assert not rt.pods["pod-uid-1"]["metadata"].get("annotations")


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


async def test_a_stray_cancellation_in_a_read_does_not_end_the_pods_verifier(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CancelledError that no one aimed at the verifier (a library timer's lost race) used to
    end it without a word: the engine was not read again until its pod changed, so its periodic
    re-reads (which catch a pool that changed under an unchanged pod) stopped. Now it is a
    failed read, and the next periodic one runs."""
    import asyncio

    reads: list[float] = []
    second = asyncio.Event()

    async def check(_: Runtime, pod: dict[str, Any]) -> None:
        reads.append(asyncio.get_running_loop().time())
        if len(reads) == 1:
            raise asyncio.CancelledError
        second.set()

    monkeypatch.setattr(engine_pods, "check_pod", check)
    monkeypatch.setattr(engine_pods, "reverify_seconds", lambda *_: 0.2)
    pod = engine_pod(9)
    engine_pods.on_pod_event(rt, "ADDED", pod)
    await asyncio.wait_for(second.wait(), timeout=5)  # no pod event in between
    assert len(reads) == 2
    assert not rt.verifiers[pod["metadata"]["uid"]].done()
