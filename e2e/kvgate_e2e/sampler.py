"""The invariant sampler: during a scenario, every 200 ms, is any traffic path pointing at an
engine whose live engine does not meet its requirement?

Invariant 1 of the mission says a prefill or decode pod is Ready (and so in Service endpoints and
in the router's worker set) only while its live engine proves it holds the advertised context.
The sampler checks exactly that, from outside, the way a user could:

1. list the engine pods (their IPs and uids) in the scenario's namespace;
2. read every engine's ``/server_info`` and ``/v1/models`` (``kvgate_engine.probe``) and judge
   the report (``kvgate_engine.verdict.judge``) against the pod's requirement (by default
   derived from the namespace's ModelDeployments as the operator derives it,
   ``requirements_from``, never from the pod's annotations; a scenario may pass its own);
3. then read the pods again, every EndpointSlice of the namespace, and smg's ``GET /workers`` on
   every running router pod.

The pods, EndpointSlices and ModelDeployments come from watches (``_Mirror``: list once, then
follow the watch), not from five lists of the API server every 200 ms: those cost about 7 CPU-s
per 40 s of sampling (API server, etcd and the test process; measured on one ModelDeployment),
summed over a whole `make test` a large part of what the two cores have. A watch trails the API
server by its delivery delay, so a violation seen in the watched state is **confirmed by lists**
before it counts: the same tick reads pods, EndpointSlices, routers and ModelDeployments again by
list (as every tick did before) and judges the same engine reports against them; only what the
lists also show is a violation (the candidates the lists refute are counted, ``unconfirmed``). A
tick whose watches are not running (the API server down, a watch being re-listed) fails like a
list that failed.

A *traffic path* is a pod whose Ready condition is True, an EndpointSlice endpoint that
kube-proxy would route to (``ready``, or ``serving`` and ``terminating``), or a gateway worker
that is not ``draining``. A violation is a traffic path to a pod whose engine, read in step 2,
was UNSAFE. Reading the engines *before* the routing state means a violation is never an
artefact of ordering: the engine was already unsafe when the path was still open.

An engine that could not be read (CANNOT_TELL: down, restarting, garbage) is counted but is not a
violation: a dead engine serves nothing. A pod without a requirement cannot be judged and is
counted as such.

``decide`` is pure (plain JSON in, violations out); ``InvariantSampler`` is the thin I/O around
it. It runs its own event loop in a thread that joined the cluster's network namespace, so it
reaches pod IPs and the apiserver directly (no relays, no kubectl).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import unquote

import aiohttp
from kvgate.api.models import ModelDeploymentSpec
from kvgate.api.requirements import requirement_for
from kvgate.api.revision import revision_of
from kvgate_engine.probe import fetch_report
from kvgate_engine.report import EngineReport
from kvgate_engine.verdict import Outcome, Requirement, Verdict, judge

from kvgate_e2e.cluster_like import ClusterLike
from kvgate_e2e.kubelet.api import ApiError, KubeApi, KubeConfig
from kvgate_e2e.netns import enter_netns_thread
from kvgate_e2e.polling import poll_until

Obj = Mapping[str, Any]
RequirementOf = Callable[[Obj], Requirement | None]

ENGINE_SELECTOR = "kvgate.io/component=engine"
ROUTER_SELECTOR = "kvgate.io/component=router"
# One GET of the API server in a sample (pods, EndpointSlices, ModelDeployments, a Secret): it
# answers in milliseconds; the timeout only ends a request that hangs.
API_REQUEST_TIMEOUT = 5
# One engine's report per sample (a sample every 0.2 s): a report not read within it leaves that
# engine unchecked in that sample (counted unreadable, never a violation), so a slow machine checks
# fewer samples; it never fails a test.
ENGINE_REPORT_TIMEOUT = 1.0
# The watches' first lists before the first sample: a list answers in milliseconds; past this the
# ticks run and fail (counted) until the lists are in. Below start()'s 30 s first-sample wait.
MIRROR_LIST_DEADLINE = 20.0
# A broken watch is listed or resumed again after this pause (a retry period, not a bound).
MIRROR_RETRY_SECONDS = 0.2

POD_READY = "pod Ready"
ENDPOINT = "EndpointSlice endpoint"
WORKER = "gateway worker"


# --------------------------------------------------------------------------------- pure part
@dataclass(frozen=True)
class Violation:
    """One traffic path to an engine that did not meet its requirement, at one sample."""

    at: float  # monotonic seconds
    path: str  # POD_READY | ENDPOINT | WORKER
    via: str  # the Service's EndpointSlice or the router pod; the pod itself for POD_READY
    pod: str  # namespace/name
    reason: str  # the verdict's reason, e.g. KvPoolTooSmall
    message: str  # the verdict's message with numbers
    evidence: str = field(default="", compare=False)  # the pod's state, for diagnosis

    def describe(self) -> str:
        return f"{self.path} {self.via} -> {self.pod}: {self.reason}: {self.message}"


@dataclass(frozen=True)
class Decision:
    """What one sample found."""

    violations: tuple[Violation, ...]
    paths: int  # traffic paths checked
    unreadable: tuple[str, ...]  # pods with a path whose engine could not be read (CANNOT_TELL)
    unjudged: tuple[str, ...]  # pods with a path but no requirement


def _key(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"


def _uid(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("uid", ""))


def pod_is_ready(pod: Obj) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


# The EndpointSlice controller labels the slices of a headless Service (clusterIP None) so;
# kube-proxy ignores them (it watches slices with !service.kubernetes.io/headless): no ClusterIP
# routes there. Such a Service only names pods in DNS, e.g. LeaderWorkerSet's per-group Service,
# which publishes not-ready addresses so that a group's ranks find their leader before it serves.
HEADLESS_LABEL = "service.kubernetes.io/headless"


def routable_addresses(slices: Iterable[Obj]) -> list[tuple[str, str]]:
    """(service, address) of every endpoint kube-proxy would send traffic to: ``ready``, or
    ``serving`` and ``terminating`` (the fallback when a Service has no ready endpoint); slices
    of headless Services are no traffic path (kube-proxy ignores them)."""
    out: list[tuple[str, str]] = []
    for s in slices:
        labels = (s.get("metadata") or {}).get("labels") or {}
        if HEADLESS_LABEL in labels:
            continue
        service = str(
            labels.get("kubernetes.io/service-name", (s.get("metadata") or {}).get("name"))
        )
        for ep in s.get("endpoints") or []:
            cond = ep.get("conditions") or {}
            # A nil `ready` means ready (discovery.k8s.io/v1 API convention).
            ready = cond.get("ready") is not False
            fallback = bool(cond.get("serving")) and bool(cond.get("terminating"))
            if ready or fallback:
                out.extend((service, str(addr)) for addr in ep.get("addresses") or [])
    return out


# WHATWG "forbidden domain code points" (besides controls): a URL whose host holds one fails.
FORBIDDEN_HOST_CHARACTERS = frozenset(" #%/:<>?@[\\]^|")


def smg_host(url: str) -> str | None:
    """The host smg connects to for a worker URL: read as the WHATWG URL standard reads an
    ``http`` URL (smg is Rust, and its URL type follows that standard), not as Python's
    ``urlsplit`` does (RFC 3986). The differences that matter for a hostile URL: tabs and
    newlines are dropped, ``\\`` is ``/`` (so it ends the authority), user info is everything
    up to the authority's last ``@``, and an IPv4 host may be written in octal, hex or fewer
    than four parts. A bare ``ip:port`` is read as ``http://ip:port``. None when there is no
    host."""
    text = url.strip("".join(chr(c) for c in range(0x21))).translate(
        {ord(c): None for c in "\t\n\r"}
    )
    scheme, sep, rest = text.partition(":")
    if not sep or not scheme[:1].isalpha() or scheme.lower() not in ("http", "https"):
        rest = "//" + text
    rest = rest.lstrip("/\\")
    end = min((i for i, c in enumerate(rest) if c in "/\\?#"), default=len(rest))
    authority = rest[:end].rpartition("@")[2]
    if authority.startswith("["):
        host, closed, _ = authority[1:].partition("]")
        try:
            return str(ipaddress.ip_address(host)) if closed else None
        except ValueError:
            return None
    host = unquote(authority.partition(":")[0]).lower()
    if not host or any(c in FORBIDDEN_HOST_CHARACTERS or ord(c) < 0x21 for c in host):
        return None
    if host.rstrip(".").rsplit(".", 1)[-1][:1].isdigit():  # ends in a number: an IPv4 host
        try:
            return socket.inet_ntoa(socket.inet_aton(host.rstrip(".")))
        except OSError:
            return None
    return host


def live_host(worker: Obj) -> str | None:
    """The host smg sends a worker's traffic to (:func:`smg_host`) when the worker is not
    draining, else None. Hosts are compared whole: ``10.0.0.2`` is not ``10.0.0.21``."""
    if str(worker.get("status", "")).lower() == "draining":
        return None
    return smg_host(str(worker.get("url", "")))


def routes_to_ip(workers: Iterable[Obj], ip: str) -> bool:
    """Does any of these workers (one router's ``GET /workers`` list) still route to ``ip``?"""
    return any(live_host(worker) == ip for worker in workers)


def live_workers(workers: Mapping[str, Obj]) -> list[tuple[str, str]]:
    """(router, worker host) for every worker of every router that is not draining."""
    out: list[tuple[str, str]] = []
    for router, body in workers.items():
        for worker in body.get("workers") or []:
            host = live_host(worker)
            if host:
                out.append((router, host))
    return out


def requirements_from(mds: Sequence[Obj]) -> RequirementOf:
    """What each engine pod must prove, from its ModelDeployment (as the operator derives it;
    never from the pod's own annotations, which a tenant may edit). A pod whose revision is
    neither the spec's nor recorded in ``status.revisions`` is held to the current spec."""
    by_name = {str((m.get("metadata") or {}).get("name")): m for m in mds}

    def of(pod: Obj) -> Requirement | None:
        pod_labels = (pod.get("metadata") or {}).get("labels") or {}
        md = by_name.get(str(pod_labels.get("kvgate.io/deployment")))
        if md is None:
            return None
        try:
            spec = ModelDeploymentSpec.model_validate(md.get("spec") or {})
        except ValueError:
            return None
        target = revision_of(spec)
        role = str(pod_labels.get("kvgate.io/role", ""))
        revision = str(pod_labels.get("kvgate.io/revision", ""))
        found = requirement_for(
            spec=spec,
            target_revision=target,
            status=md.get("status"),
            revision=revision,
            role=role,
            cluster_floor=None,
        )
        return found or requirement_for(
            spec=spec,
            target_revision=target,
            status=None,
            revision=target,
            role=role,
            cluster_floor=None,
        )

    return of


def decide(
    *,
    at: float,
    probed_pods: Sequence[Obj],
    reports: Mapping[str, EngineReport | Verdict],
    pods: Sequence[Obj],
    slices: Sequence[Obj],
    workers: Mapping[str, Obj],
    requirement_of: RequirementOf,
) -> Decision:
    """Violations in one sample (pure).

    ``probed_pods`` are the pods as listed before their engines were read; ``reports`` maps a pod
    uid to what its engine reported (or the CANNOT_TELL verdict). ``pods``, ``slices`` and
    ``workers`` (router name -> its ``GET /workers`` body) were read after. A path is judged only
    when the pod holding its address now is the very pod (same uid) whose engine was read.
    """
    probed = {_uid(p): p for p in probed_pods}
    by_ip: dict[str, Obj] = {}
    # A terminating pod may still hold an IP a new pod got; the live one wins.
    for pod in sorted(pods, key=lambda p: not (p.get("metadata") or {}).get("deletionTimestamp")):
        ip = (pod.get("status") or {}).get("podIP")
        if ip:
            by_ip[str(ip)] = pod

    paths: list[tuple[str, str, Obj]] = [
        (POD_READY, _key(p), p) for p in pods if pod_is_ready(p) and _uid(p) in reports
    ]
    for service, address in routable_addresses(slices):
        if address in by_ip:
            paths.append((ENDPOINT, service, by_ip[address]))
    for router, host in live_workers(workers):
        if host in by_ip:
            paths.append((WORKER, router, by_ip[host]))

    violations: list[Violation] = []
    unreadable: set[str] = set()
    unjudged: set[str] = set()
    checked = 0
    for path, via, pod in paths:
        uid = _uid(pod)
        report = reports.get(uid)
        if report is None or uid not in probed:
            continue  # not an engine we read in this sample (e.g. a router, a new pod)
        checked += 1
        if isinstance(report, Verdict):
            unreadable.add(_key(pod))
            continue
        requirement = requirement_of(probed[uid]) or requirement_of(pod)
        if requirement is None:
            unjudged.add(_key(pod))
            continue
        verdict = judge(report, requirement)
        if verdict.outcome is Outcome.UNSAFE:
            violations.append(
                Violation(at, path, via, _key(pod), verdict.reason, verdict.message, evidence(pod))
            )
        elif verdict.outcome is Outcome.CANNOT_TELL:
            unreadable.add(_key(pod))
    return Decision(tuple(violations), checked, tuple(sorted(unreadable)), tuple(sorted(unjudged)))


def evidence(pod: Obj) -> str:
    """The pod's Ready and gate conditions and container readiness, in one line (pure)."""
    status = pod.get("status") or {}
    parts = [f"rv {(pod.get('metadata') or {}).get('resourceVersion')}"]
    for cond in status.get("conditions") or []:
        if cond.get("type") in ("Ready", "ContainersReady", "kvgate.io/engine-verified"):
            parts.append(
                f"{cond.get('type')}={cond.get('status')}/{cond.get('reason', '')}"
                f"@{cond.get('lastTransitionTime')}"
            )
    for c in status.get("containerStatuses") or []:
        running = (c.get("state") or {}).get("running") or {}
        parts.append(
            f"container {c.get('name')} ready={c.get('ready')} restarts={c.get('restartCount')}"
            f" startedAt={running.get('startedAt')}"
        )
    return "; ".join(parts)


@dataclass(frozen=True)
class Window:
    """Consecutive samples in which the same path to the same pod was a violation."""

    path: str
    via: str
    pod: str
    reason: str
    message: str
    first: float
    last: float
    samples: int
    evidence: str = ""

    @property
    def seconds(self) -> float:
        return self.last - self.first


def windows(violations: Sequence[Violation], sample_times: Sequence[float]) -> list[Window]:
    """Group violations into windows: a window ends at the first sample that lacks it (pure)."""
    index = {t: i for i, t in enumerate(sample_times)}
    open_: dict[tuple[str, str, str], tuple[Violation, Violation, int, int]] = {}
    out: list[Window] = []

    def close(first: Violation, last: Violation, count: int) -> None:
        out.append(
            Window(
                first.path, first.via, first.pod, first.reason, first.message,
                first.at, last.at, count, first.evidence,
            )
        )  # fmt: skip

    for v in sorted(violations, key=lambda v: v.at):
        key = (v.path, v.via, v.pod)
        i = index.get(v.at, -1)
        if key in open_:
            first, last, count, last_i = open_[key]
            if i == last_i + 1:
                open_[key] = (first, v, count + 1, i)
                continue
            close(first, last, count)
        open_[key] = (v, v, 1, i)
    for first, last, count, _ in open_.values():
        close(first, last, count)
    return sorted(out, key=lambda w: (w.first, w.path, w.via))


# --------------------------------------------------------------------------------- I/O part
@dataclass
class SamplerStats:
    samples: int = 0
    failed: int = 0  # ticks whose reads failed (apiserver error, timeout)
    outage_failed: int = 0  # ... during a declared API server outage (``api_outage``)
    paths: int = 0
    unreadable: int = 0
    unjudged: int = 0
    router_errors: int = 0
    confirmed: int = 0  # ticks whose watched state showed a violation, read again by list
    unconfirmed: int = 0  # ... and the lists showed none of it (the watch trailed the server)
    tick_seconds: list[float] = field(default_factory=list)
    last_error: str = ""


class InvariantSampler:
    """``with InvariantSampler(cluster, namespace) as sampler: ...`` samples every ``interval``
    seconds until the block ends, then raises ``AssertionError`` listing every violation window
    (unless ``expect_violations``). It also fails when it could not sample: no sample taken, or
    more than a tenth of its ticks failed to read the cluster.
    """

    def __init__(
        self,
        cluster: ClusterLike,
        namespace: str,
        *,
        engine_selector: str = ENGINE_SELECTOR,
        router_selector: str = ROUTER_SELECTOR,
        router_port: int = 8000,
        engine_port: int | None = None,
        requirement_of: RequirementOf | None = None,
        interval: float = 0.2,
        expect_violations: bool = False,
        name: str = "",
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.engine_selector = engine_selector
        self.router_selector = router_selector
        self.router_port = router_port
        self.engine_port = engine_port
        self.requirement_of = requirement_of  # None: derived from the namespace's MDs
        self.interval = interval
        self.expect_violations = expect_violations
        self.name = name or namespace
        self.stats = SamplerStats()
        self.violations: list[Violation] = []
        self.sample_times: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._crash: BaseException | None = None
        self._first_sample = threading.Event()
        self._keys: dict[str, str | None] = {}  # MD name -> its routers' control-plane key
        self._outage_until = 0.0  # monotonic time until which failed reads are the outage's
        self._mirrors: _Mirrors | None = None  # the watches, made in the sampling thread's loop
        self.started_at = 0.0
        self.stopped_at = 0.0

    # ------------------------------------------------------------ public
    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        print(self.summary())
        if exc is None:
            self.check()

    def start(self, timeout: float = 30.0) -> None:
        self.started_at = time.monotonic()
        self._thread = threading.Thread(target=self._main, name=f"sampler-{self.name}", daemon=True)
        self._thread.start()
        if not self._first_sample.wait(timeout):
            self.stop()
            raise AssertionError(f"invariant sampler took no sample within {timeout:.0f}s")
        if self._crash is not None:
            raise AssertionError(f"invariant sampler failed to start: {self._crash}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.stopped_at = time.monotonic()

    @contextlib.contextmanager
    def api_outage(self, settle: float = 10.0) -> Iterator[None]:
        """Inside the block (and ``settle`` seconds after it) the test takes the API server
        away on purpose: ticks that cannot read the cluster then are counted apart (reported,
        not failures), since nothing can be sampled, nor changed, without the API server.
        Ticks that do read are still judged."""
        self._outage_until = math.inf
        try:
            yield
        finally:
            self._outage_until = time.monotonic() + settle

    def violation_windows(self) -> list[Window]:
        with self._lock:
            return windows(list(self.violations), list(self.sample_times))

    def wait_for_violation(self, timeout: float, path: str | None = None) -> Violation:
        """Block until the sampler has seen a violation (for scenarios that expect one), on
        ``path`` (POD_READY, ENDPOINT, WORKER) when given: a scenario that asserts a path was
        unsafe waits until the sampler has actually read it (a router's ``/workers`` can be
        unreadable for its first seconds)."""

        def first() -> Violation | None:
            with self._lock:
                return next((v for v in self.violations if path in (None, v.path)), None)

        return poll_until(
            f"sampler {self.name} to see a violation" + (f" on the {path} path" if path else ""),
            first,
            timeout,
            period=0.05,
            details=self.summary,
        )

    def summary(self) -> str:
        s = self.stats
        ticks = sorted(s.tick_seconds) or [0.0]
        p50 = ticks[len(ticks) // 2]
        p95 = ticks[min(len(ticks) - 1, int(len(ticks) * 0.95))]
        wall = (self.stopped_at or time.monotonic()) - self.started_at
        lines = [
            f"MEASURED sampler[{self.name}]: {s.samples} samples in {wall:.1f}s "
            f"(tick p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms), {s.paths} traffic paths "
            f"checked, {len(self.violations)} violations, {s.failed} failed ticks, "
            f"{s.outage_failed} ticks unread during a declared API server outage, "
            f"{s.unreadable} unreadable-engine paths, {s.unjudged} unjudged, "
            f"{s.router_errors} router read errors, {s.confirmed} ticks confirmed by list "
            f"({s.unconfirmed} refuted)"
        ]
        for w in self.violation_windows():
            lines.append(
                f"  VIOLATION {w.path} {w.via} -> {w.pod} for {w.seconds:.2f}s "
                f"({w.samples} samples, from +{w.first - self.started_at:.2f}s): "
                f"{w.reason}: {w.message}"
                + (f"\n    pod state at the first sample: {w.evidence}" if w.evidence else "")
            )
        return "\n".join(lines)

    def check(self) -> None:
        """Raise AssertionError if the sampler saw a violation or could not watch."""
        problems: list[str] = []
        if self._crash is not None:
            problems.append(f"the sampler crashed: {self._crash!r}")
        if self.stats.samples == 0:
            problems.append("the sampler took no sample")
        ticks = self.stats.samples + self.stats.failed
        if ticks and self.stats.failed > ticks / 10:
            problems.append(
                f"{self.stats.failed} of {ticks} sampler ticks failed to read the cluster "
                f"(last: {self.stats.last_error})"
            )
        if self.violations and not self.expect_violations:
            problems.append(
                "traffic paths pointed at engines that do not meet their requirement:\n"
                + "\n".join(
                    f"  {w.path} {w.via} -> {w.pod} for {w.seconds:.2f}s ({w.samples} samples):"
                    f" {w.reason}: {w.message}"
                    for w in self.violation_windows()
                )
            )
        if problems:
            raise AssertionError("invariant sampler: " + "; ".join(problems))

    # ------------------------------------------------------------ the sampling thread
    def _main(self) -> None:
        try:
            enter_netns_thread(Path("/run/netns") / self.cluster.netns_name)
            asyncio.run(self._run())
        except BaseException as exc:
            self._crash = exc
        finally:
            self._first_sample.set()

    async def _run(self) -> None:
        async with (
            KubeApi(KubeConfig(self.cluster.kubeconfig)) as api,
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
        ):
            ns = f"/api/v1/namespaces/{self.namespace}"
            self._mirrors = _Mirrors(
                engines=_Mirror(f"{ns}/pods", {"labelSelector": self.engine_selector}),
                routers=_Mirror(f"{ns}/pods", {"labelSelector": self.router_selector}),
                slices=_Mirror(
                    f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices", {}
                ),
                mds=_Mirror(
                    f"/apis/kvgate.io/v1alpha1/namespaces/{self.namespace}/modeldeployments", {}
                ),
            )
            watches = [
                asyncio.ensure_future(m.follow(api, self._stop)) for m in self._mirrors.all()
            ]
            try:
                await self._mirrors.listed(MIRROR_LIST_DEADLINE)
                await self._ticks(api, http)
            finally:
                for watch in watches:
                    watch.cancel()
                await asyncio.gather(*watches, return_exceptions=True)

    async def _ticks(self, api: KubeApi, http: aiohttp.ClientSession) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                await self._tick(api, http)
            except Exception as exc:
                if time.monotonic() <= self._outage_until:
                    self.stats.outage_failed += 1
                else:
                    self.stats.failed += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
            finally:
                self._first_sample.set()
            elapsed = time.monotonic() - started
            self.stats.tick_seconds.append(elapsed)
            await asyncio.sleep(max(0.0, self.interval - elapsed))

    async def _report(
        self, http: aiohttp.ClientSession, pod: Obj
    ) -> tuple[str, EngineReport | Verdict]:
        ip = pod["status"]["podIP"]
        port = self.engine_port or _engine_port(pod)
        report = await fetch_report(
            f"http://{ip}:{port}", timeout=ENGINE_REPORT_TIMEOUT, retries=0, session=http
        )
        return _uid(pod), report

    async def _router_key(self, api: KubeApi, router: Obj) -> str | None:
        """The router's control-plane key, read (as the cluster admin) from the Secret kvgate
        made for its ModelDeployment; smg answers 401 to GET /workers without it."""
        md = ((router.get("metadata") or {}).get("labels") or {}).get("kvgate.io/deployment")
        if not md:
            return None
        if md not in self._keys:
            path = f"/api/v1/namespaces/{self.namespace}/secrets/{md}-router-control"
            try:
                secret = await api.request("GET", path, timeout=API_REQUEST_TIMEOUT)
                raw = (secret.get("data") or {}).get("admin-key")
                self._keys[md] = base64.b64decode(raw).decode() if raw else None
            except Exception:  # no Secret (yet): read without a key
                return None
        return self._keys[md]

    async def _workers(
        self, http: aiohttp.ClientSession, router: Obj, key: str | None = None
    ) -> tuple[str, Obj | None]:
        url = f"http://{router['status']['podIP']}:{self.router_port}/workers"
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        try:
            async with http.get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=1.0)
            ) as resp:
                if resp.status == 200:
                    return _key(router), dict(await resp.json(content_type=None))
                if resp.status == 401:
                    self._keys.clear()  # re-read the key next time (a re-keyed router)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            pass
        return _key(router), None

    async def _tick(self, api: KubeApi, http: aiohttp.ClientSession) -> None:
        mirrors = self._mirrors
        assert mirrors is not None
        engines = [p for p in mirrors.engines.items() if (p.get("status") or {}).get("podIP")]
        reports = dict(await asyncio.gather(*(self._report(http, p) for p in engines)))
        judged = await self._judge(
            api, http, engines, reports, mirrors.engines.items(), mirrors.slices.items(),
            mirrors.routers.items(), mirrors.mds.items(),
        )  # fmt: skip
        if judged.decision.violations:
            # What the watches showed may trail the API server: read the routing state by list,
            # after the same reports, and count only what the lists show too.
            self.stats.confirmed += 1
            pods_now, routers, slices, mds = await asyncio.gather(
                mirrors.engines.fetch(api), mirrors.routers.fetch(api),
                mirrors.slices.fetch(api), mirrors.mds.fetch(api),
            )  # fmt: skip
            judged = await self._judge(
                api, http, engines, reports, pods_now[0], slices[0], routers[0], mds[0]
            )
            if not judged.decision.violations:
                self.stats.unconfirmed += 1
        decision, at = judged.decision, judged.at
        with self._lock:
            self.sample_times.append(at)
            self.violations.extend(decision.violations)
        s = self.stats
        s.samples += 1
        s.paths += decision.paths
        s.unreadable += len(decision.unreadable)
        s.unjudged += len(decision.unjudged)
        s.router_errors += judged.router_errors

    async def _judge(
        self,
        api: KubeApi,
        http: aiohttp.ClientSession,
        engines: Sequence[Obj],
        reports: Mapping[str, EngineReport | Verdict],
        pods_now: Sequence[Obj],
        slices: Sequence[Obj],
        routers: Sequence[Obj],
        mds: Sequence[Obj],
    ) -> _Judged:
        """The routing state read after ``reports`` (pods, slices, routers' ``/workers``),
        judged against them."""
        running = [
            r
            for r in routers
            if (r.get("status") or {}).get("podIP") and r["status"].get("phase") == "Running"
        ]
        keys = [await self._router_key(api, r) for r in running]
        answers = await asyncio.gather(
            *(self._workers(http, r, k) for r, k in zip(running, keys, strict=True))
        )
        workers = {name: body for name, body in answers if body is not None}
        at = time.monotonic()
        decision = decide(
            at=at,
            probed_pods=engines,
            reports=reports,
            pods=pods_now,
            slices=slices,
            workers=workers,
            requirement_of=self.requirement_of or requirements_from(mds),
        )
        return _Judged(decision, at, len(answers) - len(workers))


@dataclass(frozen=True)
class _Judged:
    """One judgement of a sample: the decision, when it was taken, routers not read."""

    decision: Decision
    at: float
    router_errors: int


class MirrorStale(RuntimeError):
    """A tick read a watch that is not running (never listed, broken, being re-listed)."""


class _Mirror:
    """One list and watch of a namespace's objects (``path`` with ``params``), kept by uid. Its
    ``items`` are readable while the watch runs; after a failure they raise ``MirrorStale``
    until it has listed or resumed again (a tick that cannot read them fails, as a failed list
    did)."""

    def __init__(self, path: str, params: Mapping[str, str]) -> None:
        self.path = path
        self.params = dict(params)
        self._objects: dict[str, Obj] = {}
        self._running = False
        self._listed = asyncio.Event()
        self._problem = "not listed yet"

    def items(self) -> list[Obj]:
        if not self._running:
            raise MirrorStale(f"watch of {self.path} not running: {self._problem}")
        return list(self._objects.values())

    async def fetch(self, api: KubeApi) -> tuple[list[Obj], str]:
        """One list of the same objects: (items, the list's resourceVersion)."""
        body = await api.request("GET", self.path, params=self.params, timeout=API_REQUEST_TIMEOUT)
        version = str((body.get("metadata") or {}).get("resourceVersion") or "")
        return list(body.get("items") or []), version

    async def follow(self, api: KubeApi, stop: threading.Event) -> None:
        version: str | None = None
        while not stop.is_set():
            try:
                if version is None:
                    items, version = await self.fetch(api)
                    self._objects = {_uid(o): o for o in items}
                self._running = True
                self._listed.set()
                events = 0
                async for event in api.watch(self.path, self.params, version):
                    events += 1
                    obj = event.get("object") or {}
                    version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                    if event.get("type") in ("ADDED", "MODIFIED"):
                        self._objects[_uid(obj)] = obj
                    elif event.get("type") == "DELETED":
                        self._objects.pop(_uid(obj), None)
                # The server ended the watch (its timeout): resume from the last version, after a
                # pause if it brought nothing (no hot loop against a server that ends it at once).
                await asyncio.sleep(0 if events else MIRROR_RETRY_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._running = False
                self._problem = f"{type(exc).__name__}: {exc}"
                if isinstance(exc, ApiError) and exc.status == 410:
                    version = None  # too old to resume: list again
                await asyncio.sleep(MIRROR_RETRY_SECONDS)


@dataclass
class _Mirrors:
    engines: _Mirror
    routers: _Mirror
    slices: _Mirror
    mds: _Mirror

    def all(self) -> list[_Mirror]:
        return [self.engines, self.routers, self.slices, self.mds]

    async def listed(self, timeout: float) -> None:
        """Until every mirror has listed once (at most ``timeout``: then the ticks fail)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(m._listed.wait() for m in self.all())), timeout)


def _engine_port(pod: Obj) -> int:
    containers = (pod.get("spec") or {}).get("containers") or []
    for container in containers:
        for port in container.get("ports") or []:
            if port.get("name") == "http":
                return int(port["containerPort"])
    for container in containers:
        for port in container.get("ports") or []:
            return int(port["containerPort"])
    return 30000
