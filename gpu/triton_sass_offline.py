#!/usr/bin/env python3
"""kvprof's fused Triton kernels compiled for the H200 (sm_90) here, without a GPU: does each
compile, how many instructions, how wide are its global loads and stores (16-byte:
LDG/STG.E.128), and a digest of the whole SASS listing.

    python gpu/triton_sass_offline.py [--out DIR]

Compiled by Triton's bundled ptxas at the writers' own launch shapes (Llama-3.1-70B TP8's
MHA and paged rows, DeepSeek-V3's MLA row), bf16 and fp8 e4m3 from bf16, disassembled by
its nvdisasm. The digest answers "does this source change alter the machine code?": run it
before and after a refactor; equal digests mean the same SASS, instruction for instruction.
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

os.environ["TRITON_INTERPRET"] = "0"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def sass(fn, sig, consts, attrs, warps: int) -> str:
    import triton
    from triton.backends.compiler import GPUTarget

    src = triton.compiler.ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        return subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from kvprof.writers import mla_triton, paged_triton, triton_kernel
    from kvprof.writers.layout_tables import mla_shape, paged_shape
    from kvprof.writers.triton_convert import BF16, E4M3, e4m3_saturates
    from kvprof.writers.triton_tables import pick_config

    div16 = [["tt.divisibility", 16]]
    for tokens in (1, 64, 4096):
        for fp8 in (False, True):
            # MHA (triton_fused): one K and one V row of 128 bf16 per token, the tuned launch shape
            cfg = pick_config(2 * 128 * 2, tokens, fp8=fp8)
            mode = triton_kernel.mode_bits(BF16, E4M3 if fp8 else BF16, fp8, fp8, True, e4m3_saturates(), False, True)
            chunk = 128 // min(cfg.split, 128)
            if fp8 and not triton_kernel.fp8_cast_safe(128, 128, 128, 128, cfg.block_t, cfg.num_warps, chunk, chunk):
                mode |= triton_kernel.MODE_FP8_INT  # as the writer decides per launch
            sig = {"k_out": "*u8" if fp8 else "*bf16", "v_out": "*u8" if fp8 else "*bf16", "loc": "*i64",
                   "k_in": "*bf16", "v_in": "*bf16", "k_inv": "fp32", "v_inv": "fp32", "tokens": "i32", "rows": "i32",
                   "k_stride": "i32", "v_stride": "i32",
                   **{k: "constexpr" for k in ("RK", "RV", "BLOCK_K", "BLOCK_V", "BLOCK_T", "SPLIT", "MODE")}}
            consts = {"RK": 128, "RV": 128, "BLOCK_K": 128, "BLOCK_V": 128, "BLOCK_T": cfg.block_t,
                      "SPLIT": cfg.split, "MODE": mode}
            attrs = {(i,): div16 for i in (0, 1, 2, 3, 4, 9, 10)}
            report("mha 1x128", tokens, fp8, sass(triton_kernel.store_kv_kernel, sig, consts, attrs, cfg.num_warps),
                   args.out)
            m = mla_shape(tokens, 576, fp8)
            bt, warps = m.block_t, m.num_warps
            flags = ("R", "P", "BLOCK_R", "BLOCK_P", "BLOCK_T", "CONV", "SAT", "HW_R", "HW_P", "WIDE", "PDL", "STREAM")
            sig = {"buf": "*u8" if fp8 else "*bf16", "loc": "*i64", "nope": "*bf16", "rope": "*bf16", "tokens": "i32",
                   "rows": "i32", "skip": "i32", "nope_stride": "i32", "rope_stride": "i32",
                   **{k: "constexpr" for k in flags}}
            consts = {"R": 512, "P": 64, "BLOCK_R": 512, "BLOCK_P": 64, "BLOCK_T": bt, "CONV": int(fp8), "SAT": True,
                      "HW_R": True, "HW_P": True, "WIDE": False, "PDL": True, "STREAM": m.stream}
            attrs = {(i,): div16 for i in (0, 1, 2, 3, 7, 8)}
            report("mla 512+64", tokens, fp8, sass(mla_triton._mla_store_kernel, sig, consts, attrs, warps), args.out)
            p = paged_shape(tokens, 128, fp8)
            bt, warps = p.block_t, p.num_warps
            sig = {"k_cache": "*u8" if fp8 else "*bf16", "v_cache": "*u8" if fp8 else "*bf16", "slots": "*i64",
                   "key": "*bf16", "value": "*bf16", "k_scale": "*fp32", "v_scale": "*fp32", "tokens": "i32",
                   "num_slots": "i32", "k_stride": "i32", "v_stride": "i32",
                   **{k: "constexpr" for k in ("RW", "BLOCK", "FULL", "BLOCK_T", "FP8", "E4M3", "HW", "WIDE", "PDL")}}
            consts = {"RW": 128, "BLOCK": 128, "FULL": True, "BLOCK_T": bt, "FP8": fp8, "E4M3": True, "HW": True,
                      "WIDE": False, "PDL": True}
            attrs = {(i,): div16 for i in (0, 1, 2, 3, 4, 9, 10)}
            report("paged 1x128", tokens, fp8, sass(paged_triton._paged_store_kernel, sig, consts, attrs, warps),
                   args.out)


def report(what: str, tokens: int, fp8: bool, listing: str, out: Path | None) -> None:
    ops = re.findall(r"\b(LDG|STG)\.E(\.\w+)*", listing)
    widths: dict[str, int] = {}
    for m in re.finditer(r"\b(LDG|STG)\.E((?:\.\w+)*)", listing):
        key = m.group(1) + (m.group(2) or "")
        widths[key] = widths.get(key, 0) + 1
    n = sum(1 for ln in listing.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln))
    digest = hashlib.sha256(listing.encode()).hexdigest()[:12]
    print(f"{what} x{tokens} {'fp8' if fp8 else 'bf16'}: {n} instructions, sass {digest}; "
          + ", ".join(f"{k} x{v}" for k, v in sorted(widths.items())) + ("" if ops else " (no global accesses?)"))
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{what.split()[0]}-{tokens}-{'fp8' if fp8 else 'bf16'}.sass").write_text(listing)


if __name__ == "__main__":
    main()
