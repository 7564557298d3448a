"""The operator stores a projection of each watched pod (kvgate.verify.pod_view), indexed by its
ModelDeployment (kvgate.controller.runtime.PodStore): the scale target's 1,000 ModelDeployments /
9,000 pods within 300 MB, and per-ModelDeployment questions that cost its own pods, not the
fleet's."""

from __future__ import annotations

import contextvars
import copy
import gc
import json
import weakref
from pathlib import Path
from typing import Any

from factories.model_deployments import make_md
from kvgate.api import labels
from kvgate.api.revision import revision_of
from kvgate.controller import engine_pods, router_workers
from kvgate.controller.modeldeployment import workload_state
from kvgate.controller.runtime import PodStore, Runtime
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings
from kvgate.objects import builders
from kvgate.rollout import workload_writes
from kvgate.verify import gate, pod_view

# An engine pod as the API server returns it: kvgate's template, a controller, the kubelet's
# status, kvgate's gate condition and three managers' managedFields.
API_POD = Path(__file__).resolve().parents[1] / "fixtures" / "pods" / "engine-pod-api.json"


def api_pod() -> dict[str, Any]:
    body: dict[str, Any] = json.loads(API_POD.read_text())
    return body


def test_the_projection_drops_managed_fields_and_the_container_spec() -> None:
    full = api_pod()
    slim = pod_view.slim(full)
    assert "managedFields" not in slim["metadata"]
    (engine,) = [c for c in slim["spec"]["containers"] if c["name"] == gate.ENGINE_CONTAINER]
    assert set(engine) == {"name", "ports"}  # no command, args, env, resources, probes
    assert "volumes" not in slim["spec"]
    for status in slim["status"]["containerStatuses"]:
        assert "image" not in status and "imageID" not in status and "lastState" not in status
    assert len(json.dumps(slim)) < len(json.dumps(full)) / 3


def test_the_projection_keeps_kvgates_conditions_whole_and_of_the_kubelets_only_ready() -> None:
    full = api_pod()
    full["status"]["conditions"].append({"type": "Ready", "status": "False", "reason": "x"})
    slim = pod_view.slim(full)
    kinds = [c["type"] for c in full["status"]["conditions"]]
    assert {"PodScheduled", "ContainersReady"} <= set(kinds)  # the fixture has the kubelet's
    ours = [c for c in full["status"]["conditions"] if c["type"] == labels.ENGINE_VERIFIED]
    readiness = [
        {"type": "Ready", "status": c["status"]}
        for c in full["status"]["conditions"]
        if c["type"] == "Ready"
    ]
    assert ours and readiness
    assert sorted(slim["status"]["conditions"], key=json.dumps) == sorted(
        [*ours, *readiness], key=json.dumps
    )
    assert gate.current_condition(slim) == gate.current_condition(full)


def test_the_projection_keeps_every_field_the_gate_and_identity_read() -> None:
    full = api_pod()
    slim = pod_view.slim(full)
    for read in (
        gate.engine_url,
        gate.current_condition,
        gate.is_verified,
        gate.restart_count,
        gate.pod_name,
        gate.pod_role,
        engine_pods.fingerprint,
    ):
        assert read(slim) == read(full), read.__name__
    for key in ("uid", "namespace", "labels", "ownerReferences", "resourceVersion"):
        assert slim["metadata"][key] == full["metadata"][key]
    assert slim["metadata"]["annotations"] == {
        k: v for k, v in full["metadata"]["annotations"].items() if k.startswith("kvgate.io/")
    }
    ready = [c["status"] for c in full["status"]["conditions"] if c["type"] == "Ready"]
    assert [c["status"] for c in slim["status"]["conditions"] if c["type"] == "Ready"] == ready


def test_the_projection_shares_nothing_with_the_input_it_drops() -> None:
    full = api_pod()
    before = copy.deepcopy(full)
    pod_view.slim(full)
    assert full == before  # the input is not modified


def test_a_watched_engine_pod_is_stored_as_its_projection() -> None:
    rt = Runtime(
        api=KubeApi(Credentials(server="http://127.0.0.1:9")),
        settings=OperatorSettings(),
        verify=None,  # type: ignore[arg-type]
    )
    full = api_pod()
    uid = full["metadata"]["uid"]
    # No running loop: store and index only (what on_pod_event keeps is the point here).
    rt.pods[uid] = pod_view.slim(full)
    assert "managedFields" not in rt.pods[uid]["metadata"]
    namespace = full["metadata"]["namespace"]
    md_name = full["metadata"]["labels"][labels.DEPLOYMENT]
    assert [u for u, _ in rt.pods.of_md(namespace, md_name)] == [uid]


async def test_the_verifier_and_router_stores_hold_projections() -> None:
    rt = Runtime(
        api=KubeApi(Credentials(server="http://127.0.0.1:9")),
        settings=OperatorSettings(),
        verify=None,  # type: ignore[arg-type]
    )
    full = api_pod()
    engine_pods.on_pod_event(rt, "ADDED", copy.deepcopy(full))
    router = copy.deepcopy(full)
    router["metadata"]["uid"] = "router-uid"
    router_workers.on_router_pod_event(rt, "ADDED", router)
    try:
        assert rt.pods[full["metadata"]["uid"]] == pod_view.slim(full)
        assert rt.routers["router-uid"] == pod_view.slim(router)
    finally:
        await rt.shutdown()
        await rt.api.close()


def _pod(uid: str, namespace: str, md_name: str) -> dict[str, Any]:
    return {
        "metadata": {"uid": uid, "namespace": namespace, "labels": {labels.DEPLOYMENT: md_name}}
    }


def test_the_store_answers_per_model_deployment_and_follows_relabels_and_deletes() -> None:
    store = PodStore()
    store["a"] = _pod("a", "ns", "x")
    store["b"] = _pod("b", "ns", "y")
    store["c"] = _pod("c", "other", "x")  # same name, another namespace
    assert [u for u, _ in store.of_md("ns", "x")] == ["a"]
    store["a"] = _pod("a", "ns", "y")  # relabelled: moves
    assert [u for u, _ in store.of_md("ns", "x")] == []
    assert sorted(u for u, _ in store.of_md("ns", "y")) == ["a", "b"]
    store.pop("b")
    del store["a"]
    assert list(store.of_md("ns", "y")) == []
    store.setdefault("d", _pod("d", "ns", "x"))
    assert [u for u, _ in store.of_md("ns", "x")] == ["d"]
    assert sorted(store) == ["c", "d"]
    assert store._by_md.keys() == {("other", "x"), ("ns", "x")}  # no empty sets left behind


class _Body:
    """Stands for kopf's cause of an event (the raw watch event, the whole object)."""


_KOPF_CAUSE: contextvars.ContextVar[_Body | None] = contextvars.ContextVar("cause", default=None)


async def test_a_verifier_started_from_a_handler_does_not_keep_the_handlers_context() -> None:
    """asyncio.create_task copies the caller's context variables into the task for its life;
    from a kopf handler that copy held the event's whole body (90 MiB at 250 ModelDeployments
    in the scale benchmark's heap profile). Verifiers and loops start in an empty context."""
    rt = Runtime(
        api=KubeApi(Credentials(server="http://127.0.0.1:9")),
        settings=OperatorSettings(),
        verify=None,  # type: ignore[arg-type]
    )
    cause: _Body | None = _Body()
    gone = weakref.ref(cause)

    def handler() -> None:  # what kopf runs for the watch event, with its cause in context
        _KOPF_CAUSE.set(cause)
        engine_pods.on_pod_event(rt, "ADDED", api_pod())

    try:
        contextvars.copy_context().run(handler)
        cause = None  # only the handler's context (or a task copying it) could still hold it
        gc.collect()
        assert rt.verifiers, "the pod's verifier was started"
        assert gone() is None, "the verifier task keeps the handler's context alive"
    finally:
        await rt.shutdown()
        await rt.api.close()


def test_sibling_pods_share_one_copy_of_their_labels_owner_annotations_and_containers() -> None:
    first, second, other = api_pod(), api_pod(), api_pod()
    second["metadata"].update(name="sibling", uid="uid-2")
    second["status"]["podIP"] = "10.0.0.2"
    other["metadata"]["labels"] = {**other["metadata"]["labels"], labels.REVISION: "def456"}
    a, b, c = (pod_view.slim(p) for p in (first, second, other))
    for part, key in pod_view.SHARED_FIELDS:
        assert a[part][key] is b[part][key], key
    assert a["metadata"]["labels"] is not c["metadata"]["labels"]
    assert c["metadata"]["labels"][labels.REVISION] == "def456"
    assert a["metadata"]["labels"][labels.REVISION] == first["metadata"]["labels"][labels.REVISION]
    assert (a["metadata"]["uid"], b["metadata"]["uid"]) == (first["metadata"]["uid"], "uid-2")
    assert b["status"]["podIP"] == "10.0.0.2" != a["status"]["podIP"]


def _deployment(**spec_and_meta: Any) -> dict[str, Any]:
    """A revision Deployment as the API server returns it (kvgate.objects.builders' body, plus what
    the
    server adds: managedFields, other annotations, status)."""
    md = make_md(model__contextLength=131_072)
    body = builders.deployment(md, revision_of(md.spec), "decode", replicas=2)
    body["metadata"].update(uid="d1", resourceVersion="7", managedFields=[{"manager": "kvgate"}])
    body["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "3"
    body["status"] = {"replicas": 2, "readyReplicas": 1, "conditions": [{"type": "Available"}]}
    for key, value in spec_and_meta.items():
        part, field = key.split("__")
        body[part][field] = value
    return body


def test_a_pass_plans_the_same_deployment_writes_and_state_from_the_slim_deployment() -> None:
    """What the pass reads of a stored Deployment (workload_writes.deployment_writes,
    workload_state) is the same from the projection as from the API's full body."""
    md = make_md(model__contextLength=131_072)
    desired = builders.deployment(md, revision_of(md.spec), "decode", replicas=3)
    cases = [
        _deployment(),  # replicas 2 -> 3
        _deployment(spec__replicas=3),  # nothing to do
        _deployment(metadata__annotations={"other": "x"}),  # template hash lost
        {**_deployment(), "metadata": {"name": desired["metadata"]["name"], "uid": "d1"}},
        _deployment(metadata__annotations=None),
    ]
    for full in cases:
        slim = pod_view.slim_workload(full)
        assert "template" not in slim["spec"] and "managedFields" not in slim["metadata"]
        for notes, new_refusal in [({}, False), ({labels.REFUSED_REASON: "KvPoolTooSmall"}, True)]:
            assert workload_writes.deployment_writes(
                slim, desired, create_annotations={}, notes=notes, new_refusal=new_refusal
            ) == workload_writes.deployment_writes(
                full, desired, create_annotations={}, notes=notes, new_refusal=new_refusal
            )
        assert workload_state(slim) == workload_state(full)


def test_the_deployment_projection_keeps_its_identity_owner_and_kvgates_annotations() -> None:
    full = _deployment()
    slim = pod_view.slim_workload(full)
    meta = slim["metadata"]
    assert meta["ownerReferences"] == full["metadata"]["ownerReferences"]
    assert meta["labels"] == full["metadata"]["labels"]
    assert (meta["uid"], meta["resourceVersion"]) == ("d1", "7")
    assert set(meta["annotations"]) == {
        k for k in full["metadata"]["annotations"] if k.startswith(f"{labels.PREFIX}/")
    }
    assert slim["status"] == {"replicas": 2, "readyReplicas": 1}
    assert slim["kind"] == "Deployment" and slim["spec"]["selector"] == full["spec"]["selector"]
