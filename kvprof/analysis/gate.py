"""The regression gate: is any (variant, phase, size) of NEW slower than in BASE?

``kvprof compare BASE NEW --fail-if-slower PCT`` asks this for CI. Each variant is paired
with itself. Per (variant, phase, size) one source is judged: the first, in BASE's
``trusted_sources`` order (the unprofiled reference first where the run has one, then the
least perturbed profiler), that both runs measured. The figure is ``cost_per_write_ns``
(what a write costs the step, the figure analyze reports).

A row regresses when NEW is slower than BASE by more than PCT percent AND by more than
its spread: the sum of both runs' interquartile ranges of the step, per write
(``step_iqr_ns`` x steps / writes). A difference inside the runs' own step-to-step
scatter is not a regression. Where a run has fewer than 4 steps its IQR does not exist
(``spread_known`` false) and the row is judged on PCT alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from kvprof.core.numbers import finite_or_none

FALLBACK_ORDER = ("reference", "nsys", "kineto")


@dataclass
class GateRow:
    """One (variant, phase, size) judged on one source; times in ns per write."""

    variant: str
    phase: str
    size: int
    source: str
    base_ns: float
    new_ns: float
    slower_pct: float
    base_iqr_ns: float | None
    new_iqr_ns: float | None
    spread_ns: float | None
    regressed: bool

    @property
    def spread_known(self) -> bool:
        return self.spread_ns is not None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "spread_known": self.spread_known}


@dataclass
class GateResult:
    """Every judged row, and why a variant or point could not be judged."""

    threshold_pct: float
    rows: list[GateRow] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)

    @property
    def regressed(self) -> list[GateRow]:
        return [r for r in self.rows if r.regressed]

    @property
    def passed(self) -> bool:
        return not self.regressed

    def to_json(self) -> dict[str, Any]:
        return {"threshold_pct": self.threshold_pct, "passed": self.passed,
                "rule": "slower by more than threshold_pct AND by more than spread_ns "
                        "(base_iqr_ns + new_iqr_ns: each run's step IQR per write; PCT alone where unknown)",
                "rows": [r.to_json() for r in self.rows], "unjudged": self.unjudged}




def _iqr_per_write(row: Any) -> float | None:
    """The step IQR divided by the writes per step (the spread of a per-write figure)."""
    iqr, writes, steps = finite_or_none(row.get("step_iqr_ns")), finite_or_none(row.get("writes")), finite_or_none(row.get("steps"))
    if iqr is None or not writes or not steps:
        return None
    return iqr * steps / writes


def _index(groups: pd.DataFrame) -> dict[tuple[str, str, int, str], dict[str, Any]]:
    if groups is None or groups.empty:
        return {}
    g = groups[groups["layer"].astype(str) == "all"] if "layer" in groups.columns else groups
    out = {}
    for r in g.to_dict("records"):
        if finite_or_none(r.get("cost_per_write_ns")) is not None:
            out[(str(r["variant"]), str(r["phase"]), int(r["size"]), str(r["source"]))] = r
    return out


def regression_gate(base: pd.DataFrame, new: pd.DataFrame, threshold_pct: float,
                    source_order: list[str] | None = None) -> GateResult:
    """``base``/``new``: the runs' group tables (kvprof.analysis.metrics.GROUP_COLUMNS);
    ``source_order``: BASE's trusted_sources."""
    if not (math.isfinite(threshold_pct) and threshold_pct >= 0):
        raise ValueError(f"threshold must be a finite percentage >= 0, got {threshold_pct}")
    b, n = _index(base), _index(new)
    order = list(dict.fromkeys([*(source_order or []), *FALLBACK_ORDER]))
    rank = {s: i for i, s in enumerate(order)}
    out = GateResult(threshold_pct=threshold_pct)
    points = sorted({k[:3] for k in b} | {k[:3] for k in n})
    for variant, phase, size in points:
        common = sorted({k[3] for k in b if k[:3] == (variant, phase, size)}
                        & {k[3] for k in n if k[:3] == (variant, phase, size)},
                        key=lambda s: (rank.get(s, len(order)), s))
        if not common:
            in_b = any(k[:3] == (variant, phase, size) for k in b)
            in_n = any(k[:3] == (variant, phase, size) for k in n)
            why = "no source measured in both runs" if in_b and in_n else f"not measured in {'NEW' if in_b else 'BASE'}"
            out.unjudged.append(f"{variant} {phase} {size}: {why}")
            continue
        source = common[0]
        rb, rn = b[(variant, phase, size, source)], n[(variant, phase, size, source)]
        base_ns, new_ns = float(rb["cost_per_write_ns"]), float(rn["cost_per_write_ns"])
        if base_ns <= 0:
            out.unjudged.append(f"{variant} {phase} {size}: BASE cost per write is {base_ns} ns ({source})")
            continue
        ib, i_n = _iqr_per_write(rb), _iqr_per_write(rn)
        spread = ib + i_n if ib is not None and i_n is not None else None
        slower_pct = (new_ns - base_ns) / base_ns * 100.0
        regressed = slower_pct > threshold_pct and (spread is None or new_ns - base_ns > spread)
        out.rows.append(GateRow(variant, phase, size, source, base_ns, new_ns, slower_pct, ib, i_n, spread,
                                regressed))
    return out


__all__ = ["GateResult", "GateRow", "regression_gate"]
