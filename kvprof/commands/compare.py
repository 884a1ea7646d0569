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
trusted_sources: the unprofiled reference first). A row regresses when NEW is slower
than BASE by more than PCT percent beyond the noise: the low end of the 95 % bootstrap
interval of the median difference per write, over the reference pass's per-step
samples, is above PCT, and so it is in a profiled pass both runs timed (without
samples: slower by more than PCT and by more than both runs' step IQRs per write; rows
of unknown noise are not judged). Rows of variants that ran under Triton's interpreter
are left out (--include-interpreted judges them). Exit codes: 0 passed, 1 a row
regressed, 7 the runs cannot be compared or no row could be judged (each reason one
line), 2 usage. The rows and reasons are printed (stderr when stdout holds a json/csv
document); --junit FILE also writes a JUnit XML report with one testcase per row.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvprof.argtypes import non_negative_float, output_folder, positive_float, positive_int
from kvprof.core.errors import UsageError
from kvprof.core.rundir import RunDir
from kvprof.report.terminal import add_format_arguments

if TYPE_CHECKING:
    from rich.console import Console

    from kvprof.analysis.compare import Benchmark
    from kvprof.analysis.gate import GateResult
    from kvprof.analysis.summary import Analysis
    from kvprof.trace.load import Loaded

GATE_FAILED_EXIT_CODE = 1
NOT_COMPARABLE_EXIT_CODE = 7  # the gate judged nothing: the runs differ in what they measure, or no row has a noise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvprof.analysis.compare import Benchmark

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
                             "more than PCT %% beyond the runs' noise; exit 7 when the runs cannot be compared")
    parser.add_argument("--include-interpreted", action="store_true",
                        help="with --fail-if-slower: also judge variants that ran under Triton's interpreter "
                             "(left out by default: the interpreter's time swings between identical runs)")
    parser.add_argument("--junit", type=Path, default=None, metavar="FILE",
                        help="with --fail-if-slower: also write a JUnit XML report (one testcase per row)")
    add_format_arguments(parser)


def _check_flags(args: argparse.Namespace) -> None:
    """The gate's options need the gate, and the gate needs two runs."""
    if args.fail_if_slower is not None and not args.run2:
        raise UsageError("--fail-if-slower needs two runs: kvprof compare BASE NEW --fail-if-slower PCT")
    if args.junit is not None and args.fail_if_slower is None:
        raise UsageError("--junit needs --fail-if-slower PCT")
    if args.include_interpreted and args.fail_if_slower is None:
        raise UsageError("--include-interpreted needs --fail-if-slower PCT")


def _run_against_run(args: argparse.Namespace, first: Analysis, first_run: Loaded, max_events: int,
                     bench: Benchmark, con: Console) -> tuple[dict[str, Any], GateResult | None]:
    """RUN against RUN2 (each variant with itself), with the gate when asked: the document and
    the gate's result (None without --fail-if-slower); the tables when the format is table."""
    from kvprof import api
    from kvprof.core.text import markup
    from kvprof.report.console import run_comparison_table

    second_run = api.open_run(args.run2, max_events)
    second = api.analyze(second_run, bench=bench, layers=args.layers)
    runs = api.compare_runs(first, second, bench=bench, layers=args.layers)
    if not any(r.get("only_in") is None for r in runs.rows) and args.fail_if_slower is None:
        raise UsageError(f"{args.run} and {args.run2} have no (variant, source, phase, size) measured in both"
                         + (": " + "; ".join(runs.empty) if runs.empty else ""))
    doc = api.clean(runs.to_json())
    doc["runs"] = {"before": _identity(args.run, first_run), "after": _identity(args.run2, second_run)}
    gate = None
    if args.fail_if_slower is not None:
        gate = api.regression_gate(first, second, args.fail_if_slower, base_run=first_run, new_run=second_run,
                                   include_interpreted=args.include_interpreted)
        doc["gate"] = api.clean(gate.to_json())
        differ: list[str] = []
    else:
        differ = api.comparability(first, second, first_run, second_run)[0]
        doc["not_comparable"] = differ
    if args.format == "table":
        for line in _runs_lines(doc["runs"]):
            con.print(line, soft_wrap=True, markup=False, highlight=False)
        for why in differ:
            con.print(f"[yellow]warning:[/yellow] not comparable: {why}", soft_wrap=True)
        if doc["rows"]:
            con.print(run_comparison_table(doc))
        for why in runs.empty:
            con.print(f"[yellow]no row:[/yellow] {markup(why)}", soft_wrap=True)
    return doc, gate


def _variants_against_baseline(args: argparse.Namespace, first: Analysis, bench: Benchmark,
                               con: Console) -> dict[str, Any]:
    """Each variant of RUN against --baseline: the document, and with the table format the
    table, the headline projection and the warnings."""
    from kvprof import api
    from kvprof.core.text import markup
    from kvprof.report.console import comparison_table

    doc = api.compare_variants(first, args.baseline, bench, args.layers)
    if args.format == "table":
        if doc["rows"]:
            con.print(comparison_table(doc))
        h = doc.get("headline")
        if h:
            con.print(f"captured {markup(h['variant'])} ({markup(h['source'])}, decode bs={markup(h['size'])}): "
                      "saving "
                      f"{h['saving_per_step_ms']:.3f} ms per step -> ITL {bench.itl_before_ms:.2f} -> "
                      f"{h['predicted_itl_ms']:.2f} ms; measured {bench.itl_before_ms:.2f} -> "
                      f"{bench.itl_after_ms:.2f} ms")
        for w in doc["warnings"]:
            con.print(f"[yellow]warning:[/yellow] {markup(w)}", soft_wrap=True)
    return doc


def run(args: argparse.Namespace) -> int:
    from kvprof import api
    from kvprof.report.files import write_json
    from kvprof.report.terminal import csv_text, note, print_json, print_text, table_console

    _check_flags(args)
    me = api.DEFAULT_MAX_EVENTS if args.max_events is None else args.max_events
    bench = api.benchmark(args.layers, args.itl_before, args.itl_after)
    baseline = None if args.run2 else args.baseline
    first_run = api.open_run(args.run, me)
    first = api.analyze(first_run, baseline=baseline, bench=bench, layers=args.layers)
    con = table_console(args.format)
    gate = None
    if args.run2:
        doc, gate = _run_against_run(args, first, first_run, me, bench, con)
    else:
        doc = _variants_against_baseline(args, first, bench, con)
    if args.format == "json":
        print_json(doc)
    elif args.format == "csv":
        print_text(csv_text(doc["rows"]))
    if gate is not None:
        _report_gate(gate, args)
    if args.out is not None and not args.no_files:
        out = RunDir(args.out).compare
        write_json(out, doc)
        note(args.format, str(out))
    if gate is None:
        return 0
    if not gate.comparable or not gate.rows:
        return NOT_COMPARABLE_EXIT_CODE
    return GATE_FAILED_EXIT_CODE if gate.regressed else 0


def _identity(path: str, loaded: Any) -> dict[str, Any]:
    """A run as compare names it: the path given, its run id and when it was captured."""
    from kvprof.core.run import captured_text

    m = loaded.manifest
    return {"input": str(path), "run_id": m.run_id if m is not None else None,
            "captured_at": m.captured_at if m is not None else None, "captured": captured_text(m)}


def _runs_lines(runs: dict[str, Any]) -> list[str]:
    """before -> after with both capture times; a note when the order given is not the order captured."""
    b, a = runs["before"], runs["after"]
    lines = [f"before: {b['input']} ({b['captured']}) -> after: {a['input']} ({a['captured']})"]
    if b["captured_at"] and a["captured_at"] and b["captured_at"] > a["captured_at"]:
        lines.append(f"note: the before run ({b['input']}) was captured after the after run ({a['input']}); the "
                     "order given is kept")
    return lines


def _grouped(lines: list[str]) -> list[str]:
    """"v phase size: why" lines with the same variant and reason as one line naming the points."""
    by: dict[tuple[str, str], list[str]] = {}
    for line in lines:
        point, _, why = line.partition(": ")
        variant, _, where = point.partition(" ")
        by.setdefault((variant, why), []).append(where)
    return [f"{v} ({', '.join(points)}): {why}" for (v, why), points in by.items()]


def _report_gate(gate: Any, args: argparse.Namespace) -> None:
    from kvprof.core.atomic import atomic_write_text
    from kvprof.core.text import markup
    from kvprof.report.gate import junit_xml, row_text
    from kvprof.report.terminal import make_console

    con = make_console(stderr=args.format != "table")
    for why in gate.not_comparable:
        con.print(f"[red]not comparable:[/red] {markup(why)}", soft_wrap=True)
    for line in gate.notes:
        con.print(f"[yellow]note:[/yellow] {markup(line)}", soft_wrap=True)
    for r in gate.regressed:
        con.print(f"[red]regressed:[/red] {markup(row_text(r, gate.threshold_pct))}", soft_wrap=True, highlight=False)
    for r in gate.rows:  # the table's raw ratio alone would read as a regression: say why it is not one
        if not r.regressed and r.slower_pct > gate.threshold_pct:
            con.print(f"not a regression: {markup(row_text(r, gate.threshold_pct))}", soft_wrap=True, highlight=False)
    rule = f"slower than BASE by more than {gate.threshold_pct:g} % beyond the noise"
    if not gate.comparable:
        verdict = (f"gate: not judged, the runs cannot be compared ({len(gate.not_comparable)} reason(s) above); "
                   f"exit {NOT_COMPARABLE_EXIT_CODE}")
    elif not gate.rows:
        verdict = f"gate: not judged, no row could be judged (see below); exit {NOT_COMPARABLE_EXIT_CODE}"
    elif gate.regressed:
        verdict = f"gate: {len(gate.regressed)} of {len(gate.rows)} rows {rule}"
    else:
        verdict = f"gate: passed, none of {len(gate.rows)} rows {rule}"
    con.print(verdict, soft_wrap=True)
    for why in gate.unjudged:
        con.print(f"[yellow]not judged:[/yellow] {markup(why)}", soft_wrap=True)
    for why in _grouped(gate.left_out):
        con.print(f"[yellow]left out:[/yellow] {markup(why)}", soft_wrap=True)
    if args.junit is not None:
        atomic_write_text(args.junit, junit_xml(gate, base=str(args.run), new=str(args.run2)))
        print(f"wrote {args.junit}", file=con.file)
