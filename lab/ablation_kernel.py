"""The fused write's kernel with an ablation knob, for lab/fp8_ablation.py only.

A copy of ``kvprof.kvcache.writers.triton_kernel.store_kv_kernel`` (same conversion code, imported
from kvprof) with one more compile-time field, CHAIN (MODE bits 15-17): N dependent integer
ops that leave a pair of 16-bit row values unchanged, alternating add and xor of a zero the
compiler cannot see (the sign bit of a positive inverse scale), so ptxas can neither fold
nor merge them. They measure what one more step on a warp's load -> store chain costs at
the latency floor: the yardstick for the steps of the fp8 conversion. The shipped kernel
has no such field; keep this copy's load/store structure in step with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvprof.kvcache.writers.triton_convert import triton  # noqa: E402
from kvprof.kvcache.writers.triton_kernel import mode_bits  # noqa: E402,F401  (re-exported for the lab scripts)

CHAIN_SHIFT = 15

if triton is not None:
    import triton.language as tl

    from kvprof.kvcache.writers.triton_convert import BF16, F16, as_bits, to_storage
    from kvprof.kvcache.writers.triton_kernel import convert_bits

    @triton.jit
    def dependent_ops(bits, inv, N: tl.constexpr):
        """``bits`` (int16) unchanged after N dependent add/xor steps of a runtime zero."""
        zero = (tl.zeros(bits.shape, tl.int32) + inv.to(tl.int32, bitcast=True)) >> 31
        r = bits
        for i in tl.static_range(N):
            if i % 2 == 0:
                r = tl.inline_asm_elementwise("add.u32 $0, $1, $2;", "=r,r,r,r", [r, zero], dtype=tl.int16,
                                              is_pure=True, pack=2)
            else:
                r = tl.inline_asm_elementwise("xor.b32 $0, $1, $2;", "=r,r,r,r", [r, zero], dtype=tl.int16,
                                              is_pure=True, pack=2)
        return r

    @triton.jit(do_not_specialize=["tokens", "rows"])
    def store_kv_ablation_kernel(
        k_out, v_out, loc, k_in, v_in,
        k_inv, v_inv,
        tokens, rows, k_stride, v_stride,
        RK: tl.constexpr, RV: tl.constexpr,
        BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr,
        MODE: tl.constexpr,
    ):
        """``store_kv_kernel`` (no 64-bit offsets) plus CHAIN dependent steps on every row word."""
        IN: tl.constexpr = MODE & 7
        OUT: tl.constexpr = (MODE >> 3) & 7
        K_SCALED: tl.constexpr = (MODE >> 6) & 1
        V_SCALED: tl.constexpr = (MODE >> 7) & 1
        HW: tl.constexpr = (MODE >> 8) & 1
        SAT: tl.constexpr = (MODE >> 9) & 1
        PDL: tl.constexpr = (MODE >> 11) & 1
        FP8_INT: tl.constexpr = (MODE >> 12) & 1
        POW2: tl.constexpr = (MODE >> 13) & 1
        PACKED: tl.constexpr = (MODE >> 14) & 1
        CHAIN: tl.constexpr = (MODE >> 15) & 7
        CK: tl.constexpr = BLOCK_K // SPLIT
        CV: tl.constexpr = BLOCK_V // SPLIT
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = tok < tokens
        slot = tl.load(loc + tok, mask=tmask, other=-1)
        chunk = tl.program_id(1)
        ck = chunk * CK + tl.arange(0, CK)
        cv = chunk * CV + tl.arange(0, CV)
        if RK == BLOCK_K:
            kin_mask = tmask[:, None]
        else:
            kin_mask = tmask[:, None] & (ck[None, :] < RK)
        if RV == BLOCK_V:
            vin_mask = tmask[:, None]
        else:
            vin_mask = tmask[:, None] & (cv[None, :] < RV)
        k_raw = as_bits(tl.load(k_in + tok[:, None] * k_stride + ck[None, :], mask=kin_mask), IN)
        v_raw = as_bits(tl.load(v_in + tok[:, None] * v_stride + cv[None, :], mask=vin_mask), IN)
        if CHAIN > 0:
            tl.static_assert(IN == BF16 or IN == F16, "the dependent-op ablation takes 16-bit rows")
            k_raw = dependent_ops(k_raw, k_inv, CHAIN)
            v_raw = dependent_ops(v_raw, v_inv, CHAIN)
        if IN == OUT:
            k_new = k_raw
            v_new = v_raw
        else:
            k_new = to_storage(convert_bits(k_raw, k_inv, IN, OUT, K_SCALED, HW, SAT, FP8_INT, POW2, PACKED), OUT)
            v_new = to_storage(convert_bits(v_raw, v_inv, IN, OUT, V_SCALED, HW, SAT, FP8_INT, POW2, PACKED), OUT)
        ok = tmask & (slot >= 0) & (slot < rows)
        row = slot.to(tl.int32)
        k_mask = ok[:, None] if RK == BLOCK_K else ok[:, None] & (ck[None, :] < RK)
        v_mask = ok[:, None] if RV == BLOCK_V else ok[:, None] & (cv[None, :] < RV)
        tl.store(k_out + row[:, None] * RK + ck[None, :], k_new.to(k_out.dtype.element_ty, bitcast=True),
                 mask=k_mask)
        tl.store(v_out + row[:, None] * RV + cv[None, :], v_new.to(v_out.dtype.element_ty, bitcast=True),
                 mask=v_mask)


def chain_mode(n: int) -> int:
    """MODE bits asking for ``n`` (0-7) dependent steps."""
    if not 0 <= n <= 7:
        raise ValueError(f"CHAIN takes 0..7 steps, got {n}")
    return n << CHAIN_SHIFT


__all__ = ["CHAIN_SHIFT", "chain_mode", "mode_bits", "store_kv_ablation_kernel"]
