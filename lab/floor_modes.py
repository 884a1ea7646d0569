#!/usr/bin/env python3
"""Is a write's graph time at the latency floor a property of the kernel, or of one pool
allocation and one graph capture?

    cd <repo> && OUT=/tmp/out python lab/floor_modes.py      # ~60 s, JSON to $OUT/floor-modes.json

Why it exists: at 1-8 tokens a write costs about one empty kernel node (0.7 µs on an H200),
and two runs of the same kernel gave different medians there (lab/tune_fused.py measured
triton_fused's fp8 write at 8x128 x 1 token at 0.658 µs, the bench at 0.716 µs a few
minutes later), while each median's interquartile range is ~0.006 µs. This times the same
points the way the bench does (``BenchCase`` + ``time_graph``), for several pool allocations
(seeds) and several captures of each, bf16 and fp8 interleaved, and the empty-node floor
the same way, so the spread between instances can be read against the spread inside one.
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

POINTS = [(8, 128, 1), (8, 128, 8), (32, 128, 1), (1, 128, 1), (1, 128, 64)]
DTYPES = [("bf16", "bf16"), ("fp8_e4m3", "bf16")]
POOLS = int(os.environ.get("FLOOR_POOLS", "4"))
CAPTURES = int(os.environ.get("FLOOR_CAPTURES", "3"))


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        print("floor_modes.py needs a CUDA GPU")
        raise SystemExit(1)
    from kvprof.bench.empty_kernel import launch_empty
    from kvprof.bench.run import BenchCase, BenchPoint
    from kvprof.bench.timing import time_graph
    from kvprof.kvcache.writers import create_writer

    t0 = time.perf_counter()
    device = torch.device("cuda")
    out: dict[str, dict[str, list[list[float]]]] = {}
    for variant in ("triton_fused", "cuda_fused"):
        writer = create_writer(variant)
        for seed in range(POOLS):
            for heads, dim, tokens in POINTS:
                for cache, inp in DTYPES:
                    point = BenchPoint(heads, dim, cache, inp, tokens)
                    case = BenchCase(point, device, 256 << 20, seed=seed)
                    pool = case.pool(variant, writer)

                    def step(pool=pool, case=case) -> None:
                        for loc in case.locs:
                            pool.set_kv_buffer(0, loc, case.k, case.v, case.scale, case.scale)

                    key = f"{variant} {point.shape} {point.dtype_label} {tokens}"
                    runs = out.setdefault(key, {"median": [], "iqr": []})
                    ts = [time_graph(step, case.writes, 100) for _ in range(CAPTURES)]
                    runs["median"].append([round(t.median_us, 4) for t in ts])
                    runs["iqr"].append([round(t.spread_us, 4) for t in ts])
                    del pool, case
            floor = [time_graph(lambda: [launch_empty() for _ in range(200)], 200, 100) for _ in range(CAPTURES)]
            out.setdefault("empty kernel node", {"median": [], "iqr": []})
            out["empty kernel node"]["median"].append([round(t.median_us, 4) for t in floor])
            out["empty kernel node"]["iqr"].append([round(t.spread_us, 4) for t in floor])
    print(f"{'point':<44} {'median of all':>13} {'min':>7} {'max':>7} {'inside (IQR)':>13}   per pool: captures")
    for key, runs in out.items():
        flat = [m for row in runs["median"] for m in row]
        iqr = statistics.median([q for row in runs["iqr"] for q in row])
        rows = "  ".join("/".join(f"{m:.3f}" for m in row) for row in runs["median"])
        print(f"{key:<44} {statistics.median(flat):13.3f} {min(flat):7.3f} {max(flat):7.3f} {iqr:13.3f}   {rows}")
    dest = Path(os.environ.get("OUT", "/tmp/kvprof-gpu"))
    dest.mkdir(parents=True, exist_ok=True)
    doc = {"pools": POOLS, "captures": CAPTURES, "points": out, "elapsed_s": round(time.perf_counter() - t0, 1)}
    atomic_write_text(dest / "floor-modes.json", json.dumps(doc, indent=1))
    print(f"wrote {dest / 'floor-modes.json'} ({time.perf_counter() - t0:.1f} s)")


if __name__ == "__main__":
    main()
