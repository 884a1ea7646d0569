"""Run vs run: each variant of one run against the same variant of another.

A before/after question ("did my change make triton_fused faster?") pairs a variant with
itself across two runs; ``pairs`` may also name other pairings (before's two_stream
against after's triton_fused). Each pair goes through compare_groups with the before
side as the baseline, so every ratio means the same as in ``analyze``'s comparison; the
two sides' figures are named ``before_<metric>`` and ``after_<metric>`` (``baseline_``
names a baseline variant, in ``compare RUN --baseline``). A (source, phase, size) that
one run measured and the other did not is a row too, with ``only_in`` naming the run
(and the other side's figures null), so nothing measured is dropped without a word.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvprof.analysis.compare import RATIO_METRICS, Benchmark, compare_groups, row_clock
from kvprof.core import variants as variant_table
from kvprof.core.numbers import finite_or_none

_BEFORE = "__before__"
_AFTER = "__after__"


@dataclass
class RunComparison:
    """Rows of compare_groups per (before, after) pair; ``empty`` says why a pair has none."""

    pairs: list[tuple[str, str]]
    rows: list[dict[str, Any]] = field(default_factory=list)
    empty: list[str] = field(default_factory=list)
    benchmark: dict[str, Any] = field(default_factory=dict)
    layers: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"kind": "run_vs_run", "pairs": [list(p) for p in self.pairs], "rows": self.rows,
                "empty": self.empty, "benchmark": self.benchmark, "layers": self.layers}


def _variants(groups: pd.DataFrame) -> list[str]:
    return sorted(set(groups["variant"].astype(str))) if len(groups) else []


def same_variant_pairs(before: pd.DataFrame, after: pd.DataFrame) -> list[tuple[str, str]]:
    """Every variant of either run paired with itself, in the variant table's order."""
    names = variant_table.ordered(sorted(set(_variants(before)) | set(_variants(after))))
    return [(n, n) for n in names]


def _sides(row: dict[str, Any]) -> dict[str, Any]:
    """compare_groups' row with its baseline's figures named before_* and the variant's after_*,
    each metric's before, after and ratio side by side."""
    out: dict[str, Any] = {k: row[k] for k in ("source", "phase", "size") if k in row}
    for m in RATIO_METRICS:
        out[f"before_{m}"], out[f"after_{m}"] = row.get(f"baseline_{m}"), row.get(m)
        out[f"ratio_{m}"] = row.get(f"ratio_{m}")
    named = {*RATIO_METRICS, *(f"baseline_{m}" for m in RATIO_METRICS), *(f"ratio_{m}" for m in RATIO_METRICS)}
    out.update((k, v) for k, v in row.items() if k not in named and k not in out)
    return out


def _all_rows(groups: pd.DataFrame) -> pd.DataFrame:
    return groups[groups["layer"].astype(str) == "all"] if "layer" in groups.columns else groups


def _one_side(r: Any, side: str) -> dict[str, Any]:
    """A (source, phase, size) only ``side`` measured: its figures, the other side's null."""
    other = "after" if side == "before" else "before"
    row: dict[str, Any] = {"source": str(r.source), "phase": str(r.phase), "size": int(r.size)}
    for m in RATIO_METRICS:
        row[f"{side}_{m}"] = finite_or_none(getattr(r, m, None))
        row[f"{other}_{m}"] = None
        row[f"ratio_{m}"] = None
    row.update(saving_per_write_ns=None, context=str(getattr(r, "context", "none") or "none"),
               clock=row_clock(str(r.source), str(getattr(r, "attribution", "") or "")), only_in=side)
    return {k: row[k] for k in ["source", "phase", "size",
                                *(f"{s}_{m}" for m in RATIO_METRICS for s in ("before", "after", "ratio")),
                                "saving_per_write_ns", "context", "clock", "only_in"]}


def compare_runs(before: pd.DataFrame, after: pd.DataFrame, pairs: list[tuple[str, str]] | None = None,
                 bench: Benchmark | None = None, layers: int | None = None) -> RunComparison:
    """``before``/``after``: the two runs' group tables (kvprof.analysis.metrics.GROUP_COLUMNS)."""
    bench = bench or Benchmark()
    layers = int(layers or bench.layers)
    pairs = same_variant_pairs(before, after) if pairs is None else list(pairs)
    out = RunComparison(pairs=pairs, benchmark=dict(bench.__dict__), layers=layers)
    before, after = _all_rows(before), _all_rows(after)
    for bv, av in pairs:
        b = before[before["variant"].astype(str) == bv]
        a = after[after["variant"].astype(str) == av]
        name = bv if bv == av else f"{bv} -> {av}"
        if b.empty and a.empty:
            out.empty.append(f"{name}: no measured writes in either run")
            continue
        rows: list[dict[str, Any]] = []
        if len(b) and len(a):
            comp = compare_groups(pd.concat([b.assign(variant=_BEFORE), a.assign(variant=_AFTER)],
                                            ignore_index=True), _BEFORE, bench, layers)
            rows = [{**_sides(r), "only_in": None} for r in comp["rows"]]
        both = {(r["source"], r["phase"], r["size"]) for r in rows}
        for side, frame in (("before", b), ("after", a)):
            for r in frame.itertuples():
                if (str(r.source), str(r.phase), int(r.size)) not in both:
                    rows.append(_one_side(r, side))
        for r in rows:
            r.pop("variant", None)
            out.rows.append({"variant": name, **r, "before": bv, "after": av})
    return out


__all__ = ["RunComparison", "compare_runs", "same_variant_pairs"]
