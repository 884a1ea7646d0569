"""The paged cache's torch writers: the reference, and the unfused path in torch ops.

``paged_index_put`` is the reference every paged writer must match bit for bit: convert
(``convert_like_vllm``), drop the -1 slots with a boolean mask (a host sync), one
``index_put`` into the flattened K cache, one into V. The simplest correct write.

``paged_unfused`` is vLLM's write done as separate torch ops, with no fused kernel: K and V
each converted by their own kernels (divide, clamp, cast), then one ``index_copy_`` each.
Sync-free, so it replays in a CUDA graph: a padding token (-1) is redirected to the first
real token's slot with that token's row (the same bytes written twice), or, when every
token is padding, to slot 0 with slot 0's current contents.
"""

from __future__ import annotations

import torch

from kvprof.kvcache.contracts import PagedWriter
from kvprof.kvcache.dtypes import convert_like_vllm

TWO_INDEX_PUTS = "two_index_puts"
UNFUSED = "unfused"


class PagedIndexPutWriter(PagedWriter):
    name = "paged_index_put"
    description = "the reference: convert, drop -1 slots, index_put into K then V"

    def launches_pdl(self, device: torch.device) -> bool:
        """torch's own kernels, launched without programmatic dependent launch."""
        return False

    def write(self, k_cache, v_cache, slots, key, value, dtype, k_scale, v_scale):  # type: ignore[override]
        n = slots.shape[0]
        keep = slots >= 0
        idx = slots[keep]
        h, d = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, h, d)[idx] = convert_like_vllm(key[:n], dtype, k_scale)[keep]
        v_cache.view(-1, h, d)[idx] = convert_like_vllm(value[:n], dtype, v_scale)[keep]
        return TWO_INDEX_PUTS


class PagedUnfusedWriter(PagedWriter):
    name = "paged_unfused"
    description = "vLLM's write as torch ops: convert K, convert V, index_copy_ each (padding redirected)"

    def launches_pdl(self, device: torch.device) -> bool:
        """torch's own kernels, launched without programmatic dependent launch."""
        return False

    def write(self, k_cache, v_cache, slots, key, value, dtype, k_scale, v_scale):  # type: ignore[override]
        n = slots.shape[0]
        if n == 0:
            return UNFUSED
        h, d = k_cache.shape[2], k_cache.shape[3]
        valid = slots >= 0
        # the first real token (0 when there is none), picked with index_select: indexing with a
        # 0-d tensor reads it on the host, which a CUDA-graph capture does not allow
        first = valid.to(torch.int32).argmax().view(1)
        any_valid = valid.index_select(0, first).squeeze(0)
        slot_first = slots.index_select(0, first).squeeze(0)
        target = torch.where(valid, slots, torch.where(any_valid, slot_first, torch.zeros_like(slot_first)))
        for cache, x, scale in ((k_cache, key, k_scale), (v_cache, value, v_scale)):
            flat = cache.view(-1, h, d)
            new = convert_like_vllm(x[:n], dtype, scale)
            fill = torch.where(any_valid, new.index_select(0, first).squeeze(0), flat[0])
            flat.index_copy_(0, target.long(), torch.where(valid[:, None, None], new, fill))
        return UNFUSED
