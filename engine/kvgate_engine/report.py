"""What a live SGLang engine says about itself, reduced to the numbers kvgate checks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineReport:
    """The facts read from one engine's ``/server_info`` and ``/v1/models``.

    A field is ``None`` when the engine did not say; ``problems`` says why, in human text.
    """

    version: str | None
    role: str | None  # disaggregation_mode: "prefill" | "decode" | "null"
    kv_pool_tokens: int | None  # min over DP ranks of memory_usage.token_capacity
    kv_pool_tokens_per_rank: tuple[int, ...]
    max_req_input_len: int | None
    effective_context_length: int | None  # /v1/models data[0].max_model_len, else fallbacks
    served_model_name: str | None
    problems: tuple[str, ...] = ()
