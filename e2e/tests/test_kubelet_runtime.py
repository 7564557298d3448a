"""The loopback kubelet's pod worker with real processes on 127.0.0.x and an in-memory API.

No cluster: the "apiserver" here records the status patches and the final delete, so these tests
prove what the worker *writes* (probe-driven readiness, gate handling, restarts, deletion) in a few
seconds. The real apiserver's side is covered by test_kubelet_smoke.py.
"""

from __future__ import annotations

import asyncio
import copy
import ipaddress
import itertools
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kvgate_e2e.kubelet.api import ApiError
from kvgate_e2e.kubelet.mounts import MountPoints
from kvgate_e2e.kubelet.runtime import PodWorker, RuntimeSettings

GATE = "kvgate.io/engine-verified"
# A deadline, not a bound: a status the pod worker writes (a probe's result, a gate, a restart) or
# its task ending after deleted(grace=2): local process starts and kills (well under a second here)
# and the 2 s grace; only a status that never comes reaches it.
WORKER_DEADLINE = 20
_hosts = itertools.count(2)


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class FakeApi:
    """Keeps one pod; applies status patches (conditions merged by type, like the server)."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.pod = copy.deepcopy(pod)
        self.patches: list[dict[str, Any]] = []
        self.deletes: list[tuple[str, Any]] = []
        self.changed = asyncio.Event()
        # Called with the pod as a patch left it, before the patch's response returns (what
        # others write meanwhile, and the watch events the kubelet sees before that response).
        self.before_response: Callable[[dict[str, Any]], None] | None = None

    async def patch(self, path: str, body: Any, content_type: str = "") -> Any:
        assert path.endswith("/status")
        self.patches.append(copy.deepcopy(body))
        status = self.pod.setdefault("status", {})
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        for cond in body["status"].get("conditions") or []:
            conditions[cond["type"]] = cond
        status.update({k: v for k, v in body["status"].items() if k != "conditions"})
        status["conditions"] = list(conditions.values())
        meta = self.pod["metadata"]
        meta["resourceVersion"] = str(int(meta.get("resourceVersion") or 0) + 1)
        response = copy.deepcopy(self.pod)
        if self.before_response is not None:
            self.before_response(response)
        self.changed.set()
        return response

    async def delete(self, path: str, body: Any = None) -> Any:
        self.deletes.append((path, body))
        self.changed.set()
        return None

    async def get(self, path: str, params: Any = None) -> Any:
        raise ApiError("GET", path, 404, "not found")

    async def create(self, path: str, body: Any) -> Any:
        raise ApiError("POST", path, 404, "not found")


class LoopbackAddresses:
    def __init__(self, host: str) -> None:
        self.host = host
        self.released: list[ipaddress.IPv4Address] = []

    def add_pod_ip(self) -> ipaddress.IPv4Address:
        return ipaddress.IPv4Address(self.host)

    def release_pod_ip(self, addr: ipaddress.IPv4Address) -> None:
        self.released.append(addr)


class FakeHost:
    def __init__(self, pod: dict[str, Any], run_dir: Path, session: aiohttp.ClientSession) -> None:
        self.fake_api = FakeApi(pod)
        self.api: Any = self.fake_api
        self.settings = RuntimeSettings(
            run_dir=run_dir,
            python=sys.executable,
            venv_bin=str(Path(sys.executable).parent),
            ca_pem=b"",
            service_env={"KUBERNETES_SERVICE_HOST": "198.19.0.1"},
            backoff_initial=0.2,
            backoff_max=1.0,
            mount_namespaces=False,
        )
        self.addresses = LoopbackAddresses(f"127.0.0.{next(_hosts)}")
        self.probe_session = session
        self.done: list[str] = []

    async def gpu_memory_gib(self, node: str) -> float:
        return 24.0

    def node_ip(self, node: str) -> str:
        return "198.18.0.10"

    def worker_done(self, uid: str) -> None:
        self.done.append(uid)


def web_pod(port: int, *, gates: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": "small",
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "web",
                "image": "python:3.11",
                "command": ["python3", "-m", "http.server", "--bind", "$(POD_IP)", str(port)],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "GREETING", "value": "hi-$(POD_IP)"},
                ],
                "readinessProbe": {"httpGet": {"path": "/", "port": port}, "periodSeconds": 1},
            }
        ],
    }
    if gates:
        spec["readinessGates"] = [{"conditionType": GATE}]
    return {
        "metadata": {"name": "web", "namespace": "ns", "uid": "uid-1", "resourceVersion": "1"},
        "spec": spec,
        "status": {"phase": "Pending"},
    }


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        yield s


async def until(host: FakeHost, what: str, check: Callable[[dict[str, Any]], bool]) -> None:
    async def loop() -> None:
        while not check(host.fake_api.pod):
            host.fake_api.changed.clear()
            await host.fake_api.changed.wait()

    try:
        await asyncio.wait_for(loop(), WORKER_DEADLINE)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}; pod: {host.fake_api.pod}") from None


def cond(pod: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [c for c in pod.get("status", {}).get("conditions", []) if c["type"] == kind]
    return found[0] if found else {}


def with_gate(pod: dict[str, Any], status: str, rv: str) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["metadata"]["resourceVersion"] = rv
    conds = [c for c in out["status"]["conditions"] if c["type"] != GATE]
    out["status"]["conditions"] = [*conds, {"type": GATE, "status": status}]
    return out


async def test_probed_container_with_unset_gate_is_containers_ready_but_not_ready(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    host = FakeHost(web_pod(0), tmp_path, session)
    port = free_port(host.addresses.host)
    host.fake_api.pod = web_pod(port)
    worker = PodWorker(host, host.fake_api.pod)
    task = asyncio.create_task(worker.run())
    try:
        await until(
            host, "ContainersReady", lambda p: cond(p, "ContainersReady").get("status") == "True"
        )
        pod = host.fake_api.pod
        assert pod["status"]["podIP"] == host.addresses.host
        assert pod["status"]["phase"] == "Running"
        assert cond(pod, "Ready") | {"lastTransitionTime": None} == {
            "type": "Ready",
            "status": "False",
            "reason": "ReadinessGatesNotReady",
            "message": f'corresponding condition of pod readiness gate "{GATE}" does not exist.',
            "lastProbeTime": None,
            "lastTransitionTime": None,
        }
        written = {c["type"] for p in host.fake_api.patches for c in p["status"]["conditions"]}
        assert written == {"PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"}

        # Someone else (the operator) sets the gate: the next event re-evaluates Ready.
        worker.update(with_gate(pod, "True", "100"))
        await until(host, "Ready", lambda p: cond(p, "Ready").get("status") == "True")
        ready_at = cond(host.fake_api.pod, "Ready")["lastTransitionTime"]
        containers_at = cond(host.fake_api.pod, "ContainersReady")["lastTransitionTime"]
        # An out-of-date event (lower resourceVersion) must not flip anything back.
        worker.update(with_gate(pod, "False", "50"))
        worker.update(with_gate(host.fake_api.pod, "False", "101"))
        await until(host, "Ready=False", lambda p: cond(p, "Ready").get("status") == "False")
        assert cond(host.fake_api.pod, "ContainersReady")["lastTransitionTime"] == containers_at
        assert cond(host.fake_api.pod, "Ready")["lastTransitionTime"] >= ready_at
        log = worker.log_path("web").read_text()
        assert "http.server" in log
    finally:
        worker.deleted(grace=2)
        await asyncio.wait_for(task, WORKER_DEADLINE)
    assert host.done == ["uid-1"]
    assert host.addresses.released == [ipaddress.IPv4Address(host.addresses.host)]


async def test_a_gate_set_while_a_status_patch_is_in_flight_still_makes_the_pod_ready(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    """The operator sets the gate, and its watch event reaches the kubelet before the response to
    the kubelet's own status patch (which carries the older resourceVersion). The worker must
    keep the newer view and publish Ready=True, not recompute from the response, see the patch
    it already wrote and wait forever (seen in e2e: gate True, ContainersReady True, Ready
    False for 300 s)."""
    host = FakeHost(web_pod(0), tmp_path, session)
    port = free_port(host.addresses.host)
    host.fake_api.pod = web_pod(port)
    worker = PodWorker(host, host.fake_api.pod)

    def operator_sets_the_gate(applied: dict[str, Any]) -> None:
        if cond(applied, "ContainersReady").get("status") != "True":
            return
        host.fake_api.before_response = None
        rv = str(int(applied["metadata"]["resourceVersion"]) + 1)
        host.fake_api.pod = with_gate(applied, "True", rv)
        worker.update(copy.deepcopy(host.fake_api.pod))

    host.fake_api.before_response = operator_sets_the_gate
    task = asyncio.create_task(worker.run())
    try:
        await until(host, "Ready", lambda p: cond(p, "Ready").get("status") == "True")
        assert cond(host.fake_api.pod, GATE)["status"] == "True"
    finally:
        worker.deleted(grace=2)
        await asyncio.wait_for(task, WORKER_DEADLINE)


async def test_ready_written_false_by_someone_else_is_put_back_while_nothing_changed_here(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    """Another writer sets Ready=False and leaves ContainersReady alone, as the node lifecycle
    controller's MarkPodsNotReady does when a node's Lease is late (a loaded machine, an API
    server restart). Nothing changed on this kubelet's side, so the status it computes equals
    the one it last wrote; the real kubelet's status manager still writes it again
    (syncBatch: needsReconcile, the API's status differs from its cache). The same picture was
    seen once in an e2e run (gate True, ContainersReady True, Ready False, the router never
    Ready); that this was its cause is not proven."""
    host = FakeHost(web_pod(0), tmp_path, session)
    port = free_port(host.addresses.host)
    host.fake_api.pod = web_pod(port)
    worker = PodWorker(host, host.fake_api.pod)
    task = asyncio.create_task(worker.run())
    try:
        await until(
            host, "ContainersReady", lambda p: cond(p, "ContainersReady").get("status") == "True"
        )
        host.fake_api.pod = with_gate(host.fake_api.pod, "True", "100")  # the operator's gate
        worker.update(copy.deepcopy(host.fake_api.pod))
        await until(host, "Ready", lambda p: cond(p, "Ready").get("status") == "True")
        marked = copy.deepcopy(host.fake_api.pod)
        marked["metadata"]["resourceVersion"] = "200"
        for c in marked["status"]["conditions"]:
            if c["type"] == "Ready":
                c["status"] = "False"
        host.fake_api.pod = copy.deepcopy(marked)
        worker.update(marked)
        await until(host, "Ready put back", lambda p: cond(p, "Ready").get("status") == "True")
        assert cond(host.fake_api.pod, "ContainersReady")["status"] == "True"
    finally:
        worker.deleted(grace=2)
        await asyncio.wait_for(task, WORKER_DEADLINE)


async def test_killed_container_restarts_with_last_state_and_deletion_is_finished(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    host = FakeHost(web_pod(0), tmp_path, session)
    port = free_port(host.addresses.host)
    host.fake_api.pod = web_pod(port, gates=False)
    worker = PodWorker(host, host.fake_api.pod)
    task = asyncio.create_task(worker.run())
    await until(host, "Ready", lambda p: cond(p, "Ready").get("status") == "True")
    first_pid = worker.kill_container("web")
    assert first_pid is not None

    def restarted(p: dict[str, Any]) -> bool:
        (cs,) = p["status"]["containerStatuses"]
        return cs["restartCount"] == 1 and cs["ready"]

    await until(host, "a restart", restarted)
    (cs,) = host.fake_api.pod["status"]["containerStatuses"]
    assert cs["lastState"]["terminated"]["exitCode"] == 137
    assert cs["lastState"]["terminated"]["containerID"] == f"loopback://{first_pid}"
    assert cs["containerID"] != f"loopback://{first_pid}"
    second_pid = int(cs["containerID"].removeprefix("loopback://"))

    deleting = copy.deepcopy(host.fake_api.pod)
    deleting["metadata"] |= {
        "deletionTimestamp": "2026-01-01T00:00:00Z",
        "deletionGracePeriodSeconds": 5,
        "resourceVersion": "200",
    }
    worker.update(deleting)
    await asyncio.wait_for(task, WORKER_DEADLINE)
    assert host.fake_api.deletes == [
        (
            "/api/v1/namespaces/ns/pods/web",
            {"gracePeriodSeconds": 0, "preconditions": {"uid": "uid-1"}},
        )
    ]
    with pytest.raises(ProcessLookupError):
        os.kill(second_pid, 0)
    (cs,) = host.fake_api.pod["status"]["containerStatuses"]
    assert "terminated" in cs["state"] and not cs["ready"]


# One container exits on SIGTERM (Python's default); the other ignores it, as a process that
# drains slowly does (smg waits drain_settle_secs): only SIGKILL stops that one.
POLITE = "import time; print('up', flush=True); time.sleep(3600)"
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('up', flush=True); time.sleep(3600)"
)


# The pod's own grace period, and the bound that tells "reported or killed at once" from "waited
# for that grace": half of it, far above any machine's process start and kill, far below 60 s.
LONG_GRACE = 60
CUT_BOUND = LONG_GRACE / 2


@pytest.mark.parametrize("cut", ["a shorter grace period", "the pod object gone"])
async def test_a_process_that_exits_on_sigterm_is_reported_at_once_and_a_cut_grace_kills_the_rest(
    tmp_path: Path, session: aiohttp.ClientSession, cut: str
) -> None:
    host = FakeHost(web_pod(0), tmp_path, session)
    pod = web_pod(0, gates=False)
    pod["spec"]["terminationGracePeriodSeconds"] = LONG_GRACE
    pod["spec"]["containers"] = [
        {"name": name, "image": "python:3.11", "command": [sys.executable, "-c", code]}
        for name, code in (("polite", POLITE), ("stubborn", STUBBORN))
    ]
    host.fake_api.pod = pod
    worker = PodWorker(host, host.fake_api.pod)
    task = asyncio.create_task(worker.run())
    loop = asyncio.get_running_loop()
    try:
        await until(host, "Ready", lambda p: cond(p, "Ready").get("status") == "True")
        deadline = loop.time() + 20
        # A line of its own: the log's header line quotes the command, 'up' included.
        while not all(
            "up" in worker.log_path(c).read_text().splitlines() for c in ("polite", "stubborn")
        ):
            assert loop.time() < deadline, "the containers never started"
            await asyncio.sleep(0.05)
        stubborn = worker.procs["stubborn"].popen.pid

        def deletion(grace: int, rv: str) -> dict[str, Any]:
            pod = copy.deepcopy(host.fake_api.pod)
            pod["metadata"] |= {
                "deletionTimestamp": "2026-01-01T00:00:00Z",
                "deletionGracePeriodSeconds": grace,
                "resourceVersion": rv,
            }
            return pod

        def state(p: dict[str, Any], name: str) -> dict[str, Any]:
            (cs,) = [c for c in p["status"]["containerStatuses"] if c["name"] == name]
            return dict(cs["state"])

        asked = loop.time()
        worker.update(deletion(LONG_GRACE, "200"))
        await until(host, "polite terminated", lambda p: "terminated" in state(p, "polite"))
        assert loop.time() - asked < CUT_BOUND, "a process that exited on SIGTERM was not reported"
        assert state(host.fake_api.pod, "polite")["terminated"]["exitCode"] == 143
        await asyncio.sleep(1)
        assert not task.done(), "stopped before its 60 s grace period or a shorter one"
        os.kill(stubborn, 0)  # still running: it ignores SIGTERM

        cut_at = loop.time()
        if cut == "a shorter grace period":
            worker.update(deletion(1, "201"))
        else:
            worker.deleted()
        await asyncio.wait_for(task, CUT_BOUND)
        took = loop.time() - cut_at
    finally:
        worker.deleted()
        await asyncio.wait_for(task, WORKER_DEADLINE)
    with pytest.raises(ProcessLookupError):
        os.kill(stubborn, 0)
    if cut == "a shorter grace period":
        assert 0.9 < took < CUT_BOUND, f"SIGKILL {took:.1f}s after a 1 s grace period"
        assert state(host.fake_api.pod, "stubborn")["terminated"]["exitCode"] == 137
        assert len(host.fake_api.deletes) == 1
    else:
        assert took < CUT_BOUND, f"SIGKILL {took:.1f}s after the pod object was deleted"
        assert host.fake_api.deletes == []  # a gone pod is neither written nor deleted


def test_mount_points_are_removed_only_when_the_last_kubelet_leaves(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    target = tmp_path / "run" / "secrets" / "kubernetes.io" / "serviceaccount"
    first, second = MountPoints(registry), MountPoints(registry)
    first.ensure(target)
    second.ensure(target)
    first.cleanup()
    assert target.is_dir(), "removed while another kubelet may still mount it"
    second.cleanup()
    assert not (tmp_path / "run").exists()
    assert not registry.exists()


# ---------------------------------------------------------------- native sidecars (KEP-753)
# A container that logs when it starts, is probed and is asked to stop, and answers GET / with 200
# while its flag file exists (503 otherwise): readiness the test switches by touching a file.
FLAGGED_SERVER = r"""
import http.server, os, signal, sys, time
name, port, flag, log = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def note(what):
    with open(log, "a") as f:
        f.write(f"{what} {name} {time.monotonic()}\n")
def stop(*_):
    note("stop")
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
note("start")
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        note("probe")
        self.send_response(200 if os.path.exists(flag) else 503)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer((os.environ["POD_IP"], port), Handler).serve_forever()
"""


def flagged(name: str, port: int, flag: Path, log: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": "python:3.11",
        "command": [sys.executable, "-c", FLAGGED_SERVER, name, str(port), str(flag), str(log)],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        # A generous timeout: a loaded machine must not fail a probe the test did not fail.
        "readinessProbe": {
            "httpGet": {"path": "/", "port": port},
            "periodSeconds": 1,
            "timeoutSeconds": 5,
        },
        **extra,
    }


def sidecar_pod(host: FakeHost, tmp_path: Path, **sidecar: Any) -> dict[str, Any]:
    ip = host.addresses.host
    log = tmp_path / "events.log"
    pod = web_pod(0, gates=False)
    pod["spec"]["restartPolicy"] = "Never"  # sidecars restart regardless
    pod["spec"]["initContainers"] = [
        flagged(
            "guard", free_port(ip), tmp_path / "guard.ok", log, restartPolicy="Always", **sidecar
        )
    ]
    pod["spec"]["containers"] = [flagged("engine", free_port(ip), tmp_path / "engine.ok", log)]
    return pod


def events_of(tmp_path: Path, kinds: tuple[str, ...] = ("start", "stop")) -> list[str]:
    """``["start guard", "start engine", ...]`` in the order they happened."""
    path = tmp_path / "events.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [" ".join(line.split()[:2]) for line in lines if line.split()[0] in kinds]


def init_status(pod: dict[str, Any]) -> dict[str, Any]:
    """The one sidecar's status ({} before the first status patch)."""
    statuses = pod.get("status", {}).get("initContainerStatuses") or [{}]
    (status,) = statuses
    return dict(status)


async def test_a_sidecar_starts_first_its_readiness_gates_ready_and_it_stops_last(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    host = FakeHost(web_pod(0), tmp_path, session)
    host.fake_api.pod = sidecar_pod(host, tmp_path)
    (tmp_path / "guard.ok").touch()
    (tmp_path / "engine.ok").touch()
    worker = PodWorker(host, host.fake_api.pod)
    task = asyncio.create_task(worker.run())
    await until(host, "Ready", lambda p: cond(p, "Ready").get("status") == "True")
    # Spawned in that order (their own start-up lines may still race: both are Pythons).
    assert worker.procs["guard"].started_monotonic < worker.procs["engine"].started_monotonic
    status = init_status(host.fake_api.pod)
    assert (status["name"], status["ready"], status["started"]) == ("guard", True, True)
    assert cond(host.fake_api.pod, "Initialized")["status"] == "True"

    # The sidecar turns unready: the kubelet alone takes the pod out of Ready.
    (tmp_path / "guard.ok").unlink()
    await until(host, "Ready=False", lambda p: cond(p, "Ready").get("status") == "False")
    assert cond(host.fake_api.pod, "Ready")["message"] == (
        "containers with unready status: [guard]"
    )
    (cs,) = host.fake_api.pod["status"]["containerStatuses"]
    assert cs["ready"] is True
    (tmp_path / "guard.ok").touch()
    await until(host, "Ready again", lambda p: cond(p, "Ready").get("status") == "True")

    # Killed, it is restarted (pod restartPolicy Never notwithstanding); the pod stays
    # initialized and the engine is not touched.
    worker.kill_container("guard")
    await until(
        host,
        "the sidecar restarted and ready",
        lambda p: init_status(p)["restartCount"] == 1 and init_status(p)["ready"],
    )
    assert cond(host.fake_api.pod, "Initialized")["status"] == "True"
    (cs,) = host.fake_api.pod["status"]["containerStatuses"]
    assert cs["restartCount"] == 0
    assert cond(host.fake_api.pod, "Ready")["status"] == "True"

    deleting = copy.deepcopy(host.fake_api.pod)
    deleting["metadata"] |= {
        "deletionTimestamp": "2026-01-01T00:00:00Z",
        "deletionGracePeriodSeconds": 5,
        "resourceVersion": "200",
    }
    worker.update(deleting)
    await asyncio.wait_for(task, WORKER_DEADLINE)
    assert events_of(tmp_path)[-2:] == ["stop engine", "stop guard"]


async def test_the_next_container_waits_for_the_sidecars_startup_probe(
    tmp_path: Path, session: aiohttp.ClientSession
) -> None:
    host = FakeHost(web_pod(0), tmp_path, session)
    pod = sidecar_pod(host, tmp_path)
    port = pod["spec"]["initContainers"][0]["readinessProbe"]["httpGet"]["port"]
    pod["spec"]["initContainers"][0]["startupProbe"] = {
        "httpGet": {"path": "/", "port": port},
        "periodSeconds": 1,
        "failureThreshold": 30,
    }
    host.fake_api.pod = pod
    (tmp_path / "engine.ok").touch()
    worker = PodWorker(host, host.fake_api.pod)
    task = asyncio.create_task(worker.run())
    try:
        await until(
            host,
            "the sidecar running, not started",
            lambda p: "running" in (init_status(p).get("state") or {}),
        )
        deadline = asyncio.get_running_loop().time() + 20
        while events_of(tmp_path, ("probe",)).count("probe guard") < 2:  # two failed probes
            assert asyncio.get_running_loop().time() < deadline, "the startup probe never ran"
            await asyncio.sleep(0.05)
        pod_now = host.fake_api.pod
        assert init_status(pod_now)["started"] is False
        assert cond(pod_now, "Initialized")["message"] == (
            "containers with incomplete status: [guard]"
        )
        assert pod_now["status"]["phase"] == "Pending"
        assert events_of(tmp_path) == ["start guard"]  # the engine has not been started
        (tmp_path / "guard.ok").touch()
        await until(host, "Ready", lambda p: cond(p, "Ready").get("status") == "True")
        assert sorted(events_of(tmp_path)) == ["start engine", "start guard"]
    finally:
        worker.deleted(grace=2)
        await asyncio.wait_for(task, WORKER_DEADLINE)
