"""SGLang's per-request arithmetic: speculative reserved tokens and the longest full answer."""

from __future__ import annotations

import pytest
from kvgate_engine.request_limits import (
    RequestBounds,
    longest_full_answer,
    new_tokens_granted,
    speculative_reserved_tokens,
)

LLAMA = {"architectures": ["LlamaForCausalLM"]}
QWEN = {"architectures": ["Qwen3ForCausalLM"]}


@pytest.mark.parametrize(
    ("args", "config", "reserved"),
    [
        ([], LLAMA, 0),
        (["--speculative-algorithm", "EAGLE"], LLAMA, 20),  # auto (5, 4, 8): max(4 × 5, 8)
        (["--speculative-algorithm", "EAGLE3"], QWEN, 4),  # auto (3, 1, 4): max(1 × 3, 4)
        (["--speculative-alg=nextn"], QWEN, 4),  # NEXTN aliases EAGLE; argparse prefixes
        (
            [
                "--speculative-algorithm=EAGLE",
                "--speculative-num-steps",
                "6",
                "--speculative-eagle-topk=2",
                "--speculative-num-draft-tokens=16",
            ],
            LLAMA,
            16,
        ),
        (["--speculative-algorithm", "STANDALONE"], LLAMA, 0),  # not EAGLE: nothing reserved
    ],
)
def test_eagle_reserves_output_slots_on_top_of_the_input(
    args: list[str], config: dict[str, object], reserved: int
) -> None:
    assert speculative_reserved_tokens(args, config) == reserved


def test_the_longest_full_answer_is_granted_in_full_and_one_page_more_is_not() -> None:
    for pool in (131_072, 140_000):
        for bounds in (
            RequestBounds(),
            RequestBounds(64),
            RequestBounds(1, 20),
            RequestBounds(16, 4),
        ):
            n = longest_full_answer(131_072, 8, pool_tokens=pool, bounds=bounds)
            granted = new_tokens_granted(
                n, 8, context_length=131_072, pool_tokens=pool, bounds=bounds
            )
            assert granted == 8
            beyond = new_tokens_granted(
                n + bounds.page_size, 8, context_length=131_072, pool_tokens=pool, bounds=bounds
            )
            assert beyond != 8
