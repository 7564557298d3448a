"""The reference model: one attention head whose correct output is a known function of the prompt.

Each token at position ``p`` gets the feature vector ``h = [token, p, p², 1]``. Fixed projections
give its key ``k = [p, p², 1, 1]`` and value ``v = [token, 1]``. Decode step ``t`` builds the
query ``q = β·[2t, −1, −t², M]``, so ``q·k = β·(M − (p − t)²)``: the softmax peaks on the slot
that holds position ``t`` (never-written, zeroed slots score 0, far below ``β·M``), and the
attended value is that slot's token. So the model copies its prompt: output = the first
``max_new_tokens`` prompt tokens (repeating the prompt when asked for more).

The keys and values live in the paged KV pool and every decode step reads them back from it.
When the slots a request reads were never written for it, the step reads whatever the pool
holds there — for a reused page, the previous request's tokens, verbatim.
"""

from __future__ import annotations

import torch

K_DIM = 4
V_DIM = 2
SHARPNESS = 50.0  # β: neighbours of the matching position get weight e^-50
MATCH_BONUS = 16.0  # M: a real match beats an empty (all-zero) slot by e^(β·M)


class CopyAttentionModel:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        dtype = torch.float64  # exact positions up to 2^26 and token ids in the scores
        # h = [token, p, p², 1]
        self.w_k = torch.tensor(
            [[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1]], dtype=dtype
        )
        self.w_v = torch.tensor([[1, 0], [0, 0], [0, 0], [0, 1]], dtype=dtype)
        self.w_q = SHARPNESS * torch.tensor(
            [[0, 0, 0, 0], [2, 0, 0, 0], [0, 0, -1, 0], [0, -1, 0, MATCH_BONUS]], dtype=dtype
        )

    @staticmethod
    def features(tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        p = positions.to(torch.float64)
        return torch.stack([tokens.to(torch.float64), p, p * p, torch.ones_like(p)], dim=-1)

    def kv(self, tokens: list[int], start_position: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of ``tokens`` placed at positions ``start_position``, ... (prefill)."""
        ids = torch.tensor(tokens, dtype=torch.long)
        positions = torch.arange(start_position, start_position + len(tokens), dtype=torch.long)
        h = self.features(ids, positions)
        return h @ self.w_k, h @ self.w_v

    def decode_step(self, step: int, keys: torch.Tensor, values: torch.Tensor) -> int:
        """The token decode step ``step`` produces from the request's keys and values."""
        h = self.features(torch.tensor([0]), torch.tensor([step]))
        query = (h @ self.w_q)[0]
        weights = torch.softmax(keys @ query, dim=0)
        attended = weights @ values
        token = float(attended[0])
        if token != token:  # NaN: nothing sensible to attend to
            return 0
        return int(min(max(round(token), 0), self.vocab_size - 1))
