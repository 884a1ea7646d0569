"""The first summary ``capture`` writes and prints: the same analysis ``analyze`` runs.

Capture does not count anything itself; it runs kvprof's one analysis pipeline over the
run directory it just wrote (before the directory is renamed into place), so the
summary files are there for the dashboard from the start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvprof.errors import KvprofError


def scrub_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as it may be shared: the scrub rules on every string (it names $HOME paths)."""
    from kvprof.scrub import Rules, scrub_document

    return scrub_document(manifest, Rules())


def verify_run_dir(run_dir: Path) -> list[KvprofError]:
    """``scrub --check`` of a finished run folder: one error per file where anything remains."""
    from kvprof.scrub import check_path

    problems: list[KvprofError] = []
    for report in check_path(run_dir, on_error=problems.append):
        if not report.clean:
            problems.append(KvprofError(f"scrub check: {report.line()}"))
    return problems


def analyze_run_dir(run_dir: Path, layers: int | None, scrub: bool = False) -> tuple[dict[str, Any] | None, str | None]:
    """(summary, None) or (None, why the analysis failed) — a capture is kept either way.
    ``scrub``: the outputs get the scrub rules before they are written."""
    from kvprof.analysis.compare import Benchmark
    from kvprof.analysis.summary import analyze
    from kvprof.report.files import write_analysis
    from kvprof.trace.load import load_run

    try:
        loaded = load_run(run_dir)
        bench = Benchmark(layers=layers) if layers else Benchmark()
        result = analyze(loaded, bench=bench, layers=layers)
        rules = None
        if scrub:
            from kvprof.scrub import Rules

            rules = Rules()
        write_analysis(loaded, result, run_dir, rules)
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
