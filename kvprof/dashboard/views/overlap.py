"""Overlap: for the two-stream write, how much of the V copy runs beside the K copy, write by write."""

from __future__ import annotations

import streamlit as st

from kvprof.dashboard import charts, frames
from kvprof.dashboard.state import Context
from kvprof.dashboard.ui import md, show_figure, show_table
from kvprof.dashboard.views.common import esc, intro, need_run, per_write_source, source_label

MAX_POINTS = 5000


def typical_write(df) -> int:  # noqa: ANN001
    """The write closest to the median overlap of the first phase·size: a representative example,
    not the first replay (which may be unusual)."""
    first = df["phase_size"].iloc[0]
    d = df[df["phase_size"] == first]
    med = d["overlap_pct"].median()
    return int((d["overlap_pct"] - med).abs().idxmin())


def render(ctx: Context) -> None:
    if not need_run(ctx):
        return
    assert ctx.run is not None
    st.subheader(f"Overlap · {md(ctx.run.label)}")
    writes = ctx.writes()
    source = per_write_source(ctx, writes)
    src = source_label(source)
    intro(f"For a write that copies K and V on two CUDA streams: how much of the two copies ran at the same time, "
          f"write by write (<b>{esc(src)}</b>).")
    multi = [v for v in frames.multi_stream_variants(writes) if v in ctx.variants]
    if not multi:
        st.info("No chosen variant writes on two streams here (the two-stream K/V copy is `two_stream`); "
                "nothing overlaps. CPU-only traces have no streams at all.")
        return
    default = multi.index("two_stream") if "two_stream" in multi else 0
    variant = st.selectbox("variant", multi, index=default, key=f"ov-variant::{ctx.run.label}")
    df = frames.overlap_frame(writes, variant, source)
    st.caption("overlap = time with both streams busy / time with at least one busy (analyze's overlap_frac, "
               "per write). 100 % means the V copy ran entirely beside the K copy; 0 % means one copy started only "
               "after the other had finished.")
    if len(df):
        med = df.groupby("phase_size", sort=False)["overlap_pct"].median()
        cols = st.columns(min(len(med), 4) or 1)
        for i, (k, v) in enumerate(med.items()):
            cols[i % len(cols)].metric(f"median overlap · {md(k)}", f"{v:.1f} %")
        zero = [k for k, v in med.items() if v < 1.0]
        if zero:
            span = df[df["phase_size"].isin(zero)].groupby("phase_size")[["span_us", "busy_us"]].median()
            why = "; ".join(f"{md(k)}: median span {r.span_us:,.1f} µs for {r.busy_us:,.1f} µs of kernel time"
                            for k, r in span.iterrows())
            st.caption(f"0 % overlap at {md(', '.join(zero))}: in these writes the second copy started only after "
                       f"the first had finished, so the two streams never ran side by side ({why}; a span longer "
                       "than the kernels' time is idle GPU time between them).")
    else:
        st.info(f"{md(variant)} has no measured writes with GPU work at {md(src)}.")
    shown = df
    if len(df) > MAX_POINTS:  # thousands of SVG markers stall the browser: show a window of writes
        first = int(st.slider(f"writes shown ({MAX_POINTS:,} of {len(df):,}), starting at", 0, len(df) - MAX_POINTS,
                              0, step=max(1, MAX_POINTS // 10), key=f"ov-first::{variant}"))
        shown = df.iloc[first:first + MAX_POINTS]
    show_figure(charts.overlap_scatter(shown, variant), f"overlap-per-write-{variant}")
    show_figure(charts.overlap_hist(df, variant), f"overlap-hist-{variant}")

    if len(df):
        st.markdown("#### One write's kernels")
        pick = int(st.number_input(f"write (0 to {len(df) - 1}, in the order of the table below; the default is "
                                   "the one closest to the median overlap)", min_value=0, max_value=len(df) - 1,
                                   value=typical_write(df), key=f"ov-write::{variant}"))
        row = df.iloc[pick]
        st.caption(f"{md(row['trace'].rsplit('/', 1)[-1])} · write {int(row['write_id'])} · {md(row['phase_size'])} "
                   f"L{int(row['layer'])} step {int(row['step'])} · {md(row['kernel_names'])}")
        ev = ctx.run.gpu_events()
        k = ev[(ev["trace"].astype(str) == row["trace"]) & (ev["write_id"] == int(row["write_id"]))]
        origin = frames.trace_origin_ns(k, k.iloc[0:0])
        bars = frames.lane_rows(k, k.iloc[0:0], origin)
        show_figure(charts.timeline(bars, f"write {int(row['write_id'])}: {row['overlap_pct']:.1f} % overlap · {src}"),
                    f"overlap-write-{variant}")
    show_table(df, f"overlap-{variant}-{ctx.run.label}")
