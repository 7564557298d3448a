"""Multi-node reference engines: ranks 1..N-1 join rank 0 over TCP at ``--dist-init-addr``.

What SGLang's multi-node start-up looks like from outside, and all kvgate relies on:

- **Rank 0 (the leader)** listens at the ``--dist-init-addr`` port and waits until every rank
  1..N-1 has joined before it serves anything: SGLang starts its HTTP server only after the
  schedulers of all ranks initialised torch.distributed together, so until then ``/health`` and
  ``/server_info`` do not answer at all. Only rank 0 serves HTTP (and, for prefill, the KV
  bootstrap server).
- **Ranks >= 1** connect to rank 0 (retrying while it starts, up to the watchdog timeout),
  announce themselves and then hold the connection; they serve nothing.
- **A rank that leaves ends the engine.** NCCL cannot replace a member of a running
  communicator: when any rank's connection drops, the leader exits with an error, and a rank
  whose leader goes away exits too. (Kubernetes then restarts the container, and
  LeaderWorkerSet's RecreateGroupOnPodRestart recreates the whole group.)

**The pool model.** Tensor parallelism across nodes shards every token's KV by attention head:
each of the ``tp_size`` GPUs (on whichever node) holds its share of the same tokens, so the pool
the engine holds, and rank 0 reports, is the per-GPU token capacity computed for ``tp_size``
GPUs: exactly the single-node arithmetic with ``--tp-size`` the total over all nodes. Adding
nodes at a fixed ``--tp-size`` does not grow the pool; a larger ``--tp-size`` does (fewer weights
and fewer KV heads per GPU).

The protocol (one JSON line each way): rank -> leader ``{"rank": r, "nnodes": n, "tp_size": t}``;
leader -> rank ``{"ok": true}`` or ``{"ok": false, "error": "..."}`` and the connection closes.
After ``ok`` the leader may send more lines to a rank: ``{"canary": "corrupt"}`` (tests only,
``POST /kvgate/canary/corrupt`` with ``{"rank": r}``) corrupts a slot of that rank, whose own KV
canary then logs the violation, as each of SGLang's ranks does in its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("kvgate_engine.reference.ranks")

RETRY_SECONDS = 0.2


class RankError(Exception):
    """A rank could not join, or the group lost a rank."""


def split_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port); ValueError naming the value."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--dist-init-addr {addr!r} must be host:port, e.g. 10.0.0.2:20000")
    return host.strip("[]"), int(port)


@dataclass
class RankServer:
    """Rank 0's side: accept every other rank, then watch that none leaves."""

    nnodes: int
    tp_size: int
    joined: asyncio.Event = field(default_factory=asyncio.Event)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    lost_reason: str = ""
    _ranks: dict[int, asyncio.StreamWriter] = field(default_factory=dict)
    _server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)
        log.info("rank 0 waiting for ranks 1..%d at %s:%d", self.nnodes - 1, host, port)

    def ranks(self) -> list[int]:
        return sorted(self._ranks)

    async def _refuse(self, writer: asyncio.StreamWriter, error: str) -> None:
        log.warning("refused a rank: %s", error)
        writer.write((json.dumps({"ok": False, "error": error}) + "\n").encode())
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            hello = json.loads(await reader.readline() or b"null")
        except (ValueError, ConnectionError):
            hello = None
        if not isinstance(hello, dict):
            await self._refuse(writer, "expected one JSON line {rank, nnodes, tp_size}")
            return
        rank, nnodes, tp = hello.get("rank"), hello.get("nnodes"), hello.get("tp_size")
        if (nnodes, tp) != (self.nnodes, self.tp_size):
            await self._refuse(
                writer,
                f"rank {rank} runs --nnodes {nnodes} --tp-size {tp}, rank 0 runs "
                f"--nnodes {self.nnodes} --tp-size {self.tp_size}",
            )
            return
        if not isinstance(rank, int) or not 1 <= rank < self.nnodes:
            await self._refuse(writer, f"--node-rank {rank} is not one of 1..{self.nnodes - 1}")
            return
        if rank in self._ranks or self.joined.is_set():
            await self._refuse(writer, f"rank {rank} already joined this engine")
            return
        self._ranks[rank] = writer
        writer.write(b'{"ok": true}\n')
        await writer.drain()
        log.info("rank %d joined (%d of %d ranks)", rank, len(self._ranks) + 1, self.nnodes)
        if len(self._ranks) == self.nnodes - 1:
            self.joined.set()
        await reader.read()  # a rank never sends more: EOF means it is gone
        if not self.lost.is_set():
            self.lost_reason = f"rank {rank} left the engine (its connection closed)"
            self.lost.set()

    async def send(self, rank: int, message: dict[str, Any]) -> bool:
        """One JSON line to a joined rank; False when it is not (or no longer) connected."""
        writer = self._ranks.get(rank)
        if writer is None or writer.is_closing():
            return False
        writer.write((json.dumps(message) + "\n").encode())
        try:
            await writer.drain()
        except ConnectionError:
            return False
        return True

    async def close(self) -> None:
        for writer in self._ranks.values():
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def join(
    addr: str,
    rank: int,
    nnodes: int,
    tp_size: int,
    deadline_seconds: float,
    on_message: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Rank ``rank``'s side: join rank 0 at ``addr`` (retrying until the deadline), hand each
    later line from the leader to ``on_message``, and return when the leader goes away (raises
    RankError when it refuses or never answers)."""
    host, port = split_addr(addr)
    deadline = time.monotonic() + deadline_seconds
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port)
            break
        except OSError as error:
            if time.monotonic() >= deadline:
                raise RankError(
                    f"rank 0 at {addr} did not answer within {deadline_seconds:g} s: {error}"
                ) from None
            await asyncio.sleep(RETRY_SECONDS)
    writer.write((json.dumps({"rank": rank, "nnodes": nnodes, "tp_size": tp_size}) + "\n").encode())
    await writer.drain()
    try:
        answer = json.loads(await reader.readline() or b"null")
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or answer.get("ok") is not True:
        reason = answer.get("error") if isinstance(answer, dict) else "no answer"
        raise RankError(f"rank 0 at {addr} refused rank {rank}: {reason}")
    log.info("rank %d joined rank 0 at %s", rank, addr)
    while line := await reader.readline():  # held until the leader goes away
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if isinstance(message, dict) and on_message is not None:
            on_message(message)
    writer.close()
