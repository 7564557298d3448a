"""Read a revision's router pods' response counters and its engine pods' failure counters for
the progressive step check (I/O).

Each router pod serves Prometheus text on its metrics port (builders.ROUTER_METRICS_PORT), each
engine on its HTTP port's ``/metrics`` (SGLang with ``--enable-metrics``, which kvgate always
passes; SGLang serves it without the API key); the operator reads them directly, like it reads
engines for verification, so the check needs no Prometheus. The pure parsing and judging is
kvgate.rollout.progressive.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aiohttp
from kvgate_engine.untrusted import read_bounded

from kvgate.api import labels
from kvgate.objects import builders
from kvgate.rollout.progressive import (
    EngineFailures,
    RouterCounters,
    counters_from_metrics,
    engine_failures_from_metrics,
)
from kvgate.verify import gate

log = logging.getLogger(__name__)

TIMEOUT_SECONDS = 3.0
MAX_METRICS_BYTES = 4 << 20  # a router's exposition is ~100 KiB; more is not a router's

TextFetch = Callable[[str], Awaitable[str]]


async def fetch_text(url: str) -> str:
    """GET ``url``; raises on any failure, a non-200 or a body over MAX_METRICS_BYTES."""
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url) as response,
    ):
        if response.status != 200:
            raise RuntimeError(f"GET {url}: HTTP {response.status}")
        body = await read_bounded(response.content, MAX_METRICS_BYTES + 1)
        if len(body) > MAX_METRICS_BYTES:
            raise RuntimeError(f"GET {url}: body over {MAX_METRICS_BYTES:,} bytes")
        return body.decode("utf-8", errors="replace")


def metrics_url(pod: dict[str, Any]) -> str | None:
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or (pod.get("status") or {}).get("phase") != "Running":
        return None
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{builders.ROUTER_METRICS_PORT}/metrics"


async def read_counters(
    routers: Iterable[dict[str, Any]], fetch: TextFetch = fetch_text
) -> tuple[RouterCounters, ...] | None:
    """Every running router pod's counters; None when any of them cannot be read (a step
    never ends, nor starts its count, on a partial view)."""
    targets = [
        (str(p.get("metadata", {}).get("name") or ""), url)
        for p in routers
        if not p.get("metadata", {}).get("deletionTimestamp") and (url := metrics_url(p))
    ]

    async def one(pod: str, url: str) -> RouterCounters | None:
        try:
            return counters_from_metrics(pod, await fetch(url))
        except (aiohttp.ClientError, TimeoutError, RuntimeError, OSError) as exc:
            log.info("router metrics unreadable: %s: %s", url, exc)
            return None

    read = await asyncio.gather(*(one(pod, url) for pod, url in targets))
    if any(c is None for c in read):
        return None
    return tuple(c for c in read if c is not None)


async def read_engine_failures(
    engines: Iterable[dict[str, Any]], fetch: TextFetch = fetch_text
) -> tuple[EngineFailures, ...] | None:
    """Every serving engine pod's failure counters (pods whose engine container is ready, on
    its HTTP port: a multi-node engine's leader, whose ranks' counters its /metrics holds);
    None when any of them cannot be read. An engine that answers but writes neither counter
    has failed nothing; one that does not answer decides nothing, so the step neither ends nor
    passes on a partial view."""
    targets = [
        (str(p.get("metadata", {}).get("name") or ""), labels_of(p).get(labels.ROLE, ""), url)
        for p in engines
        if (url := gate.engine_url(p))
    ]

    async def one(pod: str, role: str, url: str) -> EngineFailures | None:
        try:
            return engine_failures_from_metrics(pod, role, await fetch(f"{url}/metrics"))
        except (aiohttp.ClientError, TimeoutError, RuntimeError, OSError) as exc:
            log.info("engine metrics unreadable: %s/metrics: %s", url, exc)
            return None

    read = await asyncio.gather(*(one(*target) for target in targets))
    if any(f is None for f in read):
        return None
    return tuple(f for f in read if f is not None)


def labels_of(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod.get("metadata", {}).get("labels") or {})
