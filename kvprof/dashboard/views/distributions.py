"""Distributions: per-write GPU time, launch delay and gaps by variant, and by layer."""

from __future__ import annotations

import streamlit as st

from kvprof.dashboard import charts, frames
from kvprof.dashboard.state import Context
from kvprof.dashboard.ui import md, number_format, show_figure, show_table
from kvprof.dashboard.views.common import need_run, no_gpu_traces

KINDS = {"box": "box", "violin": "violin", "ECDF": "ecdf"}


def render(ctx: Context) -> None:
    if not need_run(ctx):
        return
    assert ctx.run is not None
    summary = ctx.summary()
    writes = ctx.writes()
    st.subheader(f"Distributions · {md(ctx.run.label)}")
    if no_gpu_traces(summary):
        st.warning("Some traces have no GPU events (CPU-only): their writes have no GPU times; "
                   "host launch per write still shows.")
    c1, c2, c3 = st.columns([2, 1, 2])
    metrics = list(frames.DIST_METRICS)
    metric = c1.selectbox("per-write metric", metrics, key="dist-metric")
    kind = KINDS[c2.radio("plot", list(KINDS), horizontal=True, key="dist-kind")]
    df = frames.dist_frame(writes, metric, ctx.variants, ctx.source)
    if df.empty and metric != "host launch per write (µs)":
        st.info(f"No measured write has {metric.split(' (')[0]} here; try another metric (host launch per write "
                "exists even without GPU events).")
    w = frames.measured_writes(writes, ctx.variants, ctx.source)  # options independent of the metric
    sizes = [frames.phase_size(p, s) for p, s in
             w[["phase", "size"]].drop_duplicates().sort_values(["size", "phase"]).itertuples(index=False)]
    ps = c3.selectbox("phase · size", ["all", *sizes], key=f"dist-ps::{ctx.run.label}")
    sel = df if ps == "all" else df[df["phase_size"] == ps]
    show_figure(charts.distribution(sel, metric, kind, f"{metric} per write · {ctx.source or 'all sources'}"),
                f"distribution-{metric}-{kind}")
    show_figure(charts.per_layer(sel, metric, f"{metric} by layer · {ps}"), f"per-layer-{metric}")

    layers = frames.groups_frame(summary, "layers")
    layers = layers[layers["variant"].astype(str).isin(ctx.variants)]
    if ctx.source:
        layers = layers[layers["source"].astype(str) == ctx.source]
    if ps != "all":
        layers = layers[[frames.phase_size(p, s) == ps for p, s in zip(layers["phase"], layers["size"])]]
    st.markdown("#### Per layer, median of each (analyze's layers table)")
    show_table(layers, f"layers-{ctx.run.label}", column_config=number_format(layers))
    with st.expander(f"the {len(sel):,} writes behind the charts"):
        show_table(sel, f"writes-{metric}-{ctx.run.label}")
