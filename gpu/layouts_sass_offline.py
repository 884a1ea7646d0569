#!/usr/bin/env python3
"""The layouts' fused Triton kernels compiled for the H200 (sm_90) here, without a GPU: does
each compile, how many instructions, how wide are its global loads and stores (16-byte:
LDG/STG.E.128), and a digest of the whole SASS listing.

    python gpu/layouts_sass_offline.py [--out DIR]

Compiled by Triton's bundled ptxas at the writers' own launch shapes (DeepSeek-V3's MLA row,
Llama-3.1-70B TP8's paged rows; 32- and 64-bit offsets), bf16 and fp8 e4m3 from bf16,
disassembled by its nvdisasm. The digest answers "does this source change alter the machine
code?": equal digests before and after mean the same SASS. ``lab/sass_offline.py`` does the
same for the MHA writer's kernel.
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


def fail(msg: str) -> None:
    raise SystemExit(f"layouts_sass_offline.py: error: {msg}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        fail(f"needs triton ({type(exc).__name__}: {exc})")
    try:
        compile_all(args)
    except Exception as exc:  # noqa: BLE001 - a compile or disassembly failure: one line
        fail(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def compile_all(args: argparse.Namespace) -> None:
    from kvprof.kvcache.writers import mla_triton, paged_triton
    from kvprof.kvcache.writers.layout_tables import mla_shape, paged_shape

    div16 = [["tt.divisibility", 16]]
    for tokens, wide in ((1, False), (64, False), (4096, False), (4096, True)):  # wide: 64-bit offsets
        for fp8 in (False, True):
            shape = f"{tokens}{'-wide' if wide else ''}"
            m = mla_shape(tokens, 576, fp8)
            bt, warps = m.block_t, m.num_warps
            flags = ("R", "P", "BLOCK_R", "BLOCK_P", "BLOCK_T", "CONV", "SAT", "HW_R", "HW_P", "WIDE", "PDL", "STREAM")
            sig = {"buf": "*u8" if fp8 else "*bf16", "loc": "*i64", "nope": "*bf16", "rope": "*bf16", "tokens": "i32",
                   "rows": "i32", "skip": "i32", "nope_stride": "i32", "rope_stride": "i32",
                   **{k: "constexpr" for k in flags}}
            consts = {"R": 512, "P": 64, "BLOCK_R": 512, "BLOCK_P": 64, "BLOCK_T": bt, "CONV": int(fp8), "SAT": True,
                      "HW_R": True, "HW_P": True, "WIDE": wide, "PDL": True, "STREAM": m.stream}
            attrs = {(i,): div16 for i in (0, 1, 2, 3, 7, 8)}
            report("mla 512+64", shape, fp8, sass(mla_triton._mla_store_kernel, sig, consts, attrs, warps), args.out)
            p = paged_shape(tokens, 128, fp8)
            bt, warps = p.block_t, p.num_warps
            sig = {"k_cache": "*u8" if fp8 else "*bf16", "v_cache": "*u8" if fp8 else "*bf16", "slots": "*i64",
                   "key": "*bf16", "value": "*bf16", "k_scale": "*fp32", "v_scale": "*fp32", "tokens": "i32",
                   "num_slots": "i32", "k_stride": "i32", "v_stride": "i32",
                   **{k: "constexpr" for k in ("RW", "BLOCK", "FULL", "BLOCK_T", "FP8", "E4M3", "HW", "WIDE", "PDL")}}
            consts = {"RW": 128, "BLOCK": 128, "FULL": True, "BLOCK_T": bt, "FP8": fp8, "E4M3": True, "HW": True,
                      "WIDE": wide, "PDL": True}
            attrs = {(i,): div16 for i in (0, 1, 2, 3, 4, 9, 10)}
            report("paged 1x128", shape, fp8, sass(paged_triton._paged_store_kernel, sig, consts, attrs, warps),
                   args.out)


def report(what: str, shape: str, fp8: bool, listing: str, out: Path | None) -> None:
    ops = re.findall(r"\b(LDG|STG)\.E(\.\w+)*", listing)
    widths: dict[str, int] = {}
    for m in re.finditer(r"\b(LDG|STG)\.E((?:\.\w+)*)", listing):
        key = m.group(1) + (m.group(2) or "")
        widths[key] = widths.get(key, 0) + 1
    n = sum(1 for ln in listing.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln))
    digest = hashlib.sha256(listing.encode()).hexdigest()[:12]
    print(f"{what} x{shape} {'fp8' if fp8 else 'bf16'}: {n} instructions, sass {digest}; "
          + ", ".join(f"{k} x{v}" for k, v in sorted(widths.items())) + ("" if ops else " (no global accesses?)"))
    if out:
        from kvprof.core.atomic import atomic_write_text

        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / f"{what.split()[0]}-{shape}-{'fp8' if fp8 else 'bf16'}.sass", listing)


if __name__ == "__main__":
    main()
