"""The landing view of a run, built once for the Overview page and for ``kvprof report --html``.

Pure (pandas + Plotly, no Streamlit, no torch): for the chosen source -- by default the
most trusted one the run has (the unprofiled reference pass, else the least perturbed
profiler) -- each variant fused or not, its cost per write with the spread, the saving
per decode step against the baseline with its spread, and the writes' share of the step.
Every label says how the source timed its figures (kvprof.core.timings.SourceTiming: CUDA
events, a profiler's GPU timestamps, or a CPU's wall clock); where that is no GPU time
there is no saving per step and no share of the inter-token latency, and the page says
why instead of drawing an empty chart. The report also carries the run's decoder-layer
views (the rotary fused into the write, what PDL hides: kvprof.dashboard.layer_view).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvprof.analysis.compare import Benchmark
from kvprof.analysis.figures import INTERPRETED, MARK, NEGATIVE, NEGATIVE_WHY
from kvprof.core.timings import SourceTiming
from kvprof.dashboard import charts, frames, layer_view, tables
from kvprof.dashboard.engine_view import EngineView, engine_views
from kvprof.dashboard.layer_view import LayerView


def timing(summary: dict[str, Any] | None, source: str | None) -> SourceTiming:
    """How ``source`` of the run timed its figures (its clock from summary.json)."""
    return frames.timing_of(summary, source)


def source_words(source: str | None, summary: dict[str, Any] | None = None) -> str:
    """The source and how it timed (with the run's ``summary``): "the reference pass (no profiler
    attached, wall clock)"."""
    return timing(summary, source).words


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
    timing: SourceTiming = SourceTiming(None, None)
    layer: LayerView | None = None  # the rotary-fusion and PDL views (kvprof.dashboard.layer_view)
    engine: list[EngineView] = field(default_factory=list)  # engine traces' write kernels per step and layer


def headline_text(comp: dict[str, Any], source: str | None, layers: int, summary: dict[str, Any] | None = None) -> str:
    head = comp.get("headline")
    t = timing(summary, source)
    if not head:
        if source is not None and not t.gpu and t.clock is not None:
            return f"No decode saving per step at {t.words}: {t.no_step_why[1]}."
        return f"No decode saving to report at {t.words}."
    how = ("measured: the baseline's decoder-layer step minus this one's" if head.get("measured")
           else f"projected: {layers} layers x the difference in GPU cost per write")
    return (f"{head['variant']} saves {head['saving_per_step_ms']:.3f} ms per decode step at bs={head['size']} "
            f"against {comp.get('baseline')} ({how}; source: {source_words(head['source'], summary)}); predicted "
            f"inter-token latency {head['predicted_itl_ms']:.2f} ms.")


def _has_saving(df: pd.DataFrame, baseline: str | None) -> bool:
    """A decode saving of some variant other than the baseline (the baseline's own is 0 by definition)."""
    d = df[(df["phase"] == "decode") & (df["variant"] != baseline)]
    return bool(d["saving_ms"].notna().any())


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
    t = timing(summary, source)
    df = tables.landing_frame(g, comp, summary, source, writes, layers, bench.itl_before_ms, gpu=t.gpu) if source \
        else pd.DataFrame(columns=list(tables.LANDING_COLUMNS))
    verdicts = frames.verdicts_frame(summary)
    verdicts = verdicts[verdicts["variant"].isin(chosen) | ~verdicts["variant"].isin(every)]  # not-run ones too
    src = t.words
    land = Landing(label, device, source, baseline, headline_text(comp, source, layers, summary), df,
                   verdicts[["variant", "verdict", "claims fused", "paths say", "kernels say", "GPU ops per write"]],
                   timing=t, engine=engine_views(summary))
    land.figures = [("cost", charts.landing_cost(df, f"{t.per_write} (bars: median, whiskers: IQR) · {src}",
                                                 t.per_write))]
    saving_title = f"ms saved per decode step vs {baseline} ({layers} layers) · {src}"
    if _has_saving(df, baseline):
        land.figures.append(("saving", charts.landing_saving(df, saving_title)))
    elif not t.gpu and source is not None:
        land.notes.append(f"no chart of ms saved per decode step: {t.no_step_why[1]} (capture and analyze show "
                          f"n/a ({t.no_step_why[0]}) too).")
    else:
        land.notes.append(f"no chart of ms saved per decode step: no variant has a decode row of its own and of "
                          f"{baseline} at {src}.")
    if source and source != "reference" and "reference" in set(groups["source"].astype(str)):
        land.notes.append(f"{src} is not the reference pass: its numbers include the profiler's own cost.")
    kinds = set(df["cost_kind"]) if "cost_kind" in df.columns else set()
    if INTERPRETED in kinds:
        land.notes.append(f"{MARK} {', '.join(sorted(set(df[df['cost_kind'] == INTERPRETED]['variant'])))}: "
                          "ran in Triton's interpreter on the host (a CPU run): the bar (hatched) is the "
                          "interpreter's time, not what the fused kernel costs on a GPU.")
    if NEGATIVE in kinds:
        land.notes.append(f"n/a ({NEGATIVE_WHY}): a cost below zero (a difference of two medians within their "
                          f"noise) is not drawn: {', '.join(sorted(set(df[df['cost_kind'] == NEGATIVE]['variant'])))}.")
    spreads = sorted(set(df["spread_from"]) - {"none"})
    if spreads:
        land.notes.append("spreads: " + "; ".join(spreads) + (
            "; the saving's spread combines the baseline's and the variant's (or the decoder-layer step's IQR where "
            "measured)." if _has_saving(df, baseline) else "."))
    if t.gpu:
        land.notes.append(f"share of ITL: {layers} layers x GPU µs per write over the benchmark's inter-token latency "
                          f"{bench.itl_before_ms:.2f} ms ({bench.label}).")
    elif source is not None:
        land.notes.append(f"share of ITL: n/a ({t.no_step_why[0]}): {t.no_step_why[1]}.")
    land.layer = layer_view.build(summary, source, layers, chosen, writes, bench, groups)
    return land
