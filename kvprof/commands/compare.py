"""Compare variants with a baseline, or a run with another run: ratios and the saving per decode step.

RUN is a run directory or trace (as for analyze). Alone, each of its variants is
compared with --baseline. With RUN2, each variant of RUN is compared with the same
variant of RUN2 (before -> after: did the change make it faster?); a variant that has no
row says why. The projection multiplies the per-write cost difference by --layers
(default 80, Llama-3.1-70B) and sets it against the motivating benchmark's inter-token
latency (12.05 ms before, 11.87 ms after). Writes compare.json next to RUN2 (or RUN) or
into --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvprof.argtypes import positive_float, positive_int
from kvprof.core.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvprof.analysis.compare import Benchmark

    b = Benchmark()
    parser.add_argument("run", help="run directory or trace holding the baseline (and variants)")
    parser.add_argument("run2", nargs="?", default=None, help="second run whose variants are compared with the baseline")
    parser.add_argument("--baseline", default="two_stream", help="baseline variant (default two_stream)")
    parser.add_argument("--layers", type=positive_int, default=None, help=f"layers per decode step (default {b.layers})")
    parser.add_argument("--itl-before", type=positive_float, default=b.itl_before_ms, help="baseline inter-token latency, ms")
    parser.add_argument("--itl-after", type=positive_float, default=b.itl_after_ms, help="measured inter-token latency after, ms")
    parser.add_argument("--max-events", type=positive_int, default=None, help="refuse traces with more events than this")
    parser.add_argument("--out", type=Path, default=None, help="folder for compare.json")
    parser.add_argument("--no-files", action="store_true", help="print only")


def run(args: argparse.Namespace) -> int:
    from kvprof import api
    from kvprof.report.console import comparison_table, make_console, run_comparison_table
    from kvprof.report.files import write_json

    me = api.DEFAULT_MAX_EVENTS if args.max_events is None else args.max_events
    bench = api.benchmark(args.layers, args.itl_before, args.itl_after)
    first = api.analyze(api.open_run(args.run, me), baseline=args.baseline, bench=bench, layers=args.layers)
    con = make_console()
    if args.run2:
        second = api.analyze(api.open_run(args.run2, me), bench=bench, layers=args.layers)
        runs = api.compare_runs(first, second, bench=bench, layers=args.layers)
        if not runs.rows:
            raise UsageError(f"{args.run} and {args.run2} have no variant measured in both: " + "; ".join(runs.empty))
        doc = clean(runs.to_json())
        con.print(run_comparison_table(doc))
        for why in runs.empty:
            con.print(f"[yellow]no row:[/yellow] {why}")
    else:
        doc = api.compare_variants(first, args.baseline, bench, args.layers)
        if doc["rows"]:
            con.print(comparison_table(doc))
        h = doc.get("headline")
        if h:
            con.print(f"captured {h['variant']} ({h['source']}, decode bs={h['size']}): saving "
                      f"{h['saving_per_step_ms']:.3f} ms per step -> ITL {bench.itl_before_ms:.2f} -> "
                      f"{h['predicted_itl_ms']:.2f} ms; measured {bench.itl_before_ms:.2f} -> {bench.itl_after_ms:.2f} ms")
        for w in doc["warnings"]:
            con.print(f"[yellow]warning:[/yellow] {w}")
    if not args.no_files:
        out = api.output_dir(args.run2 or args.run, args.out)
        write_json(out / "compare.json", doc)
        print(out / "compare.json")
    return 0


def clean(doc: dict) -> dict:  # type: ignore[type-arg]
    from kvprof.analysis.summary import clean as _clean

    return _clean(doc)
