"""The Overview's frames and figures, built once per file version and setting, shared by every session.

Building the four Plotly figures and the comparison is most of the Overview's server time
(Plotly validates every property as it is set); a new visitor, a reload or a widget that
comes back to an earlier value gets the same objects from here instead. Keys are the files'
paths and stamps (``data.stamp``: size and mtime) plus the page's settings, so a re-analysed
run is rebuilt. The objects are shared, not copied (``st.cache_resource``): nothing that gets
them may change them -- ``st.plotly_chart`` serialises a figure, it does not modify it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from kvprof.analysis.compare import Benchmark
from kvprof.core.rundir import RunDir
from kvprof.dashboard import charts, data, frames, landing, layer_view, tables
from kvprof.dashboard.landing import Landing
from kvprof.dashboard.layer_view import LayerView


@dataclass(frozen=True)
class RunFiles:
    """Where one run's summary and writes are, and their stamps: the cache key of what is built from them."""

    summary: str
    summary_stamp: int
    writes: str | None
    writes_stamp: int

    @classmethod
    def of(cls, run: data.RunOutputs) -> RunFiles:
        s = run.file(RunDir.SUMMARY)
        w = RunDir(run.dir).writes
        has_w = w.is_file()
        return cls(str(s), data.stamp(s), str(w) if has_w else None, data.stamp(w) if has_w else 0)


@dataclass(frozen=True)
class Settings:
    """The Overview's choices: source, variants shown, baseline, and the projection's inputs."""

    source: str | None
    variants: tuple[str, ...]
    baseline: str
    layers: int
    itl_before_ms: float
    itl_after_ms: float


@st.cache_resource(show_spinner=False, max_entries=32)
def landing_view(label: str, summary: str, summary_stamp: int, writes: str | None, writes_stamp: int,
                 source: str | None, variants: tuple[str, ...], baseline: str, layers: int, itl_before_ms: float,
                 itl_after_ms: float) -> Landing:
    """landing.build for one run and setting; writes.parquet is read only when a spread needs it."""
    doc = data.read_summary(summary, summary_stamp)
    groups = data.read_groups(summary, summary_stamp)
    src = source or landing.default_source(doc, groups)
    w = None
    if writes is not None and src is not None and tables.spread_needs_writes(groups, src):
        w = data.read_writes(writes, writes_stamp)
    bench = Benchmark(itl_before_ms=itl_before_ms, itl_after_ms=itl_after_ms, layers=layers)
    return landing.build(label, doc, w, src, list(variants), baseline, layers, bench)


def landing_for(run: data.RunOutputs, s: Settings) -> Landing:
    f = RunFiles.of(run)
    return landing_view(run.label, f.summary, f.summary_stamp, f.writes, f.writes_stamp, s.source, s.variants,
                        s.baseline, s.layers, s.itl_before_ms, s.itl_after_ms)


@dataclass(frozen=True)
class Detail:
    """The Overview's per variant and phase part: its table, the comparison's warnings, the speed-up chart."""

    groups: pd.DataFrame  # the chosen variants' groups at the source
    table: pd.DataFrame
    warnings: tuple[str, ...]
    speedup: go.Figure


@st.cache_resource(show_spinner=False, max_entries=32)
def detail_view(summary: str, summary_stamp: int, source: str | None, variants: tuple[str, ...], baseline: str,
                layers: int, itl_before_ms: float, itl_after_ms: float) -> Detail | None:
    """None when the chosen variants have no groups at the source."""
    doc = data.read_summary(summary, summary_stamp)
    groups = data.read_groups(summary, summary_stamp)
    g = groups[groups["variant"].astype(str).isin(variants)]
    if source:
        g = g[g["source"].astype(str) == source]
    if g.empty:
        return None
    order = [source] + [s for s in (doc.get("trusted_sources") or []) if s != source]
    comp = frames.comparison(groups, baseline, layers, itl_before_ms, itl_after_ms,
                             prefer=frames.fused_variants(doc), source_order=order)
    table = frames.overview_frame(g, comp, doc, baseline)
    t = landing.timing(doc, source)
    fig = charts.speedup_bars(table, baseline, f"{'GPU cost' if t.gpu else f'cost ({t.how})'} per write: speed-up "
                                               f"vs {baseline} · {t.words}")
    return Detail(g, table, tuple(str(w) for w in comp.get("warnings") or []), fig)


def detail_for(run: data.RunOutputs, s: Settings) -> Detail | None:
    f = RunFiles.of(run)
    return detail_view(f.summary, f.summary_stamp, s.source, s.variants, s.baseline, s.layers, s.itl_before_ms,
                       s.itl_after_ms)


@st.cache_resource(show_spinner=False, max_entries=64)
def metric_figure(summary: str, summary_stamp: int, source: str | None, variants: tuple[str, ...], metric: str,
                  cpu_only: bool) -> go.Figure:
    """The Overview's bar chart of one group metric for the chosen variants at the source."""
    groups = data.read_groups(summary, summary_stamp)
    g = groups[groups["variant"].astype(str).isin(variants)]
    if source:
        g = g[g["source"].astype(str) == source]
    doc = data.read_summary(summary, summary_stamp)
    mf = frames.group_metric_frame(g, metric, frames.interpreted_variants(doc))
    t = landing.timing(doc, source)
    src = t.words
    label = t.per_write if frames.GROUP_METRICS[metric][0] == "cost_per_write_ns" else metric
    if len(mf):
        return charts.metric_bars(mf, label, f"{label} · {src}",
                                  derived=frames.GROUP_METRICS[metric][0] in frames.DERIVED_METRICS)
    return charts.empty_figure(f"no {metric} at {src}" + (" (a CPU-only capture has no GPU times)" if cpu_only
                                                          else ""), metric)


def metric_for(run: data.RunOutputs, s: Settings, metric: str, cpu_only: bool) -> go.Figure:
    f = RunFiles.of(run)
    return metric_figure(f.summary, f.summary_stamp, s.source, s.variants, metric, cpu_only)



@st.cache_resource(show_spinner=False, max_entries=32)
def layer_views(summary: str, summary_stamp: int, writes: str | None, writes_stamp: int, source: str | None,
                variants: tuple[str, ...], layers: int) -> LayerView:
    """The Layer page's rotary-fusion and PDL views (layer_view.build); writes.parquet is read only
    when a projected saving's spread needs it."""
    doc = data.read_summary(summary, summary_stamp)
    groups = data.read_groups(summary, summary_stamp)
    w = None
    rope = [v for v in variants if v in layer_view.ROPE_VARIANTS]
    if writes is not None and rope and any(tables.spread_needs_writes(groups[groups["variant"].isin(rope)], s)
                                           for s in frames.sources_in(groups, doc)):
        w = data.read_writes(writes, writes_stamp)
    return layer_view.build(doc, source, layers, list(variants), w, groups=groups)


def layer_for(run: data.RunOutputs, source: str | None, variants: tuple[str, ...], layers: int) -> LayerView:
    f = RunFiles.of(run)
    return layer_views(f.summary, f.summary_stamp, f.writes, f.writes_stamp, source, variants, layers)
