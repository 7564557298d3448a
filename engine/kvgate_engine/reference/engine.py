"""Request handling for one engine process: admission, KV pool, handoff, generation.

Three roles, as ``--disaggregation-mode`` says:
- ``null``: prefill and decode in this process;
- ``prefill``: compute the prompt's KV into the pool and hand it to the decode engine that asks
  for the request's ``bootstrap_room`` on the bootstrap port; answer with one token;
- ``decode``: reserve pages for the whole prompt (plus the completion) first, then fetch the KV
  from the prefill, then generate. Its answer is what the client sees.

``incident`` switches the pre-0.5.21 rejection path on (see admission.py); the fixed path is the
default. ``admit_over_length`` (``KVGATE_ADMIT_OVER_LENGTH=1``) drops the tokenizer's and the
scheduler's length checks while the pool stays honest and large: the engine a pool check passes
and that still answers a prompt longer than its context with HTTP 200 and tokens (what kvgate's
content check at maximum length must catch). Decode still refuses what its pool cannot hold.
``stale_kv_after_abort`` (``KVGATE_REFERENCE_STALE_KV_AFTER_ABORT=1``, decode role) is an engine
whose abort path is broken: a decode request aborted by its client's disconnect frees its pages
at once but its KV transfer is never cancelled, and the transfer lands in those pages after the
next request (which took the same pages, lowest free first) received its own KV. That request
then decodes the aborted prompt: HTTP 200, wrong tokens (what the content check's abort step must
catch). The landing is made deterministic: always just before the next decode's first step.
``decode_step_seconds`` (``KVGATE_REFERENCE_DECODE_STEP_SECONDS``, e.g. 0.02) paces each decode
step as a GPU engine's per-token latency does (50 tokens/s a request): streams then last as long
as real ones at almost no CPU, which is what autoscaling and drain tests need.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvgate_engine.reference.admission import (
    PLACEHOLDER_INPUT,
    Rejection,
    decode_capacity_check,
    scheduler_check,
    tokenizer_check,
    transfer_incomplete,
)
from kvgate_engine.reference.canary import KvCanary
from kvgate_engine.reference.kv_pool import PagedKVPool
from kvgate_engine.reference.model import K_DIM, V_DIM, CopyAttentionModel
from kvgate_engine.reference.sizing import EngineLimits
from kvgate_engine.reference.transfer import (
    FAKE_BOOTSTRAP_HOST,
    KVPayload,
    Rendezvous,
    TransferError,
    adler32,
    receive_kv,
)

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's sampling_params default
DECODE_STEP_SECONDS = "KVGATE_REFERENCE_DECODE_STEP_SECONDS"
DEFAULT_BOOTSTRAP_PORT = 8998
STALE_KV_AFTER_ABORT = "KVGATE_REFERENCE_STALE_KV_AFTER_ABORT"
log = logging.getLogger("kvgate_engine.reference")


class GenerateError(Exception):
    """A request that ends in an HTTP error; ``message`` is what the client reads."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    @staticmethod
    def of(rejection: Rejection) -> GenerateError:
        return GenerateError(rejection.message, rejection.status)


Progress = Callable[[int], Awaitable[None]]  # one generated token, before the next step
# Writes the answer's last bytes (the result, or the error the client reads); the request counts
# in num_running_reqs until it returns, so a drain that reads 0 never cuts an answer.
Deliver = Callable[["GenerateResult | GenerateError"], Awaitable[None]]
# SGLang 0.5.23's default buckets of sglang:time_to_first_token_seconds (TokenizerMetricsCollector).
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)


@dataclass(frozen=True)
class GenerateRequest:
    rid: str
    input_ids: tuple[int, ...]
    max_new_tokens: int
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    # A streaming client's: each token but the last goes out as it is generated (SGLang streams
    # a decode a token at a time), which is also where a gone client's abort lands.
    progress: Progress | None = field(default=None, compare=False)
    deliver: Deliver | None = field(default=None, compare=False)
    stream: bool = False  # the client asked for a stream (SGLang's is_streaming label)
    created: float = field(default_factory=time.monotonic, compare=False)


@dataclass(frozen=True)
class GenerateResult:
    rid: str
    output_ids: list[int]
    prompt_tokens: int
    e2e_latency: float

    def meta_info(self) -> dict[str, Any]:
        return {
            "id": self.rid,
            "finish_reason": {"type": "length", "length": len(self.output_ids)},
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": 0,
            "e2e_latency": self.e2e_latency,
        }


@dataclass(frozen=True)
class EngineSettings:
    role: str  # "null" | "prefill" | "decode"
    version: str
    incident: bool
    kv_checksum: bool
    vocab_size: int
    bootstrap_timeout: float = 300.0  # SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT
    admit_over_length: bool = False  # KVGATE_ADMIT_OVER_LENGTH=1: no length admission
    waiting_timeout: float = 300.0  # SGLANG_DISAGGREGATION_WAITING_TIMEOUT
    kv_canary: bool = False  # --kv-canary log|raise: verify every slot a decode reads (canary.py)
    stale_kv_after_abort: bool = False  # KVGATE_REFERENCE_STALE_KV_AFTER_ABORT=1 (decode role)
    decode_step_seconds: float = 0.0  # KVGATE_REFERENCE_DECODE_STEP_SECONDS: per-token pace


@dataclass
class Histogram:
    """Cumulative bucket counts, as a Prometheus histogram exports them."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.buckets)
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.count += 1


@dataclass
class EngineCounters:
    num_requests: int = 0
    num_aborted_requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_transfer_failed_reqs: int = 0
    num_bootstrap_failed_reqs: int = 0
    num_running_reqs: int = 0
    num_queue_reqs: int = 0
    num_prefill_bootstrap_queue_reqs: int = 0
    num_prefill_inflight_queue_reqs: int = 0  # forward done, KV not yet collected by decode
    num_decode_prealloc_queue_reqs: int = 0
    num_decode_transfer_queue_reqs: int = 0
    last_gen_throughput: float = 0.0
    stale_reads: int = field(default=0)
    # by is_streaming; a decode or unified engine observes each request's first token once
    time_to_first_token: dict[bool, Histogram] = field(default_factory=dict)

    def observe_first_token(self, request: GenerateRequest) -> None:
        histogram = self.time_to_first_token.setdefault(request.stream, Histogram(TTFT_BUCKETS))
        histogram.observe(time.monotonic() - request.created)


def new_rid() -> str:
    return uuid.uuid4().hex


class ReferenceEngine:
    def __init__(self, settings: EngineSettings, limits: EngineLimits) -> None:
        self.settings = settings
        self.limits = limits
        self.model = CopyAttentionModel(settings.vocab_size)
        self.pool = PagedKVPool(
            num_pages=max(1, limits.num_pages), page_size=limits.page_size, k_dim=K_DIM, v_dim=V_DIM
        )
        self.rendezvous = Rendezvous(abort_ttl=settings.bootstrap_timeout)
        self.counters = EngineCounters()
        self._running: set[int] = set()  # the requests (by id()) num_running_reqs counts
        self._page_waiters: list[asyncio.Future[None]] = []
        self.canary = KvCanary() if settings.kv_canary else None
        # stale_kv_after_abort: the aborted request's slots and prompt, whose KV lands next
        self._stale_landing: tuple[NDArray[np.int64], list[int], str] | None = None
        self._fail_transfers = False  # faults.FAIL_TRANSFERS_PATH (KVGATE_REFERENCE_FAULTS=1)

    def fail_every_transfer(self) -> None:
        """Injected fault (tests): from now on every KV transfer this decode receives fails its
        checksum, as SGLang's decode reports one."""
        self._fail_transfers = True

    # -- health ---------------------------------------------------------------------------------

    def health_forward(self) -> bool:
        """A one-token forward pass on scratch tensors (it never touches the pool's pages)."""
        keys, values = self.model.kv([0])
        return self.model.decode_step(0, keys, values) == 0

    # -- pages ----------------------------------------------------------------------------------

    async def _reserve(self, num_tokens: int, *, waiting_queue: bool = True) -> list[int]:
        """Pages for ``num_tokens``, waiting for them if need be. The wait counts in
        num_queue_reqs (SGLang's waiting queue admits a prefill or unified request by memory)
        unless ``waiting_queue`` is False: a decode waits in its prealloc queue instead."""
        deadline = time.monotonic() + self.settings.waiting_timeout
        queued = 1 if waiting_queue else 0
        self.counters.num_queue_reqs += queued
        try:
            while self.pool.pages_for(num_tokens) > self.pool.free_pages:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise GenerateError(
                        f"KV pool exhausted: {num_tokens:,} tokens needed, "
                        f"{self.pool.free_pages * self.pool.page_size:,} free after waiting "
                        f"{self.settings.waiting_timeout:g} s",
                        status=503,
                    )
                waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._page_waiters.append(waiter)
                try:
                    await asyncio.wait_for(waiter, remaining)
                except TimeoutError:
                    continue
            return self.pool.alloc(num_tokens)
        finally:
            self.counters.num_queue_reqs -= queued

    def _release(self, pages: list[int]) -> None:
        self.pool.free(pages)
        waiters, self._page_waiters = self._page_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- generation -----------------------------------------------------------------------------

    def _start_running(self, request: GenerateRequest) -> None:
        if id(request) not in self._running:
            self._running.add(id(request))
            self.counters.num_running_reqs += 1

    def _stop_running(self, request: GenerateRequest) -> None:
        if id(request) in self._running:
            self._running.discard(id(request))
            self.counters.num_running_reqs -= 1

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate, then hand the outcome to ``request.deliver`` while the request still counts
        as running: a decode (or unified) request counts from its first decode step until its
        answer's last bytes are written, with no gap between the two. A request whose client went
        away (its handler cancelled, or a write to it failed) counts in num_aborted_requests, as
        SGLang's tokenizer counts ``sglang:num_aborted_requests_total`` in ``abort_request``; a
        request the engine refused (a GenerateError) does not, as in SGLang."""
        started = time.monotonic()
        self.counters.num_requests += 1
        self.counters.prompt_tokens += len(request.input_ids)
        try:
            outcome: GenerateResult | GenerateError
            try:
                output = await self._generate(request)
            except GenerateError as error:
                outcome = error
            else:
                elapsed = time.monotonic() - started
                self.counters.generation_tokens += len(output)
                if elapsed > 0:
                    self.counters.last_gen_throughput = len(output) / elapsed
                outcome = GenerateResult(request.rid, output, len(request.input_ids), elapsed)
            if request.deliver is not None:
                self._start_running(request)
                await request.deliver(outcome)
        except (asyncio.CancelledError, ConnectionError):  # the client went away: an abort
            self.counters.num_aborted_requests += 1
            raise
        finally:
            self._stop_running(request)
        if isinstance(outcome, GenerateError):
            raise outcome
        return outcome

    async def _generate(self, request: GenerateRequest) -> list[int]:
        limits = self.limits
        role = self.settings.role
        input_len = len(request.input_ids)
        lenient = self.settings.admit_over_length
        rejected = (
            None
            if lenient
            else tokenizer_check(input_len, request.max_new_tokens, limits.context_length)
        )
        if rejected is not None:
            self._retire_room(request, rejected)
            raise GenerateError.of(rejected)
        tokens = list(request.input_ids)
        aborted = None if lenient else scheduler_check(input_len, limits.max_req_input_len)
        if aborted is not None:
            if not self.settings.incident or role == "null":
                # Fixed path (0.5.21+): retired before any queue, so no handoff starts.
                self._retire_room(request, aborted)
                raise GenerateError.of(aborted)
            # SGLang <= 0.5.19: set_finish_with_abort swaps in a placeholder and the request
            # still enters the PD queues; it is reported as aborted only at the end.
            log.error(
                "%s (rid=%s); continuing with a placeholder input", aborted.message, request.rid
            )
            tokens = list(PLACEHOLDER_INPUT)
        if role == "prefill":
            output = await self._prefill(request, tokens)
        elif role == "decode":
            output = await self._decode(request, tokens)
        else:
            output = await self._unified(request, tokens)
        if aborted is not None:
            raise GenerateError.of(aborted)
        return output

    def _retire_room(self, request: GenerateRequest, rejection: Rejection) -> None:
        """A prefill that rejects a request tells the paired decode at once (no stale wait)."""
        if self.settings.role == "prefill" and request.bootstrap_room is not None:
            self.rendezvous.abort(request.bootstrap_room, rejection.message, rejection.status)

    async def _unified(self, request: GenerateRequest, tokens: list[int]) -> list[int]:
        pages = await self._reserve(len(tokens) + request.max_new_tokens)
        try:
            slots = self.pool.slots(pages, len(tokens))
            keys, values = self.model.kv(tokens)
            self.pool.write(slots, keys, values)
            self._start_running(request)  # generate() stops it once the answer is out
            return await self._decode_loop(pages, len(tokens), request)
        finally:
            self._release(pages)

    async def _prefill(self, request: GenerateRequest, tokens: list[int]) -> list[int]:
        fake = request.bootstrap_host == FAKE_BOOTSTRAP_HOST
        room = request.bootstrap_room
        if room is None and not fake:
            raise GenerateError(
                "prefill mode needs bootstrap_room (and bootstrap_host) in the request; "
                "send it through the PD router, or use bootstrap_host 2.2.2.2 for a local test"
            )
        self.counters.num_prefill_bootstrap_queue_reqs += 1
        try:
            pages = await self._reserve(len(tokens))
        finally:
            self.counters.num_prefill_bootstrap_queue_reqs -= 1
        try:
            # The forward: running (SGLang counts a prefill's forward batch), then, while its KV
            # waits for the decode, in the inflight queue instead.
            self._start_running(request)
            slots = self.pool.slots(pages, len(tokens))
            keys, values = self.model.kv(tokens)
            self.pool.write(slots, keys, values)
            keys, values = self.pool.read(slots)
            first = self.model.decode_step(0, keys, values)
            self._stop_running(request)
            if fake or room is None:
                return [first]
            payload = KVPayload.build(keys, values, with_checksum=self.settings.kv_checksum)
            delivered = self.rendezvous.offer(room, payload)
            self.counters.num_prefill_inflight_queue_reqs += 1
            try:
                await asyncio.wait_for(asyncio.shield(delivered), self.settings.bootstrap_timeout)
            except TimeoutError as error:
                self.counters.num_bootstrap_failed_reqs += 1
                raise GenerateError(
                    f"no decode engine collected the KV of bootstrap_room {room} within "
                    f"{self.settings.bootstrap_timeout:g} s",
                    status=500,
                ) from error
            except TransferError as error:
                self.counters.num_transfer_failed_reqs += 1
                raise GenerateError(error.message, 500) from error
            finally:
                self.counters.num_prefill_inflight_queue_reqs -= 1
            return [first]
        except asyncio.CancelledError:
            if room is not None:
                self.rendezvous.abort(room, f"prefill request {request.rid} was aborted", 500)
            raise
        finally:
            if room is not None:
                self.rendezvous.forget(room)
            self._release(pages)

    async def _decode(self, request: GenerateRequest, tokens: list[int]) -> list[int]:
        fake = request.bootstrap_host == FAKE_BOOTSTRAP_HOST
        host, room = request.bootstrap_host, request.bootstrap_room
        if not fake and (host is None or room is None):
            raise GenerateError(
                "decode mode needs bootstrap_host and bootstrap_room in the request (the PD "
                "router sends them); use bootstrap_host 2.2.2.2 for a local test"
            )
        needed = len(tokens) + request.max_new_tokens
        rejected = decode_capacity_check(request.rid, needed, self.pool.capacity_tokens)
        if rejected is not None:
            raise GenerateError.of(rejected)
        # Pre-allocate KV for the whole prompt (and the completion) before the transfer.
        self.counters.num_decode_prealloc_queue_reqs += 1
        try:
            pages = await self._reserve(needed, waiting_queue=False)
        finally:
            self.counters.num_decode_prealloc_queue_reqs -= 1
        prompt_slots = self.pool.slots(pages, len(tokens))
        try:
            if fake or host is None or room is None:
                keys, values = self.model.kv(tokens)
                self.pool.write(prompt_slots, keys, values)
            else:
                await self._receive_into(host, request, room, prompt_slots)
            self._land_stale(request.rid)
            self._start_running(request)  # generate() stops it once the answer is out
            return await self._decode_loop(pages, len(tokens), request)
        except (asyncio.CancelledError, ConnectionError):  # the client went away: an abort
            if self.settings.stale_kv_after_abort:
                self._stale_landing = (prompt_slots, tokens, request.rid)
            raise
        finally:
            self._release(pages)

    def _land_stale(self, rid: str) -> None:
        """stale_kv_after_abort: the aborted request's KV transfer lands now, in the slots it
        had (freed at the abort; this request took the same pages), over this request's KV."""
        landing, self._stale_landing = self._stale_landing, None
        if landing is None:
            return
        slots, tokens, aborted = landing
        keys, values = self.model.kv(tokens)
        self.pool.write(slots, keys, values)
        self.counters.stale_reads += 1
        log.error(
            "%s=1: the KV transfer of aborted request %s (%d tokens) landed in its freed pages "
            "after request %s received its own KV",
            STALE_KV_AFTER_ABORT,
            aborted,
            len(tokens),
            rid,
        )

    async def _receive_into(
        self, host: str, request: GenerateRequest, room: int, prompt_slots: NDArray[np.int64]
    ) -> None:
        reserved = int(prompt_slots.shape[0])
        port = request.bootstrap_port or DEFAULT_BOOTSTRAP_PORT
        self.counters.num_decode_transfer_queue_reqs += 1
        try:
            payload = await receive_kv(
                host, port, room, reserved, timeout=self.settings.waiting_timeout
            )
        except TransferError as error:
            if error.status >= 500:
                self.counters.num_transfer_failed_reqs += 1
            raise GenerateError(error.message, error.status) from error
        finally:
            self.counters.num_decode_transfer_queue_reqs -= 1
        if self._fail_transfers:
            self.counters.num_transfer_failed_reqs += 1
            raise GenerateError("KV checksum mismatch (injected: fail-transfers)", 500)
        if self.settings.kv_checksum:
            if payload.checksum is None:
                log.warning("bootstrap_room %s arrived without a KV checksum; unverified", room)
            elif adler32(payload.k, payload.v) != payload.checksum:
                self.counters.num_transfer_failed_reqs += 1
                raise GenerateError("KV checksum mismatch", 500)
        if not self.settings.incident:
            incomplete = transfer_incomplete(room, payload.num_tokens, reserved)
            if incomplete is not None:
                self.counters.num_transfer_failed_reqs += 1
                raise GenerateError.of(incomplete)
        elif payload.num_tokens < reserved:
            # SGLang <= 0.5.19 did not compare; the unwritten slots keep what they held.
            self.counters.stale_reads += 1
            log.error(
                "bootstrap_room %s: %d of %d reserved tokens arrived; decoding anyway "
                "(emulating SGLang <= 0.5.19)",
                room,
                payload.num_tokens,
                reserved,
            )
        received = min(payload.num_tokens, reserved)
        self.pool.write(prompt_slots[:received], payload.k[:received], payload.v[:received])

    def _canary_verify(self, slots: NDArray[np.int64]) -> None:
        """The KV canary on a decode's first step: slot i must hold position i (the key's
        first component, model.py). ``corrupt_next`` first overwrites slot 0 (tests)."""
        canary = self.canary
        if canary is None or slots.shape[0] == 0:
            return
        if canary.corrupt_next:
            canary.corrupt_next = False
            keys, values = self.model.kv([0], start_position=1_000_003)
            self.pool.write(slots[:1], keys, values)
        keys, values = self.pool.read(slots)
        canary.check(
            [int(s) for s in slots.tolist()],
            [int(p) for p in keys[:, 0].round().tolist()],
            [int(t) for t in values[:, 0].round().tolist()],
        )

    async def _decode_loop(
        self, pages: list[int], prompt_len: int, request: GenerateRequest
    ) -> list[int]:
        max_new_tokens, progress = request.max_new_tokens, request.progress
        output: list[int] = []
        slots = self.pool.slots(pages, prompt_len + max_new_tokens)  # the request's page table
        for step in range(max_new_tokens):
            position = prompt_len + step
            if step == 0 and self.canary is not None:
                self._canary_verify(slots[:position])
            keys, values = self.pool.read(slots[:position])
            token = self.model.decode_step(step, keys, values)
            new_keys, new_values = self.model.kv([token], start_position=position)
            self.pool.write(slots[position : position + 1], new_keys, new_values)
            output.append(token)
            if step == 0:
                self.counters.observe_first_token(request)
            if progress is not None and step < max_new_tokens - 1:
                await progress(token)
            if self.settings.decode_step_seconds > 0:
                await asyncio.sleep(self.settings.decode_step_seconds)
            elif step % 16 == 15:
                # Let other requests, /metrics and health checks run: awaiting a stream's write
                # need not suspend, so a streamed answer would otherwise hold the loop throughout.
                await asyncio.sleep(0)
        return output
