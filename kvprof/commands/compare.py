"""Compare variants with a baseline, or a run with another run: ratios and the saving per decode step.

RUN is a run directory or trace (as for analyze). Alone, each of its variants is
compared with --baseline. With RUN2, each variant of RUN is compared with the same
variant of RUN2 (before -> after: did the change make it faster?); a variant or a
figure that has no value says why. The projection multiplies the per-write cost
difference by --layers (default 80, Llama-3.1-70B) and sets it against the motivating
benchmark's inter-token latency (12.05 ms before, 11.87 ms after).

With RUN2, both runs are named with their capture time (the manifest's captured_at)
and RUN stays "before" as given; a line says so when RUN was captured after RUN2. A row
measured in one run only is listed as such (only_in), and the before/after figures are
named before_* and after_* (baseline_* is a baseline variant, without RUN2). Before
anything is compared, the runs are checked for what makes them measure different
things -- device, timing source, settings, Triton's interpreter, torch threads, layers per
step -- and each difference is one line (a warning; with the gate, a refusal).

Nothing is written unless --out FOLDER is given (then compare.json goes there): the
inputs, the committed samples included, are never written to. --format json prints
the document on stdout instead of the tables.

The regression gate, for CI: kvprof compare BASE NEW --fail-if-slower PCT judges each
variant x phase x size on the most trusted source both runs measured (BASE's
trusted_sources: the unprofiled reference first). Each row gets an interval for its
slowdown, family-wise (each row's at 1 - 0.05/m for m rows: judging a dozen rows at once
does not multiply false fails). A row regresses when its slowdown and the low end of its
interval are above PCT, however wide the interval; it passes when the interval's high end,
or its noise (half its interval), is at or under PCT; the rest are inconclusive (too noisy
to judge), and the gate says how many reference steps in both captures would settle them
(--reference-steps N). On a CPU each step is divided by torch's index_put timed
beside it (the interval widened by how far the variants' levels spread within a run:
torch's control over numpy's, each its own allocation), and a row per phase x size
checks that control against numpy's (no torch: a torch that became slower is a
regression like any other); on a GPU the interval is that of the median difference per write over the reference pass's
per-step samples, which must also hold in a profiled pass both runs timed; without
samples it is the slowdown +- both runs' step IQRs per write; rows of unknown noise are
not judged. Rows of variants that ran under Triton's interpreter are left out
(--include-interpreted judges them). Exit codes: 0 passed, 1 a row regressed, 8
inconclusive (no row regressed, some row too noisy to judge), 7 the runs cannot be
compared or no row could be judged (each reason one line), 3 step timings no clock gives
(zero, negative, NaN, infinite; series of different lengths), 2 usage. The rows and
reasons are printed (stderr when stdout holds a json/csv document); --junit FILE also
writes a JUnit XML report with one testcase per row.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from kvprof.commands import add_format_arguments, command_flags
from kvprof.commands.argtypes import non_negative_float, output_file, output_folder, positive_float, positive_int
from kvprof.core.errors import (
    GATE_INCONCLUSIVE_EXIT_CODE,
    GATE_NOT_JUDGED_EXIT_CODE,
    GATE_REGRESSED_EXIT_CODE,
    UsageError,
)
from kvprof.core.rundir import RunDir
from kvprof.report.renderers import RunComparisonDoc, VariantComparisonDoc, formats

GATE_FAILED_EXIT_CODE = GATE_REGRESSED_EXIT_CODE
NOT_COMPARABLE_EXIT_CODE = GATE_NOT_JUDGED_EXIT_CODE  # the runs differ in what they measure, or no row has a noise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvprof.core.benchmark import Benchmark

    b = Benchmark()
    parser.add_argument("run", help="run directory or trace holding the baseline (and variants); BASE for the gate")
    parser.add_argument("run2", nargs="?", default=None, help="second run, each variant compared with itself in RUN")
    parser.add_argument("--baseline", default="two_stream", help="baseline variant (default two_stream)")
    parser.add_argument("--layers", type=positive_int, default=None,
                        help=f"layers per decode step (default {b.layers})")
    parser.add_argument("--itl-before", type=positive_float, default=b.itl_before_ms,
                        help="baseline inter-token latency, ms")
    parser.add_argument("--itl-after", type=positive_float, default=b.itl_after_ms,
                        help="measured inter-token latency after, ms")
    parser.add_argument("--max-events", type=positive_int, default=None,
                        help="refuse traces with more events than this (default 4,000,000; also bounds the JSON "
                             "values parsed at once, and KVPROF_MAX_TRACE_MB the decompressed size)")
    parser.add_argument("--out", type=output_folder, default=None,
                        help=f"folder for {RunDir.COMPARE} (default: write nothing)")
    parser.add_argument("--no-files", action="store_true", help="write nothing even with --out")
    parser.add_argument("--fail-if-slower", type=non_negative_float, default=None, metavar="PCT",
                        help="with RUN2: exit 1 when any variant x phase x size of RUN2 is slower than in RUN by "
                             "more than PCT %% beyond the runs' noise, 8 when none is but a row's interval reaches "
                             "both sides of PCT (inconclusive), 7 when the runs cannot be compared")
    parser.add_argument("--include-interpreted", action="store_true",
                        help="with --fail-if-slower: also judge variants that ran under Triton's interpreter "
                             "(left out by default: the interpreter's time swings between identical runs)")
    parser.add_argument("--junit", type=output_file, default=None, metavar="FILE",
                        help="with --fail-if-slower: also write a JUnit XML report (one testcase per row)")
    add_format_arguments(parser, formats(VariantComparisonDoc, RunComparisonDoc))


def run(args: argparse.Namespace) -> int:
    from kvprof import api
    from kvprof.report.files import write_json
    from kvprof.report.renderers import Output, render
    from kvprof.report.terminal import note, table_console

    if args.fail_if_slower is not None and not args.run2:
        raise UsageError("--fail-if-slower needs two runs: kvprof compare BASE NEW --fail-if-slower PCT")
    if args.junit is not None and args.fail_if_slower is None:
        raise UsageError("--junit needs --fail-if-slower PCT")
    if args.include_interpreted and args.fail_if_slower is None:
        raise UsageError("--include-interpreted needs --fail-if-slower PCT")
    names = flags()
    me = api.DEFAULT_MAX_EVENTS if args.max_events is None else args.max_events
    bench = api.benchmark(args.layers, args.itl_before, args.itl_after)
    baseline = None if args.run2 else args.baseline
    first_run = api.open_run(args.run, me)
    first = api.analyze(first_run, baseline=baseline, bench=bench, layers=args.layers)
    con = table_console(args.format)
    gate = None
    if args.run2:
        second_run = api.open_run(args.run2, me)
        second = api.analyze(second_run, bench=bench, layers=args.layers)
        runs = api.compare_runs(first, second, bench=bench, layers=args.layers)
        if not any(r.get("only_in") is None for r in runs.rows) and args.fail_if_slower is None:
            raise UsageError(f"{args.run} and {args.run2} have no (variant, source, phase, size) measured in both"
                             + (": " + "; ".join(runs.empty) if runs.empty else ""))
        doc = api.clean(runs.to_json())
        doc["runs"] = {"before": _identity(args.run, first_run), "after": _identity(args.run2, second_run)}
        # which variants each run timed in Triton's interpreter: the table marks their costs and
        # derives nothing from them (kvprof.analysis.figures)
        doc["interpreted"] = {side: sorted(n for n, v in a.summary.variants.items() if v.interpreted)
                              for side, a in (("before", first), ("after", second))}
        if args.fail_if_slower is not None:
            gate = api.regression_gate(first, second, args.fail_if_slower, base_run=first_run, new_run=second_run,
                                       include_interpreted=args.include_interpreted, names=names)
            doc["gate"] = api.clean(gate.to_json())
            differ: list[str] = []
        else:
            differ = api.comparability(first, second, first_run, second_run)[0]
            doc["not_comparable"] = differ
        result: RunComparisonDoc | VariantComparisonDoc = RunComparisonDoc(doc)
    else:
        doc = api.compare_variants(first, args.baseline, bench, args.layers)
        result = VariantComparisonDoc(doc)
    render(args.format, result, Output(console=con, names=names))
    if gate is not None:
        _report_gate(gate, args, names)
    if args.out is not None and not args.no_files:
        out = RunDir(args.out).compare
        write_json(out, doc)
        note(args.format, str(out))
    if gate is None:
        return 0
    return {"not judged": NOT_COMPARABLE_EXIT_CODE, "regressed": GATE_FAILED_EXIT_CODE,
            "inconclusive": GATE_INCONCLUSIVE_EXIT_CODE}.get(gate.verdict, 0)


def _identity(path: str, loaded: Any) -> dict[str, Any]:
    """A run as compare names it: the path given, its run id and when it was captured."""
    from kvprof.core.run import captured_text

    m = loaded.manifest
    return {"input": str(path), "run_id": m.run_id if m is not None else None,
            "captured_at": m.captured_at if m is not None else None, "captured": captured_text(m)}


def flags() -> Callable[[str], str]:
    """A setting's field -> its flag: compare's own, then capture's (the gate's advice names
    capture's reference steps)."""
    from kvprof.commands.capture import add_arguments as capture_arguments

    return command_flags(add_arguments, capture_arguments)


def _report_gate(gate: Any, args: argparse.Namespace, names: Callable[[str], str]) -> None:
    from kvprof.report.renderers import Output, render
    from kvprof.report.terminal import table_console

    out = Output(console=table_console(args.format), path=args.junit, names=names)
    render("table", gate, out, exit_code=NOT_COMPARABLE_EXIT_CODE, inconclusive_exit_code=GATE_INCONCLUSIVE_EXIT_CODE)
    if args.junit is not None:
        render("junit", gate, out, base=str(args.run), new=str(args.run2))
