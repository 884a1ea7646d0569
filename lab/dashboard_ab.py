"""Interleaved A/B of two dashboard checkouts in one headless Chromium: differences smaller than
benchmarks/bench_dashboard.py's round-to-round noise (about 0.5 s on a 2-core machine).

    python lab/dashboard_ab.py fresh --pairs 7 before=/tmp/kvprof-before after=.
    python lab/dashboard_ab.py warm --rounds 9 before=/tmp/kvprof-before after=/tmp/kvprof-toggle

``fresh``: per pair, in random order, each checkout's server is started (as ``kvprof dashboard``
starts it: ``python -m kvprof.dashboard.serve`` where the checkout has it, else ``streamlit
run``) and visited by a new browser the moment its health check answers: server start, first
chart, and start to first chart. ``warm``: both servers run; per round, in random order, one new
browser each, with bench_dashboard's milestones (Plotly chunk received, first bar drawn).
Each visit waits for the 1-minute load average to fall below 1.0. Data: the H200 samples.
A checkout from ``git worktree add DIR COMMIT``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_dashboard as bd  # noqa: E402
from kvprof.core.errors import ToolError  # noqa: E402
from kvprof.tools.background import BackgroundServer  # noqa: E402

SAMPLES = ROOT / "traces" / "samples"
RUN = SAMPLES / "h200-llama70b-tp8"


def start(code: Path) -> BackgroundServer:
    env = bd.env_for(SAMPLES, RUN, Path(tempfile.mkdtemp(prefix="kvprof-ab-")), code=code)
    return bd.start_server(code, code / "kvprof" / "dashboard" / "app.py", env)


def wait_up(server: BackgroundServer) -> None:
    try:
        server.wait_healthy()
    except ToolError as exc:
        raise SystemExit(f"dashboard_ab: {exc}") from None


def quiet() -> None:
    while os.getloadavg()[0] > 1.0:
        time.sleep(2)


def visit(b: Any, url: str, marks: bool = False) -> tuple[float, dict[str, Any]]:
    ctx = b.new_context(viewport={"width": 1400, "height": 1000})
    try:
        pg = ctx.new_page()
        pg.set_default_timeout(bd.WAIT_MS)
        if marks:
            pg.add_init_script(bd.MARKS_INIT)
        t = time.perf_counter()
        pg.goto(url)
        pg.wait_for_function(bd.FIRST_CHART, polling=20)
        first = time.perf_counter() - t
        got: dict[str, Any] = {}
        if marks:
            pg.wait_for_timeout(300)
            got = pg.evaluate(bd.MARKS)
        return first, got
    finally:
        ctx.close()


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}] n={len(xs)}"


def fresh(b: Any, codes: dict[str, Path], pairs: int) -> None:
    up: dict[str, list[float]] = {k: [] for k in codes}
    first: dict[str, list[float]] = {k: [] for k in codes}
    for _ in range(pairs):
        for name in random.sample(list(codes), len(codes)):
            quiet()
            t = time.perf_counter()
            server = start(codes[name])
            try:
                wait_up(server)
                up[name].append(time.perf_counter() - t)
                first[name].append(visit(b, server.url)[0])
            finally:
                server.stop()
    for name in codes:
        total = [a + c for a, c in zip(up[name], first[name])]
        print(f"{name:10s} server start {spread(up[name])}   first chart {spread(first[name])}   "
              f"start -> first chart {spread(total)}")


def warm(b: Any, codes: dict[str, Path], rounds: int) -> None:
    servers: dict[str, BackgroundServer] = {}
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in codes}
    try:
        for name, code in codes.items():
            servers[name] = start(code)
        for server in servers.values():
            wait_up(server)
        for server in servers.values():
            visit(b, server.url)  # each server's first session: imports and caches, not measured
        for _ in range(rounds):
            for name in random.sample(list(codes), len(codes)):
                quiet()
                wall, m = visit(b, servers[name].url, marks=True)
                rows[name].append({"wall": wall, **m})
    finally:
        for server in servers.values():
            server.stop()
    for name, r in rows.items():
        ok = [x for x in r if x.get("plotly_got") and x.get("bar")]
        print(f"{name:10s} first chart {spread([x['wall'] for x in r])} s   Plotly chunk received "
              f"{spread([x['plotly_got'] / 1000 for x in ok])} s   chunk -> first bar "
              f"{spread([(x['bar'] - x['plotly_got']) / 1000 for x in ok])} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["fresh", "warm"])
    ap.add_argument("checkouts", nargs=2, metavar="NAME=DIR")
    ap.add_argument("--pairs", type=int, default=7, help="fresh: server starts per checkout")
    ap.add_argument("--rounds", type=int, default=9, help="warm: new-browser visits per checkout")
    args = ap.parse_args()
    codes = {}
    for spec in args.checkouts:
        name, _, d = spec.partition("=")
        code = Path(d).resolve()
        if not name or not (code / "kvprof" / "dashboard" / "app.py").is_file():
            print(f"dashboard_ab: {spec!r} is not NAME=CHECKOUT with kvprof/dashboard/app.py", file=sys.stderr)
            return 2
        codes[name] = code
    if not Path(bd.CHROMIUM).is_file():
        print(f"dashboard_ab: {bd.CHROMIUM} is missing (apt-get install chromium)", file=sys.stderr)
        return 2
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("dashboard_ab: the playwright package is missing (pip install -e '.[dev]')", file=sys.stderr)
        return 2

    print(f"load average {os.getloadavg()[0]:.2f}; " + ", ".join(f"{k} = {v}" for k, v in codes.items()))
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=bd.CHROMIUM, args=bd.CHROMIUM_ARGS)
        try:
            (fresh if args.mode == "fresh" else warm)(b, codes, args.pairs if args.mode == "fresh" else args.rounds)
        finally:
            b.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
