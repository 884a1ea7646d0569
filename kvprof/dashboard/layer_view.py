"""The decoder-layer views of a run, built once for the dashboard's Layer page and for
``kvprof report --html``.

Two views, each a table with a chart where there is something to draw, and a sentence that
says why where there is not (never an empty chart):

- the rotary fused into the write: per source and size, each variant whose one launch
  rotates q and k and writes K and V (``rope="fused"`` in kvprof.core.variants) against each
  variant that runs the rotary and the write as separate kernels (``rope="separate"``, the
  ``rope_then_*`` ones): their µs per write and the saving per decode step with its spread.
  The savings are kvprof.analysis.compare's with the separate variant as the baseline, laid
  out as the landing view lays out its own (kvprof.dashboard.tables.landing_frame): measured
  in the layer (the two steps' IQRs in quadrature) where the run has the layer context,
  else projected from the writes alone; none where the source timed no GPU work (a CPU's
  wall clock) or for a prefill, where capture and analyze say n/a too.
- what programmatic dependent launch hides: from summary.json's ``layer_steps``
  (kvprof.analysis.layer_step.WriteBoundary), per variant, traced source and size, how many
  writes began before their predecessor ended, how many of those on the predecessor's own
  stream (PDL), and by how much (the median over those writes). The reference pass has no
  trace, so these come from the most trusted profiler that traced the layer.

Pure (pandas + Plotly, no Streamlit, no torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from kvprof.analysis.compare import Benchmark
from kvprof.analysis.figures import (
    INTERPRETED,
    MARK,
    MEASURED,
    NEGATIVE,
    NOISE,
    NOT_APPLICABLE,
    Figure,
    classify,
    derived,
)
from kvprof.analysis.layer_step import LayerSteps
from kvprof.core import variants as V
from kvprof.core.errors import Setting, Words
from kvprof.dashboard import charts, frames, tables

ROPE_COLUMNS = ("variant", "against", "source", "phase", "size", "phase_size", "variant_us", "against_us",
                "saving_ms", "saving_spread_ms", "how", "why", "variant_kind", "against_kind", "saving_kind")
PDL_COLUMNS = ("variant", "source", "phase", "size", "phase_size", "writes", "early", "same_stream", "early_pct",
               "overlap_us", "critical_us", "second_stream", "wait_us")
# what a capture asks for to fill the rotary view (the setting as Words parts: the pages spell it)
CAPTURE_ROPE = (Setting("variants"), " rope_then_triton_fused,rope_triton_fused")
ROPE_VARIANTS = V.ROPE_VARIANTS
# what each view is, in a sentence (the report's and the page's)
ROPE_INTRO = ("Each variant whose one launch rotates q and k and writes K and V, against the rotary and the write as "
              "separate kernels: the time per write of each and what fusing saves per decode step.")
PDL_INTRO = ("Writes that began on the GPU before the kernel before them ended, and by how much: on the same stream "
             "that is programmatic dependent launch (PDL), which overlaps a kernel's start with the end of the one "
             "before it.")
GAP_INTRO = ("Where the saving measured in the layer is off the projection from the writes alone by more than its "
             "spread, and what the trace says of it:")


def rope_variants(names: list[str]) -> tuple[list[str], list[str]]:
    """(fused into the rotary, rotary then write as separate kernels) among ``names``, in table order."""
    ordered = V.ordered(names)
    return ([v for v in ordered if V.info(v).rope == "fused"], [v for v in ordered if V.info(v).rope == "separate"])


def _how(c: dict[str, Any] | None, layers: int) -> str:
    """How the comparison got a saving: measured in the layer or projected (and from what)."""
    if c is None or c.get("saving_per_step_ms") is None:
        return ""
    if c.get("measured_saving_per_step_ms") is not None:
        return "measured in the layer"
    if c.get("context") == "layer":
        return "projected: the writes-alone steps"
    return f"projected: {layers} layers x µs/write"


def rope_frame(summary: dict[str, Any], groups: pd.DataFrame | None = None, layers: int = 80,
               variants: list[str] | None = None, writes: pd.DataFrame | None = None,
               bench: Benchmark | None = None) -> pd.DataFrame:
    """One row per rotary-fused variant, separate-rotary variant, source and (phase, size) that both
    were timed at: the two µs per write and the saving per decode step of the fused one (ROPE_COLUMNS).
    ``why`` says why a row has no saving: prefill, CPU (the source's clock), not measured."""
    groups = frames.groups_frame(summary) if groups is None else groups
    names = [v for v in frames.variants_in(summary, groups) if variants is None or v in variants]
    fused, separate = rope_variants(names)
    rows: list[dict[str, Any]] = []
    if not fused or not separate:
        return pd.DataFrame(rows, columns=list(ROPE_COLUMNS))
    bench = bench or Benchmark()
    g = groups[groups["variant"].astype(str).isin(fused + separate)]
    for against in separate:
        comp = frames.comparison(g, against, layers, bench.itl_before_ms, bench.itl_after_ms)
        keyed = {(r["variant"], r["source"], r["phase"], int(r["size"])): r for r in comp.get("rows", [])}
        for source in frames.sources_in(g, summary):
            t = frames.timing_of(summary, source)
            land = tables.landing_frame(g, comp, summary, source, writes, layers, bench.itl_before_ms, gpu=t.gpu)
            at = {(r.variant, r.phase, int(r.size)): r for r in land.itertuples(index=False)}
            for r in land[land["variant"].isin(fused)].itertuples(index=False):
                base = at.get((against, r.phase, int(r.size)))
                c = keyed.get((r.variant, source, r.phase, int(r.size)))
                saving = float(r.saving_ms) if c is not None and np.isfinite(r.saving_ms) else math.nan
                measured = c is not None and c.get("measured_saving_per_step_ms") is not None
                banded = base is not None and "none" not in (r.spread_from, base.spread_from)
                spread = float(r.saving_spread_ms) if np.isfinite(saving) and (measured or banded) else math.nan
                if np.isfinite(saving):
                    why = ""
                elif r.phase != "decode":
                    why = str(r.phase)
                elif not t.gpu:
                    why = t.no_step_why[0]
                elif base is None:
                    why = f"no {against} by {source}"
                else:
                    why = "not measured"
                # the one rule (kvprof.analysis.figures): each time's kind, and the saving's: that of
                # an untrusted time it is computed from (a chart reads it n/a with why), else noise
                # within its spread or with no spread to judge it
                vk = str(r.cost_kind)
                ak = str(base.cost_kind) if base is not None else NOT_APPLICABLE
                pk = frames.pair_kind(vk, ak)
                sk = classify(saving, spread=spread, needs_spread=True).kind if pk == MEASURED else pk
                rows.append({"variant_kind": vk, "against_kind": ak, "saving_kind": sk,
                             "variant": r.variant, "against": against, "source": source, "phase": r.phase,
                             "size": int(r.size), "phase_size": r.phase_size, "variant_us": float(r.cost_us),
                             "against_us": float(base.cost_us) if base is not None else math.nan,
                             "saving_ms": saving, "saving_spread_ms": spread,
                             "how": _how(c, layers) if np.isfinite(saving) else "", "why": why})
    return pd.DataFrame(rows, columns=list(ROPE_COLUMNS))


ROPE_TABLE = {"variant": "rotary fused into the write", "against": "vs rotary, then the write", "source": "source",
              "phase_size": "phase · size", "variant_us": "µs/write (fused)", "against_us": "µs/write (separate)",
              "saving_ms": "saves ms/step", "saving_spread_ms": "± ms", "how": "saving is"}


def rope_table(df: pd.DataFrame, summary: dict[str, Any] | None = None) -> pd.DataFrame:
    """The comparison as text: each source in words with its clock, µs/write in the sources' unit
    where they share one, and a saving that does not exist as n/a with capture's reason."""
    words = {s: frames.timing_of(summary, s) for s in df["source"].astype(str).unique()}
    units = {t.per_write_short for t in words.values()}
    names = dict(ROPE_TABLE)
    if len(units) == 1:
        unit = units.pop()
        names["variant_us"], names["against_us"] = f"fused: {unit}", f"separate: {unit}"
    shown = df.assign(source=[words[s].words for s in df["source"].astype(str)])
    out = tables.display(shown[list(ROPE_TABLE)].rename(columns=names), digits=3)
    for col in ("saving_ms", "saving_spread_ms", "how"):
        out[names[col]] = [f"{tables.MISSING} ({why})" if why and v == tables.MISSING else v
                           for v, why in zip(out[names[col]], df["why"])]
    # the one rule (kvprof.analysis.figures): a time labelled where it is not a measurement (`*`,
    # n/a (negative: noise)); a saving from such a time n/a with why; one within its spread, or
    # with no spread to judge it, marked noise
    for col, kcol, who in (("variant_us", "variant_kind", "variant"), ("against_us", "against_kind", "against")):
        out[names[col]] = [Figure(float(v), k).text(3) if k in (INTERPRETED, NEGATIVE) else t
                           for v, k, t in zip(df[col], df[kcol], out[names[col]])]
        out[names[who]] = [f"{v} {MARK}" if k == INTERPRETED else v for v, k in zip(out[names[who]], df[kcol])]
    saving = []
    for v, sp, k, a, b, t in zip(df["saving_ms"], df["saving_spread_ms"], df["saving_kind"], df["variant_kind"],
                                 df["against_kind"], out[names["saving_ms"]]):
        pk = frames.pair_kind(str(a), str(b))
        if k == NOISE:
            t = Figure(float(v), NOISE, "within its spread" if np.isfinite(sp) else "no spread to judge it").text(
                3, sign=True)
        elif pk != MEASURED and np.isfinite(v):  # a saving computed from an untrusted time
            t = derived(Figure(0.0, pk), v).text()
        saving.append(t)
    out[names["saving_ms"]] = saving
    return out


def pdl_frame(steps: LayerSteps | None, variants: list[str] | None = None) -> pd.DataFrame:
    """summary.json's write boundaries (``layer_steps``) in µs, one row per variant, source, phase, size."""
    rows = []
    for b in (steps.boundaries if steps is not None else []):
        if variants is not None and b.variant not in variants:
            continue
        rows.append({"variant": b.variant, "source": b.source, "phase": b.phase, "size": b.size,
                     "phase_size": frames.phase_size(b.phase, b.size), "writes": b.writes, "early": b.early_starts,
                     "same_stream": b.same_stream_early,
                     "early_pct": 100.0 * b.early_starts / b.writes if b.writes else math.nan,
                     "overlap_us": _us(b.early_overlap_ns), "critical_us": _us(b.critical_ns),
                     "second_stream": b.second_stream, "wait_us": _us(b.stream_wait_ns)})
    df = pd.DataFrame(rows, columns=list(PDL_COLUMNS))
    order = {v: i for i, v in enumerate(V.ordered(list(df["variant"].astype(str))))}
    return (df.assign(_o=df["variant"].map(order), _p=df["phase"] != "decode")
            .sort_values(["source", "_o", "_p", "size"]).drop(columns=["_o", "_p"]).reset_index(drop=True))


def _us(ns: float | None) -> float:
    return ns / frames.NS_PER_US if ns is not None and math.isfinite(ns) else math.nan


PDL_TABLE = {"variant": "variant", "source": "source", "phase_size": "phase · size", "writes": "writes traced",
             "early": "began before predecessor ended", "same_stream": "of those on its stream (PDL)",
             "early_pct": "% of writes", "overlap_us": "median overlap µs", "critical_us": "adds to critical path µs",
             "second_stream": "with a second stream", "wait_us": "next kernel waits µs"}


def pdl_table(df: pd.DataFrame, summary: dict[str, Any] | None = None) -> pd.DataFrame:
    """The write boundaries as text, each source in words; a median over no writes says so."""
    shown = df.assign(source=[frames.timing_of(summary, s).words for s in df["source"].astype(str)])
    out = tables.display(shown[list(PDL_TABLE)].rename(columns=PDL_TABLE), digits=3)
    out[PDL_TABLE["overlap_us"]] = [f"{tables.MISSING} (none began early)" if n == 0 else v
                                    for v, n in zip(out[PDL_TABLE["overlap_us"]], df["early"])]
    out[PDL_TABLE["wait_us"]] = [f"{tables.MISSING} (one stream)" if n == 0 else v
                                 for v, n in zip(out[PDL_TABLE["wait_us"]], df["second_stream"])]
    return out


@dataclass
class LayerView:
    """What the layer views show for one run and source: frames, charts where they have bars, and why not."""

    rope: pd.DataFrame  # rope_frame
    pdl: pd.DataFrame  # pdl_frame
    rope_text: pd.DataFrame  # rope_table: what the page and the report show
    pdl_text: pd.DataFrame  # pdl_table
    rope_variants: tuple[list[str], list[str]] = ([], [])
    rope_source: str | None = None  # the source the rope chart is drawn from
    pdl_source: str | None = None  # the traced source the PDL chart is drawn from
    has_layer: bool = False  # the run has summary.json's layer_steps (--context layer)
    figures: list[tuple[str, go.Figure]] = field(default_factory=list)  # ("rope" | "pdl", figure)
    rope_notes: list[str] = field(default_factory=list)  # a note naming a setting is Words (pages spell it)
    pdl_notes: list[str] = field(default_factory=list)
    gap_notes: list[str] = field(default_factory=list)  # layer_steps' account of measured vs projected

    @property
    def has_rope(self) -> bool:
        return any(self.rope_variants)

    @property
    def empty(self) -> bool:
        """Nothing of either view in this run (no rotary variant, no layer context)."""
        return not self.has_rope and not self.has_layer

    def figure(self, name: str) -> go.Figure | None:
        return next((f for n, f in self.figures if n == name), None)


def _gpu_traces(summary: dict[str, Any]) -> bool:
    return any(isinstance(t, dict) and (t.get("gpu_events") or 0) > 0 for t in summary.get("traces") or [])


def _rope_view(view: LayerView, summary: dict[str, Any], source: str | None) -> None:
    fused, separate = view.rope_variants
    if not fused and not separate:
        view.rope_notes.append(Words("no rotary variant in this run: capture with ", *CAPTURE_ROPE,
                                     " (and the peers) to compare the rotary fused into the write with the two as "
                                     "separate kernels."))
        return
    if not fused or not separate:
        have, need = ("fused into the rotary", "the rotary and the write as separate kernels (rope_then_*)") \
            if fused else ("with a separate rotary", "one fused into the rotary (rope_triton_fused or a peer)")
        view.rope_notes.append(f"only variants {have} ran ({', '.join(fused or separate)}): the comparison needs "
                               f"one with {need} too.")
        return
    df = view.rope
    src = source if source in set(df["source"]) else (str(df["source"].iloc[0]) if len(df) else source)
    view.rope_source = src
    t = frames.timing_of(summary, src)
    rows = df[(df["source"] == src) & (df["phase"] == "decode") & df["saving_ms"].notna()]
    if len(rows):
        view.figures.append(("rope", charts.rope_saving(rows, f"rotary fused into the write: ms saved per decode "
                                                              f"step (whiskers: spread) · {t.words}")))
        hows = sorted(set(rows["how"]))
        view.rope_notes.append("saving: " + "; ".join(hows) + (
            "; ± is the two layer steps' IQRs in quadrature." if "measured in the layer" in hows else
            "; ± combines the two variants' spreads."))
    elif len(df) == 0:
        view.rope_notes.append(f"no chart: no size at which a rotary-fused and a separate-rotary variant were both "
                               f"timed ({', '.join(fused)} vs {', '.join(separate)}).")
    elif not t.gpu and src is not None:
        view.rope_notes.append(f"no chart of ms saved per decode step: {t.no_step_why[1]} (capture and analyze show "
                               f"n/a ({t.no_step_why[0]}) too).")
    else:
        view.rope_notes.append(f"no chart of ms saved per decode step: no rotary-fused variant has a decode row of "
                               f"its own and of a separate-rotary variant at {t.words}.")


def _pdl_view(view: LayerView, summary: dict[str, Any], source: str | None, steps: LayerSteps | None) -> None:
    if steps is None:
        view.pdl_notes.append(Words("no decoder-layer context in this run: what PDL hides shows in a run captured "
                                    "with ", Setting("context"), " layer."))
        return
    df = view.pdl
    if df.empty:
        why = ("this run's traces have no GPU events (a CPU capture): no GPU timeline shows which writes began "
               "before their predecessor ended" if not _gpu_traces(summary) else
               "no profiled trace of the layer's writes on the GPU timeline (the reference pass has no trace)")
        view.pdl_notes.append(f"no write boundaries: {why}.")
        return
    traced = list(dict.fromkeys(df["source"].astype(str)))
    src = source if source in traced else frames.sources_in(pd.DataFrame({"source": traced}), summary)[0]
    view.pdl_source = src
    t = frames.timing_of(summary, src)
    if source is not None and source != src:
        view.pdl_notes.append(f"{frames.timing_of(summary, source).words} has no trace of the layer: the write "
                              f"boundaries are {t.words}'s.")
    rows = df[(df["source"] == src) & (df["early"] > 0) & df["overlap_us"].notna()]
    if len(rows):
        view.figures.append(("pdl", charts.pdl_overlap(rows, f"what PDL hides: µs a write began before its "
                                                             f"predecessor ended (median over those writes) · "
                                                             f"{t.words}")))
        view.pdl_notes.append("labels: writes that began before their predecessor ended, of those traced; on the "
                              "predecessor's own stream that is programmatic dependent launch (PDL).")
    else:
        view.pdl_notes.append(f"no chart: no write began before its predecessor ended in {t.words}'s trace, so PDL "
                              "hides nothing there.")


def build(summary: dict[str, Any], source: str | None = None, layers: int = 80, variants: list[str] | None = None,
          writes: pd.DataFrame | None = None, bench: Benchmark | None = None,
          groups: pd.DataFrame | None = None) -> LayerView:
    """Both layer views for one run: ``source`` is the one the charts are drawn from where it has
    rows (the landing view's), ``variants`` the ones shown (all when None)."""
    groups = frames.groups_frame(summary) if groups is None else groups
    names = [v for v in frames.variants_in(summary, groups) if variants is None or v in variants]
    steps = LayerSteps.from_json(summary.get("layer_steps"))
    rope = rope_frame(summary, groups, layers, names, writes, bench)
    pdl = pdl_frame(steps, names)
    view = LayerView(rope=rope, pdl=pdl, rope_text=rope_table(rope, summary), pdl_text=pdl_table(pdl, summary),
                     rope_variants=rope_variants(names), has_layer=steps is not None,
                     gap_notes=list(steps.notes) if steps is not None else [])
    _rope_view(view, summary, source)
    _pdl_view(view, summary, source, steps)
    return view


__all__ = ["PDL_COLUMNS", "ROPE_COLUMNS", "LayerView", "build", "pdl_frame", "pdl_table", "rope_frame", "rope_table",
           "rope_variants"]
