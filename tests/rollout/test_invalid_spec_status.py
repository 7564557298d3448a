"""A spec kvgate cannot parse is reported once: a stable condition and one Event, no churn."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kvgate.rollout.status import invalid_spec_status

NOW = datetime(2026, 11, 5, 12, 0, tzinfo=UTC)
PROBLEM = "spec.model.contextLength: Input should be greater than 0"


def test_the_first_pass_writes_the_condition_and_posts_one_event() -> None:
    status, event = invalid_spec_status(None, PROBLEM, generation=3, now=NOW)
    assert status is not None and event is not None
    (ready,) = status["conditions"]
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", "InvalidSpec", PROBLEM)
    assert ready["lastTransitionTime"] == "2026-11-05T12:00:00Z"
    assert (event.type, event.reason) == ("Warning", "InvalidSpec") and PROBLEM in event.message


def test_later_passes_rewrite_nothing_and_post_nothing() -> None:
    status, _ = invalid_spec_status(None, PROBLEM, generation=3, now=NOW)
    again = invalid_spec_status(status, PROBLEM, generation=3, now=NOW + timedelta(seconds=30))
    assert again == (None, None)


def test_a_new_problem_keeps_the_transition_time_of_the_false_condition() -> None:
    status, _ = invalid_spec_status(None, PROBLEM, generation=3, now=NOW)
    other, event = invalid_spec_status(
        status, "spec.safety.headroom: too small", generation=4, now=NOW + timedelta(minutes=5)
    )
    assert other is not None and event is not None
    assert other["conditions"][0]["lastTransitionTime"] == "2026-11-05T12:00:00Z"
    assert other["observedGeneration"] == 4


def test_a_ready_deployment_whose_spec_turns_invalid_transitions_now() -> None:
    serving = {"conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "x"}]}
    status, _ = invalid_spec_status(serving, PROBLEM, generation=5, now=NOW)
    assert status is not None
    assert status["conditions"][0]["lastTransitionTime"] == "2026-11-05T12:00:00Z"
