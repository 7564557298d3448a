"""The planner's content-check rule: a revision switches only after its content check passed."""

from __future__ import annotations

from typing import Any

from factories.model_deployments import NOW, make_md
from kvgate.rollout.planner import (
    REFUSED_CONTENT,
    ObservedState,
    PodState,
    RolloutRecord,
    WorkloadState,
    content_verified,
    plan,
)
from kvgate.verify.content_probe import ContentCheck

OLD, NEW = "aaaaaaaaaa", "bbbbbbbbbb"
LEAK = (
    "content check of revision bbbbbbbbbb failed: an over-length prompt was answered with "
    "generated tokens (HTTP 200), the incident's signature: 131,073 tokens (over contextLength "
    "131,072): HTTP 200, 8 tokens generated"
)


def _revision(rev: str) -> tuple[list[WorkloadState], list[PodState]]:
    wl = [
        WorkloadState(rev, "prefill", 1, 1, verify_started_at=NOW),
        WorkloadState(rev, "decode", 1, 1, verify_started_at=NOW),
        WorkloadState(rev, "router", 1, 1, verify_started_at=NOW),
    ]
    pods = [
        PodState(f"llama-{rev}-{role}-0", rev, role, True, "EngineVerified", ready=True)
        for role in ("prefill", "decode")
    ]
    return wl, pods


def update(checks: tuple[ContentCheck, ...], **spec: Any) -> ObservedState:
    """OLD serves (its check passed long ago); NEW is verified and its router Ready."""
    old_wl, old_pods = _revision(OLD)
    new_wl, new_pods = _revision(NEW)
    return ObservedState(
        spec=make_md(**spec).spec,
        target_revision=NEW,
        workloads=tuple(old_wl + new_wl),
        pods=tuple(old_pods + new_pods),
        service_revision=OLD,
        now=NOW,
        recorded=RolloutRecord(NEW, OLD, NOW, None),
        content_checks=(ContentCheck(OLD, True, "ok"), *checks),
    )


def test_verified_revision_without_a_content_check_waits_for_it_and_old_keeps_serving() -> None:
    step = plan(update(()))
    assert step.content_check_due
    assert step.serving_revision == OLD and step.service_revision == OLD
    assert step.refusal is None and not step.delete_revisions


def test_revision_switches_once_its_content_check_passed() -> None:
    step = plan(update((ContentCheck(NEW, True, "passed"),)))
    assert not step.content_check_due
    assert step.serving_revision == NEW and step.service_revision == NEW


def test_failed_content_check_refuses_the_revision_and_old_keeps_serving() -> None:
    step = plan(update((ContentCheck(NEW, False, LEAK),)))
    assert step.refusal is not None and step.refusal.reason == REFUSED_CONTENT
    assert step.refusal.message == LEAK and step.new_refusal
    assert step.serving_revision == OLD and step.service_revision == OLD
    assert OLD not in step.delete_revisions


def test_another_revisions_pass_does_not_count() -> None:
    step = plan(update((ContentCheck("cccccccccc", True, "passed"),)))
    assert step.content_check_due and step.serving_revision == OLD


def test_the_check_turned_off_switches_on_verification_alone() -> None:
    spec = {"safety__contentProbe__enabled": False}
    state = update((), **spec)
    assert content_verified(state, NEW)
    step = plan(state)
    assert not step.content_check_due and step.serving_revision == NEW
