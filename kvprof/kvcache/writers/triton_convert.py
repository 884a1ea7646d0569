"""Dtype conversion for kvprof's fused Triton write, bitwise PyTorch's rounding.

Two implementations, chosen at compile time by the kernel (:mod:`kvprof.kvcache.writers.triton_kernel`):

* ``hw`` (compiled for a GPU): the hardware round-to-nearest-even conversions (``cvt.rn``),
  plus a fix-up for fp8, because the hardware fp8 conversion saturates (``satfinite``)
  where c10's routine overflows to inf (e5m2) or, before torch 2.12, to NaN (e4m3fn;
  torch >= 2.12 saturates it too: the rule is probed at run time, :func:`e4m3_saturates`).
* ``int`` (Triton's interpreter, whose own float casts do not round to nearest even):
  PyTorch's c10 bit algorithms written with integer ops on the fp32 bits.

NaN inputs are written as NaN, but their bits are not guaranteed to match: PyTorch itself
gives different NaN bits for the same input on CPU (depending on tensor size) and on CUDA,
so there is no single reference to match. The host-side parts (the dtype codes, the overflow
rule, the inverse scale) live here too, beside the device code that depends on them.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from kvprof.kvcache.devinfo import decorates_triton_kernels
from kvprof.kvcache.dtypes import inverse_scale

decorates_triton_kernels(__name__)  # before its kernels are decorated: Triton reads TRITON_INTERPRET then

try:  # triton is optional (pip install kvcache-profiler[triton])
    import triton
    import triton.language as tl

    TRITON_ERROR: str | None = None
except Exception as exc:  # ImportError, or a triton that fails to initialise
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    TRITON_ERROR = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".strip()

INSTALL_HINT = "pip install 'kvcache-profiler[triton]' (from a checkout: pip install -e '.[triton]')"
INT32_MAX = 2**31 - 1  # past it a launch computes its offsets in 64 bits (the kernels' MODE_WIDE)


def triton_missing() -> str:
    """Every Triton writer's reason when triton does not import: the error and how to install it."""
    return f"triton is not importable ({TRITON_ERROR}): {INSTALL_HINT}"


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): Triton's block sizes."""
    return 1 << max(0, n - 1).bit_length()


# Element kinds; the order is shared with the CUDA op (csrc/store_kv.cu).
KINDS: dict[torch.dtype, int] = {
    torch.float32: 0,
    torch.bfloat16: 1,
    torch.float16: 2,
    torch.float8_e4m3fn: 3,
    torch.float8_e5m2: 4,
}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


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


def pow2_exact(inv: float) -> bool:
    """Whether ``x * inv`` is exact for every bf16/fp32 ``x``, so that rounding the product
    back to the input dtype (the reference's ``.to(x.dtype)``) cannot change it: ``inv`` is
    a finite power of two. The only inexact products land below fp32's normal range
    (< 2^-126) or overflow to inf; fp8 rounds the former to a signed zero and the latter to
    the same inf/saturated value with or without the round trip. Not for fp16 inputs: their
    narrower exponent range makes the round trip round (fp16 subnormals, overflow)."""
    mantissa, exponent = math.frexp(inv)
    # |exponent| <= 100 keeps 464 / inv a normal number, the packed fp8 path's overflow bound
    return mantissa == 0.5 and math.isfinite(inv) and abs(exponent) <= 100


_INV_CACHE: dict[float, float] = {}


def cached_inverse(scale: float | torch.Tensor) -> float:
    """:func:`kvprof.kvcache.dtypes.inverse_scale`, memoised for Python numbers (it is on the host hot path)."""
    if isinstance(scale, torch.Tensor):
        return inverse_scale(scale)
    inv = _INV_CACHE.get(scale)
    if inv is None:
        inv = inverse_scale(scale)
        if len(_INV_CACHE) < 4096:
            _INV_CACHE[scale] = inv
    return inv


_INV_POW2_CACHE: dict[float, tuple[float, bool]] = {}


def inverse_pow2(scale: float | torch.Tensor) -> tuple[float, bool]:
    """(:func:`cached_inverse`, :func:`pow2_exact` of it): one lookup on the host hot path for a
    Python number (memoised), both computed for a tensor."""
    if isinstance(scale, torch.Tensor):
        inv = inverse_scale(scale)
        return inv, pow2_exact(inv)
    found = _INV_POW2_CACHE.get(scale)
    if found is None:
        inv = inverse_scale(scale)
        found = (inv, pow2_exact(inv))
        if len(_INV_POW2_CACHE) < 4096:
            _INV_POW2_CACHE[scale] = found
    return found


def scaled_launch(k_scale: float | torch.Tensor | None, v_scale: float | torch.Tensor | None,
                  consts: tuple[Any, ...], pow2_consts: tuple[Any, ...] | None) -> tuple[float, float, tuple[Any, ...]]:
    """A scaled fp8 write's (1/k_scale, 1/v_scale, constexprs): ``pow2_consts`` (the plan's
    variant with the power-of-two bit, or None where it has none) where both inverses are
    powers of two, a scale not given counting as one; else ``consts``."""
    k_inv = v_inv = 1.0
    k_pow2 = v_pow2 = True
    if k_scale is not None:
        k_inv, k_pow2 = inverse_pow2(k_scale)
    if v_scale is not None:
        v_inv, v_pow2 = inverse_pow2(v_scale)
    return k_inv, v_inv, (pow2_consts if pow2_consts is not None and k_pow2 and v_pow2 else consts)

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
    def int_widen(code, KIND: tl.constexpr):
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
    def int_round_small(a, M: tl.constexpr, B: tl.constexpr):
        """|x| fp32 bits -> round-to-nearest-even code of a format with M mantissa bits
        and exponent bias B, subnormals included (overflow is the caller's). The fp8 writers
        (:mod:`kvprof.kvcache.writers.fp8_jit`) use it too. The subnormal shift is kept in [1, 30] in
        every lane, also where the final select keeps the normal code, so no shift is out of range."""
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
    def int_narrow(xb, KIND: tl.constexpr, SAT: tl.constexpr):
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
            r = int_round_small(a, 10, 15)
            r = tl.where(a >= 0x47800000, 0x7C00, r)  # >= 65536: inf
            r = tl.where(a > 0x7F800000, 0x7FFF, r | (sign << 15))
        elif KIND == E4M3:
            r = int_round_small(a, 3, 7)
            if SAT:  # finite overflow and inf -> 448 (0x7E), NaN -> 0x7F
                r = tl.where(a >= 0x43F00000, tl.where(a > 0x7F800000, 0x7F, 0x7E), tl.minimum(r, 0x7E))
            else:  # >= 480, inf, NaN: NaN; (464, 480) already rounds to 0x7F
                r = tl.where(a >= 0x43F00000, 0x7F, r)
            r = r | (sign << 7)
        else:  # E5M2
            r = int_round_small(a, 2, 15)
            r = tl.where(a >= 0x47800000, tl.where(a > 0x7F800000, 0x7F, 0x7C), r)  # >= 65536: inf
            r = r | (sign << 7)
        return r

    # ---------------------------------------------------------------------------------
    # hw path: hardware cvt.rn conversions, fp8 fixed up to PyTorch's non-saturating rule.
    # ---------------------------------------------------------------------------------
    @triton.jit
    def hw_widen(bits, KIND: tl.constexpr, FP8_INT: tl.constexpr):
        """Raw storage bits of KIND -> fp32 (exact)."""
        if (KIND == E4M3 or KIND == E5M2) and FP8_INT:
            x = int_widen(bits.to(tl.int32) & 0xFF, KIND).to(tl.float32, bitcast=True)
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
    def hw_narrow(x, KIND: tl.constexpr, SAT: tl.constexpr, FP8_INT: tl.constexpr):
        """fp32 -> raw storage bits of KIND, rounded as torch rounds. FP8_INT: encode fp8
        with the integer routine instead of Triton's packed cast (see ``triton_kernel.fp8_cast_safe``)."""
        if (KIND == E4M3 or KIND == E5M2) and FP8_INT:
            r = int_narrow(x.to(tl.int32, bitcast=True), KIND, SAT).to(tl.uint8)
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
    def as_bits(x, KIND: tl.constexpr):
        """Reinterpret loaded values as KIND's storage integer (free)."""
        if KIND == F32:
            r = x.to(tl.int32, bitcast=True)
        elif KIND == BF16 or KIND == F16:
            r = x.to(tl.int16, bitcast=True)
        else:
            r = x.to(tl.uint8, bitcast=True)
        return r

    @triton.jit
    def to_storage(code, KIND: tl.constexpr):
        """Truncate a code to KIND's storage integer."""
        if KIND == F32:
            r = code.to(tl.int32)
        elif KIND == BF16 or KIND == F16:
            r = code.to(tl.int16)
        else:
            r = code.to(tl.uint8)
        return r

