"""The first summary ``capture`` writes and prints: the same analysis ``analyze`` runs.

Capture does not count anything itself; it runs kvprof's one analysis pipeline over the
run directory it just wrote (before the directory is renamed into place), so the
summary files are there for the dashboard from the start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvprof.errors import KvprofError


def analyze_run_dir(run_dir: Path, layers: int | None) -> tuple[dict[str, Any] | None, str | None]:
    """(summary, None) or (None, why the analysis failed) — a capture is kept either way."""
    from kvprof.analysis.compare import Benchmark
    from kvprof.analysis.summary import analyze
    from kvprof.report.files import write_analysis
    from kvprof.trace.load import load_run

    try:
        loaded = load_run(run_dir)
        bench = Benchmark(layers=layers) if layers else Benchmark()
        result = analyze(loaded, bench=bench, layers=layers)
        write_analysis(loaded, result, run_dir)
        return result.summary, None
    except KvprofError as exc:
        return None, str(exc)


def print_capture_summary(summary: dict[str, Any] | None, error: str | None) -> None:
    from kvprof.report.console import make_console, render

    console = make_console()
    if summary is None:
        console.print(f"[yellow]analysis of the capture failed: {error}[/] (run `kvprof analyze` on the run directory)")
        return
    render(summary, console)
