#!/usr/bin/env python3
"""kvprof's rope (+ store) Triton kernel compiled for the H200 (sm_90) here, without a GPU:
does each compile, how many instructions, how many fused multiply-adds (the rotation must
have none: the writers turn fp fusion off so that a GPU rounds as the float32 reference
does), how wide are its global loads and stores, and a digest of the SASS listing.

    python gpu/rope_sass_offline.py [--quick] [--out DIR]

Compiled by Triton's bundled ptxas at the writers' own launch shapes (rope_tables) for
Llama-3.1-8B's heads (32 q, 8 kv, 128 dims, full NeoX rotary) at 1, 64 and 4096 tokens,
Llama-3.1-70B's per rank at TP 8 (8 q, 1 kv), a partial GPT-J rotary (64 of 128 dims) and the
rotary-only kernel of the ``rope_then_*`` writers; bf16 caches and fp8 e4m3 from bf16 with
per-tensor scales (the integer encode where
the writer takes it), and one persistent grid with the streaming hints. ``--quick``: three
compiles (that one among them), to check that the kernel compiles at all.
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


def fail(msg: str) -> None:
    raise SystemExit(f"rope_sass_offline.py: error: {msg}")


def compile_sass(neox: bool, store: bool, fp8: bool, tokens: int, hq: int, hk: int, dim: int, rope: int,
                 extra: str = "") -> str:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget

    from kvprof.kvcache.writers import rope_triton_kernel as rk
    from kvprof.kvcache.writers.rope_tables import pick_rope_config
    from kvprof.kvcache.writers.triton_convert import KINDS

    bf16 = KINDS[torch.bfloat16]
    cache = KINDS[torch.float8_e4m3fn] if fp8 else bf16
    mode = rk.mode_bits(bf16, bf16, cache, hw=True, sat=True, neox=neox, store=store, pdl=True)
    # extra shape bits, words of ``extra``: "persistent" (a fixed grid walking the tiles), "stream" (the hints)
    words = extra.split()
    mode |= rk.MODE_PERSISTENT * ("persistent" in words) | rk.MODE_STREAM * ("stream" in words)
    cfg = pick_rope_config(dim, tokens)
    half = rope // 2
    if fp8:
        mode |= rk.MODE_K_SCALED | rk.MODE_V_SCALED
        # what RopeTritonFusedWriter decides for these tiles (fp8_jit.hw_cast_safe): GPT-J, or
        # fewer than 4 elements per thread, takes the integer encode
        block_hk = min(cfg.block_h, triton.next_power_of_2(hk))
        if not neox or cfg.block_t * block_hk * triton.next_power_of_2(half) < 4 * 32 * cfg.num_warps:
            mode |= rk.MODE_FP8_INT
    out = "*u8" if fp8 else "*bf16"
    names = ["q", "k", "v", "k_out", "v_out", "loc", "pos", "cos_sin", "k_inv", "v_inv", "tokens", "rows",
             "max_pos", "q_st", "q_sh", "k_st", "k_sh", "v_st", "v_sh", "loc_st", "pos_st", "cs_st"]
    types = ["*bf16", "*bf16", "*bf16", out, out, "*i64", "*i64", "*fp32", "fp32", "fp32", "i32", "i32", "i32"]
    types += ["i32"] * 9
    consts = {"HQ": hq, "HK": hk, "D": dim, "DV": dim, "HALF": half, "BLOCK_HALF": triton.next_power_of_2(half),
              "BLOCK_P": triton.next_power_of_2(dim - rope) if dim > rope else 0,
              "BLOCK_DV": triton.next_power_of_2(dim), "BLOCK_T": cfg.block_t,
              "BLOCK_HQ": min(cfg.block_h, triton.next_power_of_2(hq)),
              "BLOCK_HK": min(cfg.block_h, triton.next_power_of_2(hk)),
              "MODE": mode}
    sig = {**dict(zip(names, types)), **{name: "constexpr" for name in consts}}
    # pointers and strides divisible by 16, the unit strides of loc/positions/head rows as
    # Triton specializes them at a real launch (q from a packed qkv: token stride 6144)
    attrs = {(i,): [["tt.divisibility", 16]] for i in (*range(8), 13, 14, 15, 16, 17, 18, 21)}
    src = triton.compiler.ASTSource(fn=rk.rope_kv_kernel, signature=sig, constexprs=consts, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": cfg.num_warps, "enable_fp_fusion": False})
    nvdisasm = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "rope.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        listing = subprocess.run([str(nvdisasm), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    lines = [re.sub(r"\s*/\* 0x[0-9a-f]+ \*/", "", ln).rstrip() for ln in listing.splitlines()
             if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln) and "NOP" not in ln]
    return "\n".join(lines) + "\n"


CASES = [  # name, neox, store, fp8, tokens, hq, hk, dim, rope
    ("neox-8b", True, True, False, 1, 32, 8, 128, 128),
    ("neox-8b", True, True, True, 1, 32, 8, 128, 128),
    ("neox-8b", True, True, False, 64, 32, 8, 128, 128),
    ("neox-8b", True, True, True, 64, 32, 8, 128, 128),
    ("neox-8b", True, True, False, 4096, 32, 8, 128, 128),
    ("neox-8b", True, True, True, 4096, 32, 8, 128, 128),
    ("neox-70b-tp8", True, True, False, 64, 8, 1, 128, 128),
    ("neox-70b-tp8", True, True, True, 4096, 8, 1, 128, 128),
    ("gptj-partial", False, True, False, 64, 32, 2, 128, 64),
    ("gptj-partial", False, True, True, 4096, 32, 2, 128, 64),
    ("rotary-only", True, False, False, 1, 32, 8, 128, 128),
    ("rotary-only", True, False, False, 4096, 32, 8, 128, 128),
    ("neox-70b-tp8 persistent stream", True, True, False, 4096, 8, 1, 128, 128),
]
# extra mode bits by case name (choices the fallback row, whose shapes these compiles take, does not make)
EXTRA = {"neox-70b-tp8 persistent stream": "persistent stream"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="three compiles: does the kernel compile at all")
    ap.add_argument("--out", type=Path, help="also write each listing here")
    args = ap.parse_args()
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        fail(f"needs triton ({type(exc).__name__}: {exc})")
    from kvprof.core.atomic import atomic_write_text

    cases = [CASES[1], CASES[9], CASES[12]] if args.quick else CASES
    for name, neox, store, fp8, tokens, hq, hk, dim, rope in cases:
        label = f"{name} {hq}q/{hk}kv x {dim} (rope {rope}) x {tokens} tok, {'fp8 e4m3' if fp8 else 'bf16'} cache"
        if not store:
            label = f"{name} {hq}q/{hk}kv x {dim} x {tokens} tok"
        try:
            sass = compile_sass(neox, store, fp8, tokens, hq, hk, dim, rope, extra=EXTRA.get(name, ""))
        except Exception as exc:  # noqa: BLE001  (a compile or disassembly failure: one line)
            fail(f"{label}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        ops = [next((tok for tok in ln.split()[1:] if not tok.startswith("@")), "") for ln in sass.splitlines()]
        count = {key: sum(op.startswith(key) for op in ops) for key in ("FFMA", "LDG", "STG")}
        hinted = sum(op.startswith(("LDG", "STG")) and ".EF" in op for op in ops)
        wide = sum(op.startswith(("LDG", "STG")) and ".128" in op for op in ops)
        digest = hashlib.sha256(sass.encode()).hexdigest()[:16]
        print(f"{label}: {len(ops)} instructions, FFMA {count['FFMA']}, LDG {count['LDG']}, STG {count['STG']} "
              f"({wide} of the loads and stores 128-bit, {hinted} evict-first), sha256 {digest}")
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
            atomic_write_text(args.out / f"{slug}.sass", sass)


if __name__ == "__main__":
    main()
