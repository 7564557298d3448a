"""Run kopf's real admission machinery for the ModelDeployment webhook without a cluster.

`kopf.run` only starts serving webhooks after it has discovered the resources from an API
server. Tests and the benchmark have none, so this wires the same pieces kopf's reactor wires —
`admission_webhook_server` with `serve_admission_request` bound to the operator registry, a
memory store and "insights" that list the ModelDeployment resource — and nothing else. These are
kopf internals (pinned by kopf>=1.45); the handler, the server and the request path are the ones
the operator runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator

import kopf
from kopf._cogs.aiokits import aiovalues
from kopf._cogs.structs import ephemera, references, reviews
from kopf._core.engines import admission, indexing
from kopf._core.intents import registries
from kopf._core.reactor import inventory

import kvgate.admission.webhook  # noqa: F401  (registers the handler)
from kvgate.api import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION

MODELDEPLOYMENT_RESOURCE = references.Resource(
    group=GROUP,
    version=VERSION,
    plural=PLURAL,
    kind=KIND,
    singular=SINGULAR,
    shortcuts=frozenset(SHORT_NAMES),
    namespaced=True,
    verbs=frozenset({"list", "watch", "patch", "get", "create", "update", "delete"}),
)


@contextlib.asynccontextmanager
async def serve_webhook(
    server: kopf.WebhookServer,
    *,
    registry: registries.OperatorRegistry | None = None,
    start_timeout: float = 10.0,
    memo: kopf.Memo | None = None,
) -> AsyncIterator[reviews.WebhookClientConfig]:
    """Serve the registered admission handlers through `server` until the block exits; yields
    the client config (its `url` is where to POST). `memo` is what the operator would pass to
    `kopf.operator` (`{kvgate.admission.policy.POLICY_MEMO_KEY: ClusterPolicy(...)}`)."""
    registry = registry if registry is not None else registries.get_default_registry()
    settings = kopf.OperatorSettings()
    settings.admission.server = server
    settings.admission.managed = None
    insights = references.Insights()
    insights.webhook_resources.add(MODELDEPLOYMENT_RESOURCE)
    insights.ready_resources.set()
    indexers = indexing.OperatorIndexers()
    container: aiovalues.Container[reviews.WebhookClientConfig] = aiovalues.Container()
    webhookfn = functools.partial(
        admission.serve_admission_request,
        settings=settings,
        registry=registry,
        insights=insights,
        memories=inventory.ResourceMemories(),
        memobase=ephemera.AnyMemo(memo if memo is not None else ephemera.Memo()),
        indices=indexers.indices,
    )
    task = asyncio.create_task(
        admission.admission_webhook_server(
            settings=settings,
            registry=registry,
            insights=insights,
            webhookfn=webhookfn,
            container=container,
        )
    )
    try:
        waiter = asyncio.ensure_future(container.wait())
        done, _ = await asyncio.wait(
            {waiter, task}, timeout=start_timeout, return_when="FIRST_COMPLETED"
        )
        if waiter not in done:
            waiter.cancel()
            if task in done:
                task.result()  # re-raise why the server stopped
            raise TimeoutError(f"the webhook server did not start within {start_timeout:g} s")
        yield waiter.result()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def free_loopback_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` right now (kopf would otherwise probe on all interfaces)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
