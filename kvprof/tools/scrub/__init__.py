"""Remove the environment, tokens, host names and home paths from exports, traces, logs and outputs.

The rules are in ``rules`` (its docstring says what is removed and why); one module per
format (``sqlite``, ``text`` for JSON traces and logs, ``tables`` for Parquet and in-memory
documents), ``files`` picks the scrubber for a path, ``check`` verifies without writing.
"""

from __future__ import annotations

from kvprof.tools.scrub.check import CheckReport, check_file, check_path
from kvprof.tools.scrub.files import file_kind, scrub_path, scrub_tree
from kvprof.tools.scrub.rules import HOME, HOST_MARKER, MARKER, TOKEN_MARKER, Rules, ScrubReport, find_values
from kvprof.tools.scrub.sqlite import scrub_sqlite
from kvprof.tools.scrub.tables import scrub_document, scrub_frame, scrub_parquet, scrub_table
from kvprof.tools.scrub.text import scrub_json, scrub_text

__all__ = [
    "HOME", "HOST_MARKER", "MARKER", "TOKEN_MARKER", "CheckReport", "Rules", "ScrubReport", "check_file",
    "check_path", "file_kind", "find_values", "scrub_document", "scrub_frame", "scrub_json", "scrub_parquet",
    "scrub_path", "scrub_sqlite", "scrub_table", "scrub_text", "scrub_tree",
]
