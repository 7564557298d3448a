"""The prefill→decode KV handoff's bytes are pinned: prefill and decode engines of different kvgate
versions must interoperate, so the wire header, the keys' and values' bytes and their adler32 may
not change. The pinned values were computed with the torch reference engine (before the numpy
port) and must hold for every later implementation.

Each case runs the engine's own path: the model's keys and values are written to a paged pool,
read back (freed pages keep their old contents, so case ``stale`` reads another request's data),
built into a payload and served by the bootstrap server to a plain socket client.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from collections.abc import AsyncIterator

import pytest
from conftest import free_port, loopback_host
from kvgate_engine.reference.kv_pool import PagedKVPool
from kvgate_engine.reference.model import K_DIM, V_DIM, CopyAttentionModel
from kvgate_engine.reference.transfer import (
    BootstrapServer,
    KVPayload,
    Rendezvous,
    adler32,
    receive_kv,
)

VOCAB = 32_000


def _short() -> KVPayload:
    model = CopyAttentionModel(VOCAB)
    pool = PagedKVPool(num_pages=64, page_size=1, k_dim=K_DIM, v_dim=V_DIM)
    tokens = [1, 2, 3, 4, 5]
    slots = pool.slots(pool.alloc(len(tokens)), len(tokens))
    pool.write(slots, *model.kv(tokens))
    return KVPayload.build(*pool.read(slots), with_checksum=True)


def _stale() -> KVPayload:
    """A 300-token request freed; the next one writes 130 of the 300 slots it reads."""
    model = CopyAttentionModel(VOCAB)
    pool = PagedKVPool(num_pages=128, page_size=16, k_dim=K_DIM, v_dim=V_DIM)
    earlier = [(i * 7919) % VOCAB for i in range(300)]
    pages = pool.alloc(len(earlier))
    pool.write(pool.slots(pages, len(earlier)), *model.kv(earlier))
    pool.free(pages)
    pages = pool.alloc(len(earlier))
    slots = pool.slots(pages, len(earlier))
    later = [31_999 - i for i in range(130)]
    pool.write(slots[: len(later)], *model.kv(later, start_position=17))
    return KVPayload.build(*pool.read(slots), with_checksum=True)


def _grown() -> KVPayload:
    """Slots on both sides of the first 4,096 materialised ones: the pool grew, its data moved."""
    model = CopyAttentionModel(VOCAB)
    pool = PagedKVPool(num_pages=10_000, page_size=1, k_dim=K_DIM, v_dim=V_DIM)
    first = [(i * 31) % VOCAB for i in range(4_000)]
    pool.write(pool.slots(pool.alloc(len(first)), len(first)), *model.kv(first))
    second = list(range(500))
    pool.write(pool.slots(pool.alloc(len(second)), len(second)), *model.kv(second, 1_000_003))
    return KVPayload.build(
        *pool.read(pool.slots(list(range(3_900, 4_500)), 600)), with_checksum=True
    )


# case → (adler32, sha256 of k bytes + v bytes, k_nbytes, v_nbytes); computed with torch 2.15.0
PINNED = {
    "short": (
        116856949,
        "e545ad898c9c8e40ad83317981110fc354cddd45229a0e6984ada546642baf39",
        160,
        80,
    ),
    "stale": (
        951803059,
        "ca4e860edf1680a9c71afb9390521f8a860ca1854f40bd1096d988a4e3244b92",
        9600,
        4800,
    ),
    "grown": (
        1106971026,
        "fe6015222f96fcd997d93f73947d6e6a693054e08417901b8570c1bdcb50e54a",
        19200,
        9600,
    ),
}
CASES = {"short": _short, "stale": _stale, "grown": _grown}


@contextlib.asynccontextmanager
async def _bootstrap() -> AsyncIterator[tuple[Rendezvous, str, int]]:
    """A prefill's bootstrap server on a loopback port: its rendezvous, host and port."""
    host = loopback_host()
    port = free_port(host)
    rendezvous = Rendezvous()
    server = BootstrapServer(rendezvous, wait_timeout=10)
    await server.start(host, port)
    try:
        yield rendezvous, host, port
    finally:
        await server.close()


async def _serve_and_read(payload: KVPayload, room: int) -> tuple[dict[str, object], bytes]:
    """Offer ``payload`` on a bootstrap server; read the wire answer as a decode engine would."""
    async with _bootstrap() as (rendezvous, host, port):
        delivered = rendezvous.offer(room, payload)
        reader, writer = await asyncio.open_connection(host, port)
        try:
            writer.write(json.dumps({"room": room, "reserved_tokens": 1}).encode() + b"\n")
            await writer.drain()
            header = json.loads(await asyncio.wait_for(reader.readline(), 10))
            size = int(header["k_nbytes"]) + int(header["v_nbytes"])
            body = await asyncio.wait_for(reader.readexactly(size), 10)
            writer.write(b'{"status": "received"}\n')
            await writer.drain()
            await asyncio.wait_for(delivered, 10)
        finally:
            writer.close()
            await writer.wait_closed()
        return header, body


@pytest.mark.parametrize("case", sorted(CASES))
async def test_kv_payload_wire_bytes_and_checksum_are_the_pinned_ones(case: str) -> None:
    payload = CASES[case]()
    header, body = await _serve_and_read(payload, room=7)
    checksum, digest, k_nbytes, v_nbytes = PINNED[case]
    assert header == {
        "status": "ok",
        "room": 7,
        "num_tokens": k_nbytes // (8 * K_DIM),
        "k_dim": K_DIM,
        "v_dim": V_DIM,
        "k_nbytes": k_nbytes,
        "v_nbytes": v_nbytes,
        "checksum": checksum,
    }
    assert hashlib.sha256(body).hexdigest() == digest
    assert payload.checksum == checksum


async def test_a_received_payload_is_what_the_prefill_offered_and_passes_its_checksum() -> None:
    offered = _stale()
    async with _bootstrap() as (rendezvous, host, port):
        rendezvous.offer(11, offered)
        received = await receive_kv(host, port, 11, offered.num_tokens, timeout=10)
    assert received.num_tokens == offered.num_tokens == 300
    # The later request's 130 tokens, then the earlier request's stale ones, verbatim.
    earlier = [(i * 7919) % VOCAB for i in range(300)]
    assert received.v[:, 0].tolist() == [31_999 - i for i in range(130)] + earlier[130:]
    assert received.k.tolist() == offered.k.tolist()
    assert received.v.tolist() == offered.v.tolist()
    assert received.checksum == offered.checksum == adler32(received.k, received.v)
