"""Container logs on the loopback kubelet, as containerd writes them and the kubelet serves them.

Writing (containerd's ``pkg/cri/io/logger.go`` ``redirectLogs``): each stream of a container
instance is cut into records of the CRI log format, one per line,
``<RFC 3339 nano time> <stdout|stderr> <F|P> <content>\\n``: ``F`` ends a line, ``P`` is a part of a
longer one (cut at ``MAX_LINE_BYTES``, containerd's ``max_container_log_line_size``) or the
unterminated rest at end of stream. The time is taken when the line is read from the pipe.
Each instance has its own file, ``<restartCount>.log`` as the kubelet names them.

Reading (k8s.io/cri-client ``pkg/logs/logs.go`` ``ReadLogs`` and ``tail.go``, v0.37.2, behind
the kubelet's ``GET /containerLogs/<ns>/<pod>/<container>``):

- ``tailLines=N`` starts at the last N lines of the file (0: none), counted in records;
- ``sinceTime``/``sinceSeconds`` skip records older than the later of the two (inclusive);
- ``timestamps=true`` prefixes each line with its time (``2006-01-02T15:04:05.000000000Z``), not
  the continuations of a partial line;
- ``limitBytes=N`` stops after N bytes of output (prefixes included), the last line cut;
- ``follow=true`` waits for more at the end of the file and ends once the instance has exited
  and its log is read to the end; without follow (and with tailLines) it ends at the end.

``parse_log_options`` reads the query as the kubelet does (``tail`` is the old name of
``tailLines``; 400 for a value it cannot decode, 422 for one ``ValidatePodLogOptions`` refuses).
``container_id_for_logs`` picks the instance from the container's status exactly as
``validateContainerLogStatus`` (``pkg/kubelet/kubelet_pods.go``) does, with its messages.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

MAX_LINE_BYTES = 16 * 1024  # containerd's default max_container_log_line_size
STDOUT, STDERR = "stdout", "stderr"
FULL, PARTIAL = b"F", b"P"
READ_BLOCK = 64 * 1024
FORCE_CHECK_SECONDS = 1.0  # logForceCheckPeriod: look again even without a change signal

_TIME_RE = re.compile(
    r"^(?P<date>\d{4}-\d\d-\d\d)T(?P<time>\d\d:\d\d:\d\d)(?:\.(?P<frac>\d{1,9}))?"
    r"(?P<zone>Z|[+-]\d\d:\d\d)$"
)
_BOOL = {
    "1": True, "t": True, "T": True, "TRUE": True, "true": True, "True": True,
    "0": False, "f": False, "F": False, "FALSE": False, "false": False, "False": False,
}  # fmt: skip


def format_timestamp(ns: int) -> str:
    """RFC3339NanoFixed in UTC: ``2026-12-01T19:55:10.123456789Z``."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    whole = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{nanos:09d}Z"


def parse_timestamp(text: str) -> int:
    """Nanoseconds since the epoch from RFC 3339 with or without a fraction (Go's lenient
    RFC3339Nano); ValueError otherwise."""
    match = _TIME_RE.match(text)
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    zone = match.group("zone").replace("Z", "+00:00")
    base = datetime.fromisoformat(f"{match.group('date')}T{match.group('time')}{zone}")
    frac = (match.group("frac") or "").ljust(9, "0")
    return int(base.timestamp()) * 1_000_000_000 + int(frac or 0)


# ------------------------------------------------------------------ writing
class CriFramer:
    """One stream's bytes -> CRI records (containerd's ``redirectLogs``)."""

    def __init__(
        self,
        stream: str,
        max_line_bytes: int = MAX_LINE_BYTES,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.stream = stream.encode()
        self.max_line_bytes = max_line_bytes
        self.clock = clock
        self._buffer = bytearray()

    def _record(self, tag: bytes, content: bytes | bytearray) -> bytes:
        stamp = format_timestamp(self.clock()).encode()
        return b"%s %s %s %s\n" % (stamp, self.stream, tag, bytes(content))

    def feed(self, data: bytes) -> list[bytes]:
        """Records for every line ``data`` completes, and a ``P`` record for each full
        ``max_line_bytes`` of a longer line."""
        out: list[bytes] = []
        self._buffer += data
        while True:
            newline = self._buffer.find(b"\n", 0, self.max_line_bytes + 1)
            if newline >= 0:
                out.append(self._record(FULL, self._buffer[:newline]))
                del self._buffer[: newline + 1]
            elif len(self._buffer) > self.max_line_bytes:
                out.append(self._record(PARTIAL, self._buffer[: self.max_line_bytes]))
                del self._buffer[: self.max_line_bytes]
            else:
                return out

    def close(self) -> list[bytes]:
        """End of stream: what is left (a line without its newline) as a partial record."""
        if not self._buffer:
            return []
        rest, self._buffer = bytes(self._buffer), bytearray()
        return [self._record(PARTIAL, rest)]


# ------------------------------------------------------------------ reading
@dataclass(frozen=True)
class LogRecord:
    timestamp_ns: int
    stream: str
    partial: bool
    content: bytes  # what the kubelet writes: with the line's newline unless partial


def parse_record(line: bytes) -> LogRecord | None:
    """One CRI record (``parseCRILog``); None if it is not one (the kubelet skips it)."""
    parts = line.split(b" ", 3)
    if len(parts) < 4:
        return None
    stamp, stream, tags, content = parts
    try:
        ns = parse_timestamp(stamp.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    if stream not in (b"stdout", b"stderr"):
        return None
    partial = tags.split(b":")[0] == PARTIAL
    if partial and content.endswith(b"\n"):
        content = content[:-1]
    return LogRecord(ns, stream.decode(), partial, content)


class LogOptionsError(ValueError):
    """A query the kubelet refuses: ``status`` and the body it answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class LogOptions:
    """``v1.PodLogOptions`` as the kubelet decodes them from the query."""

    follow: bool = False
    previous: bool = False
    timestamps: bool = False
    since_seconds: int | None = None
    since_time_ns: int | None = None
    tail_lines: int | None = None
    limit_bytes: int | None = None
    stream: str | None = None  # PodLogsQuerySplitStreams (alpha, off): only "All" is served

    def since_ns(self, now_ns: int) -> int:
        """``ReadLogs``' ``Since``: the later of now - sinceSeconds and sinceTime (0: none)."""
        since = 0
        if self.since_seconds is not None:
            since = now_ns - self.since_seconds * 1_000_000_000
        if self.since_time_ns is not None and self.since_time_ns > since:
            since = self.since_time_ns
        return since


def parse_log_options(query: Mapping[str, str]) -> LogOptions:
    """The kubelet's decoding and validation of a ``containerLogs`` query."""
    params = dict(query)
    tail = params.pop("tail", None)
    if tail is not None and tail != "":
        if tail == "all":
            params.pop("tailLines", None)
        else:
            params["tailLines"] = tail

    def flag(name: str) -> bool:
        value = params.get(name)
        if value is None or value == "":
            return False
        if value not in _BOOL:
            raise LogOptionsError(400, '{"message": "Unable to decode query."}')
        return _BOOL[value]

    def integer(name: str) -> int | None:
        value = params.get(name)
        if value is None or value == "":
            return None
        try:
            return int(value)
        except ValueError:
            raise LogOptionsError(400, '{"message": "Unable to decode query."}') from None

    since_time = params.get("sinceTime")
    since_time_ns = None
    if since_time:
        try:
            since_time_ns = parse_timestamp(since_time)
        except ValueError:
            raise LogOptionsError(400, '{"message": "Unable to decode query."}') from None
    opts = LogOptions(
        follow=flag("follow"),
        previous=flag("previous"),
        timestamps=flag("timestamps"),
        since_seconds=integer("sinceSeconds"),
        since_time_ns=since_time_ns,
        tail_lines=integer("tailLines"),
        limit_bytes=integer("limitBytes"),
        stream=params.get("stream") or None,
    )
    invalid = (
        (opts.tail_lines is not None and opts.tail_lines < 0)
        or (opts.limit_bytes is not None and opts.limit_bytes < 1)
        or (opts.since_seconds is not None and opts.since_seconds < 1)
        or (opts.since_seconds is not None and opts.since_time_ns is not None)
        or (opts.stream is not None and opts.stream not in ("All", "Stdout", "Stderr"))
    )
    if invalid:
        raise LogOptionsError(422, '{"message": "Invalid request."}')
    if opts.stream not in (None, "All"):
        raise LogOptionsError(
            400,
            f'unable to return the given log stream: "{opts.stream}". Please enable '
            "PodLogsQuerySplitStreams feature gate in kubelet",
        )
    return opts


def tail_start(f: BinaryIO, n: int | None, block: int = 1024) -> int:
    """``findTailLineStartIndex``: the offset of the last ``n`` lines (an unterminated last line
    is not counted); 0 for None (all lines)."""
    if n is None or n < 0:
        return 0
    size = f.seek(0, 2)
    count = 0
    left = size
    buf = b""
    right = size
    while right > 0 and count <= n:
        left = max(right - block, 0)
        f.seek(left)
        buf = f.read(right - left)
        count += buf.count(b"\n")
        right -= block
    while count > n:
        idx = buf.index(b"\n") + 1
        buf = buf[idx:]
        left += idx
        count -= 1
    return left


class LogWriter:
    """``logWriter``: since, timestamps and limitBytes applied to one record at a time."""

    def __init__(self, opts: LogOptions, since_ns: int) -> None:
        self.opts = opts
        self.since_ns = since_ns
        self.remain = opts.limit_bytes if opts.limit_bytes is not None else math.inf
        self.new_line = True

    @property
    def exhausted(self) -> bool:
        return self.remain <= 0

    def render(self, record: LogRecord) -> bytes:
        """The bytes to send for ``record`` (maybe none); ``exhausted`` once the limit is hit."""
        add_prefix = self.new_line
        self.new_line = not record.content or record.content.endswith(b"\n")
        if record.timestamp_ns < self.since_ns:
            return b""
        line = record.content
        if self.opts.timestamps and add_prefix:
            line = format_timestamp(record.timestamp_ns).encode() + b" " + line
        if len(line) > self.remain:
            line = line[: int(self.remain)]
        self.remain -= len(line)
        return line


def select_records(data: bytes, opts: LogOptions, now_ns: int) -> bytes:
    """Everything a request without follow gets from a whole log file's ``data`` (for tests and
    small reads; ``stream_log`` does the same incrementally)."""
    import io

    f = io.BytesIO(data)
    start = tail_start(f, opts.tail_lines)
    writer = LogWriter(opts, opts.since_ns(now_ns))
    out = bytearray()
    lines = data[start:].split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    limit = opts.tail_lines if opts.tail_lines is not None else math.inf
    rendered, _ = render_lines(lines, writer, limit)
    out += rendered
    return bytes(out)


def render_lines(lines: list[bytes], writer: LogWriter, left: float) -> tuple[bytes, float]:
    """``lines`` (CRI records without their newline) rendered until ``left`` records were
    written or the writer is exhausted; returns the bytes and how many records may still go."""
    out = bytearray()
    for raw in lines:
        if left <= 0 or writer.exhausted:
            break
        record = parse_record(raw + b"\n")
        if record is None:
            continue
        out += writer.render(record)
        left -= 1
    return bytes(out), left


async def stream_log(
    path: Path,
    opts: LogOptions,
    *,
    finished: Callable[[], bool],
    wait_change: Callable[[float], Awaitable[Any]],
    write: Callable[[bytes], Awaitable[None]],
    now_ns: Callable[[], int] = time.time_ns,
) -> None:
    """``ReadLogs`` over one instance's CRI file: write what ``opts`` selects; with follow, wait
    for more (``wait_change``, at most FORCE_CHECK_SECONDS each) until ``finished()`` (the
    instance exited and its log is complete) and the file is read to its end."""
    writer = LogWriter(opts, opts.since_ns(now_ns()))
    limited = opts.tail_lines is not None and not opts.follow
    left = opts.tail_lines if limited and opts.tail_lines is not None else math.inf
    last_pass = False
    with path.open("rb") as f:
        offset = tail_start(f, opts.tail_lines)
        f.seek(offset)
        pending = b""
        while True:
            chunk = f.read(READ_BLOCK)
            if not chunk:
                if not opts.follow:
                    if pending:  # an unterminated last record is still parsed
                        record = parse_record(pending)
                        if record is not None and left > 0:
                            await write(writer.render(record))
                    return
                if last_pass:
                    return
                if finished():
                    last_pass = True  # read what came before the end once more
                    continue
                await wait_change(FORCE_CHECK_SECONDS)
                continue
            data = pending + chunk
            lines = data.split(b"\n")
            pending = lines.pop()
            out, left = render_lines(lines, writer, left)
            if out:
                await write(out)
            if left <= 0 or writer.exhausted:
                return


# ------------------------------------------------------------------ which instance
class ContainerLogError(LookupError):
    """No log to serve for this request (the kubelet answers 400 with the message)."""


def container_id_for_logs(status: Mapping[str, Any] | None, container: str, pod: str, *,
                          previous: bool) -> str:  # fmt: skip
    """``validateContainerLogStatus``: the container ID whose log a request reads, from the
    container's status entry; ContainerLogError with the kubelet's message otherwise."""
    if status is None:
        raise ContainerLogError(f'container "{container}" in pod "{pod}" is not available')
    last = (status.get("lastState") or {}).get("terminated")
    state = status.get("state") or {}
    waiting, running, terminated = (
        state.get("waiting"),
        state.get("running"),
        state.get("terminated"),
    )
    if previous:
        if not last or not last.get("containerID"):
            raise ContainerLogError(
                f'previous terminated container "{container}" in pod "{pod}" not found'
            )
        return str(last["containerID"])
    if running is not None:
        return str(status.get("containerID") or "")
    if terminated is not None:
        if terminated.get("containerID"):
            return str(terminated["containerID"])
        if last and last.get("containerID"):
            return str(last["containerID"])
        raise ContainerLogError(f'container "{container}" in pod "{pod}" is terminated')
    if last is not None:
        if not last.get("containerID"):
            raise ContainerLogError(f'container "{container}" in pod "{pod}" is terminated')
        return str(last["containerID"])
    if waiting is not None:
        raise ContainerLogError(
            f'container "{container}" in pod "{pod}" is waiting to start: '
            f"{waiting.get('reason', '')}"
        )
    raise ContainerLogError(
        f'container "{container}" in pod "{pod}" is waiting to start - no logs yet'
    )
