"""Plotly figure builders: a DataFrame in, a go.Figure out, no Streamlit.

Pure so they are tested without a server and reused by the HTML report and the benchmark.
Rules every chart follows (the browser test checks them):

- a variant's colour is ``kvprof.core.variants.colour`` on every chart, and every trace of
  a variant carries ``legendgroup=variant`` so the colour can be checked per variant;
- axis ranges are set from the measured values (a small margin around them); reference
  limits are lines inside that range: the line is a shape and its label a legend entry of
  the same ``name`` in the line's colour and dash, never text over the bars and lines;
- decode and prefill are never on one linear axis (one panel per phase); a panel whose
  values span more than SPREAD_LOG (20x) is drawn on a log axis, so that small bars
  beside large ones stay visible (a CPU run's copies beside the Triton interpreter);
- several variants' lines differ in dash and marker as well as colour (two that measure
  the same lie on one another); sizes in the overlap charts each have a colour;
- legends sit right of the plot, never over the title; log axes get 1-2-5 ticks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TypedDict

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvprof.analysis.figures import INTERPRETED, MARK, MEASURED, NEGATIVE, NEGATIVE_WHY, NOISE, NOT_APPLICABLE
from kvprof.core import variants as V
from kvprof.dashboard.axes import (  # noqa: F401 (MARGIN: tests)
    LIMIT_COLOURS,
    LIMIT_DASHES,
    MARGIN,
    limit_line,
    lin_range,
    log_range,
    log_ticks,
    set_y,
    wide_spread,
)
from kvprof.dashboard.frames import HOST_LANE, NOT_IN_WRITE, WRITES_LANE

NEUTRAL = "#9aa0a6"
SYMBOLS = ("circle", "diamond", "square", "x")  # marker per phase and size in the overlap scatter
# one colour per phase and size in the overlap charts (Paul Tol's bright scheme): decode batch 1,
# 10 and 64 were one blue, indistinguishable in the scatter and stacked alike in the histogram
SIZE_COLOURS = ("#4477aa", "#228833", "#ccbb44", "#66ccee", "#aa3377", "#ee6677", "#bbbbbb")
# lines of several variants (sweeps, by layer): each its own dash and open marker, so a line drawn
# exactly over another (triton_fused and store_kv_fused run one kernel) still shows both
LINE_DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
LINE_MARKERS = ("circle", "diamond-open", "square-open", "triangle-up-open", "x-thin-open", "star-open",
                "hexagon-open", "cross-thin-open")
HEIGHT = 420
LIMIT_REACH = 4.0  # a limit line within this factor of the data widens the range to show it


def variant_colors(names: Iterable[object]) -> dict[str, str]:
    """One colour per variant, from kvprof's variant table: the same on every page and export."""
    out = {str(v): V.colour(str(v)) for v in names if str(v) != NOT_IN_WRITE}
    out[NOT_IN_WRITE] = NEUTRAL
    return out


def ordered_variants(names: Iterable[object]) -> list[str]:
    return V.ordered([str(n) for n in names])


def line_style(i: int, dash: bool = True) -> tuple[dict[str, object], dict[str, object]]:
    """(line, marker) keywords of the i-th variant on a chart of lines: its dash and marker."""
    marker = {"symbol": LINE_MARKERS[i % len(LINE_MARKERS)], "size": 6 + 2 * (i % 3), "line": {"width": 1.5}}
    return ({"dash": LINE_DASHES[i % len(LINE_DASHES)]} if dash else {}), marker


def size_colours(labels: Iterable[object]) -> dict[str, str]:
    """A distinct colour per phase·size label, in the order given."""
    out: dict[str, str] = {}
    for lab in labels:
        out.setdefault(str(lab), SIZE_COLOURS[len(out) % len(SIZE_COLOURS)])
    return out


def empty_figure(message: str, title: str | None = None) -> go.Figure:
    """A figure that says why it is empty, instead of a blank axis."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 14})
    fig.update_layout(title=title, height=240, xaxis={"visible": False}, yaxis={"visible": False},
                      meta={"empty": message})
    return fig


def _layout(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0, "xanchor": "left", "font": {"size": 15}}, height=height,
                      margin={"l": 10, "r": 10, "t": 56, "b": 10}, template="plotly_white",
                      legend={"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top",
                              "title": {"text": ""}, "tracegroupgap": 2})
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


def _phases(df: pd.DataFrame) -> list[str]:
    order = {"decode": 0, "prefill": 1}
    return sorted(df["phase"].astype(str).unique(), key=lambda p: (order.get(p, 2), p))


def _phase_panels(phases: list[str], widths: list[int] | None = None, titles: bool = True) -> go.Figure:
    if len(phases) <= 1:
        return go.Figure()
    return make_subplots(rows=1, cols=len(phases), subplot_titles=phases if titles else None,
                         column_widths=widths, horizontal_spacing=0.08)


class _Cell(TypedDict, total=False):
    """The subplot of phase j (row/col keywords of Plotly's add_trace and kvprof's set_y)."""

    row: int
    col: int


def _kw(phases: list[str], j: int) -> _Cell:
    return {"row": 1, "col": j + 1} if len(phases) > 1 else {}


# ---------------------------------------------------------------------------- the one rule

# why a figure is not drawn, by its kind (kvprof.analysis.figures)
NOT_DRAWN_WHY = {NEGATIVE: f"n/a ({NEGATIVE_WHY})", NOISE: "noise (within its spread, or no spread to judge it)",
                 NOT_APPLICABLE: "n/a"}
INTERPRETED_CHART_NOTE = (f"{MARK} hatched: ran in Triton's interpreter on the host (a CPU run), the interpreter's "
                          "time, not a kernel's")


def trusted_rows(df: pd.DataFrame, kind: str = "figure", derived: bool = False
                 ) -> tuple[pd.DataFrame, list[str], set[str]]:
    """The one rule (kvprof.analysis.figures) for a chart's rows: (the rows it may draw, a note per
    kind of row it may not or draws marked, the variants drawn marked). A negative, noise or n/a
    figure is never drawn; an interpreted one is drawn hatched and marked ``*`` -- unless
    ``derived`` (a ratio or rate computed from the time), which is n/a then. A frame without the
    ``kind`` column is drawn as it is."""
    if kind not in df.columns or df.empty:
        return df, [], set()
    ok = [MEASURED] if derived else [MEASURED, INTERPRETED]
    notes = []
    for k in (INTERPRETED, NEGATIVE, NOISE, NOT_APPLICABLE):
        names = ordered_variants(df[df[kind] == k]["variant"].unique())
        if not names:
            continue
        if k in ok:
            notes.append(f"{INTERPRETED_CHART_NOTE}: {', '.join(names)}")
        else:
            why = "n/a (interpreted: nothing is derived from the interpreter's time)" if k == INTERPRETED \
                else NOT_DRAWN_WHY[k]
            notes.append(f"not drawn, {why}: {', '.join(names)}")
    interp = set(df[df[kind] == INTERPRETED]["variant"].astype(str)) if INTERPRETED in ok else set()
    return df[df[kind].isin(ok)], notes, interp


def with_notes(fig: go.Figure, notes: list[str]) -> go.Figure:
    """The chart's notes of the one rule under its title (and in ``meta["figure_notes"]``)."""
    if not notes:
        return fig
    title = fig.layout.title.text or ""
    fig.update_layout(title_text=title + "".join(f"<br><sup>{n}</sup>" for n in notes),
                      margin={"t": 56 + 18 * len(notes)}, meta={**(fig.layout.meta or {}), "figure_notes": notes})
    return fig


def mark_interpreted(fig: go.Figure, interpreted: Iterable[str]) -> go.Figure:
    """Each trace of an interpreted variant (its ``legendgroup``) named with ``*``, and the note: for
    charts of per-write values, where no bar can be hatched (boxes, violins, lines)."""
    interp = {str(v) for v in interpreted}
    drawn = [t for t in fig.data if getattr(t, "legendgroup", None) in interp]
    for t in drawn:
        if t.name and not str(t.name).startswith(f"{t.legendgroup} {MARK}"):
            t.name = f"{t.legendgroup} {MARK}" + str(t.name)[len(t.legendgroup):]
    names = ordered_variants({str(t.legendgroup) for t in drawn})
    return with_notes(fig, [f"{INTERPRETED_CHART_NOTE}: {', '.join(names)}".replace(" hatched", "")] if names else [])


def empty_or_noted(notes: list[str], message: str, title: str | None) -> go.Figure:
    """A figure that says why it is empty, with the one rule's notes when that is why."""
    return with_notes(empty_figure(message if not notes else "nothing here can be drawn as measured", title), notes)


# ---------------------------------------------------------------------------- overview


def metric_bars(df: pd.DataFrame, metric: str, title: str | None = None, derived: bool = False) -> go.Figure:
    """Bars per variant and phase·size, one panel (own linear axis) per phase (frames.group_metric_frame).
    ``derived``: the metric is computed from the time (a rate): none of an interpreted variant."""
    # the one rule: no negative bar; interpreted ones hatched, or n/a where derived
    df, notes, interp = trusted_rows(df, derived=derived)
    if df.empty:
        return empty_or_noted(notes, f"no values of {metric} in this run", title or metric)
    phases = _phases(df)
    fig = _phase_panels(phases, [max(1, df[df["phase"] == p]["phase_size"].nunique()) for p in phases])
    colors = variant_colors(df["variant"])
    shown: set[str] = set()
    for j, ph in enumerate(phases):
        d = df[df["phase"] == ph]
        for v in ordered_variants(d["variant"]):
            g = d[d["variant"] == v]
            fig.add_trace(go.Bar(x=g["phase_size"], y=g["value"], name=f"{v} {MARK}" if v in interp else v,
                                 legendgroup=v, showlegend=v not in shown, marker_color=colors[v],
                                 marker_pattern_shape="/" if v in interp else "",
                                 hovertemplate=f"{v}<br>%{{x}}<br>{metric}: %{{y:.4g}}<extra></extra>"),
                          **_kw(phases, j))
            shown.add(v)
        log = wide_spread(d["value"]) and bool((d["value"] > 0).all())
        set_y(fig, d["value"], log, (metric + (" (log)" if log else "")) if j == 0 or log else "", **_kw(phases, j))
    fig.update_layout(barmode="group", meta={"chart": "metric_bars"})
    return with_notes(_layout(fig, title or metric), notes)


def speedup_bars(df: pd.DataFrame, baseline: str, title: str | None = None) -> go.Figure:
    """Speed-up against the baseline per variant and phase·size (overview_frame rows), 1x = the baseline."""
    d = df.dropna(subset=["speed-up vs baseline"])
    d = d[d["variant"] != baseline]
    # a ratio is derived from both times: none where either is interpreted or negative
    d, notes, _ = trusted_rows(d, "ratio figure", derived=True)
    if d.empty:
        return empty_or_noted(notes, f"nothing to compare with {baseline}: no (phase, size) that both have GPU "
                              "times for", title or f"speed-up vs {baseline}")
    colors = variant_colors(d["variant"])
    fig = go.Figure()
    labels = {(p, s): f"{p} {'bs' if p == 'decode' else 'tokens'}={s}" for p, s in zip(d["phase"], d["size"])}
    order = [labels[k] for k in sorted(labels, key=lambda k: (k[0] != "decode", k[0], k[1]))]
    for v in ordered_variants(d["variant"]):
        g = d[d["variant"] == v]
        fig.add_trace(go.Bar(x=[labels[(p, s)] for p, s in zip(g["phase"], g["size"])], y=g["speed-up vs baseline"],
                             name=v, legendgroup=v, marker_color=colors[v],
                             hovertemplate=f"{v}<br>%{{x}}<br>%{{y:.2f}}x as fast as {baseline}<extra></extra>"))
    vals = [*d["speed-up vs baseline"], 1.0]
    set_y(fig, vals, True, f"speed-up vs {baseline} (x, log)")
    fig.update_xaxes(categoryorder="array", categoryarray=order)
    limit_line(fig, 1.0, f"{baseline} = 1x", log=True)
    fig.update_layout(barmode="group", meta={"chart": "speedup_bars"})
    return with_notes(_layout(fig, title or f"GPU cost per write: speed-up vs {baseline}"), notes)


def landing_cost(df: pd.DataFrame, title: str, axis: str = "GPU µs per write") -> go.Figure:
    """µs per write with its spread (error bar = IQR), one panel per phase (frames.landing_frame);
    ``axis``: what the figures are (kvprof.core.timings.SourceTiming.per_write)."""
    d = df.dropna(subset=["cost_us"])
    if "cost_kind" in d.columns:  # the one rule (kvprof.analysis.figures): a negative cost is never a bar
        d = d[d["cost_kind"].isin([MEASURED, INTERPRETED])]
    if d.empty:
        return empty_figure("no time per write for this source (a CPU-only capture's profiler has none)", title)
    phases = _phases(d)
    fig = _phase_panels(phases, [max(1, d[d["phase"] == p]["phase_size"].nunique()) for p in phases])
    shown: set[str] = set()
    for j, ph in enumerate(phases):
        p = d[d["phase"] == ph]
        for v in ordered_variants(p["variant"]):
            g = p[p["variant"] == v]
            # an interpreted write's bar is hatched and its name marked: the interpreter's time
            interp = "cost_kind" in g.columns and bool((g["cost_kind"] == INTERPRETED).any())
            fig.add_trace(go.Bar(
                x=g["phase_size"], y=g["cost_us"], name=f"{v} {MARK}" if interp else v, legendgroup=v,
                showlegend=v not in shown, marker_color=V.colour(v),
                marker_pattern_shape="/" if interp else "",
                error_y={"type": "data", "symmetric": False, "array": (g["cost_hi_us"] - g["cost_us"]).clip(lower=0),
                         "arrayminus": (g["cost_us"] - g["cost_lo_us"]).clip(lower=0), "thickness": 1.2, "width": 3},
                hovertemplate=f"{v}<br>%{{x}}<br>%{{y:.3f}} µs per write<extra></extra>"), **_kw(phases, j))
            shown.add(v)
        # a CPU run's interpreted Triton writes cost 100x the copies: a log axis keeps both visible
        log = wide_spread(p["cost_us"]) and bool((p["cost_us"] > 0).all())
        vals = [*p["cost_us"], *p["cost_hi_us"], *(p["cost_lo_us"] if log else [])]
        set_y(fig, vals, log, (axis + (" (log)" if log else "")) if j == 0 or log else "", **_kw(phases, j))
    fig.update_layout(barmode="group", meta={"chart": "landing_cost"})
    return _layout(fig, title)


def landing_saving(df: pd.DataFrame, title: str) -> go.Figure:
    """Saving per decode step (ms) per variant and batch, with its spread (frames.landing_frame)."""
    d = df[(df["phase"] == "decode")].dropna(subset=["saving_ms"])
    # the one rule: a saving within its spread is noise, and none is drawn from an untrusted cost
    d, notes, _ = trusted_rows(d, "saving_kind", derived=True)
    if d.empty:
        return empty_or_noted(notes, "no decode saving: the baseline has no decode rows for this source, or no GPU "
                              "times", title)
    fig = go.Figure()
    for v in ordered_variants(d["variant"]):
        g = d[d["variant"] == v]
        err = g["saving_spread_ms"].fillna(0.0)
        fig.add_trace(go.Bar(x=g["phase_size"], y=g["saving_ms"], name=v, legendgroup=v, marker_color=V.colour(v),
                             error_y={"type": "data", "array": err, "thickness": 1.2, "width": 3},
                             customdata=np.stack([g["share_pct"].fillna(np.nan)], axis=1),
                             hovertemplate=(f"{v}<br>%{{x}}<br>saves %{{y:.3f}} ms per step"
                                            "<br>%{customdata[0]:.2f} % of the step<extra></extra>")))
    vals = [*(d["saving_ms"] + d["saving_spread_ms"].fillna(0)), *(d["saving_ms"] - d["saving_spread_ms"].fillna(0))]
    set_y(fig, vals, False, "ms saved per decode step")
    if min(vals) < 0:
        limit_line(fig, 0.0, "no saving", log=False)
    fig.update_layout(barmode="group", meta={"chart": "landing_saving"})
    return with_notes(_layout(fig, title, height=360), notes)


# ---------------------------------------------------------------------------- the decoder layer


def _size_label(phase: str, size: int) -> str:
    return f"{'bs' if phase == 'decode' else 'tokens'}={int(size)}"


def rope_saving(df: pd.DataFrame, title: str) -> go.Figure:
    """ms saved per decode step by each rotary-fused variant against each separate-rotary one, per
    batch size, whiskers the spread (kvprof.dashboard.layer_view.rope_frame rows of one source);
    one panel per separate variant it is measured against."""
    d = df[df["phase"] == "decode"].dropna(subset=["saving_ms"])
    # the one rule: a saving within its spread (or with none to judge it) is noise, never a bar;
    # nor one derived from an interpreted or negative time
    d, notes, _ = trusted_rows(d, "saving_kind", derived=True)
    if d.empty:
        return empty_or_noted(notes, "no decode saving of a rotary-fused variant against a separate rotary", title)
    against = ordered_variants(d["against"])
    fig = make_subplots(rows=1, cols=len(against), subplot_titles=[f"vs {a}" for a in against],
                        horizontal_spacing=0.08) if len(against) > 1 else go.Figure()
    order = [_size_label("decode", s) for s in sorted(d["size"].unique())]
    shown: set[str] = set()
    vals: list[float] = []
    for j, a in enumerate(against):
        kw: _Cell = {"row": 1, "col": j + 1} if len(against) > 1 else {}
        p = d[d["against"] == a]
        for v in ordered_variants(p["variant"]):
            g = p[p["variant"] == v].sort_values("size")
            err = g["saving_spread_ms"].fillna(0.0)
            fig.add_trace(go.Bar(x=[_size_label("decode", s) for s in g["size"]], y=g["saving_ms"], name=v,
                                 legendgroup=v, showlegend=v not in shown, marker_color=V.colour(v),
                                 error_y={"type": "data", "array": err, "thickness": 1.2, "width": 3},
                                 customdata=np.stack([g["how"].astype(str), err], axis=1),
                                 hovertemplate=(f"{v} vs {a}<br>%{{x}}<br>saves %{{y:.3f}} ± %{{customdata[1]:.3f}} "
                                                "ms per step<br>%{customdata[0]}<extra></extra>")), **kw)
            shown.add(v)
            vals += [*(g["saving_ms"] + err), *(g["saving_ms"] - err)]
        fig.update_xaxes(categoryorder="array", categoryarray=order, **kw)
    for j in range(len(against)):
        kw = {"row": 1, "col": j + 1} if len(against) > 1 else {}
        set_y(fig, vals, False, "ms saved per decode step" if j == 0 else "", **kw)
        if min(vals) < 0:
            limit_line(fig, 0.0, "no saving", log=False, **kw)
    fig.update_layout(barmode="group", meta={"chart": "rope_saving"})
    return with_notes(_layout(fig, title, height=380), notes)


def pdl_overlap(df: pd.DataFrame, title: str) -> go.Figure:
    """µs by which writes began before their predecessor ended (median over those writes), per
    variant and size, one panel per phase; each bar labelled with how many writes did, of those
    traced (kvprof.dashboard.layer_view.pdl_frame rows of one source)."""
    d = df[(df["early"] > 0)].dropna(subset=["overlap_us"])
    if d.empty:
        return empty_figure("no write began before its predecessor ended", title)
    phases = _phases(d)
    fig = _phase_panels(phases, [max(1, d[d["phase"] == p]["size"].nunique()) for p in phases])
    shown: set[str] = set()
    for j, ph in enumerate(phases):
        p = d[d["phase"] == ph]
        order = [_size_label(ph, s) for s in sorted(p["size"].unique())]
        for v in ordered_variants(p["variant"]):
            g = p[p["variant"] == v].sort_values("size")
            fig.add_trace(go.Bar(
                x=[_size_label(ph, s) for s in g["size"]], y=g["overlap_us"], name=v, legendgroup=v,
                showlegend=v not in shown, marker_color=V.colour(v),
                text=[f"{e}/{n}" for e, n in zip(g["early"], g["writes"])], textposition="outside",
                customdata=np.stack([g["early"], g["writes"], g["same_stream"]], axis=1),
                hovertemplate=(f"{v}<br>{ph} %{{x}}<br>began %{{y:.2f}} µs before its predecessor ended (median)"
                               "<br>in %{customdata[0]} of %{customdata[1]} writes, %{customdata[2]} on its stream "
                               "(PDL)<extra></extra>")), **_kw(phases, j))
            shown.add(v)
        fig.update_xaxes(categoryorder="array", categoryarray=order, **_kw(phases, j))
        # room above the tallest bar for its label
        set_y(fig, [*p["overlap_us"], float(p["overlap_us"].max()) * 1.15], False,
              "µs before the predecessor ended" if j == 0 else "", **_kw(phases, j))
    fig.update_layout(barmode="group", meta={"chart": "pdl_overlap"})
    return _layout(fig, title, height=380)


# ---------------------------------------------------------------------------- timeline


def time_unit(span_us: float) -> tuple[str, float]:
    """The unit a span reads best in: µs up to 2 ms, ms up to 2 s, then s."""
    if span_us >= 2e6:
        return "s", 1e6
    if span_us >= 2e3:
        return "ms", 1e3
    return "µs", 1.0


def timeline(bars: pd.DataFrame, title: str = "timeline", lanes: Sequence[str] | None = None) -> go.Figure:
    """One lane per stream plus the kvprof write lanes: horizontal bars on a time axis (frames.window rows)."""
    if bars.empty:
        return empty_figure("nothing in this window", title)
    order = list(lanes) if lanes else sorted(bars["lane"].unique(), key=_lane_key)
    colors = variant_colors(bars["variant"])
    span = float((bars["start_us"] + bars["dur_us"]).max() - bars["start_us"].min())
    unit, div = time_unit(span)
    fig = go.Figure()
    for v in [*ordered_variants(set(bars["variant"]) - {NOT_IN_WRITE}), NOT_IN_WRITE]:
        d = bars[bars["variant"] == v]
        if d.empty:
            continue
        custom = np.stack([d["name"].astype(str), d["kind"].astype(str), d["grid"].astype(str),
                           d["block"].astype(str), d["count"].astype(str), d["detail"].astype(str),
                           d["busy_us"].round(3).astype(str), d["start_us"].round(3).astype(str),
                           d["dur_us"].round(3).astype(str)], axis=1)
        # a merged bar is as opaque as its lane was busy: dense stretches read dark, sparse ones pale
        busy = (d["busy_us"] / d["dur_us"].where(d["dur_us"] > 0)).fillna(1.0).clip(0.0, 1.0)
        opacity = np.where(d["count"] > 1, 0.2 + 0.8 * busy, 1.0)
        fig.add_trace(go.Bar(
            orientation="h", base=d["start_us"] / div, x=d["dur_us"].clip(lower=1e-3) / div, y=d["lane"], name=v,
            legendgroup=v, marker={"color": colors.get(v, NEUTRAL), "line": {"width": 0}, "opacity": opacity},
            customdata=custom,
            hovertemplate=("<b>%{customdata[0]}</b><br>%{customdata[1]} · " + v + "<br>start %{customdata[7]} µs"
                           "<br>duration %{customdata[8]} µs (busy %{customdata[6]} µs)<br>grid %{customdata[2]} "
                           "block %{customdata[3]}<br>%{customdata[5]}<extra>%{y}</extra>"),
        ))
    fig.update_layout(barmode="overlay", bargap=0.25, meta={"chart": "timeline", "unit": unit},
                      yaxis={"categoryorder": "array", "categoryarray": order[::-1], "title": None})
    fig.update_xaxes(title_text=f"time from the first activity ({unit})", exponentformat="none",
                     separatethousands=True)
    return _layout(fig, title, height=max(260, 70 + 46 * len(order)))


def _lane_key(lane: str) -> tuple[int, tuple[int, ...], str]:
    """Write lanes first, then GPU streams in numeric order (stream 7 before stream 13)."""
    nums = tuple(int(n) for n in re.findall(r"\d+", lane))
    return (0 if lane == WRITES_LANE else 1 if lane == HOST_LANE else 2, nums, lane)


# ---------------------------------------------------------------------------- distributions


SCALES = ("log", "clipped at p99", "linear")


def _clip_hi(values: pd.Series) -> float:
    return float(values.quantile(0.99))


def distribution(df: pd.DataFrame, metric: str, kind: str = "box", title: str | None = None,
                 scale: str = "log") -> go.Figure:
    """Per-write distribution by variant, one panel per phase (frames.dist_frame rows).

    ``scale``: log (values <= 0 cannot be drawn on it: the caller picks another scale
    for those), ``clipped at p99`` (a linear axis up to the 99th percentile; the writes
    above are counted in the figure) or linear.
    """
    if df.empty:
        return empty_figure(f"no measured writes with {metric}", title or metric)
    phases = _phases(df)
    log = scale == "log" and kind != "ecdf" and bool((df["value"] > 0).all())
    fig = _phase_panels(phases, [max(1, df[df["phase"] == p]["phase_size"].nunique()) for p in phases])
    shown: set[str] = set()
    above = 0
    for j, ph in enumerate(phases):
        d = df[df["phase"] == ph]
        order = list(dict.fromkeys(d.sort_values("size")["phase_size"]))
        for v in ordered_variants(d["variant"]):
            g = d[d["variant"] == v]
            common = {"name": v, "legendgroup": v, "showlegend": v not in shown}
            if kind == "ecdf":
                for ps in order:
                    s = np.sort(g[g["phase_size"] == ps]["value"].to_numpy())
                    if not len(s):
                        continue
                    fig.add_trace(go.Scatter(x=s, y=np.arange(1, len(s) + 1) / len(s), mode="lines",
                                             line={"color": V.colour(v), "shape": "hv",
                                                   "dash": ["solid", "dot", "dash", "dashdot"][order.index(ps) % 4]},
                                             hovertemplate=f"{v} · {ps}<br>%{{x:.4g}}<br>%{{y:.0%}} of writes below"
                                                           "<extra></extra>", **common), **_kw(phases, j))
                    common["showlegend"] = False
            elif kind == "violin":
                fig.add_trace(go.Violin(x=g["phase_size"], y=g["value"], box_visible=True, points=False,
                                        line_color=V.colour(v), fillcolor=V.colour(v), opacity=0.7, offsetgroup=v,
                                        scalegroup=v, **common), **_kw(phases, j))
            else:
                fig.add_trace(go.Box(x=g["phase_size"], y=g["value"], boxpoints="outliers", marker_color=V.colour(v),
                                     line_color=V.colour(v), offsetgroup=v,
                                     customdata=np.stack([g["layer"], g["step"], g["write_id"]], axis=1),
                                     hovertemplate=(f"{v}<br>%{{x}}<br>%{{y:.4g}}<br>layer %{{customdata[0]}} step "
                                                    "%{customdata[1]} write %{customdata[2]}<extra></extra>"),
                                     **common), **_kw(phases, j))
            shown.add(v)
        if kind == "ecdf":
            kw = _kw(phases, j)
            # no log range when no value is positive and finite (all infinite): a linear axis then
            rng = log_range(d["value"]) if scale == "log" and bool((d["value"] > 0).all()) else None
            if rng is not None:
                fig.update_xaxes(type="log", range=rng, exponentformat="none", title_text=metric,
                                 **log_ticks(rng), **kw)
            else:
                fig.update_xaxes(title_text=metric, range=lin_range(d["value"], zero=False), **kw)
            fig.update_yaxes(range=[0, 1.02], title_text="share of writes" if j == 0 else "", tickformat=".0%", **kw)
            continue
        if kind == "box":
            fig.update_layout(boxmode="group")
        else:
            fig.update_layout(violinmode="group")
        fig.update_xaxes(categoryorder="array", categoryarray=order, **_kw(phases, j))
        if scale == "clipped at p99" and not log:
            hi = _clip_hi(d["value"])
            above += int((d["value"] > hi).sum())
            vals = d["value"][d["value"] <= hi]
        else:
            vals = d["value"]
        set_y(fig, vals, log, (f"{metric} (log)" if log else metric) if j == 0 else "", **_kw(phases, j))
    meta = {"chart": "distribution", "scale": "log" if log else scale, "clipped_above": above}
    fig.update_layout(meta=meta)
    if above:
        fig.add_annotation(xref="paper", yref="paper", x=1.0, y=1.0, xanchor="right", yanchor="bottom",
                           text=f"{above:,} writes above the 99th percentile not drawn", showarrow=False,
                           font={"size": 11})
    return _layout(fig, title or metric)


def per_layer(df: pd.DataFrame, metric: str, title: str | None = None, log: bool = True) -> go.Figure:
    """Median of the metric by layer per variant, error bars from the 25th to the 75th percentile.

    The caller passes one phase·size: layers of decode and prefill never share an axis.
    """
    if df.empty:
        return empty_figure(f"no measured writes with {metric}", title or f"{metric} by layer")
    q = df.groupby(["variant", "layer"])["value"].quantile([0.25, 0.5, 0.75]).unstack()
    q.columns = ["p25", "p50", "p75"]
    q = q.reset_index()
    log = log and bool((q["p25"] > 0).all())
    fig = go.Figure()
    for i, v in enumerate(ordered_variants(q["variant"])):
        g = q[q["variant"] == v].sort_values("layer")
        line, marker = line_style(i)
        fig.add_trace(go.Scatter(x=g["layer"], y=g["p50"], mode="lines+markers", name=v, legendgroup=v,
                                 line={"color": V.colour(v), "width": 1.5, **line}, marker=marker,
                                 error_y={"type": "data", "symmetric": False, "array": g["p75"] - g["p50"],
                                          "arrayminus": g["p50"] - g["p25"], "thickness": 1, "width": 0},
                                 hovertemplate=f"{v}<br>layer %{{x}}<br>median %{{y:.4g}}<extra></extra>"))
    set_y(fig, [*q["p25"], *q["p75"]], log, f"{metric}, median and IQR" + (" (log)" if log else ""),
          zero=not log)
    fig.update_xaxes(title_text="layer", dtick=max(1, int(q["layer"].nunique() // 20)))
    fig.update_layout(meta={"chart": "per_layer"})
    return _layout(fig, title or f"{metric} by layer")


# ---------------------------------------------------------------------------- sweeps


def sweep(points: pd.DataFrame, floors: pd.DataFrame, title: str, y_label: str = "µs per write",
          x_label: str = "tokens per write", hlines: dict[str, float] | None = None,
          symbol: str | None = None) -> go.Figure:
    """Log-log time per write against tokens, one line per variant; limits as dashed lines.

    The y range is the measured points' (limits within LIMIT_REACH of them widen it);
    a floor line far below the points is cut at the range's edge and its legend says so.
    """
    points, notes, interp = trusted_rows(points)  # the one rule: no negative point; interpreted lines marked
    if points.empty:
        return empty_or_noted(notes, "no points with a GPU time per write", title)
    fig = go.Figure()
    dashes = ["solid", "dot", "dash", "longdash", "dashdot"]
    sym_values = sorted(points[symbol].astype(str).unique()) if symbol else []
    for i, v in enumerate(ordered_variants(points["variant"])):
        style, marker = line_style(i)
        for key, d in points[points["variant"].astype(str) == v].sort_values("tokens").groupby(
                [symbol] if symbol else (lambda _: ""), sort=True):
            key = str(key[0] if isinstance(key, tuple) else key)
            shown_v = f"{v} {MARK}" if v in interp else v
            name = shown_v if not symbol else f"{shown_v} · {key}"
            # several files: the dash tells the file, the marker the variant
            dash = dashes[sym_values.index(key) % len(dashes)] if symbol else style["dash"]
            fig.add_trace(go.Scatter(x=d["tokens"], y=d["us"], mode="lines+markers", name=name, legendgroup=v,
                                     line={"color": V.colour(v), "dash": dash}, marker=marker,
                                     hovertemplate=f"{name}<br>%{{x}} tokens<br>%{{y:.3f}} µs<extra></extra>"))
    data_lo, data_hi = float(points["us"][points["us"] > 0].min()), float(points["us"].max())
    shown = [y for y in (hlines or {}).values() if y and np.isfinite(y)]
    near = [y for y in shown if data_lo / LIMIT_REACH <= y <= data_hi * LIMIT_REACH]
    rng = log_range([data_lo, data_hi, *near])
    assert rng is not None
    lo, hi = 10 ** rng[0], 10 ** rng[1]
    for i, (label, d) in enumerate(floors.groupby("line", sort=True) if len(floors) else []):
        below = bool((d["us"] < lo).all())
        fig.add_trace(go.Scatter(x=d["tokens"], y=d["us"], mode="lines+markers",
                                 name=f"{label} (below this range)" if below else str(label), meta="limit",
                                 marker={"symbol": "line-ew-open", "size": 10}, legendgroup=f"limit:{label}",
                                 line={"color": LIMIT_COLOURS[i % 4], "dash": LIMIT_DASHES[i % 4], "width": 1.5},
                                 hovertemplate=f"{label}<br>%{{x}} tokens<br>%{{y:.3g}} µs<extra></extra>"))
    for i, (label, y) in enumerate((hlines or {}).items()):
        if y and np.isfinite(y) and lo <= y <= hi:
            limit_line(fig, float(y), label, log=True, i=i)
    fig.update_yaxes(type="log", range=rng, title_text=y_label, exponentformat="none", **log_ticks(rng))
    xr = log_range(points["tokens"], margin=1.15)
    fig.update_xaxes(type="log", title_text=x_label, exponentformat="none", range=xr, **(log_ticks(xr) if xr else {}))
    fig.update_layout(meta={"chart": "sweep"})
    return with_notes(_layout(fig, title, height=460), notes)


# ---------------------------------------------------------------------------- overlap


def overlap_scatter(df: pd.DataFrame, variant: str) -> go.Figure:
    """Write by write, the share of the write's GPU time with both streams busy (frames.overlap_frame)."""
    if df.empty:
        return empty_figure(f"{variant}: no measured writes with GPU work", f"{variant}: overlap per write")
    fig = go.Figure()
    colours = size_colours(df["phase_size"].unique())
    for ps, d in df.groupby("phase_size", sort=False):
        fig.add_trace(go.Scatter(x=d["order"], y=d["overlap_pct"], mode="markers", name=str(ps),
                                 marker={"color": colours[str(ps)], "size": 5,
                                         "symbol": SYMBOLS[list(df["phase_size"].unique()).index(ps) % len(SYMBOLS)]},
                                 customdata=np.stack([d["write_id"], d["layer"], d["step"], d["span_us"]], axis=1),
                                 hovertemplate=("write %{customdata[0]} L%{customdata[1]} step %{customdata[2]}"
                                                "<br>%{y:.1f} % overlap, span %{customdata[3]:.2f} µs<extra></extra>")))
    fig.update_xaxes(title_text="write (in trace order)")
    fig.update_yaxes(range=[-5, 105], title_text="overlap, % of GPU busy union")
    fig.update_layout(meta={"chart": "overlap_scatter", "bounded": "percent"})
    return _layout(fig, f"{variant}: how much of the two copies overlap, write by write")


def overlap_hist(df: pd.DataFrame, variant: str) -> go.Figure:
    if df.empty:
        return empty_figure(f"{variant}: no measured writes with GPU work", f"{variant}: overlap distribution")
    fig = go.Figure()
    colours = size_colours(df["phase_size"].unique())
    for ps, d in df.groupby("phase_size", sort=False):
        fig.add_trace(go.Histogram(x=d["overlap_pct"], name=str(ps), opacity=0.6,
                                   xbins={"start": 0, "end": 100, "size": 5}, marker_color=colours[str(ps)]))
    fig.update_xaxes(range=[-5, 105], title_text="overlap, % of GPU busy union")
    fig.update_yaxes(title_text="writes")
    fig.update_layout(barmode="overlay", meta={"chart": "overlap_hist", "bounded": "percent"})
    return _layout(fig, f"{variant}: distribution of overlap across writes", height=340)


# ---------------------------------------------------------------------------- compare runs


def before_after(df: pd.DataFrame, title: str = "GPU µs per write: before and after") -> go.Figure:
    """Per variant, before (hatched) and after (solid) in its colour; one panel per phase."""
    d = df.dropna(subset=["before µs/write", "after µs/write"], how="all")
    # the one rule, per run: a cost that is not drawable (negative, n/a) is no bar; an interpreted
    # one is cross-hatched and its name marked
    notes: list[str] = []
    interp: dict[str, set[str]] = {"before": set(), "after": set()}
    if "before figure" in d.columns:
        d = d.copy()
        for when in ("before", "after"):
            side = d.rename(columns={f"{when} figure": "figure"})
            _, side_notes, interp[when] = trusted_rows(side)
            notes += [f"{when}: {n}" for n in side_notes]
            d.loc[~d[f"{when} figure"].isin([MEASURED, INTERPRETED]), f"{when} µs/write"] = np.nan
        d = d.dropna(subset=["before µs/write", "after µs/write"], how="all")
    if d.empty:
        return empty_or_noted(notes, "no GPU time per write in both runs (CPU-only captures have none): "
                              "the table below compares host launch", title)
    d = d.assign(phase_size=[f"{p} {'bs' if p == 'decode' else 'tokens'}={s}" for p, s in zip(d["phase"], d["size"])])
    phases = _phases(d)
    fig = _phase_panels(phases, [max(1, d[d["phase"] == p]["phase_size"].nunique()) for p in phases])
    shown: set[tuple[str, str]] = set()
    for j, ph in enumerate(phases):
        p = d[d["phase"] == ph]
        for v in ordered_variants(p["variant"]):
            g = p[p["variant"] == v]
            base = v.split(" -> ")[-1]
            for when, col, pattern, op in (("before", "before µs/write", "/", 0.55),
                                           ("after", "after µs/write", "", 1.0)):
                marked = v in interp[when]
                pattern = "x" if marked else pattern  # interpreted: cross-hatched, either run
                fig.add_trace(go.Bar(x=g["phase_size"], y=g[col], name=f"{v} {MARK} · {when}" if marked else
                                     f"{v} · {when}", legendgroup=base,
                                     showlegend=(v, when) not in shown, offsetgroup=f"{v}-{when}",
                                     marker={"color": V.colour(base), "opacity": op, "pattern": {"shape": pattern}},
                                     hovertemplate=f"{v} {when}<br>%{{x}}<br>%{{y:.3f}} µs<extra></extra>"),
                              **_kw(phases, j))
                shown.add((v, when))
        vals = [x for x in [*p["before µs/write"], *p["after µs/write"]] if x == x]
        log = wide_spread(vals) and all(x > 0 for x in vals)
        set_y(fig, vals, log, ("µs per write" + (" (log)" if log else "")) if j == 0 or log else "",
              **_kw(phases, j))
    fig.update_layout(barmode="group", meta={"chart": "before_after"})
    return with_notes(_layout(fig, title), notes)


def ratio_bars(df: pd.DataFrame, column: str = "ratio after/before", title: str = "after / before") -> go.Figure:
    """One ratio after/before per variant and phase·size, log axis; below the 1x line the after run is cheaper."""
    d = df.dropna(subset=[column])
    d = d[d[column] > 0]
    d, notes, _ = trusted_rows(d, "ratio figure", derived=True)  # no ratio of an interpreted or negative time
    if d.empty:
        return empty_or_noted(notes, f"no {column} in both runs (CPU-only captures have no GPU times)", title)
    labels = [f"{p} {'bs' if p == 'decode' else 'tokens'}={s}" for p, s in zip(d["phase"], d["size"])]
    d = d.assign(phase_size=labels)
    fig = go.Figure()
    for v in ordered_variants(d["variant"]):
        g = d[d["variant"] == v]
        base = v.split(" -> ")[-1]
        fig.add_trace(go.Bar(x=g["phase_size"], y=g[column], name=v, legendgroup=base, marker_color=V.colour(base),
                             showlegend=True, hovertemplate=f"{v}<br>%{{x}}<br>%{{y:.3f}}x<extra></extra>"))
    set_y(fig, [*d[column], 1.0], True, f"{column} (x, log)")
    limit_line(fig, 1.0, "same as before = 1x", log=True)
    fig.update_layout(barmode="group", showlegend=True, meta={"chart": "ratio_bars"})
    return with_notes(_layout(fig, title), notes)
