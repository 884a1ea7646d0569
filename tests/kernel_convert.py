"""For the tests: triton_fused's conversion, run elementwise over a whole tensor.

The exhaustive conversion tests feed every 16-bit pattern through the writer's own device
code (``triton_kernel.convert_bits``, 8 elements per thread so the packed fp8 path runs as
in the writer) and compare with ``kvprof.kvcache.dtypes.convert_for_cache``.
"""

from __future__ import annotations

import torch

from kvprof.kvcache.dtypes import store_dtype_for
from kvprof.kvcache.writers import triton_kernel
from kvprof.kvcache.writers.triton_convert import (
    FP8_DTYPES,
    KINDS,
    TRITON_ERROR,
    cached_inverse,
    e4m3_saturates,
    pow2_exact,
    triton,
)

if triton is not None:
    import triton.language as tl

    from kvprof.kvcache.writers.triton_convert import as_bits, to_storage
    from kvprof.kvcache.writers.triton_kernel import convert_bits

    @triton.jit
    def _convert_kernel(out, inp, inv, n, IN: tl.constexpr, OUT: tl.constexpr,
                        SCALED: tl.constexpr, HW: tl.constexpr, SAT: tl.constexpr, BLOCK: tl.constexpr,
                        POW2: tl.constexpr = 0, PACKED: tl.constexpr = 0):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        raw = as_bits(tl.load(inp + offs, mask=mask), IN)
        if IN == OUT:
            r = raw
        else:
            r = to_storage(convert_bits(raw, inv, IN, OUT, SCALED, HW, SAT, 0, POW2, PACKED), OUT)
        tl.store(out + offs, r.to(out.dtype.element_ty, bitcast=True), mask=mask)


def convert_with_kernel(
    x: torch.Tensor, dtype: torch.dtype, scale: float | torch.Tensor | None, *, hw: bool | None = None
) -> torch.Tensor:
    """Convert a tensor exactly as the writer's kernel does, returned as the cache's storage
    dtype (uint8 for fp8): compare with ``convert_for_cache``."""
    if triton is None:
        raise RuntimeError(f"triton is not importable ({TRITON_ERROR})")
    flat = x.reshape(-1)
    out = torch.empty(flat.shape, dtype=store_dtype_for(dtype), device=x.device)
    if flat.numel() == 0:
        return out.view(x.shape)
    scaled = not (x.dtype == dtype or scale is None)
    inv = cached_inverse(scale) if scaled else 1.0
    use_hw = (not triton_kernel.interpreted()) if hw is None else hw
    block = 1024
    pow2 = scaled and x.dtype in (torch.bfloat16, torch.float32) and dtype in FP8_DTYPES and pow2_exact(inv)
    _convert_kernel[(triton.cdiv(flat.numel(), block),)](
        out, flat, inv, flat.numel(), IN=KINDS[x.dtype], OUT=KINDS[dtype], SCALED=scaled, HW=use_hw,
        SAT=e4m3_saturates(), BLOCK=block, POW2=int(pow2),
        PACKED=int(triton_kernel.packed_e4m3(use_hw, x.dtype, dtype)),
    )
    return out.view(x.shape)
