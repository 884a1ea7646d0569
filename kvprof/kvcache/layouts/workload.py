"""Slot mappings for the paged layout: block tables as vLLM's block manager builds them.

Free blocks come off a shuffled free list (a long-running server's fragmentation: a
request's blocks are scattered), each request owns the blocks its context and new tokens
need, and token ``p`` of a request lands at ``block_table[p // block_size] * block_size +
p % block_size``. A batch is padded with -1 up to the CUDA-graph size it is replayed at.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvprof.core.errors import UsageError

# vLLM's CUDA-graph batch sizes: 1, 2, 4, then multiples of 8
GRAPH_SIZES = (1, 2, 4, *range(8, 513, 8))


def graph_size(tokens: int) -> int:
    """The smallest CUDA-graph batch size holding ``tokens`` (itself past the largest)."""
    return next((s for s in GRAPH_SIZES if s >= tokens), tokens)


@dataclass
class BlockTables:
    """Requests with scattered blocks in a cache of ``num_blocks`` x ``block_size`` slots."""

    num_blocks: int
    block_size: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1:
            raise UsageError("num_blocks and block_size must be positive")
        self._rng = np.random.default_rng(self.seed)

    def slot_mapping(self, context_lens: list[int], new_tokens: list[int], pad_to: int | None = None) -> np.ndarray:
        """int64 slots of every request's new tokens (request by request), then -1 up to ``pad_to``.

        Request ``r`` has ``context_lens[r]`` tokens cached and writes the next ``new_tokens[r]``."""
        if len(context_lens) != len(new_tokens):
            raise UsageError("context_lens and new_tokens must have one entry per request")
        need = sum(-(-(c + n) // self.block_size) for c, n in zip(context_lens, new_tokens))
        if need > self.num_blocks:
            raise UsageError(f"the requests need {need} blocks, the cache has {self.num_blocks}")
        free = self._rng.permutation(self.num_blocks)
        out, used = [], 0
        for ctx, new in zip(context_lens, new_tokens):
            blocks = -(-(ctx + new) // self.block_size)
            table = free[used:used + blocks]
            used += blocks
            pos = np.arange(ctx, ctx + new)
            out.append(table[pos // self.block_size] * self.block_size + pos % self.block_size)
        slots = np.concatenate(out) if out else np.empty(0, dtype=np.int64)
        if pad_to is not None:
            if pad_to < slots.size:
                raise UsageError(f"cannot pad {slots.size} tokens to {pad_to}")
            slots = np.concatenate([slots, np.full(pad_to - slots.size, -1)])
        return slots.astype(np.int64)

    def decode(self, batch: int, context: int, padded: bool = True) -> np.ndarray:
        """One new token for each of ``batch`` requests with ragged contexts around ``context``."""
        ctx = self._rng.integers(max(context // 2, 0), context + 1, size=batch).tolist()
        return self.slot_mapping(ctx, [1] * batch, graph_size(batch) if padded else None)

    def prefill(self, tokens: int, chunk: int = 512) -> np.ndarray:
        """``tokens`` new tokens from requests of up to ``chunk`` tokens each (no padding)."""
        sizes = [chunk] * (tokens // chunk) + ([tokens % chunk] if tokens % chunk else [])
        return self.slot_mapping([0] * len(sizes), sizes)
