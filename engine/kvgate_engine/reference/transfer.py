"""The prefill→decode KV handoff over plain TCP, keyed by ``bootstrap_room``.

The prefill engine listens on ``--disaggregation-bootstrap-port``. A decode engine that has
reserved pages for a request connects to the ``bootstrap_host``/``bootstrap_port`` it was given
and asks for the room; the prefill sends the room's keys and values once it has computed them,
and the decode acknowledges. Wire format (one connection per room):

    decode  → prefill  {"room": R, "reserved_tokens": N}\\n
    prefill → decode   {"status": "ok", "num_tokens": n, "k_dim", "v_dim", "k_nbytes",
                        "v_nbytes", "checksum": adler32 | null}\\n  <k bytes><v bytes>
                   or  {"status": "abort", "message": ..., "status_code": ...}\\n
    decode  → prefill  {"status": "received"}\\n

A dropped connection on either side is an abort. The port also answers ``GET /health`` with
``OK``, like SGLang's bootstrap server, so TCP and HTTP health checks both work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's marker for warm-up/health requests: no real transfer
log = logging.getLogger("kvgate_engine.reference.transfer")


@dataclass(frozen=True)
class KVPayload:
    num_tokens: int
    k: NDArray[np.float64]
    v: NDArray[np.float64]
    checksum: int | None

    @staticmethod
    def build(k: NDArray[np.float64], v: NDArray[np.float64], *, with_checksum: bool) -> KVPayload:
        k, v = np.ascontiguousarray(k), np.ascontiguousarray(v)
        checksum = adler32(k, v) if with_checksum else None
        return KVPayload(int(k.shape[0]), k, v, checksum)


@dataclass(frozen=True)
class TransferAbort:
    message: str
    status: int


class TransferError(Exception):
    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


def adler32(k: NDArray[np.float64], v: NDArray[np.float64]) -> int:
    """Adler-32 over the transferred keys then values (SGLang checksums each request's pages)."""
    value = zlib.adler32(np.ascontiguousarray(k).tobytes())
    return zlib.adler32(np.ascontiguousarray(v).tobytes(), value)


@dataclass
class _Room:
    payload: asyncio.Future[KVPayload | TransferAbort]
    delivered: asyncio.Future[None]
    expiry: asyncio.TimerHandle | None = field(default=None)


class Rendezvous:
    """Where a prefill request's KV waits for the decode engine that asks for its room."""

    def __init__(self, *, abort_ttl: float = 300.0) -> None:
        self._rooms: dict[int, _Room] = {}
        self._abort_ttl = abort_ttl

    def _room(self, room: int) -> _Room:
        entry = self._rooms.get(room)
        if entry is None:
            loop = asyncio.get_running_loop()
            entry = _Room(loop.create_future(), loop.create_future())
            self._rooms[room] = entry
        return entry

    def offer(self, room: int, payload: KVPayload) -> asyncio.Future[None]:
        """Publish a room's KV; the future resolves once a decode engine acknowledged it."""
        entry = self._room(room)
        if not entry.payload.done():
            entry.payload.set_result(payload)
        return entry.delivered

    def abort(self, room: int, message: str, status: int) -> None:
        """Tell the decode engine of this room (now or when it asks) that there is no KV."""
        entry = self._room(room)
        if not entry.payload.done():
            entry.payload.set_result(TransferAbort(message, status))
        if entry.expiry is None:
            entry.expiry = asyncio.get_running_loop().call_later(
                self._abort_ttl, self._drop, room, entry
            )

    def forget(self, room: int) -> None:
        entry = self._rooms.get(room)
        if entry is not None and not isinstance(_result(entry.payload), TransferAbort):
            self._drop(room, entry)

    def _drop(self, room: int, entry: _Room) -> None:
        if self._rooms.get(room) is entry:
            del self._rooms[room]
        if entry.expiry is not None:
            entry.expiry.cancel()
        for future in (entry.payload, entry.delivered):
            if not future.done():
                future.cancel()

    async def take(self, room: int, timeout: float) -> KVPayload | TransferAbort:
        entry = self._room(room)
        try:
            return await asyncio.wait_for(asyncio.shield(entry.payload), timeout)
        except TimeoutError:
            self._drop(room, entry)
            return TransferAbort(
                f"no prefill request arrived for bootstrap_room {room} within {timeout:g} s", 500
            )
        except asyncio.CancelledError:
            if entry.payload.cancelled():
                return TransferAbort(f"prefill of bootstrap_room {room} was aborted", 500)
            raise

    def delivered(self, room: int, error: str | None) -> None:
        entry = self._rooms.get(room)
        if entry is None or entry.delivered.done():
            return
        if error is None:
            entry.delivered.set_result(None)
        else:
            entry.delivered.set_exception(TransferError(error))

    @property
    def pending_rooms(self) -> int:
        return len(self._rooms)


def _result(future: asyncio.Future[Any]) -> Any:
    return future.result() if future.done() and not future.cancelled() else None


class BootstrapServer:
    """The prefill side's TCP listener on the bootstrap port."""

    def __init__(self, rendezvous: Rendezvous, *, wait_timeout: float) -> None:
        self._rendezvous = rendezvous
        self._wait_timeout = wait_timeout
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        room: int | None = None
        try:
            line = await asyncio.wait_for(reader.readline(), self._wait_timeout)
            if line.startswith((b"GET ", b"HEAD ")):
                await _answer_http_health(reader, writer)
                return
            request = json.loads(line)
            room = int(request["room"])
            result = await self._rendezvous.take(room, self._wait_timeout)
            if isinstance(result, TransferAbort):
                header = {
                    "status": "abort",
                    "message": result.message,
                    "status_code": result.status,
                }
                writer.write(json.dumps(header).encode() + b"\n")
                await writer.drain()
                return
            k_bytes = result.k.tobytes()
            v_bytes = result.v.tobytes()
            header = {
                "status": "ok",
                "room": room,
                "num_tokens": result.num_tokens,
                "k_dim": int(result.k.shape[1]),
                "v_dim": int(result.v.shape[1]),
                "k_nbytes": len(k_bytes),
                "v_nbytes": len(v_bytes),
                "checksum": result.checksum,
            }
            writer.write(json.dumps(header).encode() + b"\n" + k_bytes + v_bytes)
            await writer.drain()
            ack = await asyncio.wait_for(reader.readline(), self._wait_timeout)
            if json.loads(ack or b"{}").get("status") != "received":
                raise TransferError(f"decode did not acknowledge bootstrap_room {room}")
            self._rendezvous.delivered(room, None)
        except (OSError, ValueError, KeyError, TimeoutError, TransferError) as error:
            log.warning("KV transfer for bootstrap_room %s failed: %s", room, error)
            if room is not None:
                self._rendezvous.delivered(room, f"KV transfer to decode failed: {error}")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def _answer_http_health(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
        pass
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK")
    await writer.drain()


async def receive_kv(
    host: str, port: int, room: int, reserved_tokens: int, *, timeout: float
) -> KVPayload:
    """Decode side: ask the prefill's bootstrap server for a room's KV (raises TransferError)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError) as error:
        raise TransferError(
            f"cannot reach the prefill bootstrap server at {host}:{port} for bootstrap_room "
            f"{room}: {error or 'timed out'}"
        ) from error
    try:
        request = {"room": room, "reserved_tokens": reserved_tokens}
        writer.write(json.dumps(request).encode() + b"\n")
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
        if not line:
            raise TransferError(f"prefill closed the connection for bootstrap_room {room}")
        header = json.loads(line)
        if header.get("status") == "abort":
            raise TransferError(str(header["message"]), int(header.get("status_code", 500)))
        k_bytes = await asyncio.wait_for(reader.readexactly(int(header["k_nbytes"])), timeout)
        v_bytes = await asyncio.wait_for(reader.readexactly(int(header["v_nbytes"])), timeout)
        writer.write(b'{"status": "received"}\n')
        await writer.drain()
    except (OSError, ValueError, KeyError, TimeoutError, asyncio.IncompleteReadError) as error:
        raise TransferError(
            f"KV transfer for bootstrap_room {room} from {host}:{port} failed: "
            f"{type(error).__name__} {error}"
        ) from error
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    num_tokens = int(header["num_tokens"])
    k = _tensor(k_bytes, num_tokens, int(header["k_dim"]))
    v = _tensor(v_bytes, num_tokens, int(header["v_dim"]))
    checksum = header.get("checksum")
    return KVPayload(num_tokens, k, v, int(checksum) if checksum is not None else None)


def _tensor(raw: bytes, rows: int, cols: int) -> NDArray[np.float64]:
    if rows * cols * 8 != len(raw):
        raise TransferError(f"KV payload of {len(raw):,} bytes does not hold {rows:,} × {cols}")
    if not raw:
        return np.zeros((rows, cols), dtype=np.float64)
    # Native byte order, as the sender's tobytes() wrote it (torch's frombuffer did the same).
    return np.frombuffer(bytearray(raw), dtype=np.float64).reshape(rows, cols)
