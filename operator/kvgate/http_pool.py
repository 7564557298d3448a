"""The operator's HTTP client to engines and routers: one session whose connections are kept
alive between reads of the same pod (its periodic re-verification, its router's audit).

Opening a TCP connection per read (two per probe) cost a fifth of the operator's CPU with 8,000
engines (py-spy in the scale benchmark, issue 16). ``KEEPALIVE_SECONDS`` outlasts the default
re-verify interval (30 s, spread 0-20 % earlier) so each engine's next read reuses its
connection; a pod that is gone or restarted breaks it, and the read opens a new one. Cookies
are never kept: what one engine sets must not reach another.
"""

from __future__ import annotations

import resource

import aiohttp

KEEPALIVE_SECONDS = 75.0


def new_session() -> aiohttp.ClientSession:
    """A session for untrusted peers: no connection cap (callers bound their reads), idle
    connections kept ``KEEPALIVE_SECONDS``, no cookie jar."""
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_SECONDS)
    return aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar())


def raise_open_files_limit() -> int:
    """Raise the soft open-files limit to the hard one (a kept-alive connection per engine is
    8,000 sockets with 1,000 ModelDeployments; soft limits are often 1,024). Returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            return soft
    return hard
