"""The whole ``python -m kvprof analyze`` command vs HolisticTraceAnalysis loading the same trace.

    python benchmarks/bench_analyze.py [TRACE] [--mb 35] [--repeat 5]

Both sides are timed as a user runs them: a fresh interpreter per run, wall clock from
process start to exit, imports included. kvprof runs its full command (read, attribute,
analyze, write summary.json/csv and two Parquet files); HTA only builds its
``TraceAnalysis`` over the file (parse and its own preprocessing, no analysis call).
Without TRACE a kvprof-shaped Kineto trace of at least --mb MB of JSON is synthesized
with kvprof.trace.synthetic (bench_load.synthesize) and gzipped like a real capture; the
table says so. Prints median, min, max and the spread (max - min) of each side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_load import synthesize  # noqa: E402  (the bench folder is not a package)

HTA = r"""
import logging, sys
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_files={0: sys.argv[1]}, trace_dir="/")
print(len(ta.t.get_trace(0)))
"""


def timed(argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    try:
        _, err = proc.communicate(timeout=1800)
    finally:
        proc.kill()
        proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed: {(err.strip().splitlines() or ['?'])[-1]}")
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path)
    ap.add_argument("--mb", type=int, default=35, help="size of the synthesized trace's JSON, MB (default 35)")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.trace is None:
            path = Path(tmp) / "synthetic.pt.trace.json.gz"
            info = synthesize(path, args.mb)
            what = (f"SYNTHESIZED kvprof-shaped Kineto trace (kvprof.trace.synthetic): {info['events']:,} events, "
                    f"{info['uncompressed_mb']:.0f} MB JSON, {info['gzipped_mb']:.1f} MB gzipped")
        else:
            path = args.trace
            what = f"{path} ({path.stat().st_size / 2**20:.1f} MB on disk)"
        out = Path(tmp) / "out"
        sides = {
            "kvprof analyze (whole command)": [sys.executable, "-m", "kvprof", "analyze", str(path), "--out", str(out),
                                               "--quiet"],
            "HTA TraceAnalysis (load only)": [sys.executable, "-c", HTA, str(path)],
        }
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.repeat):  # interleaved, so a slow moment of the machine hits both
            for name, argv in sides.items():
                times[name].append(timed(argv))
    print(f"trace: {what}; {args.repeat} runs each, {os.cpu_count()} CPUs")
    print(f"{'':34} {'median s':>9} {'min s':>7} {'max s':>7} {'spread s':>9}")
    for name, ts in times.items():
        print(f"{name:34} {statistics.median(ts):9.2f} {min(ts):7.2f} {max(ts):7.2f} {max(ts) - min(ts):9.2f}")
    k, h = (statistics.median(t) for t in times.values())
    print(f"kvprof's whole command is {h / k:.1f}x faster than HTA's load (median over median); target >= 3x: "
          f"{'met' if h / k >= 3 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
