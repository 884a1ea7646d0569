"""Remove the environment and home paths from nsys SQLite exports, Chrome traces and logs.

Each PATH (a file or a run folder) is rewritten in place, atomically; one line per file
says what changed. Exit status: 0 when every file is clean; for the first file that
failed, its error's code (2 usage, 3 unreadable trace, 6 unwritable), the others are
still scrubbed (in a folder too); 1 when a file that cannot be rewritten (.nsys-rep,
unknown format) holds a secret value; 2 when only .nsys-rep files were given (they
cannot be rewritten: share the scrubbed .sqlite export).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvprof.errors import KvprofError, UsageError
from kvprof.scrub import ScrubReport, file_kind, scrub_path, scrub_tree

LEAK_EXIT_CODE = KvprofError.exit_code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", type=Path, metavar="PATH",
        help="a .sqlite export, a .json/.json.gz trace, a .log, or a run folder",
    )


def run(args: argparse.Namespace) -> int:
    exit_code = 0
    reports: list[ScrubReport] = []
    only_reports = True

    def failed(exc: KvprofError) -> None:
        nonlocal exit_code, only_reports
        print(f"kvprof scrub: {exc}", file=sys.stderr)
        exit_code = exit_code or exc.exit_code
        only_reports = False

    for path in args.paths:
        try:
            if path.is_dir():
                found = scrub_tree(path, on_error=failed)
            elif path.is_file() and file_kind(path) is None:
                raise UsageError(f"{path}: unknown file type (scrub reads .sqlite, .json, .json.gz, .log, .txt)")
            else:
                found = [scrub_path(path)]
        except KvprofError as exc:
            failed(exc)
            continue
        if path.is_dir() or any(r.kind != "nsys-rep" for r in found):
            only_reports = False
        for report in found:
            print(report.line(), file=sys.stderr if report.leaks else sys.stdout)
        reports.extend(found)
    if exit_code:
        return exit_code
    if any(r.leaks for r in reports):
        return LEAK_EXIT_CODE
    if only_reports:
        return UsageError.exit_code
    return 0
