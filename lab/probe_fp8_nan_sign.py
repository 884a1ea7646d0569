#!/usr/bin/env python3
"""Does the hardware fp32 -> e4m3 conversion keep a NaN's sign?

    cd <repo> && python lab/probe_fp8_nan_sign.py

Why it exists: torch 2.11 (the H200's) turns fp32 -> e4m3 overflow into NaN with the input's
sign (0x7F | sign); the hardware cvt.rn.satfinite.e4m3x2.f32 saturates to +-448 instead, so
triton_fused fixes each converted byte up afterwards (about half of the conversion's SASS,
docs/benchmarks.md). If the conversion kept a NaN's sign, replacing an overflowing input by a
NaN of the same sign before the cast would give c10's bits with fewer instructions. This
prints what the cast gives for signed NaNs and overflowing inputs, next to torch's bytes.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _cast(out, inp, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(inp + offs)
    tl.store(out + offs, x.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True))


def main() -> None:
    if not torch.cuda.is_available():
        print("probe_fp8_nan_sign.py needs a CUDA GPU")
        raise SystemExit(1)
    bits = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x43FA0000, 0xC3FA0000, 0x7F800000, 0xFF800000]
    names = ["+qNaN", "-qNaN", "+sNaN", "-sNaN", "+500", "-500", "+inf", "-inf"]
    x = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32).cuda()
    n = 8
    out = torch.empty(n, dtype=torch.uint8, device="cuda")
    _cast[(1,)](out, x, N=n)
    ref = x.to(torch.float8_e4m3fn).view(torch.uint8)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'input':>6} {'fp32 bits':>10} {'hw cast':>8} {'torch':>6}")
    for name, b, h, r in zip(names, bits, out.tolist(), ref.tolist()):
        print(f"{name:>6} {b:#010x} {h:#8x} {r:#6x}")
    keeps = out[1].item() == 0xFF and out[3].item() == 0xFF
    print("hardware keeps a NaN's sign:", "yes" if keeps else "no")


if __name__ == "__main__":
    main()
