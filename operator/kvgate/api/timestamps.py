"""The timestamps kvgate writes into the API (pure): RFC 3339 in UTC, to the second, as
Kubernetes writes ``lastTransitionTime`` and ``creationTimestamp``."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: datetime) -> str:
    """``moment`` as ``2026-11-05T12:00:00Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(raw: object) -> datetime | None:
    """A time the API holds (``2026-11-05T12:00:00Z`` or with an offset); None when it is
    missing, not a string, or not a time."""
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
