"""An engine's own trace shown like a kvprof run: its KV-write kernels per step and layer.

A trace that vLLM's or SGLang's profiler wrote has no kvprof write ranges; analyze finds its
KV-write kernels by name and ties each to a forward step and a layer
(kvprof.analysis.engine_steps). This view turns that part of summary.json
(``write_kernels.traces[]``) into what the HTML report and the dashboard show: the steps
table, the write time per step and layer (table and heat map), the graph-replay attribution,
and where each figure comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvprof.core.text import printable


@dataclass
class EngineView:
    trace: str
    rank: Any
    method: str | None
    reason: str | None  # why no step was found
    notes: list[str] = field(default_factory=list)  # the source of each figure, the kernels not tied
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    step_layer: pd.DataFrame = field(default_factory=pd.DataFrame)  # µs, one row per step, one column per layer

    def figure(self) -> go.Figure | None:
        """Write time per step (rows) and layer (columns), µs; None without a tied kernel."""
        if self.step_layer.empty:
            return None
        z = self.step_layer.drop(columns=["step"]).to_numpy(dtype=float)
        fig = go.Figure(go.Heatmap(z=z, x=[str(c) for c in self.step_layer.columns[1:]],
                                   y=[f"{i}: {s}" for i, s in enumerate(self.step_layer["step"])],
                                   colorbar={"title": "µs"}, hovertemplate="%{y}<br>%{x}: %{z:.2f} µs<extra></extra>"))
        fig.update_layout(title=f"KV-write time per step and layer · {printable(self.trace)} · steps from "
                                f"{printable(self.method or 'none')}", height=360 + 8 * min(len(z), 64),
                          yaxis={"autorange": "reversed"}, margin={"l": 220})
        return fig


def _us(v: Any) -> float | None:
    return None if not isinstance(v, (int, float)) or isinstance(v, bool) else round(v / 1000.0, 2)


def engine_views(summary: dict[str, Any]) -> list[EngineView]:
    """One view per trace without kvprof write ranges whose KV-write kernels were found by name."""
    section = summary.get("write_kernels") or {}
    out = []
    for t in section.get("traces") or []:
        if not isinstance(t, dict) or t.get("is_kvprof_capture") or not t.get("write_kernels"):
            continue
        name = str(t.get("path", "?")).rsplit("/", 1)[-1]
        fams = ", ".join(f"{f.get('family')} ({f.get('source')}, /{f.get('regex')}/, {f.get('kernels_per_write')} "
                         "kernel(s) per write)" for f in t.get("families") or [])
        graph = t.get("graph") or {}
        notes = [
            f"write kernels: {t.get('write_kernels'):,} found by name in the trace's kernel records: {fams}",
            f"steps: {t.get('step_method') or 'none found'}; {t.get('tied_step_and_layer', 0):,} of "
            f"{t.get('write_kernels'):,} write kernels tied to a step and a layer (layer = order within the step)",
            f"graph replays: {graph.get('launches', 0):,} cudaGraphLaunch calls; {graph.get('replayed_kernels', 0):,} "
            f"kernels carry a graph launch's correlation id, {graph.get('replayed_write_kernels', 0):,} of them write "
            f"kernels, in {graph.get('replays_with_writes', 0):,} replays",
            "write µs: the step's write kernels' durations; GPU busy µs: any GPU work in the step's GPU window; "
            "share: the write kernels' union over that busy time",
        ]
        notes += [f"{u.get('kernels'):,} write kernels not tied: {u.get('reason')}" for u in t.get("unassigned") or []
                  if u.get("reason") != t.get("no_steps_reason")]
        steps = pd.DataFrame([{
            "step": s.get("step"), "writes": s.get("writes"), "layers": s.get("layers"),
            "write µs": _us(s.get("write_kernel_ns")), "GPU busy µs": _us(s.get("gpu_busy_ns")),
            "share %": round(s["share"] * 100, 2) if isinstance(s.get("share"), (int, float)) else None,
            "graph launch": s.get("graph_launch") if s.get("graph_launch") is not None else "eager",
        } for s in t.get("steps") or []])
        sl = t.get("step_layer") or {}
        layers = sl.get("layers") or []
        step_layer = pd.DataFrame([{"step": r.get("step"),
                                    **{f"L{layer}": _us(v) for layer, v in zip(layers, r.get("ns") or [])}}
                                   for r in sl.get("rows") or []])
        out.append(EngineView(trace=name, rank=t.get("rank"), method=t.get("step_method"),
                              reason=t.get("no_steps_reason"), notes=notes, steps=steps, step_layer=step_layer))
    return out
