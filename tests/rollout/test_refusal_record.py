"""status.refusals (kvgate.rollout.refusal_record): the revisions verification refused, newest
first, kept by the operator so kvgate history needs no Event."""

from __future__ import annotations

from typing import Any

from kvgate.rollout.refusal_record import (
    MAX_REFUSALS,
    RefusedRevision,
    refusals_in,
    updated_refusals,
)

T1, T2 = "2026-11-05T10:00:00Z", "2026-11-05T11:00:00Z"


def _status(*revisions: str) -> dict[str, Any]:
    return {
        "refusals": [
            {"revision": r, "reason": "EngineUnsafe", "message": f"{r} short", "refusedAt": T1}
            for r in revisions
        ]
    }


def test_a_refusal_decided_this_pass_goes_first_with_its_time() -> None:
    refused = RefusedRevision("c0c0c0c0c0", "VerificationTimeout", "not verified in 900 s", T2)
    written = updated_refusals(_status("a0a0a0a0a0"), refused, new=True)
    assert [(r["revision"], r["refusedAt"]) for r in written] == [
        ("c0c0c0c0c0", T2),
        ("a0a0a0a0a0", T1),
    ]
    assert written[0] == {
        "revision": "c0c0c0c0c0",
        "reason": "VerificationTimeout",
        "message": "not verified in 900 s",
        "refusedAt": T2,
    }


def test_a_refusal_already_recorded_keeps_its_time_on_later_passes() -> None:
    again = RefusedRevision("a0a0a0a0a0", "EngineUnsafe", "a0a0a0a0a0 short", T2)
    assert (
        updated_refusals(_status("a0a0a0a0a0"), again, new=False)
        == _status("a0a0a0a0a0")["refusals"]
    )
    assert (
        updated_refusals(_status("a0a0a0a0a0"), None, new=False)
        == _status("a0a0a0a0a0")["refusals"]
    )


def test_a_refusal_missing_from_the_record_is_added_even_on_a_later_pass() -> None:
    """A status an earlier kvgate wrote (refusedRevision, no record), or a lost status write."""
    refused = RefusedRevision("c0c0c0c0c0", "EngineUnsafe", "short", T2)
    written = updated_refusals({"refusedRevision": "c0c0c0c0c0"}, refused, new=False)
    assert [r["revision"] for r in written] == ["c0c0c0c0c0"]


def test_a_revision_refused_again_moves_to_the_front_once() -> None:
    refused = RefusedRevision("b0b0b0b0b0", "ContentCheckFailed", "answered too long", T2)
    written = updated_refusals(_status("a0a0a0a0a0", "b0b0b0b0b0"), refused, new=True)
    assert [(r["revision"], r["reason"]) for r in written] == [
        ("b0b0b0b0b0", "ContentCheckFailed"),
        ("a0a0a0a0a0", "EngineUnsafe"),
    ]


def test_the_record_keeps_the_newest_ten() -> None:
    revisions = [f"{i:010x}" for i in range(MAX_REFUSALS)]
    refused = RefusedRevision("ffffffffff", "EngineUnsafe", "short", T2)
    written = updated_refusals(_status(*revisions), refused, new=True)
    assert len(written) == MAX_REFUSALS == 10
    assert [r["revision"] for r in written] == ["ffffffffff", *revisions[:-1]]


def test_entries_without_a_revision_or_reason_are_ignored_and_a_duplicate_counts_once() -> None:
    status = {
        "refusals": [
            {"revision": "a0a0a0a0a0", "reason": "EngineUnsafe", "message": "first"},
            {"revision": "a0a0a0a0a0", "reason": "EngineUnsafe", "message": "second"},
            {"revision": "", "reason": "EngineUnsafe"},
            {"revision": "b0b0b0b0b0"},
            "not an entry",
        ]
    }
    assert refusals_in(status) == [RefusedRevision("a0a0a0a0a0", "EngineUnsafe", "first", None)]
    assert refusals_in(None) == [] == refusals_in({"refusals": None})
