"""``kvgate history`` and ``kvgate rollback``: a ModelDeployment's revisions, and which one a
rollback asks for. Pure: the objects read from the API in, rows and a decision out.

The revisions come only from the operator's own record, the ModelDeployment's status, which
only kvgate writes (docs/rollouts.md): ``status.history`` (the revisions that served, newest
first, each with its spec: what ``kvgate.io/rollback`` can restore), ``status.targetRevision``
and ``servingRevision``, ``status.rollout.refusal``, ``status.refusals`` (the last ten refused
revisions, ``kvgate.rollout.refusal_record``) and ``status.refusedRevision``. Never from Events:
anyone who may create Events in the namespace can write a ``RolloutRefused`` in kvgate's wording,
naming kvgate as its reporter, so an Event decides no row, no row number and no rollback target.

A rollback writes one thing: the annotation ``kvgate.io/rollback=<revision>`` the operator acts
on (``kvgate.rollout.rollback``), guarded by the resourceVersion read. Before writing, the same
decision the operator makes is made here (``decide_rollback``), so a revision the operator would
refuse is refused here with exit 2 and nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvgate.api.models import ModelDeploymentSpec
from kvgate.api.revision import revision_of
from kvgate.rollout.refusal_record import refusals_in
from kvgate.rollout.rollback import ROLLBACK_ANNOTATION, decide_rollback, history_in

# A --to-revision of at most this many digits may be a row number of `kvgate history`.
ROW_NUMBER_DIGITS = 3

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Row:
    """One revision in ``kvgate history``."""

    number: int  # its place in this listing, oldest first (not stable across changes)
    revision: str
    outcome: str  # serving | served | refused | verifying | in a progressive step
    served_at: str | None
    refusal: tuple[str, str] | None  # (reason, message)
    summary: str  # what its spec asks for ("" when the spec is not recorded)
    restorable: bool  # in status.history: kvgate.io/rollback can restore it
    is_spec: bool  # the spec's own revision (status.targetRevision)


@dataclass(frozen=True)
class RollbackPlan:
    """What ``kvgate rollback`` does: write the annotation (``revision`` set), or nothing
    (``revision`` None, ``message`` says why: already there), or refuse (``problem``)."""

    revision: str | None
    message: str
    problem: str | None = None


def _map(value: object) -> Obj:
    return value if isinstance(value, Mapping) else {}


def spec_summary(spec: Obj) -> str:
    """``llama-3.1-8b 131,072 × 1.0; lmsysorg/sglang:v0.5.23 auto; prefill 1 × TP 1 80 GiB;
    decode 1 × TP 1 80 GiB`` from a spec as written (missing fields left out)."""
    model, engine, safety = (
        _map(spec.get("model")),
        _map(spec.get("engine")),
        _map(spec.get("safety")),
    )
    context = model.get("contextLength")
    head = str(model.get("name") or "?")
    if isinstance(context, int):
        head += f" {context:,} × {safety.get('headroom', 1.0)}"
    parts = [head, f"{engine.get('image', '?')} {engine.get('kvCacheDtype', 'auto')}"]
    for role in ("prefill", "decode"):
        shape = _map(spec.get(role))
        gib = shape.get("gpuMemoryGiB")
        memory = f" {gib:g} GiB" if isinstance(gib, int | float) else ""
        parts.append(
            f"{role} {shape.get('replicas', 1)} × TP {shape.get('tensorParallel', 1)}{memory}"
        )
    return "; ".join(parts)


@dataclass(frozen=True)
class _Recorded:
    """What the status says of the revisions: which serves, which is the target and whether it
    is refused, and every recorded refusal."""

    serving: str | None
    target: str | None
    target_refusal: tuple[str, str] | None
    in_step: bool
    refusals: Mapping[str, tuple[str, str]]

    @classmethod
    def of(cls, status: Obj) -> _Recorded:
        target = status.get("targetRevision") or None
        rollout = _map(status.get("rollout"))
        refusal = _map(rollout.get("refusal"))
        return cls(
            serving=status.get("servingRevision") or None,
            target=target,
            target_refusal=(
                (str(refusal["reason"]), str(refusal.get("message") or ""))
                if refusal.get("reason") and target
                else None
            ),
            in_step=bool(rollout.get("step")),
            refusals={r.revision: (r.reason, r.message) for r in refusals_in(status)},
        )

    def refusal_of(self, revision: str) -> tuple[str, str] | None:
        if revision == self.target:
            return self.target_refusal  # an earlier refusal of a target verified again: not its own
        return self.refusals.get(revision)

    def outcome(self, revision: str, restorable: bool) -> str:
        if revision == self.serving:
            return "serving"
        if revision == self.target:
            if self.target_refusal is not None:
                return "refused"
            return "in a progressive step" if self.in_step else "verifying"
        return "served" if restorable else "refused"


def history_rows(md: Obj) -> list[Row]:
    """Every revision the ModelDeployment's status records, oldest first: those that served
    (status.history), then the spec's own revision if it has not served, then the other refused
    revisions (status.refusals, oldest first, and status.refusedRevision)."""
    status = _map(md.get("status"))
    recorded = _Recorded.of(status)
    target = recorded.target
    rows = [_served_row(entry, recorded) for entry in reversed(history_in(status))]
    seen = {row.revision for row in rows}
    if target and target not in seen:
        seen.add(target)
        rows.append(
            Row(
                0,
                target,
                recorded.outcome(target, False),
                None,
                recorded.refusal_of(target),
                # The spec is the target's once the operator has read it (else a newer one's).
                spec_summary(_map(md.get("spec")))
                if _revision_of_raw(md.get("spec")) == target
                else "",
                False,
                True,
            )
        )
    rows += _other_refusals(recorded, status.get("refusedRevision") or None, seen)
    return [replace(row, number=number) for number, row in enumerate(rows, start=1)]


def _served_row(entry: Mapping[str, Any], recorded: _Recorded) -> Row:
    """A revision that served (status.history): kvgate.io/rollback can restore it."""
    revision = str(entry["revision"])
    is_target = revision == recorded.target
    return Row(
        0,
        revision,
        recorded.outcome(revision, True),
        entry.get("servedAt") or None,
        recorded.target_refusal if is_target else None,
        spec_summary(_map(entry.get("spec"))),
        True,
        is_target,
    )


def _other_refusals(recorded: _Recorded, refused_revision: str | None, seen: set[str]) -> list[Row]:
    """The refused revisions not listed yet, oldest first. status.refusals is newest first; a
    refusedRevision it lacks (a status written before it existed) is the newest refusal."""
    others = [r for r in reversed(list(recorded.refusals)) if r not in seen]
    if refused_revision and refused_revision not in seen and refused_revision not in others:
        others.append(refused_revision)
    return [
        Row(0, revision, "refused", None, recorded.refusal_of(revision), "", False, False)
        for revision in others
    ]


def history_text(name: str, rows: Sequence[Row]) -> str:
    if not rows:
        return f"{name}: no revision recorded yet (the operator has not processed it)"
    out = [f"{'#':>3}  {'REVISION':<10}  {'OUTCOME':<9}  {'SERVED AT':<20}  SPEC"]
    for row in rows:
        outcome = row.outcome if row.outcome != "in a progressive step" else "stepping"
        out.append(
            f"{row.number:>3}  {row.revision:<10}  {outcome:<9}  {row.served_at or '-':<20}  "
            f"{row.summary or '(spec not recorded)'}"
        )
        if row.refusal is not None:
            out.append(f"{'':>5}refused ({row.refusal[0]}): {row.refusal[1]}")
    restorable = [row.revision for row in rows if row.restorable and not row.is_spec]
    if restorable:
        out.append(
            f"kvgate rollback {name} --to-revision REV restores one of: {', '.join(restorable)}"
        )
    return "\n".join(out)


def row_json(row: Row) -> dict[str, Any]:
    return {
        "number": row.number,
        "revision": row.revision,
        "outcome": row.outcome,
        "served_at": row.served_at,
        "refusal": None
        if row.refusal is None
        else {"reason": row.refusal[0], "message": row.refusal[1]},
        "spec_summary": row.summary,
        "restorable": row.restorable,
        "is_spec": row.is_spec,
    }


# ---------------------------------------------------------------------------------------------
# rollback
# ---------------------------------------------------------------------------------------------


def _revision_of_raw(raw: Any) -> str | None:
    """A recorded spec's revision as this kvgate computes it (the operator's own rule)."""
    try:
        return revision_of(ModelDeploymentSpec.model_validate(raw))
    except Exception:  # a recorded spec this version no longer reads
        return None


def _resolve(wanted: str, rows: Sequence[Row]) -> Row | str:
    """The row --to-revision means (a row number, a revision or a unique prefix of one), or why
    none."""
    by_prefix = [row for row in rows if row.revision.startswith(wanted)]
    exact = [row for row in rows if row.revision == wanted]
    by_number = (
        [row for row in rows if str(row.number) == wanted]
        if wanted.isdigit() and len(wanted) <= ROW_NUMBER_DIGITS
        else []
    )
    if by_number and by_prefix and by_prefix != by_number:
        return (
            f"{wanted} is both row {wanted} of kvgate history ({by_number[0].revision}) and a "
            f"prefix of revision {by_prefix[0].revision}; give the whole revision"
        )
    if exact:
        return exact[0]
    if by_number:
        return by_number[0]
    if len(by_prefix) == 1:
        return by_prefix[0]
    if by_prefix:
        return f"{wanted} is a prefix of more than one revision; give more of it"
    return f"there is no revision {wanted}"


def plan_rollback(md: Obj, to_revision: str | None) -> RollbackPlan:
    """Which revision ``kvgate rollback`` asks the operator for, or why it refuses. Without
    ``to_revision``: the newest revision that served and is not the spec's own (as ``kubectl
    rollout undo``)."""
    status = _map(md.get("status"))
    rows = history_rows(md)
    restorable = [row for row in rows if row.restorable]
    listing = ", ".join(row.revision for row in reversed(restorable)) or "none recorded yet"
    spec = md.get("spec")
    spec_revision = _revision_of_raw(spec) or status.get("targetRevision") or ""
    if to_revision is None:
        earlier = [row for row in reversed(restorable) if row.revision != spec_revision]
        if not earlier:
            return RollbackPlan(
                None,
                "",
                "no earlier revision that served is recorded in status.history (it keeps the "
                "last spec.rollout.revisionHistoryLimit revisions that served: "
                f"{listing}); nothing to roll back to",
            )
        chosen = earlier[0]
    else:
        wanted = to_revision.strip()
        if not wanted:
            return RollbackPlan(None, "", f"--to-revision is empty; give one of: {listing}")
        found = _resolve(wanted, rows)
        if isinstance(found, str):
            return RollbackPlan(
                None, "", f"{found}; revisions that served and can be restored: {listing}"
            )
        chosen = found
    if chosen.outcome == "refused" or (not chosen.restorable and chosen.revision != spec_revision):
        if chosen.refusal is not None:
            why = f"was refused ({chosen.refusal[0]}): {chosen.refusal[1]}"
        elif chosen.outcome == "refused":
            why = "was refused (status.refusedRevision)"
        else:
            why = f"has not served ({chosen.outcome})"
        return RollbackPlan(
            None,
            "",
            f"revision {chosen.revision} {why}; kvgate rolls back only to a revision that "
            f"served and is kept in status.history: {listing}",
        )
    decision = decide_rollback(
        chosen.revision,
        history_in(status),
        target_revision=spec_revision,
        revision_of=_revision_of_raw,
    )
    if decision is None or decision.reason == "RollbackRefused":
        return RollbackPlan(None, "", decision.message if decision else "nothing requested")
    if decision.reason == "RollbackNotNeeded":
        return RollbackPlan(None, decision.message)
    return RollbackPlan(chosen.revision, decision.message)


def rollback_request(revision: str, resource_version: str | None) -> dict[str, Any]:
    """The merge patch that asks the operator for a rollback: the annotation it acts on, with
    the resourceVersion read (a ModelDeployment changed since is not written: HTTP 409)."""
    metadata: dict[str, Any] = {"annotations": {ROLLBACK_ANNOTATION: revision}}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    return {"metadata": metadata}


__all__ = [
    "RollbackPlan",
    "Row",
    "history_rows",
    "history_text",
    "plan_rollback",
    "rollback_request",
    "row_json",
    "spec_summary",
]
