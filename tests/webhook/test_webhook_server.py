"""`kvgate webhook` as a process: certificate rotation without a restart, a SIGTERM that loses no
admission, metrics, and the settings it refuses; plus the same server inside `kvgate operator`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from factories.admission_reviews import live, mutated, post, review, sample
from kvgate.admission.answer import INTERNAL_ERROR_CODE, WEBHOOK_PATH
from kvgate.admission.policy import ClusterPolicy
from kvgate.cmd.cli import main
from kvgate.kube.tls import make_ca, make_serving_cert, write_tls_dir
from kvgate.webhook import app as admission_app
from kvgate.webhook.app import serving
from kvgate.webhook.operator_webhook import OperatorWebhookServer

DEADLINE_SECONDS = 30.0


async def eventually(
    what: str, check: Callable[[], Awaitable[bool]], timeout: float = DEADLINE_SECONDS
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        await asyncio.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def own_tls_dir(tmp_path: Path) -> Path:
    """A certificate directory this test may rewrite."""
    write_tls_dir(tmp_path, make_serving_cert(make_ca(), ["localhost"], ["127.0.0.1"]))
    return tmp_path


# ------------------------------------------------------------------------ certificate rotation


async def _handshake_ok(url: str, ca_file: Path) -> bool:
    """A fresh TLS connection that verifies with the CA in `ca_file` gets an answer."""
    client = ssl.create_default_context(cafile=str(ca_file))
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json=review(sample()), ssl=client) as response,
        ):
            return response.status == 200
    except aiohttp.ClientConnectorCertificateError:
        return False


async def test_a_renewed_certificate_is_served_without_a_restart(own_tls_dir: Path) -> None:
    old_ca = own_tls_dir / "old-ca.crt"
    old_ca.write_bytes((own_tls_dir / "ca.crt").read_bytes())
    async with serving(own_tls_dir, check_interval=0.05) as server:
        url = server.url + WEBHOOK_PATH
        assert await _handshake_ok(url, old_ca)
        client = ssl.create_default_context(cafile=str(old_ca))
        async with aiohttp.ClientSession() as kept:  # a keep-alive connection from before
            async with kept.post(url, json=review(sample()), ssl=client) as response:
                assert response.status == 200

            # cert-manager renews with a new key and (here) a new CA; the kubelet swaps files.
            write_tls_dir(own_tls_dir, make_serving_cert(make_ca(), ["localhost"], ["127.0.0.1"]))
            new_ca = own_tls_dir / "ca.crt"
            await eventually("the new certificate served", lambda: _handshake_ok(url, new_ca))
            assert not await _handshake_ok(url, old_ca)
            assert server.certificate.reloads == 1

            async with kept.post(url, json=review(sample()), ssl=client) as response:
                assert response.status == 200  # connections from before keep working


async def test_a_certificate_that_does_not_load_keeps_the_previous_one(own_tls_dir: Path) -> None:
    async with serving(own_tls_dir, check_interval=0.05) as server:
        url = server.url + WEBHOOK_PATH
        (own_tls_dir / "tls.key").write_text("half-written\n")
        await asyncio.sleep(0.3)  # several checks: each fails to load, none replaces it
        assert server.certificate.reloads == 0
        assert await _handshake_ok(url, own_tls_dir / "ca.crt")


# ------------------------------------------------------------------------ kvgate webhook, a process


@dataclass
class WebhookProcess:
    process: subprocess.Popen[bytes]
    port: int
    health_port: int
    metrics_port: int
    tls_dir: Path

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}{WEBHOOK_PATH}"

    def client_ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.tls_dir / "ca.crt"))

    async def get(self, port: int, path: str) -> tuple[int, str]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}{path}") as response,
        ):
            return response.status, await response.text()


def _webhook_command(tls_dir: Path, ports: tuple[int, int, int], delay: float) -> list[str]:
    port, health, metrics = ports
    return [
        sys.executable,
        "-m",
        "kvgate.cmd.cli",
        "webhook",
        f"--port={port}",
        f"--health-port={health}",
        f"--metrics-port={metrics}",
        f"--tls-dir={tls_dir}",
        f"--shutdown-delay-seconds={delay:g}",
    ]


@contextlib.asynccontextmanager
async def webhook_process(
    tls_dir: Path, *, delay: float = 0.0, env: dict[str, str] | None = None
) -> AsyncIterator[WebhookProcess]:
    ports = (_free_port(), _free_port(), _free_port())
    process = subprocess.Popen(
        _webhook_command(tls_dir, ports, delay),
        env={
            **os.environ,
            "KVGATE_BIND_ADDRESS": "127.0.0.1",
            "KVGATE_LOG_FORMAT": "text",
            **(env or {}),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    webhook = WebhookProcess(process, *ports, tls_dir=tls_dir)

    async def ready() -> bool:
        if process.poll() is not None:
            output = process.stdout.read().decode() if process.stdout else ""
            raise AssertionError(f"kvgate webhook exited {process.returncode}: {output}")
        with contextlib.suppress(aiohttp.ClientError):
            return (await webhook.get(webhook.health_port, "/readyz"))[0] == 200
        return False

    try:
        await eventually("kvgate webhook ready", ready)
        yield webhook
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=DEADLINE_SECONDS)
        if process.stdout:
            process.stdout.close()


async def _start_request_without_its_end(
    webhook: WebhookProcess, body: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A request in flight: headers and half the body sent; returns the other half."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", webhook.port, ssl=webhook.client_ssl(), server_hostname="localhost"
    )
    half = len(body) // 2
    writer.write(
        f"POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body[:half]
    )
    await writer.drain()
    return reader, writer, body[half:]


async def _refuses_connections(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    return False


async def test_sigterm_fails_readiness_first_answers_through_the_delay_then_exits_0(
    own_tls_dir: Path,
) -> None:
    delay = 2.0
    async with webhook_process(own_tls_dir, delay=delay) as webhook:
        body = json.dumps(review(sample())).encode()
        reader, writer, rest = await _start_request_without_its_end(webhook, body)

        webhook.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        async def not_ready() -> bool:
            return (await webhook.get(webhook.health_port, "/readyz"))[0] == 503

        await eventually("/readyz failing after SIGTERM", not_ready, timeout=1.0)
        assert (await webhook.get(webhook.health_port, "/healthz"))[0] == 200

        # Still answering (the Service has not dropped the pod yet), closing each connection.
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                webhook.url,
                json=review(mutated({"spec.decode.gpuMemoryGiB": 25})),
                ssl=webhook.client_ssl(),
            ) as response,
        ):
            answer = await response.json()
            assert response.status == 200 and answer["response"]["allowed"] is False
            assert response.headers.get("Connection", "").lower() == "close"
        assert time.monotonic() - signalled < delay
        assert webhook.process.poll() is None

        await eventually("no new connection accepted", lambda: _refuses_connections(webhook.port))
        assert time.monotonic() - signalled >= delay
        assert webhook.process.poll() is None  # the request in flight holds the exit

        writer.write(rest)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_SECONDS)
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(
            next(
                line.split(b":", 1)[1]
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
        )
        answer = json.loads(await reader.readexactly(length))
        assert answer["response"]["allowed"] is True
        writer.close()

        code = await asyncio.to_thread(webhook.process.wait, DEADLINE_SECONDS)
        assert code == 0


def _sample_value(text: str, name: str, labels: str = "") -> float:
    for line in text.splitlines():
        if line.startswith(f"{name}{labels} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{labels} not in the metrics:\n{text}")


async def test_metrics_count_each_answer_by_operation_and_result(own_tls_dir: Path) -> None:
    async with webhook_process(own_tls_dir) as webhook:
        target = live(f"https://127.0.0.1:{webhook.port}", webhook.tls_dir)
        await post(target, review(sample()))
        await post(target, review(sample()))
        await post(target, review(mutated({"spec.decode.gpuMemoryGiB": 25}), operation="UPDATE"))
        await post(target, b"{not json", raw=True)
        status, text = await webhook.get(webhook.metrics_port, "/metrics")
    assert status == 200
    requests = "kvgate_admission_requests_total"
    assert _sample_value(text, requests, '{operation="CREATE",result="allowed"}') == 2
    assert _sample_value(text, requests, '{operation="UPDATE",result="denied"}') == 1
    assert _sample_value(text, requests, '{operation="unknown",result="rejected"}') == 1
    assert _sample_value(text, requests, '{operation="CREATE",result="denied"}') == 0
    assert _sample_value(text, "kvgate_admission_duration_seconds_count") == 3


# ------------------------------------------------------------------------ settings it refuses


@pytest.fixture
def webhook_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in list(os.environ):
        if name.startswith("KVGATE_"):
            monkeypatch.delenv(name)
    yield monkeypatch


def test_a_floor_that_is_not_a_version_stops_it_with_exit_2_naming_the_chart_value(
    webhook_env: pytest.MonkeyPatch, tls_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    webhook_env.setenv("KVGATE_MIN_ENGINE_VERSION_FLOOR", "latest")
    assert main(["webhook", f"--tls-dir={tls_dir}"]) == 2
    error = capsys.readouterr().err
    assert "KVGATE_MIN_ENGINE_VERSION_FLOOR" in error and "engineVersionFloor" in error
    assert "'latest' is not a version; use one such as 0.5.22" in error


def test_missing_certificate_files_stop_it_with_exit_2_naming_the_path(
    webhook_env: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["webhook", f"--tls-dir={tmp_path}"]) == 2
    error = capsys.readouterr().err
    assert f"{tmp_path / 'tls.crt'} is missing" in error
    assert "mount the webhook's kubernetes.io/tls Secret" in error


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--port=8080"], "three different ports"),
        (["--port=70000"], "--port 70000: must be a TCP port"),
        (["--shutdown-delay-seconds=-1"], "--shutdown-delay-seconds -1.0: must be"),
    ],
)
def test_wrong_flags_stop_it_with_exit_2(
    webhook_env: pytest.MonkeyPatch,
    tls_dir: Path,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    words: str,
) -> None:
    assert main(["webhook", f"--tls-dir={tls_dir}", *flags]) == 2
    assert words in capsys.readouterr().err


# ------------------------------------------------------------------------ a kvgate bug: deny


async def test_a_failure_inside_kvgate_denies_with_500_saying_it_is_a_bug(
    tls_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object) -> None:
        raise KeyError("spec")

    monkeypatch.setattr(admission_app, "answer_review", broken)
    async with serving(tls_dir) as server:
        status, answer = await post(live(server.url, tls_dir), review(sample()))
    assert status == 200
    assert answer["response"]["allowed"] is False
    assert answer["response"]["uid"] == review(sample())["request"]["uid"]
    assert answer["response"]["status"]["code"] == INTERNAL_ERROR_CODE
    assert "this is a kvgate bug" in answer["response"]["status"]["message"]


# ------------------------------------------------------------------------ inside kvgate operator


async def test_the_operator_serves_the_same_webhook_until_kopf_stops_it(tls_dir: Path) -> None:
    server = OperatorWebhookServer(
        tls_dir=tls_dir,
        port=_free_port(),
        addr="127.0.0.1",
        policy=ClusterPolicy(min_engine_version_floor="0.5.23"),
    )
    configs: asyncio.Queue[Any] = asyncio.Queue()

    async def kopf_admission_task() -> None:  # what kopf's admission_webhook_server does
        async for config in server(None):  # type: ignore[arg-type]  # kopf's fn is not used
            await configs.put(config)

    task = asyncio.create_task(kopf_admission_task())
    config = await asyncio.wait_for(configs.get(), DEADLINE_SECONDS)
    url = config["url"]
    target = live(url.removesuffix(WEBHOOK_PATH), tls_dir)
    _, answer = await post(target, review(sample()))  # the sample pins 0.5.22 < the floor
    assert answer["response"]["allowed"] is False
    assert "engine version floor 0.5.23" in answer["response"]["status"]["message"]

    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    assert await _refuses_connections(port)
