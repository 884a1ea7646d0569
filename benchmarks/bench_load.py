"""Load time and peak memory: kvprof's Kineto reader vs HolisticTraceAnalysis, same trace.

    python benchmarks/bench_load.py [TRACE] [--mb 120] [--repeat 3]

Without TRACE it synthesizes a realistic kvprof trace (kvprof.trace.synthetic: the event
shapes of a real torch 2.11 H200 capture -- cpu_ops, launches, kernels, flows, syncs,
annotations -- eager writes over 80 layers) of at least --mb MB uncompressed, gzipped
like a real capture, and says so. Each measurement runs in a fresh subprocess; time
excludes imports (reported separately), memory is the process's peak RSS (VmHWM; imports
included, so both sides pay for pandas). Target: kvprof >= 3x faster, no more memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import resource, sys, time, json
t0 = time.perf_counter()
which, path = sys.argv[1], sys.argv[2]
if which == "kvprof":
    from kvprof.trace.kineto import read_kineto
elif which == "kvprof+attribution":
    from kvprof.trace.load import load
else:
    import logging
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
if which == "kvprof":
    n = read_kineto(path).events.num_rows
elif which == "kvprof+attribution":
    n = load(path).traces[0].events.num_rows
else:
    ta = TraceAnalysis(trace_files={0: path}, trace_dir="/")
    n = len(ta.t.get_trace(0))
t2 = time.perf_counter()
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork+exec from the (large) parent
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "rows": n, "peak_rss_mb": int(hwm) / 1024}))
"""


def synthesize(path: Path, mb: int) -> dict:
    sys.path.insert(0, str(ROOT))
    from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build

    steps = 40
    while True:
        spec = TraceSpec(layers=list(range(80)), cpu_ops_per_write=4,
                         write=WriteSpec([KernelSpec(7, 0, 2600), KernelSpec(21, 300, 2600)]),
                         phases=[PhaseSpec("prefill", 4096, steps // 2), PhaseSpec("decode", 10, steps // 2),
                                 PhaseSpec("decode", 10, steps // 4, graph=True)])
        doc, _ = build(spec)
        raw = json.dumps(doc, indent=1).encode()  # Kineto writes indented JSON
        if len(raw) >= mb << 20:
            break
        steps = int(steps * (mb << 20) / len(raw) * 1.05) + 1
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(raw)
    return {"events": len(doc["traceEvents"]), "uncompressed_mb": len(raw) / 2**20,
            "gzipped_mb": path.stat().st_size / 2**20}


def synthesize_engine(path: Path, mb: int) -> dict:
    """An engine's own trace (kvprof.trace.synthetic.build_engine): no kvprof ranges, 80 layers of
    GEMM + KV write (SGLang's store_kvcache) + attention per forward, decode forwards replayed from
    CUDA graphs inside SGLang's step[DECODE bs=<n>] ranges, every fourth forward launched eagerly
    kernel by kernel; gzipped, of at least ``mb`` MB of indented JSON."""
    sys.path.insert(0, str(ROOT))
    from kvprof.trace.synthetic import EngineReplaySpec, build_engine

    forwards = 8
    while True:
        docs = [build_engine(EngineReplaySpec(layers=list(range(80)), replays=[0, 1] * (forwards // 2),
                                              replay_ranges=False, step_ranges="sglang", eager=eager))[0]
                for eager in (False, True)]
        doc = docs[0]
        eager = docs[1]["traceEvents"]
        shift = max(e["ts"] for e in doc["traceEvents"] if "ts" in e) - min(e["ts"] for e in eager if "ts" in e) + 1000
        for e in eager[: len(eager) // 4]:  # after the replays, with correlation ids of their own
            e = {**e, "ts": round(e["ts"] + shift, 3)} if "ts" in e else e
            if isinstance(e.get("args"), dict) and "correlation" in e["args"]:
                e["args"] = {**e["args"], "correlation": e["args"]["correlation"] + 10_000_000}
            doc["traceEvents"].append(e)
        raw = json.dumps(doc, indent=1).encode()
        if len(raw) >= mb << 20:
            break
        forwards = int(forwards * (mb << 20) / len(raw) * 1.05) + 2
    with gzip.open(path, "wb", compresslevel=6) as f:
        f.write(raw)
    return {"events": len(doc["traceEvents"]), "uncompressed_mb": len(raw) / 2**20,
            "gzipped_mb": path.stat().st_size / 2**20}


def measure(which: str, path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", CHILD, which, str(path)], capture_output=True, text=True, env=env,
                         timeout=1800)
    if res.returncode != 0:
        return {"error": (res.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path)
    ap.add_argument("--mb", type=int, default=120, help="size of the synthesized trace, uncompressed MB")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = None
    if args.trace is None:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "synthetic.pt.trace.json.gz"
        t = time.perf_counter()
        info = synthesize(path, args.mb)
        print(f"no trace given: SYNTHESIZED a kvprof-shaped Kineto trace ({info['events']:,} events, "
              f"{info['uncompressed_mb']:.0f} MB uncompressed, {info['gzipped_mb']:.1f} MB gzipped) in "
              f"{time.perf_counter() - t:.1f} s; not a real capture")
    else:
        path = args.trace
        print(f"trace: {path} ({path.stat().st_size / 2**20:.1f} MB on disk)")
    results: dict[str, list[dict]] = {}
    for which in ("kvprof", "kvprof+attribution", "hta"):
        runs = [measure(which, path) for _ in range(args.repeat)]
        results[which] = runs
        ok = [r for r in runs if "error" not in r]
        if not ok:
            print(f"{which:>20}: failed: {runs[0]['error']}")
            continue
        best = min(ok, key=lambda r: r["load_s"])
        print(f"{which:>20}: load {best['load_s']:.2f} s (best of {len(ok)}), import {best['import_s']:.2f} s, "
              f"peak RSS {max(r['peak_rss_mb'] for r in ok):.0f} MB, rows {best['rows']:,}")
    try:
        k = min(r["load_s"] for r in results["kvprof"])
        h = min(r["load_s"] for r in results["hta"])
        km = max(r["peak_rss_mb"] for r in results["kvprof"])
        hm = max(r["peak_rss_mb"] for r in results["hta"])
        ka = min(r["load_s"] for r in results["kvprof+attribution"])
        print(f"kvprof read is {h / k:.1f}x faster than HTA (with attribution {h / ka:.1f}x); "
              f"peak memory {km:.0f} MB vs {hm:.0f} MB ({km / hm:.2f}x). Target: >= 3x faster, <= 1x memory: "
              f"{'met' if h / k >= 3 and km <= hm else 'NOT met'}")
    except (KeyError, ValueError, TypeError):
        print("comparison incomplete (see errors above)")
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
