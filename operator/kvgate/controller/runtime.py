"""What the handlers share while the operator runs: the API client, latest bodies, wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import time
from collections import UserDict
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar, cast

from kvgate_engine.verdict import Requirement, Verdict

from kvgate.api import labels
from kvgate.api.models import API_VERSION, KIND
from kvgate.controller import step_check
from kvgate.controller.pass_slots import PassSlots
from kvgate.kube import metrics
from kvgate.kube.informer import Reflector, Watched, per_namespace
from kvgate.kube.k8s import KubeApi, Urgency
from kvgate.kube.settings import OperatorSettings
from kvgate.objects import router_auth
from kvgate.rollout import pass_priority
from kvgate.rollout.pass_priority import PassClass
from kvgate.verify import pod_view

log = logging.getLogger("kvgate.runtime")


class VerifyFn(Protocol):
    """Read the engine at a URL and judge it (``api_key``: sent as a Bearer token)."""

    def __call__(
        self, url: str, requirement: Requirement, *, api_key: str | None = None
    ) -> Awaitable[Verdict]: ...


MdKey = tuple[str, str]  # (namespace, name)
T = TypeVar("T")
S = TypeVar("S")


def spawn(coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    """Start a long-lived task (a pod's verifier, a ModelDeployment's loop) in an empty context.

    ``asyncio.create_task`` copies the caller's context variables into the task for its whole
    life. Called from a kopf handler, that copy holds kopf's cause of the event (the raw watch
    event with the whole object, managedFields included), its patch and loggers: one full pod
    or ModelDeployment body kept per task, for as long as the pod or ModelDeployment exists.
    The heap profile of the scale benchmark found 90 MiB of such bodies at 250 ModelDeployments.
    kvgate's own context variables (kvgate.kube.probe_slots.URGENT) start at their
    defaults in each task.

    A task that ends with an exception is logged with its traceback at once: nothing awaits
    these tasks, so a ModelDeployment loop or verifier that died would otherwise vanish without
    a word (its ModelDeployment would simply stop being reconciled)."""
    task = asyncio.get_running_loop().create_task(coro, name=name, context=contextvars.Context())
    task.add_done_callback(_log_crash, context=contextvars.Context())  # not the caller's
    return task


def _log_crash(task: asyncio.Task[Any]) -> None:
    if task.cancelled() or task.exception() is None:
        return
    error = task.exception()
    log.error(
        "task %s ended with %s: %s",
        task.get_name(),
        type(error).__name__,
        error,
        exc_info=(type(error), error, error.__traceback__) if error is not None else None,
    )


def stray_cancellation() -> bool:
    """Whether a CancelledError caught in the current task was aimed at something else: no
    ``cancel()`` of this task is pending. A library timer that cancels the task to time out a
    read and loses the race to turn that into a TimeoutError lets it escape; taken for the
    loop's own cancellation, it ended a ModelDeployment's loop without a word."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() == 0


def utc_now() -> datetime:
    return datetime.now(UTC)


class PodStore(UserDict[str, dict[str, Any]]):
    """uid -> latest pod body, also indexed by the ModelDeployment its ``kvgate.io/deployment``
    label names, so a per-ModelDeployment question (its routers, its verified engines, a
    group's leader) costs that ModelDeployment's pods, not the fleet's (scale benchmark: with 1,000
    ModelDeployments, a scan of every pod per audit was 9,000 reads per ModelDeployment)."""

    def __init__(self) -> None:
        self._by_md: dict[MdKey, dict[str, None]] = {}  # insertion-ordered uid sets
        self._key_of: dict[str, MdKey] = {}
        super().__init__()

    @staticmethod
    def _md_key(pod: dict[str, Any]) -> MdKey:
        meta = pod.get("metadata") or {}
        return str(meta.get("namespace", "")), str(
            (meta.get("labels") or {}).get(labels.DEPLOYMENT, "")
        )

    def _unindex(self, uid: str) -> None:
        key = self._key_of.pop(uid, None)
        if key is not None:
            uids = self._by_md.get(key)
            if uids is not None:
                uids.pop(uid, None)
                if not uids:
                    del self._by_md[key]

    def __setitem__(self, uid: str, pod: dict[str, Any]) -> None:
        self._unindex(uid)
        super().__setitem__(uid, pod)
        key = self._md_key(pod)
        self._key_of[uid] = key
        self._by_md.setdefault(key, {})[uid] = None

    def __delitem__(self, uid: str) -> None:
        super().__delitem__(uid)
        self._unindex(uid)

    def of_md(self, namespace: str, md_name: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """(uid, body) of every pod labelled for this ModelDeployment (a snapshot: safe to
        await between items)."""
        for uid in list(self._by_md.get((namespace, md_name), ())):
            pod = self.data.get(uid)
            if pod is not None:
                yield uid, pod


class Wake:
    """A flag a loop sleeps on until something sets it: ``asyncio.Event``'s behaviour without
    its per-object waiter deque (~650 bytes more each; one wake per engine pod and per
    ModelDeployment, 6 MiB at 1,000 ModelDeployments with 9,000 engine pods, scale benchmark)."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> bool:
        if self._set:
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
                if not self._waiters:
                    self._waiters = None
        return True


class Pacer:
    """Spaces calls at most ``rate`` a second across every caller, in the order they asked
    (each takes the next free instant). Used for the worker audit's router reads and the
    periodic engine re-reads."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = 1.0 / rate
        self._clock = clock
        self._next = float("-inf")

    def reserve(self) -> float:
        """Seconds until the caller's turn (0: now); the turn is taken."""
        now = self._clock()
        turn = max(now, self._next)
        self._next = turn + self.interval
        return turn - now

    async def turn(self) -> None:
        wait = self.reserve()
        if wait > 0:
            await asyncio.sleep(wait)


class OwnerChains:
    """ReplicaSet -> (ReplicaSet, Deployment) chains a pod's identity was proven through, kept
    ``ttl`` seconds so its sibling pods need no reads of their own: the pods of one ReplicaSet
    start together, and resolving each pod's chain from the API cost two GETs per pod
    (scale benchmark: 18,000 of them for 1,000 ModelDeployments). Keyed by the ReplicaSet's
    uid, so a recreated ReplicaSet is a miss; each sibling's own labels and owner are still
    checked against it (kvgate.verify.pod_identity.identify). Entries hold only the fields that
    check reads."""

    def __init__(self, ttl: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self._clock = ttl, clock
        self._chains: dict[tuple[str, str, str], tuple[float, Any]] = {}
        self._reading: dict[tuple[str, str, str], asyncio.Future[Any]] = {}

    async def read_once(self, key: tuple[str, str, str], read: Callable[[], Awaitable[T]]) -> T:
        """``read()``, unless a read for ``key`` is already under way: then its result (the
        siblings of a ReplicaSet are first seen together, before any chain is proven)."""
        pending = self._reading.get(key)
        if pending is not None:
            return cast(T, await asyncio.shield(pending))
        future: asyncio.Future[Any] = asyncio.ensure_future(read())
        self._reading[key] = future
        try:
            return cast(T, await asyncio.shield(future))
        finally:
            if future.done():
                self._reading.pop(key, None)
            else:  # this caller was cancelled: the read goes on for the others, then leaves
                future.add_done_callback(lambda _: self._reading.pop(key, None))

    def get(self, key: tuple[str, str, str]) -> Any | None:
        entry = self._chains.get(key)
        if entry is None or self._clock() - entry[0] > self.ttl:
            return None
        return entry[1]

    def put(self, key: tuple[str, str, str], chain: Any) -> None:
        now = self._clock()
        self._chains.pop(key, None)
        self._chains[key] = (now, chain)
        for old in list(self._chains):  # oldest first: drop what has expired
            if now - self._chains[old][0] <= self.ttl:
                break
            del self._chains[old]

    def __len__(self) -> int:
        return len(self._chains)


class MdStore(UserDict[MdKey, dict[str, Any]]):
    """(namespace, name) -> latest ModelDeployment body, as kvgate.verify.pod_view.slim_md keeps it
    (no managedFields; keys and short strings shared across the fleet)."""

    def __setitem__(self, key: MdKey, body: dict[str, Any]) -> None:
        super().__setitem__(key, pod_view.slim_md(body))


@dataclass
class VerifiedEngine:
    """The last verdict on one pod's live engine (in memory; re-read after a restart)."""

    outcome: str
    reason: str
    kv_pool_tokens: int | None


@dataclass
class Runtime:
    api: KubeApi
    settings: OperatorSettings
    verify: VerifyFn
    clock: Callable[[], datetime] = utc_now
    pods: PodStore = field(default_factory=PodStore)  # uid -> latest engine pod (pod_view)
    mds: MdStore = field(default_factory=MdStore)  # latest MD bodies (pod_view.slim_md)
    engines: dict[str, VerifiedEngine] = field(default_factory=dict)  # uid -> last verdict
    verifiers: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # uid -> loop
    # (namespace, name) -> (uid, reconcile loop); see handlers.md_loops
    md_loops: dict[MdKey, tuple[str, asyncio.Task[None]]] = field(default_factory=dict)
    routers: PodStore = field(default_factory=PodStore)  # uid -> router pod (pod_view)
    # uid -> kvgate Deployment (pod_view.slim_workload), indexed by ModelDeployment like pods
    deployments: PodStore = field(default_factory=PodStore)
    # pod uid -> (ownership fingerprint, proven identity); see identity.resolve_identity
    identities: dict[str, tuple[bytes, Any]] = field(default_factory=dict)
    owner_chains: OwnerChains = field(default_factory=OwnerChains)  # see identity.resolve_identity
    # ModelDeployments whose router ServiceAccount, Role, RoleBinding or NetworkPolicies a watch
    # event reported since their last pass read them (kvgate.rollout.access_checks)
    access_changed: set[MdKey] = field(default_factory=set)
    # ModelDeployments whose pass an event asked for (a RoleScale's new count, a rollback
    # annotation, a new spec) since their last pass started: that pass goes first
    # (kvgate.rollout.pass_priority), without the debounce after the pass running then
    pass_requests: set[MdKey] = field(default_factory=set)
    # The Urgency of each ModelDeployment's running pass (kvgate.kube.k8s): raised when
    # somebody asks for a pass while it runs, so the asked-for pass does not wait for a slow one
    pass_urgency: dict[MdKey, Urgency] = field(default_factory=dict)
    # GET a URL's text (the routers' metrics, progressive step check); replaced in tests.
    fetch_text: Callable[[str], Awaitable[str]] = step_check.fetch_text
    # State a single module keeps for this operator run, one instance per type: the module
    # defines it and reaches it through ``owned`` (see forget_md and forget_pod).
    _owned: dict[type[Any], Any] = field(default_factory=dict)
    _pass_slots: PassSlots | None = None  # settings.max_concurrent_reconciles
    _audit_pacer: Pacer | None = None  # settings.worker_audit_reads_per_second
    _reverify_pacer: Pacer | None = None  # settings.reverify_reads_per_second
    _pod_wakes: dict[str, Wake] = field(default_factory=dict)
    _md_wakes: dict[MdKey, Wake] = field(default_factory=dict)
    # The operator's own list-then-watch of engine pods and of its Deployments
    # (kvgate.kube.informer;
    # one per watched namespace, or one for all), and their tasks: see start_reflectors in
    # engine_pods and deployments
    pod_reflectors: list[Reflector] = field(default_factory=list)
    deployment_reflectors: list[Reflector] = field(default_factory=list)
    md_reflectors: list[Reflector] = field(default_factory=list)  # kvgate.controller.md_loops
    reflector_tasks: list[asyncio.Task[None]] = field(default_factory=list)
    # False while this replica stands by for the Lease (kvgate.controller.standby): the stores
    # above are kept, nothing is verified, reconciled or written.
    leading: bool = True

    @property
    def engine_pods_listed(self) -> bool:
        """Whether ``pods`` holds every engine pod: each reflector finished a complete list (a
        ModelDeployment's pass then reads its pods from there instead of listing them)."""
        return bool(self.pod_reflectors) and all(r.synced for r in self.pod_reflectors)

    @property
    def deployments_listed(self) -> bool:
        """Whether ``deployments`` holds every kvgate Deployment (as ``engine_pods_listed``)."""
        return bool(self.deployment_reflectors) and all(
            r.synced for r in self.deployment_reflectors
        )

    def reflect(
        self,
        watched: Watched,
        *,
        store: Mapping[str, dict[str, Any]],
        on_event: Callable[[str | None, dict[str, Any]], None],
        into: list[Reflector],
    ) -> None:
        """List and watch ``watched`` in every watched namespace (or cluster-wide) until
        shutdown, feeding ``on_event``, which keeps ``store``; ``into`` holds the reflectors
        whose ``synced`` says the store is complete."""
        for reflector in per_namespace(
            self.api, watched, namespaces=self.settings.namespaces, store=store, on_event=on_event
        ):
            into.append(reflector)
            reflector.start(self._spawn_reflector)

    def _spawn_reflector(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = spawn(coro, name)
        self.reflector_tasks.append(task)
        task.add_done_callback(self._forget_reflector_task)
        return task

    def _forget_reflector_task(self, task: asyncio.Task[None]) -> None:
        with contextlib.suppress(ValueError):
            self.reflector_tasks.remove(task)

    @property
    def reflectors(self) -> list[Reflector]:
        return [*self.pod_reflectors, *self.deployment_reflectors, *self.md_reflectors]

    async def resume_reflectors(self, *, report_every: float = 10.0) -> None:
        """Re-open every reflector's watch from the last resourceVersion it delivered, and
        return once the API server has accepted each new watch (or the reflector has listed
        again and opened its watch): from then on each store holds every change up to the
        server's present, whatever its watch did while this replica stood by
        (kvgate.kube.informer)."""
        reflectors = self.reflectors
        before = [r.opened for r in reflectors]
        for reflector in reflectors:
            reflector.resume(self._spawn_reflector)

        def waiting() -> list[str]:
            return [
                r.path
                for r, n in zip(reflectors, before, strict=True)
                if r.opened <= n or not r.current()
            ]

        started = last_report = time.monotonic()
        while waiting():
            await asyncio.sleep(0.02)
            if time.monotonic() - last_report >= report_every:
                last_report = time.monotonic()
                log.warning(
                    "waiting %.0fs for the watches of %s to re-open before leading",
                    last_report - started,
                    ", ".join(waiting()),
                )

    def owned(self, kind: type[S]) -> S:
        """The instance of ``kind`` this runtime keeps for the module that defines it (made on
        first use). A ``forget_md(key)`` or ``forget_pod(uid)`` method on it is called when
        the runtime forgets that ModelDeployment or pod."""
        state = self._owned.get(kind)
        if state is None:
            state = self._owned[kind] = kind()
        return cast(S, state)

    def pass_slots(self) -> PassSlots:
        """At most ``max_concurrent_reconciles`` ModelDeployment passes at once; a free slot
        goes to a pass asked for first, then to the namespaces in turn
        (kvgate.rollout.pass_priority)."""
        if self._pass_slots is None:
            slots = self._pass_slots = PassSlots(self.settings.max_concurrent_reconciles)
            metrics.watch_pass_slots(
                lambda: (
                    slots.size,
                    slots.busy,
                    {c.name.lower(): n for c, n in slots.waiting.items()},
                )
            )
        return self._pass_slots

    def pass_class(self, key: MdKey) -> PassClass:
        """The class of ``key``'s next pass: from its body as last seen, and whether an event
        asked for it (``request_pass``)."""
        body = self.mds.get(key) or {}
        return pass_priority.pass_class(body, requested=key in self.pass_requests)

    def request_pass(self, namespace: str | None, name: str | None) -> None:
        """An event asked for a pass of this ModelDeployment (a RoleScale's new count): wake
        its loop; the pass goes first, even if it already waits."""
        if not (namespace and name):
            return
        key = (namespace, name)
        self.ask_pass(key)
        self.pass_slots().reclassify(key, PassClass.REQUESTED)
        self.wake_md(namespace, name)

    def ask_pass(self, key: MdKey) -> None:
        """Somebody asked for a pass of ``key``: the next goes first and without the debounce,
        and a pass running now sends its remaining API requests first."""
        self.pass_requests.add(key)
        running = self.pass_urgency.get(key)
        if running is not None:
            running.urgent = True

    def audit_pacer(self) -> Pacer:
        """The worker audit's router reads, at most ``worker_audit_reads_per_second``."""
        if self._audit_pacer is None:
            self._audit_pacer = Pacer(self.settings.worker_audit_reads_per_second)
        return self._audit_pacer

    def reverify_pacer(self) -> Pacer:
        """The periodic engine re-reads, at most ``reverify_reads_per_second`` across the fleet
        (a read after a change never waits for it: kvgate.controller.engine_pods)."""
        if self._reverify_pacer is None:
            self._reverify_pacer = Pacer(self.settings.reverify_reads_per_second)
        return self._reverify_pacer

    def take_access_changed(self, key: MdKey) -> bool:
        """Whether a watch event reported the MD's router access objects or NetworkPolicies
        since this was last asked (kvgate.rollout.access_checks); clears the mark."""
        changed = key in self.access_changed
        self.access_changed.discard(key)
        return changed

    def pod_wake(self, uid: str) -> Wake:
        wake = self._pod_wakes.get(uid)
        if wake is None:
            wake = self._pod_wakes[uid] = Wake()
        return wake

    def md_wake(self, key: MdKey) -> Wake:
        wake = self._md_wakes.get(key)
        if wake is None:
            wake = self._md_wakes[key] = Wake()
        return wake

    def wake_md(self, namespace: str | None, name: str | None) -> None:
        if namespace and name:
            self.md_wake((namespace, name)).set()

    def md_ref(self, namespace: str, md_name: str) -> dict[str, Any]:
        """The ModelDeployment as an Event's involvedObject, with its uid when known (kubectl
        describe matches Events to an object by uid)."""
        meta: dict[str, Any] = {"name": md_name, "namespace": namespace}
        uid = (self.mds.get((namespace, md_name)) or {}).get("metadata", {}).get("uid")
        if uid:
            meta["uid"] = uid
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta}

    def router_key(self, namespace: str, md_name: str) -> str | None:
        """The control-plane key of this ModelDeployment's routers (None: MD not known yet)."""
        uid = (self.mds.get((namespace, md_name)) or {}).get("metadata", {}).get("uid")
        if not uid:
            return None
        return router_auth.control_key(self.settings.router_key_seed, namespace, md_name, uid)

    def forget_pod(self, uid: str) -> None:
        task = self.verifiers.pop(uid, None)
        if task is not None:
            task.cancel()
        self.pods.pop(uid, None)
        self.engines.pop(uid, None)
        self.identities.pop(uid, None)
        self._pod_wakes.pop(uid, None)
        for state in list(self._owned.values()):
            forget = getattr(state, "forget_pod", None)
            if forget is not None:
                forget(uid)

    def forget_md(self, key: MdKey) -> None:
        metrics.forget_md(*key)  # a deleted ModelDeployment's series (no alert on a ghost)
        self.mds.pop(key, None)
        self.access_changed.discard(key)
        self.pass_requests.discard(key)
        self._md_wakes.pop(key, None)
        for state in list(self._owned.values()):
            forget = getattr(state, "forget_md", None)
            if forget is not None:
                forget(key)

    async def shutdown(self) -> None:
        """Stop every verifier and reconcile loop (operator exit)."""
        tasks = [
            *self.reflector_tasks,
            *self.verifiers.values(),
            *(task for _, task in self.md_loops.values()),
        ]
        self.reflector_tasks.clear()
        self.verifiers.clear()
        self.md_loops.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        close = getattr(
            self.verify, "close", None
        )  # kvgate.controller.main.Prober: its client session
        if close is not None:
            await close()


async def sleep_until_woken(wake: Wake, seconds: float) -> bool:
    """Wait for a wake-up or the timeout; True when woken. Clears the wake-up.

    Every verifier and every ModelDeployment loop sleeps here. ``asyncio.timeout`` waits in the
    caller's own task; ``asyncio.wait_for`` (Python 3.11) wraps the wait in a task of its own,
    ~1.1 KiB more per sleeper: 11 MiB at 1,000 ModelDeployments with 9,000 engine pods, whose
    operator must fit in 300 MB (docs/design/scale.md)."""
    woken = wake.is_set()
    if not woken:
        try:
            async with asyncio.timeout(None if math.isinf(seconds) else max(0.0, seconds)):
                woken = await wake.wait()
        except TimeoutError:
            woken = False
    wake.clear()
    return woken
