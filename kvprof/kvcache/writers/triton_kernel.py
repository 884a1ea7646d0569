"""kvprof's fused K+V write kernel in Triton: one launch stores both rows for every token.

* One program handles ``BLOCK_T`` tokens (a ``[BLOCK_T, row]`` tile per K and V), so small
  rows still give each program enough bytes, and rows are read and written as contiguous
  vectors (16-byte accesses when row size and alignment allow it). ``SPLIT`` > 1 cuts
  each row into column chunks, one program each, for a few tokens with long rows.
* The K/V rows are loaded before the slots are used and do not depend on them, so the
  slot load's latency overlaps the row loads; slots outside ``[0, rows)`` are masked in
  the kernel (the pool validates them already; this is defence in depth).
* The dtype conversion happens in the same kernel (:mod:`kvprof.kvcache.writers.triton_convert`).
  bf16 -> e4m3fn under torch 2.11's overflow-to-NaN rule runs in inline PTX, four elements
  at a time, with the overflow test packed into one integer add per bf16 pair
  (:func:`bf16_to_e4m3_packed`): fewer instructions on each warp's load -> store chain,
  which is what a write of a few tokens is bound by (docs/benchmarks.md).
* With programmatic dependent launch (PDL, sm_90+) the kernel waits (``griddepcontrol.wait``)
  before its first load, so back-to-back writes overlap one launch with the previous
  kernel's tail without reading what it still writes.
* On CPU the kernel runs under Triton's interpreter; Triton decides that when the kernel
  is decorated, i.e. when this module is imported, from ``TRITON_INTERPRET``.

The compile-time flags travel packed in one ``MODE`` constexpr (:func:`mode_bits`): fewer
arguments, less launch overhead.
"""

from __future__ import annotations

import torch

from kvprof.kvcache.devinfo import decorates_triton_kernels
from kvprof.kvcache.writers.triton_convert import e4m3_saturates, triton

decorates_triton_kernels(__name__)  # before its kernels are decorated: Triton reads TRITON_INTERPRET then

if triton is not None:
    import triton.language as tl

    from kvprof.kvcache.writers.triton_convert import (
        BF16,
        E4M3,
        F16,
        F32,
        as_bits,
        hw_narrow,
        hw_widen,
        int_narrow,
        int_widen,
        to_storage,
    )
    from kvprof.kvcache.writers.triton_rows import program_tokens

# The kernel's name in every trace, Kineto's and nsys's alike: the Triton function's own name.
# The leading underscore tells it from the CUDA writer's ``kvprof::store_kv_kernel<...>`` (a
# substring match on "store_kv_kernel" would take both); the analysis's write pattern and the
# SGLang plugin's graph record look for this name.
KERNEL_NAME = "_store_kv_kernel"

# MODE bits: input kind (0-2), output kind (3-5), then one flag each
MODE_K_SCALED = 1 << 6
MODE_V_SCALED = 1 << 7
MODE_HW = 1 << 8  # hardware conversions (else the integer emulation)
MODE_SAT = 1 << 9  # torch saturates e4m3fn overflow (>= 2.12)
MODE_WIDE = 1 << 10  # 64-bit offsets
MODE_PDL = 1 << 11  # programmatic dependent launch
MODE_FP8_INT = 1 << 12  # fp8 through the integer routines (see fp8_cast_safe)
MODE_POW2 = 1 << 13  # the inverse scale is a power of two: no round trip through the input dtype
MODE_PACKED = 1 << 14  # bf16 -> e4m3fn through bf16_to_e4m3_packed
MODE_STREAM = 1 << 15  # streaming cache hints (TritonConfig.stream)


def mode_bits(in_kind: int, out_kind: int, k_scaled: bool, v_scaled: bool, hw: bool, sat: bool, wide: bool,
              pdl: bool) -> int:
    """The kernel's packed compile-time flags (MODE); FP8_INT, POW2 and PACKED are set per call."""
    return (in_kind | out_kind << 3 | k_scaled * MODE_K_SCALED | v_scaled * MODE_V_SCALED | hw * MODE_HW
            | sat * MODE_SAT | wide * MODE_WIDE | pdl * MODE_PDL)


def interpreted() -> bool:
    """Whether the kernel was decorated under TRITON_INTERPRET (it then runs on the host)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(store_kv_kernel, InterpretedFunction)


def packed_e4m3(hw: bool, in_dtype: torch.dtype, dtype: torch.dtype) -> bool:
    """Whether bf16 -> e4m3fn takes the packed fix-up (:func:`bf16_to_e4m3_packed`): only under
    torch 2.11's overflow-to-NaN rule, which is what the fix-up is for."""
    return (hw and in_dtype == torch.bfloat16 and dtype == torch.float8_e4m3fn and not e4m3_saturates()
            and not interpreted())  # inline PTX: compiled kernels only


def fp8_cast_safe(rk: int, rv: int, k_stride: int, v_stride: int, block_t: int, num_warps: int,
                  block_k: int, block_v: int) -> bool:
    """Whether Triton's packed fp8 cast may be used for this launch, else the integer encode.

    Triton converts fp32 <-> fp8 in pairs (cvt.rn.satfinite.e4m3x2.f32). Where a thread
    holds its elements in pairs (2 contiguous per row chunk), the ptxas bundled with
    Triton 3.6 emits sm_90 SASS that merges the stack-pointer register R1 into the second
    byte (docs/benchmarks.md, "Triton's packed fp8 cast", has the failing launch). Rows in
    16-element multiples, 16-element aligned token strides and >= 4 elements per thread do
    not show it (the layouts every common KV shape gets: 1x128 .. 32x128). Anything else
    takes the exact integer encode (slower, rare), and so do fp8 *inputs* (their widening
    and rounding show the same defect).
    ``block_k``/``block_v``: the columns one program holds (the row's block over ``split``)."""
    if rk % 16 or rv % 16 or k_stride % 16 or v_stride % 16 or block_k % 16 or block_v % 16:
        return False
    threads = 32 * num_warps
    return block_t * block_k >= 4 * threads and block_t * block_v >= 4 * threads


if triton is not None:
    # bf16 -> e4m3fn, four elements per instance: widen, multiply (MUL), the paired satfinite
    # cast, and torch 2.11's overflow rule as one packed integer test per bf16 pair:
    # ((w & 0x7fff7fff) + $7) sets bit 15/31 where |x| > T ($7 = (0x7fff - T) * 0x10001: no
    # carry between the halves), a byte permute gathers those bits and one OR turns each
    # flagged 0x7E|s into 0x7F|s (NaN). Triton's own fix-up spends a compare, a select and
    # byte merges per element (docs/benchmarks.md). $3: the inverse scale's fp32 bits.
    _E4M3_BODY = """
        .reg .b32 a0, a1, a2, a3, m0, m1, q;
        .reg .f32 f0, f1, f2, f3, fi;
        .reg .b16 h0, h1;
        shl.b32 a0, $1, 16;
        and.b32 a1, $1, 0xffff0000;
        shl.b32 a2, $2, 16;
        and.b32 a3, $2, 0xffff0000;
        mov.b32 f0, a0;
        mov.b32 f1, a1;
        mov.b32 f2, a2;
        mov.b32 f3, a3;
        {MUL}
        cvt.rn.satfinite.e4m3x2.f32 h0, f1, f0;
        cvt.rn.satfinite.e4m3x2.f32 h1, f3, f2;
        mov.b32 q, {h0, h1};
        and.b32 m0, $1, 0x7fff7fff;
        add.u32 m0, m0, $7;
        and.b32 m1, $2, 0x7fff7fff;
        add.u32 m1, m1, $7;
        prmt.b32 m0, m0, m1, 0x7531;
        shr.b32 m0, m0, 7;
        and.b32 m0, m0, 0x01010101;
        or.b32 $0, q, m0;
    """
    _E4M3_MUL = """mov.b32 fi, $3;
        mul.rn.f32 f0, f0, fi;
        mul.rn.f32 f1, f1, fi;
        mul.rn.f32 f2, f2, fi;
        mul.rn.f32 f3, f3, fi;"""
    _E4M3_ASM_MUL: tl.constexpr = tl.constexpr("{" + _E4M3_BODY.replace("{MUL}", _E4M3_MUL) + "}")
    _E4M3_ASM: tl.constexpr = tl.constexpr("{" + _E4M3_BODY.replace("{MUL}", "") + "}")

    @triton.jit
    def bf16_to_e4m3_packed(bits, inv, thr, MUL: tl.constexpr):
        """bf16 bits (int16) -> e4m3fn bytes of ``bf16(x) * inv`` (MUL; exact: a power of two)
        or of ``x``, NaN where |x| > ``thr`` (bf16 bits of 464 / inv), as torch 2.11 casts."""
        zero = tl.zeros(bits.shape, tl.int32)
        inv_bits = (zero.to(tl.float32) + inv).to(tl.int32, bitcast=True)
        t2 = zero + (0x7FFF - thr) * 0x10001
        if MUL:
            r = tl.inline_asm_elementwise(_E4M3_ASM_MUL, "=r,r,r,r,r,r,r,r,r,r,r", [bits, inv_bits, t2],
                                          dtype=tl.uint8, is_pure=True, pack=4)
        else:
            r = tl.inline_asm_elementwise(_E4M3_ASM, "=r,r,r,r,r,r,r,r,r,r,r", [bits, inv_bits, t2],
                                          dtype=tl.uint8, is_pure=True, pack=4)
        return r

    @triton.jit
    def convert_bits(raw, inv, IN: tl.constexpr, OUT: tl.constexpr, SCALED: tl.constexpr, HW: tl.constexpr,
                     SAT: tl.constexpr, FP8_INT: tl.constexpr = 0, POW2: tl.constexpr = 0, PACKED: tl.constexpr = 0):
        """Input rows (raw storage bits) -> cache storage bits:
        ``(x.float() * inv).to(x.dtype).to(cache_dtype)``, or ``x.to(cache_dtype)``.
        POW2: ``inv`` is a power of two and the input bf16/fp32, so the round trip through
        the input dtype is exact and skipped (see ``pow2_exact``). PACKED: bf16 -> e4m3fn
        under torch 2.11's rule through ``bf16_to_e4m3_packed`` (>= 4 elements per thread)."""
        if HW and PACKED and IN == BF16 and OUT == E4M3 and SAT == 0 and FP8_INT == 0:
            if SCALED and POW2 == 0:  # round to bf16 first (the reference's .to(x.dtype)), then cast
                y = hw_narrow(hw_widen(raw, IN, FP8_INT) * inv, IN, SAT, FP8_INT)
                r = bf16_to_e4m3_packed(y, 1.0, 0x43E8, 0)
            elif SCALED:  # x * inv is exact: the test moves onto x, against 464 / inv (exact too)
                # inv = 2^e: 464 / inv = 1.8125 * 2^(8 - e), bf16 bits ((135 - e) << 7) | 0x68,
                # with e + 127 the exponent field of inv (integer ops, no division)
                e_field = (inv.to(tl.int32, bitcast=True) >> 23) & 0xFF
                thr = ((262 - e_field) << 7) | 0x68
                r = bf16_to_e4m3_packed(raw, inv, thr, 1)
            else:
                r = bf16_to_e4m3_packed(raw, 1.0, 0x43E8, 0)
        elif HW:
            x = hw_widen(raw, IN, FP8_INT)
            if SCALED:
                x = x * inv
                if IN != F32 and POW2 == 0:
                    x = hw_widen(hw_narrow(x, IN, SAT, FP8_INT), IN, FP8_INT)
            r = hw_narrow(x, OUT, SAT, FP8_INT)
        else:
            if IN == F32:
                code = raw
            elif IN == BF16 or IN == F16:
                code = raw.to(tl.int32) & 0xFFFF
            else:
                code = raw.to(tl.int32) & 0xFF
            xb = int_widen(code, IN)
            if SCALED:
                xb = (xb.to(tl.float32, bitcast=True) * inv).to(tl.int32, bitcast=True)
                if IN != F32 and POW2 == 0:
                    xb = int_widen(int_narrow(xb, IN, SAT), IN)
            r = int_narrow(xb, OUT, SAT)
        return r

    @triton.jit(do_not_specialize=["tokens", "rows"])
    def _store_kv_kernel(
        k_out, v_out, loc, k_in, v_in,
        k_inv, v_inv,
        tokens, rows, k_stride, v_stride,
        RK: tl.constexpr, RV: tl.constexpr,
        BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_T: tl.constexpr, SPLIT: tl.constexpr,
        MODE: tl.constexpr,
    ):
        """Program (p, c) writes chunk c of SPLIT of the K and V rows (RK and RV elements,
        row-major; the cache's rows are [slot, RK] and [slot, RV]) of tokens
        [p*BLOCK_T, (p+1)*BLOCK_T). MODE packs the compile-time flags (see ``mode_bits``):
        fewer arguments, less launch overhead."""
        IN: tl.constexpr = MODE & 7
        OUT: tl.constexpr = (MODE >> 3) & 7
        K_SCALED: tl.constexpr = (MODE >> 6) & 1
        V_SCALED: tl.constexpr = (MODE >> 7) & 1
        HW: tl.constexpr = (MODE >> 8) & 1
        SAT: tl.constexpr = (MODE >> 9) & 1
        WIDE: tl.constexpr = (MODE >> 10) & 1
        PDL: tl.constexpr = (MODE >> 11) & 1
        FP8_INT: tl.constexpr = (MODE >> 12) & 1
        POW2: tl.constexpr = (MODE >> 13) & 1
        PACKED: tl.constexpr = (MODE >> 14) & 1
        STREAM: tl.constexpr = (MODE >> 15) & 1
        CK: tl.constexpr = BLOCK_K // SPLIT  # columns of K and of V per program
        CV: tl.constexpr = BLOCK_V // SPLIT
        tok, tmask, slot = program_tokens(loc, tokens, BLOCK_T, WIDE, PDL)

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
        # Row loads: independent of the slots, issued while the slot load is in flight.
        if STREAM:
            k_raw = tl.load(k_in + tok[:, None] * k_stride + ck[None, :], mask=kin_mask, eviction_policy="evict_first")
            v_raw = tl.load(v_in + tok[:, None] * v_stride + cv[None, :], mask=vin_mask, eviction_policy="evict_first")
        else:
            k_raw = tl.load(k_in + tok[:, None] * k_stride + ck[None, :], mask=kin_mask)
            v_raw = tl.load(v_in + tok[:, None] * v_stride + cv[None, :], mask=vin_mask)

        k_raw = as_bits(k_raw, IN)
        v_raw = as_bits(v_raw, IN)
        if IN == OUT:
            k_new = k_raw
            v_new = v_raw
        else:
            k_new = to_storage(convert_bits(k_raw, k_inv, IN, OUT, K_SCALED, HW, SAT, FP8_INT, POW2, PACKED), OUT)
            v_new = to_storage(convert_bits(v_raw, v_inv, IN, OUT, V_SCALED, HW, SAT, FP8_INT, POW2, PACKED), OUT)

        ok = tmask & (slot >= 0) & (slot < rows)  # never write outside the buffer
        if WIDE:
            row = slot.to(tl.int64)
        else:
            row = slot.to(tl.int32)
        k_mask = ok[:, None] if RK == BLOCK_K else ok[:, None] & (ck[None, :] < RK)
        v_mask = ok[:, None] if RV == BLOCK_V else ok[:, None] & (cv[None, :] < RV)
        if STREAM:
            tl.store(k_out + row[:, None] * RK + ck[None, :],
                     k_new.to(k_out.dtype.element_ty, bitcast=True), mask=k_mask, cache_modifier=".cs")
            tl.store(v_out + row[:, None] * RV + cv[None, :],
                     v_new.to(v_out.dtype.element_ty, bitcast=True), mask=v_mask, cache_modifier=".cs")
        else:
            tl.store(k_out + row[:, None] * RK + ck[None, :],
                     k_new.to(k_out.dtype.element_ty, bitcast=True), mask=k_mask)
            tl.store(v_out + row[:, None] * RV + cv[None, :],
                     v_new.to(v_out.dtype.element_ty, bitcast=True), mask=v_mask)

    store_kv_kernel = _store_kv_kernel  # what kvprof's code launches (and lab's probes replace)
