"""Remove the environment, tokens, host names and home paths from exports, traces, logs and outputs.

Each PATH (a file or a run folder) is rewritten in place, atomically; one line per file
says what changed. An export's environment is cut down to kvprof's allow-list (what a
profiled child is given); secrets are removed in plain, base64, hex and percent-encoded
forms and when cut across adjacent JSON strings; every string is judged as a reader would see
it (escapes decoded, invisible characters dropped, look-alike letters folded). Then every PATH
is verified as ``--check`` does; file and folder names too, and no line printed shows a secret.
With ``--check`` nothing is written: every string is decoded (JSON escapes, gzip, SQLite
text, Parquet, log lines) and any environment entry outside the allow-list, secret, home
path, host name or token-shaped string still there is reported; a file read only in part
(.nsys-rep, unknown format) is never called clean, a symbolic link is followed (a link to a
folder or a broken one is reported as not read), and the last line names the forms looked
for. ``--max-bytes`` bounds what one file may hold once decompressed (default 2 GiB).
Exit status: 0 when every file is clean; for the first file that failed, its error's code
(2 usage or over --max-bytes, 3 unreadable, 6 unwritable), the others are still handled; 1
when anything remains after scrubbing (or, with --check, is there or was not read), or a
file that cannot be rewritten (.nsys-rep, unknown format) or a name that cannot be changed (a
file's, a folder's, an SQLite table's or column's) holds a secret; 2 when only
.nsys-rep files were given (they cannot be rewritten: share the scrubbed .sqlite export).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from kvprof.commands import command_flags
from kvprof.core.errors import KvprofError, UsageError, rendered
from kvprof.tools.scrub import CheckReport, ScrubReport, check_path, file_kind, scrub_path, scrub_tree
from kvprof.tools.scrub.check import COVERED
from kvprof.tools.scrub.rules import DEFAULT_MAX_BYTES, Rules, format_bytes

LEAK_EXIT_CODE = KvprofError.exit_code


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths", nargs="+", type=Path, metavar="PATH",
        help="a .sqlite export, a .json/.json.gz trace, a .log, a .parquet, or a run folder",
    )
    parser.add_argument("--check", action="store_true",
                        help="verify only: write nothing, exit 1 if anything would still be removed")
    parser.add_argument("--max-bytes", type=byte_size, default=DEFAULT_MAX_BYTES, metavar="SIZE",
                        help="the most one file may hold once decompressed, e.g. 512M, 4G "
                             f"(default {format_bytes(DEFAULT_MAX_BYTES)}); a larger one is an error")


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?", re.IGNORECASE)


def byte_size(text: str) -> int:
    """``--max-bytes``: a positive number of bytes, with an optional K/M/G/T (binary) unit."""
    m = _SIZE.fullmatch(text.strip())
    value = int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")) if m else 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a size such as 512M or 2G, got {text!r}")
    return value


def verify(paths: list[Path], failed: object, max_bytes: int = DEFAULT_MAX_BYTES) -> list[CheckReport]:
    """check_path over every PATH; a line per file that is not clean (stderr)."""
    reports: list[CheckReport] = []
    for path in paths:
        try:
            reports += check_path(path, on_error=failed, max_bytes=max_bytes)  # type: ignore[arg-type]
        except KvprofError as exc:
            failed(exc)  # type: ignore[operator]
    return reports


def tally(reports: list[CheckReport]) -> str:
    """The last line of ``--check``: how many files were clean, read in part, not clean, and
    which forms were looked for (so a partial read is never taken for a clean one)."""
    partial = sum(1 for r in reports if r.clean and r.partial)
    dirty = sum(1 for r in reports if not r.clean)
    return (f"kvprof scrub --check: {len(reports)} files: {len(reports) - partial - dirty} clean, {partial} read in "
            f"part (raw bytes only: nothing found there), {dirty} not clean; secrets looked for as: {COVERED}")


_RULES: list[Rules] = []


def _shown(line: str) -> str:
    """A line as printed: a word that holds a secret in any form (a file named by a token) is
    redacted, control characters escaped (``Rules.redact``)."""
    if not _RULES:
        _RULES.append(Rules())
    return _RULES[0].redact(line)


@dataclass
class _Outcome:
    """What the paths have come to so far: the first failed file's exit code, and whether
    only .nsys-rep files (which cannot be rewritten) were given."""

    exit_code: int = 0
    only_reports: bool = True

    def failed(self, exc: KvprofError) -> None:
        print(f"kvprof scrub: {_shown(rendered(exc, command_flags(add_arguments)))}", file=sys.stderr)
        self.exit_code = self.exit_code or exc.exit_code
        self.only_reports = False


def _check_only(paths: list[Path], outcome: _Outcome, max_bytes: int) -> int:
    """``--check``: a line per file and the tally; nothing is written."""
    checked = verify(paths, outcome.failed, max_bytes)
    for r in checked:
        print(_shown(r.line()), file=sys.stdout if r.clean else sys.stderr)
    print(tally(checked))
    if outcome.exit_code:
        return outcome.exit_code
    return LEAK_EXIT_CODE if any(not r.clean for r in checked) else 0


def _scrub_one(path: Path, outcome: _Outcome, max_bytes: int) -> list[ScrubReport]:
    """Scrub a file or a folder in place, a line per file; a failure is told and counted."""
    try:
        if path.is_dir():
            found = scrub_tree(path, on_error=outcome.failed, max_bytes=max_bytes)
        elif path.is_file() and file_kind(path) is None:
            raise UsageError(f"{path}: unknown file type (scrub reads .sqlite, .json, .json.gz, .log, .txt, "
                             ".csv, .parquet)")
        else:
            found = [scrub_path(path, max_bytes=max_bytes)]
    except KvprofError as exc:
        outcome.failed(exc)
        return []
    if path.is_dir() or any(r.kind != "nsys-rep" for r in found):
        outcome.only_reports = False
    for report in found:
        print(_shown(report.line()), file=sys.stderr if report.leaks else sys.stdout)
    return found


def run(args: argparse.Namespace) -> int:
    outcome = _Outcome()
    max_bytes = getattr(args, "max_bytes", DEFAULT_MAX_BYTES)
    if getattr(args, "check", False):
        return _check_only(args.paths, outcome, max_bytes)
    reports: list[ScrubReport] = []
    for path in args.paths:
        reports.extend(_scrub_one(path, outcome, max_bytes))
    if outcome.exit_code:
        return outcome.exit_code
    if any(r.leaks for r in reports):
        return LEAK_EXIT_CODE
    if outcome.only_reports:
        return UsageError.exit_code
    left = [r for r in verify([p for p in args.paths if p.exists()], outcome.failed, max_bytes) if not r.clean]
    for r in left:
        print(f"kvprof scrub: after scrubbing, {_shown(r.line())}", file=sys.stderr)
    if outcome.exit_code:
        return outcome.exit_code
    return LEAK_EXIT_CODE if left else 0
