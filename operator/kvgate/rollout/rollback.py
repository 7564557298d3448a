"""Revision history and one-command rollback (pure: plain data in, plain data out).

``status.history`` keeps the full spec of the last ``spec.rollout.revisionHistoryLimit`` revisions
that served (newest first), written only by the operator, so a rollback never depends on objects
still running. ``kubectl annotate kvmd <name> kvgate.io/rollback=<revision>`` asks for one of them
back: the operator replaces the spec with the recorded one (as ``kubectl rollout undo`` replaces a
Deployment's template) and removes the annotation. From there it is an ordinary rollout to that
revision: its Deployments are reused if they still run, otherwise re-created, and its engines are
verified before it takes traffic — a rollback is never a shortcut past the gate. The restored
spec goes through the admission webhook like any update (a cluster floor raised since then is
enforced).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate.api.labels import PREFIX

ROLLBACK_ANNOTATION = f"{PREFIX}/rollback"
MAX_HISTORY = 10

Entry = dict[str, Any]  # {"revision", "servedAt", "spec"} as on the wire


def history_in(status: Mapping[str, Any] | None) -> list[Entry]:
    """``status.history`` as written (entries without a revision or spec are ignored)."""
    raw = (status or {}).get("history") or []
    return [
        dict(e)
        for e in raw
        if isinstance(e, Mapping) and e.get("revision") and isinstance(e.get("spec"), Mapping)
    ]


def updated_history(
    previous: Mapping[str, Any] | None,
    *,
    serving_revision: str | None,
    target_revision: str,
    spec: Mapping[str, Any],
    served_at: str,
    limit: int,
) -> list[Entry]:
    """``status.history`` after a pass: the serving revision first (recorded from the current
    spec the first time it serves as the target), then the older ones, at most ``limit``
    (0 keeps none). An entry is never rewritten: a revision's spec is fixed by its hash."""
    known = history_in(previous)
    if (
        serving_revision is not None
        and serving_revision == target_revision
        and all(e["revision"] != serving_revision for e in known)
    ):
        known.insert(0, {"revision": serving_revision, "servedAt": served_at, "spec": dict(spec)})
    elif serving_revision is not None:
        # The serving revision moves to the front (rolled back to, it is the newest again).
        known.sort(key=lambda e: e["revision"] != serving_revision)
    return known[: max(0, min(limit, MAX_HISTORY))]


@dataclass(frozen=True)
class RollbackDecision:
    """What to do with a ``kvgate.io/rollback`` annotation. ``spec`` is the spec to restore
    (None: leave the spec alone); the annotation is always removed once decided."""

    spec: Mapping[str, Any] | None
    event_type: str  # Normal | Warning
    reason: str
    message: str


def decide_rollback(
    requested: str | None,
    history: Sequence[Entry],
    *,
    target_revision: str,
    revision_of: Callable[[Mapping[str, Any]], str | None],
) -> RollbackDecision | None:
    """None when nothing was requested; else restore, or refuse saying what can be asked for.

    ``revision_of`` hashes a recorded spec as this operator would (None: it no longer parses);
    a spec that no longer hashes to its recorded revision (a kvgate upgrade changed the spec's
    defaults) is still restored, and the message says which revision it becomes."""
    if requested is None:
        return None
    wanted = requested.strip()
    known = [e["revision"] for e in history]
    listing = ", ".join(known) if known else "none recorded yet"
    if not wanted:
        return RollbackDecision(
            None,
            "Warning",
            "RollbackRefused",
            f"annotation {ROLLBACK_ANNOTATION} is empty; set it to one of the revisions in "
            f"status.history ({listing})",
        )
    if wanted == target_revision:
        return RollbackDecision(
            None,
            "Normal",
            "RollbackNotNeeded",
            f"revision {wanted} is already the spec's revision; nothing to roll back",
        )
    matches = [e for e in history if e["revision"] == wanted or e["revision"].startswith(wanted)]
    if len(matches) != 1:
        why = "matches more than one" if matches else "is not one of"
        return RollbackDecision(
            None,
            "Warning",
            "RollbackRefused",
            f"{ROLLBACK_ANNOTATION}={wanted} {why} the revisions kept in status.history "
            f"({listing}; spec.rollout.revisionHistoryLimit keeps that many); annotate with one "
            "of them",
        )
    return _restore(matches[0], revision_of)


def _restore(
    entry: Entry, revision_of: Callable[[Mapping[str, Any]], str | None]
) -> RollbackDecision:
    """Restore the one history entry asked for, unless its recorded spec no longer parses."""
    becomes = revision_of(entry["spec"])
    if becomes is None:
        return RollbackDecision(
            None,
            "Warning",
            "RollbackRefused",
            f"the recorded spec of revision {entry['revision']} is not valid for this kvgate "
            "version; apply the spec you want instead",
        )
    note = (
        ""
        if becomes == entry["revision"]
        else f" (this kvgate version hashes it as revision {becomes})"
    )
    return RollbackDecision(
        entry["spec"],
        "Normal",
        "RollbackStarted",
        f"rolling back to revision {entry['revision']}{note}, which served from "
        f"{entry.get('servedAt') or 'an unknown time'}: its spec is restored and its engines "
        "are verified before it takes traffic",
    )


def rollback_patch(decision: RollbackDecision, resource_version: str | None) -> list[Entry]:
    """The JSON patch that applies a decision: guarded by the resourceVersion read (a spec
    changed meanwhile wins), the spec replaced when restoring, the annotation removed."""
    ops: list[Entry] = []
    if resource_version:
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})
    if decision.spec is not None:
        ops.append({"op": "replace", "path": "/spec", "value": dict(decision.spec)})
    key = ROLLBACK_ANNOTATION.replace("~", "~0").replace("/", "~1")
    ops.append({"op": "remove", "path": f"/metadata/annotations/{key}"})
    return ops


__all__ = [
    "MAX_HISTORY",
    "ROLLBACK_ANNOTATION",
    "RollbackDecision",
    "decide_rollback",
    "history_in",
    "rollback_patch",
    "updated_history",
]
