"""CR status from a rollout step: conventions, messages with numbers, events on transitions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from factories.model_deployments import NOW
from kvgate.rollout.planner import (
    Evidence,
    PodState,
    Refusal,
    RoleProgress,
    RolloutRecord,
    RolloutStep,
    ServiceRepair,
)
from kvgate.rollout.status import compute_status, events_for, rollout_record

OLD, NEW = "aaaaaaaaaa", "bbbbbbbbbb"
SMALL_POOL = (
    "decode pod llama-bbbbbbbbbb-decode-x2 reports KV pool 681,280 tokens < context length "
    "1,048,576 × headroom 1.0"
)


def progress(pv: int = 1, dv: int = 1, n: int = 1) -> dict[str, RoleProgress]:
    return {
        "prefill": RoleProgress(n, n, pv, pv, 900_000 if pv else None),
        "decode": RoleProgress(n, n, dv, dv, 1_100_000 if dv else None),
    }


def step(**kw: Any) -> RolloutStep:
    base: dict[str, Any] = {
        "target_revision": NEW,
        "serving_revision": NEW,
        "previous_serving_revision": NEW,
        "workloads": (),
        "delete_revisions": (),
        "service_revision": NEW,
        "refusal": None,
        "new_refusal": False,
        "verify_started_at": NOW,
        "progress": progress(),
        "target_router_ready": True,
    }
    base.update(kw)
    return RolloutStep(**base)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def compute(
    s: RolloutStep, previous: dict[str, Any] | None = None, now: Any = NOW
) -> dict[str, Any]:
    return compute_status(s, generation=3, context_length=1_048_576, previous=previous, now=now)


def test_serving_revision_is_ready_with_per_role_counts() -> None:
    status = compute(step())
    cond = conditions(status)
    assert cond["Ready"]["status"] == "True" and cond["Ready"]["reason"] == "RevisionServing"
    assert cond["EnginesVerified"]["status"] == "True"
    assert cond["Progressing"]["status"] == "False" and cond["Degraded"]["status"] == "False"
    assert all(c["observedGeneration"] == 3 for c in status["conditions"])
    assert status["observedGeneration"] == 3 and status["contextLength"] == 1_048_576
    assert status["decode"] == {
        "replicas": 1,
        "readyReplicas": 1,
        "verifiedReplicas": 1,
        "minVerifiedKvPoolTokens": 1_100_000,
    }
    assert status["servingRevision"] == NEW and status["targetRevision"] == NEW


def test_refused_update_explains_itself_and_says_who_keeps_serving() -> None:
    refused = step(
        serving_revision=OLD,
        previous_serving_revision=OLD,
        service_revision=OLD,
        refusal=Refusal(NEW, "EngineUnsafe", SMALL_POOL),
        new_refusal=True,
        progress=progress(dv=0),
        target_problems=(
            PodState(
                "llama-bbbbbbbbbb-decode-x2", NEW, "decode", False, "KvPoolTooSmall", SMALL_POOL
            ),
        ),
    )
    status = compute(refused, previous={"servingRevision": OLD, "contextLength": 131_072})
    cond = conditions(status)
    assert cond["Ready"]["status"] == "False" and cond["Ready"]["reason"] == "RolloutRefused"
    assert cond["Degraded"]["status"] == "True" and cond["Degraded"]["reason"] == "EngineUnsafe"
    assert cond["EnginesVerified"]["reason"] == "KvPoolTooSmall"
    assert status["message"] == (
        f"revision {NEW} refused: {SMALL_POOL}; revision {OLD} keeps serving"
    )
    assert status["refusedRevision"] == NEW and status["servingRevision"] == OLD
    assert status["contextLength"] == 131_072  # still the serving revision's
    (event,) = events_for(refused, {"targetRevision": NEW})
    assert event.type == "Warning" and event.reason == "RolloutRefused"
    assert SMALL_POOL in event.message


def test_serving_pod_losing_verification_degrades_the_deployment() -> None:
    lost = PodState(
        "llama-bbbbbbbbbb-decode-x2", NEW, "decode", False, "KvPoolTooSmall", SMALL_POOL
    )
    status = compute(
        step(serving_problems=(lost,), target_problems=(lost,), progress=progress(dv=0))
    )
    cond = conditions(status)
    assert cond["Degraded"]["status"] == "True"
    assert cond["Degraded"]["reason"] == "EngineVerificationLost"
    assert SMALL_POOL in cond["Degraded"]["message"]
    assert cond["Ready"]["status"] == "False"
    assert cond["Ready"]["reason"] == "NotEnoughVerifiedEngines"


def test_first_deploy_awaiting_verification_is_progressing() -> None:
    s = step(
        serving_revision=None,
        previous_serving_revision=None,
        service_revision=None,
        progress=progress(0, 0),
    )
    status = compute(s)
    cond = conditions(status)
    assert cond["Ready"]["reason"] == "AwaitingVerification"
    assert cond["Progressing"]["status"] == "True"
    assert "prefill 0/1 verified, decode 0/1 verified; nothing serves" in status["message"]
    assert status["contextLength"] is None
    (event,) = events_for(s, None)
    assert event.reason == "RolloutStarted"


def test_transition_time_kept_while_status_holds() -> None:
    # No write when nothing changed: test_modeldeployment_kmock's steady-state pass checks
    # the PATCHes.
    first = compute(step())
    again = compute(step(), previous=first, now=NOW + timedelta(minutes=5))
    assert again == first
    flipped = compute(step(progress=progress(dv=0)), previous=first, now=NOW + timedelta(minutes=5))
    assert conditions(flipped)["Ready"]["lastTransitionTime"] == "2026-11-05T12:05:00Z"
    assert conditions(flipped)["Progressing"]["lastTransitionTime"] == "2026-11-05T12:00:00Z"


def test_switch_emits_one_event_and_steady_state_emits_none() -> None:
    switch = step(previous_serving_revision=OLD)
    (event,) = events_for(switch, {"targetRevision": NEW, "servingRevision": OLD})
    assert event.reason == "RevisionServing" and f"(was {OLD})" in event.message
    assert events_for(step(), {"targetRevision": NEW, "servingRevision": NEW}) == []


def test_status_records_the_rollout_and_the_next_pass_reads_it_back() -> None:
    refusal = Refusal(NEW, "EngineUnsafe", SMALL_POOL)
    refused = step(
        serving_revision=OLD,
        previous_serving_revision=OLD,
        service_revision=OLD,
        refusal=refusal,
        verify_started_at=NOW - timedelta(seconds=42),
    )
    status = compute(refused)
    assert status["rollout"] == {
        "verifyStartedAt": "2026-11-05T11:59:18Z",
        "refusal": {"reason": "EngineUnsafe", "message": SMALL_POOL},
        "step": None,
    }
    assert rollout_record(status) == RolloutRecord(
        target_revision=NEW,
        serving_revision=OLD,
        verify_started_at=NOW - timedelta(seconds=42),
        refusal=refusal,
    )
    # A retried (or never refused) target records no refusal; the merge patch removes it.
    assert compute(step())["rollout"]["refusal"] is None


def test_no_status_is_no_record() -> None:
    assert not rollout_record(None).known
    assert rollout_record({"servingRevision": OLD, "rollout": {"verifyStartedAt": "junk"}}) == (
        RolloutRecord(serving_revision=OLD)
    )


# The status a pass wrote once NEW was refused: the refusal is recorded, not announced again.
REFUSED_RECORDED = {
    "targetRevision": NEW,
    "servingRevision": OLD,
    "rollout": {"refusal": {"reason": "EngineUnsafe", "message": SMALL_POOL}},
}


def _refused_keeping(old: str, repair: ServiceRepair, **kw: Any) -> RolloutStep:
    return step(
        serving_revision=old,
        previous_serving_revision=old,
        service_revision=old,
        refusal=Refusal(NEW, "EngineUnsafe", SMALL_POOL),
        service_repair=repair,
        serving_evidence=repair.evidence,
        **kw,
    )


def test_recreated_service_is_announced_with_the_revision_it_selects_and_why() -> None:
    s = _refused_keeping(OLD, ServiceRepair(True, OLD, None, Evidence.STATUS))
    (event,) = events_for(s, REFUSED_RECORDED)
    assert (event.type, event.reason) == ("Warning", "ServiceRecreated")
    assert event.message == (
        f"the Service was missing: recreated it selecting revision {OLD}'s routers (the last "
        f"revision that served, recorded in status.servingRevision); revision {NEW} is refused "
        "and takes no traffic"
    )


def test_restored_selector_names_what_it_selected() -> None:
    s = _refused_keeping(OLD, ServiceRepair(False, OLD, NEW, Evidence.VERIFIED_ENGINES))
    (event,) = events_for(s, REFUSED_RECORDED)
    assert event.reason == "ServiceSelectorRestored"
    assert event.message.startswith(
        f"the Service selected revision {NEW}, not the serving revision: restored its "
        f"selector to revision {OLD} (status.servingRevision and the Service named no running "
        "revision; it is the revision whose engines are verified and whose router is Ready)"
    )


def test_recreated_router_of_the_serving_revision_is_announced() -> None:
    s = step(recreated_serving_components=("router",))
    (event,) = events_for(s, {"targetRevision": NEW, "servingRevision": NEW})
    assert (event.type, event.reason) == ("Warning", "ServingDeploymentRecreated")
    assert event.message == (
        f"the router Deployment of serving revision {NEW} was missing: recreated; its traffic "
        "resumes once the new pods are Ready (the Service keeps selecting that revision)"
    )


def test_a_refusal_is_announced_until_a_status_records_it_and_never_after() -> None:
    """Standing on the Deployments (the deciding pass's status write was lost): announced; once
    the status records it: silent."""
    refused = step(
        serving_revision=OLD,
        previous_serving_revision=OLD,
        service_revision=OLD,
        refusal=Refusal(NEW, "EngineUnsafe", SMALL_POOL),
    )
    assert not refused.new_refusal
    unrecorded = {"targetRevision": NEW, "servingRevision": OLD}
    assert [e.reason for e in events_for(refused, unrecorded)] == ["RolloutRefused"]
    assert [e.reason for e in events_for(refused, REFUSED_RECORDED)] == []
