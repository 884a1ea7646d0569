"""Compare runs: each variant against itself in two runs (before / after), ratios from kvprof's compare_groups.

Runs pair by when they were captured (the manifest's ``captured_at``), never by when their
files were last written: analysing an old run again must not make it the "after" one. A
run whose capture time is unknown (an upload, a run from before kvprof recorded it) is
not ordered; the page says so and leaves the order to the reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pandas as pd
import streamlit as st

from kvprof.analysis.compare import Benchmark
from kvprof.core.errors import KvprofError
from kvprof.core.run import Manifest, captured_text
from kvprof.core.rundir import RunDir
from kvprof.dashboard import charts, frames, landing
from kvprof.dashboard.state import Context
from kvprof.dashboard.tables import compare_table
from kvprof.dashboard.ui import md, show_figure, show_table
from kvprof.dashboard.views.common import device_line, esc, intro, source_label

RATIOS = ("ratio after/before", "ratio GPU span", "ratio host launch", "ratio kernels/write")


@dataclass(frozen=True)
class RunIdentity:
    """What pairs runs: device and model (runs pair within them) and the capture time (orders them)."""

    device: str
    model: str
    captured: datetime | None
    captured_text: str
    manifest: Manifest | None = None


def _identity(ctx: Context, label: str) -> RunIdentity:
    run = ctx.open(label)
    s = run.summary()
    dev = s.get("device") or {}
    device = str(dev.get("name") or "unknown device") if isinstance(dev, dict) else "unknown device"
    model = "unknown model"
    manifest = None
    rd = RunDir(run.run_dir) if run.run_dir is not None else None
    if rd is not None and rd.is_run():
        try:
            manifest = rd.read_manifest()
            model = str(manifest.config.get("model") or model)
        except KvprofError:
            manifest = None
    return RunIdentity(device, model, manifest.captured if manifest else None, captured_text(manifest), manifest)


def pair_by_capture(ident: dict[str, RunIdentity], cur: str) -> tuple[str | None, str, str]:
    """(before, after, why): the open run and the capture of its device and model next to it in
    time -- the one after it, or the one before when it is the latest -- in the order they were
    captured; where capture times are unknown, why the order is not known."""
    dev, model = ident[cur].device, ident[cur].model
    same = [lab for lab, i in ident.items() if (i.device, i.model) == (dev, model)]
    timed = sorted((lab for lab in same if ident[lab].captured is not None),
                   key=lambda lab: ident[lab].captured)  # type: ignore[arg-type, return-value]
    if len(timed) >= 2 and cur in timed:
        i = timed.index(cur)
        if i == len(timed) - 1:
            return timed[i - 1], cur, f"{cur} and the capture of {model} on {dev} before it, by capture time"
        return cur, timed[i + 1], f"{cur} and the capture of {model} on {dev} after it, by capture time"
    if len(same) < 2:
        others = [lab for lab in ident if lab != cur]
        return (others[-1] if others else None), cur, f"{cur} is the only analysed run of {model} on {dev}"
    unknown = [lab for lab in same if ident[lab].captured is None]
    other = next(lab for lab in same if lab != cur)
    return other, cur, (f"runs of {model} on {dev}; capture time unknown for {', '.join(unknown)}, so which came "
                        "first is not known: check before and after")


def default_pair(ctx: Context, labels: list[str], cur: str) -> tuple[str | None, str, str, dict[str, RunIdentity]]:
    """pair_by_capture over the readable runs, and the identities it read."""
    readable = [lab for lab in labels if lab in ctx.uploads or ((e := ctx.entry(lab)) is not None and e.analysed)]
    try:
        ident = {lab: _identity(ctx, lab) for lab in dict.fromkeys([cur, *readable])}
    except KvprofError:
        return None, cur, "the runs could not be read", {}
    return (*pair_by_capture(ident, cur), ident)


def render(ctx: Context) -> None:
    st.subheader("Compare runs")
    intro("Each variant against itself in two runs (before and after a change), by default the open run and the "
          "capture of the same model and device next to it, in the order they were captured, at "
          f"<b>{esc(source_label(ctx.source))}</b>.")
    labels = ctx.labels()
    if not labels:
        st.info("No runs to compare: the traces root has none and nothing was uploaded.")
        return
    cur = ctx.run.label if ctx.run is not None and ctx.run.label in labels else labels[0]
    before0, after0, why, ident = default_pair(ctx, labels, cur)
    if before0 is None:
        st.info(f"Nothing to compare: {md(why)}. Capture another run (or upload a trace, or add a traces root) "
                "and it is paired with this one here.")
        return
    _say_default_pair(before0, after0, why)
    c1, c2, c5 = st.columns([2, 2, 1])
    before = c1.selectbox("before", labels, index=labels.index(before0), key="cmp-before")
    after = c2.selectbox("after", labels, index=labels.index(after0), key="cmp-after")
    layers = int(c5.number_input("layers per decode step", min_value=1, max_value=1000, value=Benchmark().layers,
                                 key="cmp-layers"))
    if before == after:
        st.info("Before and after are the same run: pick two different runs.")
        return
    sums = _summaries(ctx, [before, after])
    if sums is None:
        return
    b_sum, a_sum = sums
    bg, ag = frames.groups_frame(b_sum), frames.groups_frame(a_sum)
    for lab in (before, after):
        if lab not in ident:
            ident[lab] = _identity(ctx, lab)
    bi, ai = ident[before], ident[after]
    st.caption(f"before: **{md(before)}** ({md(bi.captured_text)}) · {device_line(b_sum)} — after: **{md(after)}** "
               f"({md(ai.captured_text)}) · {device_line(a_sum)}")
    if bi.captured is not None and ai.captured is not None and bi.captured > ai.captured:
        st.warning(f"{md(before)} was captured after {md(after)}: before and after are the other way round.")
    for why_not in _not_comparable(b_sum, a_sum, bg, ag, bi, ai):
        st.warning(f"not comparable: {md(why_not)}")
    bvars, avars = frames.variants_in(b_sum, bg), frames.variants_in(a_sum, ag)
    pairs = [(v, v) for v in bvars if v in avars and (not ctx.variants or v in ctx.variants)]
    if not pairs:
        st.info("The two runs have no variant in common (with the sidebar's variant filter).")
        return
    bench = Benchmark()
    df, warns = frames.compare_runs(bg, ag, pairs, layers, bench.itl_before_ms, bench.itl_after_ms,
                                    (frames.interpreted_variants(b_sum), frames.interpreted_variants(a_sum)))
    if ctx.source:
        df = df[df["source"] == ctx.source]
    for w in warns:
        st.info(md(w))
    _show_comparison(ctx, df, b_sum, a_sum, before, after)


def _say_default_pair(before: str, after: str, why: str) -> None:
    """Which runs are paired by default and why; a warning when their order is not known."""
    if "only analysed run" in why:
        st.info(f"{md(why)}: no run of the same model and device to pair it with; pick two runs below.")
    elif "unknown" in why:
        st.warning(f"paired by default: {md(before)} → {md(after)} ({md(why)}); pick others below.")
    else:
        st.caption(f"paired by default: {md(before)} → {md(after)} ({md(why)}); pick others below.")


def _summaries(ctx: Context, labels: list[str]) -> list[dict[str, Any]] | None:
    """Each run's summary, or None (and the error shown) at the first that cannot be opened."""
    sums = []
    for lab in labels:
        try:
            sums.append(ctx.open(lab).summary())
        except KvprofError as exc:
            st.error(f"Cannot open {md(lab)}: {md(exc)}")
            return None
    return sums


def _show_comparison(ctx: Context, df: pd.DataFrame, b_sum: dict[str, Any], a_sum: dict[str, Any], before: str,
                     after: str) -> None:
    """Before/after per variant, the chosen ratio, and the table, timed as the source says."""
    timing = landing.timing(b_sum, ctx.source)
    if timing.clock is None:  # the before run has no such source: say how the after run timed it
        timing = landing.timing(a_sum, ctx.source)
    src = timing.words
    show_figure(charts.before_after(df, f"{timing.per_write}: {before} → {after} · {src}"), "compare-before-after")
    have = [c for c in RATIOS if df[c].notna().any()]
    if have:
        col = st.selectbox("ratio", have, key="cmp-ratio")
        show_figure(charts.ratio_bars(df, col, f"{col}: {after} over {before} · {src}"), "compare-ratios")
    else:
        st.info("No ratio after/before: neither run has a number both can be divided by at this source.")
    show_table(df, "compare-runs", text=compare_table(df))


def _not_comparable(b_sum: dict, a_sum: dict, bg, ag, bi: RunIdentity, ai: RunIdentity) -> list[str]:  # noqa: ANN001
    """What makes the two runs measure different things (kvprof compare's check), one line each."""
    from kvprof.analysis.gate import GateRun, comparability
    from kvprof.core.summary import Summary

    try:
        sides = [GateRun(groups=g, summary=Summary.from_json(s), manifest=i.manifest)
                 for g, s, i in ((bg, b_sum, bi), (ag, a_sum, ai))]
    except ValueError:
        return []
    return comparability(*sides)[0]
