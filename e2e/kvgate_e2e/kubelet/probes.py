"""One probe of a container on the loopback kubelet: httpGet, tcpSocket or exec, as the kubelet's
prober runs them (an HTTP status from 200 to 399 passes; redirects are not followed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from kvgate_e2e.kubelet.podspec import PodSpecError, ProbeSettings, resolve_port

log = logging.getLogger("kvgate_e2e.kubelet")


async def probe_once(
    container: Mapping[str, Any],
    settings: ProbeSettings,
    *,
    pod_ip: str,
    session: aiohttp.ClientSession,
    env: Callable[[], Awaitable[Mapping[str, str]]],
) -> bool:
    """Run the probe once: True if it passes. ``env``: the container's environment, for exec."""
    handler = settings.handler
    try:
        if settings.kind == "httpGet":
            port = resolve_port(handler["port"], container)
            host = handler.get("host") or pod_ip
            scheme = str(handler.get("scheme") or "HTTP").lower()
            path = handler.get("path") or "/"
            headers = {h["name"]: h["value"] for h in handler.get("httpHeaders") or []}
            url = f"{scheme}://{host}:{port}{path}"
            async with session.get(
                url,
                headers=headers,
                ssl=False,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=settings.timeout),
            ) as resp:
                await resp.read()
                return 200 <= resp.status < 400
        if settings.kind == "tcpSocket":
            port = resolve_port(handler["port"], container)
            host = handler.get("host") or pod_ip
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), settings.timeout
            )
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True
        if settings.kind == "exec":
            child = await asyncio.create_subprocess_exec(
                *handler.get("command", []),
                env=dict(await env()),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            try:
                return await asyncio.wait_for(child.wait(), settings.timeout) == 0
            except TimeoutError:
                child.kill()
                await child.wait()
                return False
        log.warning(
            "container %s: %s probes are not supported; failing",
            container.get("name"),
            settings.kind,
        )
        return False
    except (OSError, TimeoutError, aiohttp.ClientError, PodSpecError, ValueError):
        return False
