"""SGLang's request-length checks, with SGLang's message texts (pure).

Three places reject a request by length in SGLang:
1. the tokenizer, against the context length only;
2. the scheduler, against ``max_req_input_len`` (which is below the context when the KV pool is);
3. the decode prealloc queue, against the pool.

The incident lives in the gap between 1 and 2: before 0.5.21 a request that passed 1 and failed 2
was swapped for a one-token placeholder and still handed off from prefill to decode.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

# The leak: up to 0.5.19 the placeholder's one token of KV went out as the transfer's last chunk
# and decode generated from pages nothing wrote. 0.5.20 retires the placeholder after the forward
# (no KV sent; decode waits out its transfer timeout and fails the request, measured on the
# released 0.5.20 on CPU); 0.5.21 rejects it at intake (sglang#38935). From 0.5.20 on the
# reference engine answers such a prompt as the fixed releases do: a 400.
FIXED_IN = Version("0.5.20")
PLACEHOLDER_INPUT = (0,)  # Req.set_finish_with_abort's replacement for origin_input_ids


@dataclass(frozen=True)
class Rejection:
    message: str
    status: int = 400


def emulates_incident(version: str, forced: bool) -> bool:
    """True when the engine should behave like SGLang <= 0.5.19 (the leaking rejection path)."""
    if forced:
        return True
    try:
        return Version(version) < FIXED_IN
    except InvalidVersion:
        return False


def tokenizer_check(input_len: int, max_new_tokens: int, context_len: int) -> Rejection | None:
    """TokenizerManager._validate_one_request: only the context length is known here."""
    if input_len >= context_len:
        return Rejection(
            f"The input ({input_len} tokens) is longer than the model's context length "
            f"({context_len} tokens)."
        )
    total = input_len + max_new_tokens
    if total > context_len:
        return Rejection(
            f"Requested token count exceeds the model's maximum context length of {context_len} "
            f"tokens. You requested a total of {total} tokens: {input_len} tokens from the input "
            f"messages and {max_new_tokens} tokens for the completion. Please reduce the number "
            f"of tokens in the input messages or the completion to fit within the limit."
        )
    return None


def scheduler_check(input_len: int, max_req_input_len: int) -> Rejection | None:
    """Scheduler validate_input_length: the pool-derived limit."""
    if input_len >= max_req_input_len:
        return Rejection(
            f"Input length ({input_len} tokens) exceeds the maximum allowed length "
            f"({max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate."
        )
    return None


def decode_capacity_check(rid: str, tokens_needed: int, pool_tokens: int) -> Rejection | None:
    """DecodePreallocQueue._check_if_req_exceed_kv_capacity."""
    if tokens_needed > pool_tokens:
        return Rejection(
            f"Request {rid} exceeds the maximum number of tokens: {tokens_needed} > {pool_tokens}"
        )
    return None


def transfer_incomplete(room: int, received: int, reserved: int) -> Rejection | None:
    """The fixed decode's guard: generating from slots the transfer did not fill reads stale KV."""
    if received != reserved:
        return Rejection(
            f"KV transfer for bootstrap_room {room} incomplete: received {received:,} of "
            f"{reserved:,} reserved tokens; refusing to decode from unwritten KV pages",
            status=500,
        )
    return None
