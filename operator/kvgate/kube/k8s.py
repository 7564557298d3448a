"""A thin async Kubernetes REST client (aiohttp): the few calls the operator makes, with the
exact content types written down (strategic-merge for pod status, merge for the CR status).

Credentials come from the in-cluster service account or the kubeconfig (via the `kubernetes`
package's loader). Plain dicts in, plain dicts out.

The two status writes (an engine pod's gate condition, a ModelDeployment's status) are retried
on transient failures with bounded exponential backoff and jitter (RetryPolicy), so a blip of
the API server delays them by seconds, not by a reverify interval.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import os
import random
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from kvgate.api import labels
from kvgate.api.content_types import JSON_PATCH as JSON_PATCH
from kvgate.api.content_types import MERGE_PATCH as MERGE_PATCH
from kvgate.api.content_types import STRATEGIC_MERGE_PATCH as STRATEGIC_MERGE_PATCH
from kvgate.api.models import GROUP, PLURAL, SCALE_PLURAL, VERSION
from kvgate.kube import metrics
from kvgate.kube.probe_slots import ProbeSlots

JSON = "application/json"
# Requests of kvgate's own client in flight at once (watches and log streams apart).
MAX_REQUESTS = 32


class Urgency:
    """Whether a task's API requests go before the others waiting for a request slot: a pass
    somebody asked for (a rollback, a scale request, a new spec; kvgate.rollout.pass_priority),
    or a pass running when somebody asked (``urgent`` raised meanwhile: what was asked waits
    for it), and a gate's write."""

    __slots__ = ("urgent",)

    def __init__(self, urgent: bool) -> None:
        self.urgent = urgent


# The current task's Urgency (None: not urgent). Set by the task that makes the requests; a
# task inherits it only from where it was set.
URGENT: contextvars.ContextVar[Urgency | None] = contextvars.ContextVar(
    "kvgate_api_urgent", default=None
)


def urgent_now() -> bool:
    """Whether the current task's requests go first."""
    urgency = URGENT.get()
    return urgency is not None and urgency.urgent


RBAC = "/apis/rbac.authorization.k8s.io/v1"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

Body = dict[str, Any]
log = logging.getLogger("kvgate.kube.k8s")


def resource_of(path: str) -> str:
    """``pods``, ``pods/status``, ``modeldeployments``... from an API path (pure)."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if "namespaces" in parts:
        i = parts.index("namespaces")
        rest = parts[i + 2 :] if len(parts) > i + 2 else ["namespaces"]
    else:
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    return "/".join(rest[:1] + rest[2:3]) or "unknown"


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        method: str,
        path: str,
        message: str,
        *,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after  # seconds, from a Retry-After header (429, 503)


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the API server sends delta-seconds; an HTTP date is ignored)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for the status writes.

    Retried: connection errors, timeouts, HTTP 429 and 5xx, and 409 only where the caller says
    a conflict is worth retrying. Never any other 4xx (403, 404, 422, ...): the same request
    would fail the same way. The n-th retry waits a random time in [1/2, 1] of
    min(max_delay, base * 2**(n-1)), or the server's Retry-After when longer; a Retry-After
    above max_retry_after, or a wait that would end past budget (seconds since the first try),
    gives up and raises the last error (the next pass writes again).
    """

    attempts: int = 5  # tries in all, the first included
    base_seconds: float = 0.2
    max_delay_seconds: float = 3.0
    max_retry_after_seconds: float = 10.0
    budget_seconds: float = 20.0
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    clock: Callable[[], float] = time.monotonic
    jitter: Callable[[], float] = random.random  # in [0, 1)

    def delay(self, retry: int, retry_after: float | None) -> float:
        """Seconds before retry number ``retry`` (1-based)."""
        step = min(self.max_delay_seconds, self.base_seconds * 2.0 ** (retry - 1))
        backoff = step * (0.5 + 0.5 * self.jitter())
        return max(backoff, retry_after or 0.0)


def retry_reason(exc: BaseException, *, conflict_retryable: bool) -> str | None:
    """Why ``exc`` is worth retrying (the metric's reason label), or None when it is not."""
    if isinstance(exc, ApiError):
        if exc.status == 429 or exc.status >= 500:
            return f"http_{exc.status}"
        if exc.status == 409 and conflict_retryable:
            return "http_409"
        return None
    if isinstance(exc, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
        return "timeout"
    if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError):
        return "connection"
    return None


@dataclass(frozen=True)
class Credentials:
    server: str
    token: str | None = None
    token_file: str | None = None  # re-read on use: bound service-account tokens rotate
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True

    def bearer(self) -> str | None:
        if self.token_file:
            return Path(self.token_file).read_text().strip()
        return self.token

    def ssl_context(self) -> ssl.SSLContext | bool:
        if not self.server.startswith("https"):
            return False
        if not self.verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.cert_file and self.key_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        return ctx


def in_cluster_credentials() -> Credentials | None:
    """The pod's service account, when this process runs in a pod that has one."""
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT"),
    )
    if not (host and port and (SA_DIR / "token").exists()):
        return None
    server_host = f"[{host}]" if ":" in host else host
    return Credentials(
        server=f"https://{server_host}:{port}",
        token_file=str(SA_DIR / "token"),
        ca_file=str(SA_DIR / "ca.crt"),
    )


def kubeconfig_credentials(
    config_file: str | None = None, context: str | None = None
) -> Credentials:
    """A kubeconfig's context (default: $KUBECONFIG or ~/.kube/config, its current context),
    read by the ``kubernetes`` package's loader (exec plugins and auth providers included)."""
    from kubernetes import config  # the kubeconfig loader only; no API calls through it
    from kubernetes.client import Configuration

    cfg = Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=config_file, context=context, client_configuration=cfg
    )
    raw = cfg.api_key.get("BearerToken") or cfg.api_key.get("authorization")
    token = raw.removeprefix("Bearer ").strip() if raw else None
    return Credentials(
        server=str(cfg.host).rstrip("/"),
        token=token,
        ca_file=cfg.ssl_ca_cert,
        cert_file=cfg.cert_file,
        key_file=cfg.key_file,
        verify=bool(cfg.verify_ssl),
    )


def load_credentials() -> Credentials:
    """In-cluster service account if present, else the current kubeconfig context."""
    return in_cluster_credentials() or kubeconfig_credentials()


def _api_error(response: aiohttp.ClientResponse, method: str, path: str, text: str) -> ApiError:
    try:
        message = str(json.loads(text).get("message", text))
    except (ValueError, AttributeError):
        message = text[:500]
    return ApiError(
        response.status,
        method,
        path,
        message,
        retry_after=_retry_after(response.headers.get("Retry-After")),
    )


def _selector(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in selector.items())


class KubeApi:
    """The operator's API calls. One aiohttp session, reused.

    At most ``max_requests`` requests are in flight at once, and one marked ``URGENT`` takes the
    next free request slot before any other (kvgate.kube.probe_slots' two queues). Watches and
    pods/log streams hold no request slot: they last minutes. Before, the limit was the
    session's connection pool (aiohttp's FIFO queue, 32 connections, watches and log streams
    included): with one tenant's 200 never-Ready ModelDeployments refused at once, 126 requests
    waited for a connection and another namespace's passes waited 0.8-7.8 s for one read
    behind them, whatever the pass order (fairness benchmark, traced)."""

    def __init__(
        self,
        credentials: Credentials,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        max_requests: int = MAX_REQUESTS,
    ) -> None:
        self.credentials = credentials
        self.retry = retry or RetryPolicy()
        self.slots = ProbeSlots(max_requests)
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No connection limit: ``slots`` bounds the requests, and a watch or log stream
            # must never wait for (or hold) a request's connection.
            connector = aiohttp.TCPConnector(ssl=self.credentials.ssl_context(), limit=0)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": JSON}
        token = self.credentials.bearer()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Body | Sequence[Body] | None = None,
        content_type: str = JSON,
        params: dict[str, str] | None = None,
        missing_ok: bool = False,
    ) -> Body | None:
        headers = self._headers()
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body)
        metrics.API_REQUESTS.labels(method, resource_of(path)).inc()
        async with (
            self.slots.slot(urgent=urgent_now()),
            self._session_now().request(
                method, self.credentials.server + path, data=data, headers=headers, params=params
            ) as response,
        ):
            text = await response.text()
            if response.status == 404 and missing_ok:
                return None
            if response.status >= 400:
                raise _api_error(response, method, path, text)
            if not text:
                return {}
            result: Body = json.loads(text)
            return result

    async def watch(
        self,
        path: str,
        params: dict[str, str],
        *,
        read_timeout: float,
        on_open: Callable[[], None] | None = None,
    ) -> AsyncIterator[Body]:
        """``GET path?watch=true``: yields each event ({"type", "object"}) as the API server
        streams it, until the server ends the watch (its timeoutSeconds) or nothing arrives for
        ``read_timeout`` seconds (aiohttp raises then). ``on_open`` is called once the server
        has accepted the watch (its resourceVersion included). Counted as verb WATCH."""
        metrics.API_REQUESTS.labels("WATCH", resource_of(path)).inc()
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=read_timeout)
        async with self._session_now().get(
            self.credentials.server + path,
            params={**params, "watch": "true"},
            headers=self._headers(),
            timeout=timeout,
        ) as response:
            if response.status >= 400:
                raise _api_error(response, "WATCH", path, await response.text())
            if on_open is not None:
                on_open()
            pending = b""
            # Split on newlines by hand: one event is one line, and a line may be larger than
            # aiohttp's readline limit (a pod with long managedFields).
            async for chunk in response.content.iter_any():
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        event: Body = json.loads(line)
                        yield event

    # -- paths ------------------------------------------------------------------------------
    @staticmethod
    def path(kind: str, namespace: str, name: str | None = None, sub: str | None = None) -> str:
        bases = {
            "Deployment": f"/apis/apps/v1/namespaces/{namespace}/deployments",
            "ReplicaSet": f"/apis/apps/v1/namespaces/{namespace}/replicasets",
            "StatefulSet": f"/apis/apps/v1/namespaces/{namespace}/statefulsets",
            "LeaderWorkerSet": (
                f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{namespace}/leaderworkersets"
            ),
            "Secret": f"/api/v1/namespaces/{namespace}/secrets",
            "NetworkPolicy": f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies",
            "Pod": f"/api/v1/namespaces/{namespace}/pods",
            "Service": f"/api/v1/namespaces/{namespace}/services",
            "ServiceAccount": f"/api/v1/namespaces/{namespace}/serviceaccounts",
            "Event": f"/api/v1/namespaces/{namespace}/events",
            "Role": f"{RBAC}/namespaces/{namespace}/roles",
            "RoleBinding": f"{RBAC}/namespaces/{namespace}/rolebindings",
            "ModelDeployment": f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}",
            "RoleScale": f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{SCALE_PLURAL}",
        }
        out = bases[kind]
        if name is not None:
            out += "/" + quote(name, safe="")
        if sub is not None:
            out += "/" + sub
        return out

    # -- generic verbs ----------------------------------------------------------------------
    async def list(self, kind: str, namespace: str, selector: dict[str, str]) -> list[Body]:
        doc = await self.request(
            "GET", self.path(kind, namespace), params={"labelSelector": _selector(selector)}
        )
        items: list[Body] = (doc or {}).get("items", [])
        return items

    async def get(self, kind: str, namespace: str, name: str) -> Body | None:
        return await self.request("GET", self.path(kind, namespace, name), missing_ok=True)

    async def get_text(self, path: str, params: dict[str, str], max_bytes: int) -> str:
        """``GET path`` answered in plain text (a pod's log), at most ``max_bytes`` read;
        raises ApiError on an HTTP error."""
        metrics.API_REQUESTS.labels("GET", resource_of(path)).inc()
        async with (
            self.slots.slot(urgent=urgent_now()),
            self._session_now().get(
                self.credentials.server + path, params=params, headers=self._headers()
            ) as response,
        ):
            raw = await response.content.read(max_bytes)
            text = raw.decode("utf-8", errors="replace")
            if response.status >= 400:
                raise _api_error(response, "GET", path, text)
            return text

    async def create(self, body: Body) -> Body | None:
        """Create; an object that already exists (HTTP 409) is fine (idempotent)."""
        meta = body["metadata"]
        try:
            return await self.request("POST", self.path(body["kind"], meta["namespace"]), body=body)
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise

    async def patch(
        self,
        kind: str,
        namespace: str,
        name: str,
        patch: Body | Sequence[Body],
        *,
        content_type: str = MERGE_PATCH,
        missing_ok: bool = False,
        sub: str | None = None,
    ) -> Body | None:
        """Patch one object (or its subresource ``sub``); None when it does not exist and
        ``missing_ok``."""
        return await self.request(
            "PATCH",
            self.path(kind, namespace, name, sub),
            body=patch,
            content_type=content_type,
            missing_ok=missing_ok,
        )

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        await self.request(
            "DELETE",
            self.path(kind, namespace, name),
            body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
            missing_ok=True,
        )

    async def delete_pod(self, namespace: str, name: str, uid: str) -> bool:
        """Delete one pod, only if it is still the pod with this uid (a precondition: a pod
        recreated under the same name gets 409 and is left alone). True when deleted."""
        try:
            result = await self.request(
                "DELETE",
                self.path("Pod", namespace, name),
                body={
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "preconditions": {"uid": uid},
                },
                missing_ok=True,
            )
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return result is not None

    # -- the two status writes kvgate makes -------------------------------------------------
    async def _retried(
        self,
        kind: str,
        target: str,
        write: Callable[[], Awaitable[Body | None]],
        *,
        conflict_retryable: bool,
    ) -> Body | None:
        """Run ``write``, retrying transient failures as self.retry says; each retry is logged
        and counted (kvgate_status_write_retries_total{kind, reason})."""
        policy = self.retry
        started = policy.clock()
        for attempt in range(1, policy.attempts + 1):
            try:
                return await write()
            except Exception as exc:
                reason = retry_reason(exc, conflict_retryable=conflict_retryable)
                if reason is None or attempt == policy.attempts:
                    raise
                retry_after = exc.retry_after if isinstance(exc, ApiError) else None
                if retry_after is not None and retry_after > policy.max_retry_after_seconds:
                    raise
                delay = policy.delay(attempt, retry_after)
                if policy.clock() - started + delay > policy.budget_seconds:
                    raise
                log.warning(
                    "status write failed (%s), retry %d of %d in %.2f s: %s",
                    reason,
                    attempt,
                    policy.attempts - 1,
                    delay,
                    exc,
                    extra={"kind": kind, "target": target, "reason": reason},
                )
                metrics.STATUS_WRITE_RETRIES.labels(kind, reason).inc()
                await policy.sleep(delay)
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def patch_pod_condition(
        self, namespace: str, name: str, uid: str, condition: dict[str, str]
    ) -> Body | None:
        """Strategic-merge patch of pods/status: conditions merge by `type` (the kubelet's own
        conditions are untouched); metadata.uid is a precondition (a recreated pod of the same
        name gets 409, never another pod's verdict). None when the pod is gone (404) or was
        replaced (409: never retried, it would fail the same way). Transient failures are
        retried (RetryPolicy)."""
        patch = {"metadata": {"uid": uid}, "status": {"conditions": [condition]}}

        async def write() -> Body | None:
            return await self.request(
                "PATCH",
                self.path("Pod", namespace, name, "status"),
                body=patch,
                content_type=STRATEGIC_MERGE_PATCH,
                missing_ok=True,
            )

        # A gate's write goes before the passes' reads: a pod that failed must leave traffic now.
        urgent = URGENT.set(Urgency(True))
        try:
            return await self._retried(
                "pod_condition", f"{namespace}/{name}", write, conflict_retryable=False
            )
        except ApiError as exc:
            if exc.status == 409:
                log.info("pod %s/%s was replaced; its condition is not written", namespace, name)
                return None
            raise
        finally:
            URGENT.reset(urgent)

    async def patch_md_status(self, namespace: str, name: str, status: Body) -> Body | None:
        """Merge patch of the CR's status subresource (kvgate owns the whole status). The patch
        carries no resourceVersion, so a 409 is a write conflict the API server could not
        resolve itself: retried, like other transient failures (RetryPolicy)."""

        async def write() -> Body | None:
            return await self.request(
                "PATCH",
                self.path("ModelDeployment", namespace, name, "status"),
                body={"status": status},
                content_type=MERGE_PATCH,
                missing_ok=True,
            )

        return await self._retried(
            "md_status", f"{namespace}/{name}", write, conflict_retryable=True
        )

    async def post_event(
        self, involved: Body, *, type_: str, reason: str, message: str, now: datetime
    ) -> None:
        """A core/v1 Event from component kvgate on the involved object (``now`` in UTC)."""
        meta = involved.get("metadata", {})
        namespace = meta.get("namespace") or "default"
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'kvgate')}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta.get("name"),
                "namespace": namespace,
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": labels.MANAGED_BY_VALUE},
            # Legacy (firstTimestamp) form: no eventTime, so no reportingController/action rules.
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        await self.request("POST", self.path("Event", namespace), body=event)
