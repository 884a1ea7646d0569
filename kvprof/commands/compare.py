"""Compare variants with a baseline, or a run with another run: ratios and the saving per decode step.

RUN is a run directory or trace (as for analyze). Alone, each of its variants is
compared with --baseline. With RUN2, each variant of RUN is compared with the same
variant of RUN2 (before -> after: did the change make it faster?); a variant or a
figure that has no value says why. The projection multiplies the per-write cost
difference by --layers (default 80, Llama-3.1-70B) and sets it against the motivating
benchmark's inter-token latency (12.05 ms before, 11.87 ms after).

Nothing is written unless --out FOLDER is given (then compare.json goes there): the
inputs, the committed samples included, are never written to. --format json prints
the document on stdout instead of the tables.

The regression gate, for CI: kvprof compare BASE NEW --fail-if-slower PCT judges each
variant x phase x size on the most trusted source both runs measured (BASE's
trusted_sources: the unprofiled reference first) and exits 1 when any is slower than
BASE by more than PCT percent AND by more than the sum of both runs' step IQRs per
write (PCT alone where a run has fewer than 4 steps); 0 otherwise. The regressed rows
are printed (stderr when stdout holds a json/csv document); --junit FILE also writes a
JUnit XML report with one testcase per judged row.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvprof.argtypes import non_negative_float, output_folder, positive_float, positive_int
from kvprof.core.errors import UsageError
from kvprof.core.rundir import RunDir
from kvprof.report.terminal import add_format_arguments

GATE_FAILED_EXIT_CODE = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvprof.analysis.compare import Benchmark

    b = Benchmark()
    parser.add_argument("run", help="run directory or trace holding the baseline (and variants); BASE for the gate")
    parser.add_argument("run2", nargs="?", default=None, help="second run, each variant compared with itself in RUN")
    parser.add_argument("--baseline", default="two_stream", help="baseline variant (default two_stream)")
    parser.add_argument("--layers", type=positive_int, default=None, help=f"layers per decode step (default {b.layers})")
    parser.add_argument("--itl-before", type=positive_float, default=b.itl_before_ms, help="baseline inter-token latency, ms")
    parser.add_argument("--itl-after", type=positive_float, default=b.itl_after_ms, help="measured inter-token latency after, ms")
    parser.add_argument("--max-events", type=positive_int, default=None,
                        help="refuse traces with more events than this (default 4,000,000; also bounds the JSON "
                             "values parsed at once, and KVPROF_MAX_TRACE_MB the decompressed size)")
    parser.add_argument("--out", type=output_folder, default=None, help=f"folder for {RunDir.COMPARE} (default: write nothing)")
    parser.add_argument("--no-files", action="store_true", help="write nothing even with --out")
    parser.add_argument("--fail-if-slower", type=non_negative_float, default=None, metavar="PCT",
                        help="with RUN2: exit 1 when any variant x phase x size of RUN2 is slower than in RUN by "
                             "more than PCT %% and more than both runs' spread (step IQR per write)")
    parser.add_argument("--junit", type=Path, default=None, metavar="FILE",
                        help="with --fail-if-slower: also write a JUnit XML report (one testcase per row)")
    add_format_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from kvprof import api
    from kvprof.report.files import write_json
    from kvprof.report.renderers import Output, RunComparisonDoc, VariantComparisonDoc, render
    from kvprof.report.terminal import note, table_console

    if args.fail_if_slower is not None and not args.run2:
        raise UsageError("--fail-if-slower needs two runs: kvprof compare BASE NEW --fail-if-slower PCT")
    if args.junit is not None and args.fail_if_slower is None:
        raise UsageError("--junit needs --fail-if-slower PCT")
    me = api.DEFAULT_MAX_EVENTS if args.max_events is None else args.max_events
    bench = api.benchmark(args.layers, args.itl_before, args.itl_after)
    baseline = None if args.run2 else args.baseline
    first = api.analyze(api.open_run(args.run, me), baseline=baseline, bench=bench, layers=args.layers)
    con = table_console(args.format)
    gate = None
    if args.run2:
        second = api.analyze(api.open_run(args.run2, me), bench=bench, layers=args.layers)
        runs = api.compare_runs(first, second, bench=bench, layers=args.layers)
        if not runs.rows and args.fail_if_slower is None:
            raise UsageError(f"{args.run} and {args.run2} have no variant measured in both: " + "; ".join(runs.empty))
        doc = api.clean(runs.to_json())
        if args.fail_if_slower is not None:
            gate = api.regression_gate(first, second, args.fail_if_slower)
            doc["gate"] = api.clean(gate.to_json())
        result: RunComparisonDoc | VariantComparisonDoc = RunComparisonDoc(doc)
    else:
        doc = api.compare_variants(first, args.baseline, bench, args.layers)
        result = VariantComparisonDoc(doc)
    render(args.format, result, Output(console=con))
    if gate is not None:
        _report_gate(gate, args)
    if args.out is not None and not args.no_files:
        out = RunDir(args.out).compare
        write_json(out, doc)
        note(args.format, str(out))
    return GATE_FAILED_EXIT_CODE if gate is not None and not gate.passed else 0


def _report_gate(gate: Any, args: argparse.Namespace) -> None:
    from kvprof.report.renderers import Output, render
    from kvprof.report.terminal import table_console

    out = Output(console=table_console(args.format), path=args.junit)
    render("table", gate, out)
    if args.junit is not None:
        render("junit", gate, out, base=str(args.run), new=str(args.run2))
