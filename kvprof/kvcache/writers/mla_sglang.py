"""SGLang's own MLA store, called as SGLang's pool calls it (the peer of ``mla_triton``).

``set_mla_kv_buffer_triton`` from the installed SGLang (``sglang.kernels.ops.kvcache.mla_buffer``):
on sm_90+ with 16-byte-aligned parts its JIT CUDA kernel (one warp per row, a TMA bulk
store), else its Triton kernel, else (platforms without Triton, e.g. CPU) its torch scatter.
The parts are cast first as ``MLATokenToKVPool._write_mla_kv_buffer`` does.
"""

from __future__ import annotations

from typing import Any

import torch

from kvprof.kvcache.contracts import MLAWriter
from kvprof.kvcache.dtypes import cast_like_sglang

FUSED = "fused"  # one launch on the GPU, the inputs already in the cache dtype
CAST_THEN_STORE = "cast_then_store"  # SGLang casts each part with its own kernel first (fp8 caches)
TORCH_FALLBACK = "fallback:sglang_torch"  # SGLang's torch scatter, where it has no Triton (CPU)


def _load() -> tuple[Any, str | None]:
    try:
        from sglang.kernels.ops.kvcache.mla_buffer import set_mla_kv_buffer_triton
    except Exception as exc:  # not installed, or an SGLang that does not import here
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        return None, f"SGLang's MLA store is not installed or does not import ({type(exc).__name__}: {first})"
    return set_mla_kv_buffer_triton, None


class SglangMLAWriter(MLAWriter):
    name = "sglang_mla"
    description = "SGLang's set_mla_kv_buffer_triton (its JIT CUDA, Triton or torch path)"
    fused = True

    def __init__(self) -> None:
        self._op, self._error = _load()

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        return super().unsupported_reason(device, dtype, input_dtype) or self._error

    def write(self, kv_buf: torch.Tensor, loc, nope, rope, dtype, skip):  # type: ignore[override]
        if self._op is None:
            raise RuntimeError(f"sglang_mla cannot run: {self._error}")
        path = (FUSED if nope.dtype == dtype else CAST_THEN_STORE) if kv_buf.is_cuda else TORCH_FALLBACK
        if loc.shape[0] == 0:
            return path  # nothing to write (SGLang's torch path cannot view an empty batch)
        self._op(kv_buf, loc, cast_like_sglang(nope, dtype), cast_like_sglang(rope, dtype),
                 reserved_skip_index=skip)
        return path
