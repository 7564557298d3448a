"""Status of a progressive rollout: the split column, the step record read back, the Events."""

from __future__ import annotations

from factories.model_deployments import NOW
from kvgate.rollout.planner import StepRecord, plan
from kvgate.rollout.progressive import EngineFailures, RouterCounters
from kvgate.rollout.status import compute_status, events_for, rollout_record
from test_planner import NEW, OLD
from test_planner_progressive import both_serving, progressive


def status_of(step, previous=None):  # type: ignore[no-untyped-def]
    return compute_status(step, generation=3, context_length=131072, previous=previous, now=NOW)


def test_a_step_is_recorded_and_the_next_pass_reads_it_back() -> None:
    engine = EngineFailures("decode-y", "decode", 2, 1)
    record = StepRecord(1, NOW, (RouterCounters("router-x", 40, 1, 2),), 3, 50, (engine,))
    step = plan(
        progressive(
            step=record,
            counters=(RouterCounters("router-x", 60, 1, 2),),
            engines=(EngineFailures("decode-y", "decode", 3, 1),),
            now_after=5,
            rollout={"stepCheck": {"maxErrorPercent": 10}},
        )
    )
    status = status_of(step)
    assert status["rollout"]["step"] == {
        "index": 1,
        "weight": 50,
        "startedAt": "2026-11-05T12:00:00Z",
        "servingRouterReplicas": 3,
        "baseline": [{"pod": "router-x", "requests": 40, "errors": 1, "rejected": 2}],
        "engineBaseline": [{"pod": "decode-y", "role": "decode", "transfers": 2, "bootstraps": 1}],
        "check": "20 requests: 0 refused (4xx, 0.0 %), 20 answered, of which 1 failed (5xx, 499, "
        "broken streams, failed KV transfers: 5.0 %); 1 KV transfer failed on decode pod decode-y",
    }
    assert rollout_record(status).step == record


def test_kubectl_get_shows_each_revisions_share_of_the_ready_routers() -> None:
    step = plan(progressive(step=StepRecord(0, NOW, (), 1, 10), wl=both_serving(serving_routers=9)))
    status = status_of(step)
    assert status["trafficSplit"] == f"{OLD}=90%,{NEW}=10%"
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "ProgressiveStep"
    assert progressing["message"].startswith(
        f"progressive step 1 (10 %): revision {NEW} takes 10 % of new connections"
    )
    assert "pause 0/60 s" in progressing["message"]


def test_a_step_start_posts_one_event_and_a_held_step_none() -> None:
    first = plan(progressive())
    assert [e.reason for e in events_for(first, {"targetRevision": NEW})] == ["TrafficStepStarted"]
    held = plan(progressive(step=first.step_record))
    assert events_for(held, status_of(first)) == []


def test_a_completed_rollout_shows_all_traffic_on_one_revision() -> None:
    done = plan(progressive(step=StepRecord(1, NOW, (), 1, 50), now_after=61))
    status = status_of(done)
    assert status["trafficSplit"] == f"{NEW}=100%"
    assert status["rollout"]["step"] is None  # null: the merge patch removes the step
