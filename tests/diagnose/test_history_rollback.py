"""kvgate history and kvgate rollback, decided from given objects (kvgate.diagnose.history): the
revisions kvgate has a record of, and which one a rollback asks the operator for, or why not."""

from __future__ import annotations

from typing import Any

from factories.cluster_objects import T0, refused_md, revision, serving_md, spec_of
from kvgate.diagnose.history import (
    history_rows,
    history_text,
    plan_rollback,
    rollback_request,
    row_json,
    spec_summary,
)
from kvgate.rollout.rollback import ROLLBACK_ANNOTATION


def _three_revisions() -> tuple[dict[str, Any], list[str]]:
    """``llama`` that served revisions A (oldest) and B (serving), and whose spec, C, was
    refused; plus D, refused earlier, recorded in status.refusals."""
    spec_a, spec_b = spec_of(model__contextLength=32_768), spec_of(model__contextLength=65_536)
    md = refused_md(
        "decode pod p reports KV pool 44,584 tokens < context length 131,072 × headroom 1.0"
    )
    a, b, c = revision(spec_a), revision(spec_b), md["status"]["targetRevision"]
    md["status"].update(
        servingRevision=b,
        history=[
            {"revision": b, "servedAt": "2026-11-04T10:00:00Z", "spec": spec_b},
            {"revision": a, "servedAt": "2026-11-03T10:00:00Z", "spec": spec_a},
        ],
    )
    d = "d0d0d0d0d0"
    md["status"]["refusals"] = [
        {
            "revision": c,
            "reason": "EngineUnsafe",
            "message": md["status"]["rollout"]["refusal"]["message"],
            "refusedAt": "2026-11-05T10:00:00Z",
        },
        {
            "revision": d,
            "reason": "VerificationTimeout",
            "message": f"not verified within 900 s; revision {a} keeps serving",
            "refusedAt": "2026-11-03T12:00:00Z",
        },
    ]
    return md, [a, b, c, d]


def test_history_lists_what_served_then_the_specs_revision_then_older_refusals() -> None:
    md, (a, b, c, d) = _three_revisions()
    rows = history_rows(md)
    assert [(r.number, r.revision, r.outcome, r.restorable) for r in rows] == [
        (1, a, "served", True),
        (2, b, "serving", True),
        (3, c, "refused", False),
        (4, d, "refused", False),
    ]
    assert rows[2].is_spec and rows[2].refusal is not None and rows[2].refusal[0] == "EngineUnsafe"
    assert rows[3].refusal == (
        "VerificationTimeout",
        f"not verified within 900 s; revision {a} keeps serving",
    )
    assert rows[0].served_at == "2026-11-03T10:00:00Z"
    assert "32,768" in rows[0].summary and "65,536" in rows[1].summary
    text = history_text("llama", rows)
    assert "refused (EngineUnsafe)" in text and f"restores one of: {a}, {b}" in text
    assert set(row_json(rows[0])) == {
        "number",
        "revision",
        "outcome",
        "served_at",
        "refusal",
        "spec_summary",
        "restorable",
        "is_spec",
    }


def test_a_spec_summary_says_what_the_revision_asks_for() -> None:
    assert spec_summary(spec_of()) == (
        "llama-3.1-8b 131,072 × 1.0; lmsysorg/sglang:v0.5.23 auto; prefill 1 × TP 1 80 GiB; "
        "decode 1 × TP 1 80 GiB"
    )


def test_rollback_without_a_revision_asks_for_the_newest_that_served_before_the_spec() -> None:
    md, (_, b, _, _) = _three_revisions()
    plan = plan_rollback(md, None)
    assert (plan.revision, plan.problem) == (b, None)
    assert f"rolling back to revision {b}" in plan.message


def test_rollback_takes_a_row_number_a_revision_or_a_unique_prefix() -> None:
    md, (a, _, _, _) = _three_revisions()
    for asked in ("1", a, a[:6]):
        assert plan_rollback(md, asked).revision == a, asked


def test_rollback_to_a_refused_revision_is_refused_naming_the_refusal() -> None:
    md, (a, b, c, d) = _three_revisions()
    for asked, reason in ((c, "EngineUnsafe"), ("4", "VerificationTimeout")):
        plan = plan_rollback(md, asked)
        assert plan.revision is None and plan.problem is not None
        assert f"was refused ({reason})" in plan.problem, plan.problem
        assert f"{b}, {a}" in plan.problem  # what can be asked for, newest first
    del d


def test_rollback_to_a_revision_kvgate_has_no_record_of_is_refused() -> None:
    md, (_, b, _, _) = _three_revisions()
    plan = plan_rollback(md, "ffffffffff")
    assert plan.revision is None and plan.problem is not None
    assert "there is no revision ffffffffff" in plan.problem and b in plan.problem
    empty = plan_rollback(md, " ")
    assert empty.problem is not None and "empty" in empty.problem


def test_a_prefix_that_is_also_a_row_number_is_refused_as_ambiguous() -> None:
    md, (a, _, _, _) = _three_revisions()
    md["status"]["history"][1]["revision"] = "2" + a[1:]  # A's hash starts with 2, B is row 2
    plan = plan_rollback(md, "2")
    assert plan.problem is not None and "give the whole revision" in plan.problem


def test_rollback_to_the_specs_own_revision_writes_nothing() -> None:
    md = serving_md()
    rev = md["status"]["targetRevision"]
    plan = plan_rollback(md, rev)
    assert plan.revision is None and plan.problem is None and "already" in plan.message
    only = plan_rollback(md, None)
    assert only.problem is not None and "no earlier revision" in only.problem


def test_a_recorded_spec_this_kvgate_no_longer_reads_is_refused_as_the_operator_would() -> None:
    md = serving_md()
    md["status"]["history"].append({"revision": "abcdefabcd", "servedAt": T0, "spec": {"model": 1}})
    plan = plan_rollback(md, "abcdefabcd")
    assert plan.problem is not None and "not valid for this kvgate version" in plan.problem


def test_the_rollback_request_is_the_annotation_guarded_by_the_resource_version() -> None:
    assert rollback_request("abcdefabcd", "41") == {
        "metadata": {"annotations": {ROLLBACK_ANNOTATION: "abcdefabcd"}, "resourceVersion": "41"}
    }
    assert rollback_request("abcdefabcd", None) == {
        "metadata": {"annotations": {ROLLBACK_ANNOTATION: "abcdefabcd"}}
    }


def test_a_refused_revision_a_status_of_an_earlier_kvgate_names_is_listed_last() -> None:
    """status.refusedRevision without status.refusals (written before kvgate kept the record):
    the newest refusal, after the recorded ones."""
    md, (_, _, c, d) = _three_revisions()
    md["status"]["refusals"] = md["status"]["refusals"][1:]  # D only
    md["status"]["refusedRevision"] = "e0e0e0e0e0"
    rows = history_rows(md)
    assert [(r.revision, r.outcome) for r in rows][2:] == [
        (c, "refused"),
        (d, "refused"),
        ("e0e0e0e0e0", "refused"),
    ]
    assert rows[4].refusal is None
    plan = plan_rollback(md, "5")
    assert plan.problem is not None and "was refused (status.refusedRevision)" in plan.problem


def test_the_specs_revision_verified_again_after_a_refusal_shows_no_old_refusal() -> None:
    """A refused revision is retried once its Deployments are deleted: status.refusals still
    holds the earlier refusal, the row says verifying, without it."""
    md, (_, _, c, _) = _three_revisions()
    md["status"]["rollout"] = {"verifyStartedAt": T0, "refusal": None}
    row = next(r for r in history_rows(md) if r.revision == c)
    assert (row.outcome, row.refusal) == ("verifying", None)
