"""How fast the dashboard shows its first page: the samples, and a ~100 MB trace.

    python benchmarks/bench_dashboard.py [--samples DIR] [--mb 100] [--repeat 3] [--no-browser] [--code CHECKOUT]
                                         [--timeline] [--cpu-profile]

Two measurements per data set, each from a fresh process so nothing is warm by accident:
- AppTest (streamlit.testing): the server-side script run of the first page, in a new
  process (imports included: what a freshly started server pays), then in a new session of
  a warm process, then every other page;
- a real headless Chromium (Debian's /usr/bin/chromium) against the server ``kvprof dashboard``
  starts (``python -m kvprof.dashboard.serve``; plain ``streamlit run`` for a --code checkout
  that predates it): from
  ``goto`` to the first chart drawn (a Plotly bar in the SVG: the target), and to the page
  complete (every chart of the first page drawn and the script run over) -- first visit of
  a just-started server, a new browser (empty cache) on a warm server, and a reload.
Data sets: the samples under traces/samples (when that is empty, the real H200 fixture
tests/fixtures/real analysed into a temp folder, and the table says so); a synthesized
kvprof-shaped Kineto trace of --mb MB uncompressed (kvprof.trace.synthetic via
benchmarks/bench_load.py) both before analyze has run (the dashboard runs the pipeline) and
after (its summary/parquet files present). Targets: samples < 3 s, 100 MB trace < 15 s.
For scale, the same browser measurement of a data-free Streamlit app with the same kinds
of widgets and one chart (Streamlit's and Plotly's own front-end cost on this machine).
The 1-minute load average is printed before and after each browser measurement: other work
on the machine shows in these figures (the "after" includes this benchmark's own browser).
``--code CHECKOUT`` measures another checkout's dashboard on the same data sets, e.g. an
earlier commit unpacked with ``git archive COMMIT | tar -x -C CHECKOUT``: a before/after on
one machine in one session. ``--timeline`` adds new-browser visits that note when the page
script loaded, the first websocket message, the Plotly chunk's request and arrival and the
first bar; ``--cpu-profile`` one visit under Chromium's sampling profiler.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvprof.core.errors import ToolError
from kvprof.tools.background import BackgroundServer, free_port

ROOT = Path(__file__).resolve().parents[1]
Row = tuple[str, str, Any, str]  # data set, measurement, seconds (or a list of them, or a note), target
CODE = ROOT  # the checkout whose dashboard is measured (--code): the samples and this script stay ROOT's


def dashboard_app() -> Path:
    return CODE / "kvprof" / "dashboard" / "app.py"
PAGES = ("Overview", "Timeline", "Distributions", "Sweeps", "Overlap", "Compare runs")
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from streamlit.testing.v1 import AppTest
t1 = time.perf_counter()
app, pages = sys.argv[1], sys.argv[2].split(",")
out = {"import_s": t1 - t0, "pages": {}, "problems": []}
def problems(at):
    return [str(e.value)[:200] for e in at.exception] + [str(e.value)[:200] for e in at.error]
at = AppTest.from_file(app, default_timeout=900)
t = time.perf_counter(); at.run(); out["first_s"] = time.perf_counter() - t
out["charts"] = len(at.get("plotly_chart")); out["problems"] += problems(at)
t = time.perf_counter(); AppTest.from_file(app, default_timeout=900).run()
out["warm_session_s"] = time.perf_counter() - t
for p in pages:
    t = time.perf_counter(); at.sidebar.radio(key="nav_page").set_value(p).run()
    out["pages"][p] = time.perf_counter() - t; out["problems"] += problems(at)
print(json.dumps(out))
"""


def env_for(root: Path, run: Path, cache: Path, code: Path | None = None) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(code or CODE), "KVPROF_DASHBOARD_ROOTS": str(root),
            "KVPROF_DASHBOARD_RUN": str(run), "KVPROF_DASHBOARD_CACHE": str(cache)}


def apptest(root: Path, run: Path, cache: Path) -> dict[str, Any]:
    # cwd: `python -c` puts the working folder first on sys.path, so it must be the measured checkout
    res = subprocess.run([sys.executable, "-c", CHILD, str(dashboard_app()), ",".join(PAGES)], capture_output=True,
                         text=True, cwd=CODE, env=env_for(root, run, cache), timeout=1800)
    if res.returncode != 0:
        return {"error": (res.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(res.stdout.strip().splitlines()[-1])


FLOOR_APP = """
import plotly.graph_objects as go
import streamlit as st
st.sidebar.radio("Page", ["a", "b"])
st.sidebar.selectbox("root", ["x", "y"])
with st.sidebar.expander("Upload"):
    st.file_uploader("up")
st.sidebar.multiselect("v", ["a", "b"], default=["a", "b"])
st.dataframe({"a": [1, 2]})
st.number_input("n", value=3)
st.metric("m", "3 ms", delta="-1")
st.download_button("d", data=b"x")
st.plotly_chart(go.Figure(go.Bar(x=[1, 2], y=[3, 4])))
"""


# A Plotly chart with data drawn: an SVG bar (or marker) of a trace, not only an empty axis.
FIRST_CHART = "() => !!document.querySelector('.js-plotly-plot .barlayer .point, .js-plotly-plot .scatterlayer .point')"
# The page complete: n charts drawn, the script run over (no status widget, nothing left stale).
COMPLETE = ("n => [...document.querySelectorAll('.js-plotly-plot')].filter(e => e.querySelector('.main-svg'))"
            ".length >= n && !document.querySelector('[data-testid=\"stStatusWidget\"]') && "
            "!document.querySelector('[data-stale=\"true\"]')")


WAIT_MS = 180_000  # a page not drawn by then is reported as an error, not waited on


def _visit(pg: Any, go: Any, charts: int) -> tuple[float, float]:
    """Seconds from ``go()`` (goto or reload) to the first chart drawn, and to the page complete."""
    t = time.perf_counter()
    go()
    pg.wait_for_function(FIRST_CHART, polling=20)
    first = time.perf_counter() - t
    pg.wait_for_function(COMPLETE, arg=charts, polling=20)
    return first, time.perf_counter() - t


def browser(root: Path, run: Path, cache: Path, charts: int, repeat: int, app: Path | None = None,
            profile: bool = False, timeline: bool = False) -> dict[str, Any]:
    """goto -> first chart drawn, and -> every first-page chart drawn with the run over: a just-started
    server, a new browser (empty cache) on a warm server, a reload; then page switches. ``profile``:
    one more new-browser visit under Chromium's CPU profiler (``profiled_visit``)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout, sync_playwright

    app = app or dashboard_app()
    server = start_server(CODE, app, env_for(root, run, cache))
    url = server.url
    out: dict[str, Any] = {k: [] for k in ("new_browser_s", "new_browser_complete_s", "reload_s", "reload_complete_s")}
    out["pages"] = {}
    try:
        try:
            out["server_start_s"] = server.wait_healthy()
        except ToolError as exc:
            return {"error": str(exc)}
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                _visits(b, url, charts, repeat, app, out)
                if timeline:
                    out["timeline"] = timeline_visits(b, url, max(3, repeat))
                if profile:
                    out["profile"] = profiled_visit(b, url, charts)
            except PlaywrightTimeout as exc:
                return {"error": f"not drawn within {WAIT_MS / 1000:.0f} s ({str(exc).splitlines()[0]})"}
            finally:
                b.close()
    finally:
        server.stop()
    return out


def start_server(code: Path, app: Path, env: dict[str, str]) -> BackgroundServer:
    """``app``'s server on a free localhost port, started. The dashboard of a checkout is started
    the way `kvprof dashboard` starts it (its server imports the pages before the first visitor); a
    checkout from before that launcher, or another app (the floor): plain `streamlit run`."""
    serve = (code / "kvprof" / "dashboard" / "serve.py").is_file() and app == code / "kvprof" / "dashboard" / "app.py"
    launcher = "kvprof.dashboard.serve" if serve else "streamlit"
    port = free_port()
    return BackgroundServer([sys.executable, "-m", launcher, "run", str(app), "--server.headless", "true",
                             "--server.address", "127.0.0.1", "--server.port", str(port),
                             "--browser.gatherUsageStats", "false"], port, env=env, cwd=code).start()


def _visits(b: Any, url: str, charts: int, repeat: int, app: Path, out: dict[str, Any]) -> None:
    """``repeat`` new browser contexts: a visit and a reload each; page switches in the last one."""
    for i in range(repeat):
        ctx = b.new_context(viewport={"width": 1400, "height": 1000})
        pg = ctx.new_page()
        pg.set_default_timeout(WAIT_MS)
        first, complete = _visit(pg, lambda: pg.goto(url), charts)
        if i == 0:
            out["first_visit_s"], out["first_visit_complete_s"] = first, complete
        else:
            out["new_browser_s"].append(first)
            out["new_browser_complete_s"].append(complete)
        first, complete = _visit(pg, pg.reload, charts)
        out["reload_s"].append(first)
        out["reload_complete_s"].append(complete)
        if i == repeat - 1 and app == dashboard_app():
            side = pg.locator('[data-testid="stSidebar"]')
            for name in PAGES[1:]:
                t = time.perf_counter()
                side.get_by_text(name, exact=True).click()
                pg.locator('[data-testid="stMain"] h3').filter(has_text=name.split()[0]).first.wait_for()
                pg.wait_for_function(COMPLETE, arg=0, polling=20)  # some pages have no chart for some runs
                out["pages"][name] = time.perf_counter() - t
        ctx.close()


PAGE_FACTS = """() => ({charts: document.querySelectorAll('.js-plotly-plot').length,
  tables: document.querySelectorAll('[data-testid="kvprof-table"] table, [data-testid="stTable"], '
                                     + '[data-testid="stDataFrame"]').length,
  cells: document.querySelectorAll('[data-testid="kvprof-table"] td, [data-testid="stTable"] td').length,
  elements: document.querySelectorAll('[data-testid="stElementContainer"]').length})"""


def profiled_visit(b: Any, url: str, charts: int, top: int = 8) -> dict[str, Any]:
    """A new-browser visit under Chromium's sampling CPU profiler, goto -> first chart drawn: the main
    thread's time by script (self time; '(idle)' is waiting for the network or the server), and what
    the complete first page holds (charts, tables, cells, elements, websocket bytes received)."""
    ctx = b.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.set_default_timeout(WAIT_MS)
    received = [0]
    pg.on("websocket", lambda ws: ws.on("framereceived", lambda f: received.__setitem__(0, received[0] + len(f))))
    cdp = ctx.new_cdp_session(pg)
    cdp.send("Profiler.enable")
    cdp.send("Profiler.setSamplingInterval", {"interval": 500})
    cdp.send("Profiler.start")
    t = time.perf_counter()
    pg.goto(url)
    pg.wait_for_function(FIRST_CHART, polling=20)
    first = time.perf_counter() - t
    prof = cdp.send("Profiler.stop")["profile"]
    pg.wait_for_function(COMPLETE, arg=charts, polling=20)
    facts = pg.evaluate(PAGE_FACTS)
    ctx.close()
    nodes = {n["id"]: n["callFrame"] for n in prof["nodes"]}
    by: dict[str, float] = {}
    for sid, dt in zip(prof["samples"][1:], prof["timeDeltas"][1:]):
        cf = nodes[sid]
        name = cf["url"].rsplit("/", 1)[-1] or cf["functionName"] or "(native)"
        name = name.split(".")[0] + ".js" if name.endswith(".js") else name  # PlotlyChart.<hash>.js -> PlotlyChart.js
        by[name] = by.get(name, 0.0) + dt / 1e6
    ranked = sorted(by.items(), key=lambda kv: -kv[1])
    return {"first_s": first, "total_s": sum(by.values()), "top": ranked[:top], **facts,
            "ws_kb": received[0] / 1024}


# Milestones of a page load, in ms from navigation start (the page's own clock): a MutationObserver
# notes the first bar drawn, a WebSocket wrapper the first message from the server.
MARKS_INIT = """(() => {
  window.__kvprofMarks = {};
  const mark = k => { if (!(k in window.__kvprofMarks)) window.__kvprofMarks[k] = performance.now(); };
  new MutationObserver(() => {
    if (document.querySelector('.js-plotly-plot .barlayer .point, .js-plotly-plot .scatterlayer .point')) mark('bar');
  }).observe(document, {subtree: true, childList: true});
  const WS = window.WebSocket;
  window.WebSocket = function (...a) {
    const w = new WS(...a);
    w.addEventListener('message', () => mark('ws'));
    return w;
  };
  window.WebSocket.prototype = WS.prototype;
})()"""
MARKS = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const plotly = performance.getEntriesByType('resource').find(r => r.name.includes('/PlotlyChart.'));
  return {script: nav.domContentLoadedEventEnd, ws: window.__kvprofMarks.ws,
          plotly_asked: plotly && plotly.startTime, plotly_got: plotly && plotly.responseEnd,
          bar: window.__kvprofMarks.bar};
}"""
TIMELINE = (("script", "Streamlit's page script loaded (DOMContentLoaded)"), ("ws", "first websocket message"),
            ("plotly_asked", "Plotly chunk (4.7 MB) requested"), ("plotly_got", "Plotly chunk received"),
            ("bar", "first bar drawn"))


def timeline_visits(b: Any, url: str, n: int) -> dict[str, list[float]]:
    """``n`` new-browser visits with milestones (TIMELINE) in ms from navigation start: where the
    seconds before the first chart go (no profiler attached)."""
    out: dict[str, list[float]] = {k: [] for k, _ in TIMELINE}
    for _ in range(n):
        ctx = b.new_context(viewport={"width": 1400, "height": 1000})
        pg = ctx.new_page()
        pg.set_default_timeout(WAIT_MS)
        pg.add_init_script(MARKS_INIT)
        pg.goto(url)
        pg.wait_for_function(FIRST_CHART, polling=20)
        pg.wait_for_timeout(300)  # the resource entry of the chunk is complete by then
        for k, v in pg.evaluate(MARKS).items():
            if v is not None:
                out[k].append(float(v))
        ctx.close()
    return out


def samples_root(arg: Path | None, tmp: Path) -> tuple[Path, Path, str]:
    sys.path.insert(0, str(ROOT))
    from kvprof.dashboard.data import analyse_to, discover_runs

    root = (arg or ROOT / "traces" / "samples").resolve()
    runs = [e for e in discover_runs(root) if e.analysed] or discover_runs(root)
    if runs:
        shown = root.relative_to(ROOT) if root.is_relative_to(ROOT) else root
        return root, runs[0].path, f"samples: {shown}/{runs[0].rel}"
    fx = tmp / "samples" / "h200-fixture"
    shutil.copytree(ROOT / "tests" / "fixtures" / "real", fx)
    analyse_to(fx, fx)
    return fx.parent, fx, f"SAMPLES MISSING in {root}: real H200 fixture tests/fixtures/real instead"


def big_run(tmp: Path, mb: int) -> tuple[Path, dict[str, Any]]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from bench_load import synthesize

    d = tmp / "big" / "synthetic-100mb"
    d.mkdir(parents=True)
    info = synthesize(d / "two_stream.pt.trace.json.gz", mb)
    return d, info


def browser_rows(rows: list[Row], name: str, b: dict[str, Any], target: str,
                 charts: int) -> None:
    """First chart drawn (the target) and the page complete, for each kind of visit; the CPU profile."""
    done = f"all {charts} chart(s), run over"
    for what, key in (("first visit, server just started", "first_visit"),
                      ("new browser, empty cache, warm server", "new_browser"), ("reload (cached assets)", "reload")):
        rows.append((name, f"browser: {what}: first chart", b[f"{key}_s"], target))
        rows.append((name, f"browser: {what}: {done}", b[f"{key}_complete_s"], ""))
    for key, what in TIMELINE if b.get("timeline") else ():
        ms = b["timeline"][key]
        rows.append((name, f"  new-browser timeline: {what}", [v / 1000 for v in ms] if ms else "n/a", ""))
    prof = b.get("profile")
    if prof:
        rows.append((name, "profiled new-browser visit: first chart (profiler on)", prof["first_s"], ""))
        rows.append((name, "  main thread sampled, goto -> first chart", prof["total_s"], ""))
        for script, sec in prof["top"]:
            rows.append((name, f"  of which {script}", sec, ""))
        rows.append((name, "  first page: charts / tables / table cells / elements",
                     f"{prof['charts']} / {prof['tables']} / {prof['cells']} / {prof['elements']}", ""))
        rows.append((name, "  first page: websocket KB received", prof["ws_kb"], ""))


def fmt(x: Any) -> str:
    if isinstance(x, list):
        if not x:
            return "-"
        m = statistics.median(x)
        return f"{m:.2f} [{min(x):.2f}-{max(x):.2f}] n={len(x)}"  # median [spread]
    return f"{x:.2f}" if isinstance(x, (int, float)) else str(x)


def measure_set(rows: list[Row], name: str, root: Path, run: Path, target: float, args: argparse.Namespace,
                tmp: Path) -> None:
    """One data set: AppTest's first page, warm session and page switches, then (unless
    --no-browser) Chromium's first chart, complete page and page switches."""
    r = apptest(root, run, tmp / f"cache-{name.split()[0]}")
    if "error" in r:
        rows.append((name, "AppTest", r["error"], ""))
        return
    rows.append((name, "AppTest first page, new process", r["first_s"], f"{target:g}"))
    rows.append((name, "AppTest first page, new session (warm process)", r["warm_session_s"], f"{target:g}"))
    rows.append((name, "AppTest imports (streamlit testing)", r["import_s"], ""))
    for p, s in r["pages"].items():
        rows.append((name, f"AppTest switch to {p}", s, ""))
    if r["problems"]:
        rows.append((name, "errors shown", "; ".join(r["problems"])[:300], ""))
    if args.no_browser:
        return
    if not Path(CHROMIUM).is_file():
        rows.append((name, "browser", f"skipped: {CHROMIUM} missing", ""))
        return
    # first chart visible (a drawn bar), and the page complete (all its charts, the run over)
    load0 = os.getloadavg()[0]
    b = browser(root, run, tmp / f"cache-{name.split()[0]}", max(1, int(r["charts"])), args.repeat,
                profile=args.cpu_profile, timeline=args.timeline)
    rows.append((name, "load average (1 min) before / after the browser runs",
                 f"{load0:.2f} / {os.getloadavg()[0]:.2f}", ""))
    if "error" in b:
        rows.append((name, "browser", b["error"], ""))
        return
    rows.append((name, "browser: server start (process up, health ok)", b["server_start_s"], ""))
    browser_rows(rows, name, b, f"{target:g}", int(r["charts"]))
    for p, s in b["pages"].items():
        rows.append((name, f"browser: switch to {p}, run over", s, ""))


def measure_floor(rows: list[Row], args: argparse.Namespace, tmp: Path) -> None:
    """The floor: a data-free app with the same kinds of widgets and one chart, measured the same way."""
    floor = tmp / "floor_app.py"
    floor.write_text(FLOOR_APP)
    load0 = os.getloadavg()[0]
    b = browser(tmp, tmp, tmp / "cache-floor", 1, args.repeat, app=floor, profile=args.cpu_profile,
                timeline=args.timeline)
    if "error" not in b:
        name = "floor: no-data app, same widgets"
        rows.append((name, "load average (1 min) before / after the browser runs",
                     f"{load0:.2f} / {os.getloadavg()[0]:.2f}", ""))
        browser_rows(rows, name, b, "", 1)


def print_rows(rows: list[Row]) -> None:
    """The measurements as one aligned table."""
    w1 = max(len(r[0]) for r in rows)
    w2 = max(len(r[1]) for r in rows)
    print(f"\n{'data set':<{w1}}  {'measurement':<{w2}}  {'seconds':>22}  target s")
    print("-" * (w1 + w2 + 36))
    for name, what, val, target in rows:
        print(f"{name:<{w1}}  {what:<{w2}}  {fmt(val):>22}  {target}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=Path, default=None, help="traces root with the samples (default traces/samples)")
    ap.add_argument("--mb", type=int, default=100, help="size of the synthesized trace, uncompressed MB")
    ap.add_argument("--repeat", type=int, default=3, help="browser visits per data set")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--samples-only", action="store_true", help="skip the synthesized trace")
    ap.add_argument("--cpu-profile", action="store_true",
                    help="one more new-browser visit per data set under Chromium's CPU profiler: where the main "
                         "thread's time goes before the first chart")
    ap.add_argument("--timeline", action="store_true",
                    help="more new-browser visits (at least 3) with milestones: page script loaded, first "
                         "websocket message, Plotly chunk requested and received, first bar")
    ap.add_argument("--code", type=Path, default=None,
                    help="measure the dashboard of another checkout (e.g. an earlier commit, for a before/after); "
                         "the data sets are this checkout's")
    args = ap.parse_args()
    global CODE
    if args.code is not None:
        CODE = args.code.resolve()
        if not (CODE / "kvprof" / "dashboard" / "app.py").is_file():
            print(f"bench_dashboard: {CODE} has no kvprof/dashboard/app.py", file=sys.stderr)
            return 2
        print(f"dashboard code: {CODE}")
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="kvprof-bench-dash-") as t:
        tmp = Path(t)
        s_root, s_run, s_label = samples_root(args.samples, tmp)
        print(f"data set 1: {s_label}")
        t0 = time.perf_counter()
        sets = [("samples", s_root, s_run, 3.0)]
        big, info = big_run(tmp, args.mb if not args.samples_only else 1)
        print(f"data set 2: SYNTHESIZED kvprof-shaped Kineto trace, {info['events']:,} events, "
              f"{info['uncompressed_mb']:.0f} MB uncompressed ({info['gzipped_mb']:.1f} MB gzipped), "
              f"built in {time.perf_counter() - t0:.0f} s; not a real capture")

        # the big trace before analyze ran: the dashboard runs kvprof's pipeline (cache outside the root)
        cache = tmp / "cache"
        r = apptest(big.parent, big, cache) if not args.samples_only else {"error": "skipped (--samples-only)"}
        rows.append((f"{args.mb} MB trace, not analysed", "AppTest first page, new process (runs analyze)",
                     r.get("first_s", r.get("error")), "15"))
        outs = next((cache / "runs").glob("*/summary.json"), None)
        if outs is not None and not args.samples_only:  # the same outputs in the run folder: the analysed case
            for n in ("summary.json", "writes.parquet", "events.parquet"):
                shutil.copy2(outs.parent / n, big / n)
        if not args.samples_only:
            sets.append((f"{args.mb} MB trace, analysed", big.parent, big, 15.0))

        for name, root, run, target in sets:
            measure_set(rows, name, root, run, target, args, tmp)

        if not args.no_browser and Path(CHROMIUM).is_file():
            measure_floor(rows, args, tmp)

    print_rows(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
