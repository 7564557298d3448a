"""The validating webhook's HTTPS server: aiohttp's low-level server, one handler, no framework.

POST /validate-modeldeployment with an AdmissionReview: a malformed request gets a 4xx with
`{"error": ...}` (`kvgate.admission.review`); a well-formed one gets the AdmissionReview response
(`kvgate.admission.answer`), denied with code 500 if kvgate itself fails. Used by `kvgate webhook`
(its own Deployment) and by `kvgate operator` without --no-webhook (tests, development).

Shutting down without losing a request: `begin_drain` (the pod's readiness fails, so the
Service drops it; every answer from then on closes its keep-alive connection, so the API server
reconnects to a ready replica), then `stop` stops accepting connections, lets the requests in
flight finish and closes the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from kvgate.admission.answer import HANDLER_ID, WEBHOOK_PATH, Answer, answer_review, internal_error
from kvgate.admission.checks import check_document
from kvgate.admission.limits import MAX_REQUEST_BYTES
from kvgate.admission.policy import ClusterPolicy
from kvgate.admission.review import RejectedReview, check_resource, check_review, parse_review
from kvgate.api.models import API_VERSION, GROUP, KIND, PLURAL, VERSION
from kvgate.webhook import metrics
from kvgate.webhook.certificates import CHECK_INTERVAL_SECONDS, ReloadingCertificate

log = logging.getLogger("kvgate.admission")

HANDLER_IDS = frozenset({HANDLER_ID})
# The API server gives a webhook at most 30 s (ours: 10 s); a request still running after that
# has been given up on.
SHUTDOWN_TIMEOUT_SECONDS = 30.0
# kopf's (aiohttp's) limit, kept: a larger body is answered 413.
MAX_BODY_BYTES = MAX_REQUEST_BYTES
# kube-apiserver's webhook client (Go's http.Transport) drops idle keep-alive connections after
# 90 s; a server that closes them first (aiohttp's default: 75 s) races the client's next POST,
# which Go does not retry ("EOF"). Idle connections are left for the client to close.
KEEPALIVE_TIMEOUT_SECONDS = 120.0
# After the shutdown delay: how long open connections may still bring one more request (answered
# with `Connection: close`) before the rest are closed. Each close of an idle connection can race
# a request the API server is sending on it; the fewer, the better.
LINGER_SECONDS = 10.0
_JSON = "application/json"
_WARM_UP = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "warm-up"}, "spec": {}}


def _json_response(payload: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(payload).encode(), status=status, content_type=_JSON)


def _log_denial(data: dict[str, Any], answer: Answer) -> None:
    request = data["request"]
    obj = request.get("object") or request.get("oldObject") or {}
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    metadata = metadata if isinstance(metadata, dict) else {}
    namespace = metadata.get("namespace") or request.get("namespace") or ""
    name = metadata.get("name") or request.get("name") or ""
    log.log(
        logging.ERROR if answer.outcome == "error" else logging.INFO,
        "%s of ModelDeployment %s/%s %s: %s",
        answer.operation,
        namespace,
        name,
        answer.outcome,
        answer.message,
        extra={"uid": request.get("uid"), "outcome": answer.outcome},
    )


class AdmissionServer:
    """HTTPS on `host`:`port` (0: any free port; see `port` after `start`)."""

    def __init__(
        self,
        *,
        certificate: ReloadingCertificate,
        policy: ClusterPolicy | None = None,
        host: str = "0.0.0.0",
        port: int = 9443,
        shutdown_timeout: float = SHUTDOWN_TIMEOUT_SECONDS,
        linger_seconds: float = LINGER_SECONDS,
    ) -> None:
        self.certificate = certificate
        self.policy = policy if policy is not None else ClusterPolicy()
        self.host = host
        self.port = port
        self.draining = False
        self.linger_seconds = linger_seconds
        self._server = web.Server(
            self._handle,
            access_log=None,
            handler_cancellation=False,
            keepalive_timeout=KEEPALIVE_TIMEOUT_SECONDS,
        )
        self._runner = web.ServerRunner(self._server, shutdown_timeout=shutdown_timeout)
        self.shutdown_timeout = shutdown_timeout
        self._watcher: asyncio.Task[None] | None = None
        self._stopped = False
        self._site: web.TCPSite | None = None
        # Requests whose handler runs (from the headers on): aiohttp's own shutdown drops the
        # rest of a body still arriving, so `stop` waits for these before handing over to it.
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def url(self) -> str:
        """Where to reach the server (the bound address; loopback for a wildcard one)."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(self.host, self.host)
        return f"https://[{host}]:{self.port}" if ":" in host else f"https://{host}:{self.port}"

    async def start(self) -> None:
        """Listen; certificate changes are picked up from now on."""
        # The first check builds what later ones reuse (the CRD schema the size limit reads,
        # pydantic's validators): ~0.1 s, spent here rather than on the first admission.
        check_document(_WARM_UP, self.policy)
        await self._runner.setup()
        self._site = web.TCPSite(
            self._runner, self.host, self.port, ssl_context=self.certificate.context
        )
        await self._site.start()
        if self.port == 0:
            self.port = int(self._runner.addresses[0][1])
        self._watcher = asyncio.create_task(self.certificate.watch())

    def begin_drain(self) -> None:
        """Keep answering, but close every connection after its answer (see the module doc)."""
        self.draining = True

    async def stop(self) -> None:
        """Stop accepting connections, finish the requests in flight, close the connections."""
        self.draining = True
        if self._stopped:
            return
        self._stopped = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self._site is not None:
            await self._site.stop()  # no new connections; open ones are answered and closed
        # Connections still open may carry one more request each (answered, then closed in
        # band); only those still idle after the linger are closed under the client.
        loop = asyncio.get_running_loop()
        until = loop.time() + self.linger_seconds
        while self._server.connections and loop.time() < until:
            await asyncio.sleep(0.05)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), self.shutdown_timeout)
        await self._runner.cleanup()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        self._in_flight += 1
        self._idle.clear()
        try:
            response = await self._answer(request)
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()
        if self.draining:
            response.force_close()
        return response

    async def _answer(self, request: web.BaseRequest) -> web.Response:
        started = time.perf_counter()
        data: dict[str, Any] | None = None
        try:
            if request.method != "POST":
                raise RejectedReview(405, f"use POST {WEBHOOK_PATH} with an AdmissionReview")
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise RejectedReview(
                    413,
                    f"the body is larger than {MAX_BODY_BYTES:,} bytes; no ModelDeployment "
                    "kvgate admits is that large (its spec may be at most 96 KiB)",
                ) from None
            data = parse_review(body)
            check_review(data, request.path[1:], HANDLER_IDS)
            check_resource(data, GROUP, VERSION, PLURAL)
        except RejectedReview as rejected:
            request_field = data.get("request") if data is not None else None
            operation = request_field.get("operation") if isinstance(request_field, dict) else None
            metrics.count(metrics.operation_label(operation), "rejected")
            return _json_response({"error": rejected.message}, status=rejected.status)
        try:
            answer = answer_review(data, self.policy)
        except Exception as error:  # checks never raise; anything here is a kvgate bug
            log.exception("admission request failed inside kvgate")
            answer = internal_error(data, error)
        if answer.outcome != "allowed":
            _log_denial(data, answer)
        response = _json_response(answer.review)
        metrics.count(answer.operation, answer.outcome)
        metrics.DURATION.observe(time.perf_counter() - started)
        return response


@contextlib.asynccontextmanager
async def serving(
    tls_dir: str | Path,
    *,
    policy: ClusterPolicy | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    check_interval: float = CHECK_INTERVAL_SECONDS,
) -> AsyncIterator[AdmissionServer]:
    """An `AdmissionServer` for the certificate in `tls_dir`, stopped when the block exits."""
    server = AdmissionServer(
        certificate=ReloadingCertificate(tls_dir, check_interval=check_interval),
        policy=policy,
        host=host,
        port=port,
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
