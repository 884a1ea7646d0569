"""One reading of "a number that can be shown": tables and summaries hold NaN, None and
strings where a figure does not exist, and every consumer must treat them alike."""

from __future__ import annotations

import math
from typing import Any


def finite_or_none(v: Any) -> float | None:
    """``v`` as a float when it is a finite number, else None (NaN, inf, None, text)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def finite_positive(value: float | None, name: str) -> None:
    """A value from the Python API that must be a positive finite number, or None (raises ValueError).

    The command line refuses the same values at the argument (``kvprof.commands.argtypes``)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


__all__ = ["finite_or_none", "finite_positive"]
