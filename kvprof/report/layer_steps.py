"""The console view of a ``--context layer`` run's step savings (kvprof.analysis.layer_step).

``analyze`` prints both tables and the gap notes; the capture's first summary prints one
line per variant at the decode batch nearest the benchmark's, and the notes for it.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from kvprof.analysis.figures import INTERPRETED_NOTE, MARK, Figure, classify
from kvprof.analysis.layer_step import LayerSteps, StepSaving
from kvprof.report.cells import NA, NOT_MEASURED, Cell, Col, num, print_table, table, us

WALL = NA("CPU clock", "a CPU's wall clock: host time, says nothing of a GPU's step")
NO_SPREAD = NA("< 4 steps")


def _ms(ns: Any, missing: NA) -> Cell:
    return num(ns / 1e6 if isinstance(ns, (int, float)) else None, missing, "{:.3f}")


def saving_figure(s: StepSaving, interpreted: set[str] | frozenset[str] = frozenset()) -> Figure:
    """The one rule (kvprof.analysis.figures) for a measured step saving: interpreted where
    either variant ran in Triton's interpreter, noise where it is within the two steps' spread
    or, on a CPU's wall clock, has no spread to judge it."""
    return classify(s.saving_ns / 1e6, interpreted=s.variant in interpreted or s.against in interpreted,
                    spread=None if s.spread_ns is None else s.spread_ns / 1e6, needs_spread=s.clock == "wall",
                    why_noise="within the steps' spread" if s.spread_ns is not None else "no spread to judge it")


def savings_table(doc: LayerSteps, width: int | None = None,
                  interpreted: set[str] | frozenset[str] = frozenset()) -> tuple[Table, list[str]]:
    cols = [Col("variant", justify="left"), Col("vs", "the variant it is measured against", "left"),
            Col("phase", justify="left"), Col("size", "batch or tokens"),
            Col("step µs", "the variant's median layer step"), Col("IQR µs", "its interquartile range"),
            Col("saving ms", "the other's median step minus the variant's (positive: shorter)"),
            Col("± ms", "the two steps' IQRs in quadrature"),
            Col("projected ms", "the same difference of the rotary + store units timed alone"),
            Col("gap ms", "measured - projected")]
    rows: list[list[Cell]] = []
    for s in doc.savings:
        wall = s.clock == "wall"
        saving = saving_figure(s, interpreted)
        rows.append([s.variant + (f" {MARK}" if s.variant in interpreted else ""),
                     s.against + (f" {MARK}" if s.against in interpreted else ""), s.phase, str(s.size),
                     us(s.step_ns, NOT_MEASURED, 1), us(s.step_iqr_ns, NO_SPREAD, 1),
                     saving.text(3, sign=True) if saving.value is not None else NOT_MEASURED,
                     _ms(s.spread_ns, NO_SPREAD),
                     _ms(s.projected_ns, WALL if wall else NOT_MEASURED),
                     _ms(s.gap_ns, WALL if wall else NOT_MEASURED)])
    return table("in the layer: step saving against " + " and ".join(doc.against)
                 + " (reference pass, no profiler)", cols, rows, width=width)


def boundaries_table(doc: LayerSteps, width: int | None = None) -> tuple[Table, list[str]]:
    cols = [Col("variant", justify="left"), Col("source", justify="left"), Col("phase", justify="left"),
            Col("size"), Col("writes", "writes traced"),
            Col("adds µs", "median time a write adds to the GPU critical path"),
            Col("after prev µs", "write start - end of the work before it (< 0: began before it ended)"),
            Col("early", "writes that began before their predecessor ended (same stream: PDL)"),
            Col("next after µs", "next kernel's start - write end (< 0: began before the write ended)"),
            Col("2nd stream", "writes with work on another stream than the next kernel's"),
            Col("wait µs", "the next kernel's stream idle before it, waiting for such a write")]
    rows: list[list[Cell]] = []
    for b in doc.boundaries:
        rows.append([b.variant, b.source, b.phase, str(b.size), str(b.writes), us(b.critical_ns, NOT_MEASURED),
                     us(b.start_after_ns, NOT_MEASURED), f"{b.early_starts} ({b.same_stream_early} same stream)",
                     us(b.next_after_ns, NOT_MEASURED), str(b.second_stream),
                     us(b.stream_wait_ns, NA("one stream") if not b.second_stream else NOT_MEASURED)])
    return table("in the layer: where each write sits on the traced GPU timeline (median)", cols, rows, width=width)


def render_layer_steps(raw: dict[str, Any] | None, console: Any,
                       interpreted: set[str] | frozenset[str] = frozenset()) -> None:
    """``analyze``'s view: the savings, the trace's boundaries, the notes on each gap."""
    doc = LayerSteps.from_json(raw)
    if doc is None or not (doc.savings or doc.boundaries):
        return
    if doc.savings:
        table_, notes = savings_table(doc, console.width, interpreted)
        if any(s.variant in interpreted or s.against in interpreted for s in doc.savings):
            notes = [*notes, INTERPRETED_NOTE]
        print_table(console, table_, notes)
    if doc.boundaries:
        print_table(console, *boundaries_table(doc, console.width))
    for line in doc.notes:
        console.print(Text(f"  {line}"))


def _nearest(savings: list[StepSaving], batch: int) -> int | None:
    sizes = sorted({s.size for s in savings if s.phase == "decode"})
    return min(sizes, key=lambda n: (abs(n - batch), n)) if sizes else None


def saving_lines(raw: dict[str, Any] | None, batch: int = 10,
                 interpreted: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """The capture's summary: per variant, its step saving against each reference at the
    decode batch nearest ``batch`` (labelled by the one rule: noise and interpreted savings
    say so), then the notes on the gaps at that batch."""
    doc = LayerSteps.from_json(raw)
    if doc is None:
        return []
    size = _nearest(doc.savings, batch)
    if size is None:
        return []
    rows = [s for s in doc.savings if s.phase == "decode" and s.size == size]
    wall = any(s.clock == "wall" for s in rows)
    by: dict[str, list[str]] = {}
    figures = [saving_figure(s, interpreted) for s in rows]
    for s, f in zip(rows, figures):
        spread = f" ± {s.spread_ns / 1e6:.3f}" if s.spread_ns is not None else ""
        by.setdefault(s.variant, []).append(f"{f.text(3, sign=True)}{spread} vs {s.against}")
    how = "CPU wall clock, not a GPU's" if wall else "reference pass"
    layers = sorted({s.layers for s in rows})
    step = f"decode step of {layers[0]} layers" if len(layers) == 1 else "decode step"
    what = "measured step saving" if all(f.trusted for f in figures) else "step saving"
    lines = [f"{what} in the layer (ms per {step} at batch {size}, {how}; positive: "
             "shorter step): " + "; ".join(f"{v} {', '.join(parts)}" for v, parts in by.items())]
    if any(f.kind == "noise" for f in figures):
        lines.append("(noise): a difference within the two steps' spread, or a CPU's with no spread to judge it: "
                     "not a saving")
    tag = f", decode {size}:"
    lines += [n for n in doc.notes if tag in n]
    return lines


__all__ = ["boundaries_table", "render_layer_steps", "saving_lines", "savings_table"]
