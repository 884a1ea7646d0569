"""The few plain sentences a capture ends with: what fused, what a write costs here, what next.

The tables before it hold every figure; this says what they mean for someone who has not
read the docs yet, from the summary alone (no figure of its own).
"""

from __future__ import annotations

import math
from typing import Any

from kvprof.core.summary import Summary

LEGEND = ("cost/write: GPU time a write adds (on CPU: the wall time of one write); host µs: the "
          "launching thread's time in the write; launch→GPU: from launch to the first kernel; "
          "source: where a row was measured (reference = unprofiled); every column: docs/formats.md")


def _us(ns: Any) -> str | None:
    try:
        v = float(ns)
    except (TypeError, ValueError):
        return None
    return f"{v / 1000:.1f} µs" if math.isfinite(v) else None


def verdict_lines(summary: Summary) -> list[str]:
    """Plain-language lines: fused or not per variant, cost per write per size, next steps."""
    lines: list[str] = []
    ran = {n: v for n, v in summary.variants.items() if v.available}
    fused = [n for n, v in ran.items() if v.fused]
    not_fused = [n for n, v in ran.items() if v.fused is False]
    unknown = [n for n, v in ran.items() if v.fused is None]
    if fused:
        lines.append(f"fused (one launch writes K and V): {', '.join(fused)}")
    if not_fused:
        why = {n: ", ".join(f"{p}" for p in ran[n].paths) or "two copies" for n in not_fused}
        lines.append("not fused: " + "; ".join(f"{n} ({why[n]})" for n in not_fused))
    if unknown:
        lines.append(f"not decided (no paths or kernels to judge by): {', '.join(unknown)}")
    skipped = [(n, v.reason) for n, v in summary.variants.items() if not v.available]
    if skipped:
        lines.append("not run here: " + "; ".join(f"{n} ({r or 'unavailable'})" for n, r in skipped))
    source = summary.trusted_sources[0] if summary.trusted_sources else None
    rows = [g for g in summary.groups if g.get("source") == source and g.get("phase") == "decode"]
    if rows:
        per: dict[str, list[str]] = {}
        for g in sorted(rows, key=lambda g: (str(g.get("variant")), float(g.get("size") or 0))):
            cost = _us(g.get("cost_per_write_ns"))
            if cost:
                per.setdefault(str(g["variant"]), []).append(f"{cost} at batch {g.get('size')}")
        if per:
            lines.append(f"one layer's write here, decode, median ({source}): "
                         + "; ".join(f"{n} {', '.join(v)}" for n, v in per.items()))
    if (summary.device or {}).get("type") == "cpu":
        lines.append("on a CPU there are no kernel launches, so the launch cost that fused writes remove "
                     "does not show; run the same command on a machine with a CUDA GPU to see it")
        lines.append("the H200 samples (fused vs two-stream writes, both profilers): "
                     "pip install 'kvcache-profiler[dashboard]' && python -m kvprof dashboard")
    return lines


def render_verdict(summary: Summary, console: Any) -> None:
    lines = verdict_lines(summary)
    if not lines:
        return
    console.print("[bold]What this run says[/]")
    for line in lines:
        console.print(f"  {line}", highlight=False)
    console.print(f"[dim]{LEGEND}[/]", highlight=False)
