#!/usr/bin/env python3
"""The µs-per-write table of docs/benchmarks.md, from a bench.json.

    python lab/bench_markdown.py traces/samples/h200-bench/bench.json [--mode graph|eager] [--field host_us]

One Markdown row per point (shape, dtype, tokens): each variant's median µs per write, then,
for graph and wall-clock tables, the best kvprof fused variant's columns (the same cells as
``kvprof bench``'s console table).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvprof.bench.render import EXTRA_COLUMNS, point_rows  # noqa: E402
from kvprof.core.bench_result import BenchResult  # noqa: E402


def to_markdown(result: BenchResult, mode: str = "graph", field: str = "median_us") -> str:
    """One Markdown table: µs per write per variant (``field``: the median, or a host-time column)."""
    head = ["shape", "dtype", "tokens", *result.variants, *(EXTRA_COLUMNS if field == "median_us" else ())]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cells) + " |" for cells in point_rows(result, mode, no="**no**", field=field)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_json", type=Path)
    ap.add_argument("--mode", choices=("graph", "eager"), default="graph")
    ap.add_argument("--field", choices=("median_us", "host_us", "writer_host_us"), default="median_us")
    args = ap.parse_args(argv)
    try:
        result = BenchResult.from_json(args.bench_json.read_bytes())
    except (OSError, ValueError) as exc:
        print(f"bench_markdown.py: error: {args.bench_json}: {exc}", file=sys.stderr)
        return 1
    sys.stdout.write(to_markdown(result, args.mode, args.field))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
