"""The first summary ``capture`` writes and prints: the same analysis ``analyze`` runs.

Capture does not count anything itself; it runs kvprof's one pipeline (kvprof.api) over
the run directory it just wrote, so the summary files are there for the dashboard from
the start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvprof.core.errors import KvprofError
from kvprof.core.run import Manifest
from kvprof.core.summary import Summary

if TYPE_CHECKING:
    from kvprof.capture.run import CaptureResult


def scrub_manifest(manifest: Manifest) -> Manifest:
    """The manifest as it may be shared: the scrub rules on every string (it names $HOME paths)."""
    from kvprof.tools.scrub import Rules, scrub_document

    return Manifest.from_json(scrub_document(manifest.to_json(), Rules()))


def verify_run_dir(run_dir: Path) -> list[KvprofError]:
    """``scrub --check`` of a finished run folder: one error per file where anything remains."""
    from kvprof.tools.scrub import check_path

    problems: list[KvprofError] = []
    for report in check_path(run_dir, on_error=problems.append):
        if not report.clean:
            problems.append(KvprofError(f"scrub check: {report.line()}"))
    return problems


def analyze_run_dir(run_dir: Path, layers: int | None, scrub: bool = False) -> tuple[Summary | None, str | None]:
    """(summary, None) or (None, why the analysis failed) — a capture is kept either way.
    ``scrub``: the outputs get the scrub rules before they are written."""
    from kvprof import api

    try:
        loaded = api.open_run(run_dir)
        result = api.analyze(loaded, bench=api.benchmark(layers), layers=layers)
        api.write_outputs(loaded, result, run_dir, scrub=scrub)
        return result.summary, None
    except KvprofError as exc:
        return None, str(exc)


def print_capture_summary(result: CaptureResult) -> None:
    """What ran, the compact table, the verdict, and where the full tables are."""
    from kvprof.report.console import make_console
    from kvprof.report.verdict import render_first_run

    console = make_console()
    if result.summary is None:
        console.print(f"[yellow]analysis of the capture failed: {result.analysis_error}[/] "
                      f"(run `kvprof analyze {result.run_dir}`)")
        return
    render_first_run(result.summary, console, result.manifest, str(result.run_dir))
