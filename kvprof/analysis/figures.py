"""One rule for a figure that cannot be taken at face value, used by every renderer.

A figure is one of:

- ``measured``: a number to read and to draw as it is;
- ``interpreted``: timed while the kernel ran in Triton's interpreter on the host (a CPU
  run): the interpreter's time, not a kernel's. Shown with ``*``, drawn marked (hatched),
  and nothing is derived from it as if it were a kernel's (no GB/s, % of copy rate or
  ratio to a compiled peer: those read ``n/a (interpreted)``);
- ``negative``: a cost, duration or rate below zero, which only noise makes (a difference
  of two medians in a decoder layer): shown ``n/a (negative: noise)``, never drawn as a bar;
- ``noise``: a difference smaller than its own spread (or with no spread where one is
  needed to judge it, e.g. a CPU's layer step): shown with ``(noise)``, never as a saving;
- ``n/a``: no such figure here, with why.

:func:`classify` decides; :meth:`Figure.text` is its one label, the same in the console,
JSON/CSV (``figure_kind`` columns), the HTML report, the dashboard and Perfetto.
Torch-free and free of rendering libraries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MEASURED = "measured"
INTERPRETED = "interpreted"
NEGATIVE = "negative"
NOISE = "noise"
NOT_APPLICABLE = "n/a"
KINDS = (MEASURED, INTERPRETED, NEGATIVE, NOISE, NOT_APPLICABLE)

MARK = "*"  # beside an interpreted figure or variant name
INTERPRETED_NOTE = ("* ran in Triton's interpreter on the host (a CPU run): the interpreter's time, not a "
                    "kernel's; no GB/s or ratio is derived from it")
NEGATIVE_WHY = "negative: noise"
UNIT_US = "µs"


@dataclass(frozen=True)
class Figure:
    """A value and what it can be taken for (one of :data:`KINDS`), with why when it is not
    a plain measurement."""

    value: float | None
    kind: str = MEASURED
    why: str = ""

    @property
    def trusted(self) -> bool:
        """A number to read and compare as it is."""
        return self.kind == MEASURED

    @property
    def drawable(self) -> bool:
        """Whether a chart may draw it as a bar or point: measured, or interpreted (drawn
        marked); never a negative cost, a noise difference or a missing figure."""
        return self.kind in (MEASURED, INTERPRETED) and self.value is not None

    def text(self, digits: int = 2, unit: str = "", sign: bool = False) -> str:
        """The figure's one label: ``1,234.56 µs``, ``16,120.00 µs *``, ``n/a (negative: noise)``,
        ``+20.12 ms (noise)``, ``n/a (why)``. ``sign``: a difference, written with its sign."""
        if self.kind == NOT_APPLICABLE or self.value is None:
            return f"n/a ({self.why or 'not measured'})"
        if self.kind == NEGATIVE:
            return f"n/a ({self.why or NEGATIVE_WHY})"
        number = fmt_number(self.value, digits, sign) + (f" {unit}" if unit else "")
        if self.kind == INTERPRETED:
            return f"{number} {MARK}"
        if self.kind == NOISE:
            return f"{number} (noise{': ' + self.why if self.why else ''})"
        return number


def fmt_number(value: float, digits: int = 2, sign: bool = False) -> str:
    """Thousands separated, ``digits`` after the point: ``-3,810.58``; ``sign`` adds ``+``."""
    return f"{value:{'+' if sign else ''},.{digits}f}"


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def classify(value: Any, *, interpreted: bool = False, cost: bool = False, spread: Any = None,
             needs_spread: bool = False, why_missing: str = "not measured", why_noise: str = "") -> Figure:
    """What ``value`` can be taken for.

    ``interpreted``: timed in Triton's interpreter. ``cost``: a cost, duration or rate (never
    negative when measured). ``spread``: the figure's own noise (an IQR, an interval's
    half-width): a difference no larger than it is noise. ``needs_spread``: a difference that
    cannot be judged without a spread (noise when there is none). A missing or non-finite
    value is n/a with ``why_missing``."""
    v = _number(value)
    if v is None:
        return Figure(None, NOT_APPLICABLE, why_missing)
    if cost and v < 0:
        return Figure(v, NEGATIVE, NEGATIVE_WHY)
    if interpreted:
        return Figure(v, INTERPRETED, "Triton's interpreter")
    s = _number(spread)
    if not cost and ((s is not None and abs(v) <= abs(s)) or (needs_spread and s is None)):
        return Figure(v, NOISE, why_noise or ("within its spread" if s is not None else "no spread to judge it"))
    return Figure(v, MEASURED)


def derived(base: Figure, value: Any, why_missing: str = "not measured") -> Figure:
    """A figure computed from ``base`` (GB/s from a time, a ratio to a peer): n/a where
    ``base`` is interpreted, negative or n/a, so nothing is derived from an untrusted time."""
    if base.kind == INTERPRETED:
        return Figure(None, NOT_APPLICABLE, "interpreted")
    if base.kind in (NEGATIVE, NOT_APPLICABLE):
        return Figure(None, NOT_APPLICABLE, base.why or why_missing)
    return classify(value, why_missing=why_missing)


__all__ = ["INTERPRETED", "INTERPRETED_NOTE", "KINDS", "MARK", "MEASURED", "NEGATIVE", "NEGATIVE_WHY", "NOISE",
           "NOT_APPLICABLE", "UNIT_US", "Figure", "classify", "derived", "fmt_number"]
