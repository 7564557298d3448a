"""SGLang's KV canary as a live signal (pure): find a violation in an engine's log.

With ``--kv-canary log`` (``safety.kvCanary``), SGLang (0.5.19 and later) paints KV slots with a
token/position chain and verifies them on every forward; it reports only in its log (never in an
API or a metric). The two line shapes, the same in every supported release:

- ``srt/kv_canary/runner/violation_reporter.py:_format_violation``, one WARNING per violation,
  whose first line is frozen ("Format frozen: do not reorder / rename / change separators"):
  ``kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=verify_position slot_idx=17
  position=3 stored_token=... expected_token=... stored_chain_hash=0x... expected_aux=0x...``
  followed by ``KV cache canary violation detected (...)`` and indented detail lines;
- ``srt/kv_canary/runner/stats_logger.py``, every ``stats_print_every_n_steps``, INFO:
  ``[canary] step=%d protected_tokens=%d sweep_passes=%d violations=%d launch_tags_active=%d/%d``
  where ``violations`` is the running total (the device ring's write index).

Only SGLang's own record counts, never a substring: a line is read as a violation only when it is
SGLang's log prefix (``configure_logger``: ``[%(asctime)s{ms}{ranks}] %(message)s``, e.g.
``[2026-11-05 12:00:00 DP0 TP3] ``; the scheduler's ranks `` DP<d>``, `` PP<p>``,
`` ATTN_CP<c>``, `` MOE_DP<m>``, `` TP<t>``, `` EP<e>`` in that order, ``managers/scheduler.py``)
followed by the record and nothing else, every field parsed and checked: ``launch_tag`` one of
SGLang's ``CanaryLaunchTag`` names (or its ``unknown(N)``), ``fail_reason`` ``none`` or
``FailReason`` labels joined by ``+`` in the enum's order, the four numbers integers, the two
hashes ``0x`` and 16 lowercase hex digits; a stats line must be whole too. Engine lines carry
client-chosen text (request ids and prompts with ``--log-requests``, an error quoting bootstrap
input), so a record that is quoted inside another message, follows other text, lacks the prefix
or has one field out of shape trips nothing; what kvgate reports quotes the parsed fields, never
the line. The pods/log API adds an RFC 3339 timestamp when asked (``timestamps=true``), which is
what a follower resumes from.

What this cannot tell apart: a complete, well-formed record that begins a physical line. SGLang's
request logger quotes strings with ``repr`` (``utils/request_logger.py``), so a newline in a
request id or prompt stays ``\\n`` there; a log path that wrote a client's raw newline would let
that client write such a line (docs/threat-model.md).

Every tensor-parallel rank's ModelRunner installs the canary in its own scheduler process and
logs its own violations, with no rank filter (``kv_canary/runner/violation_reporter.py``). A
multi-node engine's pods of node rank 1 and up run only schedulers, so a corrupt slot on one of
their ranks shows only in that pod's log: each worker pod is followed too, and its violation
turns its group leader's gate False (``worker_pod``, ``node_rank``, ``leader_pod``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kvgate.api.timestamps import parse_rfc3339, rfc3339

REASON = "KvCanaryViolation"
MAX_LINE_BYTES = 16 * 1024  # longer lines are cut (a canary line is < 400 bytes)

# SGLang's CanaryLaunchTag names (kernels/ops/kv_canary/verify.py) and FailReason labels in the
# enum's order (kernels/ops/kv_canary/consts.py, ``name.lower().removesuffix("_mismatch")``), the
# same in every supported release (tests/conformance/test_kv_canary_format.py checks each).
LAUNCH_TAGS = frozenset(
    f"{stage}_{kv}_{pool}"
    for pool in ("FULL", "SWA")
    for stage in ("HEAD", "TAIL", "SWEEP")
    for kv in ("K", "V")
)
FAIL_REASONS = (
    "verify_chain_hash",
    "verify_position",
    "verify_real_kv_hash",
    "write_token",
    "write_position",
    "verify_token",
)
_INT = r"-?\d{1,20}"
_HASH = r"0x[0-9a-f]{16}"  # f"{u64:#018x}"
# SGLang's log prefix: ``[2026-11-05 12:00:00.123 DP0 TP3] `` (milliseconds with SGLANG_LOG_MS).
PREFIX_RE = re.compile(
    r"\[(?P<asctime>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d{3})?)"
    r"(?P<ranks>(?: DP\d+)?(?: PP\d+)?(?: ATTN_CP\d+)?(?: MOE_DP\d+)?(?: TP\d+)?(?: EP\d+)?)\] "
)
# The first line of _format_violation's message, whole ("Format frozen" in SGLang's source).
VIOLATION_RE = re.compile(
    rf"kv_canary violation: launch_tag=(?P<tag>[A-Z_]{{1,20}}|unknown\({_INT}\)) "
    rf"fail_reason=(?P<reason>[a-z_+]{{1,200}}) slot_idx=(?P<slot>{_INT}) "
    rf"position=(?P<position>{_INT}) stored_token=(?P<stored>{_INT}) "
    rf"expected_token=(?P<expected>{_INT}) stored_chain_hash=(?P<hash>{_HASH}) "
    rf"expected_aux=(?P<aux>{_HASH})"
)
# stats_logger.py's INFO line, whole.
STATS_RE = re.compile(
    r"\[canary\] step=(?P<step>\d{1,20}) protected_tokens=\d{1,20} sweep_passes=\d{1,20} "
    r"violations=(?P<violations>\d{1,20}) launch_tags_active=(?P<active>\d{1,3})/(?P<tags>\d{1,3})"
)
# The pods/log API's timestamps=true prefix: RFC 3339 with nanoseconds, then one space.
TIMESTAMP_RE = re.compile(r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) ")


@dataclass(frozen=True)
class CanaryViolation:
    """The first violation kvgate saw in one engine's log: the record's parsed fields only."""

    launch_tag: str | None = None  # HEAD_K_FULL, SWEEP_V_FULL, ...; None from a stats line
    fail_reason: str | None = None  # verify_position, verify_chain_hash+write_token, ...
    slot_idx: int | None = None
    position: int | None = None
    stored_token: int | None = None
    expected_token: int | None = None
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
                f"position={self.position}, stored_token={self.stored_token}, "
                f"expected_token={self.expected_token})"
            )
        return f"SGLang's KV canary reports violations={self.total} in its stats line"


def split_timestamp(line: str) -> tuple[str | None, str]:
    """``2026-...Z text`` -> (``2026-...Z``, ``text``); (None, line) without the prefix."""
    match = TIMESTAMP_RE.match(line)
    if match is None:
        return None, line
    return match.group("ts"), line[match.end() :]


def _launch_tag_ok(tag: str) -> bool:
    return tag in LAUNCH_TAGS or tag.startswith("unknown(")


def _fail_reason_ok(reason: str) -> bool:
    """``none``, or FailReason labels joined by ``+``, each once, in the enum's order (how
    _format_violation writes them)."""
    if reason == "none":
        return True
    labels = reason.split("+")
    if any(label not in FAIL_REASONS for label in labels):
        return False
    order = [FAIL_REASONS.index(label) for label in labels]
    return order == sorted(set(order))


def parse_line(line: str) -> CanaryViolation | None:
    """SGLang's violation record (or a stats line counting violations) as one whole log line,
    with or without the pods/log timestamp, else None."""
    stamp, text = split_timestamp(line)
    prefix = PREFIX_RE.match(text)
    if prefix is None:
        return None
    ranks = prefix.group("ranks").strip() or None
    message = text[prefix.end() :].rstrip("\r")
    record = VIOLATION_RE.fullmatch(message)
    if record is not None:
        tag, reason = record.group("tag"), record.group("reason")
        if not (_launch_tag_ok(tag) and _fail_reason_ok(reason)):
            return None
        return CanaryViolation(
            launch_tag=tag,
            fail_reason=reason,
            slot_idx=int(record.group("slot")),
            position=int(record.group("position")),
            stored_token=int(record.group("stored")),
            expected_token=int(record.group("expected")),
            logged_at=stamp,
            ranks=ranks,
        )
    stats = STATS_RE.fullmatch(message)
    if stats is None or int(stats.group("tags")) != len(LAUNCH_TAGS):
        return None
    if int(stats.group("active")) > len(LAUNCH_TAGS) or int(stats.group("violations")) == 0:
        return None
    return CanaryViolation(total=int(stats.group("violations")), logged_at=stamp, ranks=ranks)


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
    moment = parse_rfc3339(last_stamp)
    return None if moment is None else rfc3339(moment)


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
            f"{when}; the group's KV cache is corrupt, so the group takes no "
            f"traffic. Delete the leader pod {violation.leader_pod} to replace the group "
            "(LeaderWorkerSet recreates every rank, verified again); the canary follows every "
            "rank's log while safety.kvCanary is true"
        )
    where = f" on {violation.ranks}" if violation.ranks else ""
    return (
        f"{violation.describe()}{where}{when}; the "
        "engine's KV cache is corrupt, so it takes no traffic. Delete the pod to replace it "
        "(its new engine is verified again); the canary follows every verified engine while "
        "safety.kvCanary is true"
    )
