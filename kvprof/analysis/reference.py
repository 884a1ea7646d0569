"""The reference figures and each profiler's observer effect, from ``step_timings.json``.

Pure functions over ``kvprof.core.timings.StepTimings`` and the groups table:

- ``reference_groups``: one row per (variant, phase, size) in the groups table's columns,
  source ``reference``: the unprofiled step's median and IQR, and the per-write cost.
  With writes back to back that is the step over its writes; inside a decoder layer it is
  what the write adds to the step, (layer step - the same step without the write) /
  layers, and ``write_share`` is that difference over the step.
- ``observer_effect``: for each profiler source and (variant, phase, size), its per-write
  and per-step reading over the reference's, how much the profiled run itself was slowed
  (its own step timings over the reference's) and a flag past a threshold (10 %).
- ``trusted_sources``: the order headline figures are drawn from: the reference where
  there is one, then the profiler sources from least to most perturbed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from kvprof.analysis.metrics import GROUP_COLUMNS
from kvprof.core.numbers import finite_or_none
from kvprof.core.sources import PROFILER_PRIOR, REFERENCE as REFERENCE_SOURCE, SOURCES, source_names
from kvprof.core.timings import StepSamples, StepTimings

REFERENCE = REFERENCE_SOURCE.name
OBSERVER_THRESHOLD = 0.10
SOURCE_LABELS = {s.name: s.label for s in SOURCES}
_PRIOR_ORDER = source_names(PROFILER_PRIOR)  # without a reference (docs/observer-effect.md)


def _key(r: StepSamples) -> tuple[str, str, int]:
    return r.variant, r.phase, r.size


def reference_groups(timings: StepTimings | None, layout: str | None = None) -> pd.DataFrame:
    """Reference rows in GROUP_COLUMNS (NaN where a profiler-only figure has no meaning);
    ``layout``: the run's cache layout (from its manifest)."""
    if timings is None:
        return pd.DataFrame(columns=list(GROUP_COLUMNS))
    recs = timings.select(pass_=REFERENCE)
    by: dict[tuple[str, str, int], dict[str, StepSamples]] = {}
    for r in recs:
        by.setdefault(_key(r), {})[r.mode] = r
    rows = []
    for (variant, phase, size), modes in sorted(by.items()):
        main = modes.get("layer") or modes.get("writes")
        if main is None or not main.samples_ns:
            continue
        layers = max(main.writes_per_step, 1)
        row: dict[str, Any] = {c: np.nan for c in GROUP_COLUMNS}
        med = main.median_ns
        row.update(
            variant=variant, source=REFERENCE, phase=phase, size=size, layer="all",
            context="layer" if main.mode == "layer" else "none", layout=layout, writes=len(main.samples_ns) * layers,
            steps=len(main.samples_ns), graph=main.graph, attribution=main.clock, step_ns=med, step_gpu_ns=med,
            step_iqr_ns=main.iqr_ns, tokens=float(size), cost_per_write_ns=med / layers,
        )
        bare = modes.get("layer_no_write")
        if main.mode == "layer" and bare is not None and bare.samples_ns:
            added = med - bare.median_ns
            row["cost_per_write_ns"] = added / layers
            row["write_share"] = added / med if med > 0 else np.nan
        alone = modes.get("writes")
        if main.mode == "layer" and alone is not None and alone.samples_ns:
            row["writes_only_step_ns"] = alone.median_ns
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=list(GROUP_COLUMNS))
    return pd.DataFrame(rows)[list(GROUP_COLUMNS)]


def _ratio(a: Any, b: Any) -> float | None:
    try:
        num, den = float(a), float(b)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(num) and math.isfinite(den)) or den <= 0:
        return None
    return num / den


def observer_effect(groups: pd.DataFrame, timings: StepTimings | None,
                    threshold: float = OBSERVER_THRESHOLD) -> dict[str, Any]:
    """Each profiler source against the reference, per (variant, phase, size)."""
    out: dict[str, Any] = {"threshold": threshold, "rows": [], "sources": {}}
    if groups.empty or timings is None:
        return out
    g = groups[groups["layer"].astype(str) == "all"]
    ref = {(r.variant, r.phase, int(r.size)): r for r in g[g["source"] == REFERENCE].itertuples()}
    if not ref:
        return out
    in_pass = {(r.pass_, *_key(r)): r for r in timings.records if r.pass_ != REFERENCE}
    for r in g[g["source"] != REFERENCE].itertuples():
        base = ref.get((r.variant, r.phase, int(r.size)))
        if base is None:
            continue
        own = in_pass.get((r.source, r.variant, r.phase, int(r.size)))
        ratio_write = _ratio(r.cost_per_write_ns, base.cost_per_write_ns)
        # a wall-clock reference (CPU) is held against the profiler's host step duration
        reading = r.step_ns if base.attribution == "wall" else r.step_gpu_ns
        ratio_step = _ratio(reading, base.step_ns)
        slowdown = _ratio(own.median_ns, base.step_ns) if own is not None else None
        flagged = any(x is not None and abs(x - 1) > threshold for x in (ratio_write, ratio_step))
        out["rows"].append({
            "variant": r.variant, "source": r.source, "phase": r.phase, "size": int(r.size), "graph": bool(r.graph),
            "cost_per_write_ns": finite_or_none(r.cost_per_write_ns),
            "reference_cost_per_write_ns": finite_or_none(base.cost_per_write_ns),
            "ratio_per_write": ratio_write,
            "step_ns": finite_or_none(reading), "reference_step_ns": finite_or_none(base.step_ns),
            "ratio_per_step": ratio_step,
            "pass_step_ns": own.median_ns if own is not None else None, "pass_slowdown": slowdown,
            "reading_over_pass": _ratio(reading, own.median_ns) if own is not None else None,
            "flagged": flagged,
        })
    for source in sorted({row["source"] for row in out["rows"]}):
        rows = [row for row in out["rows"] if row["source"] == source]
        out["sources"][source] = {
            "points": len(rows), "flagged": sum(row["flagged"] for row in rows),
            "median_ratio_per_write": _median([row["ratio_per_write"] for row in rows]),
            "median_ratio_per_step": _median([row["ratio_per_step"] for row in rows]),
            "median_pass_slowdown": _median([row["pass_slowdown"] for row in rows]),
            "range_ratio_per_write": _range([row["ratio_per_write"] for row in rows]),
            "range_ratio_per_step": _range([row["ratio_per_step"] for row in rows]),
        }
    return out


def trusted_sources(present: list[str], observer: dict[str, Any] | None) -> list[str]:
    """Sources in the order headline figures are taken from: the reference, then the
    profilers from least to most perturbed (median |log ratio| per write), else the prior."""
    present = list(dict.fromkeys(present))
    order = [REFERENCE] if REFERENCE in present else []
    stats = (observer or {}).get("sources") or {}

    def distance(s: str) -> tuple[float, int]:
        r = (stats.get(s) or {}).get("median_ratio_per_write")
        prior = _PRIOR_ORDER.index(s) if s in _PRIOR_ORDER else len(_PRIOR_ORDER)
        return (abs(math.log(r)) if r else math.inf, prior)

    order += sorted((s for s in present if s != REFERENCE), key=distance)
    return order


def observer_notes(observer: dict[str, Any]) -> list[str]:
    """One sentence per profiler source that is more than the threshold off the reference."""
    notes = []
    pct = round(observer.get("threshold", OBSERVER_THRESHOLD) * 100)
    for source, st in (observer.get("sources") or {}).items():
        if not st.get("flagged"):
            continue
        what, span = "per-write", st.get("range_ratio_per_write")
        if not span:  # a CPU trace has no GPU time per write: its host steps were compared
            what, span = "per-step", st.get("range_ratio_per_step")
        spread = f"{span[0]:.2f}-{span[1]:.2f}x" if span else "n/a"
        slow = st.get("median_pass_slowdown")
        slowed = f"; the profiled run itself took {slow:.2f}x the reference per step" if slow else ""
        notes.append(
            f"{SOURCE_LABELS.get(source, source)} is more than {pct} % off the unprofiled reference at "
            f"{st['flagged']} of {st['points']} points ({what} reading {spread} the reference{slowed}); "
            "headline figures use the reference")
    return notes




def _median(vals: list[Any]) -> float | None:
    xs = [v for v in vals if v is not None]
    return float(np.median(xs)) if xs else None


def _range(vals: list[Any]) -> tuple[float, float] | None:
    xs = [v for v in vals if v is not None]
    return (float(min(xs)), float(max(xs))) if xs else None


__all__ = ["OBSERVER_THRESHOLD", "REFERENCE", "SOURCE_LABELS", "observer_effect", "observer_notes",
           "reference_groups", "trusted_sources"]
