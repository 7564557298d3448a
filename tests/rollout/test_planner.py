"""Rollout planner table tests: one observed cluster state in, the next step out."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from factories.model_deployments import NOW, make_md
from kvgate.rollout.planner import (
    Evidence,
    ObservedState,
    PodState,
    Refusal,
    RolloutRecord,
    RolloutStep,
    WorkloadIntent,
    WorkloadState,
    needed_verified,
    plan,
)
from kvgate.verify.content_probe import ContentCheck

OLD, NEW, NEWER = "aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc"
SMALL_POOL = (
    "decode pod llama-bbbbbbbbbb-decode-x2 reports KV pool 681,280 tokens < context length "
    "131,072 × headroom 1.0"
)


# The rollout rules here are independent of the content check: every revision passed it
# (tests/rollout/test_planner_content.py covers the check's own rule).
CONTENT_PASSED = tuple(
    ContentCheck(r, True, "passed") for r in ("aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc")
)


def workloads(
    rev: str,
    *,
    replicas: int = 1,
    router_ready: bool = True,
    started: datetime | None = NOW,
    **extra: Any,
) -> list[WorkloadState]:
    return [
        WorkloadState(rev, "prefill", replicas, replicas, verify_started_at=started, **extra),
        WorkloadState(rev, "decode", replicas, replicas, verify_started_at=started, **extra),
        WorkloadState(
            rev, "router", 1, 1 if router_ready else 0, verify_started_at=started, **extra
        ),
    ]


def pods(
    rev: str,
    role: str,
    n: int,
    *,
    verified: bool = True,
    reason: str | None = None,
    message: str | None = None,
) -> list[PodState]:
    return [
        PodState(
            name=f"llama-{rev}-{role}-{i}",
            revision=rev,
            role=role,
            verified=verified,
            gate_reason=reason or ("EngineVerified" if verified else None),
            gate_message=message,
            ready=verified,
            kv_pool_tokens=200_000 + i if verified else None,
        )
        for i in range(n)
    ]


def observe(
    *,
    target: str = NEW,
    service: str | None = None,
    wl: list[WorkloadState] | None = None,
    pd: list[PodState] | None = None,
    now: datetime = NOW,
    recorded: RolloutRecord | None = None,
    **spec: Any,
) -> ObservedState:
    return ObservedState(
        spec=make_md(**spec).spec,
        target_revision=target,
        workloads=tuple(wl or []),
        pods=tuple(pd or []),
        service_revision=service,
        now=now,
        recorded=recorded or RolloutRecord(),
        content_checks=CONTENT_PASSED,
    )


def record(
    serving: str | None,
    target: str = NEW,
    started: datetime | None = NOW,
    refusal: Refusal | None = None,
) -> RolloutRecord:
    """The status a previous pass wrote (servingRevision, targetRevision, rollout)."""
    return RolloutRecord(
        target_revision=target, serving_revision=serving, verify_started_at=started, refusal=refusal
    )


def intents(
    rev: str, prefill: int = 1, decode: int = 1, router: int = 1
) -> tuple[WorkloadIntent, ...]:
    return (
        WorkloadIntent(rev, "prefill", prefill),
        WorkloadIntent(rev, "decode", decode),
        WorkloadIntent(rev, "router", router),
    )


def test_first_deploy_creates_the_target_and_serves_nothing_yet() -> None:
    step = plan(observe())
    assert step.workloads == intents(NEW)
    assert step.serving_revision is None and step.service_revision is None
    assert step.refusal is None and step.delete_revisions == ()
    assert step.verify_started_at == NOW


def test_first_deploy_serves_once_both_roles_are_verified_and_the_router_is_ready() -> None:
    step = plan(observe(wl=workloads(NEW), pd=pods(NEW, "prefill", 1) + pods(NEW, "decode", 1)))
    assert step.serving_revision == NEW and step.service_revision == NEW and step.switched


def test_first_deploy_with_only_prefill_verified_does_not_serve() -> None:
    step = plan(
        observe(
            wl=workloads(NEW),
            pd=pods(NEW, "prefill", 1) + pods(NEW, "decode", 1, verified=False),
        )
    )
    assert step.serving_revision is None and step.service_revision is None
    assert step.progress["decode"].verified == 0 and step.progress["decode"].needed == 1


def test_verified_engines_without_a_ready_router_do_not_serve() -> None:
    step = plan(
        observe(
            wl=workloads(NEW, router_ready=False),
            pd=pods(NEW, "prefill", 1) + pods(NEW, "decode", 1),
        )
    )
    assert step.serving_revision is None


def test_healthy_update_keeps_the_old_revision_serving_until_the_new_one_is_verified() -> None:
    step = plan(
        observe(
            service=OLD,
            wl=workloads(OLD) + workloads(NEW),
            pd=pods(OLD, "prefill", 1)
            + pods(OLD, "decode", 1)
            + pods(NEW, "prefill", 1)
            + pods(NEW, "decode", 1, verified=False),
        )
    )
    assert step.serving_revision == OLD and step.service_revision == OLD
    assert step.delete_revisions == ()
    assert step.workloads == intents(NEW)


def test_healthy_update_switches_then_deletes_the_old_revision() -> None:
    both = (
        pods(OLD, "prefill", 1)
        + pods(OLD, "decode", 1)
        + pods(NEW, "prefill", 1)
        + pods(NEW, "decode", 1)
    )
    wl = workloads(OLD) + workloads(NEW)
    switch = plan(observe(service=OLD, wl=wl, pd=both, recorded=record(OLD)))
    assert switch.service_revision == NEW and switch.previous_serving_revision == OLD
    assert switch.delete_revisions == ()  # the old routers still get the Service's last requests
    # The next pass: the status records NEW as serving, the Service selects it.
    after = plan(observe(service=NEW, wl=wl, pd=both, recorded=record(NEW)))
    assert after.delete_revisions == (OLD,) and not after.switched


def test_min_verified_percent_is_rounded_up_per_role() -> None:
    assert needed_verified(4, 50) == 2
    assert needed_verified(3, 50) == 2
    assert needed_verified(1, 1) == 1
    assert needed_verified(0, 100) == 0
    partial = pods(NEW, "prefill", 2) + pods(NEW, "prefill", 2, verified=False)
    partial += pods(NEW, "decode", 2) + pods(NEW, "decode", 2, verified=False)
    step = plan(
        observe(
            service=OLD,
            wl=workloads(OLD) + workloads(NEW, replicas=4),
            pd=partial,
            prefill__replicas=4,
            decode__replicas=4,
            rollout__minVerifiedPercent=50,
        )
    )
    assert step.service_revision == NEW


def test_update_refused_when_a_target_pod_is_unsafe_and_old_keeps_serving() -> None:
    step = plan(
        observe(
            service=OLD,
            wl=workloads(OLD) + workloads(NEW),
            pd=pods(OLD, "prefill", 1)
            + pods(OLD, "decode", 1)
            + pods(NEW, "prefill", 1)
            + pods(NEW, "decode", 1, verified=False, reason="KvPoolTooSmall", message=SMALL_POOL),
        )
    )
    assert step.refusal is not None and step.new_refusal
    assert step.refusal.reason == "EngineUnsafe" and step.refusal.message == SMALL_POOL
    assert step.service_revision == OLD and step.serving_revision == OLD
    assert step.workloads == intents(NEW, 0, 0, 0)  # GPUs freed
    assert OLD not in step.delete_revisions and all(w.revision == NEW for w in step.workloads)


def test_refused_revision_keeps_its_engines_when_scale_down_is_off() -> None:
    step = plan(
        observe(
            service=OLD,
            wl=workloads(OLD) + workloads(NEW),
            pd=pods(NEW, "decode", 1, verified=False, reason="KvPoolTooSmall", message=SMALL_POOL),
            rollout__scaleDownRefused=False,
        )
    )
    assert step.refusal is not None and step.workloads == intents(NEW)


def test_unreachable_engine_does_not_refuse_before_the_timeout() -> None:
    step = plan(
        observe(
            wl=workloads(NEW),
            pd=pods(NEW, "decode", 1, verified=False, reason="EngineUnreachable", message="x"),
            now=NOW + timedelta(seconds=899),
        )
    )
    assert step.refusal is None


def test_timeout_refuses_a_revision_that_does_not_verify_in_time() -> None:
    step = plan(
        observe(
            service=OLD,
            wl=workloads(OLD) + workloads(NEW, started=NOW),
            pd=pods(NEW, "prefill", 1) + pods(NEW, "decode", 1, verified=False),
            now=NOW + timedelta(seconds=900),
        )
    )
    assert step.refusal is not None and step.refusal.reason == "VerificationTimeout"
    assert "rollout.verifyTimeoutSeconds=900 s" in step.refusal.message
    assert "prefill 1/1 verified, decode 0/1 verified" in step.refusal.message
    assert step.service_revision == OLD


def test_a_timed_out_refusal_names_what_kept_the_engines_from_verifying() -> None:
    unreadable = (
        "decode pod d-0 could not be verified: engine report unreadable: GET "
        "http://10.0.0.7:30000/server_info: body larger than the 4 MiB cap; kvgate reads no further"
    )
    step = plan(
        observe(
            wl=workloads(NEW, started=NOW),
            pd=pods(NEW, "prefill", 1, verified=False, reason="EngineUnreachable", message="p")
            + pods(NEW, "decode", 1, verified=False, reason="ReportUnreadable", message=unreadable),
            now=NOW + timedelta(seconds=900),
        )
    )
    assert step.refusal is not None and step.refusal.reason == "VerificationTimeout"
    message = step.refusal.message
    assert "(prefill 0/1 verified, decode 0/1 verified; router ready); p (and 1 more pods " in (
        message
    )
    alone = plan(
        observe(
            wl=workloads(NEW, started=NOW),
            pd=pods(
                NEW, "decode", 1, verified=False, reason="ReportUnreadable", message=unreadable
            ),
            now=NOW + timedelta(seconds=900),
        )
    )
    assert alone.refusal is not None
    assert f"router ready); {unreadable}; raise the timeout" in alone.refusal.message


def test_standing_refusal_survives_and_is_not_decided_again() -> None:
    refused = workloads(NEW, refused_reason="EngineUnsafe", refused_message=SMALL_POOL)
    step = plan(observe(service=OLD, wl=workloads(OLD) + refused))
    assert step.refusal is not None and not step.new_refusal
    assert step.refusal.message == SMALL_POOL and step.service_revision == OLD
    assert step.workloads == intents(NEW, 0, 0, 0)


def test_first_deploy_refusal_leaves_nothing_serving() -> None:
    step = plan(
        observe(
            wl=workloads(NEW),
            pd=pods(NEW, "decode", 1, verified=False, reason="KvPoolTooSmall", message=SMALL_POOL),
        )
    )
    assert step.refusal is not None and step.serving_revision is None
    assert step.service_revision is None


def test_serving_pod_that_loses_verification_is_reported() -> None:
    lost = pods(NEW, "decode", 1, verified=False, reason="KvPoolTooSmall", message=SMALL_POOL)
    step = plan(
        observe(
            service=NEW,
            wl=workloads(NEW),
            pd=pods(NEW, "prefill", 1) + lost,
            recorded=record(NEW),
        )
    )
    assert step.refusal is None  # a serving revision is never refused
    assert [p.name for p in step.serving_problems] == [lost[0].name]
    assert step.service_revision == NEW


def test_operator_restarted_mid_rollout_resumes_from_cluster_state() -> None:
    # Only cluster state: the Service points at OLD, NEW's Deployments carry their start time.
    started = NOW - timedelta(seconds=600)
    state = observe(
        service=OLD,
        wl=workloads(OLD) + workloads(NEW, started=started),
        pd=pods(OLD, "prefill", 1) + pods(OLD, "decode", 1) + pods(NEW, "prefill", 1),
    )
    step = plan(state)
    assert step.verify_started_at == started  # the timeout clock was not reset
    assert step.serving_revision == OLD and step.refusal is None
    late = plan(ObservedState(**{**state.__dict__, "now": started + timedelta(seconds=900)}))
    assert late.refusal is not None and late.refusal.reason == "VerificationTimeout"


def test_revision_deleted_by_hand_is_recreated() -> None:
    # Serving revision's Deployments are gone; the status and the Service still name it.
    step = plan(observe(service=NEW, wl=[], recorded=record(NEW)))
    assert step.workloads == intents(NEW)
    assert step.service_revision == NEW
    assert step.recreated_serving_components == ("prefill", "decode", "router")


def test_cr_edited_mid_rollout_removes_the_intermediate_revision() -> None:
    step = plan(
        observe(
            target=NEWER,
            service=OLD,
            wl=workloads(OLD) + workloads(NEW) + workloads(NEWER),
            pd=pods(NEW, "prefill", 1) + pods(NEW, "decode", 1),
        )
    )
    assert step.delete_revisions == (NEW,)
    assert step.service_revision == OLD
    assert step.workloads == intents(NEWER)


def test_scaling_the_serving_revision_is_not_a_rollout() -> None:
    step: RolloutStep = plan(
        observe(
            service=NEW,
            wl=workloads(NEW),
            pd=pods(NEW, "prefill", 1) + pods(NEW, "decode", 1),
            decode__replicas=3,
        )
    )
    assert step.workloads == intents(NEW, 1, 3, 1)
    assert not step.switched


@pytest.mark.parametrize("terminating", [True, False])
def test_terminating_pods_do_not_count_as_verified(terminating: bool) -> None:
    pd = [
        PodState("p", NEW, "prefill", True, "EngineVerified", terminating=terminating),
        PodState("d", NEW, "decode", True, "EngineVerified", terminating=terminating),
    ]
    step = plan(observe(wl=workloads(NEW), pd=pd))
    assert (step.serving_revision == NEW) is (not terminating)


# --- Lost or replaced derived objects: the Service, Deployments, annotations, status.
# The durable record is the status (only the operator writes it); everything else is evidence.

GONE = "dddddddddd"  # a revision with no Deployment and no pod left
MID = "eeeeeeeeee"  # a revision that was a target once and never served
STARTED = NOW - timedelta(seconds=300)
OLD_STARTED = NOW - timedelta(hours=5)
UNSAFE = {"reason": "KvPoolTooSmall", "message": SMALL_POOL}
REFUSED = Refusal(NEW, "EngineUnsafe", SMALL_POOL)

SERVICES: dict[str, str | None] = {
    "service-selects-old": OLD,
    "service-missing": None,
    "service-selects-gone-revision": GONE,
    "service-selects-target": NEW,
}
STATUSES = ("status-records-old", "status-lost", "status-stale")
ANNOTATIONS = ("annotations-kept", "annotations-stripped")
TARGETS = ("target-safe", "target-in-progress", "target-refused", "target-unsafe")


def lost_objects_state(service: str, status: str, annotations: str, target: str) -> ObservedState:
    """OLD served (verified, router Ready); NEW is the target in the given state."""
    kept = annotations == "annotations-kept"
    refused = target == "target-refused"
    notes: dict[str, Any] = (
        {"refused_reason": REFUSED.reason, "refused_message": REFUSED.message}
        if refused and kept
        else {}
    )
    new_wl = workloads(
        NEW,
        replicas=0 if refused else 1,
        router_ready=target == "target-safe",
        started=STARTED if kept else None,
        **notes,
    )
    new_pods = {
        "target-safe": pods(NEW, "prefill", 1) + pods(NEW, "decode", 1),
        "target-in-progress": pods(NEW, "prefill", 1, verified=False)
        + pods(NEW, "decode", 1, verified=False),
        "target-refused": [],  # scaled down when refused
        "target-unsafe": pods(NEW, "prefill", 1) + pods(NEW, "decode", 1, verified=False, **UNSAFE),
    }[target]
    recorded = {
        "status-records-old": record(OLD, started=STARTED, refusal=REFUSED if refused else None),
        "status-lost": RolloutRecord(),
        "status-stale": record(GONE, started=STARTED, refusal=REFUSED if refused else None),
    }[status]
    return ObservedState(
        spec=make_md().spec,
        target_revision=NEW,
        workloads=tuple(workloads(OLD, started=OLD_STARTED if kept else None) + new_wl),
        pods=tuple(pods(OLD, "prefill", 1) + pods(OLD, "decode", 1) + new_pods),
        service_revision=SERVICES[service],
        now=NOW,
        recorded=recorded,
        service_exists=SERVICES[service] is not None,
        content_checks=CONTENT_PASSED,
    )


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("annotations", ANNOTATIONS)
@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize("service", SERVICES)
def test_the_revision_that_served_keeps_serving_whatever_derived_object_is_lost(
    service: str, status: str, annotations: str, target: str
) -> None:
    step = plan(lost_objects_state(service, status, annotations, target))

    # Never deleted, never scaled, never rebuilt from another spec: OLD runs as it ran.
    assert OLD not in step.delete_revisions and NEW not in step.delete_revisions
    assert [w for w in step.workloads if w.revision == OLD] == []
    if target == "target-safe":
        # A verified successor takes over; OLD goes on a later pass (record and Service moved).
        assert (step.serving_revision, step.service_revision) == (NEW, NEW)
        assert step.switched and step.previous_serving_revision == OLD
        assert step.service_repair is None
        return
    assert (step.serving_revision, step.service_revision) == (OLD, OLD)
    assert not step.switched

    evidence = (
        Evidence.STATUS
        if status == "status-records-old"
        else Evidence.SERVICE
        if service == "service-selects-old"
        else Evidence.VERIFIED_ENGINES
    )
    assert step.serving_evidence is evidence
    repair = step.service_repair
    if service == "service-selects-old":
        assert repair is None
    else:
        assert repair is not None and repair.revision == OLD and repair.evidence is evidence
        assert repair.recreated is (service == "service-missing")
        assert repair.was == SERVICES[service]

    if target == "target-unsafe":
        assert step.refusal is not None and step.new_refusal
        assert step.workloads == intents(NEW, 0, 0, 0)
    elif target == "target-refused":
        if status == "status-lost" and annotations == "annotations-stripped":
            # Every trace of the refusal is gone: the revision is verified again from scratch
            # (as when its Deployments are deleted to retry); OLD serves throughout.
            assert step.refusal is None and step.workloads == intents(NEW)
        else:
            assert step.refusal == REFUSED and not step.new_refusal  # no second Warning
            assert step.workloads == intents(NEW, 0, 0, 0)
    else:
        assert step.refusal is None and step.workloads == intents(NEW)
        expected_start = (
            NOW if status == "status-lost" and annotations == "annotations-stripped" else STARTED
        )
        assert step.verify_started_at == expected_start


def test_lost_service_then_refused_update_keeps_the_old_revision_serving() -> None:
    # The reproduction as the cluster shows it: `kubectl delete service llama`, then an
    # update whose decode engine reports a pool below the context (status records OLD).
    step = plan(
        observe(
            service=None,
            wl=workloads(OLD) + workloads(NEW),
            pd=pods(OLD, "prefill", 1)
            + pods(OLD, "decode", 1)
            + pods(NEW, "prefill", 1)
            + pods(NEW, "decode", 1, verified=False, **UNSAFE),
            recorded=record(OLD),
        )
    )
    assert step.delete_revisions == () and step.refusal is not None
    assert step.serving_revision == OLD and step.service_revision == OLD
    assert step.service_repair is not None and step.service_repair.recreated


def test_lost_service_with_no_status_record_still_protects_the_revision_that_can_serve() -> None:
    # The same without status.servingRevision (a status lost or written by an older kvgate).
    step = plan(
        observe(
            service=None,
            wl=workloads(OLD) + workloads(NEW),
            pd=pods(OLD, "prefill", 1) + pods(OLD, "decode", 1),
        )
    )
    assert step.delete_revisions == ()
    assert step.serving_revision == OLD and step.service_revision == OLD
    assert step.serving_evidence is Evidence.VERIFIED_ENGINES


def test_old_revision_is_deleted_only_after_the_service_has_moved_off_it() -> None:
    both = pods(OLD, "prefill", 1) + pods(OLD, "decode", 1)
    both += pods(NEW, "prefill", 1) + pods(NEW, "decode", 1)
    wl = workloads(OLD) + workloads(NEW)
    # Status records NEW, but the Service (edited, or its write lost) still selects OLD.
    first = plan(observe(service=OLD, wl=wl, pd=both, recorded=record(NEW)))
    assert first.service_revision == NEW and first.delete_revisions == ()
    assert first.service_repair is not None and first.service_repair.was == OLD
    second = plan(observe(service=NEW, wl=wl, pd=both, recorded=record(NEW)))
    assert second.delete_revisions == (OLD,) and second.service_repair is None


def test_intermediate_revision_that_never_served_is_deleted_when_history_is_known() -> None:
    wl = workloads(OLD) + workloads(MID) + workloads(NEW)
    old_pods = pods(OLD, "prefill", 1) + pods(OLD, "decode", 1)
    step = plan(observe(service=None, wl=wl, pd=old_pods, recorded=record(OLD)))
    assert step.delete_revisions == (MID,) and step.service_revision == OLD


def test_nothing_is_deleted_while_no_record_says_which_revision_served() -> None:
    # Status and Service lost, and no revision able to serve right now (OLD's pods restarting):
    # any of them may be the one that served.
    wl = workloads(OLD, router_ready=False) + workloads(MID) + workloads(NEW)
    step = plan(observe(service=None, wl=wl))
    assert step.delete_revisions == () and step.serving_revision is None
    assert step.service_revision is None  # no Service for an unverified revision
    # Once the target passes the switch rule it serves; the others go on the next pass.
    ready = pods(NEW, "prefill", 1) + pods(NEW, "decode", 1)
    switch = plan(observe(service=None, wl=wl, pd=ready))
    assert switch.service_revision == NEW and switch.delete_revisions == ()
    after = plan(observe(service=NEW, wl=wl, pd=ready, recorded=record(NEW)))
    assert set(after.delete_revisions) == {OLD, MID}


def test_service_selecting_an_unverified_target_does_not_make_it_serve() -> None:
    # Status says nothing served yet; a Service (re)created by hand selects the target.
    step = plan(
        observe(
            service=NEW,
            wl=workloads(NEW, router_ready=False),
            pd=pods(NEW, "prefill", 1, verified=False),
            recorded=record(None),
        )
    )
    assert step.serving_revision is None and step.service_revision is None
    # Status records OLD; the Service was pointed at the unverified target: restored to OLD.
    restored = plan(
        observe(
            service=NEW,
            wl=workloads(OLD) + workloads(NEW, router_ready=False),
            pd=pods(OLD, "prefill", 1) + pods(OLD, "decode", 1),
            recorded=record(OLD),
        )
    )
    assert restored.service_revision == OLD and restored.delete_revisions == ()
    assert restored.service_repair is not None and restored.service_repair.was == NEW


def test_lost_router_of_the_serving_revision_is_rebuilt_during_a_refused_rollout() -> None:
    old_engines = [w for w in workloads(OLD) if w.component != "router"]
    refused = workloads(NEW, replicas=0, router_ready=False)
    step = plan(
        observe(
            service=OLD,
            wl=old_engines + refused,
            pd=pods(OLD, "prefill", 1) + pods(OLD, "decode", 1),
            recorded=record(OLD, refusal=REFUSED),
        )
    )
    assert step.refusal == REFUSED and step.serving_revision == OLD
    assert WorkloadIntent(OLD, "router", 1) in step.workloads
    assert [w for w in step.workloads if w.revision == OLD] == [WorkloadIntent(OLD, "router", 1)]
    assert step.recreated_serving_components == ("router",)
    assert step.service_repair is None  # the Service keeps its selector


def test_lost_router_of_the_serving_target_is_recreated_behind_the_same_service() -> None:
    engines = [w for w in workloads(NEW) if w.component != "router"]
    step = plan(
        observe(
            service=NEW,
            wl=engines,
            pd=pods(NEW, "prefill", 1) + pods(NEW, "decode", 1),
            recorded=record(NEW),
        )
    )
    assert step.serving_revision == NEW and step.workloads == intents(NEW)
    assert step.recreated_serving_components == ("router",)
    assert step.service_revision == NEW and step.service_repair is None


def test_lost_engines_of_a_serving_revision_that_is_not_the_target_are_not_rebuilt() -> None:
    # Its spec is no longer in the ModelDeployment: building them from the new spec would pair
    # engines of another revision under its label. It stays recorded and is never deleted.
    only_router = [w for w in workloads(OLD) if w.component == "router"]
    step = plan(observe(service=OLD, wl=only_router + workloads(NEW), recorded=record(OLD)))
    assert step.serving_revision == OLD and OLD not in step.delete_revisions
    assert [w for w in step.workloads if w.revision == OLD] == []


def test_deleting_every_deployment_of_a_refused_revision_retries_it() -> None:
    step = plan(
        observe(
            service=OLD,
            wl=workloads(OLD),
            pd=pods(OLD, "prefill", 1) + pods(OLD, "decode", 1),
            recorded=record(OLD, started=STARTED, refusal=REFUSED),
        )
    )
    assert step.refusal is None and step.workloads == intents(NEW)
    assert step.verify_started_at == NOW  # a fresh verification clock


def test_retry_whose_status_write_was_lost_is_not_refused_again() -> None:
    # The retry's Deployments carry a newer start than the status' refused attempt.
    step = plan(
        observe(
            service=OLD,
            wl=workloads(OLD) + workloads(NEW, started=NOW - timedelta(seconds=5)),
            pd=pods(OLD, "prefill", 1) + pods(OLD, "decode", 1),
            recorded=record(OLD, started=STARTED, refusal=REFUSED),
        )
    )
    assert step.refusal is None and step.verify_started_at == NOW - timedelta(seconds=5)


def test_stripped_start_annotations_do_not_reset_the_verification_clock() -> None:
    state = observe(
        service=OLD,
        wl=workloads(OLD) + workloads(NEW, started=None),
        pd=pods(OLD, "prefill", 1) + pods(OLD, "decode", 1),
        recorded=record(OLD, started=STARTED),
        now=STARTED + timedelta(seconds=900),
    )
    step = plan(state)
    assert step.refusal is not None and step.refusal.reason == "VerificationTimeout"
    assert step.serving_revision == OLD and step.delete_revisions == ()


def test_status_write_lost_after_a_switch_switches_again_or_restores_the_old_revision() -> None:
    wl = workloads(OLD) + workloads(NEW)
    old_pods = pods(OLD, "prefill", 1) + pods(OLD, "decode", 1)
    verified = pods(NEW, "prefill", 1) + pods(NEW, "decode", 1)
    again = plan(observe(service=NEW, wl=wl, pd=old_pods + verified, recorded=record(OLD)))
    assert again.switched and again.service_revision == NEW and again.delete_revisions == ()
    lost = pods(NEW, "decode", 1, verified=False, reason="EngineUnreachable", message="down")
    back = plan(
        observe(
            service=NEW,
            wl=workloads(OLD) + workloads(NEW, router_ready=False),
            pd=old_pods + pods(NEW, "prefill", 1) + lost,
            recorded=record(OLD),
        )
    )
    assert back.service_revision == OLD and back.delete_revisions == ()


def test_two_revisions_able_to_serve_with_status_and_service_lost_the_newest_is_kept() -> None:
    wl = workloads(OLD, started=OLD_STARTED) + workloads(MID, started=STARTED) + workloads(NEW)
    pd = pods(OLD, "prefill", 1) + pods(OLD, "decode", 1)
    pd += pods(MID, "prefill", 1) + pods(MID, "decode", 1)
    step = plan(observe(service=None, wl=wl, pd=pd))
    assert step.service_revision == MID and step.delete_revisions == ()


def test_a_service_the_model_deployment_does_not_control_is_no_evidence() -> None:
    state = ObservedState(
        spec=make_md().spec,
        target_revision=NEW,
        workloads=tuple(workloads(OLD, router_ready=False) + workloads(NEW)),
        pods=(),
        service_revision=None,
        now=NOW,
        recorded=record(OLD),
        service_exists=True,
        service_foreign=True,
    )
    step = plan(state)
    assert step.serving_revision == OLD and step.service_repair is None
