"""The MLA pool's torch writers: the reference, and SGLang's unfused path.

``mla_index_put`` is the reference every MLA writer must match bit for bit: each part cast
(SGLang's ``.to``), then one ``index_put`` per column range of the row. It drops the skipped
slot with a boolean mask (a host sync): the simplest correct write, not a timed variant.

``mla_cat_copy`` is what SGLang runs without a fused kernel: ``torch.cat`` of the two parts
into a temporary row, then one ``index_put`` of whole rows (``MLATokenToKVPool.set_kv_buffer``
after the model's concatenation). Sync-free, so it replays in a CUDA graph: a token at the
skipped slot writes that row's current contents back.
"""

from __future__ import annotations

import torch

from kvprof.kvcache.contracts import MLAWriter
from kvprof.kvcache.dtypes import cast_like_sglang

TWO_INDEX_PUTS = "two_index_puts"
CAT_COPY = "cat_copy"


class MLAIndexPutWriter(MLAWriter):
    name = "mla_index_put"
    description = "the reference: cast, then index_put of the nope and rope column ranges"

    def launches_pdl(self, device: torch.device) -> bool:
        """torch's own kernels, launched without programmatic dependent launch."""
        return False

    def write(self, kv_buf, loc, nope, rope, dtype, skip):  # type: ignore[override]
        r = nope.shape[-1]
        nope = cast_like_sglang(nope, dtype)
        rope = cast_like_sglang(rope, dtype)
        if skip >= 0:
            keep = loc != skip
            loc, nope, rope = loc[keep], nope[keep], rope[keep]
        kv_buf[:, :, :r][loc] = nope
        kv_buf[:, :, r:][loc] = rope
        return TWO_INDEX_PUTS


class MLACatCopyWriter(MLAWriter):
    name = "mla_cat_copy"
    description = "SGLang's unfused path: torch.cat of nope and rope, cast, index_put of whole rows"

    def launches_pdl(self, device: torch.device) -> bool:
        """torch's own kernels, launched without programmatic dependent launch."""
        return False

    def write(self, kv_buf, loc, nope, rope, dtype, skip):  # type: ignore[override]
        row = cast_like_sglang(torch.cat([nope, rope], dim=-1), dtype)
        if skip >= 0:
            row = torch.where((loc == skip)[:, None, None], kv_buf[skip], row)
        kv_buf[loc] = row
        return CAT_COPY
