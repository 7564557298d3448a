"""GET one JSON document from a server kvgate does not trust (an engine pod, a router pod).

Whoever can edit a pod in the namespace decides what its address answers, so every read here is
bounded and nothing the server sent is ever copied into a message:

- **No redirects.** A 3xx is an answer kvgate cannot use (``Unreadable``); following it would let
  the pod make the operator fetch any address it can reach (read-back SSRF).
- **Bodies are capped.** The body is streamed and counted, and the read stops at the cap. A
  ``Content-Length`` above the cap is refused before reading. ``Accept-Encoding: identity`` and no
  automatic decompression: the count is of the bytes that arrive.
- **Parse cost is capped.** Before parsing, the body's structural characters are counted (``,``,
  ``[`` and ``{``, also inside strings, so an upper bound of its JSON values); above
  ``max_values`` it is refused unparsed. CPython's ``json`` spends up to ~27x a body's size on
  ``[{},{},...]``; the value cap bounds the parsed objects, not just the bytes. Nesting beyond the
  interpreter's recursion limit is refused too.
- **One deadline per request** covers connecting, the headers and the whole body, so a server that
  trickles its body (slowloris) is cut off at ``timeout``.
- **Messages name what failed** (the URL kvgate built, the HTTP status, a cap, a byte count),
  never the body, a header, the reason phrase or an exception text that quotes what the server
  sent (aiohttp's parser errors quote the offending line).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import aiohttp

MiB = 2**20
# A real value in SGLang's /server_info averages ~27 bytes (2,485 bytes and 94 counted values for
# the reference engine; ~800 keys in ~40 KB for SGLang 0.5.23): a cap of one value per 16 bytes
# lets every real document reach the byte cap first, and refuses documents made of tiny values.
BYTES_PER_VALUE = 16


@dataclass(frozen=True)
class BodyLimits:
    """How much kvgate reads and parses of one answer."""

    max_bytes: int
    max_values: int

    @classmethod
    def for_bytes(cls, max_bytes: int) -> BodyLimits:
        return cls(max_bytes, max_bytes // BYTES_PER_VALUE)


class FetchError(Exception):
    """A GET that gave no usable JSON. ``str()`` is safe to show: it holds no server bytes."""


class Unreachable(FetchError):
    """No answer: connection failed, deadline passed, or a 5xx (worth retrying)."""


class Unreadable(FetchError):
    """An answer kvgate cannot use: a redirect, a 4xx, over a cap, or not JSON (final)."""


class Unauthorized(Unreadable):
    """HTTP 401/403: the engine wants credentials kvgate did not send, or refused them."""


class NotFound(FetchError):
    """HTTP 404: the route does not exist on this server."""


def size_text(n: int) -> str:
    """``4 MiB`` for whole MiB, else ``1,234 bytes``."""
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n:,} bytes"


def client_error_text(exc: BaseException) -> str:
    """What went wrong, in words that cannot carry server bytes.

    aiohttp's own texts can quote the server (``Bad status line: b'...'``, invalid header values),
    so only the exception class is named, plus the operating system's words for a failed connect.
    """
    if isinstance(exc, aiohttp.ClientConnectorError):
        reason = exc.os_error.strerror or type(exc.os_error).__name__
        return f"cannot connect ({reason})"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server closed the connection before answering"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "response body broken off (ClientPayloadError)"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"not a valid HTTP response ({type(exc).__name__})"
    return type(exc).__name__


def count_values(body: bytes | bytearray) -> int:
    """An upper bound of the JSON values in ``body`` (structural characters, strings included)."""
    return body.count(b",") + body.count(b"[") + body.count(b"{") + 1


def decode_json(body: bytes | bytearray, limits: BodyLimits, where: str) -> object:
    """Parse a body within ``limits``; raises Unreadable. Pure."""
    values = count_values(body)
    if values > limits.max_values:
        raise Unreadable(
            f"{where}: refused unparsed: {values:,} JSON values or more in {len(body):,} bytes, "
            f"above the cap of {limits.max_values:,}"
        )
    try:
        return json.loads(body)
    except RecursionError as exc:
        raise Unreadable(f"{where}: not usable JSON (nested too deeply)") from exc
    except json.JSONDecodeError as exc:
        # exc.msg is the json module's own words ("Expecting value"), never body text.
        raise Unreadable(f"{where}: not JSON ({exc.msg}, {len(body):,} bytes)") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise Unreadable(f"{where}: not JSON ({len(body):,} bytes)") from exc


async def read_bounded(stream: aiohttp.StreamReader, limit: int) -> bytes:
    """A body until its end or ``limit`` bytes, whichever comes first (a caller that reads
    ``max + 1`` knows that more than ``max`` came). ``stream.read(n)`` alone is not that: it
    returns as soon as any bytes are there, so of a streamed answer only its first event."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await stream.read(min(limit - size, 64 * 1024))
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


async def _read_capped(response: aiohttp.ClientResponse, max_bytes: int, where: str) -> bytes:
    too_big = f"{where}: body larger than the {size_text(max_bytes)} cap; kvgate reads no further"
    if response.content_length is not None and response.content_length > max_bytes:
        raise Unreadable(too_big)
    body = await read_bounded(response.content, max_bytes + 1)
    if len(body) > max_bytes:
        raise Unreadable(too_big)
    return body


def _status_error(where: str, status: int) -> FetchError:
    if status == 404:
        return NotFound(f"{where}: HTTP 404")
    if 300 <= status < 400:
        return Unreadable(f"{where}: HTTP {status} redirect, not followed (kvgate follows none)")
    if status >= 500:
        return Unreachable(f"{where}: HTTP {status}")
    if status in (401, 403):
        return Unauthorized(f"{where}: HTTP {status}")
    return Unreadable(f"{where}: HTTP {status}")


async def get_json(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout: float,
    limits: BodyLimits,
    headers: Mapping[str, str] | None = None,
    project: Callable[[object], object] | None = None,
) -> object:
    """``GET url`` and parse its JSON within ``limits`` and one ``timeout`` for all of it.

    ``project`` reduces the parsed document to what the caller keeps; it runs before this returns
    (no await in between), so a large parsed document never outlives its own parse. Raises
    Unreachable, Unreadable or NotFound; their messages never contain server bytes.
    """
    where = f"GET {url}"
    try:
        async with (
            asyncio.timeout(timeout),
            session.get(
                url,
                allow_redirects=False,
                auto_decompress=False,
                headers={**(headers or {}), "Accept-Encoding": "identity"},
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response,
        ):
            if response.status != 200:
                raise _status_error(where, response.status)  # the body is never read
            body = await _read_capped(response, limits.max_bytes, where)
    except TimeoutError as exc:
        raise Unreachable(f"{where}: no answer within {timeout:g} s") from exc
    except aiohttp.ClientError as exc:
        raise Unreachable(f"{where}: {client_error_text(exc)}") from exc
    except ValueError as exc:  # yarl/aiohttp on a URL kvgate built badly
        raise Unreachable(f"{where}: {type(exc).__name__}") from exc
    doc = decode_json(body, limits, where)
    del body
    return project(doc) if project is not None else doc
