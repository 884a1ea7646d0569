"""Two ``index_put`` copies on the current stream: SGLang's path outside graph capture."""

from __future__ import annotations

import torch

from kvprof.kvcache.contracts import TWO_COPIES, KVWriter, convert_pair


class IndexPutWriter(KVWriter):
    """The reference every other writer must match bit for bit."""

    name = "index_put"
    description = "two index_put copies (K then V) on the current stream"
    fused = False
    devices = ("cpu", "cuda")

    def launches_pdl(self, device: torch.device) -> bool:
        """torch's own kernels, launched without programmatic dependent launch."""
        return False

    def write(
        self,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        dtype: torch.dtype,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> str:
        if cache_k.dtype != k_buf.dtype or cache_v.dtype != v_buf.dtype:
            cache_k, cache_v = convert_pair(cache_k, cache_v, dtype, k_scale, v_scale)
        k_buf[loc] = cache_k
        v_buf[loc] = cache_v
        return TWO_COPIES
