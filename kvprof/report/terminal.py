"""Where command output goes: one machine-readable document on stdout, or rich tables.

``--format json|csv|table`` (``--json`` for short) is the same on analyze, compare and
bench. With json or csv, stdout carries exactly one document and everything else
(tables, file paths, warnings) goes to stderr, so ``kvprof analyze RUN --json | jq`` and
``json.loads`` work. Tables follow the terminal's width; when piped they follow
``COLUMNS`` and otherwise use ``PIPE_WIDTH``. A reader closing the pipe early
(``| head -1``) raises BrokenPipeError, which ``kvprof.cli`` ends quietly with exit 0.
"""

from __future__ import annotations

import csv
import io
import os
import sys
from collections.abc import Iterable, Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # rich is imported when a table is printed, not by the parser or a --json run
    from rich.console import Console

PIPE_WIDTH = 120  # wide enough for most tables, narrow enough for a CI log viewer


@cache
def _pipe_console() -> type[Console]:
    from rich.console import Console

    class PipeConsole(Console):
        """rich's Console, except that a closed pipe raises BrokenPipeError for kvprof.cli to
        end quietly (rich's own handler exits with status 1)."""

        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return PipeConsole


def make_console(stderr: bool = False) -> Console:
    """A console at the terminal's width; piped, ``COLUMNS`` when set, else PIPE_WIDTH."""
    pipe_console = _pipe_console()
    con = pipe_console(stderr=stderr)
    if con.is_terminal or (os.environ.get("COLUMNS") or "").isdigit():
        return con
    return pipe_console(stderr=stderr, width=PIPE_WIDTH)


def table_console(fmt: str) -> Console:
    """Where tables go: stdout for --format table, stderr when stdout holds a document."""
    return make_console(stderr=fmt != "table")


def note(fmt: str, text: str) -> None:
    """A line for people (a file written, a warning): stdout with tables, stderr otherwise."""
    print(text, file=sys.stdout if fmt == "table" else sys.stderr)


def print_json(doc: Any) -> None:
    """One JSON document on stdout (numpy values and non-string keys allowed)."""
    import orjson

    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    sys.stdout.buffer.write(data + b"\n")
    sys.stdout.flush()


def csv_text(rows: Iterable[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows as CSV with a header; missing values empty; columns in first-seen order; a text
    cell a spreadsheet would run as a formula gets a leading ``'`` (kvprof.core.text.csv_cell)."""
    from kvprof.core.text import csv_cell

    rows = list(rows)
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([csv_cell(str(k)) for k in cols])
    for r in rows:
        w.writerow([("" if r.get(k) is None else csv_cell(r.get(k))) for k in cols])
    return buf.getvalue()


def print_text(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


__all__ = ["PIPE_WIDTH", "csv_text", "make_console", "note",
           "print_json", "print_text", "table_console"]
