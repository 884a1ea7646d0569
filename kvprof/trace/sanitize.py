"""What a reader changed or skipped in a trace, said once per trace as warnings.

(A trace's ``kvprof`` metadata and a run's manifest are type-checked by their classes in
kvprof.core.run.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

SPAN_WARN_NS = 86_400 * 10**9  # a profile longer than a day: a timestamp is probably corrupt


def reader_warnings(stats: dict[str, Any], negative: int, start_ns: np.ndarray, dur_ns: np.ndarray) -> list[str]:
    """What a reader changed or skipped, said once per trace."""
    out = []
    untimed = int(stats.get("not_a_number", 0))
    if untimed:
        out.append(f"{untimed:,} events skipped: timestamp or duration missing or not a number "
                   "(text, true/false, null; corrupt values)")
    bad = int(stats.get("out_of_range", 0))
    if bad:
        out.append(f"{bad:,} events skipped: timestamp or duration not finite or beyond ±3e15 µs (corrupt values)")
    if negative:
        out.append(f"{negative:,} events have a negative duration (end before start); counted as 0 ns")
    if len(start_ns):
        span = int(np.max(start_ns + np.maximum(dur_ns, 0))) - int(np.min(start_ns))
        if span > SPAN_WARN_NS:
            out.append(f"the events span {span / 86_400e9:,.1f} days: a timestamp is probably corrupt, "
                       "and windows and gaps are measured across it")
    return out
