"""Variant vs baseline: ratios, and what the difference is worth per decode step.

The motivating measurement (SGLang PR #9775, Llama-3.1-70B TP8, 10 concurrent requests)
moved mean inter-token latency from 12.05 ms (two streams) to 11.87 ms (fused), with 80
layers per step. This module turns a captured per-write cost difference into the same
unit -- layers x (baseline cost - variant cost) per decode step, and as a share of the
inter-token latency -- so the capture can be held against that benchmark.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from kvprof.core.benchmark import Benchmark as Benchmark  # re-exported: analysis code imports it from here
from kvprof.core.numbers import finite_or_none
from kvprof.core.sources import PROFILER_PRIOR, source_names
from kvprof.core.timings import CLOCK_WORDS, CUDA_EVENTS, WALL

RATIO_METRICS = ("cost_per_write_ns", "gpu_span_ns", "gpu_busy_ns", "host_launch_ns",
                 "kernels_per_write", "step_gpu_ns")


def row_clock(source: str, attribution: str) -> str:
    """What clock a row's times come from, in words: a CPU run's are never GPU time."""
    if attribution in (WALL, CUDA_EVENTS):
        return CLOCK_WORDS[attribution]  # the reference pass: the workload's own timer
    if not attribution or attribution == "none":
        return "host trace (no GPU activity)"  # a profiler's trace of a CPU run: host-side times only
    return "GPU trace"  # kernels' own timestamps in the profiler's trace


def _ratio(a: float, b: float) -> float | None:
    if a is None or b is None or not np.isfinite(a) or not np.isfinite(b) or b == 0:
        return None
    return float(a / b)


def compare_groups(groups: pd.DataFrame, baseline: str, bench: Benchmark | None = None,
                   layers: int | None = None, prefer: list[str] | None = None,
                   source_order: list[str] | None = None) -> dict[str, Any]:
    """Each variant's (source, phase, size) rows against the baseline's same rows.

    ``layers``: how many layers a decode step writes in the projection (default: the
    benchmark's model, 80). ``prefer``: variants the headline is drawn from first (the
    fused ones: the benchmark measured a change to a fused write). ``source_order``: the
    sources the headline is drawn from, most trusted first (the reference pass, then the
    least perturbed profiler; see kvprof.analysis.reference.trusted_sources).

    Rows of a step measured inside a decoder layer (``context`` layer, the reference's)
    also carry ``measured_saving_per_step_ms``: the baseline's step minus the variant's,
    beside the projection from the writes alone; their predicted ITL uses the measurement.
    """
    bench = bench or Benchmark()
    layers = int(layers or bench.layers)
    out: dict[str, Any] = {"baseline": baseline, "benchmark": asdict(bench), "layers": layers, "rows": [],
                           "warnings": []}
    if groups.empty:
        out["warnings"].append("nothing to compare: no measured writes")
        return out
    g = groups[groups["layer"].astype(str) == "all"] if "layer" in groups.columns else groups
    base = g[g["variant"] == baseline]
    if base.empty:
        out["warnings"].append(f"baseline variant {baseline!r} has no measured writes; "
                               f"variants present: {', '.join(sorted(g['variant'].astype(str).unique()))}")
        return out
    keyed = {(r.source, r.phase, int(r.size)): r for r in base.itertuples()}
    for r in g[g["variant"] != baseline].itertuples():
        b = keyed.get((r.source, r.phase, int(r.size)))
        if b is None:
            continue
        row: dict[str, Any] = {"variant": r.variant, "source": r.source, "phase": r.phase, "size": int(r.size)}
        for m in RATIO_METRICS:
            row[f"{m}"] = finite_or_none(getattr(r, m))
            row[f"baseline_{m}"] = finite_or_none(getattr(b, m))
            row[f"ratio_{m}"] = _ratio(getattr(r, m), getattr(b, m))
        b_cost, r_cost = finite_or_none(b.cost_per_write_ns), finite_or_none(r.cost_per_write_ns)
        diff = b_cost - r_cost if b_cost is not None and r_cost is not None else None
        row["saving_per_write_ns"] = diff
        row["context"] = str(getattr(r, "context", "none") or "none")
        row["clock"] = row_clock(str(r.source), str(getattr(r, "attribution", "") or ""))
        # a CPU wall clock says nothing about a GPU serving step: no ITL projection from it
        gpu_time = getattr(r, "attribution", "") != WALL
        if r.phase == "decode" and diff is not None and gpu_time:
            step_ms = diff * layers / 1e6
            row["projected_saving_per_step_ms"] = step_ms
            if row["context"] == "layer" and _finite(getattr(b, "writes_only_step_ns", None),
                                                     getattr(r, "writes_only_step_ns", None)):
                row["projected_saving_per_step_ms"] = (
                    float(b.writes_only_step_ns) - float(r.writes_only_step_ns)) / 1e6
            row["saving_per_step_ms"] = row["projected_saving_per_step_ms"]
            if row["context"] == "layer" and _finite(b.step_ns, r.step_ns):
                measured = (float(b.step_ns) - float(r.step_ns)) / 1e6
                row["measured_saving_per_step_ms"] = measured
                b_iqr, r_iqr = (finite_or_none(getattr(x, "step_iqr_ns", None)) for x in (b, r))
                row["measured_saving_spread_ms"] = (
                    float(np.hypot(b_iqr, r_iqr)) / 1e6 if b_iqr is not None and r_iqr is not None else None)
                row["saving_per_step_ms"] = measured
            row["saving_share_of_itl"] = row["saving_per_step_ms"] / bench.itl_before_ms
            row["predicted_itl_ms"] = bench.itl_before_ms - row["saving_per_step_ms"]
        out["rows"].append(row)
    decode = [r for r in out["rows"] if r["phase"] == "decode" and r.get("saving_per_step_ms") is not None]
    if decode:
        pref = [r for r in decode if r["variant"] in (prefer or [])] or decode
        order = list(source_order or []) + list(source_names(PROFILER_PRIOR))
        rank = {s: i for i, s in reversed(list(enumerate(order)))}
        # the most trusted source, the benchmark's batch size, then the largest saving there
        near = min(pref, key=lambda r: (rank.get(r["source"], len(order)), abs(r["size"] - bench.batch),
                                        -(r["saving_per_step_ms"] or 0.0)))
        out["headline"] = {
            "variant": near["variant"], "source": near["source"], "size": near["size"],
            "context": near.get("context", "none"),
            "measured": near.get("measured_saving_per_step_ms") is not None,
            "projected_saving_per_step_ms": near.get("projected_saving_per_step_ms"),
            "saving_per_step_ms": near["saving_per_step_ms"],
            "predicted_itl_ms": near["predicted_itl_ms"],
            "measured_itl_ms": bench.itl_after_ms,
            "measured_saving_ms": bench.measured_saving_ms,
            "explains_fraction": (near["saving_per_step_ms"] / bench.measured_saving_ms
                                  if bench.measured_saving_ms else None),
        }
    return out


def _finite(*vals: Any) -> bool:
    return all(v is not None and np.isfinite(float(v)) for v in vals)


