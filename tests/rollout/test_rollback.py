"""Revision history and kvgate.io/rollback (kvgate.rollout.rollback): what status.history keeps,
what a
rollback request restores or refuses, and the JSON patch that applies it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kvgate.rollout.rollback import (
    ROLLBACK_ANNOTATION,
    decide_rollback,
    history_in,
    rollback_patch,
    updated_history,
)


def entry(revision: str, marker: int) -> dict[str, Any]:
    return {"revision": revision, "servedAt": f"t{marker}", "spec": {"marker": marker}}


def status_with(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"history": list(entries)}


def test_a_revision_is_recorded_with_its_spec_the_first_time_it_serves_as_the_target() -> None:
    out = updated_history(
        status_with(entry("aaa", 1)),
        serving_revision="bbb",
        target_revision="bbb",
        spec={"marker": 2},
        served_at="t2",
        limit=3,
    )
    assert out == [entry("bbb", 2), entry("aaa", 1)]
    # Served again later (a later pass, or a rollback to it): never rewritten.
    again = updated_history(
        status_with(*out),
        serving_revision="bbb",
        target_revision="bbb",
        spec={"marker": 99},
        served_at="t9",
        limit=3,
    )
    assert again == out


def test_a_target_that_does_not_serve_yet_is_not_recorded() -> None:
    previous = status_with(entry("aaa", 1))
    for serving in ("aaa", None):
        out = updated_history(
            previous,
            serving_revision=serving,
            target_revision="bbb",
            spec={"marker": 2},
            served_at="t2",
            limit=3,
        )
        assert [e["revision"] for e in out] == ["aaa"]


def test_the_serving_revision_moves_to_the_front_and_the_limit_drops_the_oldest() -> None:
    previous = status_with(entry("ccc", 3), entry("bbb", 2), entry("aaa", 1))
    rolled_back = updated_history(
        previous,
        serving_revision="aaa",
        target_revision="aaa",
        spec={"marker": 1},
        served_at="t4",
        limit=3,
    )
    assert [e["revision"] for e in rolled_back] == ["aaa", "ccc", "bbb"]
    assert rolled_back[0]["servedAt"] == "t1"  # when it first served
    for limit, kept in ((2, ["ddd", "ccc"]), (1, ["ddd"]), (0, [])):
        out = updated_history(
            previous,
            serving_revision="ddd",
            target_revision="ddd",
            spec={"marker": 4},
            served_at="t4",
            limit=limit,
        )
        assert [e["revision"] for e in out] == kept, limit


def test_malformed_history_entries_are_ignored() -> None:
    raw = {"history": [{"revision": "aaa"}, "junk", {"spec": {}}, entry("bbb", 2)]}
    assert history_in(raw) == [entry("bbb", 2)]
    assert history_in(None) == []


def hash_marker(spec: Mapping[str, Any]) -> str | None:
    marker = spec.get("marker")
    return None if marker is None else {1: "aaa", 2: "bbb", 3: "ccc"}.get(int(marker), "zzz")


HISTORY = [entry("ccc", 3), entry("bbb", 2), entry("aaa1234567", 1)]


@pytest.mark.parametrize(
    ("requested", "restores", "reason", "says"),
    [
        (None, None, None, None),
        ("bbb", 2, "RollbackStarted", "rolling back to revision bbb, which served from t2"),
        # A unique prefix is enough (revisions are 10 hex digits).
        ("aaa1", 1, "RollbackStarted", "revision aaa1234567"),
        ("ddd", None, "RollbackRefused", "ddd is not one of the revisions kept in status.history"),
        ("", None, "RollbackRefused", "is empty; set it to one of the revisions"),
        ("ccc", None, "RollbackNotNeeded", "already the spec's revision"),
    ],
)
def test_a_rollback_request_restores_a_recorded_spec_or_says_what_can_be_asked_for(
    requested: str | None, restores: int | None, reason: str | None, says: str | None
) -> None:
    decision = decide_rollback(requested, HISTORY, target_revision="ccc", revision_of=hash_marker)
    if reason is None:
        assert decision is None
        return
    assert decision is not None and decision.reason == reason
    assert says is not None and says in decision.message, decision.message
    if restores is None:
        assert decision.spec is None
    else:
        assert decision.spec == {"marker": restores}
        assert "verified before it takes traffic" in decision.message
    if reason == "RollbackRefused" and requested:
        assert "ccc, bbb, aaa1234567" in decision.message  # what may be asked for


def test_an_ambiguous_prefix_and_a_spec_that_no_longer_parses_are_refused() -> None:
    history = [entry("abc1", 1), entry("abc2", 2), {"revision": "old", "spec": {}}]
    ambiguous = decide_rollback("abc", history, target_revision="x", revision_of=hash_marker)
    assert ambiguous is not None and ambiguous.spec is None
    assert "matches more than one" in ambiguous.message
    stale = decide_rollback("old", history, target_revision="x", revision_of=hash_marker)
    assert stale is not None and stale.spec is None and stale.reason == "RollbackRefused"
    assert "not valid for this kvgate version" in stale.message


def test_a_spec_that_hashes_differently_now_is_restored_and_the_message_says_so() -> None:
    history = [entry("oldhash", 2)]
    decision = decide_rollback("oldhash", history, target_revision="x", revision_of=hash_marker)
    assert decision is not None and decision.spec == {"marker": 2}
    assert "this kvgate version hashes it as revision bbb" in decision.message


def test_the_patch_is_guarded_by_the_resource_version_and_always_drops_the_annotation() -> None:
    restore = decide_rollback("bbb", HISTORY, target_revision="ccc", revision_of=hash_marker)
    assert restore is not None
    assert rollback_patch(restore, "42") == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "replace", "path": "/spec", "value": {"marker": 2}},
        {"op": "remove", "path": "/metadata/annotations/kvgate.io~1rollback"},
    ]
    refuse = decide_rollback("nope", HISTORY, target_revision="ccc", revision_of=hash_marker)
    assert refuse is not None
    assert rollback_patch(refuse, None) == [
        {"op": "remove", "path": "/metadata/annotations/kvgate.io~1rollback"}
    ]
    assert ROLLBACK_ANNOTATION == "kvgate.io/rollback"
