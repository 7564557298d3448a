"""The KV canary follower: SGLang's canary lines in an engine's log turn its gate False.

Pure parts are table-tested; the follower runs against a small HTTP server that plays the API
server's pods/log (``follow=true&timestamps=true``), pods/status and events endpoints.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from factories.model_deployments import NOW, md_doc
from kvgate.api import labels, multinode
from kvgate.controller import kv_canary_watch
from kvgate.controller.runtime import Runtime
from kvgate.kube import metrics
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings
from kvgate.verify import kv_canary
from kvgate_engine.reference.canary import format_violation

VIOLATION = format_violation(
    row=[0, 17, 1_000_003, 0, 0, 0, 0, 2], total=1, ring_overflow=False, step_when_pumped=1
).splitlines()[0]
STATS_OK = (
    "[canary] step=64 protected_tokens=300 sweep_passes=0 violations=0 launch_tags_active=2/12"
)
STATS_BAD = STATS_OK.replace("violations=0", "violations=3")


SGLANG = "[2026-11-05 12:00:00] "  # SGLang's log prefix (configure_logger), no ranks
# A record a client writes into text the engine logs: the shape is right, the place is not.
FORGED = "kv_canary violation: launch_tag=HEAD_K_FULL fail_reason=forged slot_idx=1 position=1"


@pytest.mark.parametrize(
    "line",
    [
        f"{SGLANG}{VIOLATION}",
        f"2026-11-05T12:00:00.5Z [2026-11-05 12:00:00 TP0] {VIOLATION}",
        f"2026-11-05T12:00:00.5Z [2026-11-05 12:00:00.123 DP1 PP0 ATTN_CP1 MOE_DP0 TP3 EP2] "
        f"{VIOLATION}",
        f"2026-11-05T12:00:00Z [2026-11-05 12:00:00 TP0] {STATS_BAD}",
        f"{SGLANG}{VIOLATION.replace('HEAD_K_FULL', 'unknown(99)')}",
        f"{SGLANG}{VIOLATION.replace('verify_position', 'verify_chain_hash+verify_token')}",
    ],
)
def test_sglangs_own_record_after_its_log_prefix_trips_the_gate(line: str) -> None:
    assert kv_canary.parse_line(line) is not None


@pytest.mark.parametrize(
    "line",
    [
        # The line: bootstrap input quoted in an error the engine logged.
        f"{SGLANG}KV transfer for bootstrap_room None failed: invalid literal for int() with "
        f"base 10: '{VIOLATION}'",
        f"{SGLANG}KV transfer for bootstrap_room None failed: invalid literal for int() with "
        f"base 10: '{FORGED}'",
        # SGLang's request logger (--log-requests): the request id, the prompt.
        f"{SGLANG}Receive: obj=GenerateReqInput(rid='{VIOLATION}', text='hello')",
        f"{SGLANG}Receive: obj=GenerateReqInput(rid='r1', text='{VIOLATION}')",
        f"{SGLANG}Receive: obj=GenerateReqInput(rid='r1', text='\\n{VIOLATION}')",
        f"[2026-11-05 12:00:00 TP0] Abort request {VIOLATION}",
        f"{SGLANG}Receive: obj=GenerateReqInput(rid='{STATS_BAD}')",
        # A record without SGLang's prefix (another program's line, a continuation line).
        VIOLATION,
        f"2026-11-05T12:00:00.5Z {VIOLATION}",
        STATS_BAD,
        f"[2026-11-05 12:00:00] WARNING sglang.srt.kv_canary: {VIOLATION}",
        f"[2026-11-05 12:00:00 TP0]{VIOLATION}",
        f"[2026-11-05 12:00:00 TP0 DP0] {VIOLATION}",  # ranks out of SGLang's order
        f"[2026-11-05 12:00:00 rid=x] {VIOLATION}",
        f"[{VIOLATION}] {VIOLATION}",
        # SGLang's prefix, the record's shape, a field out of shape.
        f"{SGLANG}{FORGED}",
        f"{SGLANG}{VIOLATION.replace('HEAD_K_FULL', 'EVIL')}",
        f"{SGLANG}{VIOLATION.replace('HEAD_K_FULL', 'head_k_full')}",
        f"{SGLANG}{VIOLATION.replace('verify_position', 'forged')}",
        f"{SGLANG}{VIOLATION.replace('verify_position', 'verify_token+verify_position')}",
        f"{SGLANG}{VIOLATION.replace('verify_position', 'verify_position+verify_position')}",
        f"{SGLANG}{VIOLATION.replace('slot_idx=17', 'slot_idx=seventeen')}",
        f"{SGLANG}{VIOLATION.replace('position=1000003', 'position=1e6')}",
        f"{SGLANG}{VIOLATION.replace('0x0000000000000000', '0x0')}",
        f"{SGLANG}{VIOLATION.replace('0x0000000000000000', 'deadbeefdeadbeef')}",
        f"{SGLANG}{VIOLATION} and the tenant's words",
        f"{SGLANG}{VIOLATION}'",
        f"{SGLANG} {VIOLATION}",
        f"{SGLANG}{VIOLATION.split(' stored_token=')[0]}",  # the fields kvgate once read
        f"{SGLANG}{STATS_BAD} rid=x",
        f"{SGLANG}{STATS_BAD.replace('/12', '/13')}",
        f"{SGLANG}{STATS_BAD.replace('violations=3', 'violations=-3')}",
        # Nothing to see.
        f"{SGLANG}{STATS_OK}",
        "[2026-11-05 12:00:00 TP0] Decode batch, #running-req: 1",
        "the user wrote kv_canary violation: in a prompt",
        "",
    ],
)
def test_a_forged_canary_record_in_client_chosen_text_trips_nothing(line: str) -> None:
    assert kv_canary.parse_line(line) is None


def test_the_violation_keeps_what_sglang_said_and_when() -> None:
    found = kv_canary.parse_line(f"2026-11-05T12:00:00.5Z {SGLANG}{VIOLATION}")
    assert found is not None
    assert (found.launch_tag, found.fail_reason, found.slot_idx, found.position) == (
        "HEAD_K_FULL",
        "verify_position",
        17,
        1_000_003,
    )
    assert found.logged_at == "2026-11-05T12:00:00.5Z"
    text = kv_canary.message(found)
    assert "fail_reason=verify_position" in text and "Delete the pod" in text
    # The parsed fields are quoted, not the line.
    assert "launch_tag=HEAD_K_FULL, fail_reason=verify_position, slot_idx=17" in text
    assert "stored_chain_hash" not in text and "kv_canary violation:" not in text


def test_lines_are_split_across_chunks_and_bounded() -> None:
    splitter = kv_canary.LineSplitter(max_line_bytes=10)
    assert splitter.feed(b"abc\nde") == ["abc"]
    assert splitter.feed(b"f\n") == ["def"]
    # A line with no end: cut at 10 bytes, the rest dropped up to its newline.
    assert splitter.feed(b"x" * 25) == ["x" * 10]
    assert splitter.feed(b"y" * 1000) == []
    assert splitter.feed(b"y\nok\n") == ["ok"]


def test_a_stream_resumes_from_the_last_line_read() -> None:
    assert kv_canary.resume_from("2026-11-05T12:00:07.123456789Z") == "2026-11-05T12:00:07Z"
    assert kv_canary.resume_from(None) is None
    assert kv_canary.resume_from("garbage") is None


# --------------------------------------------------------------------- the follower, over HTTP
NS, POD, UID = "models", "llama-abc-decode-x1", "uid-decode-1"


class FakeApiServer:
    """pods/log streams lines the test puts in ``lines`` (the first connection is dropped after
    its first line); records pods/status patches and events."""

    def __init__(self) -> None:
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        self.patches: list[tuple[float, dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []
        self.log_requests: list[dict[str, str]] = []

    async def log(self, request: web.Request) -> web.StreamResponse:
        self.log_requests.append(dict(request.query))
        response = web.StreamResponse()
        await response.prepare(request)
        first = len(self.log_requests) == 1
        while True:
            line = await self.lines.get()
            await response.write(line.encode() + b"\n")
            if first:
                return response  # dropped: the follower must reconnect and resume

    async def status(self, request: web.Request) -> web.Response:
        self.patches.append((time.monotonic(), await request.json()))
        return web.json_response({"metadata": {"uid": UID}})

    async def event(self, request: web.Request) -> web.Response:
        self.events.append(await request.json())
        return web.json_response({}, status=201)


def verified_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": POD,
            "namespace": NS,
            "uid": UID,
            "labels": {labels.DEPLOYMENT: "llama", labels.ROLE: "decode"},
        },
        "status": {
            "conditions": [
                {"type": labels.ENGINE_VERIFIED, "status": "True", "reason": "EngineVerified"}
            ]
        },
    }


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeApiServer, Runtime]]:
    fake = FakeApiServer()
    app = web.Application()
    app.router.add_get(f"/api/v1/namespaces/{NS}/pods/{POD}/log", fake.log)
    app.router.add_patch(f"/api/v1/namespaces/{NS}/pods/{POD}/status", fake.status)
    app.router.add_post(f"/api/v1/namespaces/{NS}/events", fake.event)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    api = KubeApi(Credentials(server=f"http://127.0.0.1:{port}"))

    async def never(*_: Any, **__: Any) -> Any:
        raise AssertionError("the follower never verifies")

    rt = Runtime(api=api, settings=OperatorSettings(), verify=never, clock=lambda: NOW)
    doc = md_doc(safety__kvCanary=True)
    rt.mds[(NS, "llama")] = doc
    try:
        yield fake, rt
    finally:
        kv_canary_watch.on_pod_event(rt, "DELETED", verified_pod())
        await api.close()
        await runner.cleanup()


async def test_first_violation_turns_the_gate_false_and_stays_false(
    served: tuple[FakeApiServer, Runtime],
) -> None:
    fake, rt = served
    pod = verified_pod()
    rt.pods[UID] = pod
    kv_canary_watch.on_pod_event(rt, "ADDED", pod)
    kv_canary_watch.on_pod_event(rt, "MODIFIED", pod)  # one stream per pod
    await fake.lines.put(f"2026-11-05T12:00:01.000000001Z {STATS_OK}")
    await fake.lines.put(f"2026-11-05T12:00:02.000000001Z {STATS_OK}")  # after the reconnect
    deadline = time.monotonic() + 10
    while len(fake.log_requests) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    written = time.monotonic()
    await fake.lines.put(f"2026-11-05T12:00:03.000000001Z [2026-11-05 12:00:03 TP0] {VIOLATION}")
    while not fake.patches and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert fake.patches, "the gate was never written"
    latency = fake.patches[0][0] - written
    condition = fake.patches[0][1]["status"]["conditions"][0]
    assert condition["type"] == labels.ENGINE_VERIFIED and condition["status"] == "False"
    assert condition["reason"] == "KvCanaryViolation"
    assert "decode pod llama-abc-decode-x1" in condition["message"]
    assert "launch_tag=HEAD_K_FULL" in condition["message"]
    assert latency < 2.0, latency
    print(f"MEASURED log line -> gate False patch: {latency * 1000:.1f} ms")
    # One stream per pod, and the second one resumed where the first stopped.
    assert len(fake.log_requests) == 2
    assert fake.log_requests[0] == {"container": "engine", "follow": "true", "timestamps": "true"}
    assert fake.log_requests[1]["sinceTime"] == "2026-11-05T12:00:01Z"
    while not fake.events and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert fake.events[0]["reason"] == "KvCanaryViolation"
    assert fake.events[0]["involvedObject"]["kind"] == "ModelDeployment"
    # Sticky: the verifier's next Safe verdict cannot turn the gate True again.
    safe = {"type": labels.ENGINE_VERIFIED, "status": "True", "reason": "EngineVerified"}
    kept = kv_canary_watch.override(pod, safe, NOW)
    assert kept is not None and kept["status"] == "False" and kept["reason"] == "KvCanaryViolation"


async def test_no_follower_without_safety_kv_canary_or_before_verification(
    served: tuple[FakeApiServer, Runtime],
) -> None:
    fake, rt = served
    unverified = verified_pod()
    unverified["status"]["conditions"] = []
    rt.pods[UID] = unverified
    kv_canary_watch.on_pod_event(rt, "ADDED", unverified)
    rt.mds[(NS, "llama")] = md_doc(safety__kvCanary=False)
    kv_canary_watch.on_pod_event(rt, "MODIFIED", verified_pod())
    await asyncio.sleep(0.3)
    assert fake.log_requests == []


async def test_a_log_that_cannot_be_read_is_retried_with_a_growing_back_off(
    served: tuple[FakeApiServer, Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An API server that refuses the stream (here 403) is asked again after 0.5, 1, 2, 5, then
    every 10 s, not twice a second forever; a stream that delivers lines resets the back-off."""
    fake, rt = served
    answers = ["refuse"] * 6 + ["lines", "refuse"]
    waits: list[float] = []
    done = asyncio.Event()

    async def log(request: web.Request) -> web.StreamResponse:
        fake.log_requests.append(dict(request.query))
        if answers.pop(0) == "refuse":
            return web.Response(status=403, text="forbidden")
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(f"2026-11-05T12:00:01.000000001Z {STATS_OK}\n".encode())
        return response  # ends after one line: the instance had nothing more

    async def record(delay: float) -> None:
        waits.append(delay)
        if not answers:
            done.set()
            await asyncio.Event().wait()  # the follower stops here (cancelled at the end)
        await asyncio.sleep(0)

    monkeypatch.setattr(kv_canary_watch, "_sleep", record)
    app = web.Application()
    app.router.add_get(f"/api/v1/namespaces/{NS}/pods/{POD}/log", log)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    api = KubeApi(Credentials(server=f"http://127.0.0.1:{port}"))
    rt.api = api
    pod = verified_pod()
    rt.pods[UID] = pod
    try:
        kv_canary_watch.on_pod_event(rt, "ADDED", pod)
        await asyncio.wait_for(done.wait(), 10)
        assert waits == [0.5, 1.0, 2.0, 5.0, 10.0, 10.0, 0.5, 1.0]
        assert fake.log_requests[-1]["sinceTime"] == "2026-11-05T12:00:01Z"
    finally:
        kv_canary_watch.on_pod_event(rt, "DELETED", pod)
        await api.close()
        await runner.cleanup()


def test_a_violation_keeps_the_rank_sglang_logged_it_on() -> None:
    found = kv_canary.parse_line(f"2026-11-05T12:00:00Z [2026-11-05 12:00:00 DP0 TP3] {VIOLATION}")
    assert found is not None and found.ranks == "DP0 TP3"
    unranked = kv_canary.parse_line(f"{SGLANG}{VIOLATION}")
    assert unranked is not None and unranked.ranks is None


# ------------------------------------------------ a multi-node engine: a worker rank's own log
LEADER, LEADER_UID = "llama-abc-decode-0", "uid-leader-0"
WORKER, WORKER_UID, GROUP_STS_UID = "llama-abc-decode-0-1", "uid-worker-1", "uid-sts-0"


def group_pods() -> tuple[dict[str, Any], dict[str, Any]]:
    """A verified leader (rank 0) and its worker (node rank 1), as LeaderWorkerSet makes them:
    the worker is controlled by the StatefulSet <lws>-<g>, which the leader pod controls."""
    group = {
        multinode.LWS_NAME_LABEL: "llama-abc-decode",
        multinode.GROUP_INDEX_LABEL: "0",
    }
    leader = verified_pod()
    leader["metadata"].update(name=LEADER, uid=LEADER_UID)
    leader["metadata"]["labels"].update(group, **{multinode.WORKER_INDEX_LABEL: "0"})
    worker: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": WORKER,
            "namespace": NS,
            "uid": WORKER_UID,
            "labels": {
                labels.DEPLOYMENT: "llama",
                labels.ROLE: "decode",
                labels.COMPONENT: multinode.COMPONENT_WORKER,
                labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
                multinode.WORKER_INDEX_LABEL: "1",
                **group,
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "name": LEADER,
                    "uid": GROUP_STS_UID,
                    "controller": True,
                }
            ],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "engine", "ready": False, "restartCount": 0, "state": {"running": {}}}
            ],
        },
    }
    return leader, worker


async def test_a_violation_on_a_worker_rank_turns_its_leaders_gate_false(
    served: tuple[FakeApiServer, Runtime],
) -> None:
    """SGLang's every rank logs its own canary violations; a node-rank-1 pod runs only
    schedulers, so its log is the only place a corrupt slot there shows. The group's gate is
    the leader's: it turns False naming the worker pod and its rank, with an Event and the
    metric."""
    fake, rt = served
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": LEADER,
            "namespace": NS,
            "uid": GROUP_STS_UID,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": LEADER,
                    "uid": LEADER_UID,
                    "controller": True,
                }
            ],
        },
    }
    leader_patches: list[dict[str, Any]] = []

    async def get_statefulset(request: web.Request) -> web.Response:
        return web.json_response(statefulset)

    async def leader_status(request: web.Request) -> web.Response:
        leader_patches.append(await request.json())
        return web.json_response({"metadata": {"uid": LEADER_UID}})

    app = web.Application()
    app.router.add_get(f"/api/v1/namespaces/{NS}/pods/{WORKER}/log", fake.log)
    app.router.add_get(f"/apis/apps/v1/namespaces/{NS}/statefulsets/{LEADER}", get_statefulset)
    app.router.add_patch(f"/api/v1/namespaces/{NS}/pods/{LEADER}/status", leader_status)
    app.router.add_post(f"/api/v1/namespaces/{NS}/events", fake.event)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    rt.api = KubeApi(Credentials(server=f"http://127.0.0.1:{port}"))
    leader, worker = group_pods()
    rt.pods[LEADER_UID] = leader
    series = ("models", "llama", WORKER, "decode")
    before = metrics.KV_CANARY_VIOLATIONS.labels(*series)._value.get()
    try:
        kv_canary_watch.on_worker_event(rt, "ADDED", worker)
        await fake.lines.put(f"2026-11-05T12:00:01.000000001Z {STATS_OK}")  # then dropped
        line = f"2026-11-05T12:00:03.000000001Z [2026-11-05 12:00:03 TP1] {VIOLATION}"
        await fake.lines.put(line)
        deadline = time.monotonic() + 10
        while not (leader_patches and fake.events) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert leader_patches, "the leader's gate was never written"
        condition = leader_patches[0]["status"]["conditions"][0]
        assert condition["type"] == labels.ENGINE_VERIFIED and condition["status"] == "False"
        assert condition["reason"] == "KvCanaryViolation"
        message = condition["message"]
        assert f"worker pod {WORKER} (node rank 1, TP1)" in message, message
        assert "launch_tag=HEAD_K_FULL" in message and f"leader pod {LEADER}" in message
        assert fake.events[0]["reason"] == "KvCanaryViolation"
        assert WORKER in fake.events[0]["message"]
        assert metrics.KV_CANARY_VIOLATIONS.labels(*series)._value.get() == before + 1
        # Sticky on the leader: its next Safe verdict cannot turn the group's gate True again.
        safe = {"type": labels.ENGINE_VERIFIED, "status": "True", "reason": "EngineVerified"}
        kept = kv_canary_watch.override(leader, safe, NOW)
        assert kept is not None and kept["reason"] == "KvCanaryViolation"
        # A replaced worker pod (new uid) gets a follower of its own.
        kv_canary_watch.on_worker_event(rt, "DELETED", worker)
        replaced = copy.deepcopy(worker)
        replaced["metadata"]["uid"] = "uid-worker-1b"
        kv_canary_watch.on_worker_event(rt, "ADDED", replaced)
        count = len(fake.log_requests)
        while len(fake.log_requests) == count and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert len(fake.log_requests) == count + 1
        kv_canary_watch.on_worker_event(rt, "DELETED", replaced)
    finally:
        kv_canary_watch.on_pod_event(rt, "DELETED", leader)
        await rt.api.close()
        await runner.cleanup()


async def test_a_worker_seen_before_its_deployment_is_followed_on_its_leaders_next_pass(
    served: tuple[FakeApiServer, Runtime],
) -> None:
    """A worker's watch event can come before the operator knows its ModelDeployment (after a
    restart); running workers send no further events, so the leader's verification pass
    starts their followers."""
    _, rt = served
    leader, worker = group_pods()
    saved = rt.mds.pop((NS, "llama"))
    rt.pods[LEADER_UID] = leader
    try:
        kv_canary_watch.on_worker_event(rt, "ADDED", worker)
        assert WORKER_UID not in kv_canary_watch._followers
        rt.mds[(NS, "llama")] = saved
        kv_canary_watch.on_check(rt, leader, None, NOW)
        assert not kv_canary_watch._followers[WORKER_UID].done()
    finally:
        kv_canary_watch.on_worker_event(rt, "DELETED", worker)
        kv_canary_watch.on_pod_event(rt, "DELETED", leader)


def test_a_deleted_worker_or_leader_pod_leaves_no_canary_series_behind() -> None:
    """kvgate_kv_canary_violations_total is per pod: a pod that is gone drops its series, a
    multi-node worker (followed from its own watch) as well as an engine pod, so /metrics does
    not grow with every pod a ModelDeployment ever had."""
    from kvgate.controller import engine_pods

    rt = Runtime(
        api=KubeApi(Credentials(server="http://127.0.0.1:9")),
        settings=OperatorSettings(),
        verify=None,  # type: ignore[arg-type]
    )
    rt.leading = True
    leader, worker = group_pods()
    name = "kvgate_kv_canary_violations_total"

    def value(pod_name: str) -> float | None:
        return metrics.REGISTRY.get_sample_value(
            name, {"namespace": NS, "deployment": "llama", "pod": pod_name, "role": "decode"}
        )

    for pod_name in (WORKER, LEADER):
        metrics.KV_CANARY_VIOLATIONS.labels(NS, "llama", pod_name, "decode").inc()
        assert value(pod_name) is not None
    kv_canary_watch.on_worker_event(rt, "ADDED", worker)  # safety.kvCanary off: not followed
    kv_canary_watch.on_worker_event(rt, "DELETED", worker)
    assert value(WORKER) is None
    assert value(LEADER) == 1.0  # the leader still runs
    engine_pods.on_pod_event(rt, "DELETED", leader)
    assert value(LEADER) is None
