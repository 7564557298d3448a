"""A paged KV pool that behaves like SGLang's where it matters for the incident.

- Sized in tokens at start-up (``kv_pool_tokens``), split into pages of ``page_size`` slots.
- Storage is materialised lazily: a million-token pool costs nothing until its pages are used.
- Allocation takes the lowest-numbered free pages first (SGLang keeps its free list sorted), so
  a request that follows another reuses that request's pages, in order.
- Freed pages are **not** zeroed: their old keys and values stay there until overwritten. A
  request that reads slots it never wrote reads another request's data.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np
from numpy.typing import DTypeLike, NDArray


class PoolExhausted(Exception):
    """Not enough free pages right now."""


class PagedKVPool:
    def __init__(
        self,
        *,
        num_pages: int,
        page_size: int,
        k_dim: int,
        v_dim: int,
        dtype: DTypeLike = np.float64,
    ) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(f"pool needs >= 1 page of >= 1 slot, got {num_pages} × {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._k: NDArray[Any] = np.zeros((0, k_dim), dtype=dtype)
        self._v: NDArray[Any] = np.zeros((0, v_dim), dtype=dtype)
        self._freed: list[int] = []  # min-heap of pages that were used and released
        self._next_fresh = 0  # pages >= this were never handed out
        self._free_count = num_pages

    @property
    def capacity_tokens(self) -> int:
        return self.num_pages * self.page_size

    @property
    def free_pages(self) -> int:
        return self._free_count

    @property
    def used_tokens(self) -> int:
        return (self.num_pages - self._free_count) * self.page_size

    @property
    def materialized_slots(self) -> int:
        """Slots backed by memory so far (grows with use, never beyond the pool)."""
        return int(self._k.shape[0])

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def alloc(self, num_tokens: int) -> list[int]:
        """Pages for ``num_tokens`` slots, lowest free first; contents are left as they are."""
        need = self.pages_for(num_tokens)
        if need > self._free_count:
            raise PoolExhausted(f"need {need:,} pages, {self._free_count:,} free")
        pages = [heapq.heappop(self._freed) for _ in range(min(need, len(self._freed)))]
        fresh = need - len(pages)
        if fresh:
            pages.extend(range(self._next_fresh, self._next_fresh + fresh))
            self._next_fresh += fresh
            self._materialize(self._next_fresh * self.page_size)
        self._free_count -= need
        return pages

    def free(self, pages: list[int]) -> None:
        """Return pages to the free list without touching their contents (as SGLang does)."""
        for page in pages:
            heapq.heappush(self._freed, page)
        self._free_count += len(pages)

    def slots(self, pages: list[int], num_tokens: int) -> NDArray[np.int64]:
        """Slot indices of the first ``num_tokens`` token positions laid out on ``pages``."""
        page_index = np.array(pages, dtype=np.int64)
        offsets = np.arange(self.page_size, dtype=np.int64)
        all_slots = (page_index[:, None] * self.page_size + offsets[None, :]).reshape(-1)
        return all_slots[:num_tokens]

    def write(self, slots: NDArray[np.int64], k: NDArray[Any], v: NDArray[Any]) -> None:
        self._check(slots)
        if k.shape[0] != slots.shape[0] or v.shape[0] != slots.shape[0]:  # no broadcasting
            raise ValueError(
                f"{slots.shape[0]:,} slots for {k.shape[0]:,} keys, {v.shape[0]:,} values"
            )
        self._k[slots] = k.astype(self._k.dtype, copy=False)
        self._v[slots] = v.astype(self._v.dtype, copy=False)

    def read(self, slots: NDArray[np.int64]) -> tuple[NDArray[Any], NDArray[Any]]:
        """Copies of the slots' keys and values (later writes to the pool do not change them)."""
        self._check(slots)
        return self._k[slots], self._v[slots]

    def _check(self, slots: NDArray[np.int64]) -> None:
        # torch's index_copy_/index_select refused negative and out-of-range indices; numpy
        # would wrap a negative index to the end of the pool.
        if slots.size and (int(slots.min()) < 0 or int(slots.max()) >= self.materialized_slots):
            raise IndexError(
                f"slots {int(slots.min()):,}..{int(slots.max()):,} are outside the "
                f"{self.materialized_slots:,} materialised slots of the KV pool"
            )

    def _materialize(self, slots_needed: int) -> None:
        have = self.materialized_slots
        if slots_needed <= have:
            return
        # Geometric growth keeps reallocation rare; the old contents (stale data included) move.
        target = min(max(slots_needed, 2 * have, 4096), self.capacity_tokens)
        k = np.zeros((target, self._k.shape[1]), dtype=self._k.dtype)
        v = np.zeros((target, self._v.shape[1]), dtype=self._v.dtype)
        k[:have] = self._k
        v[:have] = self._v
        self._k, self._v = k, v
