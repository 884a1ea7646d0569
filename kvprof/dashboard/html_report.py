"""The landing view of a run as one self-contained HTML file (``kvprof report RUN --html OUT``),
followed by the run's decoder-layer views where it has rotary variants or the layer context.

Plotly's JavaScript is inlined once (about 4.5 MB), so the file opens offline, from an
e-mail attachment or a CI artefact, with the charts interactive; each chart's camera
button saves a PNG. No torch, no Streamlit: only pandas and Plotly.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from datetime import datetime, timezone

import plotly.graph_objects as go

from kvprof import __version__
from kvprof.core.atomic import atomic_file
from kvprof.core.errors import rendered
from kvprof.dashboard.engine_view import EngineView
from kvprof.dashboard.landing import Landing
from kvprof.dashboard.layer_view import GAP_INTRO, PDL_INTRO, ROPE_INTRO, LayerView
from kvprof.dashboard.tables import display, landing_table
from kvprof.report.renderers import Output, register

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 6px}
p.sub{color:#555;margin:0 0 14px} p.head{font-size:16px;font-weight:600}
p.note{color:#555;font-size:13px;margin:2px 0}
table{border-collapse:collapse;font-size:13px;margin:6px 0 16px}
th,td{border-bottom:1px solid #ddd;padding:4px 10px;text-align:right;white-space:nowrap}
th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}
"""


def _table(df) -> str:  # noqa: ANN001
    return display(df).to_html(index=False, escape=True, border=0)


def _layer_sections(view: LayerView, figure: Callable[[go.Figure], str], names: Callable[[str], str]) -> list[str]:
    """The rotary-fusion and PDL sections of a run that has either: chart or why, notes (the
    settings they name spelled by ``names``), table."""
    e = html.escape
    parts = []
    if view.has_rope:
        parts.append(f"<h2 id='rope'>Rotary fused into the write</h2><p class='note'>{e(ROPE_INTRO)}</p>")
        rope = view.figure("rope")
        parts += [figure(rope)] if rope is not None else []
        parts += [f"<p class='note'>{e(rendered(n, names))}</p>" for n in view.rope_notes]
        if len(view.rope_text):
            parts.append(_table_html(view.rope_text))
    if view.has_layer:
        parts.append(f"<h2 id='pdl'>In the decoder layer: what PDL hides</h2><p class='note'>{e(PDL_INTRO)}</p>")
        pdl = view.figure("pdl")
        parts += [figure(pdl)] if pdl is not None else []
        parts += [f"<p class='note'>{e(rendered(n, names))}</p>" for n in view.pdl_notes]
        if len(view.pdl_text):
            parts.append(_table_html(view.pdl_text))
        if view.gap_notes:
            parts.append(f"<h2 id='gaps'>Measured in the layer, projected from the writes alone</h2>"
                         f"<p class='note'>{e(GAP_INTRO)}</p>")
            parts += [f"<p class='note'>{e(n)}</p>" for n in view.gap_notes]
    return parts


def engine_sections(views: list[EngineView], figure: Callable[[go.Figure], str]) -> list[str]:
    """Per engine trace: its steps (or why none), where each figure comes from, the write time per step and layer."""
    e = html.escape
    parts = []
    for v in views:
        parts.append(f"<h2 id='engine-{e(v.trace)}'>Engine trace {e(v.trace)} (rank {e(str(v.rank))}): KV writes "
                     "per step and layer</h2>")
        if v.reason:
            parts.append(f"<p class='note'>{e(v.reason)}</p>")
        parts += [f"<p class='note'>{e(n)}</p>" for n in v.notes]
        fig = v.figure()
        parts += [figure(fig)] if fig is not None else []
        if len(v.steps):
            parts.append("<h3>Steps</h3>" + _table_html(v.steps))
        if len(v.step_layer):
            parts.append("<h3>Write µs per step and layer</h3>" + _table_html(v.step_layer))
    return parts


def render(land: Landing, names: Callable[[str], str] = str) -> str:
    """The HTML document for one landing view, then the run's decoder-layer views where it has them
    (``names``: how a note spells a setting it names)."""
    e = html.escape
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>kvprof report · {e(land.run)}"
             f"</title><style>{CSS}</style></head><body>",
             f"<h1>kvprof report · {e(land.run)}</h1>",
             f"<p class='sub'>{e(land.device)} · source: {e(land.timing.words)} · baseline: "
             f"{e(str(land.baseline))} · kvprof {e(__version__)} · "
             f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}</p>",
             f"<p class='head'>{e(land.headline)}</p>"]
    drawn: list[go.Figure] = []

    def figure(fig: go.Figure) -> str:
        """plotly.js inlined once, with the first chart."""
        drawn.append(fig)
        return fig.to_html(full_html=False, include_plotlyjs=len(drawn) == 1, config={"displaylogo": False})

    parts += [figure(fig) for _name, fig in land.figures]
    parts += [f"<p class='note'>{e(n)}</p>" for n in land.notes]
    parts.append("<h2>Per variant and phase</h2>" + _table_html(landing_table(land.frame, land.timing)))
    parts.append("<h2>Fused or fell back</h2>" + _table(land.verdicts))
    if land.layer is not None and not land.layer.empty:
        parts += _layer_sections(land.layer, figure, names)
    parts += engine_sections(land.engine, figure)
    parts.append("</body></html>")
    return "\n".join(parts)


def _table_html(shown) -> str:  # noqa: ANN001
    return shown.to_html(index=False, escape=True, border=0)


@register("html", Landing)
class HtmlReport:
    """The landing view as one HTML file, written atomically to ``out.path``."""

    writes_file = True

    def render(self, result: Landing, out: Output) -> None:
        with atomic_file(out.need_path(), "w") as fh:
            fh.write(render(result, out.names))
