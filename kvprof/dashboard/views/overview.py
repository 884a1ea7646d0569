"""Overview: per variant what a write costs, fused or not, and what it saves per decode step."""

from __future__ import annotations

import streamlit as st

from kvprof.dashboard import charts, frames
from kvprof.dashboard.state import Context
from kvprof.dashboard.ui import md, number_format, show_figure, show_table
from kvprof.dashboard.views.common import device_line, need_run, no_gpu_traces
from kvprof.analysis.compare import Benchmark


def render(ctx: Context) -> None:
    if not need_run(ctx):
        return
    assert ctx.run is not None
    summary = ctx.summary()
    groups = ctx.groups()
    st.subheader(f"Overview · {md(ctx.run.label)}")
    st.caption(f"{device_line(summary)} · input: {md(summary.get('input_kind'))} · "
               f"{len(summary.get('traces') or [])} trace file(s) · kvprof {md(summary.get('kvprof_version'))}")
    cpu_only = no_gpu_traces(summary)
    if cpu_only:
        st.warning(f"{len(cpu_only)} trace(s) have no GPU events (CPU-only capture): GPU columns are empty and only "
                   "host-side numbers are shown. " + ", ".join(md(p.rsplit('/', 1)[-1]) for p in cpu_only))
    warns = summary.get("warnings") or []
    if warns:
        with st.expander(f"analyze reported {len(warns)} warning(s)"):
            for w in warns:
                st.markdown(f"- {md(w)}")

    st.markdown("#### Fused or fell back")
    show_table(frames.verdicts_frame(summary), f"verdicts-{ctx.run.label}")

    all_variants = frames.variants_in(summary, groups)
    chosen = [v for v in all_variants if v in ctx.variants]
    g = groups[groups["variant"].astype(str).isin(chosen)]
    if ctx.source:
        g = g[g["source"].astype(str) == ctx.source]
    if g.empty:
        st.warning("No measured writes for the chosen variants and source.")
        return

    comp0 = summary.get("comparison") or {}
    default_base = comp0.get("baseline") if comp0.get("baseline") in all_variants else (
        "two_stream" if "two_stream" in all_variants else all_variants[0])
    bench = Benchmark()
    c1, c2, c3, c4 = st.columns(4)
    baseline = c1.selectbox("baseline", all_variants, index=all_variants.index(default_base), key="ov-baseline",
                            help="the variant the others are compared with (analyze used "
                                 f"{md(comp0.get('baseline') or 'none')})")
    layers = int(c2.number_input("layers per decode step", min_value=1, max_value=1000,
                                 value=int(comp0.get("layers") or bench.layers), key="ov-layers",
                                 help="the projection: layers x (baseline - variant) GPU cost per write"))
    itl_b = float(c3.number_input("ITL before, ms", min_value=0.01, value=bench.itl_before_ms, key="ov-itl-before"))
    itl_a = float(c4.number_input("ITL after (measured), ms", min_value=0.01, value=bench.itl_after_ms,
                                  key="ov-itl-after"))
    comp = frames.comparison(groups, baseline, layers, itl_b, itl_a, prefer=frames.fused_variants(summary),
                             source_order=summary.get("trusted_sources"))
    table = frames.overview_frame(g, comp, summary, baseline)

    head = comp.get("headline")
    if head and head["variant"] in chosen:
        m1, m2, m3 = st.columns(3)
        how = ("measured: the baseline's decoder-layer step minus this variant's" if head.get("measured")
               else f"projected: {layers} layers x cost difference per write")
        m1.metric(f"{md(head['variant'])} saves per decode step ({md(head['source'])}, bs={md(head['size'])})",
                  f"{head['saving_per_step_ms']:.3f} ms", help=f"{how}; source: {head['source']}")
        m2.metric("predicted inter-token latency", f"{head['predicted_itl_ms']:.2f} ms",
                  delta=f"{head['predicted_itl_ms'] - itl_b:+.2f} ms vs {itl_b:.2f}", delta_color="inverse")
        m3.metric("measured by the benchmark", f"{itl_a:.2f} ms", delta=f"{itl_a - itl_b:+.2f} ms",
                  delta_color="inverse", help=comp["benchmark"]["label"])
    for w in comp.get("warnings") or []:
        st.info(md(w))

    obs = frames.observer_frame(summary)
    if len(obs):
        st.markdown("#### Observer effect")
        st.caption("Each profiler's reading over the unprofiled reference (the same steps, no profiler, CUDA "
                   "events); 'profiled run / reference' is how much the profiler slowed the run itself. "
                   f"More than {round((summary.get('observer') or {}).get('threshold', 0.1) * 100)} % off is "
                   "flagged; headline figures come from the reference.")
        show_table(obs, f"observer-{ctx.run.label}", column_config=number_format(obs))

    st.markdown("#### Per variant and phase")
    show_table(table, f"overview-{ctx.run.label}", column_config=number_format(table))

    metrics = list(frames.GROUP_METRICS)
    has_gpu = table["GPU µs/write"].notna().any()
    metric = st.selectbox("chart", metrics, index=0 if has_gpu else metrics.index("host launch µs per write"),
                          key="ov-metric")
    show_figure(charts.metric_bars(frames.group_metric_frame(g, metric), metric,
                                   f"{metric} · {ctx.source or 'all sources'}"), f"overview-{metric}")
    show_figure(charts.speedup_bars(table, baseline), f"speedup-vs-{baseline}")
