"""How long a prompt SGLang answers with every new token it asks for. Pure.

Three bounds apply to a prompt of ``n`` tokens asking for ``m`` new ones, the same in SGLang
0.5.19 to 0.5.23:

- the tokenizer (``managers/tokenizer_manager.py`` ``_validate_one_request``) adds the
  speculative decoding's reserved tokens ``r`` to the input and refuses with HTTP 400 when
  ``n + r >= contextLength`` or ``n + r + m > contextLength``. ``r`` is
  ``compute_num_reserved_tokens`` (``managers/utils.py``): for EAGLE, EAGLE3 and NEXTN (an alias
  of EAGLE) ``max(speculative_eagle_topk × speculative_num_steps, speculative_num_draft_tokens)``,
  else 0;
- the scheduler refuses ``n >= max_req_input_len = min(contextLength, pool) − 6`` and clips ``m``
  to ``max_req_len − n − 1`` with ``max_req_len = min(contextLength, pool) − 1``
  (``managers/tp_worker.py``, ``managers/scheduler.py`` ``init_req_max_new_tokens``);
- it clips ``m`` to the empty pool as well: ``pool − ceil(n / page) × page − page − 1``
  (``max_new_tokens_for_memory`` in ``mem_cache/allocator/base.py``; inline in 0.5.19 and
  0.5.20), so a large page (DSA's forced 64) near capacity answers fewer tokens than asked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvgate_engine.flag_reader import last_uses

# Every option string of the speculative flags read here -> the flag it stands for.
SPECULATIVE_FLAGS: Mapping[str, str] = {
    "--speculative-algorithm": "--speculative-algorithm",
    "--speculative-num-steps": "--speculative-num-steps",
    "--speculative-eagle-topk": "--speculative-eagle-topk",
    "--speculative-num-draft-tokens": "--speculative-num-draft-tokens",
}
EAGLE_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "NEXTN"})
# arg_groups/speculative_hook.py _auto_choose_speculative_params: (steps, topk, draft tokens)
# when none is given; LlamaForCausalLM and Grok take (5, 4, 8), every other model (3, 1, 4).
_AUTO_WIDE = (5, 4, 8)
_AUTO_NARROW = (3, 1, 4)
_AUTO_WIDE_ARCHITECTURES = frozenset({"LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"})


@dataclass(frozen=True)
class RequestBounds:
    """What an engine's flags add to SGLang's per-request arithmetic."""

    page_size: int = 1  # the page the engine runs with (SGLang may force one)
    reserved_tokens: int = 0  # speculative decoding's output slots, added to every input


PLAIN = RequestBounds()  # page 1, no speculative decoding


def _positive(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() and int(value) > 0 else None


def speculative_reserved_tokens(
    engine_args: Sequence[str], config: Mapping[str, Any] | None
) -> int:
    """``compute_num_reserved_tokens`` for the engine's flags (0 without EAGLE). A step count
    without topk or draft tokens is refused by SGLang at start; here the missing ones count 1."""
    uses = last_uses(engine_args, SPECULATIVE_FLAGS)
    values = {SPECULATIVE_FLAGS[flag]: use.value for flag, use in uses.items()}
    algorithm = (values.get("--speculative-algorithm") or "").upper()
    if algorithm not in EAGLE_ALGORITHMS:
        return 0
    steps = _positive(values.get("--speculative-num-steps"))
    if steps is None:
        architectures = (config or {}).get("architectures")
        first = architectures[0] if isinstance(architectures, list) and architectures else ""
        wide = first in _AUTO_WIDE_ARCHITECTURES
        steps, topk, draft = _AUTO_WIDE if wide else _AUTO_NARROW
    else:
        topk = _positive(values.get("--speculative-eagle-topk")) or 1
        draft = _positive(values.get("--speculative-num-draft-tokens")) or 1
    return max(topk * steps, draft)


def new_tokens_granted(
    prompt_tokens: int,
    max_new_tokens: int,
    *,
    context_length: int,
    pool_tokens: int,
    bounds: RequestBounds = PLAIN,
) -> int | None:
    """The new tokens SGLang generates for this request, or None when it refuses it."""
    n, m, reserved = prompt_tokens, max_new_tokens, bounds.reserved_tokens
    if n + reserved >= context_length or n + reserved + m > context_length:
        return None
    limit = min(context_length, pool_tokens)
    if n >= limit - 6:
        return None
    page = bounds.page_size
    paged = -(-n // page) * page
    return max(0, min(m, limit - 1 - n - 1, pool_tokens - paged - page - 1))


def longest_full_answer(
    context_length: int,
    max_new_tokens: int,
    *,
    pool_tokens: int | None = None,
    bounds: RequestBounds = PLAIN,
) -> int:
    """The longest prompt SGLang admits and answers with all ``max_new_tokens`` tokens
    (``pool_tokens`` None: a pool as large as the context)."""
    pool = context_length if pool_tokens is None else pool_tokens
    limit = min(context_length, pool)
    m, page, reserved = max_new_tokens, bounds.page_size, bounds.reserved_tokens
    longest = min(
        context_length - reserved - m,
        context_length - reserved - 1,
        limit - 7,
        limit - m - 2,
        (pool - page - 1 - m) // page * page,
    )
    return max(1, longest)
