"""Sweeps: time per write against tokens (log-log) per variant, with the bandwidth floor lines."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from kvprof.core.errors import Setting, Words
from kvprof.core.rundir import RunDir
from kvprof.dashboard import charts, data, frames, landing
from kvprof.dashboard.settings import setting_names
from kvprof.dashboard.state import Context
from kvprof.dashboard.tables import labelled
from kvprof.dashboard.ui import md, show_figure, show_table
from kvprof.dashboard.views.common import intro, source_label


def _run_sweep(ctx: Context) -> None:
    assert ctx.run is not None
    summary = ctx.summary()
    st.markdown(f"#### From the run's groups · {md(ctx.run.label)}")
    pts = frames.sweep_from_groups(ctx.groups(), ctx.variants, ctx.source, frames.interpreted_variants(summary))
    phases = sorted(pts["phase"].unique()) if len(pts) else []
    if not phases:
        st.info(f"No (phase, size) of this run has a time per write at {md(source_label(ctx.source, summary))} "
                "(a CPU-only trace's profiler has none, or no measured writes).")
        return
    phase = st.radio("phase", phases, horizontal=True, key=f"sw-phase::{ctx.run.label}")
    p = pts[pts["phase"] == phase].rename(columns={"us_per_write": "us"})
    if p["tokens"].nunique() < 2:
        st.info(f"{md(phase)}: one size only ({int(p['tokens'].iloc[0])} tokens); a sweep needs several "
                + Words("(capture ", Setting("decode_sizes"), " 1,10,64 / ", Setting("prefill_sizes"),
                        " ...).").render(setting_names()))
    dev = summary.get("device") or {}
    rates = {f"floor at peak {dev['peak_bandwidth_gbs']:,.0f} GB/s": dev.get("peak_bandwidth_gbs")} \
        if dev.get("peak_bandwidth_gbs") else {}
    if dev.get("copy_rate_gbs"):
        rates[f"measured copy rate {dev['copy_rate_gbs']:,.0f} GB/s"] = dev["copy_rate_gbs"]
    wb = frames.write_bytes(frames.measured_writes(ctx.writes(), ctx.variants))  # bytes per write: any source
    floors = frames.floor_lines(wb[wb["tokens"].isin(p["tokens"])], rates)
    if not rates:
        st.caption("the device's peak bandwidth is unknown here: no floor line")
    timing = landing.timing(summary, ctx.source)
    show_figure(charts.sweep(p, floors, f"{phase}: {timing.per_write} vs tokens · {timing.words}", timing.per_write),
                f"sweep-run-{phase}")
    show_table(p, f"sweep-run-{ctx.run.label}-{phase}",
               text=labelled(p, {"us": "figure", "gpu_span_us": "figure"}, {"bandwidth_gbs": "figure"}))


def _bench_files(ctx: Context) -> dict[str, tuple[Path, Path]]:
    """label -> (folder it was found under, file): the traces root's bench results first, then
    those `kvprof bench` wrote without --out (~/.cache/kvprof/bench), labelled with that folder."""
    out: dict[str, tuple[Path, Path]] = {}
    for i, where in enumerate(data.bench_roots(ctx.root)):
        for f in data.discover_bench(where):
            rel = f.relative_to(where).as_posix()
            out[rel if i == 0 and ctx.root is not None else f"{data.root_label(where)}/{rel}"] = (where, f)
    return out


def _bench_sweep(ctx: Context) -> None:
    st.markdown(f"#### From kvprof bench results ({RunDir.BENCH} under the root and in kvprof bench's own folder)")
    found = _bench_files(ctx)
    if not found:
        where = f"under {md(ctx.root)} or " if ctx.root is not None else ""
        st.info(f"No {RunDir.BENCH} {where}in {md(data.root_label(data.bench_cache_root()))}, where "
                + Words("`python -m kvprof bench` writes its results (or under this root with `", Setting("out"),
                        " ROOT/bench-NAME`).").render(setting_names()))
        return
    labels = {lab: f for lab, (_, f) in found.items()}
    root_r = ctx.root.resolve() if ctx.root is not None else None
    # the root's files, then kvprof bench's own folders newest first (named by UTC time)
    order = [lab for lab, (w, _) in found.items() if w == root_r]
    order += sorted((lab for lab, (w, _) in found.items() if w != root_r), reverse=True)
    chosen = st.multiselect("bench files", order, default=order[:1], key="sw-bench-files")
    docs: dict[str, dict] = {}
    for lab in chosen:
        try:
            f = data.contained(found[lab][0], labels[lab])
            docs[lab] = data.read_bench(str(f), data.stamp(f))
        except data.DashboardError as exc:
            st.error(f"{md(lab)}: {md(exc)}")
    if not docs:
        return
    recs = frames.bench_frame(docs)
    show_table(frames.bench_limits(docs), "bench-limits", caption="limits measured by each bench run")
    ok = recs[recs["status"] == "ok"]
    if ok.empty:
        st.warning("These bench files have no successful measurement.")
    else:
        c1, c2, c3 = st.columns(3)
        shape = c1.selectbox("row shape (heads x dim; MLA: latent)",
                             sorted(ok["shape"].dropna().unique()), key="sw-shape")
        dtype = c2.selectbox("dtype (cache<-input)", sorted(ok["dtype"].dropna().unique()), key="sw-dtype")
        modes = sorted(ok["mode"].dropna().unique(), key=lambda m: (m != "graph", m))  # graph replays first
        mode = c3.radio("mode", modes, horizontal=True, key="sw-mode")
        sel = ok[(ok["shape"] == shape) & (ok["dtype"] == dtype) & (ok["mode"] == mode)]
        names = sorted(sel["variant"].dropna().unique())
        # keyed by the names offered: another shape or dtype (e.g. another cache layout's
        # writers) starts from all of its own variants, not from the previous selection
        chosen = st.multiselect("bench variants", names, default=names, key=f"sw-bench-variants::{'|'.join(names)}")
        sel = sel[sel["variant"].isin(chosen)]
        pts = sel.rename(columns={"median_us": "us"})
        floors = []
        hlines: dict[str, float] = {}
        for lab, doc in docs.items():
            lim = doc.get("limits") or {}
            rate = lim.get("copy_rate_gbs")
            pairs = sel[sel["file"] == lab][["tokens", "bytes"]]
            name = f"measured copy rate {rate:,.0f} GB/s ({Path(lab).parent.name or lab})" if rate else ""
            floors.append(frames.floor_lines(pairs, {name: rate} if rate else {}))
            if lim.get("empty_kernel_us"):
                hlines[f"empty kernel node {lim['empty_kernel_us']:.2f} µs"] = float(lim["empty_kernel_us"])
            if lim.get("empty_pdl_kernel_us"):  # the floor of writes launched with PDL
                hlines[f"empty PDL kernel node {lim['empty_pdl_kernel_us']:.2f} µs"] = float(lim["empty_pdl_kernel_us"])
        target = sel.dropna(subset=["target_us"]).groupby("tokens", as_index=False)["target_us"].first()
        if len(target):  # kvprof bench's target for the fused writes: 1.2 µs + bytes / (0.9 x copy rate)
            floors.append(pd.DataFrame({"line": "target for fused writes", "tokens": target["tokens"],
                                        "us": target["target_us"]}))
        fl = pd.concat([f for f in floors if len(f)], ignore_index=True) if any(len(f) for f in floors) else \
            pd.DataFrame(columns=["line", "tokens", "us"])
        show_figure(charts.sweep(pts, fl, f"bench: µs per write vs tokens · {shape} {dtype} · {mode}",
                                 hlines=hlines, symbol="file" if len(docs) > 1 else None),
                    f"sweep-bench-{shape}-{mode}")
    show_table(recs, "bench-records", text=labelled(recs, {"median_us": "figure", "iqr_us": "figure"},
                                                    {"gbs": "figure", "pct_copy_rate": "figure"}))


def render(ctx: Context) -> None:
    st.subheader("Sweeps")
    intro("How the time of one write grows with the tokens it writes, per variant, against the time its bytes "
          "take at the device's bandwidth: from the open run's sizes and from kvprof bench results.")
    if ctx.run is not None:
        _run_sweep(ctx)
    else:
        st.info("No run is open: only bench results are shown.")
    _bench_sweep(ctx)
