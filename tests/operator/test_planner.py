"""Rollout planner table tests: one observed cluster state in, the next step out."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from kvgate.planner import (
    ObservedState,
    PodState,
    RolloutStep,
    WorkloadIntent,
    WorkloadState,
    needed_verified,
    plan,
)
from operator_factories import NOW, make_md

OLD, NEW, NEWER = "aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc"
SMALL_POOL = (
    "decode pod llama-bbbbbbbbbb-decode-x2 reports KV pool 681,280 tokens < context length "
    "131,072 × headroom 1.0"
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
    **spec: Any,
) -> ObservedState:
    return ObservedState(
        spec=make_md(**spec).spec,
        target_revision=target,
        workloads=tuple(wl or []),
        pods=tuple(pd or []),
        service_revision=service,
        now=now,
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
    switch = plan(observe(service=OLD, wl=workloads(OLD) + workloads(NEW), pd=both))
    assert switch.service_revision == NEW and switch.previous_serving_revision == OLD
    assert switch.delete_revisions == ()  # the old routers still get the Service's last requests
    after = plan(observe(service=NEW, wl=workloads(OLD) + workloads(NEW), pd=both))
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
    step = plan(observe(service=NEW, wl=workloads(NEW), pd=pods(NEW, "prefill", 1) + lost))
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
    # Serving revision's Deployments are gone; the Service still selects it.
    step = plan(observe(service=NEW, wl=[]))
    assert step.workloads == intents(NEW)
    assert step.service_revision == NEW


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
