"""Run vs run: each variant of one run against the same variant of another.

A before/after question ("did my change make triton_fused faster?") pairs a variant with
itself across two runs; ``pairs`` may also name other pairings (before's two_stream
against after's triton_fused). Each pair goes through compare_groups with the before
side as the baseline, so every ratio means the same as in ``analyze``'s comparison. A
pair with no row says why: missing from a run, or no (source, phase, size) in common.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvprof.analysis.compare import Benchmark, compare_groups
from kvprof.core import variants as variant_table

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


def compare_runs(before: pd.DataFrame, after: pd.DataFrame, pairs: list[tuple[str, str]] | None = None,
                 bench: Benchmark | None = None, layers: int | None = None) -> RunComparison:
    """``before``/``after``: the two runs' group tables (kvprof.analysis.metrics.GROUP_COLUMNS)."""
    bench = bench or Benchmark()
    layers = int(layers or bench.layers)
    pairs = same_variant_pairs(before, after) if pairs is None else list(pairs)
    out = RunComparison(pairs=pairs, benchmark=dict(bench.__dict__), layers=layers)
    have_b, have_a = set(_variants(before)), set(_variants(after))
    for bv, av in pairs:
        missing = [f"{bv}: no measured writes in the before run" if bv not in have_b else "",
                   f"{av}: no measured writes in the after run" if av not in have_a else ""]
        if any(missing):
            out.empty.append("; ".join(m for m in missing if m))
            continue
        b = before[before["variant"].astype(str) == bv].assign(variant=_BEFORE)
        a = after[after["variant"].astype(str) == av].assign(variant=_AFTER)
        comp = compare_groups(pd.concat([b, a], ignore_index=True), _BEFORE, bench, layers)
        if not comp["rows"]:
            out.empty.append(f"{bv} -> {av}: no (source, phase, size) measured in both runs")
        for r in comp["rows"]:
            out.rows.append({**r, "variant": bv if bv == av else f"{bv} -> {av}", "before": bv, "after": av})
    return out


__all__ = ["RunComparison", "compare_runs", "same_variant_pairs"]
