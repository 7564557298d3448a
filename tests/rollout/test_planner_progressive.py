"""Planner table tests for rollout.strategy Progressive: steps, the split, the step check."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from factories.model_deployments import NOW
from kvgate.rollout.planner import (
    REFUSED_STEP_CHECK,
    ObservedState,
    Refusal,
    RolloutRecord,
    RolloutStep,
    StepRecord,
    WorkloadIntent,
    WorkloadState,
    plan,
)
from kvgate.rollout.progressive import EngineFailures, RouterCounters
from test_planner import NEW, NEWER, OLD, observe, pods, workloads

STEPS = [{"weight": 10, "pauseSeconds": 60}, {"weight": 50, "pauseSeconds": 60}]
PROGRESSIVE: dict[str, Any] = {"rollout": {"strategy": "Progressive", "steps": STEPS}}


def both_serving(*, serving_routers: int = 1, target_routers: int = 1) -> list[WorkloadState]:
    """OLD serves; NEW is verified with a Ready router (the switch rule holds for it)."""
    old = [w for w in workloads(OLD) if w.component != "router"]
    new = [w for w in workloads(NEW) if w.component != "router"]
    return [
        *old,
        WorkloadState(OLD, "router", serving_routers, serving_routers, verify_started_at=NOW),
        *new,
        WorkloadState(NEW, "router", target_routers, target_routers, verify_started_at=NOW),
    ]


def verified_pods() -> list[Any]:
    return [
        *(p for rev in (OLD, NEW) for role in ("prefill", "decode") for p in pods(rev, role, 1))
    ]


def progressive(
    *,
    step: StepRecord | None = None,
    counters: tuple[RouterCounters, ...] | None = (),
    wl: list[WorkloadState] | None = None,
    split: bool | None = None,
    service: str | None = OLD,
    now_after: float = 0.0,
    target: str = NEW,
    recorded_target: str = NEW,
    rollout: dict[str, Any] | None = None,
    pd: list[Any] | None = None,
    engines: tuple[EngineFailures, ...] | None = (),
) -> ObservedState:
    observed = observe(
        target=target,
        service=None if (split if split is not None else step is not None) else service,
        wl=wl if wl is not None else both_serving(),
        pd=pd if pd is not None else verified_pods(),
        now=NOW + timedelta(seconds=now_after),
        recorded=RolloutRecord(
            target_revision=recorded_target,
            serving_revision=OLD,
            verify_started_at=NOW,
            step=step,
        ),
        **{"rollout": {**PROGRESSIVE["rollout"], **(rollout or {})}},
    )
    return replace(
        observed,
        service_exists=True,
        service_split=split if split is not None else step is not None,
        target_router_counters=counters,
        target_engine_failures=engines,
    )


def router_intents(step: RolloutStep) -> dict[str, int]:
    return {i.revision: i.replicas for i in step.workloads if i.component == "router"}


def test_a_verified_target_takes_the_first_steps_share_and_the_old_revision_keeps_serving() -> None:
    step = plan(progressive())
    assert step.serving_revision == OLD and step.service_revision == OLD
    assert step.service_split is True
    assert step.step_record == StepRecord(0, NOW, (), 1, 10)
    assert router_intents(step) == {NEW: 1, OLD: 9}  # 10 % of ten routers
    assert OLD not in step.delete_revisions and step.refusal is None
    assert step.traffic == ((OLD, 50), (NEW, 50))  # what the ready routers carry right now


def test_the_split_waits_until_no_other_revisions_router_could_take_requests() -> None:
    stray = [WorkloadState(NEWER, "router", 1, 1, verify_started_at=NOW)]
    step = plan(progressive(wl=both_serving() + stray))
    assert step.service_split is False and step.step_record is None
    assert step.delete_revisions == (NEWER,)
    assert "waiting for revisions cccccccccc to be removed" in step.step_waiting


def test_a_step_holds_its_share_for_its_pause() -> None:
    record = StepRecord(0, NOW, (RouterCounters("r", 3, 0, 0),), 1, 10)
    step = plan(
        progressive(
            step=record,
            counters=(RouterCounters("r", 50, 0, 0),),
            now_after=59,
            wl=both_serving(serving_routers=9),
        )
    )
    assert step.service_split is True and step.step_record == record
    assert step.step_check is not None and step.step_check.requests == 47
    assert step.traffic == ((OLD, 90), (NEW, 10))
    assert step.step_waiting == "pause 59/60 s"


def test_after_its_pause_the_next_step_begins_counting_from_the_routers_counters_then() -> None:
    now = (RouterCounters("r", 50, 0, 0),)
    step = plan(progressive(step=StepRecord(0, NOW, (), 1, 10), counters=now, now_after=60))
    assert step.step_record == StepRecord(1, NOW + timedelta(seconds=60), now, 1, 50)
    assert router_intents(step) == {NEW: 1, OLD: 1}
    assert step.service_split is True and step.serving_revision == OLD


def test_after_the_last_steps_pause_all_traffic_moves_to_the_target() -> None:
    step = plan(progressive(step=StepRecord(1, NOW, (), 1, 50), counters=(), now_after=61))
    assert step.serving_revision == NEW and step.switched
    assert step.service_revision == NEW and step.service_split is False
    assert step.step_record is None
    assert router_intents(step) == {NEW: 1}


def test_a_failing_step_check_rolls_traffic_back_and_refuses_the_target_with_the_numbers() -> None:
    step = plan(
        progressive(
            step=StepRecord(1, NOW, (RouterCounters("r", 10, 0, 0),), 3, 50),
            counters=(RouterCounters("r", 60, 5, 0),),
            now_after=5,
        )
    )
    assert step.refusal is not None and step.new_refusal
    assert step.refusal.reason == REFUSED_STEP_CHECK
    assert step.refusal.message == (
        "step 2/2 (50 % of requests): 5 of 50 answered requests failed (10.0 % > "
        "rollout.stepCheck.maxErrorPercent=1); all traffic went back to revision aaaaaaaaaa"
    )
    assert step.serving_revision == OLD and step.service_revision == OLD
    assert step.service_split is False and step.step_record is None
    # the refused target's routers go at once; the old routers are back to their count
    assert router_intents(step) == {NEW: 0, OLD: 3}
    assert OLD not in step.delete_revisions


def test_a_refused_progressive_target_keeps_no_router_on_later_passes() -> None:
    refused = plan(
        progressive(
            step=StepRecord(0, NOW, (), 1, 10),
            counters=(RouterCounters("r", 10, 10, 0),),
        )
    )
    assert refused.refusal is not None
    later = observe(
        wl=both_serving(),
        pd=verified_pods(),
        service=OLD,
        recorded=RolloutRecord(NEW, OLD, NOW, refused.refusal),
        **PROGRESSIVE,
    )
    step = plan(later)
    assert step.refusal == refused.refusal and not step.new_refusal
    assert router_intents(step)[NEW] == 0 and step.service_revision == OLD


def test_unreadable_router_metrics_hold_the_step_past_its_pause() -> None:
    record = StepRecord(0, NOW, (), 1, 10)
    step = plan(progressive(step=record, counters=None, now_after=600))
    assert step.step_record == record and step.service_split is True
    assert step.step_waiting == "the target's router metrics are unreadable"


def test_unreadable_engine_metrics_hold_the_step_past_its_pause() -> None:
    record = StepRecord(0, NOW, (), 1, 10)
    step = plan(
        progressive(
            step=record, counters=(RouterCounters("r", 500, 0, 0),), engines=None, now_after=600
        )
    )
    assert step.step_record == record and step.service_split is True and step.refusal is None
    assert step.step_waiting == "the target's engine metrics are unreadable"


def test_transfers_the_targets_decode_failed_behind_200s_refuse_it_naming_the_pod() -> None:
    record = StepRecord(
        0,
        NOW,
        (RouterCounters("r", 10, 0, 0),),
        1,
        10,
        (EngineFailures("decode-0", "decode", 2, 0),),
    )
    step = plan(
        progressive(
            step=record,
            counters=(RouterCounters("r", 60, 0, 0),),
            engines=(EngineFailures("decode-0", "decode", 6, 0),),
            now_after=5,
        )
    )
    assert step.refusal is not None and step.refusal.reason == REFUSED_STEP_CHECK
    assert step.refusal.message == (
        "step 1/2 (10 % of requests): 4 of 50 answered requests failed (8.0 % > "
        "rollout.stepCheck.maxErrorPercent=1); 4 KV transfers failed on decode pod decode-0; "
        "all traffic went back to revision aaaaaaaaaa"
    )
    assert step.service_revision == OLD


def test_a_step_records_the_targets_engine_counters_when_it_begins() -> None:
    engines = (EngineFailures("decode-0", "decode", 3, 1),)
    step = plan(progressive(engines=engines))
    assert step.step_record is not None and step.step_record.engine_baseline == engines


def test_a_step_waits_for_the_minimum_requests_after_its_pause() -> None:
    record = StepRecord(0, NOW, (), 1, 10)
    step = plan(
        progressive(
            step=record,
            counters=(RouterCounters("r", 4, 0, 0),),
            now_after=120,
            rollout={"stepCheck": {"minRequests": 20}},
        )
    )
    assert step.step_record == record
    assert step.step_waiting == (
        "waiting for 20 answered requests (rollout.stepCheck.minRequests), 4 so far"
    )


def test_a_flood_of_refused_requests_never_counts_toward_the_minimum_requests() -> None:
    record = StepRecord(1, NOW, (), 1, 50)  # the last step: ending it promotes the target
    step = plan(
        progressive(
            step=record,
            counters=(RouterCounters("r", 284_228, 0, 284_224),),
            now_after=120,
            rollout={"stepCheck": {"minRequests": 20}},
        )
    )
    assert not step.switched and step.serving_revision == OLD
    assert step.step_record == record
    assert step.step_waiting == (
        "waiting for 20 answered requests (rollout.stepCheck.minRequests), 4 so far; "
        "284,224 refused with a 4xx do not count"
    )


def test_a_failing_revision_behind_a_flood_of_refused_requests_is_refused_not_promoted() -> None:
    # Issue 46 item 4 as measured: the last step's pause is over, the target's routers counted
    # 284,286 requests (54 failed, 284,224 refused 4xx) and its decode 10 failed KV transfers.
    step = plan(
        progressive(
            step=StepRecord(1, NOW, (), 1, 50),
            counters=(RouterCounters("r", 284_286, 54, 284_224),),
            engines=(EngineFailures("decode-0", "decode", 10, 0),),
            now_after=61,
            rollout={"stepCheck": {"minRequests": 50}},
        )
    )
    assert not step.switched and step.serving_revision == OLD and step.service_revision == OLD
    assert step.refusal is not None and step.refusal.reason == REFUSED_STEP_CHECK
    assert step.refusal.message == (
        "step 2/2 (50 % of requests): 54 of 62 answered requests failed (87.1 % > "
        "rollout.stepCheck.maxErrorPercent=1; 284,224 refused with a 4xx are not counted); "
        "10 KV transfers failed on decode pod decode-0; all traffic went back to revision "
        "aaaaaaaaaa"
    )


def test_the_verification_timeout_does_not_refuse_a_target_in_its_steps() -> None:
    step = plan(
        progressive(
            step=StepRecord(0, NOW, (), 1, 10),
            now_after=10_000,  # well past verifyTimeoutSeconds (900 s)
            rollout={"steps": [{"weight": 10, "pauseSeconds": 20_000}]},
        )
    )
    assert step.refusal is None and step.service_split is True


def test_a_target_that_loses_verification_mid_step_leaves_the_split() -> None:
    lost = [*pods(OLD, "prefill", 1), *pods(OLD, "decode", 1), *pods(NEW, "prefill", 1)]
    lost += pods(NEW, "decode", 1, verified=False, reason="EngineUnreachable", message="gone")
    step = plan(progressive(step=StepRecord(0, NOW, (), 2, 10), pd=lost))
    assert step.service_split is False and step.service_revision == OLD
    assert router_intents(step)[OLD] == 2  # restored
    assert step.step_record is None


def test_a_spec_change_mid_split_keeps_the_split_revision_until_the_service_leaves_it() -> None:
    wl = both_serving() + [w for w in workloads(NEWER) if w.component != "router"]
    mid = progressive(
        target=NEWER, recorded_target=NEW, split=True, wl=wl, step=StepRecord(0, NOW, (), 1, 10)
    )
    step = plan(mid)
    assert step.service_split is False and step.service_revision == OLD
    assert NEW not in step.delete_revisions  # the Service still reaches its routers
    after = replace(mid, service_split=False, service_revision=OLD)
    assert NEW in plan(after).delete_revisions


def test_a_lost_split_service_is_recreated_with_the_split() -> None:
    observed = replace(
        progressive(step=StepRecord(0, NOW, (), 1, 10)), service_exists=False, service_split=False
    )
    step = plan(observed)
    assert step.service_split is True
    assert step.service_repair is not None and step.service_repair.recreated


def test_the_first_revision_of_a_progressive_deployment_takes_all_traffic_at_once() -> None:
    step = plan(
        observe(
            wl=workloads(NEW),
            pd=[*pods(NEW, "prefill", 1), *pods(NEW, "decode", 1)],
            **PROGRESSIVE,
        )
    )
    assert step.serving_revision == NEW and step.service_split is False


def test_switch_strategy_is_unchanged_by_router_counters() -> None:
    observed = replace(
        progressive(), spec=observe().spec, target_router_counters=(RouterCounters("r", 9, 9, 0),)
    )
    step = plan(observed)
    assert step.serving_revision == NEW and step.service_split is False
    assert step.workloads[-1] == WorkloadIntent(NEW, "router", 1)


@pytest.mark.parametrize("service_lost", [False, True])
@pytest.mark.parametrize("annotations_lost", [False, True])
@pytest.mark.parametrize("refused", [False, True])
@pytest.mark.parametrize("in_step", [False, True])
def test_every_combination_keeps_the_serving_revision_and_routes_only_where_it_should(
    service_lost: bool, annotations_lost: bool, refused: bool, in_step: bool
) -> None:
    """Lost Service x lost annotations x refused target x a step in progress: the serving
    revision is never deleted and always selected, a refused target never has routers nor a
    share, and only an unrefused target in its step is split with the serving revision."""
    wl = both_serving(serving_routers=9 if in_step else 1)
    if annotations_lost:
        wl = [replace(w, verify_started_at=None) for w in wl]
    refusal = Refusal(NEW, "EngineUnsafe", "pool too small") if refused else None
    observed = replace(
        progressive(
            step=StepRecord(0, NOW, (), 1, 10) if in_step else None,
            wl=wl,
            counters=(RouterCounters("r", 10, 0, 0),),
        ),
        service_exists=not service_lost,
    )
    observed = replace(observed, recorded=replace(observed.recorded, refusal=refusal))
    if service_lost:
        observed = replace(observed, service_revision=None, service_split=False)
    step = plan(observed)
    assert OLD not in step.delete_revisions and NEW not in step.delete_revisions
    assert step.serving_revision == OLD and step.service_revision == OLD
    if refused:
        assert step.refusal == refusal and step.service_split is False
        assert router_intents(step)[NEW] == 0
    else:
        assert step.refusal is None and step.service_split is True
        assert step.step_record is not None and step.step_record.index == 0
    if service_lost:
        assert step.service_repair is not None and step.service_repair.recreated
