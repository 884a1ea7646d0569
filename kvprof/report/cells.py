"""How every console table says a figure is missing, and why; and what its columns mean.

A blank "-" leaves a new user guessing whether something broke. A figure that cannot
exist here reads ``n/a (why)`` instead: ``n/a (CPU: no GPU kernels)``, ``n/a (graph
replay: no launch per write)``. In a wide table a column that is n/a in every row for
the same reason is left out and named once below the table, so a CPU run's tables are
not columns of the same words. Each table ends with a legend line: what each of its
columns is, in a few words (every unit and key: docs/formats.md).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import JustifyMethod
from rich.table import Table
from rich.text import Text

from kvprof.analysis.figures import NEGATIVE as NEGATIVE_KIND, NEGATIVE_WHY, classify, fmt_number
from kvprof.core.numbers import finite_or_none
from kvprof.core.summary import Summary
from kvprof.core.text import markup, printable


@dataclass(frozen=True)
class NA:
    """A figure that does not exist here, with the reason in a few words; ``explain``, when
    the words are too short to stand alone, goes once under the table."""

    why: str
    explain: str = ""

    def __str__(self) -> str:
        return f"n/a ({self.why})"


Cell = str | NA


@dataclass(frozen=True)
class Col:
    """A column: its header, alignment and one-phrase meaning for the legend."""

    header: str
    means: str = ""
    justify: JustifyMethod = "right"




NEGATIVE = NA(NEGATIVE_WHY, "a cost below zero is a difference of two medians within their noise")


def us(ns: Any, missing: NA, digits: int = 2, cost: bool = False) -> Cell:
    """Nanoseconds as µs (thousands separated), or ``missing``; ``cost``: a cost or duration,
    which by the one rule (kvprof.analysis.figures) reads n/a (negative: noise) below zero."""
    f = finite_or_none(ns)
    if f is None:
        return missing
    figure = classify(f / 1000, cost=cost)
    return NEGATIVE if figure.kind == NEGATIVE_KIND else fmt_number(f / 1000, digits)


def num(v: Any, missing: NA, fmt: str = "{:.1f}") -> Cell:
    f = finite_or_none(v)
    return missing if f is None else fmt.format(f)


# -- why a figure is missing --------------------------------------------------------------

NOT_MEASURED = NA("not measured")


def cpu_run(summary: Summary) -> bool:
    """Timed by a wall clock and no GPU event anywhere: the run was on a CPU."""
    clocks = (summary.reference or {}).get("clock") or []
    no_gpu = all(int(t.get("gpu_events") or 0) == 0 for t in summary.traces)
    return no_gpu and (clocks == ["wall"] or not clocks)


def no_gpu_reason(summary: Summary) -> NA:
    if cpu_run(summary) and (summary.reference or {}).get("clock") == ["wall"]:
        return NA("CPU: no GPU kernels")
    return NA("no GPU events in the trace")


def gpu_traced(summary: Summary) -> set[tuple[str, str]]:
    """(source, variant) pairs whose trace holds GPU events."""
    out: set[tuple[str, str]] = set()
    for t in summary.traces:
        if int(t.get("gpu_events") or 0) > 0:
            out |= {(str(t.get("source")), str(v)) for v in t.get("variants") or []}
    return out


def ns_or_why(row: dict[str, Any], key: str, gpu: bool, summary: Summary, digits: int = 2) -> Cell:
    """A profiler row's figure in µs, or why it is missing: no GPU events, a graph replay
    (no launch per write), else not measured."""
    return us(row.get(key), missing_reason(row, key, gpu, summary), digits)


GPU_KEYS = ("kernels_per_write", "gpu_span_ns", "gpu_busy_ns", "cost_per_write_ns", "launch_delay_ns", "streams",
            "overlap_frac", "gap_before_ns", "same_stream_early", "bandwidth_gbs", "pct_of_peak", "step_gpu_ns")


GRAPH = NA("graph", "a CUDA-graph replay submits a whole step at once: no launch per write")


def missing_reason(row: dict[str, Any], key: str, gpu: bool, summary: Summary) -> NA:
    if key in GPU_KEYS and not gpu:
        return no_gpu_reason(summary)
    if key in ("host_launch_ns", "launch_delay_ns") and row.get("graph"):
        return GRAPH
    if key == "pct_of_peak" and finite_or_none((summary.device or {}).get("peak_bandwidth_gbs")) is None:
        return NA("peak unknown")
    if key == "step_iqr_ns" and (finite_or_none(row.get("steps")) or 0) < 4:
        return NA("< 4 steps")
    return NOT_MEASURED


# -- tables -------------------------------------------------------------------------------

def table(title: str | None, cols: Sequence[Col], rows: Sequence[Sequence[Cell]], *, collapse: bool = True,
          compact: bool = False, width: int | None = None) -> tuple[Table, list[str]]:
    """A rich table and the lines that go under it: the columns left out because they are
    n/a in every row (``collapse``), with why, then the legend of the columns shown.
    When the table would be wider than ``width``, headers break between words, so that
    the terminal wraps headers and reasons, not figures; nothing is cut with an ellipsis."""
    keep = list(range(len(cols)))
    notes: list[str] = []
    if collapse and rows:
        gone: dict[tuple[str, ...], list[str]] = {}
        for i, col in enumerate(cols):
            cells = [r[i] for r in rows]
            if all(isinstance(c, NA) for c in cells):
                whys = tuple(dict.fromkeys(f"{c.why}: {c.explain}" if c.explain else c.why
                                           for c in cells if isinstance(c, NA)))
                gone.setdefault(whys, []).append(col.header)
                keep.remove(i)
        notes += [f"n/a here ({'; '.join(whys)}): {', '.join(heads)}" for whys, heads in gone.items()]
    t = Table(title=None if title is None else markup(title), title_justify="left",
              box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
              padding=(0, 1), pad_edge=not compact, collapse_padding=compact)
    natural = sum(max([len(cols[i].header)] + [len(str(r[i])) for r in rows]) for i in keep)
    borders = (2 if compact else 3) * len(keep) + 1
    narrow = width is not None and natural + borders > width
    for i in keep:
        c = cols[i]
        t.add_column("\n".join(c.header.split()) if narrow else c.header, justify=c.justify, overflow="fold")
    for r in rows:  # Text, not str: a cell is never rich markup, and never a control character
        t.add_row(*(Text(printable(r[i]), style="dim" if isinstance(r[i], NA) else "") for i in keep))
    meant = [f"{cols[i].header}: {cols[i].means}" for i in keep if cols[i].means]
    meant += list(dict.fromkeys(f"{cell}: {cell.explain}" for r in rows for i in keep
                                if isinstance(cell := r[i], NA) and cell.explain))
    if meant:
        notes.append("; ".join(meant))
    return t, notes


@dataclass(frozen=True)
class FitCol:
    """A column of a table that must fit a width without cutting anything (:func:`fit_table`).

    ``wrap``: a text column (a reason, a description) that may wrap onto more lines, down to
    ``min_wrap`` characters; any other column is as wide as its widest cell (a name, a figure).
    ``drop``: the column's place in the order columns are left out when the table cannot fit
    (1 first); None: never left out (the names a row is known by)."""

    header: str
    justify: JustifyMethod = "right"
    wrap: bool = False
    drop: int | None = None
    min_wrap: int = 16


def fit_table(title: str | None, cols: Sequence[FitCol], rows: Sequence[Sequence[Any]],
              width: int) -> tuple[Table, list[str]]:
    """A rich table of ``rows`` within ``width`` characters, and the line that goes under it.

    Nothing is cut with an ellipsis: a name or a figure keeps its whole width, a header breaks
    between its words, a text column wraps; where that is still too wide, whole columns are
    left out in their ``drop`` order and the line under the table names them. Every cell is
    text (never rich markup)."""
    cells = [[printable(c) for c in r] for r in rows]

    def need(i: int) -> int:
        c = cols[i]
        longest_word = max((len(w) for w in c.header.split()), default=0)
        widest = max([len(r[i]) for r in cells] or [0])
        if c.wrap:
            words = max([len(w) for r in cells for w in r[i].split()] or [0])
            return max(longest_word, min(widest, max(c.min_wrap, words)))
        return max(longest_word, widest)

    keep = list(range(len(cols)))
    order = sorted((i for i, c in enumerate(cols) if c.drop is not None), key=lambda i: (cols[i].drop, i))
    dropped: list[str] = []
    while order and sum(need(i) for i in keep) + 3 * len(keep) + 1 > width:
        i = order.pop(0)
        keep.remove(i)
        dropped.append(cols[i].header)
    # each column's width, chosen here rather than by rich (which crops a row it cannot fit):
    # a name or figure its widest cell; text columns share what is left, up to their widest
    widths = {i: need(i) for i in keep}
    natural = {i: max(len(cols[i].header), max([len(r[i]) for r in cells] or [0])) for i in keep}
    spare = width - 3 * len(keep) - 1 - sum(widths.values())
    while spare < 0:  # still too wide with every column that may go gone: text breaks inside words
        narrowable = [i for i in keep if cols[i].wrap and widths[i] > cols[i].min_wrap]
        if not narrowable:
            break
        i = max(narrowable, key=lambda j: widths[j])
        widths[i] -= 1
        spare += 1
    growing = [i for i in keep if cols[i].wrap]
    while spare > 0 and (growing := [i for i in growing if widths[i] < natural[i]]):
        share = max(1, spare // len(growing))
        for i in growing:
            step = min(share, natural[i] - widths[i], spare)
            widths[i] += step
            spare -= step
    t = Table(title=None if title is None else markup(title), title_justify="left")
    for i in keep:
        c, w = cols[i], widths[i]
        header = c.header if len(c.header) <= w else "\n".join(textwrap.wrap(c.header, w))
        t.add_column(header, justify=c.justify, width=w, no_wrap=not c.wrap, overflow="fold")
    for r in cells:
        t.add_row(*(Text(r[i]) for i in keep))
    notes = []
    if dropped:
        notes.append(f"not shown at {width} columns: {', '.join(dropped)} (left out in that order; a wider "
                     "terminal, or COLUMNS=N when piped, shows them)")
    return t, notes


def print_table(console: Any, t: Table, notes: Sequence[str]) -> None:
    console.print(t)
    for line in notes:
        console.print(Text(printable(line), style="dim"))


__all__ = ["GRAPH", "NA", "NEGATIVE", "NOT_MEASURED", "Cell", "Col", "FitCol", "cpu_run", "fit_table", "gpu_traced",
           "missing_reason", "no_gpu_reason", "ns_or_why", "num", "print_table", "table", "us"]
