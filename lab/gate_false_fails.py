"""How often the regression gate fails identical runs on a loaded CPU, and whether it still fails
real regressions: many pairs judged from a few real captures.

Each capture is ``python -m kvprof capture --variants index_put,two_stream --writer
gate_writer:make`` with the default sizes (decode 1, 10, 64 and prefill 4096: 12 rows a
pair; the third-party writer is the one tests/test_gate_captures.py judges, taken from it),
each in its own process, beside ``--busy N`` busy-looping processes (ended on exit, whatever
happens) as a shared CI machine would be loaded. Three pools are captured once:

- ``same``: ``--runs`` identical captures (the writer stores each K and V once); every ordered
  pair of them is judged, ``runs * (runs - 1)`` pairs, and any pair the gate fails is a
  false fail;
- ``twice``: ``--regressed`` captures whose writer stores every K and V twice (twice the
  writer's own work); each (same, twice) pair must fail on the writer's rows;
- ``torch``: ``--regressed`` captures where torch's own ``Tensor.__setitem__`` (the index_put
  that the index_put and two_stream variants and the writer all call, and the control series
  of older captures) does its work twice: a torch that became slower. Each (same, torch)
  pair must fail.

Judging is in-process (``kvprof.api.regression_gate`` on each run analysed once, as ``compare
--fail-if-slower`` does), so a pool of N runs gives N(N-1) identical pairs for the price of N
captures. ``--keep DIR`` keeps the pools; ``--judge DIR`` judges kept pools again without
capturing. The load average is printed as sampled during the captures.

    python lab/gate_false_fails.py [--runs 10] [--regressed 3] [--busy 6] [--threshold 10]
    python lab/gate_false_fails.py --judge DIR [--judge-steps N]   # kept pools, on their first N steps

docs/formats.md quotes its saved output (lab/results/).
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

# the writer pair tests/test_gate_captures.py judges, taken from it
_TEST = Path(__file__).resolve().parents[1] / "tests" / "test_gate_captures.py"
_spec = importlib.util.spec_from_file_location("kvprof_gate_test_writers", _TEST)
assert _spec is not None and _spec.loader is not None
_writers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_writers)
WRITER, ONCE, TWICE, SLOW_TORCH = _writers.WRITER, _writers.ONCE, _writers.TWICE, _writers.SLOW_TORCH
BUSY = "while True: pass"
POOLS = ("same", "twice", "torch")


def capture(root: Path, pool: str, index: int, steps: int | None) -> float:
    """One capture in its own process; its wall time in seconds."""
    writer_dir = root / ("twice_writer" if pool == "twice" else "once_writer")
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(writer_dir), os.environ.get("PYTHONPATH", "")])}
    args = ["capture", "--no-progress", "--no-summary", "--variants", "index_put,two_stream",
            "--writer", "gate_writer:make", "--out", str(root / pool), "--run-id", f"{pool}{index:02d}",
            *(["--reference-steps", str(steps)] if steps else [])]
    cmd = [sys.executable, "-c", SLOW_TORCH, *args] if pool == "torch" else [sys.executable, "-m", "kvprof", *args]
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"capture {pool}{index} exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - t


def capture_pools(root: Path, runs: int, regressed: int, busy: int, steps: int | None) -> None:
    for folder, body, how in (("once_writer", ONCE, "once"), ("twice_writer", TWICE, "every write done twice")):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "gate_writer.py").write_text(WRITER.format(body=body, how=how))
    loops = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
    try:
        # interleaved, so that a stretch of outside load falls on every pool alike
        order = [("same", i) for i in range(runs)]
        for i in range(regressed):
            order.insert(min(len(order), (i + 1) * max(1, runs // max(1, regressed))), ("twice", i))
            order.append(("torch", i))
        loads = []
        for pool, i in order:
            secs = capture(root, pool, i, steps)
            loads.append(os.getloadavg()[0])
            print(f"captured {pool}{i:02d} in {secs:.1f} s, load average {loads[-1]:.1f}", flush=True)
        print(f"{len(order)} captures beside {busy} busy loops on {os.cpu_count()} cores; load average "
              f"(1 min) {min(loads):.1f} .. {max(loads):.1f}", flush=True)
    finally:
        for p in loops:
            p.kill()
            p.wait()


def control_spread(opened: list[Any]) -> None:
    """Per (variant, phase, size): how far each identical run's median step over each control
    moved between runs (the standard deviation of its log, in %): the noise each control
    leaves, the choice of divisor docs/formats.md justifies."""
    import numpy as np

    from kvprof.core.timings import CONTROL, FREE_CONTROL

    per: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    for run in opened:
        series: dict[tuple[str, str, int], dict[str, Any]] = {}
        for r in run.timings.select(pass_="reference"):
            series.setdefault((r.variant, r.phase, r.size), {})[r.mode] = np.asarray(r.samples_ns, dtype=float)
        for key, modes in series.items():
            w = modes.get("writes")
            for name, mode in (("raw", None), ("torch", CONTROL), ("numpy", FREE_CONTROL)):
                c = modes.get(mode) if mode else np.ones_like(w)
                if w is not None and c is not None and len(c) == len(w):
                    per.setdefault(key, {}).setdefault(name, []).append(float(np.median(w / c)))
    print("between identical runs, std of log(median step / control), %: row, raw (no control), torch's, numpy's")
    for key in sorted(per):
        cells = [f"{100 * float(np.std(np.log(per[key][n]))):6.1f}" if n in per[key] else "   n/a"
                 for n in ("raw", "torch", "numpy")]
        print(f"  {key[0]} {key[1]} {key[2]}".ljust(34) + " ".join(cells))


def judge_pool(name: str, pairs: list[tuple[tuple[Any, Any], tuple[Any, Any]]], threshold: float) -> None:
    """Every (BASE, NEW) pair of one pool judged: the verdicts, the rows that regressed or were too
    noisy to judge, the steps the gate asked for, and (identical pairs) each false fail."""
    from kvprof import api

    verdicts: Counter[str] = Counter()
    rows_failed: Counter[str] = Counter()
    rows_noisy: Counter[str] = Counter()
    worst: list[str] = []
    widest = 0.0
    needed: list[int] = []  # per inconclusive pair: the reference steps the gate says would settle it
    stuck = 0  # inconclusive pairs with a row that no step count settles
    for (ob, ab), (on, an) in pairs:
        gate = api.regression_gate(ab, an, threshold, base_run=ob, new_run=on)
        verdicts[gate.verdict] += 1
        if gate.verdict == "inconclusive":
            steps, rows_stuck = gate.steps_needed
            needed += [steps] if steps is not None else []
            stuck += bool(rows_stuck)
        for r in gate.rows:
            if r.low_pct is not None and r.high_pct is not None:
                widest = max(widest, r.high_pct - r.low_pct)
            if r.regressed:
                rows_failed[f"{r.variant} {r.phase} {r.size}"] += 1
            elif r.status == "inconclusive":
                rows_noisy[f"{r.variant} {r.phase} {r.size}"] += 1
        if name == "same" and gate.verdict == "regressed":
            worst += [f"  {ob.manifest.run_id} -> {on.manifest.run_id}: {r.variant} {r.phase} {r.size} "
                      f"{r.judged_pct:+.1f} % ({r.low_pct:+.1f} .. {r.high_pct:+.1f})" for r in gate.regressed]
    rows = len(gate.rows) + len(gate.unjudged)
    print(f"{name:5s} {len(pairs):4d} pairs, {rows} rows each: "
          + ", ".join(f"{v} {verdicts[v]}" for v in ("passed", "inconclusive", "regressed", "not judged"))
          + f"; widest interval {widest:.1f} points")
    if needed or stuck:
        q = sorted(needed)
        print(f"      inconclusive pairs: the gate asks for --reference-steps {q[len(q) // 2] if q else 'n/a'} "
              f"(median), {q[-1] if q else 'n/a'} (max) in {len(q)} pairs; a row no step count settles in {stuck}")
    for row, n in sorted(rows_failed.items()):
        print(f"      regressed in {n:4d} pairs: {row}")
    for row, n in sorted(rows_noisy.items()):
        print(f"      too noisy in {n:4d} pairs: {row}")
    for line in worst:
        print(line)


def first_steps(opened: Any, steps: int) -> Any:
    """The run as if its reference pass had stopped after ``steps`` steps: each reference series
    cut to its first ``steps`` samples (the pass times every mode once per step, so the first N
    steps of a longer pass are the steps a pass of N would have timed)."""
    from dataclasses import replace

    if opened.timings is not None:
        opened.timings.records = [replace(r, samples_ns=r.samples_ns[:steps]) if r.pass_ == "reference" else r
                                  for r in opened.timings.records]
    return opened


def judge(root: Path, threshold: float, steps: int | None = None) -> int:
    from kvprof import api

    runs: dict[str, list[tuple[Any, Any]]] = {}
    for pool in POOLS:
        folders = sorted(p for p in (root / pool).glob(f"{pool}*") if p.is_dir()) if (root / pool).is_dir() else []
        opened = [api.open_run(f) for f in folders]
        if steps is not None:
            opened = [first_steps(o, steps) for o in opened]
        runs[pool] = [(o, api.analyze(o)) for o in opened]
    same = runs["same"]
    if len(same) < 2:
        print(f"gate_false_fails: fewer than 2 identical runs under {root / 'same'}", file=sys.stderr)
        return 1
    print(f"threshold {threshold:g} %; {', '.join(f'{len(runs[p])} {p}' for p in POOLS)} runs"
          + (f"; each reference series cut to its first {steps} steps" if steps is not None else ""))
    control_spread([o for o, _ in same])
    for name, pairs in (("same", list(itertools.permutations(same, 2))),
                        ("twice", list(itertools.product(same, runs["twice"]))),
                        ("torch", list(itertools.product(same, runs["torch"])))):
        if pairs:
            judge_pool(name, pairs, threshold)
    if runs["torch"]:  # what the gate did before its control was checked: torch's control divided, unchecked
        unchecked: Counter[str] = Counter(
            api.regression_gate(ab, an, threshold, base_run=ob, new_run=on, check_control=False).verdict
            for (ob, ab), (on, an) in itertools.product(same, runs["torch"]))
        print(f"torch {sum(unchecked.values()):4d} pairs with torch's control unchecked (check_control=False): "
              + ", ".join(f"{v} {unchecked[v]}" for v in ("passed", "inconclusive", "regressed", "not judged")))
    return 0


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # so that the busy loops and a running capture are ended


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10, help="identical captures (default: %(default)s)")
    p.add_argument("--regressed", type=int, default=3, help="captures of each regression (default: %(default)s)")
    p.add_argument("--busy", type=int, default=6, help="busy-looping processes beside them (default: %(default)s)")
    p.add_argument("--reference-steps", type=int, default=None,
                   help="capture --reference-steps (default: capture's, 10 on a CPU)")
    p.add_argument("--threshold", type=float, default=10.0, help="the gate's PCT (default: %(default)s)")
    p.add_argument("--keep", type=Path, default=None, help="keep the captured pools in this folder")
    p.add_argument("--judge", type=Path, default=None, help="judge the pools kept in this folder, capture nothing")
    p.add_argument("--judge-steps", type=int, default=None,
                   help="with --judge: judge each run on the first N steps of its reference pass")
    args = p.parse_args(argv)
    if (args.runs < 2 or args.regressed < 0 or args.busy < 0 or not args.threshold >= 0
            or (args.reference_steps is not None and args.reference_steps < 4)
            or (args.judge_steps is not None and (args.judge_steps < 4 or args.judge is None))):
        print("gate_false_fails: --runs >= 2, --regressed >= 0, --busy >= 0, --threshold >= 0, --reference-steps >= 4, "
              "--judge-steps >= 4 (with --judge)",
              file=sys.stderr)
        return 1
    if args.judge is not None:
        return judge(args.judge, args.threshold, args.judge_steps)
    root = args.keep or Path(tempfile.mkdtemp(prefix="kvprof-gate-pairs-"))
    try:
        steps = f" --reference-steps {args.reference_steps}" if args.reference_steps else ""
        print(f"# python lab/gate_false_fails.py --runs {args.runs} --regressed {args.regressed} --busy {args.busy} "
              f"--threshold {args.threshold:g}{steps}", flush=True)
        capture_pools(root, args.runs, args.regressed, args.busy, args.reference_steps)
        return judge(root, args.threshold)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"gate_false_fails: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
