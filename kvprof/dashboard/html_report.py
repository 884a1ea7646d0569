"""The landing view of a run as one self-contained HTML file (``kvprof report RUN --html OUT``).

Plotly's JavaScript is inlined once (about 4.5 MB), so the file opens offline, from an
e-mail attachment or a CI artefact, with the charts interactive; each chart's camera
button saves a PNG. No torch, no Streamlit: only pandas and Plotly.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone

from kvprof import __version__
from kvprof.core.atomic import atomic_file
from kvprof.dashboard.landing import Landing
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


def render(land: Landing) -> str:
    """The HTML document for one landing view."""
    e = html.escape
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>kvprof report · {e(land.run)}"
             f"</title><style>{CSS}</style></head><body>",
             f"<h1>kvprof report · {e(land.run)}</h1>",
             f"<p class='sub'>{e(land.device)} · source: {e(land.timing.words)} · baseline: "
             f"{e(str(land.baseline))} · kvprof {e(__version__)} · "
             f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}</p>",
             f"<p class='head'>{e(land.headline)}</p>"]
    first = True
    for _name, fig in land.figures:
        parts.append(fig.to_html(full_html=False, include_plotlyjs=True if first else False,
                                 config={"displaylogo": False}))
        first = False
    parts += [f"<p class='note'>{e(n)}</p>" for n in land.notes]
    parts.append("<h2>Per variant and phase</h2>" + _table_html(landing_table(land.frame, land.timing)))
    parts.append("<h2>Fused or fell back</h2>" + _table(land.verdicts))
    parts.append("</body></html>")
    return "\n".join(parts)


def _table_html(shown) -> str:  # noqa: ANN001
    return shown.to_html(index=False, escape=True, border=0)


@register("html", Landing)
class HtmlReport:
    """The landing view as one HTML file, written atomically to ``out.path``."""

    def render(self, result: Landing, out: Output) -> None:
        with atomic_file(out.need_path(), "w") as fh:
            fh.write(render(result))
