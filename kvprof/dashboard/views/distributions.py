"""Distributions: per-write GPU time, launch delay and gaps by variant, and by layer (one phase·size at a time)."""

from __future__ import annotations

import streamlit as st

from kvprof.dashboard import charts, frames
from kvprof.dashboard.state import Context
from kvprof.dashboard.tables import cell, outliers
from kvprof.dashboard.ui import md, show_figure, show_table
from kvprof.dashboard.views.common import esc, intro, need_run, no_gpu_traces, per_write_source, source_label

KINDS = {"box": "box", "violin": "violin", "ECDF": "ecdf"}
HOST_METRIC = "host launch per write (µs)"


def render(ctx: Context) -> None:
    if not need_run(ctx):
        return
    assert ctx.run is not None
    summary = ctx.summary()
    writes = ctx.writes()
    st.subheader(f"Distributions · {md(ctx.run.label)}")
    source = per_write_source(ctx, writes)
    src = source_label(source)
    intro(f"How each per-write number spreads across the measured writes of a variant, by phase and by layer "
          f"(<b>{esc(src)}</b>): a slow tail or a slow layer stands out here, not in a median.")
    w = frames.measured_writes(writes, ctx.variants, source)
    cpu = bool(no_gpu_traces(summary))
    if cpu:
        st.warning("Some traces have no GPU events (CPU-only): their writes have no GPU times; "
                   "host launch per write still shows.")
    metrics = [m for m in frames.DIST_METRICS if frames.dist_frame(w, m).shape[0]] or [HOST_METRIC]
    c1, c2, c3, c4 = st.columns([2, 1, 1, 2])
    metric = c1.selectbox("per-write metric", metrics, key=f"dist-metric::{ctx.run.label}",
                          help="only metrics this run has values of are offered")
    kind = KINDS[c2.radio("plot", list(KINDS), horizontal=True, key="dist-kind")]
    scale = c3.radio("axis", list(charts.SCALES), key="dist-scale",
                     help="log by default: a few slow writes would flatten every box on a linear axis")
    df = frames.dist_frame(writes, metric, ctx.variants, source)
    if df.empty:
        st.info(f"No measured write has {md(metric)} here: " + (
            "the capture had no GPU (CPU-only), and this run's writes have no host launch times either."
            if cpu else "no writes of the chosen variants at this source."))
        return
    # the one rule (kvprof.analysis.figures): an interpreted variant's times are marked `*` on both
    # charts; nothing is derived from them (no bandwidth)
    interp = frames.interpreted_variants(summary) & set(df["variant"].astype(str))
    if interp and frames.DIST_METRICS[metric][0] == "bandwidth_gbs":
        st.caption(f"not drawn, n/a (interpreted: nothing is derived from the interpreter's time): "
                   f"{md(', '.join(sorted(interp)))}")
        df = df[~df["variant"].astype(str).isin(interp)]
        interp = set()
        if df.empty:
            return
    if scale == "log" and not bool((df["value"] > 0).all()):
        st.caption(f"{md(metric)} is 0 for some writes, which a log axis cannot draw: shown clipped at p99.")
        scale = "clipped at p99"
    n_out, vmax = outliers(df["value"])
    st.caption(f"{len(df):,} writes · {n_out:,} outliers beyond 1.5 IQR of the quartiles, drawn as points "
               f"(largest {cell(vmax)}) · {md(src)}")
    show_figure(charts.mark_interpreted(charts.distribution(df, metric, kind, f"{metric} per write · {src}",
                                                            scale=scale), interp),
                f"distribution-{metric}-{kind}")

    sizes = list(dict.fromkeys(df.sort_values(["phase", "size"])["phase_size"]))
    ps = c4.selectbox("by layer: phase · size", sizes, key=f"dist-ps::{ctx.run.label}",
                      help="one phase and size at a time: decode and prefill writes differ by orders of magnitude")
    sel = df[df["phase_size"] == ps]
    show_figure(charts.mark_interpreted(charts.per_layer(sel, metric, f"{metric} by layer · {ps} · {src}",
                                                         log=scale == "log"), interp),
                f"per-layer-{metric}")

    layers = ctx.run.layers()
    layers = layers[layers["variant"].astype(str).isin(ctx.variants)]
    if source:
        layers = layers[layers["source"].astype(str) == source]
    layers = layers[[frames.phase_size(p, s) == ps for p, s in zip(layers["phase"], layers["size"])]]
    with st.expander(f"per layer, median of each (analyze's layers table, {ps})"):
        show_table(layers, f"layers-{ctx.run.label}")
    with st.expander(f"the {len(sel):,} writes behind the by-layer chart"):
        show_table(sel, f"writes-{metric}-{ctx.run.label}")
