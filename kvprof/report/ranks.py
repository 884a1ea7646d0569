"""The console view of a multi-rank run: one row per variant, size and rank, then the skew."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from kvprof.core.text import markup

MISSING = "n/a (not measured)"  # as every console table says it (kvprof.report.cells)


def _us(ns: Any, digits: int = 2) -> str:
    try:
        v = float(ns)
    except (TypeError, ValueError):
        return MISSING
    return MISSING if not math.isfinite(v) else f"{v / 1000:.{digits}f}"


def _num(v: Any, fmt: str) -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return MISSING
    return MISSING if not math.isfinite(f) else fmt.format(f)


def per_rank_table(doc: dict[str, Any]) -> Table:
    where = "GPU spans" if doc.get("step_source") == "gpu" else "host ranges"
    t = Table(title=markup(f"per rank, median ({doc.get('world_size')} ranks; {where})"), title_justify="left")
    for col in ("variant", "phase", "size", "rank", "writes", "write µs", "step µs", "collective µs", "wait µs",
                "collective %", "paths"):
        t.add_column(col, justify="left" if col in ("variant", "phase", "paths") else "right", no_wrap=True)
    for r in doc.get("per_rank") or []:
        t.add_row(markup(r.get("variant")), markup(r.get("phase")), markup(r.get("size")), markup(r.get("rank")),
                  markup(r.get("writes")), _us(r.get("write_ns")), _us(r.get("step_ns"), 1),
                  _us(r.get("collective_ns"), 1), _us(r.get("wait_ns"), 1),
                  _num(r["collective_share"] * 100 if r.get("collective_share") is not None else None, "{:.1f}"),
                  markup(r.get("paths") or "n/a (no paths reported)"))
    return t


def skew_table(doc: dict[str, Any]) -> Table:
    t = Table(title="skew per step: slowest rank / median rank", title_justify="left")
    for col in ("variant", "phase", "size", "ranks", "steps", "median", "max", "slowest rank"):
        t.add_column(col, justify="left" if col in ("variant", "phase") else "right", no_wrap=True)
    for r in doc.get("skew") or []:
        t.add_row(markup(r.get("variant")), markup(r.get("phase")), markup(r.get("size")), markup(r.get("ranks")),
                  markup(r.get("steps")), _num(r.get("skew_median"), "{:.3f}"), _num(r.get("skew_max"), "{:.3f}"),
                  markup(r.get("slowest_rank")))
    return t


def render_ranks(doc: dict[str, Any] | None, console: Console) -> None:
    """Nothing for a one-process run; else the per-rank rows, the skew and the same-path check."""
    if not doc:
        return
    console.print(per_rank_table(doc))
    console.print(skew_table(doc))
    same = doc.get("same_path") or {}
    for variant, ok in same.items():
        console.print(f"  {markup(variant)}: " + ("every rank took the same write path" if ok else
                                          "[red]the ranks took different write paths[/] (see paths above)"))


__all__ = ["per_rank_table", "render_ranks", "skew_table"]
