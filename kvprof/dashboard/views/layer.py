"""Layer: the rotary fused into the write against the two as separate kernels, and what PDL hides
in a decoder layer (kvprof.dashboard.layer_view; the HTML report shows the same)."""

from __future__ import annotations

import streamlit as st

from kvprof.analysis.compare import Benchmark
from kvprof.core.errors import rendered
from kvprof.dashboard import memo
from kvprof.dashboard.layer_view import GAP_INTRO, PDL_INTRO, ROPE_INTRO
from kvprof.dashboard.settings import setting_names
from kvprof.dashboard.state import Context
from kvprof.dashboard.ui import md, show_figure, show_table
from kvprof.dashboard.views.common import esc, intro, need_run, source_label


def render(ctx: Context) -> None:
    if not need_run(ctx):
        return
    assert ctx.run is not None
    summary = ctx.summary()
    label = ctx.run.label
    st.subheader(f"Layer · {md(label)}")
    layers = int((summary.get("comparison") or {}).get("layers") or Benchmark().layers)
    intro(f"What fusing the rotary into the write saves per decode step ({layers} layers), and what programmatic "
          f"dependent launch hides inside a decoder layer; charts from <b>{esc(source_label(ctx.source, summary))}"
          "</b> where it has the figures.")
    view = memo.layer_for(ctx.run, ctx.source, tuple(ctx.variants), layers)
    names = setting_names()

    st.markdown("#### Rotary fused into the write")
    st.caption(ROPE_INTRO)
    rope = view.figure("rope")
    if rope is not None:
        show_figure(rope, f"rope-saving-{label}")
    for n in view.rope_notes:
        (st.caption if rope is not None else st.info)(md(rendered(n, names)))
    if len(view.rope_text):
        show_table(view.rope_text, f"rope-{label}", caption="per source, each named with its clock")

    st.markdown("#### In the decoder layer: what PDL hides")
    st.caption(PDL_INTRO)
    pdl = view.figure("pdl")
    if pdl is not None:
        show_figure(pdl, f"pdl-overlap-{label}")
    for n in view.pdl_notes:
        (st.caption if pdl is not None else st.info)(md(rendered(n, names)))
    if len(view.pdl_text):
        show_table(view.pdl_text, f"pdl-{label}", caption="medians over the traced writes of each variant and size")
    if view.gap_notes:
        st.markdown("#### Measured in the layer, projected from the writes alone")
        st.caption(GAP_INTRO)
        st.markdown("\n".join(f"- {md(n)}" for n in view.gap_notes))
