"""argparse types that refuse what would otherwise be quietly taken for a default.

Through an ``x or default``, ``--pool-size 0`` or ``--max-events 0`` would mean "default";
``--itl-before nan`` passes every ``<= 0`` test. These types refuse them at the argument,
with the option's name in the one-line error (exit 2).
"""

from __future__ import annotations

import argparse
import math


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def positive_float(text: str) -> float:
    """A finite number > 0 (nan and inf are refused: they pass every comparison test wrongly)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def finite_positive(value: float | None, name: str) -> None:
    """The same rule for values that arrive through the Python API (raises ValueError)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
