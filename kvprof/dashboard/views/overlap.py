"""Overlap: for the two-stream write, how much of the V copy runs beside the K copy, write by write."""

from __future__ import annotations

import streamlit as st

from kvprof.dashboard import charts, frames
from kvprof.dashboard.state import Context
from kvprof.dashboard.ui import md, number_format, show_figure, show_table
from kvprof.dashboard.views.common import need_run

MAX_POINTS = 5000


def render(ctx: Context) -> None:
    if not need_run(ctx):
        return
    assert ctx.run is not None
    st.subheader(f"Overlap · {md(ctx.run.label)}")
    writes = ctx.writes()
    multi = [v for v in frames.multi_stream_variants(writes) if v in ctx.variants]
    if not multi:
        st.info("No chosen variant writes on two streams here (the two-stream K/V copy is `two_stream`); "
                "nothing overlaps. CPU-only traces have no streams at all.")
        return
    default = multi.index("two_stream") if "two_stream" in multi else 0
    variant = st.selectbox("variant", multi, index=default, key=f"ov-variant::{ctx.run.label}")
    df = frames.overlap_frame(writes, variant, ctx.source)
    st.caption("overlap = time with both streams busy / time with at least one busy (analyze's overlap_frac, "
               "per write). 100 % means the V copy ran entirely beside the K copy.")
    if len(df):
        med = df.groupby("phase_size")["overlap_pct"].median()
        cols = st.columns(min(len(med), 4) or 1)
        for i, (k, v) in enumerate(med.items()):
            cols[i % len(cols)].metric(f"median overlap · {md(k)}", f"{v:.1f} %")
    shown = df
    if len(df) > MAX_POINTS:  # thousands of SVG markers stall the browser: show a window of writes
        first = int(st.slider(f"writes shown ({MAX_POINTS:,} of {len(df):,}), starting at", 0, len(df) - MAX_POINTS,
                              0, step=max(1, MAX_POINTS // 10), key=f"ov-first::{variant}"))
        shown = df.iloc[first:first + MAX_POINTS]
    show_figure(charts.overlap_scatter(shown, variant), f"overlap-per-write-{variant}")
    show_figure(charts.overlap_hist(df, variant), f"overlap-hist-{variant}")

    if len(df):
        st.markdown("#### One write's kernels")
        pick = int(st.number_input(f"write (0 to {len(df) - 1}, in the order of the table below)", min_value=0,
                                   max_value=len(df) - 1, value=0, key=f"ov-write::{variant}"))
        row = df.iloc[pick]
        st.caption(f"{md(row['trace'].rsplit('/', 1)[-1])} · write {int(row['write_id'])} · {md(row['phase_size'])} "
                   f"L{int(row['layer'])} step {int(row['step'])} · {md(row['kernel_names'])}")
        ev = ctx.run.gpu_events()
        k = ev[(ev["trace"].astype(str) == row["trace"]) & (ev["write_id"] == int(row["write_id"]))]
        origin = frames.trace_origin_ns(k, k.iloc[0:0])
        bars = frames.lane_rows(k, k.iloc[0:0], origin)
        show_figure(charts.timeline(bars, f"write {int(row['write_id'])}: {row['overlap_pct']:.1f} % overlap"),
                    f"overlap-write-{variant}")
    show_table(df, f"overlap-{variant}-{ctx.run.label}", column_config=number_format(df))
