"""Compare runs: each variant against itself in two runs (before / after), ratios from kvprof's compare_groups."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from kvprof.analysis.compare import Benchmark
from kvprof.dashboard import charts, frames
from kvprof.dashboard.state import Context
from kvprof.dashboard.ui import md, show_figure, show_table
from kvprof.dashboard.views.common import device_line, esc, intro, source_label
from kvprof.core.errors import KvprofError
from kvprof.core.rundir import RunDir

RATIOS = ("ratio after/before", "ratio GPU span", "ratio host launch", "ratio kernels/write")


def _identity(ctx: Context, label: str) -> tuple[str, str, float]:
    """(device, model, when) of a run: runs are paired within the same device and model, newest first."""
    run = ctx.open(label)
    s = run.summary()
    dev = s.get("device") or {}
    device = str(dev.get("name") or "unknown device") if isinstance(dev, dict) else "unknown device"
    model = "unknown model"
    rd = RunDir(run.run_dir or run.dir)
    if rd.is_run():
        try:
            model = str(rd.read_manifest().config.get("model") or model)
        except KvprofError:
            pass
    when = Path(run.file(RunDir.SUMMARY)).stat().st_mtime
    return device, model, when


def default_pair(ctx: Context, labels: list[str], cur: str) -> tuple[str | None, str, str]:
    """The two most recent readable runs of the open run's device and model: (before, after, why)."""
    readable = [lab for lab in labels if lab in ctx.uploads or ((e := ctx.entry(lab)) is not None and e.analysed)]
    try:
        ident = {lab: _identity(ctx, lab) for lab in dict.fromkeys([cur, *readable])}
    except KvprofError:
        return None, cur, "the runs could not be read"
    dev, model, _ = ident[cur]
    same = sorted((lab for lab, (d, m, _) in ident.items() if (d, m) == (dev, model)), key=lambda lab: ident[lab][2])
    if len(same) < 2:
        others = sorted((lab for lab in ident if lab != cur), key=lambda lab: ident[lab][2])
        return (others[-1] if others else None), cur, f"{cur} is the only analysed run of {model} on {dev}"
    return same[-2], same[-1], f"the two most recent runs of {model} on {dev}"


def render(ctx: Context) -> None:
    st.subheader("Compare runs")
    intro("Each variant against itself in two runs (before and after a change), by default the two most recent "
          f"runs of the same model and device, at <b>{esc(source_label(ctx.source))}</b>.")
    labels = ctx.labels()
    if not labels:
        st.info("No runs to compare: the traces root has none and nothing was uploaded.")
        return
    cur = ctx.run.label if ctx.run is not None and ctx.run.label in labels else labels[0]
    before0, after0, why = default_pair(ctx, labels, cur)
    if before0 is None:
        st.info(f"Nothing to compare: {md(why)}. Capture another run (or upload a trace, or add a traces root) "
                "and it is paired with this one here.")
        return
    if "only analysed run" in why:
        st.info(f"{md(why)}: no run of the same model and device to pair it with; pick two runs below.")
    else:
        st.caption(f"paired by default: {md(before0)} → {md(after0)} ({md(why)}); pick others below.")
    c1, c2, c5 = st.columns([2, 2, 1])
    before = c1.selectbox("before", labels, index=labels.index(before0), key="cmp-before")
    after = c2.selectbox("after", labels, index=labels.index(after0), key="cmp-after")
    layers = int(c5.number_input("layers per decode step", min_value=1, max_value=1000, value=Benchmark().layers,
                                 key="cmp-layers"))
    if before == after:
        st.info("Before and after are the same run: pick two different runs.")
        return
    sums = {}
    for lab in (before, after):
        try:
            sums[lab] = ctx.open(lab).summary()
        except KvprofError as exc:
            st.error(f"Cannot open {md(lab)}: {md(exc)}")
            return
    b_sum, a_sum = sums[before], sums[after]
    bg, ag = frames.groups_frame(b_sum), frames.groups_frame(a_sum)
    st.caption(f"before: **{md(before)}** · {device_line(b_sum)} — after: **{md(after)}** · {device_line(a_sum)}")
    bvars, avars = frames.variants_in(b_sum, bg), frames.variants_in(a_sum, ag)
    pairs = [(v, v) for v in bvars if v in avars and (not ctx.variants or v in ctx.variants)]
    if not pairs:
        st.info("The two runs have no variant in common (with the sidebar's variant filter).")
        return
    bench = Benchmark()
    df, warns = frames.compare_runs(bg, ag, pairs, layers, bench.itl_before_ms, bench.itl_after_ms)
    if ctx.source:
        df = df[df["source"] == ctx.source]
    for w in warns:
        st.info(md(w))
    src = source_label(ctx.source)
    show_figure(charts.before_after(df, f"GPU µs per write: {before} → {after} · {src}"), "compare-before-after")
    have = [c for c in RATIOS if df[c].notna().any()]
    if have:
        col = st.selectbox("ratio", have, key="cmp-ratio")
        show_figure(charts.ratio_bars(df, col, f"{col}: {after} over {before} · {src}"), "compare-ratios")
    else:
        st.info("No ratio after/before: neither run has a number both can be divided by at this source.")
    show_table(df, "compare-runs")
