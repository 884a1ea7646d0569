#!/usr/bin/env python3
"""Where the fp8 write's extra time goes at the latency floor: the same kernel with one
part of the conversion left out at a time, beside the bf16 copy, timed as the bench times.

    cd <repo> && OUT=/tmp/out python lab/fp8_ablation.py      # ~1 minute, JSON to $OUT/fp8-ablation.json

Why it exists: at 1-8 tokens an fp8 cache written from bf16 (scale 0.5, in the same launch)
has been 0.01-0.03 µs slower than the bf16 write at some row shapes, every run. The
conversion is bf16 -> fp32, a multiply by the inverse scale, the paired hardware cast
(``cvt.rn.satfinite.e4m3x2.f32``) and a fix-up to torch 2.11's overflow-to-NaN rule. This
launches a copy of the writer's kernel (``lab/ablation_kernel.py``) with its compile-time MODE changed, so each row
isolates one part:

* ``bf16 copy``: the bf16 cache (the reference), with its own launch shape and with the fp8
  table's launch shape (does the shape, not the conversion, make the difference?);
* ``fp8, Triton's fix-up``: torch 2.11's overflow rule as Triton compiles it per element;
* ``fp8, packed fix-up``: the writer's kernel (``bf16_to_e4m3_packed``, bitwise torch's);
* ``fp8, no fix-up``: the saturating rule torch >= 2.12 follows (not torch 2.11's bits);
* ``fp8, no scale``: no multiply (a scale of 1: the cast and the packed fix-up);
* ``fp8 packed, bf16's shape``: the writer's fp8 kernel with the bf16 table's launch shape;
* ``fp8, cast only``: no scale and no fix-up (Triton's saturating cast): the least any
  conversion in the kernel can do, widen and cast;
* ``bf16 copy + N ops``: the bf16 copy with N dependent integer steps on every row word
  that leave it unchanged (MODE bits 15-17 of that copy, ``dependent_ops``): what one more step on a
  warp's load -> store chain costs here, the yardstick for the conversion's steps. The
  summary fits a line through N = 0..6 and says how many such steps the fp8 write's extra
  time is worth.

Each is timed over the bench's case (``kvprof.bench.run.BenchCase``: 256 MB pool, random slots, W writes per
graph), median of 100 replays, in ``ABL_CAPTURES`` rounds (default 3): each round is a new
allocation shared by every row of its dtype, and the row's figure is the median over rounds.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvprof.core.atomic import atomic_write_text  # noqa: E402  (after the path insert)

# every point where the bench's fp8 write has been slower than bf16 (runs 3-5), and 1x128 x 1 (a tie)
POINTS = [(8, 128, 1), (8, 128, 8), (4, 256, 1), (4, 256, 8), (32, 128, 1), (1, 128, 1), (1, 128, 8),
          (1, 128, 64)]
CHAIN_STEPS = (1, 2, 3, 4, 6)  # dependent steps added to the bf16 copy's chain (the yardstick)
try:
    CAPTURES = int(os.environ.get("ABL_CAPTURES", "3"))
except ValueError:
    raise SystemExit("fp8_ablation.py: error: ABL_CAPTURES must be an integer, got "
                     f"{os.environ['ABL_CAPTURES']!r}") from None
if CAPTURES < 1:
    raise SystemExit(f"fp8_ablation.py: error: ABL_CAPTURES must be at least 1, got {CAPTURES}")


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("fp8_ablation.py: error: needs a CUDA GPU (run it on the H200: "
                         "gpu/run_gpu_checks.sh ablation)")
    import triton

    import ablation_kernel as ak
    from kvprof.bench.run import BenchCase, BenchPoint
    from kvprof.bench.timing import time_graph
    from kvprof.kvcache.writers import triton_fused as tf

    t0 = time.perf_counter()
    device = torch.device("cuda")
    sat = tf.e4m3_saturates()
    print(f"torch {torch.__version__}: e4m3 overflow {'saturates' if sat else 'is NaN (fix-up on)'}")
    out: dict[str, dict[str, list[float]]] = {}
    for heads, dim, tokens in POINTS:
        rk = heads * dim
        bk = triton.next_power_of_2(rk)
        row_bytes = 2 * rk * 2
        cfg_bf = tf.pick_config(row_bytes, tokens)
        cfg_fp8 = tf.pick_config(row_bytes, tokens, fp8=True)
        pdl = 1 << 11
        bf_mode = tf.KINDS[torch.bfloat16] | tf.KINDS[torch.bfloat16] << 3 | 1 << 8 | pdl
        fp8_base = tf.KINDS[torch.bfloat16] | tf.KINDS[torch.float8_e4m3fn] << 3 | 1 << 8 | pdl | int(sat) << 9
        scaled = 1 << 6 | 1 << 7 | 1 << 13  # both scaled, power-of-two inverse (0.5 -> 2.0)
        packed = 0 if sat else 1 << 14  # the packed fix-up (_bf16_to_e4m3_packed); none to do when saturating
        rows = [
            ("bf16 copy", "bf16", bf_mode, cfg_bf, 1.0),
            ("bf16 copy, fp8's shape", "bf16", bf_mode, cfg_fp8, 1.0),
            ("fp8, Triton's fix-up", "fp8", fp8_base | scaled, cfg_fp8, 2.0),
            ("fp8, packed fix-up", "fp8", fp8_base | scaled | packed, cfg_fp8, 2.0),
            ("fp8, no fix-up", "fp8", fp8_base | scaled | 1 << 9, cfg_fp8, 2.0),
            ("fp8, no scale", "fp8", fp8_base | packed, cfg_fp8, 1.0),
            ("fp8 packed, bf16's shape", "fp8", fp8_base | scaled | packed, cfg_bf, 2.0),
            ("fp8, cast only", "fp8", fp8_base | 1 << 9, cfg_fp8, 1.0),
            *((f"bf16 copy + {n} ops", "bf16", bf_mode | ak.chain_mode(n), cfg_bf, 1.0) for n in CHAIN_STEPS),
            *((f"bf16 copy + {n} ops, fp8's shape", "bf16", bf_mode | ak.chain_mode(n), cfg_fp8, 1.0) for n in (2, 4)),
        ]
        # Each round is a new allocation (pool, slots, rows) that every row of its dtype shares:
        # rows of one round differ only in their kernel, and the median over rounds averages
        # where the buffers landed (which moves a floor-bound median by a few ns).
        for rnd in range(CAPTURES):
            cases = {
                "bf16": BenchCase(BenchPoint(heads, dim, "bf16", "bf16", tokens), device, 256 << 20,
                                  seed=tokens * 1000 + rnd),
                "fp8": BenchCase(BenchPoint(heads, dim, "fp8_e4m3", "bf16", tokens), device, 256 << 20,
                             seed=tokens * 1000 + rnd),
            }
            buffers = {}
            for name, case in cases.items():
                pool = case.pool("triton_fused", tf.TritonFusedWriter())
                buffers[name] = (pool, pool.k_buffer[0], pool.v_buffer[0])
            for label, which, mode, cfg, inv in rows:
                case = cases[which]
                _, k_buf, v_buf = buffers[which]
                split = min(cfg.split, bk)
                grid = (triton.cdiv(tokens, cfg.block_t), split)

                def step(case=case, k_buf=k_buf, v_buf=v_buf, mode=mode, cfg=cfg, inv=inv, grid=grid,
                         split=split) -> None:
                    for loc in case.locs:
                        ak.store_kv_ablation_kernel[grid](
                            k_buf, v_buf, loc, case.k, case.v, inv, inv, tokens, k_buf.shape[0], rk, rk,
                            RK=rk, RV=rk, BLOCK_K=bk, BLOCK_V=bk, BLOCK_T=cfg.block_t, SPLIT=split, MODE=mode,
                            num_warps=cfg.num_warps, launch_pdl=True)

                key = f"{heads}x{dim} {tokens:>2} tok  {label} [{cfg.block_t}/{cfg.num_warps}/{split}]"
                out.setdefault(key, {"median": [], "iqr": []})
                t = time_graph(step, case.writes, 100)
                out[key]["median"].append(round(t.median_us, 4))
                out[key]["iqr"].append(round(t.spread_us, 4))
            if rnd == 0:  # the writer's own fp8 write must be the "fp8" rows' kernel: torch's bits
                bad = cases["fp8"].check(tf.TritonFusedWriter())
                print(f"{heads}x{dim} {tokens} tok: writer's fp8 write {'bitwise index_put' if bad is None else bad}")
            del cases, buffers
            torch.cuda.empty_cache()
    print(f"{'point / kernel [block_t/warps/split]':<62} {'median':>8} {'min':>7} {'max':>7} {'IQR':>6}")
    for key, runs in out.items():
        m = runs["median"]
        print(f"{key:<62} {statistics.median(m):8.3f} {min(m):7.3f} {max(m):7.3f} "
              f"{statistics.median(runs['iqr']):6.3f}")
    summary = chain_summary(out)
    for line in summary["lines"]:
        print(line)
    dest = Path(os.environ.get("OUT", "/tmp/kvprof-gpu"))
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write_text(dest / "fp8-ablation.json", json.dumps(
        {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "e4m3_saturates": sat,
         "captures": CAPTURES, "points": out, "chain": summary["points"],
         "elapsed_s": round(time.perf_counter() - t0, 1)}, indent=1))
    print(f"wrote {dest / 'fp8-ablation.json'} ({time.perf_counter() - t0:.1f} s)")


def chain_summary(out: dict[str, dict[str, list[float]]]) -> dict:
    """Per point: the least-squares cost of one dependent step (bf16 copy + N ops, N = 0..6,
    the bf16 table's shape) and the fp8 write's extra time over the copy in those steps."""

    def med(key: str) -> float | None:
        runs = out.get(key)
        return statistics.median(runs["median"]) if runs else None

    points, lines = {}, []
    for key in out:
        if not key.endswith(" bf16 copy [" + key.rsplit("[", 1)[-1]) or "+" in key:
            continue
        prefix = key.split("  bf16 copy [")[0]
        xs, ys = [0], [med(key)]
        for n in CHAIN_STEPS:
            found = [k for k in out if k.startswith(f"{prefix}  bf16 copy + {n} ops [")]
            if found:
                xs.append(n)
                ys.append(med(found[0]))
        fp8 = [med(k) for k in out if k.startswith(f"{prefix}  fp8, packed fix-up [")]
        cast = [med(k) for k in out if k.startswith(f"{prefix}  fp8, cast only [")]
        if len(xs) < 3 or not fp8:
            continue
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        gap = fp8[0] - ys[0]
        rec = {"copy_us": ys[0], "ns_per_step": round(slope * 1e3, 2), "fp8_minus_copy_ns": round(gap * 1e3, 1),
               "cast_only_minus_copy_ns": round((cast[0] - ys[0]) * 1e3, 1) if cast else None,
               "steps": dict(zip(xs, ys))}
        points[prefix.strip()] = rec
        worth = f"{gap / slope:.1f} steps" if slope > 0 else "n/a (no slope)"
        lines.append(f"{prefix.strip():<16} one dependent step {slope * 1e3:5.2f} ns; fp8 (packed) - copy "
                     f"{gap * 1e3:+5.1f} ns = {worth}; cast only - copy "
                     + (f"{(cast[0] - ys[0]) * 1e3:+5.1f} ns" if cast else "n/a"))
    return {"points": points, "lines": lines}


if __name__ == "__main__":
    main()
