"""Compare variants with a baseline: ratios and projected saving per decode step.

RUN is a run directory or trace (as for analyze). With RUN2, RUN2's variants are
compared with the baseline variant taken from RUN. The projection multiplies the
per-write cost difference by --layers (default 80, Llama-3.1-70B) and sets it against
the motivating benchmark's inter-token latency (12.05 ms before, 11.87 ms after).
Writes compare.json next to RUN2 (or RUN) or into --out.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvprof.argtypes import positive_float, positive_int
from kvprof.errors import UsageError


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
    import pandas as pd
    from kvprof.analysis.compare import Benchmark, compare_groups
    from kvprof.analysis.summary import analyze, clean
    from kvprof.report.console import comparison_table
    from kvprof.report.files import write_json
    from kvprof.trace.kineto import DEFAULT_MAX_EVENTS
    from kvprof.trace.load import load

    me = DEFAULT_MAX_EVENTS if args.max_events is None else args.max_events
    bench = Benchmark(itl_before_ms=args.itl_before, itl_after_ms=args.itl_after, layers=args.layers or 80)
    first = analyze(load(args.run, me), baseline=args.baseline, bench=bench, layers=args.layers)
    groups = first.groups
    if args.run2:
        second = analyze(load(args.run2, me), bench=bench, layers=args.layers)
        base = groups[groups["variant"] == args.baseline]
        if base.empty:
            raise UsageError(f"baseline {args.baseline!r} is not in {args.run} "
                             f"(variants: {', '.join(sorted(groups['variant'].astype(str).unique())) or 'none'})")
        groups = pd.concat([base, second.groups[second.groups["variant"] != args.baseline]], ignore_index=True)
    elif args.baseline not in set(groups["variant"].astype(str)):
        raise UsageError(f"baseline {args.baseline!r} has no measured writes in {args.run} "
                         f"(variants: {', '.join(sorted(groups['variant'].astype(str).unique())) or 'none'})")
    fused = [n for n, v in first.summary["variants"].items() if v.get("fused")]
    if args.run2:
        fused += [n for n, v in second.summary["variants"].items() if v.get("fused")]
    result = clean(compare_groups(groups, args.baseline, bench, args.layers, prefer=fused))
    from kvprof.report.console import make_console

    con = make_console()
    if result["rows"]:
        con.print(comparison_table(result))
    h = result.get("headline")
    if h:
        con.print(f"captured {h['variant']} ({h['source']}, decode bs={h['size']}): saving {h['saving_per_step_ms']:.3f} ms "
                  f"per step -> ITL {bench.itl_before_ms:.2f} -> {h['predicted_itl_ms']:.2f} ms; measured "
                  f"{bench.itl_before_ms:.2f} -> {bench.itl_after_ms:.2f} ms")
    for w in result["warnings"]:
        con.print(f"[yellow]warning:[/yellow] {w}")
    if not args.no_files:
        src = Path(args.run2 or args.run)
        out = args.out or (src if src.is_dir() else src.parent)
        write_json(out / "compare.json", result)
        print(out / "compare.json")
    return 0
