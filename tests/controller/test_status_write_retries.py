"""The two status writes (pod gate condition, ModelDeployment status) against a fake API server
(a real aiohttp server on 127.0.0.1): transient failures are retried with bounded backoff, the
others are not."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from factories.model_deployments import NOW
from kvgate.controller import engine_pods
from kvgate.controller.runtime import Runtime
from kvgate.kube import metrics
from kvgate.kube.k8s import ApiError, Credentials, KubeApi, RetryPolicy
from kvgate.kube.settings import OperatorSettings
from kvgate_engine.verdict import Requirement, Verdict

NS = "models"
POD = "llama-r1-decode-x2"
CONDITION = {
    "type": "kvgate.io/engine-verified",
    "status": "False",
    "reason": "KvPoolTooSmall",
    "message": "decode pod: KV pool 68,128 tokens < context length 131,072",
    "lastTransitionTime": "2026-11-05T12:00:30Z",
}


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    drop: bool = False  # close the connection without an answer


@dataclass
class FakeApiServer:
    """Answers each request with the next scripted reply (then 200 with the patch echoed)."""

    script: list[Reply] = field(default_factory=list)
    seen: list[tuple[str, str, str, Any]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(
            (
                request.method,
                request.path,
                request.headers.get("Content-Type", ""),
                json.loads(body) if body else None,
            )
        )
        reply = self.script.pop(0) if self.script else Reply(200)
        if reply.drop:
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=200)
        if reply.status >= 400:
            status = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "code": reply.status,
            }
            status["message"] = f"scripted {reply.status}"
            return web.json_response(status, status=reply.status, headers=reply.headers)
        return web.json_response(json.loads(body) if body else {}, status=reply.status)


@dataclass
class Sleeps:
    """The injected sleep: records each wait, advances the injected clock, never sleeps."""

    waits: list[float] = field(default_factory=list)
    now: float = 1000.0

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


@pytest.fixture
def fake() -> FakeApiServer:
    return FakeApiServer()


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


@pytest.fixture
async def api(fake: FakeApiServer, sleeps: Sleeps) -> AsyncIterator[KubeApi]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    # jitter 1.0 (top of its range): the waits are exactly the capped exponential steps.
    policy = RetryPolicy(sleep=sleeps.sleep, clock=sleeps.clock, jitter=lambda: 1.0)
    client = KubeApi(Credentials(server=str(server.make_url("")).rstrip("/")), retry=policy)
    yield client
    await client.close()
    await server.close()


def retries(kind: str, reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value(
        "kvgate_status_write_retries_total", {"kind": kind, "reason": reason}
    )
    return value or 0.0


async def test_503s_then_200_are_retried_with_exponential_backoff_and_logged(
    api: KubeApi, fake: FakeApiServer, sleeps: Sleeps, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script = [Reply(503), Reply(503), Reply(503)]
    before = retries("pod_condition", "http_503")
    with caplog.at_level(logging.WARNING, logger="kvgate.kube.k8s"):
        result = await api.patch_pod_condition(NS, POD, "pod-uid-1", CONDITION)
    assert result is not None and result["status"]["conditions"] == [CONDITION]
    assert len(fake.seen) == 4
    assert {(m, p, c) for m, p, c, _ in fake.seen} == {
        (
            "PATCH",
            f"/api/v1/namespaces/{NS}/pods/{POD}/status",
            "application/strategic-merge-patch+json",
        )
    }
    assert all(body["metadata"] == {"uid": "pod-uid-1"} for *_, body in fake.seen)
    assert sleeps.waits == [0.2, 0.4, 0.8]
    assert retries("pod_condition", "http_503") - before == 3
    logged = [r.getMessage() for r in caplog.records if r.name == "kvgate.kube.k8s"]
    assert len(logged) == 3
    assert logged[0].startswith("status write failed (http_503), retry 1 of 4 in 0.20 s")
    assert "HTTP 503: scripted 503" in logged[0]


async def test_429_waits_the_servers_retry_after(
    api: KubeApi, fake: FakeApiServer, sleeps: Sleeps
) -> None:
    fake.script = [Reply(429, {"Retry-After": "2"})]
    before = retries("md_status", "http_429")
    result = await api.patch_md_status(NS, "llama", {"phase": "Serving"})
    assert result == {"status": {"phase": "Serving"}}
    assert len(fake.seen) == 2
    assert fake.seen[0][2] == "application/merge-patch+json"
    assert sleeps.waits == [2.0]  # the server's 2 s, above the 0.2 s backoff
    assert retries("md_status", "http_429") - before == 1


async def test_a_retry_after_beyond_the_cap_is_not_waited_for(
    api: KubeApi, fake: FakeApiServer, sleeps: Sleeps
) -> None:
    fake.script = [Reply(429, {"Retry-After": "60"})]
    with pytest.raises(ApiError) as error:
        await api.patch_md_status(NS, "llama", {"phase": "Serving"})
    assert error.value.status == 429 and error.value.retry_after == 60.0
    assert len(fake.seen) == 1 and sleeps.waits == []


async def test_a_409_on_the_pod_means_it_was_replaced_and_is_never_retried(
    api: KubeApi, fake: FakeApiServer, sleeps: Sleeps
) -> None:
    fake.script = [Reply(409)]
    assert await api.patch_pod_condition(NS, POD, "pod-uid-1", CONDITION) is None
    assert len(fake.seen) == 1 and sleeps.waits == []


async def test_a_409_on_the_modeldeployment_status_is_a_conflict_and_retried(
    api: KubeApi, fake: FakeApiServer, sleeps: Sleeps
) -> None:
    fake.script = [Reply(409)]
    before = retries("md_status", "http_409")
    assert await api.patch_md_status(NS, "llama", {"phase": "Serving"}) is not None
    assert len(fake.seen) == 2 and sleeps.waits == [0.2]
    assert retries("md_status", "http_409") - before == 1


@pytest.mark.parametrize("status", [422, 403, 400])
async def test_client_errors_are_never_retried(
    api: KubeApi, fake: FakeApiServer, sleeps: Sleeps, status: int
) -> None:
    for kind in ("pod_condition", "md_status"):
        fake.seen.clear()
        fake.script = [Reply(status)]
        with pytest.raises(ApiError) as error:
            if kind == "pod_condition":
                await api.patch_pod_condition(NS, POD, "pod-uid-1", CONDITION)
            else:
                await api.patch_md_status(NS, "llama", {"phase": "Serving"})
        assert error.value.status == status
        assert len(fake.seen) == 1
    assert sleeps.waits == []


async def test_a_gone_pod_is_not_retried(api: KubeApi, fake: FakeApiServer, sleeps: Sleeps) -> None:
    fake.script = [Reply(404)]
    assert await api.patch_pod_condition(NS, POD, "pod-uid-1", CONDITION) is None
    assert len(fake.seen) == 1 and sleeps.waits == []


async def test_a_dropped_connection_is_retried(
    api: KubeApi, fake: FakeApiServer, sleeps: Sleeps
) -> None:
    fake.script = [Reply(200, drop=True)]
    before = retries("pod_condition", "connection")
    assert await api.patch_pod_condition(NS, POD, "pod-uid-1", CONDITION) is not None
    assert len(fake.seen) == 2 and sleeps.waits == [0.2]
    assert retries("pod_condition", "connection") - before == 1


async def test_retries_are_bounded_then_the_last_error_is_raised(
    api: KubeApi, fake: FakeApiServer, sleeps: Sleeps
) -> None:
    fake.script = [Reply(500)] * 10
    with pytest.raises(ApiError) as error:
        await api.patch_md_status(NS, "llama", {"phase": "Serving"})
    assert error.value.status == 500
    assert len(fake.seen) == RetryPolicy().attempts == 5
    assert sleeps.waits == [0.2, 0.4, 0.8, 1.6]


async def test_the_time_budget_stops_retries_early(fake: FakeApiServer, sleeps: Sleeps) -> None:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    policy = RetryPolicy(
        sleep=sleeps.sleep, clock=sleeps.clock, jitter=lambda: 1.0, budget_seconds=1.0
    )
    client = KubeApi(Credentials(server=str(server.make_url("")).rstrip("/")), retry=policy)
    fake.script = [Reply(503)] * 10
    try:
        with pytest.raises(ApiError):
            await client.patch_md_status(NS, "llama", {"phase": "Serving"})
    finally:
        await client.close()
        await server.close()
    assert sleeps.waits == [0.2, 0.4]  # 0.8 more would end past 1 s
    assert len(fake.seen) == 3


def test_backoff_is_jittered_within_half_to_all_of_the_capped_step() -> None:
    low = RetryPolicy(jitter=lambda: 0.0)
    high = RetryPolicy(jitter=lambda: 0.999999)
    for retry, step in enumerate([0.2, 0.4, 0.8, 1.6, 3.0, 3.0], start=1):
        assert low.delay(retry, None) == pytest.approx(step / 2)
        assert high.delay(retry, None) == pytest.approx(step, rel=1e-5)
    assert low.delay(1, 1.5) == 1.5  # never sooner than Retry-After


async def test_the_gate_condition_is_written_after_an_api_server_blip(
    api: KubeApi, fake: FakeApiServer, sleeps: Sleeps
) -> None:
    """Through the handler: the verifier's write lands on this pass, not the next interval."""

    async def no_probe(url: str, requirement: Requirement) -> Verdict:
        raise AssertionError("_write probes nothing")

    rt = Runtime(api=api, settings=OperatorSettings(), verify=no_probe, clock=lambda: NOW)
    pod: dict[str, Any] = {
        "metadata": {"name": POD, "namespace": NS, "uid": "pod-uid-1", "labels": {}},
        "status": {"conditions": []},
    }
    fake.script = [Reply(503), Reply(502)]
    assert await engine_pods._write(rt, pod, CONDITION)
    assert [c["reason"] for c in pod["status"]["conditions"]] == ["KvPoolTooSmall"]
    patches = [s for s in fake.seen if s[0] == "PATCH"]
    assert len(patches) == 3 and sleeps.waits == [0.2, 0.4]
