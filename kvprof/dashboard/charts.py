"""Plotly figure builders: a DataFrame in, a go.Figure out, no Streamlit.

Pure so they are tested without a server and reused by the benchmark script. Times are
µs on numeric axes; the timeline is horizontal bars with ``base=`` (a date axis, as
px.timeline forces, cannot show µs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from kvprof.dashboard.frames import HOST_LANE, NOT_IN_WRITE, WRITES_LANE

PALETTE = px.colors.qualitative.Plotly
NEUTRAL = "#9aa0a6"
HEIGHT = 420


def variant_colors(variants: Sequence[str]) -> dict[str, str]:
    """One color per variant, stable across pages (sorted names, not order of appearance)."""
    names = sorted({str(v) for v in variants if str(v) != NOT_IN_WRITE})
    colors = {v: PALETTE[i % len(PALETTE)] for i, v in enumerate(names)}
    colors[NOT_IN_WRITE] = NEUTRAL
    return colors


def empty_figure(message: str, title: str | None = None) -> go.Figure:
    """A figure that says why it is empty, instead of a blank axis."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper", font={"size": 14})
    fig.update_layout(title=title, height=240, xaxis={"visible": False}, yaxis={"visible": False})
    return fig


def _layout(fig: go.Figure, title: str, height: int = HEIGHT) -> go.Figure:
    fig.update_layout(title=title, height=height, margin={"l": 10, "r": 10, "t": 50, "b": 10},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0, "title": {"text": ""}})
    return fig


def metric_bars(df: pd.DataFrame, metric: str, title: str | None = None) -> go.Figure:
    """Grouped bars: one group per phase·size, one bar per variant (frames.group_metric_frame)."""
    if df.empty:
        return empty_figure(f"no values of {metric} in this run", title or metric)
    colors = variant_colors(df["variant"])
    fig = go.Figure()
    for v, d in df.groupby("variant", sort=True):
        fig.add_trace(go.Bar(x=d["phase_size"], y=d["value"], name=str(v), marker_color=colors[str(v)],
                             hovertemplate=f"{v}<br>%{{x}}<br>{metric}: %{{y:.4g}}<extra></extra>"))
    fig.update_layout(barmode="group", yaxis_title=metric, xaxis_title=None)
    return _layout(fig, title or metric)


def speedup_bars(df: pd.DataFrame, baseline: str, title: str | None = None) -> go.Figure:
    """Speed-up against the baseline per variant and phase·size (overview_frame rows), 1 = same."""
    d = df.dropna(subset=["speed-up vs baseline"])
    d = d[d["variant"] != baseline]
    if d.empty:
        return empty_figure(f"nothing to compare with {baseline}: no shared (phase, size) with GPU times",
                            title or f"speed-up vs {baseline}")
    colors = variant_colors(df["variant"])
    fig = go.Figure()
    for v, g in d.groupby("variant", sort=True):
        labels = [f"{p} {'bs' if p == 'decode' else 'tokens'}={s} ({src})" for p, s, src in zip(g["phase"], g["size"], g["source"])]
        fig.add_trace(go.Bar(x=labels, y=g["speed-up vs baseline"], name=str(v), marker_color=colors[str(v)],
                             hovertemplate=f"{v}<br>%{{x}}<br>%{{y:.2f}}x faster than {baseline}<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color=NEUTRAL, annotation_text=baseline)
    fig.update_layout(barmode="group", yaxis_title=f"speed-up vs {baseline} (x)", yaxis_type="log")
    return _layout(fig, title or f"GPU cost per write: speed-up vs {baseline}")


def timeline(bars: pd.DataFrame, title: str = "timeline", lanes: Sequence[str] | None = None) -> go.Figure:
    """One lane per stream plus the kvprof write lanes: horizontal bars on a µs axis (frames.window rows)."""
    if bars.empty:
        return empty_figure("nothing in this window", title)
    order = list(lanes) if lanes else sorted(bars["lane"].unique(), key=_lane_key)
    colors = variant_colors(bars["variant"])
    fig = go.Figure()
    for v, d in bars.groupby("variant", sort=True):
        custom = np.stack([d["name"].astype(str), d["kind"].astype(str), d["grid"].astype(str),
                           d["block"].astype(str), d["count"].astype(str), d["detail"].astype(str),
                           d["busy_us"].round(3).astype(str)], axis=1)
        # a merged bar is as opaque as its lane was busy: dense stretches read dark, sparse ones pale
        busy = (d["busy_us"] / d["dur_us"].where(d["dur_us"] > 0)).fillna(1.0).clip(0.0, 1.0)
        opacity = np.where(d["count"] > 1, 0.2 + 0.8 * busy, 1.0)
        fig.add_trace(go.Bar(
            orientation="h", base=d["start_us"], x=d["dur_us"].clip(lower=1e-3), y=d["lane"], name=str(v),
            marker={"color": colors.get(str(v), NEUTRAL), "line": {"width": 0}, "opacity": opacity}, customdata=custom,
            hovertemplate=("<b>%{customdata[0]}</b><br>%{customdata[1]} · " + str(v) + "<br>start %{base:.3f} µs"
                           "<br>duration %{x:.3f} µs (busy %{customdata[6]} µs)<br>grid %{customdata[2]} "
                           "block %{customdata[3]}<br>%{customdata[5]}<extra>%{y}</extra>"),
        ))
    fig.update_layout(barmode="overlay", bargap=0.25, xaxis_title="µs from the first activity",
                      yaxis={"categoryorder": "array", "categoryarray": order[::-1], "title": None})
    return _layout(fig, title, height=max(260, 70 + 46 * len(order)))


def _lane_key(lane: str) -> tuple[int, tuple[int, ...], str]:
    """Write lanes first, then GPU streams in numeric order (stream 7 before stream 13)."""
    nums = tuple(int(n) for n in re.findall(r"\d+", lane))
    return (0 if lane == WRITES_LANE else 1 if lane == HOST_LANE else 2, nums, lane)


def distribution(df: pd.DataFrame, metric: str, kind: str = "box", title: str | None = None) -> go.Figure:
    """Per-write distribution by variant and phase·size: box, violin or ECDF (frames.dist_frame rows)."""
    if df.empty:
        return empty_figure(f"no measured writes with {metric}", title or metric)
    colors = variant_colors(df["variant"])
    order = list(dict.fromkeys(df.sort_values("size")["phase_size"]))
    if kind == "ecdf":
        fig = px.ecdf(df, x="value", color="variant", line_dash="phase_size" if len(order) > 1 else None,
                      color_discrete_map=colors, labels={"value": metric, "phase_size": "phase·size"})
    elif kind == "violin":
        fig = px.violin(df, x="phase_size", y="value", color="variant", box=True, points=False,
                        color_discrete_map=colors, category_orders={"phase_size": order},
                        labels={"value": metric, "phase_size": ""}, hover_data=["layer", "step"])
    else:
        fig = px.box(df, x="phase_size", y="value", color="variant", points="outliers", color_discrete_map=colors,
                     category_orders={"phase_size": order}, labels={"value": metric, "phase_size": ""},
                     hover_data=["layer", "step", "write_id"])
    return _layout(fig, title or metric)


def per_layer(df: pd.DataFrame, metric: str, title: str | None = None) -> go.Figure:
    """The metric by layer (box per layer and variant): a slow layer stands out."""
    if df.empty:
        return empty_figure(f"no measured writes with {metric}", title or f"{metric} by layer")
    colors = variant_colors(df["variant"])
    fig = px.box(df, x="layer", y="value", color="variant", points=False, color_discrete_map=colors,
                 labels={"value": metric, "layer": "layer"})
    fig.update_xaxes(type="category")
    return _layout(fig, title or f"{metric} by layer")


def sweep(points: pd.DataFrame, floors: pd.DataFrame, title: str, y_label: str = "µs per write",
          x_label: str = "tokens per write", hlines: dict[str, float] | None = None,
          symbol: str | None = None) -> go.Figure:
    """Log-log time per write against tokens, one line per variant, with dashed reference lines."""
    if points.empty:
        return empty_figure("no points with a GPU time per write", title)
    colors = variant_colors(points["variant"])
    fig = go.Figure()
    keys = ["variant"] + ([symbol] if symbol else [])
    dashes = ["solid", "dot", "dash", "longdash", "dashdot"]
    sym_values = sorted(points[symbol].astype(str).unique()) if symbol else []
    for key, d in points.sort_values("tokens").groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        v = str(key[0])
        name = v if not symbol else f"{v} · {key[1]}"
        dash = dashes[sym_values.index(str(key[1])) % len(dashes)] if symbol else "solid"
        fig.add_trace(go.Scatter(x=d["tokens"], y=d["us"], mode="lines+markers", name=name,
                                 line={"color": colors[v], "dash": dash},
                                 hovertemplate=f"{name}<br>%{{x}} tokens<br>%{{y:.3f}} µs<extra></extra>"))
    for i, (label, d) in enumerate(floors.groupby("line", sort=True) if len(floors) else []):
        fig.add_trace(go.Scatter(x=d["tokens"], y=d["us"], mode="lines+markers", name=str(label),
                                 marker={"symbol": "line-ew-open", "size": 10},
                                 line={"color": ["#222222", "#8c564b", "#7f7f7f"][i % 3], "dash": ["dash", "dot", "dashdot"][i % 3], "width": 1.5},
                                 hovertemplate=f"{label}<br>%{{x}} tokens<br>%{{y:.3f}} µs<extra></extra>"))
    for label, y in (hlines or {}).items():
        if y and np.isfinite(y):
            fig.add_hline(y=y, line_dash="dot", line_color=NEUTRAL, annotation_text=label)
    fig.update_layout(xaxis={"type": "log", "title": x_label}, yaxis={"type": "log", "title": y_label})
    return _layout(fig, title)


def overlap_scatter(df: pd.DataFrame, variant: str) -> go.Figure:
    """Write by write, the share of the write's GPU time with both streams busy (frames.overlap_frame)."""
    if df.empty:
        return empty_figure(f"{variant}: no measured writes with GPU work", f"{variant}: overlap per write")
    fig = px.scatter(df, x="order", y="overlap_pct", color="phase_size", symbol="source",
                     hover_data=["write_id", "layer", "step", "overlap_us", "union_us", "span_us", "kernel_names"],
                     labels={"order": "write (in trace order)", "overlap_pct": "overlap, % of GPU busy union",
                             "phase_size": "phase·size"})
    fig.update_yaxes(range=[-5, 105])
    return _layout(fig, f"{variant}: how much of the two copies overlap, write by write")


def overlap_hist(df: pd.DataFrame, variant: str) -> go.Figure:
    if df.empty:
        return empty_figure(f"{variant}: no measured writes with GPU work", f"{variant}: overlap distribution")
    fig = px.histogram(df, x="overlap_pct", color="phase_size", nbins=20, barmode="overlay", opacity=0.7,
                       labels={"overlap_pct": "overlap, % of GPU busy union", "phase_size": "phase·size"})
    fig.update_xaxes(range=[-5, 105])
    return _layout(fig, f"{variant}: distribution of overlap across writes", height=340)


def before_after(df: pd.DataFrame, title: str = "GPU µs per write: before and after") -> go.Figure:
    """Paired bars per variant and phase·size (frames.compare_runs rows)."""
    if df.empty:
        return empty_figure("no (variant, source, phase, size) in both runs", title)
    labels = [f"{v} · {p} {'bs' if p == 'decode' else 'tokens'}={s} ({src})"
              for v, p, s, src in zip(df["variant"], df["phase"], df["size"], df["source"])]
    fig = go.Figure([
        go.Bar(x=labels, y=df["before µs/write"], name="before", marker_color=NEUTRAL),
        go.Bar(x=labels, y=df["after µs/write"], name="after", marker_color=PALETTE[0]),
    ])
    fig.update_layout(barmode="group", yaxis_title="µs per write")
    return _layout(fig, title)


def ratio_bars(df: pd.DataFrame, columns: Sequence[str], title: str = "after / before") -> go.Figure:
    """Ratios after/before of several metrics per row; below 1 the after run is cheaper."""
    if df.empty:
        return empty_figure("no (variant, source, phase, size) in both runs", title)
    labels = [f"{v} · {p} {'bs' if p == 'decode' else 'tokens'}={s} ({src})"
              for v, p, s, src in zip(df["variant"], df["phase"], df["size"], df["source"])]
    fig = go.Figure()
    for i, c in enumerate(columns):
        fig.add_trace(go.Bar(x=labels, y=df[c], name=c, marker_color=PALETTE[i % len(PALETTE)]))
    fig.add_hline(y=1.0, line_dash="dot", line_color=NEUTRAL)
    fig.update_layout(barmode="group", yaxis_title="ratio (after / before)")
    return _layout(fig, title)
