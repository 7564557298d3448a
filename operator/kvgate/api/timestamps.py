"""The timestamps kvgate writes into the API (pure): RFC 3339 in UTC, to the second, as
Kubernetes writes ``lastTransitionTime`` and ``creationTimestamp``."""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: datetime) -> str:
    """``moment`` as ``2026-11-05T12:00:00Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
