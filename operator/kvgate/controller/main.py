"""`kvgate operator`: kopf start-up settings and the wiring of triggers to handlers.

Triggers (kopf watches, in the leader only): kvgate's Services and router access objects (wake
their MD), routers and multi-node workers. ModelDeployments, engine pods and kvgate's Deployments
are listed and watched by the operator itself (kvgate.kube.informer), in a standby too
(kvgate.controller.standby): ModelDeployment events start/stop one reconcile loop each (an asyncio
task: no finalizer, see controller.md_loops), engine pod events start/stop each pod's verifier task
(no finalizer on pods), Deployment events wake their MD, and passes read them from the stores
once they are listed.

Peering: with --standalone kopf does not look for KopfPeering objects; run ONE replica
(Deployment strategy Recreate). Without it, kopf uses peering objects named "kvgate" (the chart
must install kopf's peering CRDs) so a second replica pauses while the first runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import tracemalloc
from collections.abc import Callable, Iterable
from typing import Any, cast

import aiohttp.web
import kopf
from kvgate_engine import probe
from kvgate_engine.verdict import Requirement, Verdict
from prometheus_client import start_http_server

from kvgate.admission.host_paths import HostPathPolicy
from kvgate.admission.policy import ClusterPolicy
from kvgate.api import labels, multinode
from kvgate.api.models import GROUP, SCALE_PLURAL, VERSION
from kvgate.controller import (
    deployments,
    engine_pods,
    group_verify,
    kv_canary_watch,
    loop_lag,
    md_loops,
    router_workers,
    standby,
    task_dump,
)
from kvgate.controller.runtime import Runtime
from kvgate.kube import http_pool, metrics
from kvgate.kube.k8s import Credentials, KubeApi, load_credentials
from kvgate.kube.leader import LeaderElector
from kvgate.kube.probe_slots import ProbeSlots
from kvgate.kube.settings import OperatorSettings

log = logging.getLogger("kvgate.controller.main")
_runtime: Runtime | None = None  # the running operator's runtime (handlers are registered once)
_registered = False


def _rt() -> Runtime:
    if _runtime is None:  # pragma: no cover - handlers only run inside serve()
        raise RuntimeError("kvgate operator runtime is not started")
    return _runtime


class NoDiffBase(kopf.DiffBaseStorage):
    """No per-event diff: kvgate registers only event handlers (no change handlers, no
    daemons or timers), which never read one, yet kopf builds it for every watch event from a
    deep copy of the whole object: 7 % of the operator's CPU while 1,000 ModelDeployments'
    pods started (py-spy, scale benchmark). A test fails if a handler that needs a diff is added."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def register_handlers() -> kopf.OperatorRegistry:
    """Register kvgate's handlers on kopf's default registry (where the webhook's live)."""
    global _registered
    registry = kopf.get_default_registry()
    if _registered:
        return registry
    _registered = True

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        configure_kopf(settings, _rt())

    @kopf.on.login(registry=registry)
    async def login(**_: Any) -> kopf.ConnectionInfo:
        # kopf and kvgate's own client use the same credentials (k8s.load_credentials).
        creds = _rt().api.credentials
        return kopf.ConnectionInfo(
            server=creds.server,
            ca_path=creds.ca_file,
            ca_data=creds.ca_data.encode() if creds.ca_data else None,
            insecure=not creds.verify,
            scheme="Bearer" if creds.bearer() else None,
            token=creds.bearer(),
            certificate_path=creds.cert_file,
            private_key_path=creds.key_file,
        )

    @kopf.on.cleanup(registry=registry)
    async def cleanup(**_: Any) -> None:
        metrics.LEADER.set(0)
        rt = _rt()
        await rt.shutdown()
        await rt.api.close()

    _register_watches(registry)
    return registry


def configure_kopf(settings: kopf.OperatorSettings, rt: Runtime) -> None:
    """kopf's settings for kvgate: storage, Events, watch timeouts and paging, server-side
    label filters, peering and the webhook."""
    settings.persistence.finalizer = labels.FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=labels.PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.reporting_component = labels.MANAGED_BY_VALUE
    settings.posting.level = logging.WARNING  # kvgate posts its own transition Events
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 310
    settings.watching.connect_timeout = 30
    settings.watching.reconnect_backoff = 1.0
    # The initial listing in pages (client-go's reflector uses 500 too): one unpaged list
    # of 9,000 pods was ~90 MB of JSON held at once, and a leader restarted at 1,000
    # ModelDeployments peaked at 750 MB RSS re-listing them (scale benchmark).
    settings.watching.chunk_size = LIST_CHUNK_SIZE
    # Owned kinds whose handlers match only kvgate's label: filter them on the server, so
    # the operator never receives (or keeps kopf state for) a cluster's other Deployments,
    # Services, RBAC objects and NetworkPolicies. kopf's pods are filtered by component
    # only (routers and multi-node workers; engine pods are the operator's own watch): a
    # look-alike pod with kvgate's component label but not its managed-by label must still
    # be seen.
    managed = f"{labels.MANAGED_BY}={labels.MANAGED_BY_VALUE}"
    for group, version, plural in SERVER_FILTERED_RESOURCES:
        settings.watching.label_selectors[group, version, plural] = managed
    settings.watching.label_selectors["", "v1", "pods"] = KOPF_POD_SELECTOR
    settings.peering.name = "kvgate"
    settings.peering.standalone = rt.settings.standalone
    settings.peering.clusterwide = not rt.settings.namespaces
    if rt.settings.webhook:
        _configure_webhook(settings, rt.settings)
    # kvgate_leader (alert KvgateOperatorDown: absent, or no replica at 1): kopf runs only in
    # the replica that holds the Lease (or the only one, without --leader-elect).
    metrics.LEADER.set(1)


def _register_watches(registry: kopf.OperatorRegistry) -> None:
    """The watch events kopf delivers: ModelDeployments, router and multi-node worker pods,
    kvgate's Services and the router access objects (engine pods and Deployments are the
    operator's own watches, started in serve)."""

    # ModelDeployments and engine pods are not kopf's: the operator lists and watches them itself
    # (kvgate.kube.informer, started in serve), so a standby keeps them current and a pass knows
    # when every engine pod is in its store. One reconcile loop per ModelDeployment
    # (controller.md_loops), started and stopped by its events: no kopf daemon, so no finalizer
    # and no operator round trip on deletion.

    @kopf.on.event(
        "", "v1", "pods", labels={labels.COMPONENT: multinode.COMPONENT_WORKER}, registry=registry
    )
    async def engine_worker_event(event: kopf.RawEvent, **_: Any) -> None:
        # A multi-node engine's worker: wake its leader's verifier (kvgate.verify.group_gate),
        # and follow its ranks' log for SGLang's KV canary (safety.kvCanary).
        worker = dict(event["object"])
        group_verify.on_worker_event(_rt(), event.get("type"), worker)
        kv_canary_watch.on_worker_event(_rt(), event.get("type"), worker)

    @kopf.on.event(
        "", "v1", "pods", labels={labels.COMPONENT: labels.COMPONENT_ROUTER}, registry=registry
    )
    async def router_pod_event(event: kopf.RawEvent, **_: Any) -> None:
        router_workers.on_router_pod_event(_rt(), event.get("type"), dict(event["object"]))

    # kvgate's Deployments are not kopf's either: the operator lists and watches them itself
    # (deployments.start_reflectors, in serve), so a pass reads them from memory.

    @kopf.on.event(
        "", "v1", "services", labels={labels.MANAGED_BY: labels.MANAGED_BY_VALUE}, registry=registry
    )
    async def managed_service_event(event: kopf.RawEvent, **_: Any) -> None:
        # A deleted or re-pointed Service <md> is put back on the next pass, not the next timer
        # (up to KVGATE_STEADY_RECONCILE_SECONDS of no traffic). Same wake as a Deployment's: its
        # kvgate.io/deployment label names the ModelDeployment.
        deployments.wake_owner(_rt(), dict(event["object"]))

    @kopf.on.event(GROUP, VERSION, SCALE_PLURAL, registry=registry)
    async def role_scale_event(event: kopf.RawEvent, **_: Any) -> None:
        # An autoscaler's (or kubectl scale's) new count is acted on at the next pass, now,
        # ahead of the passes nobody asked for. Every RoleScale, labelled or not: its name says
        # whose it is (the pass reads it by that name).
        deployments.on_role_scale_event(_rt(), dict(event["object"]), event.get("type"))

    # The router's ServiceAccount, Role and RoleBinding (kvgate.objects.builders): deleted or
    # edited, they are put back on the next pass, not at the steady resync (KVGATE_STEADY_RECONCILE_
    # SECONDS); a settled ModelDeployment costs no reads for them. Same wake as a Deployment's.
    for group, version, plural in ROUTER_ACCESS_RESOURCES:

        async def router_access_event(event: kopf.RawEvent, **_: Any) -> None:
            deployments.on_router_access_event(_rt(), event.get("type"), dict(event["object"]))

        kopf.on.event(
            group,
            version,
            plural,
            id=f"router_access_event/{plural}",
            labels={labels.MANAGED_BY: labels.MANAGED_BY_VALUE},
            registry=registry,
        )(router_access_event)


LIST_CHUNK_SIZE = 500  # objects per page of kopf's initial listing (see configure)
# The pods kopf watches (its handlers' components), filtered on the server.
KOPF_POD_SELECTOR = (
    f"{labels.COMPONENT} in ({labels.COMPONENT_ROUTER},{multinode.COMPONENT_WORKER})"
)

# What the router of each ModelDeployment runs as, and each revision's NetworkPolicies (watched:
# see register_handlers), so a settled ModelDeployment needs no timer to notice them drift.
ROUTER_ACCESS_RESOURCES = (
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("networking.k8s.io", "v1", "networkpolicies"),
)
SERVER_FILTERED_RESOURCES = (
    ("", "v1", "services"),
    *ROUTER_ACCESS_RESOURCES,
)


def _configure_webhook(kopf_settings: kopf.OperatorSettings, settings: OperatorSettings) -> None:
    # The same lean server as `kvgate webhook`; kopf only starts and stops it.
    from kvgate.webhook.operator_webhook import OperatorWebhookServer

    assert settings.tls_dir is not None  # checked in run()
    kopf_settings.admission.server = OperatorWebhookServer(
        tls_dir=settings.tls_dir,
        port=settings.webhook_port,
        addr=settings.bind_address,
        policy=ClusterPolicy(
            min_engine_version_floor=settings.min_engine_version_floor,
            gpus_per_node=settings.gpus_per_node,
            gpu_reserved_gib_by_product=settings.gpu_reserved_gib_by_product,
            host_paths=settings.host_paths or HostPathPolicy(),
        ),
    )
    kopf_settings.admission.managed = None


class Prober:
    """The operator's probe: at most ``max_concurrent_probes`` engines are read at once, across
    every pod, so the bodies in flight stay bounded however many pods (or tenants) there are;
    a changed engine's read goes before the periodic ones (kvgate.kube.probe_slots).

    Every read opens its own connection and closes it after the answer (``force_close``): a
    connection kept alive across an engine restart (same pod address) can outlive the engine
    process in a child that inherited it and hang the next read; the fresh-clone run with
    kept-alive probes failed both engine-restart scenarios. What the reads share is one client
    session (no cookie jar, so nothing an engine sets reaches another): a session of its own per
    read cost a third of the probe's CPU (1.38 -> 0.93 ms a read, 8,000 engines re-read every
    30 s are ~270 a second; scale benchmark)."""

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self.slots = ProbeSlots(settings.max_concurrent_probes)
        metrics.watch_backlog(lambda: self.slots.waiting)
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True, limit=0),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def __call__(
        self, url: str, requirement: Requirement, *, api_key: str | None = None
    ) -> Verdict:
        async with self.slots.slot():
            return await probe.verify(
                url,
                requirement,
                timeout=self.settings.probe_timeout_seconds,
                api_key=api_key,
                session=self.session(),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def make_verify(settings: OperatorSettings) -> Prober:
    return Prober(settings)


class LeadershipLost(RuntimeError):
    """This replica could not renew its Lease in time and stopped reconciling."""


async def _memory_report(request: aiohttp.web.Request) -> aiohttp.web.Response:
    """``GET /debug/memory?top=N``: the traced Python heap and its N largest allocation sites
    (only with KVGATE_DEBUG_MEMORY=1, which starts tracemalloc at startup; tracing costs memory
    and CPU, so never by default)."""
    top = int(request.query.get("top", "40"))
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    stats = tracemalloc.take_snapshot().statistics("lineno")
    lines = [f"traced {current / 2**20:.1f} MiB (peak {peak / 2**20:.1f} MiB)"]
    lines += [f"{st.size / 2**20:9.2f} MiB {st.count:9d} {st.traceback}" for st in stats[:top]]
    return aiohttp.web.Response(text="\n".join(lines) + "\n")


async def _health_server(settings: OperatorSettings) -> aiohttp.web.AppRunner:
    """``GET /healthz`` on the health port for the process's whole life (leading or standing
    by): 200 while the event loop runs. Standbys must pass their livenessProbe too."""

    async def healthz(_: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.json_response({"ok": True})

    app = aiohttp.web.Application()
    app.router.add_get("/healthz", healthz)
    if tracemalloc.is_tracing():  # KVGATE_DEBUG_MEMORY=1 (kvgate.controller.main.run)
        app.router.add_get("/debug/memory", _memory_report)
    runner = aiohttp.web.AppRunner(app, access_log=None)
    await runner.setup()
    await aiohttp.web.TCPSite(runner, settings.bind_address, settings.health_port).start()
    return runner


async def serve(
    settings: OperatorSettings,
    *,
    credentials: Credentials | None = None,
    stop_flag: asyncio.Event | threading.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run the operator until stop_flag is set or a signal arrives. With leader election, run
    kopf only while this replica holds the Lease; raise ``LeadershipLost`` if it is lost."""
    global _runtime
    task_dump.install(asyncio.get_running_loop())
    # Raises ValueError naming the chart value when the floor is not a version.
    ClusterPolicy(min_engine_version_floor=settings.min_engine_version_floor)
    api = KubeApi(credentials or load_credentials())
    _runtime = Runtime(
        api=api,
        settings=settings,
        verify=make_verify(settings),
        leading=settings.leader_election is None,
    )
    registry = register_handlers()
    health = await _health_server(settings)
    lag = asyncio.create_task(loop_lag.measure(), name="event-loop-lag")
    # The Lease gets its own connection pool: renewals never queue behind the reconcile loops'
    # and verifiers' requests. Sharing one pool, 50 ModelDeployments with 400 engine pods kept its
    # 32 connections busy, the leader missed its renew deadline, stepped down and restarted, over
    # and over (scale benchmark).
    lease_api = KubeApi(api.credentials) if settings.leader_election is not None else None
    elector = (
        LeaderElector(lease_api, settings.leader_election, on_change=_leading_changed)
        if lease_api is not None and settings.leader_election is not None
        else None
    )
    stop = _StopRelay(stop_flag)
    try:
        # A standby keeps these stores current (nothing else: no verifier, loop or write), so
        # that it leads from them when it takes the Lease (kvgate.controller.standby).
        md_loops.start_reflectors(_runtime)
        engine_pods.start_reflectors(_runtime)
        deployments.start_reflectors(_runtime)
        led = await _lead(_runtime, elector, stop.event)
        if led is None:
            return
        holder = led if isinstance(led, asyncio.Future) else None
        kopf_stop = asyncio.Event()
        kopf_task = asyncio.create_task(
            kopf.operator(
                registry=registry,
                standalone=settings.standalone or elector is not None,
                namespaces=settings.namespaces,
                clusterwide=not settings.namespaces,
                stop_flag=kopf_stop,
                ready_flag=ready_flag,
            )
        )
        waits: set[asyncio.Future[Any]] = {kopf_task, asyncio.ensure_future(stop.event.wait())}
        if holder is not None:
            waits.add(holder)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        lost = elector is not None and not elector.leading and not stop.event.is_set()
        kopf_stop.set()
        try:
            # A replica that lost its Lease must stop before another may take over (lease
            # duration - renew deadline); a clean stop gets kopf's own shutdown time.
            budget = _stop_budget(settings)
            await asyncio.wait_for(asyncio.shield(kopf_task), timeout=budget if lost else None)
        except TimeoutError:
            log.error("kopf did not stop within %.1fs after losing the Lease: exiting", budget)
            os._exit(1)
        finally:
            for task in waits:
                task.cancel()
        if lost:
            raise LeadershipLost("lost the leader Lease; restarting to stand by again")
    finally:
        stop.close()
        if elector is not None:
            await elector.release()
        lag.cancel()
        await health.cleanup()
        await _runtime.shutdown()
        await api.close()
        if lease_api is not None:
            await lease_api.close()


async def _lead(
    rt: Runtime, elector: LeaderElector | None, stop: asyncio.Event
) -> asyncio.Future[Any] | bool | None:
    """With leader election: stand by (warm) until this replica holds the Lease, start its
    renewals and take over from the standby's stores; the renewals' future, or None when
    ``stop`` came first. Without: True at once (this replica leads)."""
    if elector is None:
        return True
    log.info(
        "standing by for the Lease",
        extra={
            "lease": f"{elector.config.namespace}/{elector.config.name}",
            "identity": elector.config.identity,
        },
    )
    await standby.warm_up(rt, stop)
    if not await elector.acquire(stop):
        return None
    # Renew from the moment the Lease is ours: taking over may wait for a re-list.
    holder = asyncio.ensure_future(
        _hold_in_thread(elector, lambda: KubeApi(rt.api.credentials), stop)
    )
    if not await standby.take_over(rt, stop, holder):
        holder.cancel()
        await asyncio.gather(holder, return_exceptions=True)
        if not elector.leading and not stop.is_set():
            raise LeadershipLost("lost the leader Lease before leading; standing by again")
        return None
    return holder


async def _hold_in_thread(
    elector: LeaderElector, make_client: Callable[[], Any], stop: asyncio.Event
) -> None:
    """``elector.hold`` on a thread of its own, with its own event loop and API client; returns
    when it stops holding (``elector.leading`` says whether it still leads).

    The renewals must not wait for the operator's event loop: with 1,000 ModelDeployments that
    loop has thousands of ready callbacks (watch events, verifiers, audits), a renewal queued
    behind them missed the renew deadline, the leader stepped down and restarted, and the new
    leader re-listed everything, loading the loop more (scale benchmark). A loop that
    is wedged rather than busy still fails its liveness probe (/healthz runs on it).
    ``make_client()`` builds the thread's API client (bound to the thread's loop)."""
    main_loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = main_loop.create_future()
    ready = threading.Event()
    thread_side: dict[str, Any] = {}

    def finish(error: BaseException | None) -> None:
        if not done.done():
            if error is None:
                done.set_result(None)
            else:
                done.set_exception(error)

    async def thread_main() -> None:
        thread_stop = asyncio.Event()
        thread_side.update(loop=asyncio.get_running_loop(), stop=thread_stop)
        ready.set()
        own = make_client()
        shared, elector.api = elector.api, own
        try:
            await elector.hold(thread_stop)
        finally:
            elector.api = shared  # release() runs on the main loop, with its own client
            await own.close()

    def run() -> None:
        error: BaseException | None = None
        try:
            asyncio.run(thread_main())
        except BaseException as exc:  # reported to the main loop, never lost
            error = exc
        finally:
            ready.set()
            main_loop.call_soon_threadsafe(finish, error)

    thread = threading.Thread(target=run, name="kvgate-lease", daemon=True)
    thread.start()
    await asyncio.to_thread(ready.wait)

    def stop_thread() -> None:
        loop, thread_stop = thread_side.get("loop"), thread_side.get("stop")
        if loop is not None and thread_stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # its loop already finished
                loop.call_soon_threadsafe(thread_stop.set)

    stopper = asyncio.ensure_future(stop.wait())
    try:
        both: set[asyncio.Future[Any]] = {done, stopper}
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
        stop_thread()  # the caller stops leading (or was cancelled): end the renewals too
        await asyncio.shield(done)


def _stop_budget(settings: OperatorSettings) -> float:
    config = settings.leader_election
    if config is None:
        return 30.0
    return max(0.5, config.lease_duration_seconds - config.renew_deadline_seconds - 0.5)


def _leading_changed(leading: bool) -> None:
    metrics.LEADER.set(1 if leading else 0)


class _StopRelay:
    """One asyncio.Event set by SIGTERM/SIGINT (while kopf is not running: kopf installs its
    own) or by the caller's stop flag (threading or asyncio)."""

    def __init__(self, flag: asyncio.Event | threading.Event | None) -> None:
        self.event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._signals: list[int] = []
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    self._loop.add_signal_handler(sig, self.event.set)
                    self._signals.append(sig)
        self._task: asyncio.Task[None] | None = None
        if isinstance(flag, asyncio.Event):
            self._task = asyncio.create_task(self._relay_async(flag))
        elif flag is not None:
            self._task = asyncio.create_task(self._relay_thread(flag))

    async def _relay_async(self, flag: asyncio.Event) -> None:
        await flag.wait()
        self.event.set()

    async def _relay_thread(self, flag: threading.Event) -> None:
        while not flag.is_set():  # polled: a thread blocked in wait() would outlive the loop
            await asyncio.sleep(0.1)
        self.event.set()

    def close(self) -> None:
        for sig in self._signals:
            with contextlib.suppress(Exception):
                self._loop.remove_signal_handler(sig)
        if self._task is not None:
            self._task.cancel()


def configure_logging(settings: OperatorSettings) -> None:
    kopf.configure(
        verbose=settings.log_level == "DEBUG",
        log_format=kopf.LogFormat.JSON if settings.log_format == "json" else kopf.LogFormat.FULL,
        log_refkey="k8s",
    )
    logging.getLogger("kvgate").setLevel(settings.log_level)
    if settings.log_level != "DEBUG":
        # One line per probe (/healthz every few seconds) and one "Handler ... succeeded" per
        # watch event drown kvgate's own transition logs; warnings and errors still show.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)


def run(args: argparse.Namespace) -> int:
    """`kvgate operator`."""
    if os.environ.get("KVGATE_DEBUG_MEMORY") == "1":
        tracemalloc.start(1)  # served at the health port's /debug/memory
    http_pool.raise_open_files_limit()
    settings = OperatorSettings.from_args(args)
    if settings.webhook and not settings.tls_dir:
        print(
            "kvgate operator: the admission webhook needs --tls-dir DIR (with tls.crt and "
            "tls.key); pass --no-webhook to run without it",
            file=sys.stderr,
        )
        return 2
    try:
        ClusterPolicy(min_engine_version_floor=settings.min_engine_version_floor)
    except ValueError as error:
        print(
            "kvgate operator: KVGATE_MIN_ENGINE_VERSION_FLOOR (the chart value "
            f"engineVersionFloor): {error}",
            file=sys.stderr,
        )
        return 2
    configure_logging(settings)
    start_http_server(settings.metrics_port, addr=settings.bind_address, registry=metrics.REGISTRY)
    log.info(
        "kvgate operator starting",
        extra={
            "namespaces": list(settings.namespaces) or "all",
            "standalone": settings.standalone,
            "metrics_port": settings.metrics_port,
            "health_port": settings.health_port,
            "webhook": settings.webhook,
            # None: KVGATE_GUARD_IMAGE unset, engine pods carry no guard sidecar (kvgate.cmd.guard)
            "guard_image": settings.guard_image,
            # None: KVGATE_GUARD_RESOURCES unset, the built-in requests and limits
            "guard_resources": settings.guard_resources,
        },
    )
    try:
        asyncio.run(serve(settings))
    except LeadershipLost as lost:
        log.error("%s", lost)
        return 1
    return 0


__all__ = ["register_handlers", "run", "serve"]
