#!/usr/bin/env python3
"""The SASS of triton_fused's kernel for the H200 (sm_90), compiled here without a GPU.

    python lab/sass_offline.py [--shape 8x128] [--tokens 1] [--out DIR]

Why: docs/benchmarks.md reads the fp8 write's extra time at 1-8 tokens from what each warp
does after its loads return (the bf16 copy stores the row words as loaded; the fp8 words pass
widen, multiply, cast, merge and the overflow fix-up first). This prints that machine code for
the writer's own launch (its table's shape, bf16 cache and fp8 e4m3 cache from bf16 at scale
0.5), compiled by Triton's bundled ptxas and disassembled by its nvdisasm, with a SHA-256 of
each listing: run it on two checkouts to see whether a change touched the writer's kernels.
Needs triton (not its interpreter) and nothing else; no CUDA device.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile the kernel, whatever the shell says
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def fail(msg: str) -> None:
    raise SystemExit(f"sass_offline.py: error: {msg}")


def sass_for(fp8: bool, heads: int, dim: int, tokens: int) -> str:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from kvprof.kvcache.writers import triton_kernel as tk
    from kvprof.kvcache.writers.triton_fused import KINDS, pick_config

    rk = heads * dim
    bk = triton.next_power_of_2(rk)
    cfg = pick_config(2 * rk * 2, tokens, fp8=fp8)
    split = min(cfg.split, bk)
    bf16, e4m3 = KINDS[torch.bfloat16], KINDS[torch.float8_e4m3fn]
    if fp8:  # what the writer sets for scale 0.5 under torch 2.11's rule: POW2 and PACKED
        mode = tk.mode_bits(bf16, e4m3, True, True, True, False, False, True) | tk.MODE_POW2 | tk.MODE_PACKED
    else:
        mode = tk.mode_bits(bf16, bf16, False, False, True, False, False, True)
    out_ty = "*u8" if fp8 else "*bf16"
    sig = {"k_out": out_ty, "v_out": out_ty, "loc": "*i64", "k_in": "*bf16", "v_in": "*bf16", "k_inv": "fp32",
           "v_inv": "fp32", "tokens": "i32", "rows": "i32", "k_stride": "i32", "v_stride": "i32",
           **{name: "constexpr" for name in ("RK", "RV", "BLOCK_K", "BLOCK_V", "BLOCK_T", "SPLIT", "MODE")}}
    consts = {"RK": rk, "RV": rk, "BLOCK_K": bk, "BLOCK_V": bk, "BLOCK_T": cfg.block_t, "SPLIT": split, "MODE": mode}
    # pointers and row strides divisible by 16, as Triton specializes them at a real launch
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 9, 10)}
    src = triton.compiler.ASTSource(fn=tk.store_kv_kernel, signature=sig, constexprs=consts, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps})
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "store_kv.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        listing = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    lines = [re.sub(r"\s*/\* 0x[0-9a-f]+ \*/", "", ln).rstrip() for ln in listing.splitlines()
             if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln) and "NOP" not in ln]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8x128", help="heads x dim (default 8x128)")
    ap.add_argument("--tokens", type=int, default=1)
    ap.add_argument("--out", type=Path, help="also write <shape>-<tokens>-{bf16,fp8}.sass here")
    args = ap.parse_args()
    m = re.fullmatch(r"(\d+)x(\d+)", args.shape)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        fail(f"--shape must be HEADSxDIM, e.g. 8x128, got {args.shape!r}")
    if args.tokens < 1:
        fail(f"--tokens must be at least 1, got {args.tokens}")
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        fail(f"needs triton ({type(exc).__name__}: {exc})")
    heads, dim = int(m.group(1)), int(m.group(2))
    from kvprof.core.atomic import atomic_write_text

    for name, fp8 in (("bf16", False), ("fp8", True)):
        try:
            sass = sass_for(fp8, heads, dim, args.tokens)
        except Exception as exc:  # noqa: BLE001  (a compile or disassembly failure: one line)
            fail(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        digest = hashlib.sha256(sass.encode()).hexdigest()[:16]
        print(f"== {args.shape} x {args.tokens} tok, {name} cache: {sass.count(chr(10))} instructions, sha256 {digest}")
        print(sass, end="")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(args.out / f"{args.shape}-{args.tokens}-{name}.sass", sass)


if __name__ == "__main__":
    main()
