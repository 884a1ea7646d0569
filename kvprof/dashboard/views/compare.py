"""Compare runs: two runs (before / after) side by side, with ratios from kvprof's compare_groups."""

from __future__ import annotations

import streamlit as st

from kvprof.dashboard import charts, frames
from kvprof.dashboard.state import Context
from kvprof.dashboard.ui import md, number_format, show_figure, show_table
from kvprof.dashboard.views.common import device_line
from kvprof.analysis.compare import Benchmark
from kvprof.core.errors import KvprofError

EACH = "(each variant vs itself)"
RATIOS = ("ratio after/before", "ratio GPU span", "ratio host launch", "ratio kernels/write")


def _keys(ctx: Context, label: str) -> set[tuple[str, str, str, int]]:
    """(variant, source, phase, size) with a GPU time per write: what a comparison can pair."""
    g = frames.groups_frame(ctx.open(label).summary())
    g = g[g["cost_per_write_ns"].notna()]
    return {(str(r.variant), str(r.source), str(r.phase), int(r.size)) for r in g.itertuples()}


def _likely_pairs(ctx: Context, cur: str, labels: list[str], limit: int = 20) -> list[str]:
    """Other readable runs, those sharing most (variant, source, phase, size) with ``cur`` first."""
    readable = [lab for lab in labels if lab != cur and (lab in ctx.uploads or (ctx.entry(lab) and ctx.entry(lab).analysed))]
    try:
        mine = _keys(ctx, cur)
        scored = sorted(readable[:limit], key=lambda lab: -len(mine & _keys(ctx, lab)))
    except KvprofError:
        scored = readable
    return scored + [lab for lab in labels if lab != cur and lab not in scored]


def render(ctx: Context) -> None:
    st.subheader("Compare runs")
    labels = ctx.labels()
    if len(labels) < 1:
        st.info("No runs to compare: the traces root has none and nothing was uploaded.")
        return
    c1, c2 = st.columns(2)
    cur = ctx.run.label if ctx.run is not None and ctx.run.label in labels else labels[0]
    others = _likely_pairs(ctx, cur, labels)
    before = c1.selectbox("before", labels, index=labels.index(others[0]) if others else 0, key="cmp-before")
    after = c2.selectbox("after", labels, index=labels.index(cur), key="cmp-after")
    if before == after:
        st.warning("Before and after are the same run: every ratio is 1. Pick two runs (or compare two variants "
                   "of it below).")
    sums = {}
    for lab in dict.fromkeys((before, after)):
        try:
            sums[lab] = ctx.open(lab).summary()
        except KvprofError as exc:
            st.error(f"Cannot open {md(lab)}: {md(exc)}")
            return
    b_sum, a_sum = sums[before], sums[after]
    bg, ag = frames.groups_frame(b_sum), frames.groups_frame(a_sum)
    side = st.columns(2)
    for col, lab, summ, g in ((side[0], before, b_sum, bg), (side[1], after, a_sum, ag)):
        with col:
            st.markdown(f"**{md(lab)}** · {device_line(summ)}")
            t = frames.overview_frame(g, None, summ)
            t = t[["variant", "source", "phase", "size", "verdict", "GPU µs/write", "host launch µs"]]
            if ctx.source:
                t = t[t["source"] == ctx.source]
            show_table(t, f"compare-side-{'before' if col is side[0] else 'after'}", column_config=number_format(t))
    bvars, avars = frames.variants_in(b_sum, bg), frames.variants_in(a_sum, ag)
    c3, c4, c5 = st.columns(3)
    bvar = c3.selectbox("before variant", [EACH, *bvars], key="cmp-bvar")
    avar = c4.selectbox("after variant", [EACH, *avars], key="cmp-avar",
                        help="e.g. before two_stream, after triton_fused: what kvprof compare RUN RUN2 reports")
    layers = int(c5.number_input("layers per decode step", min_value=1, max_value=1000, value=Benchmark().layers,
                                 key="cmp-layers"))
    if bvar == EACH or avar == EACH:
        pairs = [(v, v) for v in bvars if v in avars and v in ctx.variants] if ctx.variants else \
            [(v, v) for v in bvars if v in avars]
        if not pairs:
            st.info("The two runs have no variant in common (with the sidebar's variant filter); pick a pair.")
    else:
        pairs = [(bvar, avar)]
    bench = Benchmark()
    df, warns = frames.compare_runs(bg, ag, pairs, layers, bench.itl_before_ms, bench.itl_after_ms)
    if ctx.source:
        df = df[df["source"] == ctx.source]
    for w in warns:
        st.info(md(w))
    show_figure(charts.before_after(df, f"GPU µs per write: {before} -> {after}"), "compare-before-after")
    show_figure(charts.ratio_bars(df, [c for c in RATIOS if df[c].notna().any()] or ["ratio after/before"]),
                "compare-ratios")
    show_table(df, "compare-runs", column_config=number_format(df))
