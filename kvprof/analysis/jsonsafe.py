"""JSON-safe values for the documents the analysis returns (summary.json, compare.json, ranks)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

MAX_DEPTH = 64  # summary.json nests a few levels; deeper is copied input (a sidecar), cut here


def clean(obj: Any, depth: int = 0) -> Any:
    """JSON-safe: NaN/inf -> None, numpy scalars -> Python; anything nested deeper than
    MAX_DEPTH -> None (Python would run out of stack on it, orjson refuses to write it)."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(obj, dict):
        return {str(k): clean(v, depth + 1) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v, depth + 1) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is pd.NA or obj is pd.NaT:
        return None
    return obj


__all__ = ["clean"]
