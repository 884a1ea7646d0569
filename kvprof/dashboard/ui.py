"""Streamlit helpers shared by the pages: every chart exports PNG/HTML, every table CSV.

The PNG comes from Plotly's own modebar (rendered in the browser, no kaleido); the HTML
is generated only when its button is clicked (a deferred ``data`` callable), so a page
does not build megabytes of self-contained HTML on every rerun.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from kvprof.dashboard.tables import display, header, html_table
from kvprof.report.files import frame_csv  # text cells formula-safe, as in summary.csv

_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-.!|<>~:$])")


def md(value: object) -> str:
    """Text from a trace, a file name or an error, safe inside Streamlit Markdown.

    Every Markdown-active character is backslash-escaped, so ``![](http://host/x)`` in a
    device name is shown as those characters instead of making the browser fetch the URL,
    and ``:red[...]``, ``$math$``, links and HTML stay text. Newlines become spaces (one line).
    """
    return _MD_SPECIAL.sub(r"\\\1", " ".join(str(value).split()))


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-").lower() or "chart"


def _html_of(fig: go.Figure) -> Callable[[], bytes]:
    def make() -> bytes:
        return fig.to_html(include_plotlyjs=True, full_html=True).encode()  # self-contained: works offline

    return make


def show_figure(fig: go.Figure, key: str) -> None:
    """The chart, its PNG modebar button (named after the chart) and an HTML download."""
    name = slug(key)
    st.plotly_chart(fig, key=f"chart-{name}", config={
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": name, "scale": 2},
        "modeBarButtonsToRemove": ["lasso2d", "select2d"],
    })
    st.download_button("Download chart as HTML", data=_html_of(fig), file_name=f"{name}.html", mime="text/html",
                       key=f"html-{name}", on_click="ignore")


STATIC_ROWS = 80  # up to this many rows a table is plain HTML: every column shown in full, nothing clipped


def show_table(df: pd.DataFrame, key: str, caption: str | None = None, column_config: dict[str, Any] | None = None,
               max_rows: int = 5000, text: pd.DataFrame | None = None) -> None:
    """The table as text cells (``tables.display``: n/a for missing, never None) and a CSV of the raw values.

    ``text``: the cells to show instead, where a figure must read with its label (the one rule of
    kvprof.analysis.figures: ``tables.labelled``); the CSV keeps the raw values and their kinds.

    Small tables are one static HTML block (``tables.html_table``: no clipped columns,
    readable in a screenshot, cheap for the browser); larger ones a scrollable grid of at
    most ``max_rows`` rows.
    """
    name = slug(key)
    if caption:
        st.caption(caption)
    shown = df if text is None else text
    rows = (shown if len(shown) <= max_rows else shown.head(max_rows)).reset_index(drop=True)
    rows = rows.rename(columns=header)  # units as everywhere else (µs, GB/s); the CSV keeps the names
    if len(rows) <= STATIC_ROWS:
        st.html(html_table(rows))
    else:
        st.dataframe(display(rows), hide_index=True, column_config=column_config, key=f"table-{name}")
    if len(df) > max_rows:
        st.caption(f"showing the first {max_rows:,} of {len(df):,} rows; the CSV has all of them")
    st.download_button("Download table as CSV", data=lambda: frame_csv(df).encode(), file_name=f"{name}.csv",
                       mime="text/csv", key=f"csv-{name}", on_click="ignore")
