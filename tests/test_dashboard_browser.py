"""The dashboard in a real headless Chromium: start it on a free localhost port, switch every
page, check that Plotly drew its charts, save screenshots under test-artifacts/dashboard/.

Needs Debian's chromium at /usr/bin/chromium (apt-get install -y chromium) and the playwright
package (its driver only: never `playwright install`). Skips with the reason when either is
missing; CI installs both, so there it runs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dashboard_support import LAYERS, REPO, dash_runs, gpu_layer_summary  # noqa: F401
from kvprof.core.errors import ToolError
from kvprof.tools.background import BackgroundServer, free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # a server and a Chromium for the module

CHROMIUM = Path(os.environ.get("KVPROF_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = REPO / "test-artifacts" / "dashboard"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
# page -> (heading it shows, charts it draws with the H200 run open)
PAGES = {
    "Overview": ("Overview · h200", 4),
    "Timeline": ("Timeline · h200", 1),
    "Distributions": ("Distributions · h200", 2),
    "Sweeps": ("Sweeps", 2),
    "Overlap": ("Overlap · h200", 3),
    "Layer": ("Layer · h200", 0),
    "Compare runs": ("Compare runs", 1),
}


def _requirements() -> str | None:
    import importlib.util

    if importlib.util.find_spec("streamlit") is None:
        return "streamlit is not installed (pip install -e '.[dashboard]')"
    if not CHROMIUM.is_file():
        return f"{CHROMIUM} is missing (apt-get install -y chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing (pip install playwright; no browser download needed)"
    return None


@pytest.fixture(scope="module")
def app_url(dash_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    reason = _requirements()
    if reason:
        pytest.skip(reason)
    port = free_port()
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    env = {**os.environ, "KVPROF_DASHBOARD_ROOTS": str(dash_runs["h200"].parent),
           "KVPROF_DASHBOARD_RUN": str(dash_runs["h200"]),
           "KVPROF_DASHBOARD_CACHE": str(tmp_path_factory.mktemp("cache"))}
    server = BackgroundServer(
        [sys.executable, "-m", "kvprof.dashboard.serve", "run", str(REPO / "kvprof" / "dashboard" / "app.py"),
         "--server.headless", "true", "--server.address", "127.0.0.1", "--server.port", str(port),
         "--browser.gatherUsageStats", "false"], port, env=env, cwd=REPO, log=log)
    try:
        with server.running(limit_s=60) as url:
            yield url.rstrip("/")
    except ToolError as exc:
        pytest.fail(f"streamlit did not start: {exc}")


@pytest.fixture(scope="module")
def page(app_url: str) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        pg = browser.new_page(viewport={"width": 1400, "height": 2200})
        pg.set_default_timeout(60_000)
        yield pg
        browser.close()


def _settle(pg: object) -> None:
    """Wait until the script run is over: no 'Running...' status and no element left over from the
    previous run (Streamlit marks those data-stale until the run that replaces them ends)."""
    pg.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]') && "  # type: ignore[attr-defined]
                         "!document.querySelector('[data-stale=\"true\"]')")
    pg.wait_for_timeout(300)  # type: ignore[attr-defined]


def _charts_drawn(pg: object, n: int) -> int:
    pg.wait_for_function(  # type: ignore[attr-defined]
        "() => [...document.querySelectorAll('.js-plotly-plot')]"
        f".filter(e => e.querySelector('.main-svg')).length >= {n}")
    return int(pg.locator(".js-plotly-plot").count())  # type: ignore[attr-defined]


# Every drawn chart, as Plotly holds it in the page: traces (variant, colour, values), the y axes'
# full ranges and types, the limit lines (shapes) and their labels (annotations), and meta.
CHART_FACTS = """() => [...document.querySelectorAll('.js-plotly-plot')].filter(e => e._fullLayout).map(e => {
  const fl = e._fullLayout;
  const axes = {};
  for (const k of Object.keys(fl)) if (/^yaxis\\d*$/.test(k)) axes[k.replace('axis', '')] =
      {type: fl[k].type, range: fl[k].range, fixed: !!(e.layout[k] && e.layout[k].range)};
  const num = v => (v && v.length !== undefined && typeof v !== 'string') ? Array.from(v).map(Number) : [];
  return {
    title: (fl.title && fl.title.text) || '', meta: e.layout.meta || null,
    traces: e._fullData.map(t => ({name: t.name, group: t.legendgroup || '', type: t.type, yaxis: t.yaxis || 'y',
      orientation: t.orientation || 'v', limit: (t._input && t._input.meta) === 'limit' || t.meta === 'limit',
      colour: (t.marker && typeof t.marker.color === 'string') ? t.marker.color : (t.line && t.line.color) || null,
      y: num(t.y), up: (t.error_y && t.error_y.visible) ? num(t.error_y.array) : [],
      down: (t.error_y && t.error_y.visible) ? num(t.error_y.arrayminus) : []})),
    shapes: (e.layout.shapes || []).map(s => ({name: s.name, yref: s.yref, y: s.y0})),
    annotations: (e.layout.annotations || []).map(a => ({name: a.name, yref: a.yref, y: a.y})),
    axes};
})"""
MARGIN = 1.3  # log axes: at most this factor beyond the drawn values; linear: this share of the span


def check_chart(c: dict, where: str) -> dict[str, str]:
    """Range within the data x a small margin, labels on their lines; returns variant -> colour."""
    from kvprof.core import variants

    colours: dict[str, str] = {}
    if (c["meta"] or {}).get("empty"):
        return colours
    for t in c["traces"]:
        g = t["group"]
        if g and not g.startswith("limit:") and t["colour"] and g != "not in a write":
            assert t["colour"].lower() == variants.colour(g), (where, c["title"], g, t["colour"])
            colours.setdefault(g, t["colour"].lower())
    bounded = (c["meta"] or {}).get("bounded") == "percent"
    for ref, ax in c["axes"].items():
        vals = []
        for t in c["traces"]:
            if t["yaxis"] != ref or t["limit"] or t["orientation"] == "h" or t["type"] in ("histogram",):
                continue
            ys = t["y"]
            vals += ys
            if t["up"]:
                vals += [y + u for y, u in zip(ys, t["up"])]
                vals += [y - d for y, d in zip(ys, t["down"] or t["up"])]
        vals += [s["y"] for s in c["shapes"] if s["yref"] == ref]
        vals = [v for v in vals if v == v]
        if not vals or bounded or ax["type"] == "category" or not ax["fixed"]:
            continue
        lo, hi = ax["range"]
        if ax["type"] == "log":
            pos = [v for v in vals if v > 0]
            assert 10 ** lo >= min(pos) / MARGIN * 0.999 and 10 ** hi <= max(pos) * MARGIN * 1.001, (where, c["title"])
            clipped = (c["meta"] or {}).get("clipped_above") is not None
            assert 10 ** lo <= min(pos) * 1.001 or clipped, (where, c["title"])
        else:
            dlo, dhi = min(0.0, min(vals)), max(0.0, max(vals))
            span = (dhi - dlo) or 1.0
            assert lo >= dlo - MARGIN * span * 0.3 and hi <= dhi + span * 0.3, (where, c["title"], lo, hi, dlo, dhi)
    # a limit line is named in the legend, not by text over the bars and lines
    assert not [a for a in c["annotations"] if (a["name"] or "").startswith("limit:")], (where, c["title"])
    groups = {t["group"] for t in c["traces"] if t["limit"]}
    for s in c["shapes"]:
        if (s["name"] or "").startswith("limit:"):
            assert s["name"] in groups, (where, c["title"], s["name"])
    return colours


def visit_every_page(pg: object, url: str, tag: str) -> dict[str, str]:
    """Every page: no exception, no None in tables, charts pass check_chart; a screenshot each."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.goto(url)  # type: ignore[attr-defined]
    pg.wait_for_selector('[data-testid="stMain"] h3')  # type: ignore[attr-defined]
    sidebar = pg.locator('[data-testid="stSidebar"]')  # type: ignore[attr-defined]
    colours: dict[str, str] = {}
    for name in PAGES:
        sidebar.get_by_text(name, exact=True).click()
        pg.locator('[data-testid="stMain"] h3').filter(has_text=name.split()[0]).first.wait_for()  # type: ignore[attr-defined]
        _settle(pg)
        assert pg.locator('[data-testid="stException"]').count() == 0, (tag, name)  # type: ignore[attr-defined]
        cells = pg.locator('[data-testid="kvprof-table"] td, [data-testid="stTable"] td').all_inner_texts()  # type: ignore[attr-defined]
        assert not {c.strip() for c in cells} & {"None", "nan", "NaN"}, (tag, name)
        if name == "Overview":  # the static tables reach the page (the HTML sanitizer keeps them)
            pg.locator('[data-testid="kvprof-table"] td').first.wait_for()  # type: ignore[attr-defined]
            cells = pg.locator('[data-testid="kvprof-table"] td').all_inner_texts()  # type: ignore[attr-defined]
            assert "not fused" in {c.strip() for c in cells}, (tag, cells[:20])
            assert not {c.strip() for c in cells} & {"None", "nan", "NaN"}, (tag, name)
        assert pg.locator('[data-testid="page-intro"]').count() == 1, (tag, name)  # type: ignore[attr-defined]
        for c in pg.evaluate(CHART_FACTS):  # type: ignore[attr-defined]
            for v, col in check_chart(c, f"{tag}/{name}").items():
                assert colours.setdefault(v, col) == col, (tag, name, v)  # one colour per variant, every page
        pg.screenshot(path=str(ARTIFACTS / f"{tag}-{name.split()[0].lower()}.png"), full_page=True)  # type: ignore[attr-defined]
    return colours


def test_every_page_renders_its_charts(page: object, app_url: str) -> None:
    pg = page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    pg.goto(app_url)  # type: ignore[attr-defined]
    pg.wait_for_selector(".js-plotly-plot")  # type: ignore[attr-defined]
    first = time.perf_counter() - t
    sidebar = pg.locator('[data-testid="stSidebar"]')  # type: ignore[attr-defined]
    for name, (heading, n_charts) in PAGES.items():
        sidebar.get_by_text(name, exact=True).click()
        pg.locator('[data-testid="stMain"] h3').filter(has_text=heading).first.wait_for()  # type: ignore[attr-defined]
        _settle(pg)
        assert _charts_drawn(pg, n_charts) >= n_charts, name
        assert pg.locator('[data-testid="stException"]').count() == 0, name  # type: ignore[attr-defined]
        if name == "Timeline":  # bars really drawn: Plotly's bar points in the SVG
            assert pg.locator(".js-plotly-plot .barlayer .point").count() > 10  # type: ignore[attr-defined]
    print(f"first page with charts in {first:.1f} s")


def test_samples_and_a_cpu_run_every_page_checked(page: object, app_url: str) -> None:
    """The committed H200 samples and a CPU-only run: every page, every chart checked, one colour per variant."""
    samples = visit_every_page(page, f"{app_url}/?run=h200-llama70b-tp8", "samples")
    assert {"two_stream", "triton_fused", "index_put"} <= set(samples)
    visit_every_page(page, f"{app_url}/?run=cpu-only", "cpu")


def test_bad_upload_is_a_message_in_the_page(page: object, app_url: str, tmp_path: Path) -> None:
    pg = page
    pg.goto(app_url)  # type: ignore[attr-defined]
    pg.wait_for_selector(".js-plotly-plot")  # type: ignore[attr-defined]
    bad = tmp_path / "notes.json"
    bad.write_text("this is not a trace")
    pg.get_by_text("Upload a trace").click()  # type: ignore[attr-defined]
    pg.locator('[data-testid="stSidebar"] input[type="file"]').set_input_files(str(bad))  # type: ignore[attr-defined]
    err = pg.locator('[data-testid="stAlertContentError"]').filter(has_text="not a trace kvprof can read")  # type: ignore[attr-defined]
    err.first.wait_for()
    _settle(pg)
    assert pg.locator('[data-testid="stException"]').count() == 0  # type: ignore[attr-defined]
    assert _charts_drawn(pg, 2) >= 2  # the open run still shows
    pg.screenshot(path=str(ARTIFACTS / "bad-upload.png"))  # type: ignore[attr-defined]


def test_a_cpu_capture_is_labelled_wall_clock_in_the_browser(page: object, tmp_path: Path) -> None:
    """A real CPU capture's HTML report, drawn by Chromium: the clock is the wall clock (never "GPU µs" or
    CUDA events), no ITL share, no empty saving chart; the screenshot is saved for a person to look at."""
    from kvprof.cli import main

    assert main(["capture", "--device", "cpu", "--variants", "index_put,two_stream", "--batch-sizes", "1,8",
                 "--phase", "decode", "--steps", "6", "--warmup", "1", "--no-progress", "--out", str(tmp_path),
                 "--run-id", "cpu-run"]) == 0
    report = tmp_path / "cpu-report.html"
    assert main(["report", str(tmp_path / "cpu-run"), "--html", str(report)]) == 0
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg = page
    pg.goto(report.as_uri())  # type: ignore[attr-defined]
    pg.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 1")  # type: ignore[attr-defined]
    text = pg.inner_text("body")  # type: ignore[attr-defined]
    charts = pg.evaluate(CHART_FACTS)  # type: ignore[attr-defined]
    axes = pg.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map("  # type: ignore[attr-defined]
                       "e => e._fullLayout.yaxis.title.text)")
    pg.screenshot(path=str(ARTIFACTS / "cpu-report.png"), full_page=True)  # type: ignore[attr-defined]
    assert "source: the reference pass (no profiler attached, wall clock)" in text
    assert "CUDA events" not in text and "GPU µs" not in text
    assert axes == ["µs per write (wall clock)"]  # one chart: the cost; no empty saving chart
    assert len(charts) == 1 and "µs per write (wall clock)" in charts[0]["title"]
    assert "no chart of ms saved per decode step: a CPU's wall clock says nothing of a GPU's decode step" in text
    assert "n/a (CPU)" in text
    check_chart(charts[0], "cpu-report")


def test_layer_views_in_the_browser(page: object, app_url: str, dash_runs: dict[str, Path], tmp_path: Path) -> None:
    """The rotary-fusion and PDL views drawn by Chromium: the real CPU layer capture's Layer page and
    HTML report (wall clock, n/a with its reason, no empty chart), and a GPU layer run's report
    (built from typed inputs: no GPU here) whose four charts pass check_chart."""
    from kvprof.cli import main
    from kvprof.dashboard import html_report, landing

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg = page
    pg.goto(f"{app_url}/?page=layer&run=layer-rope")  # type: ignore[attr-defined]
    pg.locator('[data-testid="stMain"] h3').filter(has_text="Layer · layer-rope").first.wait_for()  # type: ignore[attr-defined]
    pg.get_by_text("In the decoder layer: what PDL hides").first.wait_for()  # type: ignore[attr-defined]
    _settle(pg)
    assert pg.locator('[data-testid="stException"]').count() == 0  # type: ignore[attr-defined]
    pg.locator('[data-testid="kvprof-table"] td').first.wait_for()  # type: ignore[attr-defined]
    main_text = pg.inner_text('[data-testid="stMain"]')  # type: ignore[attr-defined]
    assert "Rotary fused into the write" in main_text and "In the decoder layer: what PDL hides" in main_text
    assert "a CPU's wall clock says nothing of a GPU's decode step" in main_text
    cells = {c.strip() for c in pg.locator('[data-testid="kvprof-table"] td').all_inner_texts()}  # type: ignore[attr-defined]
    # rope_triton_fused ran in Triton's interpreter (the capture's manifest): marked, its times too
    assert {"n/a (CPU)", "n/a (prefill)", "rope_triton_fused *"} <= cells and not cells & {"None", "nan", "NaN"}
    assert any(c.endswith(" *") and c[0].isdigit() for c in cells)
    assert pg.locator(".js-plotly-plot").count() == 0  # type: ignore[attr-defined]
    pg.screenshot(path=str(ARTIFACTS / "layer-rope-layer.png"), full_page=True)  # type: ignore[attr-defined]

    cpu_report = tmp_path / "layer-rope.html"
    assert main(["report", str(dash_runs["layer-rope"]), "--html", str(cpu_report)]) == 0
    pg.goto(cpu_report.as_uri())  # type: ignore[attr-defined]
    pg.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 1")  # type: ignore[attr-defined]
    text = pg.inner_text("body")  # type: ignore[attr-defined]
    assert "Rotary fused into the write" in text and "fused: µs/write (wall clock)" in text
    assert "no write boundaries: this run's traces have no GPU events" in text
    assert [c["meta"]["chart"] for c in pg.evaluate(CHART_FACTS)] == ["landing_cost"]  # type: ignore[attr-defined]
    pg.screenshot(path=str(ARTIFACTS / "layer-rope-report.png"), full_page=True)  # type: ignore[attr-defined]

    summary, _ = gpu_layer_summary()
    gpu_report = tmp_path / "gpu-layer.html"
    gpu_report.write_text(html_report.render(landing.build("gpu-layer", summary, source="reference", layers=LAYERS)))
    pg.goto(gpu_report.as_uri())  # type: ignore[attr-defined]
    pg.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 4")  # type: ignore[attr-defined]
    charts = pg.evaluate(CHART_FACTS)  # type: ignore[attr-defined]
    assert [c["meta"]["chart"] for c in charts] == ["landing_cost", "landing_saving", "rope_saving", "pdl_overlap"]
    for c in charts:
        check_chart(c, "gpu-layer-report")
    assert pg.locator("#pdl ~ div .js-plotly-plot .bartext").count() >= 3  # type: ignore[attr-defined]
    pg.screenshot(path=str(ARTIFACTS / "gpu-layer-report.png"), full_page=True)  # type: ignore[attr-defined]
