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

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]
K_DIM = 4
V_DIM = 2
SHARPNESS = 50.0  # β: neighbours of the matching position get weight e^-50
MATCH_BONUS = 16.0  # M: a real match beats an empty (all-zero) slot by e^(β·M)


class CopyAttentionModel:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        dtype = np.float64  # exact positions up to 2^26 and token ids in the scores
        # h = [token, p, p², 1]
        self.w_k = np.array([[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 1]], dtype=dtype)
        self.w_v = np.array([[1, 0], [0, 0], [0, 0], [0, 1]], dtype=dtype)
        self.w_q = SHARPNESS * np.array(
            [[0, 0, 0, 0], [2, 0, 0, 0], [0, 0, -1, 0], [0, -1, 0, MATCH_BONUS]], dtype=dtype
        )

    @staticmethod
    def features(tokens: NDArray[np.int64], positions: NDArray[np.int64]) -> Array:
        p = positions.astype(np.float64)
        return np.stack([tokens.astype(np.float64), p, p * p, np.ones_like(p)], axis=-1)

    def kv(self, tokens: list[int], start_position: int = 0) -> tuple[Array, Array]:
        """Keys and values of ``tokens`` placed at positions ``start_position``, ... (prefill)."""
        ids = np.array(tokens, dtype=np.int64)
        positions = np.arange(start_position, start_position + len(tokens), dtype=np.int64)
        h = self.features(ids, positions)
        return h @ self.w_k, h @ self.w_v

    def decode_step(self, step: int, keys: Array, values: Array) -> int:
        """The token decode step ``step`` produces from the request's keys and values."""
        h = self.features(np.array([0], dtype=np.int64), np.array([step], dtype=np.int64))
        query = (h @ self.w_q)[0]
        weights = softmax(keys @ query)
        attended = weights @ values
        token = float(attended[0])
        if token != token:  # NaN: nothing sensible to attend to
            return 0
        return int(min(max(round(token), 0), self.vocab_size - 1))


def softmax(scores: Array) -> Array:
    """Numerically stable softmax over a 1-D array (subtract the max first, as torch does)."""
    if scores.shape[0] == 0:
        return scores.copy()
    exp = np.exp(scores - scores.max())
    result: Array = exp / exp.sum()
    return result
