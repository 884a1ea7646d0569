"""Timeline: one lane per stream with its kernels, lanes for kvprof's write ranges, on a µs axis."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from kvprof.core.rundir import RunDir
from kvprof.dashboard import charts, data, frames
from kvprof.dashboard.state import Context
from kvprof.dashboard.ui import md, show_figure, show_table
from kvprof.dashboard.views.common import intro, need_run

WIDTHS_US = (10.0, 100.0, 1_000.0, 10_000.0, 100_000.0, 1_000_000.0, 10_000_000.0)
MAX_BARS = (500, 2000, 5000, 10000)


def _fmt_us(us: float) -> str:
    return f"{us / 1e6:.4g} s" if us >= 1e6 else f"{us / 1e3:.4g} ms" if us >= 1e3 else f"{us:.4g} µs"


def render(ctx: Context) -> None:
    if not need_run(ctx):
        return
    assert ctx.run is not None
    summary = ctx.summary()
    traces = summary.get("traces") or []
    if not traces:
        st.warning("This run's summary lists no traces.")
        return
    st.subheader(f"Timeline · {md(ctx.run.label)}")
    intro("What ran on each GPU stream and when, with kvprof's write ranges in their own lanes, in one trace file: "
          "zoom the window to single kernels.")
    paths = [str(t["path"]) for t in traces]
    by_path = {str(t["path"]): t for t in traces}

    def label(p: str) -> str:
        t = by_path[p]
        return f"{p.rsplit('/', 1)[-1]} · {t.get('source')} · {', '.join(t.get('variants') or []) or '-'} · " \
               f"{t.get('gpu_events', 0):,} GPU events"

    preferred = [p for p in paths if by_path[p].get("gpu_events")
                 and (not ctx.source or by_path[p].get("source") == ctx.source)
                 and set(by_path[p].get("variants") or []) & set(ctx.variants)]
    if not preferred:  # the reference pass has no trace: the most trusted profiler's instead
        order = frames.sources_in(pd.DataFrame({"source": [by_path[p].get("source") for p in paths]}), summary)
        preferred = sorted((p for p in paths if by_path[p].get("gpu_events")),
                           key=lambda p: (order.index(by_path[p].get("source"))
                                          if by_path[p].get("source") in order else 99))
    default = paths.index(preferred[0]) if preferred else 0
    trace = st.selectbox("trace", paths, index=default, format_func=label, key=f"tl-trace::{ctx.run.label}")
    t = by_path[trace]

    ev_path, w_path = ctx.run.file(RunDir.EVENTS), ctx.run.file(RunDir.WRITES)
    rows, _origin, end_us = data.timeline_rows(str(ev_path), data.stamp(ev_path), str(w_path),
                                               data.stamp(w_path), trace)
    if not t.get("gpu_events"):
        st.warning("This trace has no GPU events (a CPU-only capture): no stream lanes; the lane below is the "
                   "kvprof write ranges on the host.")
    rows = rows[rows["variant"].isin([*ctx.variants, frames.NOT_IN_WRITE])]
    if rows.empty:
        st.info("Nothing to draw for the chosen variants in this trace.")
        return

    c1, c2, c3 = st.columns([1, 3, 1])
    widths = [w for w in WIDTHS_US if w < end_us]
    width_opts = ["whole trace", *[_fmt_us(w) for w in widths]]
    wchoice = c1.selectbox("window", width_opts, key=f"tl-width::{trace}",
                           help="narrow the window to see single kernels; wider windows merge nearby kernels")
    width = end_us if wchoice == "whole trace" else widths[width_opts.index(wchoice) - 1]
    max_start = max(0.0, end_us - width)
    start = 0.0
    if max_start > 0:
        start = float(c2.slider("window start (µs from the first activity)", 0.0, float(max_start), 0.0,
                                step=max(width / 10.0, 0.001), key=f"tl-start::{trace}::{wchoice}"))
    else:
        c2.caption(f"the whole trace: {end_us:,.1f} µs")
    max_bars = int(c3.selectbox("max bars", MAX_BARS, index=1, key="tl-maxbars",
                                help="more than this many activities in the window are merged per lane"))

    bars, info = frames.window(rows, start, start + width, max_bars)
    msg = (f"{info['in_window']:,} of {info['total']:,} activities and write ranges in "
           f"[{start:,.1f}, {start + width:,.1f}] µs")
    if info["binned"]:
        msg += (f"; merged into {info['bars']:,} bars ({info['bin_us']:.3g} µs per bin and lane): narrow the window "
                "for single kernels")
    st.caption(msg)
    show_figure(charts.timeline(bars, f"{trace.rsplit('/', 1)[-1]} · {_fmt_us(width)} window"),
                f"timeline-{ctx.run.label}")

    ends = rows["start_us"] + rows["dur_us"]
    inside = rows[(ends >= start) & (rows["start_us"] <= start + width)].sort_values("start_us")
    with st.expander(f"activities in the window ({len(inside):,})"):
        show_table(inside.drop(columns=["count", "busy_us"]), f"timeline-rows-{ctx.run.label}", max_rows=2000)
    kbn = (t.get("generic") or {}).get("kernels_by_name") or []
    if kbn:
        with st.expander("kernels by name in this trace (analyze)"):
            df = pd.DataFrame(kbn)
            for c in ("total_ns", "mean_ns", "median_ns"):
                if c in df:
                    df[c.replace("_ns", "_us")] = df.pop(c) / 1e3
            show_table(df, f"kernels-by-name-{ctx.run.label}")
