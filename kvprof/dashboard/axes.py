"""Axes and limit lines for the dashboard's charts: ranges from the data, readable log ticks,
log axes where one panel's values span more than SPREAD_LOG, and reference lines at their
value, named in the legend (text inside the plot sat over the bars and lines).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import plotly.graph_objects as go

LIMIT_COLOURS = ("#222222", "#8c564b", "#5f5f5f", "#999933")
LIMIT_DASHES = ("dash", "dot", "dashdot", "longdash")
MARGIN = 1.25  # log axes: the range is [min / MARGIN, max x MARGIN] of what is drawn
LIN_PAD = 0.08  # linear axes: this share of the span above the largest value
# A panel whose positive values span more than this factor gets a log axis: on a linear one the
# small bars are flat lines at 0 (a CPU run: index_put's 11 µs beside the interpreter's 4,476 µs)
SPREAD_LOG = 20.0


def wide_spread(values: Iterable[float]) -> bool:
    """True when the positive finite values span more than SPREAD_LOG (largest over smallest)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x) and x > 0], dtype=float)
    return bool(len(v) and v.max() / v.min() > SPREAD_LOG)


def fmt_num(v: float, digits: int = 3) -> str:
    """A number as people write it: 0.6, 12.3, 4,096 (no 1e3, no SI suffixes)."""
    if v is None or not np.isfinite(v):
        return "n/a"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a == 0:
        return "0"
    return f"{v:.{digits}g}"


# ---------------------------------------------------------------------------- axes and limits


def log_range(values: Iterable[float], margin: float = MARGIN) -> list[float] | None:
    """[log10(min / margin), log10(max x margin)] of the positive finite values (Plotly's log range)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x) and x > 0], dtype=float)
    if not len(v):
        return None
    return [math.log10(v.min() / margin), math.log10(v.max() * margin)]


def lin_range(values: Iterable[float], pad: float = LIN_PAD, zero: bool = True) -> list[float] | None:
    """From 0 (or the smallest value) to the largest plus a small pad."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if not len(v):
        return None
    lo, hi = (min(0.0, v.min()) if zero else v.min()), max(0.0, v.max()) if zero else v.max()
    span = (hi - lo) or abs(hi) or 1.0
    return [lo - (pad * span if lo < 0 or not zero else 0.0), hi + pad * span]


def log_ticks(rng: Sequence[float], max_ticks: int = 12) -> dict[str, list]:
    """tickvals/ticktext at 1-2-5 x 10^k inside a log range (only 10^k when that is too many)."""
    lo, hi = 10 ** rng[0], 10 ** rng[1]
    for mults in ((1, 2, 5), (1, 3), (1,)):
        vals = [m * 10.0 ** k for k in range(math.floor(rng[0]) - 1, math.ceil(rng[1]) + 1) for m in mults]
        vals = [v for v in vals if lo <= v <= hi]
        if len(vals) <= max_ticks and len(vals) >= 2 or mults == (1,):
            break
    if len(vals) < 2:  # less than a decade: let Plotly pick, without SI suffixes
        return {}
    return {"tickvals": vals, "ticktext": [fmt_num(v) for v in vals]}


def set_y(fig: go.Figure, values: Iterable[float], log: bool, title: str, row: int | None = None,
          col: int | None = None, zero: bool = True) -> None:
    """The y axis of one panel: type, range from ``values``, readable ticks, a title with units."""
    vals = list(values)
    kw = {"row": row, "col": col} if row else {}
    if log:
        rng = log_range(vals)
        fig.update_yaxes(type="log", title_text=title, exponentformat="none", **kw)
        if rng:
            fig.update_yaxes(range=rng, **log_ticks(rng), **kw)
    else:
        rng = lin_range(vals, zero=zero)
        fig.update_yaxes(type="linear", title_text=title, exponentformat="none", separatethousands=True, **kw)
        if rng:
            fig.update_yaxes(range=rng, **kw)


def axis_ref(fig: go.Figure, row: int | None, col: int | None) -> tuple[str, str]:
    if row is None:
        return "x", "y"
    sub = fig.get_subplot(row, col)
    x = sub.xaxis.plotly_name.replace("axis", "")
    y = sub.yaxis.plotly_name.replace("axis", "")
    return x, y


def limit_line(fig: go.Figure, y: float, label: str, log: bool, i: int = 0, row: int | None = None,
               col: int | None = None) -> None:
    """A horizontal reference line at its true value, named in the legend.

    The line is a shape across the panel; its label is a legend entry drawn in the same
    colour and dash (a trace with no points, ``legendgroup`` = the shape's ``name``), not
    text inside the plot, where it sat over bars and lines. ``i`` picks the colour and
    dash, so neighbouring lines differ. ``log`` is kept for the callers: a shape's y is the
    value itself on either axis type. One legend entry per label, whatever the panels.
    """
    xr, yr = axis_ref(fig, row, col)
    name = f"limit:{label}"
    line = {"color": LIMIT_COLOURS[i % len(LIMIT_COLOURS)], "dash": LIMIT_DASHES[i % len(LIMIT_DASHES)], "width": 1.5}
    fig.add_shape(type="line", xref=f"{xr} domain", x0=0, x1=1, yref=yr, y0=y, y1=y, name=name, line=line)
    if any(getattr(t, "legendgroup", None) == name for t in fig.data):
        return
    kw = {"row": row, "col": col} if row else {}
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=label, legendgroup=name, meta="limit",
                             line=line, hoverinfo="skip", showlegend=True), **kw)
