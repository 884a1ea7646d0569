"""Bits every page repeats: the no-run notice, the run header, the phase·size picker."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from kvprof.dashboard import frames
from kvprof.dashboard.state import Context
from kvprof.dashboard.ui import md


def need_run(ctx: Context) -> bool:
    """True when a run is open; otherwise says why the page is empty."""
    if ctx.run is not None:
        return True
    st.info("No run is open. Pick one in the sidebar, or upload a trace there.")
    return False


def device_line(summary: dict[str, Any]) -> str:
    """The device in Markdown: its name (from the trace) escaped, numbers only if numbers."""
    dev = summary.get("device") or {}
    dev = dev if isinstance(dev, dict) else {}
    parts = [md(dev.get("name") or "unknown device")]
    for key, label in (("peak_bandwidth_gbs", "peak"), ("copy_rate_gbs", "measured copy rate")):
        v = dev.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v > 0:
            src = dev.get("peak_bandwidth_source") if key == "peak_bandwidth_gbs" else None
            parts.append(f"{label} {v:,.0f} GB/s" + (f" ({md(src)})" if isinstance(src, str) and src else ""))
    return " · ".join(parts)


def no_gpu_traces(summary: dict[str, Any]) -> list[str]:
    return [str(t.get("path")) for t in summary.get("traces") or [] if not t.get("gpu_events")]


def pick_phase_size(df: pd.DataFrame, key: str, label: str = "phase · size", allow_all: bool = True) -> str | None:
    """A select over the (phase, size) pairs in ``df`` (columns phase, size); None means all."""
    pairs = df[["phase", "size"]].dropna().drop_duplicates()
    pairs = pairs.sort_values(["phase", "size"], key=lambda s: s if s.name == "size" else s.astype(str))
    opts = [frames.phase_size(p, s) for p, s in zip(pairs["phase"], pairs["size"])]
    if allow_all:
        opts = ["all", *opts]
    if not opts:
        return None
    choice = st.selectbox(label, opts, key=key)
    return None if choice == "all" else choice


def esc(value: object) -> str:
    """Text from a trace or a name inside ``intro``'s HTML."""
    import html

    return html.escape(str(value))


def intro(text: str) -> None:
    """The page's one sentence: what it shows, for which run and source (HTML: escape names with ``esc``)."""
    st.markdown(f"<p data-testid='page-intro' style='margin-top:-0.5rem'>{text}</p>", unsafe_allow_html=True)


def source_label(source: str | None, summary: dict[str, Any] | None = None) -> str:
    """The source and, with the run's summary, how it timed (wall clock, CUDA events)."""
    from kvprof.dashboard.landing import source_words

    return source_words(source, summary)


def per_write_source(ctx: Context, writes: pd.DataFrame) -> str | None:
    """The source per-write pages use: the sidebar's, unless it has no per-write rows (the reference pass
    times whole steps), then the most trusted profiler that has them -- and the page says so."""
    have = set(writes["source"].dropna().astype(str)) if len(writes) else set()
    if ctx.source is None or ctx.source in have:
        return ctx.source
    order = frames.sources_in(pd.DataFrame({"source": sorted(have)}), ctx.summary())
    if not order:
        return ctx.source
    summary = ctx.summary()
    st.caption(f"{md(source_label(ctx.source, summary))} times whole steps and has no per-write rows: this page "
               f"shows {md(source_label(order[0], summary))}, the least perturbed profiler of this run.")
    return order[0]
