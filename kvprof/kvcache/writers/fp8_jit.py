"""fp32 -> fp8 conversion inside Triton kernels, bitwise torch's (c10) or vLLM's rule.

Two implementations of one rounding (round to nearest, ties to even, subnormals included):

* ``HW`` (compiled for a GPU): the hardware conversion (``cvt.rn.satfinite``), which
  saturates; where the wanted rule does not saturate (c10's e5m2 overflow goes to inf; an
  older torch's e4m3 overflow to NaN) one integer add or or fixes it up.
* integer (Triton's interpreter, whose float casts do not round to nearest even, and any
  launch whose register layout the hardware path is not known-good for): the rounding
  written with integer ops on the fp32 bits.

``SAT``: overflow (and inf) gives the largest finite value, NaN stays NaN (vLLM's
``__NV_SATFINITE``; torch >= 2.12's e4m3fn cast); otherwise e4m3fn overflow is NaN and
e5m2 overflow is inf (c10's rule before 2.12 for e4m3fn, always for e5m2). Every rule but
vLLM's saturating e5m2 is the MHA writer's, so both paths come from
:mod:`kvprof.kvcache.writers.triton_convert`; that one rule is written here.

Beside it, what every Triton writer asks about where its kernel runs: ``interpreted``,
``pdl_capable``, ``uses_pdl`` and ``placement_reason`` (the one-line reason a writer cannot
run here).
"""

from __future__ import annotations

import os

from kvprof.kvcache.devinfo import decorates_triton_kernels
from kvprof.kvcache.writers.triton_convert import e4m3_saturates, tl, triton  # triton is None where it does not import

decorates_triton_kernels(__name__)  # before its kernels are decorated: Triton reads TRITON_INTERPRET then

# the torch overflow rule the fused kernels follow: the MHA writer's probe, shared
torch_e4m3_saturates = e4m3_saturates


def interpreted(kernel: object) -> bool:
    """Whether ``kernel`` was decorated under TRITON_INTERPRET (it then runs on the host)."""
    if triton is None:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def placement_reason(name: str, module: str, kernel_interpreted: bool, device: object,
                     pdl: bool | None = None) -> str | None:
    """Why writer ``name``'s Triton kernel, as ``module`` was imported, cannot run on ``device``;
    None when it can. The interpreter is chosen once, when the kernel is decorated, so the
    fix is always about ``TRITON_INTERPRET`` before that import."""
    kind = getattr(device, "type", str(device))
    if kind == "cpu" and not kernel_interpreted:
        value = os.environ.get("TRITON_INTERPRET")
        if value is None:
            why = " (kvprof capture sets it when it is unset, before any writer is imported)"
        elif value.strip().lower() in ("1", "true", "on", "yes"):
            why = " (it is set now, but was not at import)"
        else:
            why = f" (TRITON_INTERPRET={value.strip()} is set, which turns the interpreter off)"
        return f"{name} on CPU runs in Triton's interpreter: set TRITON_INTERPRET=1 before {module} is imported{why}"
    if kind == "cuda" and kernel_interpreted:
        return (f"{name} was imported with TRITON_INTERPRET=1: its kernel would run in the interpreter on the "
                "host, not on the GPU (unset it, or set TRITON_INTERPRET=0)")
    if pdl and (kernel_interpreted or kind != "cuda"):
        return f"{name}(pdl=True) needs the compiled kernel on a CUDA device"
    return None


_PDL_BY_DEVICE: dict[int, bool] = {}


def pdl_capable(device: object) -> bool:
    """Whether compiled kernels on ``device`` can use programmatic dependent launch (sm_90+)."""
    import torch

    index = getattr(device, "index", None)
    index = torch.cuda.current_device() if index is None else index
    found = _PDL_BY_DEVICE.get(index)
    if found is None:
        found = _PDL_BY_DEVICE[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return found


def uses_pdl(pdl: bool | None, device: object, compiled: bool = True) -> bool:
    """Whether a kvprof kernel launched with option ``pdl`` (None: where the device has it)
    uses programmatic dependent launch on ``device``: only compiled, on a CUDA device, and
    there sm_90+ unless forced (``pdl=True`` elsewhere is refused by ``placement_reason``)."""
    if getattr(device, "type", str(device)) != "cuda" or not compiled:
        return False
    return pdl_capable(device) if pdl is None else bool(pdl)


def hw_cast_safe(cols: int, token_stride: int, elems_per_program: int, num_warps: int) -> bool:
    """Whether Triton's packed hardware fp8 cast may be used for a tile. Triton 3.6's ptxas
    miscompiles it where a thread holds its elements in pairs (``triton_kernel.fp8_cast_safe``,
    docs/benchmarks.md); rows in 16-element multiples with >= 4 elements per thread do not."""
    return cols % 16 == 0 and token_stride % 16 == 0 and elems_per_program >= 4 * 32 * num_warps


if triton is not None:
    from kvprof.kvcache.writers.triton_convert import (
        E4M3 as E4M3_KIND,
        E5M2 as E5M2_KIND,
        hw_narrow,
        int_narrow,
        int_round_small,
    )

    @triton.jit
    def fp8_code_int(x, E4M3: tl.constexpr, SAT: tl.constexpr):
        """fp32 -> fp8 bits (int32 in the low byte), integer ops only."""
        xb = x.to(tl.int32, bitcast=True)
        if E4M3:
            r = int_narrow(xb, E4M3_KIND, SAT)
        elif SAT:  # vLLM's saturating e5m2, which torch never uses
            sign = (xb >> 31) & 1
            a = xb & 0x7FFFFFFF
            r = int_round_small(a, 2, 15)
            r = tl.where(a > 0x7F800000, 0x7F, tl.where(a >= 0x47800000, 0x7B, tl.minimum(r, 0x7B)))
            r = r | (sign << 7)
        else:
            r = int_narrow(xb, E5M2_KIND, False)
        return r

    @triton.jit
    def fp8_bits(x, E4M3: tl.constexpr, SAT: tl.constexpr, HW: tl.constexpr):
        """fp32 -> fp8 storage bits (uint8)."""
        if HW and E4M3:
            c = hw_narrow(x, E4M3_KIND, SAT, False)
        elif HW and not SAT:
            c = hw_narrow(x, E5M2_KIND, False, False)
        elif HW:  # satfinite is vLLM's saturating e5m2 rule as it is
            c = x.to(tl.float8e5, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
        else:
            c = fp8_code_int(x, E4M3, SAT).to(tl.uint8)
        return c
