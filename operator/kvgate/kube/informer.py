"""A list-then-watch of one kind of object (client-go's reflector, in asyncio): the operator's
own, not kopf's, for engine pods (kvgate.controller.main wires it).

Why not kopf's watch: a ModelDeployment's pass must read its engine pods from memory, and it may
only do so once the operator has seen every engine pod that exists. kopf cannot say when that is
except through its index barrier, which is quadratic in the listed objects: a leader restarted with
9,000 engine pods never finished its paged listing (the continue token expired, HTTP 410, kopf
raised and restarted the listing, in the 1,000-ModelDeployment scale benchmark). kopf's re-list
after a 410 also reports no deletions. This reflector:

* lists in pages of ``page_size`` and delivers each listed object as it arrives (event type
  ``None``, as kopf does for its listing): nothing holds a page longer than its delivery;
* restarts the list from its first page when a continue token expires (410);
* after a complete list, delivers a deletion for every stored object the list no longer holds
  (``stored`` says which), so an object deleted while the watch was down is forgotten;
* is ``synced`` from its first complete list on (and stays so: after that the store is as
  current as any informer's);
* then watches from the list's resourceVersion, with bookmarks, re-opening the watch where it
  ended; a watch answered with 410 Gone lists again;
* can be ``resume``d: its watch re-opened from the last resourceVersion it delivered, and
  ``opened`` counts the watches the API server accepted. A standby that becomes the leader
  resumes every reflector and acts once each new watch is open: the server then replays every
  change after that version (or answers 410 and the reflector lists again), so a watch that
  hung or expired while it stood by cannot leave it acting on a stale store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvgate.kube import metrics
from kvgate.kube.k8s import ApiError, Body, KubeApi, resource_of

log = logging.getLogger("kvgate.kube.informer")

PAGE_SIZE = 500  # objects per list page (client-go's reflector uses 500 too)
WATCH_SECONDS = 300  # the API server ends each watch after this; it is re-opened at once
BACKOFF_SECONDS = (1.0, 30.0)  # first and longest wait after a failed list or watch
SETTLE_SECONDS = 0.25  # a watch with no ERROR this long after it opened took its version


@dataclass(eq=False)
class Reflector:
    api: KubeApi
    path: str  # the collection, e.g. /api/v1/namespaces/models/pods
    selector: str  # labelSelector
    kind: str  # the objects' kind and apiVersion (list items carry neither)
    api_version: str
    on_event: Callable[[str | None, Body], None]  # type None: listed; else the watch's type
    on_vanished: Callable[[str], None]  # a stored uid the latest complete list did not hold
    stored: Callable[[], Iterable[str]]  # uids the store holds in this reflector's scope
    page_size: int = PAGE_SIZE
    watch_seconds: int = WATCH_SECONDS
    synced: bool = False
    lists: int = 0  # complete lists so far (the first, then one per 410)
    opened: int = 0  # watches the API server accepted so far
    open_since: float | None = None  # when the watch now open was accepted (monotonic)
    heard: bool = False  # an event or bookmark arrived on the watch now open
    version: str = ""  # the resourceVersion to watch from
    must_list: bool = True  # no list yet, or its watch got 410 Gone
    watching: bool = False  # in its watch phase (a stream open, or being re-opened)
    task: asyncio.Task[None] | None = field(default=None, repr=False)  # see start and resume
    _sleep: Callable[[float], Any] = field(default=asyncio.sleep, repr=False)

    def start(self, spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]) -> None:
        """Run the reflector in a task made by ``spawn(coro, name)``."""
        self.task = spawn(self.run(), f"reflector:{self.path}")

    def resume(self, spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]]) -> None:
        """Re-open the watch from the last resourceVersion delivered (a reflector that is
        listing, or waiting to list again, goes on: its next watch opens after the list)."""
        if not self.watching or self.task is None:
            return
        self.task.cancel()
        self.watching, self.open_since = False, None
        self.start(spawn)

    async def run(self) -> None:
        """List, then watch, for ever (until cancelled). Errors are logged and retried with
        backoff; none ends the loop (a dead reflector would leave new engine pods unverified
        and never serving). A reflector that has listed before watches from where it was."""
        delay = BACKOFF_SECONDS[0]
        while True:
            try:
                if self.must_list:
                    self.watching = False
                    self.version = await self._list()
                    self.synced, self.must_list = True, False
                delay = BACKOFF_SECONDS[0]
                await self._watch()
                self.must_list = True  # 410 Gone
            except (ApiError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.warning("listing %s failed (%s); again in %.0fs", self.path, exc, delay)
                delay = await self._backoff(delay)
            except Exception:  # a bug: say so, keep the store alive, and list it whole again
                log.exception("the list-then-watch of %s failed; again in %.0fs", self.path, delay)
                self.must_list = True
                delay = await self._backoff(delay)

    async def _backoff(self, delay: float) -> float:
        """Wait ``delay`` seconds; the next wait (doubled, at most BACKOFF_SECONDS[1])."""
        await self._sleep(delay)
        return min(delay * 2, BACKOFF_SECONDS[1])

    def _deliver(self, event_type: str | None, body: Body) -> None:
        body.setdefault("kind", self.kind)
        body.setdefault("apiVersion", self.api_version)
        try:
            self.on_event(event_type, body)
        except Exception:  # one object's failure must not stop the stream of the others
            log.exception("handling a %s event of %s failed", event_type or "listed", self.path)

    async def _list(self) -> str:
        """One complete list (restarted on an expired continue token); its resourceVersion."""
        while True:
            listed: set[str] = set()
            version = ""
            token: str | None = None
            try:
                while True:
                    params = {"labelSelector": self.selector, "limit": str(self.page_size)}
                    if token:
                        params["continue"] = token
                    doc = await self.api.request("GET", self.path, params=params) or {}
                    for item in doc.get("items") or []:
                        listed.add(str(item.get("metadata", {}).get("uid", "")))
                        self._deliver(None, item)
                    meta = doc.get("metadata") or {}
                    version = version or str(meta.get("resourceVersion", ""))
                    token = meta.get("continue") or None
                    if token is None:
                        break
            except ApiError as exc:
                if exc.status != 410:
                    raise
                log.info("the list of %s expired before its last page: listing again", self.path)
                continue
            for uid in [uid for uid in self.stored() if uid not in listed]:
                try:
                    self.on_vanished(uid)
                except Exception:
                    log.exception("forgetting %s of %s failed", uid, self.path)
            self.lists += 1
            metrics.WATCH_LISTS.labels(resource_of(self.path)).inc()
            return version

    def _opened(self) -> None:
        self.opened += 1
        self.open_since, self.heard = time.monotonic(), False

    def current(self, settle_seconds: float = SETTLE_SECONDS) -> bool:
        """Whether a watch is open and the API server did not refuse its resourceVersion: an
        event or bookmark arrived on it, or ``settle_seconds`` passed without its ERROR (the
        API server sends a too-old version's 410 at once, as the watch's first event)."""
        since = self.open_since
        return since is not None and (self.heard or time.monotonic() - since >= settle_seconds)

    async def _watch(self) -> None:
        """Watch from ``self.version`` until the API server answers 410 Gone (then return:
        list again). A watch that ends, or breaks, is re-opened from the last version seen."""
        delay = BACKOFF_SECONDS[0]
        self.watching = True
        while True:
            params = {
                "labelSelector": self.selector,
                "resourceVersion": self.version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": str(self.watch_seconds),
            }
            try:
                async for event in self.api.watch(
                    self.path,
                    params,
                    read_timeout=self.watch_seconds + 30.0,
                    on_open=self._opened,
                ):
                    self.version = self._on_watch_event(event) or self.version
                    self.heard = True
                self.open_since = None
                delay = BACKOFF_SECONDS[0]
            except ApiError as exc:  # an HTTP error, or an ERROR event (_on_watch_event)
                self.open_since = None
                if exc.status == 410:
                    log.info("the watch of %s expired (410 Gone): listing again", self.path)
                    return
                log.warning("watching %s failed (%s); again in %.0fs", self.path, exc, delay)
                delay = await self._backoff(delay)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                self.open_since = None
                log.info("the watch of %s broke (%r): re-opening it", self.path, exc)
                delay = await self._backoff(delay)

    def _on_watch_event(self, event: Body) -> str | None:
        """Deliver one watch event; the resourceVersion to resume from after it."""
        event_type = event.get("type")
        obj = event.get("object") or {}
        if event_type == "ERROR":  # a Status: 410 when the version is too old
            raise ApiError(int(obj.get("code") or 500), "WATCH", self.path, str(obj))
        version = obj.get("metadata", {}).get("resourceVersion")
        if event_type in ("ADDED", "MODIFIED", "DELETED"):
            self._deliver(event_type, obj)
        return str(version) if version else None


@dataclass(frozen=True)
class Watched:
    """One kind the operator lists and watches itself."""

    kind: str  # as KubeApi.path knows it; list items carry neither kind nor apiVersion
    api_version: str
    cluster_path: str  # the cluster-wide collection, when no namespace is configured
    selector: str  # labelSelector, applied by the API server


def per_namespace(
    api: KubeApi,
    watched: Watched,
    *,
    namespaces: tuple[str, ...],
    store: Mapping[str, Body],
    on_event: Callable[[str | None, Body], None],
) -> list[Reflector]:
    """One reflector per watched namespace, or one cluster-wide when ``namespaces`` is empty,
    feeding ``on_event``, which keeps ``store`` (uid -> body). A stored object that a complete
    list of its namespace no longer holds is delivered as DELETED."""

    def reflector(namespace: str | None) -> Reflector:
        def stored() -> list[str]:
            return [
                uid
                for uid, body in store.items()
                if namespace is None or body.get("metadata", {}).get("namespace") == namespace
            ]

        def vanished(uid: str) -> None:
            body = store.get(uid)
            if body is not None:
                on_event("DELETED", body)

        return Reflector(
            api=api,
            path=api.path(watched.kind, namespace) if namespace else watched.cluster_path,
            selector=watched.selector,
            kind=watched.kind,
            api_version=watched.api_version,
            on_event=on_event,
            on_vanished=vanished,
            stored=stored,
        )

    return [reflector(namespace) for namespace in namespaces or (None,)]
