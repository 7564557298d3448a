"""The loopback kubelet's HTTPS port: ``GET /containerLogs/<ns>/<pod>/<container>``, as the
kubelet serves it (``pkg/kubelet/server/server.go`` ``getContainerLogs``, v1.37.2).

The kube-apiserver turns ``pods/log`` into this request (``LogLocation`` in
``pkg/registry/core/pod/strategy.go``: the node's address of ``--kubelet-preferred-address-types``
and its ``daemonEndpoints.kubeletEndpoint.Port``; query ``follow``, ``previous``, ``timestamps``,
``sinceSeconds``, ``sinceTime``, ``tailLines``, ``limitBytes``) and relays the answer. One
listener per node, on the node's InternalIP, port 10250, with a serving certificate of the run's
CA; each answers for its own node's pods only.

Authentication and authorization as the kubelet's (``--anonymous-auth=false``,
``--authorization-mode=Webhook``): a client certificate signed by the CA (the apiserver's
``--kubelet-client-certificate``) gives the user (CN) and groups (O); without one the answer is
401. The user must be allowed ``get nodes/proxy`` on the node, asked of the API server with a
SubjectAccessReview (cached 5 min when allowed, 30 s when not, as the kubelet's webhook
authorizer); otherwise 403.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from kvgate_e2e.kubelet.api import ApiError, KubeApi
from kvgate_e2e.kubelet.logs import (
    ContainerLogError,
    LogOptionsError,
    parse_log_options,
    stream_log,
)
from kvgate_e2e.kubelet.processes import ContainerLog

log = logging.getLogger("kvgate_e2e.kubelet.server")
KUBELET_PORT = 10250
# How long aiohttp waits for open requests when the server stops: a follow stream never ends by
# itself, so a second, then it is closed.
SHUTDOWN_SECONDS = 1.0
NODE = web.AppKey("node", str)
ALLOWED_TTL, DENIED_TTL = 300.0, 30.0


class LogPod(Protocol):
    """What the server needs of a pod worker."""

    namespace: str
    name: str
    node: str

    def has_container(self, name: str) -> bool: ...

    def container_log(self, container: str, *, previous: bool) -> ContainerLog: ...


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]


def user_of(peercert: Mapping[str, Any] | None) -> User | None:
    """The user a verified client certificate names (CN, and O as groups), as the apiserver's and
    kubelet's x509 authenticator read it; None without a certificate."""
    if not peercert:
        return None
    name, groups = "", []
    for rdn in peercert.get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                name = str(value)
            elif key == "organizationName":
                groups.append(str(value))
    return User(name, tuple(groups)) if name else None


def server_ssl_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    """TLS 1.2+, a client certificate verified when given (its absence is a 401, not a
    handshake failure, as with the kubelet)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


class KubeletServer:
    """One HTTPS listener per node address; ``await start()``, ``await stop()``."""

    def __init__(
        self,
        api: KubeApi,
        find_pod: Callable[[str, str, str], LogPod | None],
        ssl_context: ssl.SSLContext,
        port: int = KUBELET_PORT,
    ) -> None:
        self.api = api
        self.find_pod = find_pod  # (node, namespace, name) -> the pod's worker on that node
        self.ssl_context = ssl_context
        self.port = port
        self._runners: list[web.AppRunner] = []
        self._decisions: dict[tuple[User, str], tuple[bool, float]] = {}
        self._streams: set[asyncio.Task[Any]] = set()
        self._stopping = asyncio.Event()

    async def start(self, nodes: Mapping[str, str]) -> None:
        """Listen on ``node IP:port`` for each ``node name -> IP``."""
        for node, ip in nodes.items():
            app = web.Application()
            app[NODE] = node
            app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._container_logs)
            runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_SECONDS)
            await runner.setup()
            site = web.TCPSite(runner, ip, self.port, ssl_context=self.ssl_context)
            await site.start()
            self._runners.append(runner)
            log.info("node %s: serving containerLogs on https://%s:%d", node, ip, self.port)

    async def stop(self) -> None:
        self._stopping.set()
        for task in list(self._streams):
            task.cancel()
        for runner in self._runners:
            with contextlib.suppress(Exception):
                await runner.cleanup()
        self._runners.clear()

    # ------------------------------------------------------------------ auth
    async def _authorized(self, user: User, node: str) -> bool:
        key = (user, node)
        cached = self._decisions.get(key)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.name,
                "groups": list(user.groups),
                "resourceAttributes": {
                    "verb": "get",
                    "resource": "nodes",
                    "subresource": "proxy",
                    "name": node,
                },
            },
        }
        answer = await self.api.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        allowed = bool((answer.get("status") or {}).get("allowed"))
        ttl = ALLOWED_TTL if allowed else DENIED_TTL
        self._decisions[key] = (allowed, time.monotonic() + ttl)
        return allowed

    # ------------------------------------------------------------------ handler
    async def _container_logs(self, request: web.Request) -> web.StreamResponse:
        node = request.app[NODE]
        transport = request.transport
        peercert = transport.get_extra_info("peercert") if transport is not None else None
        user = user_of(peercert)
        if user is None:
            return web.Response(status=401, text="Unauthorized")
        try:
            allowed = await self._authorized(user, node)
        except (ApiError, OSError, TimeoutError) as exc:
            return web.Response(status=500, text=f"Authorization error: {exc}")
        if not allowed:
            return web.Response(
                status=403,
                text=(f"Forbidden (user={user.name}, verb=get, resource=nodes, subresource=proxy)"),
            )
        namespace = request.match_info["namespace"]
        name = request.match_info["pod"]
        container = request.match_info["container"]
        try:
            opts = parse_log_options(request.query)
        except LogOptionsError as exc:
            return web.Response(status=exc.status, text=exc.message)
        pod = self.find_pod(node, namespace, name)
        if pod is None:
            return web.Response(status=404, text=f'pod "{name}" does not exist')
        if not pod.has_container(container):
            return web.Response(
                status=404, text=f'container "{container}" not found in pod "{name}"'
            )
        try:
            instance = pod.container_log(container, previous=opts.previous)
        except ContainerLogError as exc:
            return web.Response(status=400, text=str(exc))

        response = web.StreamResponse(status=200, headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        task = asyncio.current_task()
        if task is not None:
            self._streams.add(task)
        try:
            await stream_log(
                instance.path,
                opts,
                finished=lambda: (
                    instance.done()
                    or self._stopping.is_set()
                    or request.transport is None
                    or request.transport.is_closing()
                ),
                wait_change=instance.wait_change,
                write=response.write,
            )
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away
        except OSError as exc:
            log.warning("containerLogs %s/%s/%s: %s", namespace, name, container, exc)
        finally:
            if task is not None:
                self._streams.discard(task)
        return response
