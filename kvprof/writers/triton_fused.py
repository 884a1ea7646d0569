"""kvprof's own fused K+V write in Triton: one launch stores both rows for every token.

Why it looks the way it does:

* One program handles ``block_t`` tokens (a ``[block_t, row]`` tile per K and V), so
  small rows still give each program enough bytes, and rows are read and written as
  contiguous vectors (16-byte accesses when row size and alignment allow it).
* The K/V rows are loaded before the slots are used and do not depend on them, so the
  slot load's latency overlaps the row loads; slots outside ``[0, rows)`` are masked
  in the kernel (the pool validates them already; this is defence in depth).
* The dtype conversion happens in the same kernel and is bitwise PyTorch's reference
  (:func:`kvprof.dtypes.convert_for_cache`) for every non-NaN input. Two
  implementations, chosen at compile time:

  - ``hw`` (compiled for a GPU): the hardware round-to-nearest-even conversions
    (``cvt.rn``), plus a fix-up for fp8, because the hardware fp8 conversion saturates
    (``satfinite``) where c10's routine overflows to inf (e5m2) or, before torch 2.12,
    to NaN (e4m3fn; torch >= 2.12 saturates it too: the rule is probed at run time, see
    ``e4m3_saturates``). A few instructions per element: large fp8 writes stay memory-bound.
    bf16 -> e4m3fn under the NaN rule runs in inline PTX, four elements at a time, with the
    overflow test packed into one integer add per bf16 pair (``_bf16_to_e4m3_packed``): at
    one token the per-element fix-up was the fp8 write's extra time (gpu/fp8_ablation.py).
  - ``int`` (Triton's interpreter, whose own float casts do not round to nearest
    even): PyTorch's c10 bit algorithms written with integer ops on the fp32 bits.

  NaN inputs are written as NaN, but their bits are not guaranteed to match: PyTorch
  itself gives different NaN bits for the same input on CPU (depending on tensor size)
  and on CUDA, so there is no single reference to match.
* On a GPU (sm_90+) it launches with programmatic dependent launch by default: the
  kernel waits (``griddepcontrol.wait``) before its first load, so back-to-back writes
  overlap one launch with the previous kernel's tail (1-token writes ~0.7 us instead of
  ~1.2 us in graph replays on an H200).
* On CPU the kernel runs under Triton's interpreter; Triton decides that when the
  kernel is decorated, i.e. when this module is imported, from ``TRITON_INTERPRET``.

The launch configuration is a function of (row bytes, tokens) in two small tables, one
for fp8 caches (``TRITON_TABLE``, ``TRITON_TABLE_FP8``), measured by ``gpu/tune_fused.py``,
which overrides them per call with ``config=``.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from kvprof.dtypes import inverse_scale
from kvprof.writers.base import FUSED, KVWriter

try:  # triton is optional (pip install kvprof[triton])
    import triton
    import triton.language as tl

    _TRITON_ERROR: str | None = None
except Exception as exc:  # ImportError, or a triton that fails to initialise
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    _TRITON_ERROR = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip()

# Element kinds; the order is shared with the CUDA op (csrc/store_kv.cu).
KINDS: dict[torch.dtype, int] = {
    torch.float32: 0,
    torch.bfloat16: 1,
    torch.float16: 2,
    torch.float8_e4m3fn: 3,
    torch.float8_e5m2: 4,
}

_INT32_MAX = 2**31 - 1
_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


@dataclass(frozen=True)
class TritonConfig:
    """Launch shape: tokens per program, warps per program, and column chunks per row.

    ``split`` > 1 cuts every K and V row into that many chunks, one program each (grid
    axis 1): a write of a few tokens with long rows then runs on ``split`` times as many
    SMs instead of making one SM issue every load, conversion and store of the row."""

    block_t: int
    num_warps: int
    split: int = 1

    def __post_init__(self) -> None:
        if self.block_t < 1 or self.block_t & (self.block_t - 1):
            raise ValueError(f"block_t must be a power of two, got {self.block_t}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if self.split < 1 or self.split & (self.split - 1):
            raise ValueError(f"split must be a power of two, got {self.split}")


# (largest K+V input row bytes per token, largest token count, config): first match wins.
# From gpu/tune_fused.py on an H200 (docs/gpu/tune-2026-12-02.txt: graph replays, the bench's
# method). 512-byte rows (1x128 bf16) want one token per program for a handful of tokens,
# then more tokens per program as the write grows; 4 KB rows (8x128, 4x256) one or two
# tokens per program with 4 warps; 16 KB rows (32x128) split into column chunks for up to 64
# tokens (one program per chunk: 0.90 -> 0.71 us at 1 token), then 16 warps per token.
# Few tokens (gpu/fp8_ablation.py, docs/gpu/fp8-ablation-*.txt, interleaved, same allocation):
# the fp8 table's 4-elements-per-thread shapes are faster for the copy too: 1x128 x 1 token
# (4 tokens, 4 warps) 0.678 -> 0.651 us, x 64 0.710 -> 0.692; 32x128 x 1 (8 warps, split 4)
# 0.721 -> 0.707.
TRITON_TABLE: list[tuple[int, int, TritonConfig]] = [
    (1024, 64, TritonConfig(4, 4)),
    (1024, 512, TritonConfig(4, 1)),
    (1024, 4096, TritonConfig(8, 2)),
    (1024, 1 << 62, TritonConfig(16, 4)),
    (8192, 512, TritonConfig(1, 4)),
    (8192, 4096, TritonConfig(2, 4)),
    (8192, 1 << 62, TritonConfig(1, 4)),
    (1 << 62, 1, TritonConfig(1, 8, 4)),
    (1 << 62, 8, TritonConfig(1, 4, 2)),
    (1 << 62, 64, TritonConfig(1, 2, 4)),
    (1 << 62, 1 << 62, TritonConfig(1, 16)),
]
# fp8 caches (the conversion runs in the kernel). Few tokens: latency-bound, so each warp's
# load -> convert -> store chain is what counts, and the best shapes give every thread 4
# elements per row chunk (more warps, or more column chunks for long rows): 8x128 x 1 token
# 0.72 -> 0.66 us, 32x128 x 64 1.26 -> 1.08, 1x128 x 4096 1.67 -> 1.49
# (docs/gpu/tune-fp8-2026-12-02.txt). 512 tokens and up: docs/gpu/tune-2026-12-02.txt.
TRITON_TABLE_FP8: list[tuple[int, int, TritonConfig]] = [
    (1024, 64, TritonConfig(4, 4)),
    (1024, 512, TritonConfig(4, 2)),
    (1024, 4096, TritonConfig(8, 4)),
    (1024, 1 << 62, TritonConfig(32, 8)),
    (8192, 1, TritonConfig(1, 8)),
    (8192, 8, TritonConfig(1, 4)),
    (8192, 64, TritonConfig(1, 8)),
    (8192, 512, TritonConfig(1, 4)),
    (8192, 4096, TritonConfig(2, 8)),
    (8192, 1 << 62, TritonConfig(2, 8)),
    (1 << 62, 1, TritonConfig(1, 8, 4)),
    (1 << 62, 8, TritonConfig(1, 4, 8)),
    (1 << 62, 64, TritonConfig(1, 4, 4)),
    (1 << 62, 1 << 62, TritonConfig(1, 16)),
]


def pick_config(row_bytes: int, tokens: int, table: list[tuple[int, int, TritonConfig]] | None = None,
                fp8: bool = False) -> TritonConfig:
    """The table's config for one token's K+V input bytes and the token count (``fp8``: the
    cache is fp8, converted in the kernel)."""
    for max_row, max_tokens, cfg in table or (TRITON_TABLE_FP8 if fp8 else TRITON_TABLE):
        if row_bytes <= max_row and tokens <= max_tokens:
            return cfg
    return TritonConfig(1, 8)


@functools.cache
def e4m3_saturates() -> bool:
    """Whether this torch saturates fp32 -> float8_e4m3fn overflow to +-448 (torch >= 2.12,
    pytorch#178817) or makes it NaN (older c10). Probed once on the host: the CUDA casts of a
    release follow the same c10 routine. e5m2 overflow is inf in both."""
    probe = torch.tensor([470.0, 1.0e6, float("inf")]).to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    if probe == [0x7E, 0x7E, 0x7E]:
        return True
    if probe == [0x7F, 0x7F, 0x7F]:
        return False
    raise RuntimeError(f"unknown float8_e4m3fn overflow rule in torch {torch.__version__}: {probe}")


def _interpreted() -> bool:
    """Whether the kernel was decorated under TRITON_INTERPRET (it then runs on the host)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_store_kv_kernel, InterpretedFunction)


if triton is not None:
    F32: tl.constexpr = tl.constexpr(0)
    BF16: tl.constexpr = tl.constexpr(1)
    F16: tl.constexpr = tl.constexpr(2)
    E4M3: tl.constexpr = tl.constexpr(3)
    E5M2: tl.constexpr = tl.constexpr(4)

    # ---------------------------------------------------------------------------------
    # int path: PyTorch's rounding on the fp32 bits, integer ops only (interpreter-safe).
    # Values are int32 codes: fp32 bits, or a narrower format's bits in the low bits.
    # ---------------------------------------------------------------------------------
    @triton.jit
    def _int_widen(code, KIND: tl.constexpr):
        """A KIND code (int32, format bits in the low bits) -> its exact fp32 bits."""
        if KIND == F32:
            r = code
        elif KIND == BF16:
            r = code << 16
        elif KIND == E4M3:
            u = code & 0xFF
            e = (u >> 3) & 0xF
            m = u & 0x7
            normal = ((e + 120) << 23) | (m << 20)
            sub = (m.to(tl.float32) * 0.001953125).to(tl.int32, bitcast=True)  # m * 2^-9, exact
            r = tl.where(e == 0, sub, tl.where((e == 15) & (m == 7), 0x7FC00000, normal))
            r = r | ((u >> 7) << 31)
        else:  # F16, or E5M2 (the top byte of an fp16)
            if KIND == E5M2:
                h = (code & 0xFF) << 8
            else:
                h = code & 0xFFFF
            e = (h >> 10) & 0x1F
            m = h & 0x3FF
            normal = ((e + 112) << 23) | (m << 13)
            sub = (m.to(tl.float32) * 5.9604644775390625e-08).to(tl.int32, bitcast=True)  # m * 2^-24
            r = tl.where(e == 0, sub, tl.where(e == 31, 0x7F800000 | (m << 13), normal))
            r = r | ((h >> 15) << 31)
        return r

    @triton.jit
    def _int_round_small(a, M: tl.constexpr, B: tl.constexpr):
        """|x| fp32 bits -> round-to-nearest-even code of a format with M mantissa bits
        and exponent bias B, subnormals included (overflow is the caller's)."""
        SH: tl.constexpr = 23 - M
        r = a - ((127 - B) << 23)
        normal = (r + ((1 << (SH - 1)) - 1) + ((r >> SH) & 1)) >> SH
        e = a >> 23
        sig = tl.where(e > 0, (a & 0x7FFFFF) | 0x800000, a)
        s = tl.minimum(tl.maximum(SH + (128 - B) - tl.maximum(e, 1), 1), 30)
        q = sig >> s
        rem = sig - (q << s)
        half = 1 << (s - 1)
        up = (rem > half) | ((rem == half) & ((q & 1) == 1))
        sub = q + up.to(tl.int32)
        return tl.where(a < ((128 - B) << 23), sub, normal)

    @triton.jit
    def _int_narrow(xb, KIND: tl.constexpr, SAT: tl.constexpr):
        """fp32 bits -> KIND code, as torch rounds (c10 for bf16 and fp8, IEEE RNE for fp16).
        SAT: torch >= 2.12 saturates e4m3fn overflow (and inf) to +-448; before, NaN."""
        sign = (xb >> 31) & 1
        a = xb & 0x7FFFFFFF
        if KIND == F32:
            r = xb
        elif KIND == BF16:
            r = (a + 0x7FFF + ((a >> 16) & 1)) >> 16
            r = tl.where(a > 0x7F800000, 0x7FFF, r | (sign << 15))
        elif KIND == F16:
            r = _int_round_small(a, 10, 15)
            r = tl.where(a >= 0x47800000, 0x7C00, r)  # >= 65536: inf
            r = tl.where(a > 0x7F800000, 0x7FFF, r | (sign << 15))
        elif KIND == E4M3:
            r = _int_round_small(a, 3, 7)
            if SAT:  # finite overflow and inf -> 448 (0x7E), NaN -> 0x7F
                r = tl.where(a >= 0x43F00000, tl.where(a > 0x7F800000, 0x7F, 0x7E), tl.minimum(r, 0x7E))
            else:  # >= 480, inf, NaN: NaN; (464, 480) already rounds to 0x7F
                r = tl.where(a >= 0x43F00000, 0x7F, r)
            r = r | (sign << 7)
        else:  # E5M2
            r = _int_round_small(a, 2, 15)
            r = tl.where(a >= 0x47800000, tl.where(a > 0x7F800000, 0x7F, 0x7C), r)  # >= 65536: inf
            r = r | (sign << 7)
        return r

    # ---------------------------------------------------------------------------------
    # hw path: hardware cvt.rn conversions, fp8 fixed up to PyTorch's non-saturating rule.
    # ---------------------------------------------------------------------------------
    @triton.jit
    def _hw_widen(bits, KIND: tl.constexpr, FP8_INT: tl.constexpr):
        """Raw storage bits of KIND -> fp32 (exact)."""
        if (KIND == E4M3 or KIND == E5M2) and FP8_INT:
            x = _int_widen(bits.to(tl.int32) & 0xFF, KIND).to(tl.float32, bitcast=True)
        elif KIND == F32:
            x = bits.to(tl.float32, bitcast=True)
        elif KIND == BF16:
            x = bits.to(tl.bfloat16, bitcast=True).to(tl.float32)
        elif KIND == F16:
            x = bits.to(tl.float16, bitcast=True).to(tl.float32)
        elif KIND == E4M3:
            x = bits.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        else:
            x = bits.to(tl.float8e5, bitcast=True).to(tl.float32)
        return x

    @triton.jit
    def _hw_narrow(x, KIND: tl.constexpr, SAT: tl.constexpr, FP8_INT: tl.constexpr):
        """fp32 -> raw storage bits of KIND, rounded as torch rounds. FP8_INT: encode fp8
        with the integer routine instead of Triton's packed cast (see ``_fp8_cast_safe``)."""
        if (KIND == E4M3 or KIND == E5M2) and FP8_INT:
            r = _int_narrow(x.to(tl.int32, bitcast=True), KIND, SAT).to(tl.uint8)
        elif KIND == F32:
            r = x.to(tl.int32, bitcast=True)
        elif KIND == BF16:
            r = x.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.int16, bitcast=True)
        elif KIND == F16:
            r = x.to(tl.float16, fp_downcast_rounding="rtne").to(tl.int16, bitcast=True)
        elif KIND == E4M3:
            # satfinite gives +-448 (0x7E|s) above 464: torch >= 2.12 too, older torch NaN (0x7F|s)
            c = x.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
            if SAT:
                r = c
            else:
                r = c | (tl.abs(x) > 464.0).to(tl.uint8)
        else:
            # satfinite gives +-57344 (0x7B|s) from 61440 on where torch gives inf (0x7C|s)
            c = x.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
            r = c + (tl.abs(x) >= 61440.0).to(tl.uint8)
        return r

    @triton.jit
    def _as_bits(x, KIND: tl.constexpr):
        """Reinterpret loaded values as KIND's storage integer (free)."""
        if KIND == F32:
            r = x.to(tl.int32, bitcast=True)
        elif KIND == BF16 or KIND == F16:
            r = x.to(tl.int16, bitcast=True)
        else:
            r = x.to(tl.uint8, bitcast=True)
        return r

    @triton.jit
    def _to_storage(code, KIND: tl.constexpr):
        """Truncate a code to KIND's storage integer."""
        if KIND == F32:
            r = code.to(tl.int32)
        elif KIND == BF16 or KIND == F16:
            r = code.to(tl.int16)
        else:
            r = code.to(tl.uint8)
        return r

    # bf16 -> e4m3fn, four elements per instance: widen, multiply (MUL), the paired satfinite
    # cast, and torch 2.11's overflow rule as one packed integer test per bf16 pair:
    # ((w & 0x7fff7fff) + $7) sets bit 15/31 where |x| > T ($7 = (0x7fff - T) * 0x10001: no
    # carry between the halves), a byte permute gathers those bits and one OR turns each
    # flagged 0x7E|s into 0x7F|s (NaN). Triton's own fix-up spends a compare, a select and
    # byte merges per element (docs/benchmarks.md: it was the fp8 write's whole extra time at
    # one token). $3: the inverse scale's fp32 bits.
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
    def _bf16_to_e4m3_packed(bits, inv, thr, MUL: tl.constexpr):
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

    # gpu/fp8_ablation.py only (MODE bits 15-17, never set by the writer): N dependent integer
    # ops that leave a pair of 16-bit row values unchanged, alternating add and xor of a zero
    # the compiler cannot see (the sign bit of a positive inverse scale), so ptxas can neither
    # fold nor merge them. They measure what one more step on a warp's load -> store chain
    # costs at the latency floor: the yardstick for the steps of the fp8 conversion.
    @triton.jit
    def _dependent_ops(bits, inv, N: tl.constexpr):
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

    @triton.jit
    def _convert(raw, inv, IN: tl.constexpr, OUT: tl.constexpr, SCALED: tl.constexpr, HW: tl.constexpr,
                 SAT: tl.constexpr, FP8_INT: tl.constexpr = 0, POW2: tl.constexpr = 0, PACKED: tl.constexpr = 0):
        """Input rows (raw storage bits) -> cache storage bits:
        ``(x.float() * inv).to(x.dtype).to(cache_dtype)``, or ``x.to(cache_dtype)``.
        POW2: ``inv`` is a power of two and the input bf16/fp32, so the round trip through
        the input dtype is exact and skipped (see ``_pow2_exact``). PACKED: bf16 -> e4m3fn
        under torch 2.11's rule through ``_bf16_to_e4m3_packed`` (>= 4 elements per thread)."""
        if HW and PACKED and IN == BF16 and OUT == E4M3 and SAT == 0 and FP8_INT == 0:
            if SCALED and POW2 == 0:  # round to bf16 first (the reference's .to(x.dtype)), then cast
                y = _hw_narrow(_hw_widen(raw, IN, FP8_INT) * inv, IN, SAT, FP8_INT)
                r = _bf16_to_e4m3_packed(y, 1.0, 0x43E8, 0)
            elif SCALED:  # x * inv is exact: the test moves onto x, against 464 / inv (exact too)
                # inv = 2^e: 464 / inv = 1.8125 * 2^(8 - e), bf16 bits ((135 - e) << 7) | 0x68,
                # with e + 127 the exponent field of inv (integer ops, no division)
                e_field = (inv.to(tl.int32, bitcast=True) >> 23) & 0xFF
                thr = ((262 - e_field) << 7) | 0x68
                r = _bf16_to_e4m3_packed(raw, inv, thr, 1)
            else:
                r = _bf16_to_e4m3_packed(raw, 1.0, 0x43E8, 0)
        elif HW:
            x = _hw_widen(raw, IN, FP8_INT)
            if SCALED:
                x = x * inv
                if IN != F32 and POW2 == 0:
                    x = _hw_widen(_hw_narrow(x, IN, SAT, FP8_INT), IN, FP8_INT)
            r = _hw_narrow(x, OUT, SAT, FP8_INT)
        else:
            if IN == F32:
                code = raw
            elif IN == BF16 or IN == F16:
                code = raw.to(tl.int32) & 0xFFFF
            else:
                code = raw.to(tl.int32) & 0xFF
            xb = _int_widen(code, IN)
            if SCALED:
                xb = (xb.to(tl.float32, bitcast=True) * inv).to(tl.int32, bitcast=True)
                if IN != F32 and POW2 == 0:
                    xb = _int_widen(_int_narrow(xb, IN, SAT), IN)
            r = _int_narrow(xb, OUT, SAT)
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
        [p*BLOCK_T, (p+1)*BLOCK_T). MODE packs the compile-time flags (see ``_mode``):
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
        CHAIN: tl.constexpr = (MODE >> 15) & 7  # gpu/fp8_ablation.py only: see _dependent_ops
        CK: tl.constexpr = BLOCK_K // SPLIT  # columns of K and of V per program
        CV: tl.constexpr = BLOCK_V // SPLIT
        if PDL:  # programmatic dependent launch: let the next kernel start, wait for the last one
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        if WIDE:
            tok = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        else:
            tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)
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
        # Row loads: independent of the slots, issued while the slot load is in flight.
        k_raw = tl.load(k_in + tok[:, None] * k_stride + ck[None, :], mask=kin_mask)
        v_raw = tl.load(v_in + tok[:, None] * v_stride + cv[None, :], mask=vin_mask)

        k_raw = _as_bits(k_raw, IN)
        v_raw = _as_bits(v_raw, IN)
        if CHAIN > 0:
            tl.static_assert(IN == BF16 or IN == F16, "the dependent-op ablation takes 16-bit rows")
            k_raw = _dependent_ops(k_raw, k_inv, CHAIN)
            v_raw = _dependent_ops(v_raw, v_inv, CHAIN)
        if IN == OUT:
            k_new = k_raw
            v_new = v_raw
        else:
            k_new = _to_storage(_convert(k_raw, k_inv, IN, OUT, K_SCALED, HW, SAT, FP8_INT, POW2, PACKED), OUT)
            v_new = _to_storage(_convert(v_raw, v_inv, IN, OUT, V_SCALED, HW, SAT, FP8_INT, POW2, PACKED), OUT)

        ok = tmask & (slot >= 0) & (slot < rows)  # never write outside the buffer
        if WIDE:
            row = slot.to(tl.int64)
        else:
            row = slot.to(tl.int32)
        k_mask = ok[:, None] if RK == BLOCK_K else ok[:, None] & (ck[None, :] < RK)
        v_mask = ok[:, None] if RV == BLOCK_V else ok[:, None] & (cv[None, :] < RV)
        tl.store(k_out + row[:, None] * RK + ck[None, :],
                 k_new.to(k_out.dtype.element_ty, bitcast=True), mask=k_mask)
        tl.store(v_out + row[:, None] * RV + cv[None, :],
                 v_new.to(v_out.dtype.element_ty, bitcast=True), mask=v_mask)

    @triton.jit
    def _convert_kernel(out, inp, inv, n, IN: tl.constexpr, OUT: tl.constexpr,
                        SCALED: tl.constexpr, HW: tl.constexpr, SAT: tl.constexpr, BLOCK: tl.constexpr,
                        POW2: tl.constexpr = 0, PACKED: tl.constexpr = 0):
        """Elementwise conversion with the writer's exact rounding and paths (for exhaustive
        tests: 8 elements per thread, so the packed fp8 path runs as in the writer)."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        raw = _as_bits(tl.load(inp + offs, mask=mask), IN)
        if IN == OUT:
            r = raw
        else:
            r = _to_storage(_convert(raw, inv, IN, OUT, SCALED, HW, SAT, 0, POW2, PACKED), OUT)
        tl.store(out + offs, r.to(out.dtype.element_ty, bitcast=True), mask=mask)


def _mode(in_kind: int, out_kind: int, k_scaled: bool, v_scaled: bool, hw: bool, sat: bool, wide: bool,
          pdl: bool) -> int:
    """The kernel's packed compile-time flags (MODE)."""
    return (in_kind | out_kind << 3 | k_scaled << 6 | v_scaled << 7 | hw << 8 | sat << 9 | wide << 10
            | pdl << 11)  # bit 12: FP8_INT, bit 13: POW2, both set per call; bit 14: PACKED;
            # bits 15-17: CHAIN (gpu/fp8_ablation.py only)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _scale_flag(scale: Any, same: bool) -> tuple[bool, float]:
    if same or scale is None:
        return False, 1.0
    return True, _inverse(scale)


_INV_CACHE: dict[float, float] = {}


def _packed_e4m3(hw: bool, in_dtype: torch.dtype, dtype: torch.dtype) -> bool:
    """Whether bf16 -> e4m3fn takes the packed fix-up (``_bf16_to_e4m3_packed``): only under
    torch 2.11's overflow-to-NaN rule, which is what the fix-up is for."""
    return (hw and in_dtype == torch.bfloat16 and dtype == torch.float8_e4m3fn and not e4m3_saturates()
            and not _interpreted())  # inline PTX: compiled kernels only


def _pow2_exact(inv: float) -> bool:
    """Whether ``x * inv`` is exact for every bf16/fp32 ``x``, so that rounding the product
    back to the input dtype (the reference's ``.to(x.dtype)``) cannot change it: ``inv`` is
    a finite power of two. The only inexact products land below fp32's normal range
    (< 2^-126) or overflow to inf; fp8 rounds the former to a signed zero and the latter to
    the same inf/saturated value with or without the round trip. Not for fp16 inputs: their
    narrower exponent range makes the round trip round (fp16 subnormals, overflow)."""
    mantissa, exponent = math.frexp(inv)
    # |exponent| <= 100 keeps 464 / inv a normal number, the packed fp8 path's overflow bound
    return mantissa == 0.5 and math.isfinite(inv) and abs(exponent) <= 100


def _inverse(scale: float | torch.Tensor) -> float:
    """inverse_scale, memoised for Python numbers (it is on the host hot path)."""
    if isinstance(scale, torch.Tensor):
        return inverse_scale(scale)
    inv = _INV_CACHE.get(scale)
    if inv is None:
        inv = inverse_scale(scale)
        if len(_INV_CACHE) < 4096:
            _INV_CACHE[scale] = inv
    return inv


def convert_with_kernel(
    x: torch.Tensor, dtype: torch.dtype, scale: float | torch.Tensor | None, *, hw: bool | None = None
) -> torch.Tensor:
    """Convert a tensor exactly as the writer's kernel does, returned as the cache's storage
    dtype (uint8 for fp8). For tests: compare with ``convert_for_cache``."""
    if triton is None:
        raise RuntimeError(f"triton is not importable ({_TRITON_ERROR})")
    from kvprof.dtypes import store_dtype_for

    flat = x.reshape(-1)
    out = torch.empty(flat.shape, dtype=store_dtype_for(dtype), device=x.device)
    if flat.numel() == 0:
        return out.view(x.shape)
    same = x.dtype == dtype
    scaled, inv = _scale_flag(scale, same)
    use_hw = (not _interpreted()) if hw is None else hw
    block = 1024
    pow2 = scaled and x.dtype in (torch.bfloat16, torch.float32) and dtype in _FP8 and _pow2_exact(inv)
    _convert_kernel[(triton.cdiv(flat.numel(), block),)](
        out, flat, inv, flat.numel(), IN=KINDS[x.dtype], OUT=KINDS[dtype], SCALED=scaled, HW=use_hw,
        SAT=e4m3_saturates(), BLOCK=block, POW2=int(pow2), PACKED=int(_packed_e4m3(use_hw, x.dtype, dtype)),
    )
    return out.view(x.shape)


class TritonFusedWriter(KVWriter):
    """One Triton launch writes K and V rows at ``loc``, converting dtype in the kernel."""

    name = "triton_fused"
    description = "kvprof's fused Triton store: one launch for K and V, dtype conversion in-kernel"
    fused = True
    devices = ("cpu", "cuda")

    def __init__(self, config: TritonConfig | dict[str, int] | None = None, convert: str = "auto",
                 pdl: bool | None = None, packed_fp8: bool = True) -> None:
        """``config`` forces one launch shape (tuning); ``convert`` is 'auto', 'hw' or 'int'
        (the integer emulation of torch's rounding also runs on a GPU, for comparison);
        ``pdl``: programmatic dependent launch. None (default) turns it on where it exists
        (compiled kernel, sm_90+): back-to-back small writes then overlap one kernel's launch
        with the previous one's tail, which is what keeps a 1-token write near 0.7 us on an
        H200 instead of ~1.2 us. The kernel waits (griddepcontrol.wait) before its first load,
        so it never reads what the previous kernel is still writing. ``packed_fp8=False``
        keeps Triton's own per-element fp8 fix-up instead of the packed one (to compare)."""
        if isinstance(config, dict):
            config = TritonConfig(**config)
        if convert not in ("auto", "hw", "int"):
            raise ValueError(f"convert must be 'auto', 'hw' or 'int', got {convert!r}")
        self.config = config
        self.convert = convert
        self.pdl = pdl
        self.packed_fp8 = bool(packed_fp8)
        self._plans: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        reason = super().unsupported_reason(device, dtype, input_dtype)
        if reason:
            return reason
        if triton is None:
            return f"triton is not importable ({_TRITON_ERROR})"
        interpreted = _interpreted()
        if device.type == "cpu" and not interpreted:
            return (
                "triton_fused on CPU runs in Triton's interpreter: set TRITON_INTERPRET=1 before "
                "kvprof.writers.triton_fused is imported"
                + (" (it is set now, but was not at import)" if os.environ.get("TRITON_INTERPRET") else "")
            )
        if self.pdl and (interpreted or device.type != "cuda"):
            return "triton_fused(pdl=True) needs the compiled kernel on a CUDA device"
        if device.type == "cuda" and interpreted:
            return ("triton_fused was imported with TRITON_INTERPRET=1: its kernel would run in the "
                    "interpreter on the host, not on the GPU (unset it, or set TRITON_INTERPRET=0)")
        for d in (dtype, input_dtype):
            if d is not None and d not in KINDS:
                return f"triton_fused has no conversion for {d}"
        return None

    def _plan(self, k_buf: torch.Tensor, v_buf: torch.Tensor, in_dtype: torch.dtype, dtype: torch.dtype,
              key: tuple[Any, ...]) -> tuple[Any, ...]:
        """Everything that depends only on the buffers and dtypes, computed once."""
        if not (k_buf.is_contiguous() and v_buf.is_contiguous()):
            raise ValueError("triton_fused needs contiguous K/V cache buffers")
        if dtype not in KINDS or in_dtype not in KINDS:
            raise ValueError(f"triton_fused has no conversion from {in_dtype} to {dtype}")
        rows = k_buf.shape[0]
        rk = k_buf[0].numel()
        rv = v_buf[0].numel()
        in_size = torch.empty((), dtype=in_dtype).element_size()
        compiled = k_buf.is_cuda and not _interpreted()
        hw = {"hw": True, "int": False}.get(self.convert, compiled)
        pdl = self.pdl
        if pdl is None:
            pdl = compiled and torch.cuda.get_device_capability(k_buf.device)[0] >= 9
        same = in_dtype == dtype
        base = _mode(KINDS[in_dtype], KINDS[dtype], False, False, hw, e4m3_saturates(), False, bool(pdl))
        # fp8 inputs (converted): always the integer routines; fp8 outputs: the hardware cast
        # where the layout is known-good (see _fp8_cast_safe), decided per call
        if hw and not same and in_dtype in _FP8:
            base |= 1 << 12  # FP8_INT
        fp8_hw = hw and not same and in_dtype not in _FP8 and dtype in _FP8
        if self.packed_fp8 and _packed_e4m3(hw, in_dtype, dtype):
            base |= 1 << 14  # PACKED (ignored where a launch takes FP8_INT)
        pow2_ok = not same and in_dtype in (torch.bfloat16, torch.float32) and dtype in _FP8
        plan = (rows, rk, rv, _pow2(rk), _pow2(rv), (rk + rv) * in_size, base, same,
                {"launch_pdl": True} if pdl else {}, fp8_hw, pow2_ok, dtype in _FP8)
        self._plans[key] = plan
        return plan

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
        tokens = loc.shape[0]
        if tokens == 0:
            return FUSED
        key = (k_buf.shape, v_buf.shape, k_buf.device, cache_k.dtype, dtype)
        plan = self._plans.get(key) or self._plan(k_buf, v_buf, cache_k.dtype, dtype, key)
        rows, rk, rv, bk, bv, row_bytes, mode, same, extra, fp8_hw, pow2_ok, fp8_out = plan
        cache_k = _rows(cache_k)
        cache_v = _rows(cache_v)
        if k_scale is not None and not same:
            mode |= 1 << 6
            k_inv = _inverse(k_scale)
        else:
            k_inv = 1.0
        if v_scale is not None and not same:
            mode |= 1 << 7
            v_inv = _inverse(v_scale)
        else:
            v_inv = 1.0
        if pow2_ok and mode & 0xC0 and _pow2_exact(k_inv) and _pow2_exact(v_inv):
            mode |= 1 << 13  # POW2: no round trip through the input dtype
        cfg = self.config or pick_config(row_bytes, tokens, fp8=fp8_out)
        block_t, num_warps, split = cfg.block_t, cfg.num_warps, min(cfg.split, bk, bv)
        k_stride, v_stride = cache_k.stride(0), cache_v.stride(0)
        if fp8_hw and not _fp8_cast_safe(rk, rv, k_stride, v_stride, block_t, num_warps, bk // split, bv // split):
            mode |= 1 << 12  # FP8_INT
        if rows * max(rk, rv) > _INT32_MAX or (tokens + block_t) * max(k_stride, v_stride, rk, rv) > _INT32_MAX:
            mode |= 1 << 10  # 64-bit offsets
        _store_kv_kernel[(triton.cdiv(tokens, block_t), split)](
            k_buf, v_buf, loc, cache_k, cache_v, k_inv, v_inv, tokens, rows, k_stride, v_stride,
            RK=rk, RV=rv, BLOCK_K=bk, BLOCK_V=bv, BLOCK_T=block_t, SPLIT=split, MODE=mode,
            num_warps=num_warps, **extra,
        )
        return FUSED


def _fp8_cast_safe(rk: int, rv: int, k_stride: int, v_stride: int, block_t: int, num_warps: int,
                   block_k: int, block_v: int) -> bool:
    """Whether Triton's packed fp8 cast may be used for this launch, else the integer encode.

    Triton converts fp32 <-> fp8 in pairs (cvt.rn.satfinite.e4m3x2.f32). When a thread ends
    up with its elements in pairs (2 contiguous per row chunk), the ptxas bundled with
    Triton 3.6 (the H200's) emits SASS that merges the stack-pointer register R1 into the
    second byte: every odd element came out as 0xFC in the H200 GPU tests (a 1x20 row,
    4 tokens x 2 warps). Reproduced offline by compiling for sm_90a with Triton 3.6's ptxas
    and reading the SASS; it never showed with rows in 16-element multiples, 16-element
    aligned token strides and >= 4 elements per thread (the layouts every common KV shape
    gets: 1x128 .. 32x128). Anything else takes the exact integer encode (slower, rare),
    and so do fp8 *inputs* (their widening and rounding showed the same defect).
    ``block_k``/``block_v``: the columns one program holds (the row's block over ``split``)."""
    if rk % 16 or rv % 16 or k_stride % 16 or v_stride % 16 or block_k % 16 or block_v % 16:
        return False
    threads = 32 * num_warps
    return block_t * block_k >= 4 * threads and block_t * block_v >= 4 * threads


def _rows(t: torch.Tensor) -> torch.Tensor:
    """Rows must be contiguous after the token dimension (any token stride); copy if not."""
    if t.stride(-1) != 1 or (t.dim() == 3 and t.stride(1) != t.shape[2]) or t.dim() > 3:
        t = t.contiguous()
    return t
