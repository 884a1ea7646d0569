"""How wide the regression gate's noise interval is over N reference steps, on a loaded CPU.

A third-party writer (``--writer gate_writer:make``) stores every K and V once in BASE and
twice in NEW: a real slowdown, the pair ``tests/test_gate_captures.py`` judges (taken from
it). Each pair is two ``python -m kvprof capture`` processes (index_put and that writer,
decode batch 1) and ``compare --fail-if-slower 10 --json``; the row printed is the writer's
judged slowdown over the control series and its 95 % interval. ``--busy N`` keeps N
busy-looping processes beside the captures (ended on exit, whatever happens), as a shared
CI machine would be loaded.

    python lab/gate_steps.py [--steps 10,60] [--pairs 3] [--busy 3] [--threshold 10]

docs/formats.md quotes its output (2 cores, three busy loops, 2026-12-05).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the pair tests/test_gate_captures.py judges, taken from it: what is measured here is what it tests
_TEST = Path(__file__).resolve().parents[1] / "tests" / "test_gate_captures.py"
_spec = importlib.util.spec_from_file_location("kvprof_gate_test_writers", _TEST)
assert _spec is not None and _spec.loader is not None
_writers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_writers)
WRITER, ONCE, TWICE = _writers.WRITER, _writers.ONCE, _writers.TWICE
BUSY = "while True: pass"


def capture(out: Path, run_id: str, writer_dir: Path, steps: int) -> float:
    """One capture in its own process; its wall time in seconds."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(writer_dir), os.environ.get("PYTHONPATH", "")])}
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvprof", "capture", "--batch-sizes", "1", "--phase", "decode",
                           "--no-progress", "--no-summary", "--variants", "index_put", "--writer", "gate_writer:make",
                           "--reference-steps", str(steps), "--out", str(out), "--run-id", run_id],
                          env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"capture {run_id} exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - t


def judged(base: Path, new: Path, threshold: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, "-m", "kvprof", "compare", str(base), str(new), "--fail-if-slower",
                           threshold, "--json"], capture_output=True, text=True, timeout=300)
    rows = {r["variant"]: r for r in json.loads(proc.stdout)["gate"]["rows"]}
    row: dict[str, object] = rows["gate_writer.make"]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="10,60", help="reference steps per capture, each tried (default: %(default)s)")
    p.add_argument("--pairs", type=int, default=3, help="BASE/NEW pairs per step count (default: %(default)s)")
    p.add_argument("--busy", type=int, default=3, help="busy-looping processes beside them (default: %(default)s)")
    p.add_argument("--threshold", default="10", help="compare --fail-if-slower PCT (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        steps = [int(x) for x in args.steps.split(",") if x]
        float(args.threshold)
    except ValueError:
        print(f"gate_steps: cannot read --steps {args.steps!r} / --threshold {args.threshold!r}", file=sys.stderr)
        return 1
    if not steps or min(steps) < 4 or args.pairs < 1 or args.busy < 0:
        print("gate_steps: --steps each >= 4, --pairs >= 1, --busy >= 0", file=sys.stderr)
        return 1
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(args.busy)]
    try:
        with tempfile.TemporaryDirectory(prefix="kvprof-gate-steps-") as tmp:
            root = Path(tmp)
            for folder, body, how in (("once", ONCE, "once"), ("twice", TWICE, "every write done twice")):
                (root / folder).mkdir()
                (root / folder / "gate_writer.py").write_text(WRITER.format(body=body, how=how))
            print(f"busy loops {args.busy}, {os.cpu_count()} cores, threshold {args.threshold} %")
            print("steps pair  judged %   low %   high %   width  drift %  regressed  capture s")
            for n in steps:
                for i in range(args.pairs):
                    out = root / f"s{n}-{i}"
                    secs = [capture(out, "base", root / "once", n), capture(out, "new", root / "twice", n)]
                    r = judged(out / "base", out / "new", args.threshold)
                    lo, hi = float(r["low_pct"]), float(r["high_pct"])  # type: ignore[arg-type]
                    print(f"{n:5d} {i:4d} {float(r['judged_pct']):9.1f} {lo:7.1f} {hi:8.1f} {hi - lo:7.1f} "  # type: ignore[arg-type]
                          f"{float(r['drift_pct']):8.1f}  {str(r['regressed']):9s}  "  # type: ignore[arg-type]
                          f"{secs[0]:.1f} / {secs[1]:.1f}", flush=True)
    except (RuntimeError, subprocess.TimeoutExpired, KeyError, ValueError) as exc:
        print(f"gate_steps: {exc}", file=sys.stderr)
        return 1
    finally:
        for b in busy:
            b.kill()
            b.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
