"""A real aiohttp server on 127.0.0.1 for tests that need an HTTP peer (an engine, a router)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serving_app(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on a free 127.0.0.1 port; yields its base URL, stops it on exit."""
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
