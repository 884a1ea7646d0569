#!/usr/bin/env python3
"""A card's rope row from several ``lab/rope_bench.py`` runs: at each token count, the launch
shape with the least regret over the runs.

    python lab/rope_rows.py RUN [RUN ...] [--tokens 10,64] [--show 6]   # RUN: rope-bench.json or its .txt

Why over runs: at a few tokens the forced shapes' order changes from one run to the next by
more than they differ within a run (the H100 row at 17-64 tokens, docs/layouts.md), so one
run's fastest is not a pick. The candidates at a token count are the shapes timed in every
run that timed that count; a candidate's regret is the largest, over those runs, of its time
over the run's fastest candidate, and the pick is the least regret (ties: the smaller median
time). Forced shapes are the ``rope_triton_fused@T.H.W[t][s][pN]`` variants; the table's own
``rope_triton_fused`` and the copies and rotaries are left out (a run does not record the
table's shape). Prints each count's shapes with every run's time and regret, then the picks as
the row's entries (consecutive counts with one pick merged; a measured count is each entry's
bound: counts between two measured ones take the larger's pick, untimed). A run is its JSON or
the table it printed, either gzipped. Bad input: one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kvprof from the checkout (shape_config)

SHAPE = re.compile(r"rope_triton_fused@(\d+)\.(\d+)\.(\d+)(t?)(s?)(?:p(\d+))?")


class RowsError(Exception):
    """Bad input: one line for the user."""


TEXT_ROW = re.compile(r"(\S+)\s+(\d+)\s+(\S+)\s")  # rope_bench's printed table: variant, tokens, graph µs


def load_run(path: Path) -> dict[int, dict[str, float]]:
    """tokens -> forced shape -> graph µs of one rope_bench run: its JSON, or the table it
    printed (runs before the JSON was written), either gzipped."""
    from kvprof.core.files import gunzipped

    try:
        text = gunzipped(path.read_bytes()).decode()
    except (OSError, ValueError) as exc:
        raise RowsError(f"{path}: cannot read it ({type(exc).__name__}: {exc})") from None
    if not text.lstrip().startswith("{"):
        return _from_table(path, text)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RowsError(f"{path}: not a rope_bench JSON ({type(exc).__name__}: {exc})") from None
    results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(results, list):
        raise RowsError(f"{path}: not a rope_bench JSON (no results list)")
    rows = [(r.get("variant"), r.get("tokens"), r.get("graph_us")) for r in results if isinstance(r, dict)]
    return _collect(path, rows)


def _from_table(path: Path, text: str) -> dict[int, dict[str, float]]:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.split()[:4] == ["variant", "tokens", "graph", "us"]), None)
    if start is None:
        raise RowsError(f"{path}: neither a rope_bench JSON nor its printed table "
                        "(no 'variant tokens graph us' header)")
    rows: list[tuple[Any, Any, Any]] = []
    for line in lines[start + 1:]:
        m = TEXT_ROW.match(line)
        if m and SHAPE.fullmatch(m[1]):
            try:
                rows.append((m[1], int(m[2]), float(m[3])))
            except ValueError:
                raise RowsError(f"{path}: {m[1]} has no number for graph µs at {m[2]} tokens") from None
    return _collect(path, rows)


def _collect(path: Path, rows: list[tuple[Any, Any, Any]]) -> dict[int, dict[str, float]]:
    run: dict[int, dict[str, float]] = {}
    for variant, tokens, us in rows:
        if not (isinstance(variant, str) and SHAPE.fullmatch(variant)):
            continue
        if not isinstance(tokens, int) or not isinstance(us, (int, float)) or not us > 0:
            raise RowsError(f"{path}: {variant} has no positive graph_us at an integer token count")
        run.setdefault(tokens, {})[variant.partition("@")[2]] = float(us)
    return run


def rank(runs: list[dict[int, dict[str, float]]], tokens: int) -> list[dict[str, Any]]:
    """Candidates at one token count, least regret first: shape, per-run µs, regret, median."""
    timed = [run[tokens] for run in runs if tokens in run]
    shapes = set.intersection(*(set(t) for t in timed)) if timed else set()
    rows = []
    for shape in shapes:
        times = [t[shape] for t in timed]
        regret = max(t[shape] / min(t[s] for s in shapes) for t in timed)
        rows.append({"shape": shape, "us": times, "regret": regret, "median": statistics.median(times)})
    return sorted(rows, key=lambda r: (r["regret"], r["median"], r["shape"]))


def shape_config(shape: str) -> Any:
    """``8.1.4ts`` -> kvprof's ``RopeConfig(8, 1, 4, token_major=True, stream=True)`` (needs torch)."""
    from kvprof.kvcache.writers.rope_tables import RopeConfig

    m = SHAPE.fullmatch(f"rope_triton_fused@{shape}")
    if m is None:
        raise RowsError(f"not a launch shape: {shape!r}")
    return RopeConfig(int(m[1]), int(m[2]), int(m[3]), bool(m[4]), bool(m[5]), int(m[6] or 0))


def config_text(shape: str) -> str:
    """The row entry's ``RopeConfig(...)`` as rope_tables.py writes it (no torch needed)."""
    m = SHAPE.fullmatch(f"rope_triton_fused@{shape}")
    if m is None:
        raise RowsError(f"not a launch shape: {shape!r}")
    args = [m[1], m[2], m[3]] + [f"{k}=True" for k, on in (("token_major", m[4]), ("stream", m[5])) if on]
    if m[6]:
        args.append(f"persistent={m[6]}")
    return f"RopeConfig({', '.join(args)})"


def entries(picks: list[tuple[int, str, float]]) -> list[tuple[int, str, list[float]]]:
    """Consecutive counts with the same pick as one entry, bounded by the larger count."""
    out: list[tuple[int, str, list[float]]] = []
    for tokens, shape, regret in picks:
        if out and out[-1][1] == shape:
            out[-1] = (tokens, shape, out[-1][2] + [regret])
        else:
            out.append((tokens, shape, [regret]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="rope_bench runs: each its JSON or the table it printed")
    ap.add_argument("--tokens", help="token counts to rank (default: every count a run timed)")
    ap.add_argument("--show", type=int, default=6, help="shapes shown per token count (default 6)")
    args = ap.parse_args(argv)
    try:
        if args.show < 1:
            raise RowsError(f"--show takes a count of at least 1, got {args.show}")
        runs = [load_run(p) for p in args.runs]
        counts = sorted({t for run in runs for t in run})
        if args.tokens:
            try:
                wanted = [int(t) for t in args.tokens.split(",") if t.strip()]
            except ValueError:
                raise RowsError(f"--tokens takes integers separated by commas, got {args.tokens!r}") from None
            missing = [t for t in wanted if t not in counts]
            if missing:
                raise RowsError(f"no run timed a forced shape at {missing} tokens (timed: {counts})")
            counts = sorted(wanted)
        if not counts:
            raise RowsError("no forced shape (rope_triton_fused@T.H.W) in any run")
    except RowsError as exc:
        print(f"rope_rows: {exc}", file=sys.stderr)
        return 2
    picks: list[tuple[int, str, float]] = []
    for tokens in counts:
        ranked = rank(runs, tokens)
        n = sum(tokens in run for run in runs)
        print(f"{tokens} tokens ({n} run{'s' * (n != 1)}): shape, µs per layer in each run, "
              "worst ratio to a run's fastest")
        if not ranked:
            print("  no shape timed in every one of them")
            continue
        for r in ranked[: args.show]:
            times = " / ".join(f"{us:.3f}" for us in r["us"])
            print(f"  {r['shape']:<10} {times:<34} {r['regret']:.3f}")
        picks.append((tokens, ranked[0]["shape"], ranked[0]["regret"]))
    print("the row's entries (up to that many tokens, the pick; its worst ratio at each count):")
    for tokens, shape, regrets in entries(picks):
        print(f"  (head_dim, {tokens}, {config_text(shape)}),  # {' / '.join(f'{r:.3f}' for r in regrets)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
