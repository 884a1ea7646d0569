"""Analyze a capture: per-write GPU/host numbers, fused-or-fell-back verdicts, comparison.

PATH is a run directory (with manifest.json), a folder of traces, a torch.profiler
Chrome trace (.json or .json.gz), an nsys SQLite export or an .nsys-rep (exported with
nsys when it is found). Prints a table and writes summary.json, summary.csv,
events.parquet and writes.parquet into PATH (a folder) or next to it (a file), or
into --out. Every file is written atomically. A folder that holds the outputs of another
input's analysis (another trace of the same folder) is refused in one line: --out, or
--force to replace them. These are the run's own analysis files,
the ones capture writes into a run directory; --no-files writes none of them.
--perfetto OUT.pftrace also writes the run as a Perfetto trace (docs/formats.md), with
--no-files too.

--format json prints summary.json's document on stdout, --format csv the summary.csv
table; nothing else goes to stdout then (the files written are named on stderr).

Limits on what a trace may cost (docs/reliability.md): --max-events; a trace over 1 GiB
once decompressed (KVPROF_MAX_TRACE_MB raises it); --write-kernels matching over 5 s per
trace (KVPROF_REGEX_TIMEOUT_S). Text from a trace is printed with control characters
escaped.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from kvprof.commands import add_format_arguments, command_flags
from kvprof.commands.argtypes import output_file, output_folder, positive_float, positive_int
from kvprof.report.renderers import ANALYSIS, formats


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from kvprof.core.benchmark import Benchmark

    b = Benchmark()
    parser.add_argument("path", help="run directory, trace folder, Chrome trace, nsys .sqlite or .nsys-rep")
    parser.add_argument("--out", type=output_folder, default=None,
                        help="folder for the outputs (default: next to PATH)")
    parser.add_argument("--baseline", default=None,
                        help="variant to compare the others with (default: two_stream when present)")
    parser.add_argument("--layers", type=positive_int, default=None,
                        help=f"layers per decode step in the projection (default {b.layers}, the benchmark's model)")
    parser.add_argument("--itl-before", type=positive_float, default=b.itl_before_ms,
                        help=f"inter-token latency of the baseline, ms (default {b.itl_before_ms})")
    parser.add_argument("--itl-after", type=positive_float, default=b.itl_after_ms,
                        help=f"measured inter-token latency after the change, ms (default {b.itl_after_ms})")
    parser.add_argument("--max-events", type=positive_int, default=None,
                        help="refuse traces with more events than this, or more than 4 JSON values per "
                             "event to parse at once (default 4,000,000; memory bound)")
    parser.add_argument("--write-kernels", default=None, metavar="REGEX",
                        help="also count GPU kernels whose name matches REGEX as KV writes (one kernel a "
                             "write), beside the built-in patterns for SGLang, sgl-kernel, index_put and vLLM")
    parser.add_argument("--perfetto", type=output_file, default=None, metavar="OUT.pftrace",
                        help="also write the run as a Perfetto trace (ui.perfetto.dev): each trace's GPU work with "
                             "kvprof's writes, verdicts, steps and reference timings as tracks; written even with "
                             "--no-files (needs the perfetto package: the 'perfetto' extra)")
    parser.add_argument("--no-files", action="store_true", help="print only; write none of the four analysis files")
    parser.add_argument("--quiet", action="store_true", help="write the files, print only their paths")
    parser.add_argument("--force", action="store_true",
                        help="replace the outputs of another input's analysis in the output folder (without it, "
                             "analyze refuses in one line: two traces of one folder would share its outputs)")
    add_format_arguments(parser, formats(ANALYSIS))


def run(args: argparse.Namespace) -> int:
    # analyze does no linear algebra: numpy's OpenBLAS would start a thread per core as numpy
    # is imported (40-50 ms of a 1.2 s command); a value the user set is kept
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from kvprof import api

    api.check_write_kernel_regex(args.write_kernels)  # a bad REGEX is refused before any trace is read
    if args.perfetto is not None:
        api.check_perfetto_output(args.perfetto)  # so is an unwritable --perfetto or a missing package
    if not args.no_files:  # a previous analysis of another input is never replaced silently
        api.check_no_other_analysis(args.path, api.output_dir(args.path, args.out), args.force)
    max_events = api.DEFAULT_MAX_EVENTS if args.max_events is None else args.max_events
    # one trace file: its bytes are read and inflated in a thread while pandas and the renderers
    # are imported below (0.4 s), instead of after them
    api.prefetch_trace(Path(args.path), max_events)
    from kvprof.report.renderers import Output, render
    from kvprof.report.terminal import note, table_console

    loaded = api.open_run(Path(args.path), max_events)
    names = command_flags(add_arguments)
    result = api.analyze(loaded, baseline=args.baseline,
                         bench=api.benchmark(args.layers, args.itl_before, args.itl_after), layers=args.layers,
                         write_kernels=True, write_kernel_regex=args.write_kernels, names=names)
    if not (args.quiet and args.format == "table"):  # --quiet leaves out the tables, never a document
        # rich is imported only where a table is printed
        console = table_console(args.format) if args.format == "table" else None
        render(args.format, result, Output(console=console, names=names))
    if args.perfetto is not None:
        note(args.format, str(api.write_perfetto(loaded, result, args.perfetto)))
    if args.no_files:
        return 0
    for p in api.write_outputs(loaded, result, api.output_dir(args.path, args.out)):
        note(args.format, str(p))
    return 0
