"""``status.refusals``: the revisions verification refused, newest first, each with its reason and
message, as kvgate decided them (pure: plain data in, plain data out).

Only the operator writes the status (the status subresource), so this record, not the
``RolloutRefused`` Events, is what ``kvgate history`` lists as refused and what ``kvgate
rollback`` refuses to ask for: Events expire, and anyone who may create Events in the namespace
(the built-in ``edit`` role) can write one with kvgate's reason, wording and reporter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The most refusals kept (the CRD's maxItems for status.refusals).
MAX_REFUSALS = 10


@dataclass(frozen=True)
class RefusedRevision:
    """One revision kvgate refused: what ``kvgate history`` shows for it."""

    revision: str
    reason: str
    message: str
    refused_at: str | None  # RFC 3339; None for a record without a time

    def wire(self) -> dict[str, Any]:
        """As in ``status.refusals`` (camelCase; no ``refusedAt`` when its time is unknown)."""
        wire: dict[str, Any] = {
            "revision": self.revision,
            "reason": self.reason,
            "message": self.message,
        }
        if self.refused_at is not None:
            wire["refusedAt"] = self.refused_at
        return wire


def refusals_in(status: Mapping[str, Any] | None) -> list[RefusedRevision]:
    """``status.refusals`` as written, newest first (entries without a revision or a reason are
    ignored; a revision listed twice counts once, its first entry)."""
    found: list[RefusedRevision] = []
    for raw in (status or {}).get("refusals") or []:
        if not isinstance(raw, Mapping):
            continue
        revision, reason = raw.get("revision"), raw.get("reason")
        if not isinstance(revision, str) or not revision or not isinstance(reason, str):
            continue
        if not reason or any(r.revision == revision for r in found):
            continue
        at = raw.get("refusedAt")
        found.append(
            RefusedRevision(
                revision,
                reason,
                str(raw.get("message") or ""),
                at if isinstance(at, str) and at else None,
            )
        )
    return found


def updated_refusals(
    previous: Mapping[str, Any] | None,
    refused: RefusedRevision | None,
    *,
    new: bool,
) -> list[dict[str, Any]]:
    """``status.refusals`` after a pass: ``refused`` (the target's refusal this pass, if any) at
    the front when it was decided this pass (``new``) or is not recorded yet (a status written
    before the record existed, or a lost write), else the record unchanged; at most
    ``MAX_REFUSALS``, the oldest dropped. A recorded refusal keeps its time: it is decided once."""
    known = refusals_in(previous)
    if refused is not None and (new or all(r.revision != refused.revision for r in known)):
        known = [refused, *(r for r in known if r.revision != refused.revision)]
    return [r.wire() for r in known[:MAX_REFUSALS]]


__all__ = ["MAX_REFUSALS", "RefusedRevision", "refusals_in", "updated_refusals"]
