"""Text from a trace or a summary, made safe for the terminal and for spreadsheets.

A trace names its own variants, devices and kernels, and a summary.json can be edited: an
ESC in a name can retitle the terminal, clear the screen or move the cursor, a CR or a bidi
override can make a line read as something else, and ``[red]`` or ``[link=...]`` is markup to
rich. ``printable`` shows every such character as its escape (``\\x1b``, ``\\u202e``), so
the text is visible and inert; ``markup`` also escapes rich markup, for strings that are
printed through it. ``formula_safe`` guards a CSV cell that a spreadsheet would run as a
formula (OWASP's CSV injection advice: a leading ``'``).
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


def markup(value: Any) -> str:
    """``printable``, with rich markup escaped: for text inside a string rich parses."""
    from rich.markup import escape

    return escape(printable(value))


FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def formula_safe(value: Any) -> Any:
    """A text cell that a spreadsheet would run as a formula, prefixed with ``'``; anything
    else (numbers included) as it is."""
    if isinstance(value, str) and value.startswith(FORMULA_PREFIXES):
        return "'" + value
    return value


__all__ = ["FORMULA_PREFIXES", "formula_safe", "markup", "printable"]
