"""SGLang's KV canary as a live signal (pure): find a violation in an engine's log.

With ``--kv-canary log`` (``safety.kvCanary``), SGLang 0.5.23 paints KV slots with a token/position
chain and verifies them on every forward; it reports only in its log (never in an API or a
metric). The two line shapes, from the 0.5.23 source:

- ``srt/kv_canary/runner/violation_reporter.py:_format_violation``, one WARNING per violation,
  whose first line is frozen ("Format frozen: do not reorder / rename / change separators"):
  ``kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=verify_position slot_idx=17
  position=3 stored_token=... expected_token=... stored_chain_hash=0x... expected_aux=0x...``
  followed by ``KV cache canary violation detected (...)`` and indented detail lines;
- ``srt/kv_canary/runner/stats_logger.py``, every ``stats_print_every_n_steps``, INFO:
  ``[canary] step=%d protected_tokens=%d sweep_passes=%d violations=%d launch_tags_active=%d/%d``
  where ``violations`` is the running total (the device ring's write index).

Each line carries SGLang's prefix ``[2026-11-05 12:00:00 TP0] `` (``configure_logger``; the
scheduler adds its ranks: `` DP<d>``, `` PP<p>``, `` TP<t>``, `` EP<e>`` when that size is above
one, ``managers/scheduler.py``), and the pods/log API adds an RFC 3339 timestamp when asked
(``timestamps=true``), which is what a follower resumes from. Either shape with a violation
count above zero trips the gate.

Every tensor-parallel rank's ModelRunner installs the canary in its own scheduler process and
logs its own violations, with no rank filter (``kv_canary/runner/violation_reporter.py``). A
multi-node engine's pods of node rank 1 and up run only schedulers, so a corrupt slot on one of
their ranks shows only in that pod's log: each worker pod is followed too, and its violation
turns its group leader's gate False (``worker_pod``, ``node_rank``, ``leader_pod``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

REASON = "KvCanaryViolation"
MAX_LINE_BYTES = 16 * 1024  # longer lines are cut (a canary line is < 400 bytes)
MAX_DETAIL_CHARS = 300

VIOLATION_RE = re.compile(
    r"kv_canary violation: launch_tag=(?P<tag>\S+) fail_reason=(?P<reason>\S+) "
    r"slot_idx=(?P<slot>-?\d+) position=(?P<position>-?\d+)"
)
STATS_RE = re.compile(
    r"\[canary\] step=(?P<step>\d+) protected_tokens=\d+ sweep_passes=\d+ "
    r"violations=(?P<violations>\d+) "
)
# SGLang's log prefix with the scheduler's ranks: ``[2026-11-05 12:00:00 DP0 TP3] ``.
RANKS_RE = re.compile(r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?(?P<ranks>(?: [A-Z_]+\d+)+)\] ")
# The pods/log API's timestamps=true prefix: RFC 3339 with nanoseconds, then one space.
TIMESTAMP_RE = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) ")


@dataclass(frozen=True)
class CanaryViolation:
    """The first violation kvgate saw in one engine's log."""

    line: str  # the log line (shortened), for the condition and the Event
    launch_tag: str | None = None  # HEAD_K_FULL, SWEEP_V_FULL, ...; None from a stats line
    fail_reason: str | None = None  # verify_position, verify_chain_hash+write_token, ...
    slot_idx: int | None = None
    position: int | None = None
    total: int | None = None  # violations=N of a stats line
    logged_at: str | None = None  # the pods/log timestamp of the line
    ranks: str | None = None  # the scheduler's ranks in SGLang's prefix ("TP3", "DP0 TP3")
    # On a multi-node engine's worker pod: that pod, its node rank, and its group's leader.
    worker_pod: str | None = None
    node_rank: str | None = None
    leader_pod: str | None = None

    def describe(self) -> str:
        if self.launch_tag is not None:
            return (
                f"SGLang's KV canary reported a violation (launch_tag={self.launch_tag}, "
                f"fail_reason={self.fail_reason}, slot_idx={self.slot_idx}, "
                f"position={self.position})"
            )
        return f"SGLang's KV canary reports violations={self.total} in its stats line"


def split_timestamp(line: str) -> tuple[str | None, str]:
    """``2026-...Z text`` -> (``2026-...Z``, ``text``); (None, line) without the prefix."""
    match = TIMESTAMP_RE.match(line)
    if match is None:
        return None, line
    return match.group("ts"), line[match.end() :]


def parse_line(line: str) -> CanaryViolation | None:
    """A violation in one log line (with or without the pods/log timestamp), else None."""
    stamp, text = split_timestamp(line)
    shown = text.strip()[:MAX_DETAIL_CHARS]
    prefix = RANKS_RE.search(text)
    ranks = prefix.group("ranks").strip() if prefix is not None else None
    match = VIOLATION_RE.search(text)
    if match is not None:
        return CanaryViolation(
            line=shown,
            launch_tag=match.group("tag"),
            fail_reason=match.group("reason"),
            slot_idx=int(match.group("slot")),
            position=int(match.group("position")),
            logged_at=stamp,
            ranks=ranks,
        )
    stats = STATS_RE.search(text)
    if stats is not None and int(stats.group("violations")) > 0:
        total = int(stats.group("violations"))
        return CanaryViolation(line=shown, total=total, logged_at=stamp, ranks=ranks)
    return None


class LineSplitter:
    """Bytes of a followed log -> complete lines, holding at most MAX_LINE_BYTES: a longer line
    is cut there (its rest is dropped up to the next newline), so a log with no newlines cannot
    make kvgate buffer without bound."""

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._dropping = False

    def feed(self, chunk: bytes) -> list[str]:
        lines: list[str] = []
        start = 0
        while start < len(chunk):
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            if not self._dropping:
                room = self.max_line_bytes - len(self._buffer)
                piece = chunk[start:end]
                self._buffer += piece[:room]
                if len(piece) > room:
                    self._dropping = True  # the rest of this line is dropped
                    lines.append(self._take())
            if newline < 0:
                break
            if not self._dropping:
                lines.append(self._take())
            self._dropping = False
            start = newline + 1
        return lines

    def _take(self) -> str:
        text = self._buffer.decode(errors="replace")
        self._buffer.clear()
        return text


def resume_from(last_stamp: str | None) -> str | None:
    """The ``sinceTime`` to reconnect with: the last line's timestamp (the API's sinceTime is
    inclusive to the second, so lines of that second are read again; parse_line is idempotent
    and the first violation trips the gate once)."""
    if last_stamp is None:
        return None
    try:
        moment = datetime.fromisoformat(last_stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def message(violation: CanaryViolation) -> str:
    """The gate condition's and the Event's text (after ``<role> pod <name>: ``): what was
    seen, where, and the way out."""
    when = f" at {violation.logged_at}" if violation.logged_at else ""
    if violation.worker_pod is not None:
        rank = f"node rank {violation.node_rank}" + (
            f", {violation.ranks}" if violation.ranks else ""
        )
        return (
            f"worker pod {violation.worker_pod} ({rank}) of this group: {violation.describe()}"
            f"{when}: {violation.line!r}; the group's KV cache is corrupt, so the group takes no "
            f"traffic. Delete the leader pod {violation.leader_pod} to replace the group "
            "(LeaderWorkerSet recreates every rank, verified again); the canary follows every "
            "rank's log while safety.kvCanary is true"
        )
    where = f" on {violation.ranks}" if violation.ranks else ""
    return (
        f"{violation.describe()}{where}{when}: {violation.line!r}; the "
        "engine's KV cache is corrupt, so it takes no traffic. Delete the pod to replace it "
        "(its new engine is verified again); the canary follows every verified engine while "
        "safety.kvCanary is true"
    )
