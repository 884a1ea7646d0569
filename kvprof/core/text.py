"""Text from a trace or a summary, made safe for the terminal and for spreadsheets.

A trace names its own variants, devices and kernels, and a summary.json can be edited: an
ESC in a name can retitle the terminal, clear the screen or move the cursor, a CR or a bidi
override can make a line read as something else, and ``[red]`` or ``[link=...]`` is markup to
rich. ``printable`` shows every such character as its escape (``\\x1b``, ``\\u202e``), so
the text is visible and inert; ``markup`` also escapes rich markup, for strings that are
printed through it. ``csv_cell`` guards a CSV cell that a spreadsheet would run as a
formula (OWASP's CSV injection advice: a leading ``'``) or split in two (a bare CR).
"""

from __future__ import annotations

import re
from typing import Any

# C0 (newline and tab included: one figure, one line), DEL, C1, and the invisible
# direction and separator marks (ALM, LRM/RLM, LRE..RLO, LS/PS, LRI..PDI)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(value: Any) -> str:
    """``str(value)`` with every control, bidi and line-separator character shown as its escape."""
    text = value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_escape, text)


# rich's markup: a tag is "[" then a letter, "#", "/" or "@", up to the next "]" (rich.markup.RE_TAGS)
_OPENING = re.compile(r"(\\*)\[")
_TAG_LIKE = re.compile(r"\[[a-z#/@][^\[]*?\]")


def markup(value: Any) -> str:
    """``printable``, escaped for a string that rich parses as markup: it prints as the same
    characters, tags and backslashes included. Do not put a tag right after it (a trailing
    backslash would escape that tag; rich.markup.escape has the same limit).

    rich.markup.escape leaves a backslash before a "[" that starts no tag, which rich then
    drops ("\\[" prints as "["): here every "[" is escaped as rich reads it back.
    """
    text = printable(value)

    def escaped(m: re.Match[str]) -> str:
        n = len(m.group(1))
        if _TAG_LIKE.match(text, m.end() - 1):  # rich halves the backslashes, and one escapes the tag
            return "\\" * (2 * n + 1) + "["
        return "\\" * (n + 1) + "[" if n else "["  # in plain text rich turns "\\[" into "["

    return _OPENING.sub(escaped, text)


FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def formula_safe(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula, prefixed with ``'``; anything
    else (numbers included) as it is."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


def csv_cell(value: Any) -> Any:
    """A CSV cell that stays one cell and is no formula: a CR as its escape (Python's csv
    writer leaves it unquoted with "\\n" line ends, and readers end the row there, so the
    rest could start a row of its own), then ``formula_safe``."""
    if isinstance(value, str) and "\r" in value:
        value = value.replace("\r", "\\x0d")
    return formula_safe(value)


__all__ = ["FORMULA_PREFIXES", "csv_cell", "formula_safe", "markup", "printable"]
