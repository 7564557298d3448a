"""The operator's own list-then-watch of engine pods (kvgate.kube.informer), against an API server
stand-in on 127.0.0.1 that pages its lists, expires continue tokens and watches, and streams
scripted watch events: a restarted leader with thousands of engine pods must finish its list (one
scale run's list stalled at 680 of 1,000 ModelDeployments), and a pod deleted while the watch was
down must be forgotten."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web
from factories.local_http import serving_app
from kvgate.api import labels
from kvgate.controller import deployments, engine_pods
from kvgate.controller.runtime import Runtime
from kvgate.kube.informer import Reflector
from kvgate.kube.k8s import Credentials, KubeApi
from kvgate.kube.settings import OperatorSettings

NS = "models"
PATH = f"/api/v1/namespaces/{NS}/pods"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
GONE = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410}


def pod(uid: str, *, version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"pod-{uid}",
            "namespace": NS,
            "uid": uid,
            "resourceVersion": version,
            "labels": {
                labels.COMPONENT: labels.COMPONENT_ENGINE,
                labels.DEPLOYMENT: "llama",
                labels.ROLE: "decode",
            },
        },
        "status": {"phase": "Pending"},
    }


class FakeApiServer:
    """Lists ``pods`` in pages (continue token: the next offset), at resourceVersion
    ``version``; each watch request takes the next scripted stream (a list of events) and, with
    none left, stays open and silent. Records every request's query."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.deployments: list[dict[str, Any]] = []  # served at DEPLOYMENTS, the same way
        self.version = "100"
        self.expire_next_continue = False
        self.streams: list[list[dict[str, Any]]] = []
        self.lists: list[dict[str, str]] = []
        self.watches: list[dict[str, str]] = []
        # Runs as a watch request arrives, before its stream (what changed while nobody watched)
        self.before_watch: Callable[[], None] = lambda: None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        if query.get("watch") == "true":
            self.watches.append(query)
            self.before_watch()
            response = web.StreamResponse()
            await response.prepare(request)
            if not self.streams:
                await asyncio.Event().wait()  # open until the client goes away
            for event in self.streams.pop(0):
                await response.write(json.dumps(event).encode() + b"\n")
            return response
        self.lists.append(query)
        if "continue" in query and self.expire_next_continue:
            self.expire_next_continue = False
            return web.json_response({**GONE, "message": "continue too old"}, status=410)
        items = self.deployments if request.path == DEPLOYMENTS else self.pods
        start = int(query.get("continue", "0"))
        end = start + int(query["limit"])
        meta: dict[str, Any] = {"resourceVersion": self.version}
        if end < len(items):
            meta["continue"] = str(end)
        return web.json_response({"kind": "List", "metadata": meta, "items": items[start:end]})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get(PATH, self.handle)
        app.router.add_get(DEPLOYMENTS, self.handle)
        return app


async def until(predicate: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


class Recorder:
    """A reflector's consumer: a store of uid -> body, and the events in order."""

    def __init__(self) -> None:
        self.store: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str | None, str]] = []

    def on_event(self, event_type: str | None, body: dict[str, Any]) -> None:
        uid = body["metadata"]["uid"]
        self.events.append((event_type, uid))
        if event_type == "DELETED":
            self.store.pop(uid, None)
        else:
            self.store[uid] = body

    def on_vanished(self, uid: str) -> None:
        self.on_event("DELETED", self.store[uid])


@pytest.fixture
async def server() -> AsyncIterator[tuple[FakeApiServer, KubeApi]]:
    fake = FakeApiServer([pod(f"u{i:04d}") for i in range(1_200)])
    async with serving_app(fake.app()) as url:
        api = KubeApi(Credentials(server=url))
        yield fake, api
        await api.close()


async def running(reflector: Reflector, backoffs: list[float] | None = None) -> asyncio.Task[None]:
    """Run the reflector; its backoff waits are recorded (in ``backoffs``) and skipped."""

    async def no_wait(seconds: float) -> None:
        if backoffs is not None:
            backoffs.append(seconds)
        await asyncio.sleep(0)

    reflector._sleep = no_wait
    return asyncio.create_task(reflector.run())


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def reflector_for(api: KubeApi, recorder: Recorder) -> Reflector:
    return Reflector(
        api=api,
        path=PATH,
        selector=engine_pods.ENGINE_SELECTOR,
        kind="Pod",
        api_version="v1",
        on_event=recorder.on_event,
        on_vanished=recorder.on_vanished,
        stored=lambda: list(recorder.store),
    )


async def test_a_list_whose_continue_token_expires_starts_again_and_delivers_every_pod(
    server: tuple[FakeApiServer, KubeApi],
) -> None:
    fake, api = server
    fake.expire_next_continue = True
    recorder = Recorder()
    reflector = reflector_for(api, recorder)
    assert not reflector.synced
    backoffs: list[float] = []
    task = await running(reflector, backoffs)
    try:
        await until(lambda: reflector.synced)
    finally:
        await stop(task)
    assert len(recorder.store) == 1_200
    assert all(body["kind"] == "Pod" for body in recorder.store.values())
    # Page 1, page 2 refused (410), then the whole list again from page 1: 500 + 500 + 200.
    assert [q.get("continue") for q in fake.lists] == [None, "500", None, "500", "1000"]
    assert {q["limit"] for q in fake.lists} == {"500"}
    assert {q["labelSelector"] for q in fake.lists} == {"kvgate.io/component=engine"}
    assert reflector.lists == 1
    assert backoffs == []  # an expired token is not an error to back off from


async def test_the_watch_starts_at_the_lists_version_and_resumes_after_the_last_event_seen(
    server: tuple[FakeApiServer, KubeApi],
) -> None:
    fake, api = server
    fake.pods = [pod("a"), pod("b")]
    fake.streams = [
        [
            {"type": "MODIFIED", "object": pod("a", version="101")},
            {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "150"}}},
        ],  # then the server ends the watch (its timeout)
        [{"type": "ADDED", "object": pod("c", version="151")}],
    ]
    recorder = Recorder()
    task = await running(reflector_for(api, recorder))
    try:
        await until(lambda: len(fake.watches) == 3)
    finally:
        await stop(task)
    assert [q["resourceVersion"] for q in fake.watches] == ["100", "150", "151"]
    assert all(q["allowWatchBookmarks"] == "true" for q in fake.watches)
    assert recorder.events == [(None, "a"), (None, "b"), ("MODIFIED", "a"), ("ADDED", "c")]
    assert len(fake.lists) == 1  # an ended watch is re-opened, not re-listed


async def test_a_watch_answered_410_lists_again_and_forgets_a_pod_deleted_meanwhile(
    server: tuple[FakeApiServer, KubeApi],
) -> None:
    fake, api = server
    fake.pods = [pod("a"), pod("b")]

    def b_deleted_and_c_created_while_nobody_watched() -> None:
        fake.pods, fake.version = [pod("a"), pod("c")], "300"
        fake.before_watch = lambda: None

    fake.before_watch = b_deleted_and_c_created_while_nobody_watched
    fake.streams = [[{"type": "ERROR", "object": {**GONE, "message": "too old"}}]]
    recorder = Recorder()
    reflector = reflector_for(api, recorder)
    task = await running(reflector)
    try:
        await until(lambda: len(fake.watches) == 2)
    finally:
        await stop(task)
    assert reflector.lists == 2 and reflector.synced
    assert sorted(recorder.store) == ["a", "c"]
    assert recorder.events[-1] == ("DELETED", "b")  # after the second list: a, c listed
    assert fake.watches[-1]["resourceVersion"] == "300"


async def test_an_engine_pod_deleted_while_the_watch_was_down_is_forgotten_by_the_operator(
    server: tuple[FakeApiServer, KubeApi], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real wiring (engine_pods.start_reflectors): listed pods get a verifier; a pod a
    later list no longer holds loses its verifier and leaves the store."""

    async def no_probe(*_: Any) -> None:
        return None

    monkeypatch.setattr(engine_pods, "check_pod", no_probe)
    fake, api = server
    fake.pods = [pod("a"), pod("b")]
    rt = Runtime(api=api, settings=OperatorSettings(namespaces=(NS,)), verify=None)  # type: ignore[arg-type]
    seen: dict[str, Any] = {}

    def b_deleted_while_nobody_watched() -> None:
        seen.update(listed=rt.engine_pods_listed, pods=sorted(rt.pods), verifier=rt.verifiers["b"])
        fake.pods, fake.before_watch = [pod("a")], lambda: None

    fake.before_watch = b_deleted_while_nobody_watched
    fake.streams = [[{"type": "ERROR", "object": GONE}]]
    engine_pods.start_reflectors(rt)
    try:
        await until(lambda: len(fake.watches) == 2)
        assert seen["listed"] and seen["pods"] == ["a", "b"]
        assert rt.engine_pods_listed
        assert sorted(rt.pods) == ["a"] and "b" not in rt.verifiers
        await until(seen["verifier"].done)
    finally:
        await rt.shutdown()
    assert not rt.reflector_tasks


async def test_until_its_first_complete_list_the_operator_does_not_claim_every_pod_is_stored(
    server: tuple[FakeApiServer, KubeApi],
) -> None:
    fake, api = server
    settings = OperatorSettings(namespaces=("models", "other"))
    rt = Runtime(api=api, settings=settings, verify=None)  # type: ignore[arg-type]
    assert not rt.engine_pods_listed  # no reflector yet
    fake.pods = []  # nothing to verify
    engine_pods.start_reflectors(rt)
    try:
        assert not rt.engine_pods_listed
        await until(lambda: rt.pod_reflectors[0].synced)
        assert not rt.engine_pods_listed  # the second namespace is not listed (no route: 404)
    finally:
        await rt.shutdown()


async def test_an_event_it_cannot_read_is_logged_and_the_reflector_lists_again(
    server: tuple[FakeApiServer, KubeApi],
) -> None:
    """A dead reflector would leave every new engine pod unverified: nothing may end it."""
    fake, api = server
    fake.pods = [pod("a")]
    fake.streams = [[{"type": "ADDED", "object": "not an object"}]]
    recorder = Recorder()
    backoffs: list[float] = []
    task = await running(reflector_for(api, recorder), backoffs)
    try:
        await until(lambda: len(fake.lists) == 2)
        assert not task.done()
    finally:
        await stop(task)
    assert backoffs == [1.0]


def deployment(uid: str, md: str = "llama") -> dict[str, Any]:
    """A kvgate Deployment as a list returns it (no kind), its pod template included."""
    return {
        "metadata": {
            "name": f"{md}-rev-{uid}",
            "namespace": NS,
            "uid": uid,
            "resourceVersion": "1",
            "labels": {labels.DEPLOYMENT: md, labels.MANAGED_BY: labels.MANAGED_BY_VALUE},
            "annotations": {
                "kvgate.io/template-hash": "abc",
                "deployment.kubernetes.io/revision": "1",
            },
            "managedFields": [{"manager": "kvgate"}],
        },
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "engine"}]}}},
        "status": {"replicas": 2, "readyReplicas": 1},
    }


async def test_the_operators_deployment_store_follows_list_and_watch_and_wakes_their_passes(
    server: tuple[FakeApiServer, KubeApi],
) -> None:
    """The real wiring (deployments.start_reflectors): listed Deployments are stored slim and
    wake their ModelDeployment; a watched deletion leaves the store; the store counts as
    complete only after the first list."""
    fake, api = server
    fake.deployments = [deployment("a"), deployment("b", md="other")]
    fake.streams = [[{"type": "DELETED", "object": deployment("b", md="other")}]]
    settings = OperatorSettings(namespaces=(NS,))
    rt = Runtime(api=api, settings=settings, verify=None)  # type: ignore[arg-type]
    woken = rt.md_wake((NS, "other"))
    assert not rt.deployments_listed
    deployments.start_reflectors(rt)
    try:
        await until(lambda: rt.deployments_listed and "b" not in rt.deployments)
        (uid, kept), *_ = list(rt.deployments.of_md(NS, "llama"))
        assert uid == "a" and kept["kind"] == "Deployment"
        assert kept["metadata"]["annotations"] == {"kvgate.io/template-hash": "abc"}
        assert "template" not in kept["spec"] and "managedFields" not in kept["metadata"]
        assert (kept["spec"]["replicas"], kept["status"]["readyReplicas"]) == (2, 1)
        assert woken.is_set()
        assert fake.lists[0]["labelSelector"] == "app.kubernetes.io/managed-by=kvgate"
    finally:
        await rt.shutdown()


def spawner(tasks: list[asyncio.Task[None]]) -> Callable[[Any, str], asyncio.Task[None]]:
    def spawn(coro: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coro)
        tasks.append(task)
        return task

    return spawn


async def test_a_resumed_watch_reopens_from_the_last_version_delivered_without_listing(
    server: tuple[FakeApiServer, KubeApi],
) -> None:
    """What a standby does when it takes the Lease: its watch may have hung while it stood by,
    so it re-opens it from where its store is; the server replays what came after."""
    fake, api = server
    fake.pods = [pod("a"), pod("b")]
    fake.streams = [[{"type": "MODIFIED", "object": pod("a", version="101")}]]
    recorder = Recorder()
    reflector = reflector_for(api, recorder)
    tasks: list[asyncio.Task[None]] = []
    reflector.start(spawner(tasks))
    try:
        await until(lambda: len(fake.watches) == 2 and reflector.current())
        assert reflector.opened == 2
        fake.streams = [[{"type": "MODIFIED", "object": pod("b", version="102")}]]
        reflector.resume(spawner(tasks))
        await until(lambda: len(fake.watches) == 4)  # the replay ended, re-opened after it
    finally:
        for task in tasks:
            await stop(task)
    assert [q["resourceVersion"] for q in fake.watches] == ["100", "101", "101", "102"]
    assert len(fake.lists) == 1
    assert recorder.events[-1] == ("MODIFIED", "b")


async def test_a_new_leader_waits_for_a_relist_when_its_standby_watch_expired(
    server: tuple[FakeApiServer, KubeApi],
) -> None:
    """The version the standby's store is at is gone (410) when it takes the Lease: it may act
    only once it has listed again, so a pod deleted meanwhile is no longer in its store."""
    fake, api = server
    fake.pods = [pod("a"), pod("b")]
    rt = Runtime(
        api=api,
        settings=OperatorSettings(namespaces=(NS,)),
        verify=None,  # type: ignore[arg-type]
        leading=False,
    )
    engine_pods.start_reflectors(rt)
    try:
        await until(lambda: rt.pod_reflectors[0].current() and len(rt.pods) == 2)

        def b_deleted_while_the_watch_hung() -> None:
            fake.pods, fake.version = [pod("a")], "300"
            fake.streams = [[{"type": "ERROR", "object": {**GONE, "message": "too old"}}]]
            fake.before_watch = lambda: None

        fake.before_watch = b_deleted_while_the_watch_hung
        await asyncio.wait_for(rt.resume_reflectors(), timeout=10)
        assert sorted(rt.pods) == ["a"]  # before resume_reflectors returned
        assert rt.pod_reflectors[0].lists == 2
        assert [q["resourceVersion"] for q in fake.watches] == ["100", "100", "300"]
    finally:
        await rt.shutdown()
