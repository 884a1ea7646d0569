"""The whole ``python -m kvprof analyze`` command vs HolisticTraceAnalysis loading the same trace.

    python benchmarks/bench_analyze.py TRACE [--repeat 7] [--out FILE]
    python benchmarks/bench_analyze.py --synthetic [--engine] [--mb 35] [--repeat 7]

TRACE is a real torch.profiler trace somebody else wrote. HolisticTraceAnalysis' own test
data (MIT) has several, gzipped, at
https://github.com/facebookresearch/HolisticTraceAnalysis/tree/main/tests/data, e.g.
``trace_diff/control/control.json.gz`` (1.7 MB, 35 MB of JSON, 109k events, an A100
training step) and ``df_index_resolver/df_index_resolver.json.gz`` (3.0 MB, 54 MB, 216k
events, V100); download one and pass its path. Nothing is fetched here. ``--synthetic``
measures a kvprof-shaped trace of at least --mb MB made by kvprof.trace.synthetic instead
(benchmarks/bench_load.py), and the table says so; with ``--engine`` an engine's own trace
(no kvprof ranges: the KV-write kernels found by name and tied to steps and layers, the path
analyze takes for a trace vLLM's or SGLang's profiler wrote).

Both sides are timed as a user runs them: a fresh interpreter per run, wall clock from
process start to exit, imports included. kvprof runs its full command (read, attribute,
analyze, write summary.json/csv and two Parquet files, atomically); HTA only builds its
``TraceAnalysis`` over the file (parse and its own preprocessing, no analysis call). Both
run from compiled bytecode, as installed packages do: PYTHONDONTWRITEBYTECODE is dropped
from the children's environment and one untimed run of each side goes first (a checkout's
kvprof would otherwise be compiled anew on every run while HTA's installed modules are
not). Runs alternate (kvprof, HTA, kvprof, ...) so that a busy moment of a shared machine
hits both sides. Printed: the wall clock's median, quartiles, min and max per side, the CPU
time's (user + system, children included) median and quartiles, the ratios of the medians,
and the machine's load average before and after: on a busy machine both sides are slower,
and the CPU time moves less than the wall clock.
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 3.0  # kvprof's whole command at least this many times faster than HTA's load

HTA = r"""
import logging, sys
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_files={0: sys.argv[1]}, trace_dir="/")
print(len(ta.t.get_trace(0)))
"""


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's kvprof
    return env


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system of the process and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=child_env(), text=True)
    try:
        _, err = proc.communicate(timeout=1800)
    finally:
        proc.kill()
        proc.wait()
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed: {(err.strip().splitlines() or ['?'])[-1]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def describe(path: Path) -> str:
    size = path.stat().st_size
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    text = ""
    if gz:
        with gzip.open(path, "rb") as f:
            n = sum(len(b) for b in iter(lambda: f.read(1 << 24), b""))
        text = f", {n / 1e6:.1f} MB of JSON"
    return f"{path.name} ({size / 1e6:.1f} MB on disk{text})"


def quartiles(ts: list[float]) -> tuple[float, float]:
    if len(ts) < 2:
        return ts[0], ts[0]
    q = statistics.quantiles(ts, n=4, method="inclusive")
    return q[0], q[2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", nargs="?", type=Path, help="a torch.profiler trace (.json or .json.gz)")
    ap.add_argument("--synthetic", action="store_true", help="a kvprof-shaped trace made here instead of TRACE")
    ap.add_argument("--engine", action="store_true",
                    help="with --synthetic: an engine's own trace (no kvprof ranges; CUDA graph replays, SGLang's "
                         "step ranges, eager forwards) whose KV-write kernels analyze ties to steps and layers")
    ap.add_argument("--mb", type=int, default=35, help="size of the synthetic trace's JSON, MB (default 35)")
    ap.add_argument("--repeat", type=int, default=7, help="timed runs of each side (default 7)")
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    args = ap.parse_args()
    if (args.trace is None) == (not args.synthetic):
        ap.error("give TRACE or --synthetic (one of them)")
    if args.trace is not None and not args.trace.is_file():
        ap.error(f"no such trace: {args.trace}")
    lines = [f"# python {shlex.join(['benchmarks/bench_analyze.py', *sys.argv[1:]])}",
             f"# {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.platform()}, {os.cpu_count()} CPUs, "
             f"Python {platform.python_version()}, HolisticTraceAnalysis {metadata.version('HolisticTraceAnalysis')}"]
    with tempfile.TemporaryDirectory() as tmp:
        if args.synthetic:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from bench_load import synthesize, synthesize_engine  # the benchmarks folder is not a package

            path = Path(tmp) / "synthetic.pt.trace.json.gz"
            info = (synthesize_engine if args.engine else synthesize)(path, args.mb)
            shape = "engine-shaped (SGLang step ranges, graph replays, 80 layers)" if args.engine else "kvprof-shaped"
            what = (f"SYNTHESIZED {shape} Kineto trace (kvprof.trace.synthetic): {info['events']:,} events, "
                    f"{info['uncompressed_mb']:.0f} MB JSON, {info['gzipped_mb']:.1f} MB gzipped")
        else:
            path = args.trace
            what = describe(path)
        out = Path(tmp) / "out"
        sides = {
            "kvprof analyze (whole command)": [sys.executable, "-m", "kvprof", "analyze", str(path), "--out", str(out),
                                               "--quiet"],
            "HTA TraceAnalysis (load only)": [sys.executable, "-c", HTA, str(path)],
        }
        for argv in sides.values():  # untimed: bytecode written, the file in the page cache
            timed(argv)
        load_before = os.getloadavg()
        times: dict[str, list[float]] = {k: [] for k in sides}
        cpu: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.repeat):
            for name, argv in sides.items():
                wall, used = timed(argv)
                times[name].append(wall)
                cpu[name].append(used)
        load_after = os.getloadavg()
    lines.append(f"trace: {what}; {args.repeat} runs of each side, alternating; load average "
                 f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
    lines.append(f"{'wall clock, s':32} {'median':>7} {'q1':>6} {'q3':>6} {'min':>6} {'max':>6} | "
                 f"{'CPU s median':>12} {'q1':>6} {'q3':>6}")
    for name, ts in times.items():
        q1, q3 = quartiles(ts)
        c1, c3 = quartiles(cpu[name])
        lines.append(f"{name:32} {statistics.median(ts):7.2f} {q1:6.2f} {q3:6.2f} {min(ts):6.2f} {max(ts):6.2f} | "
                     f"{statistics.median(cpu[name]):12.2f} {c1:6.2f} {c3:6.2f}")
    k, h = (statistics.median(t) for t in times.values())
    kc, hc = (statistics.median(t) for t in cpu.values())
    lines.append(f"kvprof's whole command is {h / k:.1f}x faster than HTA's load (wall, median over median; "
                 f"target >= {TARGET:g}x: {'met' if h / k >= TARGET else 'NOT met'}); {hc / kc:.1f}x in CPU time")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
