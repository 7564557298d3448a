"""Pods the API server refuses (a ResourceQuota, Pod Security, a webhook) are said in the
ModelDeployment's conditions and one Warning Event at once, with the ReplicaSet controller's own
reason (FailedCreate) and message, read from the Deployment's ReplicaFailure condition
(kvgate.rollout.pod_creation); before, the status said "prefill 0/1 verified" until
rollout.verifyTimeoutSeconds refused the revision."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from factories.model_deployments import NOW, make_md
from kvgate.api.revision import revision_of
from kvgate.controller.modeldeployment import workload_state
from kvgate.objects import builders
from kvgate.rollout import pod_creation
from kvgate.rollout.planner import PodState, plan
from kvgate.rollout.pod_creation import CreationFailure
from kvgate.rollout.status import events_for
from kvgate.verify import pod_view
from test_planner import observe, workloads
from test_status import NEW, OLD, compute, conditions, progress, step

QUOTA = (
    'pods "llama-bbbbbbbbbb-decode-7c9f-x2k4p" is forbidden: exceeded quota: no-gpus, requested: '
    "requests.nvidia.com/gpu=1, used: requests.nvidia.com/gpu=0, limited: "
    "requests.nvidia.com/gpu=0"
)
FAILED = {
    "type": "ReplicaFailure",
    "status": "True",
    "reason": "FailedCreate",
    "message": QUOTA,
    "lastUpdateTime": "2026-12-07T10:00:00Z",
    "lastTransitionTime": "2026-12-07T10:00:00Z",
}
DECODE = CreationFailure("decode", "llama-bbbbbbbbbb-decode", QUOTA)
ROUTER = CreationFailure("router", "llama-bbbbbbbbbb-router", "pods is forbidden: webhook x")


def _deployment(*conds: dict[str, Any]) -> dict[str, Any]:
    md = make_md(model__contextLength=131_072)
    body = builders.deployment(md, revision_of(md.spec), "decode", replicas=1)
    body["metadata"].update(uid="d1", resourceVersion="7")
    body["status"] = {
        "replicas": 0,
        "conditions": [
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
            *conds,
        ],
    }
    return body


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        (FAILED, QUOTA),
        ({**FAILED, "status": "False"}, None),  # the ReplicaSet created them since
        ({**FAILED, "reason": "FailedDelete"}, None),  # removing pods, not creating them
        ({**FAILED, "message": "x" * 2000}, "x" * pod_creation.MAX_MESSAGE + "…"),
        ({"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}, None),
    ],
)
def test_a_deployment_fails_to_create_pods_while_its_replica_failure_says_failed_create(
    cond: dict[str, Any], expected: str | None
) -> None:
    assert pod_creation.replica_failure(_deployment(cond)["status"]) == expected
    assert pod_creation.replica_failure(None) is None


def test_the_operators_copy_of_a_deployment_keeps_the_replica_failure_and_no_other_condition() -> (
    None
):
    full = _deployment(FAILED)
    slim = pod_view.slim_workload(full)
    assert slim["status"]["conditions"] == [FAILED]
    state, from_full = workload_state(slim), workload_state(full)
    assert state == from_full
    assert state is not None and state.creation_failure == CreationFailure(
        "decode", full["metadata"]["name"], QUOTA
    )
    healthy = pod_view.slim_workload(_deployment())
    assert "conditions" not in healthy["status"]
    state = workload_state(healthy)
    assert state is not None and state.creation_failure is None


def test_the_plan_carries_the_targets_and_the_serving_revisions_failures() -> None:
    wl = workloads(OLD) + workloads(NEW)
    wl[4] = replace(wl[4], creation_failure=DECODE)  # the target's decode
    step_ = plan(observe(service=OLD, wl=wl))
    assert step_.target_creation_failures == (DECODE,)
    assert step_.serving_creation_failures == ()
    old_router = CreationFailure("router", "llama-aaaaaaaaaa-router", "forbidden")
    wl[2] = replace(wl[2], creation_failure=old_router)  # the serving revision's router
    step_ = plan(observe(service=OLD, wl=wl))
    assert step_.serving_creation_failures == (old_router,)


def test_a_timed_out_revision_whose_pods_were_never_created_says_why() -> None:
    wl = workloads(NEW, started=NOW)
    wl[1] = replace(wl[1], creation_failure=DECODE)
    step_ = plan(observe(wl=wl, now=NOW + timedelta(seconds=900)))
    assert step_.refusal is not None and step_.refusal.reason == "VerificationTimeout"
    assert "decode Deployment llama-bbbbbbbbbb-decode cannot create its pods" in (
        step_.refusal.message
    )
    assert QUOTA in step_.refusal.message


def _not_created(*failures: CreationFailure, **kw: Any) -> Any:
    return step(
        serving_revision=OLD,
        previous_serving_revision=OLD,
        service_revision=OLD,
        progress=progress(pv=0, dv=0),
        target_creation_failures=failures,
        **kw,
    )


def test_the_conditions_quote_the_replica_sets_reason_and_message_and_who_keeps_serving() -> None:
    cond = conditions(compute(_not_created(ROUTER, DECODE), previous={"servingRevision": OLD}))
    said = DECODE.describe()  # an engine before the router
    assert said.startswith(
        "decode Deployment llama-bbbbbbbbbb-decode cannot create its pods (FailedCreate): "
        + QUOTA
        + "; "
    )
    assert "ResourceQuota" in said
    assert cond["EnginesVerified"]["status"] == "False"
    assert cond["EnginesVerified"]["reason"] == "FailedCreate"
    assert cond["EnginesVerified"]["message"] == said
    assert cond["Ready"]["message"] == (
        f"revision {NEW} verifying: prefill 0/1 verified, decode 0/1 verified; {said}; "
        f"revision {OLD} keeps serving"
    )
    assert said in cond["Progressing"]["message"]
    assert cond["Degraded"]["status"] == "False"


def test_a_router_that_cannot_be_created_is_said_in_ready_but_not_as_an_engine_problem() -> None:
    cond = conditions(compute(_not_created(ROUTER)))
    assert cond["EnginesVerified"]["reason"] == "VerificationPending"
    assert ROUTER.describe() in cond["Ready"]["message"]


def test_a_gate_failure_outranks_a_missing_pod_in_engines_verified() -> None:
    small = PodState("p", NEW, "prefill", False, "KvPoolTooSmall", "pool too small")
    cond = conditions(compute(_not_created(DECODE, target_problems=(small,))))
    assert cond["EnginesVerified"]["reason"] == "KvPoolTooSmall"
    assert DECODE.describe() in cond["Ready"]["message"]


def test_the_serving_revision_that_cannot_replace_its_pods_is_degraded() -> None:
    old_decode = CreationFailure("decode", "llama-aaaaaaaaaa-decode", QUOTA)
    s = step(
        target_revision=OLD,
        serving_revision=OLD,
        previous_serving_revision=OLD,
        service_revision=OLD,
        progress=progress(dv=0),
        target_creation_failures=(old_decode,),
        serving_creation_failures=(old_decode,),
    )
    cond = conditions(compute(s))
    assert cond["Degraded"]["status"] == "True"
    assert cond["Degraded"]["reason"] == "FailedCreate"
    assert cond["Degraded"]["message"] == f"serving revision {OLD}: {old_decode.describe()}"
    assert old_decode.describe() in cond["Ready"]["message"]


def test_one_warning_event_when_pods_start_failing_to_be_created_not_on_every_pass() -> None:
    failing = _not_created(DECODE)
    previous = {"servingRevision": OLD, "targetRevision": NEW}
    first = events_for(failing, previous)
    assert [(e.type, e.reason, e.message) for e in first] == [
        ("Warning", "FailedCreate", DECODE.describe())
    ]
    before = compute(failing, previous=previous)
    assert events_for(failing, before) == []
    # Fixed (the pods exist): no Event; failing again later: one more.
    fixed = compute(_not_created(), previous=before)
    assert events_for(_not_created(), fixed) == []
    assert [e.reason for e in events_for(failing, fixed)] == ["FailedCreate"]
