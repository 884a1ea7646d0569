"""Overview: the landing view (fused or not, cost per write, saving per step, share; one source), then detail."""

from __future__ import annotations

import streamlit as st

from kvprof.analysis.compare import Benchmark
from kvprof.core.errors import Setting, Words
from kvprof.dashboard import frames, landing, memo
from kvprof.dashboard.settings import setting_names
from kvprof.dashboard.state import Context
from kvprof.dashboard.tables import landing_table, observer_table, overview_table
from kvprof.dashboard.ui import md, show_figure, show_table
from kvprof.dashboard.views.common import device_line, esc, intro, need_run, no_gpu_traces


def _report_html(ctx: Context, land: landing.Landing) -> bytes:
    from kvprof.dashboard.html_report import render

    return render(land, setting_names()).encode()


def render(ctx: Context) -> None:
    """Headline and its two charts first (what a visitor came for), then the tables and the detail."""
    if not need_run(ctx):
        return
    assert ctx.run is not None
    summary = ctx.summary()
    groups = ctx.groups()
    timing = landing.timing(summary, ctx.source)
    src = timing.words
    st.subheader(f"Overview · {md(ctx.run.label)}")
    where = "on the GPU" if timing.gpu else f"by the {timing.how}"
    intro(f"Per variant: fused or not, what one KV write costs {where} and what it saves per decode step, "
          f"measured by <b>{esc(src)}</b>.")
    st.caption(f"{device_line(summary)} · input: {md(summary.get('input_kind'))} · "
               f"{len(summary.get('traces') or [])} trace file(s) · kvprof {md(summary.get('kvprof_version'))}")
    cpu_only = no_gpu_traces(summary)
    if cpu_only:
        st.warning(f"{len(cpu_only)} trace(s) have no GPU events (CPU-only capture): GPU columns are empty and only "
                   "host-side numbers are shown. " + ", ".join(md(p.rsplit('/', 1)[-1]) for p in cpu_only))
    warns = summary.get("warnings") or []
    if warns:
        with st.expander(f"analyze reported {len(warns)} warning(s)"):
            st.markdown("\n".join(f"- {md(w)}" for w in warns))  # one element, not one per warning

    _engine_traces(ctx, summary)
    all_variants = frames.variants_in(summary, groups)
    chosen = [v for v in all_variants if v in ctx.variants]
    if not chosen:
        st.warning("No variant is chosen in the sidebar.")
        return
    default_base = landing.default_baseline(summary, all_variants) or all_variants[0]
    comp0 = summary.get("comparison") or {}
    bench = Benchmark()
    with st.expander("baseline and projection", expanded=False):
        c1, c2, c3, c4 = st.columns(4)
        baseline = c1.selectbox("baseline", all_variants, index=all_variants.index(default_base), key="ov-baseline",
                                help=f"the variant the others are compared with (analyze used "
                                     f"{md(comp0.get('baseline') or 'none')})")
        layers = int(c2.number_input("layers per decode step", min_value=1, max_value=1000,
                                     value=int(comp0.get("layers") or bench.layers), key="ov-layers",
                                     help="the projection: layers x (baseline - variant) GPU cost per write"))
        itl_b = float(c3.number_input("ITL before, ms", min_value=0.01, value=bench.itl_before_ms, key="ov-itl-before"))
        itl_a = float(c4.number_input("ITL after (measured), ms", min_value=0.01, value=bench.itl_after_ms,
                                      key="ov-itl-after"))
    settings = memo.Settings(ctx.source, tuple(chosen), baseline, layers, itl_b, itl_a)
    land = memo.landing_for(ctx.run, settings)

    st.markdown(f"**{md(land.headline)}**")
    for name, fig in land.figures:
        show_figure(fig, f"landing-{name}-{ctx.run.label}")
    for n in land.notes:
        st.caption(md(n))
    show_table(landing_table(land.frame, land.timing), f"landing-{ctx.run.label}",
               caption=f"the numbers behind the chart{'s' if len(land.figures) > 1 else ''} · {src}")
    st.download_button("Download this view as an HTML report", data=lambda: _report_html(ctx, land),
                       file_name=f"kvprof-report-{ctx.run.label.replace('/', '-')}.html", mime="text/html",
                       key="landing-report", on_click="ignore",
                       help=Words("self-contained (Plotly inlined): the same as `kvprof report RUN ", Setting("html"),
                                  " OUT.html`").render(setting_names()))

    st.markdown("#### Fused or fell back")
    show_table(land.verdicts, f"verdicts-{ctx.run.label}")

    obs = frames.observer_frame(summary)
    if len(obs):
        st.markdown("#### Observer effect")
        st.caption("Each profiler's reading over the unprofiled reference (the same steps, no profiler, "
                   f"{landing.timing(summary, 'reference').how}); 'profiled run / reference' is how much the "
                   "profiler slowed the run itself. "
                   f"More than {round((summary.get('observer') or {}).get('threshold', 0.1) * 100)} % off is "
                   "flagged; the landing view uses the reference by default.")
        show_table(obs, f"observer-{ctx.run.label}", text=observer_table(obs))

    detail = memo.detail_for(ctx.run, settings)
    if detail is None:
        st.info(f"No measured writes for the chosen variants at {md(src)}.")
        return
    for w in detail.warnings:
        st.info(md(w))
    st.markdown("#### Per variant and phase")
    table = detail.table.rename(columns={"GPU µs/write": timing.per_write_short})
    show_table(table, f"overview-{ctx.run.label}", text=overview_table(table, timing.per_write_short),
               caption=f"medians per write · {src}")
    metrics = list(frames.GROUP_METRICS)
    has_gpu = detail.table["GPU µs/write"].notna().any()
    metric = st.selectbox("chart", metrics, index=0 if has_gpu else metrics.index("host launch µs per write"),
                          key="ov-metric")
    show_figure(memo.metric_for(ctx.run, settings, metric, bool(cpu_only)), f"overview-{metric}")
    show_figure(detail.speedup, f"speedup-vs-{baseline}")


def _engine_traces(ctx: Context, summary: dict) -> None:  # type: ignore[type-arg]
    """An engine's own traces (no kvprof ranges): write kernels per step and layer, how the steps were found."""
    from kvprof.dashboard.engine_view import engine_views

    assert ctx.run is not None
    for v in engine_views(summary):
        st.markdown(f"#### Engine trace {md(v.trace)} (rank {md(v.rank)}): KV writes per step and layer")
        if v.reason:
            st.info(md(v.reason))
        for n in v.notes:
            st.caption(md(n))
        fig = v.figure()
        if fig is not None:
            show_figure(fig, f"engine-{v.trace}-{ctx.run.label}")
        if len(v.steps):
            show_table(v.steps, f"engine-steps-{v.trace}-{ctx.run.label}", caption="steps")
        if len(v.step_layer):
            show_table(v.step_layer, f"engine-layers-{v.trace}-{ctx.run.label}", caption="write µs per step and layer")
