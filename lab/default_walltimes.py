"""Wall time of each subcommand's default run on this machine, and when it first shows something.

Each command runs in a fresh folder under a pseudo-terminal (as a user's terminal: progress
displays draw only on one), in the order a new user meets them: ``capture`` (its run folder
then feeds ``analyze``, ``report`` and ``compare``), ``capture --context layer``, ``variants``,
``bench``, ``bench --family rope``. For each: the seconds until its first byte of output, the
seconds until it ended, its exit status, and the 1-minute load average before it started (the
machine may be shared). The target: within 30 s, or something on screen within 2 s.

    python lab/default_walltimes.py [--only NAME,...] [--json OUT.json]

Prints a table; ``--json`` also writes the rows. Needs no GPU: a CPU run is what it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S, FIRST_OUTPUT_S = 30.0, 2.0


def commands(work: Path) -> list[tuple[str, list[str]]]:
    run = work / "traces" / "default"
    return [
        ("capture", ["capture", "--run-id", "default"]),
        ("analyze", ["analyze", str(run)]),
        ("report", ["report", str(run), "--html", str(work / "report.html")]),
        ("compare", ["compare", str(run)]),
        ("capture --context layer", ["capture", "--context", "layer", "--run-id", "layer"]),
        ("variants", ["variants"]),
        ("bench", ["bench", "--out", str(work / "bench")]),
        ("bench --family rope", ["bench", "--family", "rope", "--out", str(work / "bench-rope")]),
    ]


def timed(argv: list[str], cwd: Path, limit_s: float) -> dict:
    """Run ``python -m kvprof ARGV`` on a pseudo-terminal; the times of its first output and end."""
    load = os.getloadavg()[0]
    master, slave = pty.openpty()
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "kvprof", *argv], cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=slave, stderr=slave, start_new_session=True,
                            env={**os.environ, "COLUMNS": "120", "LINES": "40"})
    os.close(slave)
    first = None
    out = bytearray()
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed its end
                    chunk = b""
                if chunk:
                    first = first if first is not None else time.monotonic() - t0
                    out += chunk
                elif proc.poll() is not None:
                    break
            elif proc.poll() is not None:
                break
            if time.monotonic() - t0 > limit_s:
                raise TimeoutError
        rc = proc.wait()
    except (TimeoutError, KeyboardInterrupt):
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        rc = None
    finally:
        os.close(master)
    end = time.monotonic() - t0
    return {"first_output_s": first, "wall_s": end, "rc": rc, "load_1min": load,
            "tail": out.decode(errors="replace")[-400:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="comma-separated names from the table (default: all)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--limit-s", type=float, default=600.0, help="end a command after this long")
    args = ap.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    names = [name for name, _ in commands(Path("."))]
    if only and only - set(names):
        ap.error(f"--only: unknown {', '.join(sorted(only - set(names)))}; choose from {', '.join(names)}")
    work = Path(tempfile.mkdtemp(prefix="kvprof-walltimes-"))
    rows = []
    try:
        for name, cmd in commands(work):
            if only and name not in only:
                continue
            row = {"command": "python -m kvprof " + " ".join(a if a != str(work) else "." for a in cmd), "name": name,
                   **timed(cmd, work, args.limit_s)}
            rows.append(row)
            ok = row["rc"] == 0 and (row["wall_s"] <= TARGET_S or (row["first_output_s"] or 1e9) <= FIRST_OUTPUT_S)
            row["meets_target"] = ok
            first = f"{row['first_output_s']:.1f}" if row["first_output_s"] is not None else "-"
            print(f"{name:<24} first output {first:>5} s  wall {row['wall_s']:6.1f} s  rc {row['rc']}  "
                  f"load {row['load_1min']:.1f}  {'ok' if ok else 'MISSED'}", flush=True)
            if row["rc"] != 0:
                print("   " + row["tail"].replace("\n", "\n   "), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"cores {os.cpu_count()}, target: within {TARGET_S:.0f} s or first output within {FIRST_OUTPUT_S:.0f} s")
    if args.json:
        for r in rows:
            r.pop("tail", None)
        args.json.write_text(json.dumps({"cores": os.cpu_count(), "rows": rows}, indent=1) + "\n")
    return 0 if all(r["meets_target"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
