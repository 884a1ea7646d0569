"""The landing view of a run, built once for the Overview page and for ``kvprof report --html``.

Pure (pandas + Plotly, no Streamlit, no torch): for the chosen source -- by default the
most trusted one the run has (the unprofiled reference pass, else the least perturbed
profiler) -- each variant fused or not, its GPU cost per write with the spread, the saving
per decode step against the baseline with its spread, and the writes' share of the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvprof.analysis.compare import Benchmark
from kvprof.dashboard import charts, frames, tables

SOURCE_WORDS = {"reference": "the reference pass (no profiler attached, CUDA events)",
                "nsys": "Nsight Systems", "kineto": "torch.profiler (Kineto)"}


def source_words(source: str | None) -> str:
    return SOURCE_WORDS.get(str(source), str(source or "no source"))


def default_source(summary: dict[str, Any], groups: pd.DataFrame | None = None) -> str | None:
    """The most trusted source with measured writes: what a step really pays."""
    groups = frames.groups_frame(summary) if groups is None else groups
    have = groups[groups["cost_per_write_ns"].notna()] if len(groups) else groups
    srcs = frames.sources_in(have if len(have) else groups, summary)
    return srcs[0] if srcs else None


def default_baseline(summary: dict[str, Any], variants: list[str]) -> str | None:
    comp = summary.get("comparison") or {}
    if comp.get("baseline") in variants:
        return str(comp["baseline"])
    from kvprof.core.variants import BASELINE

    return BASELINE if BASELINE in variants else (variants[0] if variants else None)


@dataclass
class Landing:
    run: str
    device: str
    source: str | None
    baseline: str | None
    headline: str
    frame: pd.DataFrame
    verdicts: pd.DataFrame
    figures: list[tuple[str, go.Figure]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def headline_text(comp: dict[str, Any], source: str | None, layers: int) -> str:
    head = comp.get("headline")
    if not head:
        return f"No decode saving to report at {source_words(source)}."
    how = ("measured: the baseline's decoder-layer step minus this one's" if head.get("measured")
           else f"projected: {layers} layers x the difference in GPU cost per write")
    return (f"{head['variant']} saves {head['saving_per_step_ms']:.3f} ms per decode step at bs={head['size']} "
            f"against {comp.get('baseline')} ({how}; source: {source_words(head['source'])}); predicted "
            f"inter-token latency {head['predicted_itl_ms']:.2f} ms.")


def build(label: str, summary: dict[str, Any], writes: pd.DataFrame | None = None, source: str | None = None,
          variants: list[str] | None = None, baseline: str | None = None, layers: int | None = None,
          bench: Benchmark | None = None) -> Landing:
    """Everything the landing view shows for one run and source."""
    groups = frames.groups_frame(summary)
    every = frames.variants_in(summary, groups)
    chosen = [v for v in every if variants is None or v in variants]
    source = source or default_source(summary, groups)
    baseline = baseline or default_baseline(summary, every)
    bench = bench or Benchmark()
    layers = int(layers or (summary.get("comparison") or {}).get("layers") or bench.layers)
    dev = summary.get("device") or {}
    device = str(dev.get("name") or "unknown device") if isinstance(dev, dict) else "unknown device"
    g = groups[groups["variant"].astype(str).isin(chosen)]
    order = [source] + [s for s in (summary.get("trusted_sources") or []) if s != source] if source else None
    comp = frames.comparison(g, baseline, layers, bench.itl_before_ms, bench.itl_after_ms,
                             prefer=frames.fused_variants(summary), source_order=order) if baseline else {}
    df = tables.landing_frame(g, comp, summary, source, writes, layers, bench.itl_before_ms) if source else \
        pd.DataFrame(columns=list(tables.LANDING_COLUMNS))
    verdicts = frames.verdicts_frame(summary)
    verdicts = verdicts[verdicts["variant"].isin(chosen) | ~verdicts["variant"].isin(every)]  # not-run ones too
    src = source_words(source)
    land = Landing(label, device, source, baseline, headline_text(comp, source, layers), df,
                   verdicts[["variant", "verdict", "claims fused", "paths say", "kernels say", "GPU ops per write"]])
    land.figures = [
        ("cost", charts.landing_cost(df, f"GPU µs per write (bars: median, whiskers: IQR) · {src}")),
        ("saving", charts.landing_saving(df, f"ms saved per decode step vs {baseline} ({layers} layers) · {src}")),
    ]
    if source and source != "reference" and "reference" in set(groups["source"].astype(str)):
        land.notes.append(f"{src} is not the reference pass: its numbers include the profiler's own cost.")
    spreads = sorted(set(df["spread_from"]) - {"none"})
    if spreads:
        land.notes.append("spreads: " + "; ".join(spreads) + "; the saving's spread combines the baseline's and the "
                          "variant's (or the decoder-layer step's IQR where measured).")
    land.notes.append(f"share of ITL: {layers} layers x GPU µs per write over the benchmark's inter-token latency "
                      f"{bench.itl_before_ms:.2f} ms ({bench.label}).")
    return land
