"""Container logs of the loopback kubelet without a cluster: the CRI framing, the kubelet's
selection (tailLines, sinceTime, limitBytes, timestamps), which instance a request reads, the
pump of a real process, follow, and the HTTPS port's authentication (401/403/200)."""

from __future__ import annotations

import asyncio
import io
import itertools
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.x509.oid import ExtendedKeyUsageOID
from kvgate.kube.tls import issue_certificate, make_ca
from kvgate_e2e.kubelet.log_server import KubeletServer, server_ssl_context, user_of
from kvgate_e2e.kubelet.logs import (
    MAX_LINE_BYTES,
    ContainerLogError,
    CriFramer,
    LogOptions,
    LogOptionsError,
    container_id_for_logs,
    format_timestamp,
    parse_log_options,
    parse_record,
    parse_timestamp,
    select_records,
    stream_log,
    tail_start,
)
from kvgate_e2e.kubelet.processes import start_process

T0 = 1_764_000_000_000_000_000  # ns
SECOND = 1_000_000_000
# A deadline, not a bound: a log line followed or a pod worker's task ended, all local processes
# (under a second here); only one that never comes reaches it.
LOCAL_DEADLINE = 20


def clock(step: int = SECOND) -> Iterator[int]:
    return itertools.count(T0, step)


def framed(lines: list[bytes], stream: str = "stdout", step: int = SECOND) -> bytes:
    ticks = clock(step)
    framer = CriFramer(stream, clock=lambda: next(ticks))
    return b"".join(framer.feed(b"".join(lines)) + framer.close())


# ------------------------------------------------------------------ framing
def test_timestamps_are_rfc3339_nano_fixed_and_parse_back() -> None:
    assert format_timestamp(T0 + 5) == "2025-11-24T16:00:00.000000005Z"
    assert parse_timestamp("2025-11-24T16:00:00.000000005Z") == T0 + 5
    assert parse_timestamp("2025-11-24T16:00:00Z") == T0
    assert parse_timestamp("2025-11-24T17:00:00.5+01:00") == T0 + SECOND // 2
    with pytest.raises(ValueError):
        parse_timestamp("2025-11-24 16:00:00Z")


def test_framer_writes_one_full_record_per_line_across_chunks() -> None:
    ticks = clock()
    framer = CriFramer("stderr", clock=lambda: next(ticks))
    assert framer.feed(b"hel") == []
    out = framer.feed(b"lo\nwor")
    assert out == [b"2025-11-24T16:00:00.000000000Z stderr F hello\n"]
    assert framer.feed(b"ld\n\n") == [
        b"2025-11-24T16:00:01.000000000Z stderr F world\n",
        b"2025-11-24T16:00:02.000000000Z stderr F \n",
    ]
    assert framer.close() == []


def test_framer_cuts_long_lines_into_partials_and_ends_an_unterminated_line_partial() -> None:
    framer = CriFramer("stdout", max_line_bytes=4, clock=lambda: T0)
    records = framer.feed(b"abcdefghij\nxy") + framer.close()
    parsed = [parse_record(r) for r in records]
    assert [(p.partial, p.content) for p in parsed if p] == [
        (True, b"abcd"),
        (True, b"efgh"),
        (False, b"ij\n"),
        (True, b"xy"),
    ]
    # A line of exactly the maximum is one full record.
    exact = CriFramer("stdout", max_line_bytes=4, clock=lambda: T0)
    assert exact.feed(b"abcd") == []
    assert exact.feed(b"\n") == [b"2025-11-24T16:00:00.000000000Z stdout F abcd\n"]


def test_a_partial_line_gets_its_timestamp_once() -> None:
    data = b"".join(CriFramer("stdout", 3, clock=lambda: T0).feed(b"abcdef\nok\n"))
    out = select_records(data, LogOptions(timestamps=True), T0)
    assert out == b"2025-11-24T16:00:00.000000000Z abcdef\n2025-11-24T16:00:00.000000000Z ok\n"


def test_default_max_line_is_containerds_16_kib() -> None:
    assert MAX_LINE_BYTES == 16384


def test_parse_record_skips_what_is_not_a_cri_record() -> None:
    assert parse_record(b"no timestamp here\n") is None
    assert parse_record(b"2025-11-24T16:00:00Z stdin F x\n") is None
    record = parse_record(b"2025-11-24T16:00:00Z stdout F a b c\n")
    assert record is not None and record.content == b"a b c\n" and not record.partial


# ------------------------------------------------------------------ selection
LINES = [f"line {i}\n".encode() for i in range(10)]


def test_tail_lines_starts_at_the_last_n_lines() -> None:
    data = framed(LINES)
    assert select_records(data, LogOptions(tail_lines=2), T0) == b"line 8\nline 9\n"
    assert select_records(data, LogOptions(tail_lines=0), T0) == b""
    assert select_records(data, LogOptions(tail_lines=50), T0) == b"".join(LINES)
    # Block boundaries do not matter.
    f = io.BytesIO(data)
    assert all(tail_start(f, 3, block=b) == tail_start(f, 3) for b in (1, 7, 64, 4096))
    # An unterminated last line is not counted (findTailLineStartIndex).
    assert tail_start(io.BytesIO(b"a\nb\nc"), 1) == 2


def test_since_time_keeps_lines_at_or_after_it() -> None:
    data = framed(LINES)  # line i at T0 + i s
    out = select_records(data, LogOptions(since_time_ns=T0 + 7 * SECOND), T0)
    assert out == b"line 7\nline 8\nline 9\n"
    # sinceSeconds is relative to now; the later of the two wins.
    now = T0 + 10 * SECOND
    both = LogOptions(since_seconds=5, since_time_ns=T0 + 8 * SECOND)
    assert both.since_ns(now) == T0 + 8 * SECOND
    assert select_records(data, LogOptions(since_seconds=2), now) == b"line 8\nline 9\n"


def test_limit_bytes_counts_the_timestamps_and_cuts_the_last_line() -> None:
    data = framed(LINES)
    assert select_records(data, LogOptions(limit_bytes=10), T0) == b"line 0\nlin"
    stamped = select_records(data, LogOptions(limit_bytes=40, timestamps=True), T0)
    assert stamped == b"2025-11-24T16:00:00.000000000Z line 0\n20"


def test_tail_and_since_and_timestamps_combine_as_the_kubelet_does() -> None:
    data = framed(LINES)
    out = select_records(
        data, LogOptions(tail_lines=3, since_time_ns=T0 + 8 * SECOND, timestamps=True), T0
    )
    assert out == (
        b"2025-11-24T16:00:08.000000000Z line 8\n2025-11-24T16:00:09.000000000Z line 9\n"
    )


def test_query_decoding_and_validation_answer_like_the_kubelet() -> None:
    opts = parse_log_options(
        {"follow": "true", "timestamps": "1", "tail": "5", "sinceTime": "2025-11-24T16:00:00Z"}
    )
    assert opts.follow and opts.timestamps and opts.tail_lines == 5
    assert opts.since_time_ns == T0
    assert parse_log_options({"tail": "all", "tailLines": "3"}).tail_lines is None
    assert parse_log_options({"limitBytes": "7", "previous": "true"}).previous
    for bad, status in [
        ({"follow": "yes"}, 400),
        ({"tailLines": "x"}, 400),
        ({"sinceTime": "yesterday"}, 400),
        ({"tailLines": "-1"}, 422),
        ({"limitBytes": "0"}, 422),
        ({"sinceSeconds": "0"}, 422),
        ({"sinceSeconds": "5", "sinceTime": "2025-11-24T16:00:00Z"}, 422),
        ({"stream": "Stdout"}, 400),
    ]:
        with pytest.raises(LogOptionsError) as err:
            parse_log_options(bad)
        assert err.value.status == status, bad


# ------------------------------------------------------------------ which instance
def status(state: dict[str, Any], last: dict[str, Any] | None = None, cid: str = "") -> Any:
    out: dict[str, Any] = {"name": "c", "state": state, "lastState": {}}
    if last is not None:
        out["lastState"] = {"terminated": last}
    if cid:
        out["containerID"] = cid
    return out


def test_the_instance_is_chosen_from_the_status_as_validate_container_log_status_does() -> None:
    running = status({"running": {}}, {"containerID": "loopback://1"}, "loopback://2")
    assert container_id_for_logs(running, "c", "p", previous=False) == "loopback://2"
    assert container_id_for_logs(running, "c", "p", previous=True) == "loopback://1"
    backoff = status({"waiting": {"reason": "CrashLoopBackOff"}}, {"containerID": "loopback://3"})
    assert container_id_for_logs(backoff, "c", "p", previous=False) == "loopback://3"
    first = status({"running": {}}, None, "loopback://4")
    with pytest.raises(ContainerLogError, match='previous terminated container "c" in pod "p"'):
        container_id_for_logs(first, "c", "p", previous=True)
    creating = status({"waiting": {"reason": "ContainerCreating"}})
    with pytest.raises(ContainerLogError, match="is waiting to start: ContainerCreating"):
        container_id_for_logs(creating, "c", "p", previous=False)
    with pytest.raises(ContainerLogError, match="is not available"):
        container_id_for_logs(None, "c", "p", previous=False)


# ------------------------------------------------------------------ a real process
PRINTER = (
    "import sys, time\n"
    "print('out one', flush=True)\n"
    "print('err one', file=sys.stderr, flush=True)\n"
    "import os\n"
    "while not os.path.exists(sys.argv[1]): time.sleep(0.02)\n"
    "print('after the go', flush=True)\n"
)


async def test_a_followed_log_sees_later_lines_and_ends_when_the_instance_exits(
    tmp_path: Path,
) -> None:
    go = tmp_path / "go"
    proc = start_process(
        [sys.executable, "-c", PRINTER, str(go)],
        {"PATH": "/usr/bin:/bin"},
        str(tmp_path),
        tmp_path / "c.log",
        "===== start #0\n",
        restart_count=0,
    )
    got = bytearray()
    seen_first = asyncio.Event()

    async def write(data: bytes) -> None:
        got.extend(data)
        if b"err one" in got and b"out one" in got:
            seen_first.set()

    async def exit_watch() -> None:
        await proc.exited
        proc.log.mark_exited()

    watcher = asyncio.create_task(exit_watch())
    follower = asyncio.create_task(
        stream_log(
            proc.log.path,
            LogOptions(follow=True, timestamps=True),
            finished=proc.log.done,
            wait_change=proc.log.wait_change,
            write=write,
        )
    )
    await asyncio.wait_for(seen_first.wait(), LOCAL_DEADLINE)
    assert b"after the go" not in got
    go.touch()  # the process writes one more line, then exits
    await asyncio.wait_for(follower, LOCAL_DEADLINE)  # ends once the instance has exited
    await watcher
    lines = bytes(got).decode().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["out one", "err one", "after the go"]
    stamps = [parse_timestamp(line.split(" ", 1)[0]) for line in lines]
    assert stamps == sorted(stamps)
    records = [parse_record(r + b"\n") for r in proc.log.path.read_bytes().splitlines()]
    assert [r.stream for r in records if r] == ["stdout", "stderr", "stdout"]
    # The raw log keeps its format: the header, then the output as written.
    raw = (tmp_path / "c.log").read_text()
    assert raw.startswith("===== start #0\n") and "after the go" in raw
    assert proc.log.path == tmp_path / "c" / "0.log"


# ------------------------------------------------------------------ the HTTPS port
class FakeSar:
    """The API server's SubjectAccessReview: allowed for the listed users."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed
        self.reviews: list[dict[str, Any]] = []

    async def create(self, path: str, body: Any) -> Any:
        assert path == "/apis/authorization.k8s.io/v1/subjectaccessreviews"
        self.reviews.append(body)
        return {"status": {"allowed": body["spec"]["user"] in self.allowed}}


class OnePod:
    namespace, name, node = "ns", "p", "node-a"

    def __init__(self, log: Any) -> None:
        self.log = log

    def has_container(self, name: str) -> bool:
        return name == "c"

    def container_log(self, container: str, *, previous: bool) -> Any:
        if previous:
            raise ContainerLogError('previous terminated container "c" in pod "p" not found')
        return self.log


class DoneLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    def done(self) -> bool:
        return True

    async def wait_change(self, timeout: float) -> None:
        return None


def client_ctx(ca_pem: Path, cert: Any | None, tmp: Path, name: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_pem))
    if cert is not None:
        (tmp / f"{name}.crt").write_bytes(cert.cert_pem)
        (tmp / f"{name}.key").write_bytes(cert.key_pem)
        ctx.load_cert_chain(str(tmp / f"{name}.crt"), str(tmp / f"{name}.key"))
    return ctx


async def test_the_port_wants_a_client_certificate_and_an_allowed_user(tmp_path: Path) -> None:
    ca = make_ca("test-ca", valid_days=1, path_length=None)
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    serving = issue_certificate(ca, common_name="node-a", ip_addresses=["127.0.0.1"])
    (tmp_path / "s.crt").write_bytes(serving.cert_pem)
    (tmp_path / "s.key").write_bytes(serving.key_pem)

    def client(cn: str, org: str | None = None) -> Any:
        return issue_certificate(
            ca, common_name=cn, organization=org, usages=[ExtendedKeyUsageOID.CLIENT_AUTH]
        )

    log_file = tmp_path / "0.log"
    log_file.write_bytes(framed([b"hello\n", b"world\n"]))
    sar = FakeSar({"kube-apiserver-kubelet-client"})
    server = KubeletServer(
        sar,  # type: ignore[arg-type]
        lambda node, ns, name: OnePod(DoneLog(log_file)) if (ns, name) == ("ns", "p") else None,
        server_ssl_context(tmp_path / "s.crt", tmp_path / "s.key", tmp_path / "ca.crt"),
        port=0,
    )
    await server.start({"node-a": "127.0.0.1"})
    try:
        port = server._runners[0].addresses[0][1]
        base = f"https://127.0.0.1:{port}/containerLogs"
        apiserver = client("kube-apiserver-kubelet-client", "system:masters")
        stranger = client("someone")

        async def get(cert: Any, path: str) -> tuple[int, str]:
            ctx = client_ctx(tmp_path / "ca.crt", cert, tmp_path, "client")
            async with (
                aiohttp.ClientSession() as s,
                s.get(base + path, ssl=ctx) as resp,
            ):
                return resp.status, await resp.text()

        assert await get(None, "/ns/p/c") == (401, "Unauthorized")
        code, text = await get(stranger, "/ns/p/c")
        assert code == 403 and "user=someone" in text and "subresource=proxy" in text
        assert await get(apiserver, "/ns/p/c?tailLines=1") == (200, "world\n")
        assert await get(apiserver, "/ns/p/c") == (200, "hello\nworld\n")
        assert (await get(apiserver, "/ns/p/c?previous=true"))[0] == 400
        assert (await get(apiserver, "/ns/other/c"))[0] == 404
        assert (await get(apiserver, "/ns/p/nope"))[0] == 404
        assert (await get(apiserver, "/ns/p/c?tailLines=-2"))[0] == 422
        # One review per user (cached), asking what the kubelet asks.
        spec = sar.reviews[0]["spec"]
        assert spec["resourceAttributes"] == {
            "verb": "get",
            "resource": "nodes",
            "subresource": "proxy",
            "name": "node-a",
        }
        assert len(sar.reviews) == 2
    finally:
        await server.stop()


def test_user_of_reads_cn_and_organizations() -> None:
    cert = {"subject": ((("organizationName", "system:masters"),), (("commonName", "x"),))}
    user = user_of(cert)
    assert user is not None and user.name == "x" and user.groups == ("system:masters",)
    assert user_of(None) is None and user_of({}) is None


# ------------------------------------------------------------------ a pod worker's instances
async def test_a_restarted_container_has_one_log_per_instance_and_previous_reads_the_last(
    tmp_path: Path,
) -> None:
    from test_kubelet_runtime import FakeHost

    pod = {
        "metadata": {"name": "tick", "namespace": "ns", "uid": "uid-t", "resourceVersion": "1"},
        "spec": {
            "nodeName": "small",
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": [
                        "python3",
                        "-u",
                        "-c",
                        "import os, time; print('instance', os.getpid()); time.sleep(600)",
                    ],
                }
            ],
        },
        "status": {"phase": "Pending"},
    }
    async with aiohttp.ClientSession() as session:
        host = FakeHost(pod, tmp_path, session)
        from kvgate_e2e.kubelet.runtime import PodWorker

        worker = PodWorker(host, host.fake_api.pod)
        task = asyncio.create_task(worker.run())

        async def instance_line(previous: bool) -> str:
            log = worker.container_log("main", previous=previous)
            out = bytearray()

            async def write(data: bytes) -> None:
                out.extend(data)

            await stream_log(
                log.path,
                LogOptions(),
                finished=log.done,
                wait_change=log.wait_change,
                write=write,
            )
            return out.decode()

        async def until(check: Any) -> Any:
            for _ in range(400):
                try:
                    got = await check()
                except ContainerLogError:
                    got = None
                if got:
                    return got
                await asyncio.sleep(0.05)
            raise AssertionError("timed out")

        try:
            first = await until(lambda: instance_line(False))
            first_pid = worker.records["main"].pid
            assert first == f"instance {first_pid}\n"
            with pytest.raises(ContainerLogError, match="previous terminated container"):
                worker.container_log("main", previous=True)
            worker.kill_container("main")

            async def second_line() -> str | None:
                rec = worker.records["main"]
                if rec.pid == first_pid or rec.state != "running":
                    return None
                return await instance_line(False)

            second = await until(second_line)
            assert second == f"instance {worker.records['main'].pid}\n"
            assert await instance_line(True) == first
            assert worker.container_log("main", previous=True).path.name == "0.log"
            assert worker.container_log("main", previous=False).path.name == "1.log"
            raw = worker.log_path("main").read_text()
            assert raw.count("===== ") == 2 and first in raw and second in raw
        finally:
            worker.deleted(grace=1)
            await asyncio.wait_for(task, LOCAL_DEADLINE)
