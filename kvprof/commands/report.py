"""Write a run's landing view as a self-contained HTML report (fused or not, cost, saving, share).

RUN is a folder that kvprof analyze wrote into (summary.json, and writes.parquet for the
spreads of profiled sources). The source defaults to the most trusted one the run has
(the reference pass, else the least perturbed profiler). Needs plotly (the dashboard
extra); imports neither torch nor streamlit.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from kvprof.commands import command_flags
from kvprof.commands.argtypes import output_file
from kvprof.core.errors import ToolError, TraceError, UsageError
from kvprof.core.rundir import RunDir
from kvprof.core.summary import Summary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", type=Path, help=f"an analysed run folder (has {RunDir.SUMMARY})")
    p.add_argument("--html", type=output_file, required=True, metavar="OUT.html", help="where to write the report")
    p.add_argument("--source", default=None, help="reference, nsys or kineto (default: the most trusted present)")
    p.add_argument("--baseline", default=None, help="variant the savings are against (default: analyze's)")


def page_flags() -> Callable[[str], str]:
    """A setting's field -> its flag, for the settings the dashboard's pages and the HTML report
    name (kvprof.dashboard.settings.NAMED): capture's (what to capture to fill a view), this
    command's, bench's. ``kvprof dashboard`` hands them to its server."""
    from kvprof.commands import bench, capture

    return command_flags(capture.add_arguments, add_arguments, bench.add_arguments)


def load_run(run: Path) -> tuple[Summary, object]:
    """summary.json (required) and writes.parquet (optional) of an analysed run; one-line errors."""
    if not run.is_dir():
        raise UsageError(f"{run} is not a folder")
    rd = RunDir(run)
    if not rd.summary.is_file():
        raise UsageError(f"{run} has no {RunDir.SUMMARY}: run `kvprof analyze {run}` first")
    summary = rd.read_summary()  # a summary.json that cannot be read: exit 3, as any unreadable input
    writes = None
    if rd.writes.is_file():
        import pyarrow.parquet as pq

        try:
            writes = pq.read_table(rd.writes).to_pandas()
        except (OSError, ValueError) as exc:
            raise TraceError(f"{rd.writes} is not readable Parquet ({exc})") from None
    return summary, writes


def run(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("plotly") is None:
        raise ToolError("plotly is not installed: pip install 'kvcache-profiler[dashboard]'")
    if args.html.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--html {args.html}: the report is HTML; name it *.html")
    from kvprof.dashboard import frames, html_report  # noqa: F401 (html_report registers the "html" renderer)
    from kvprof.dashboard.landing import build
    from kvprof.report.renderers import Output, render

    summary, writes = load_run(args.run)
    doc = summary.to_json()  # the landing view reads the summary's tables as rows
    groups = frames.groups_frame(doc)
    sources = set(groups["source"].dropna().astype(str))
    if args.source and args.source not in sources:
        raise UsageError(f"--source {args.source}: this run has {', '.join(sorted(sources)) or 'no sources'}")
    variants = set(groups["variant"].dropna().astype(str))
    if args.baseline and args.baseline not in variants:
        raise UsageError(f"--baseline {args.baseline}: this run has {', '.join(sorted(variants))}")
    land = build(args.run.resolve().name, doc, writes, args.source, None, args.baseline)
    land.notes[:0] = summary.invalid
    render("html", land, Output(path=args.html, names=page_flags()))
    print(f"kvprof report: {args.html} ({args.html.stat().st_size / 2**20:.1f} MB, source {land.source})")
    return 0
