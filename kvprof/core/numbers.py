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


__all__ = ["finite_or_none"]
