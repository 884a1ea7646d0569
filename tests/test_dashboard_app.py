"""Every dashboard page through Streamlit's AppTest: no exception, the tables and charts that
should be there, widgets that change what is shown, and bad input that reads as a message."""

from __future__ import annotations

import gzip
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from dashboard_support import FIXTURE, REPO, dash_env, dash_runs, empty_root_env, synth_spec  # noqa: E402,F401
from kvprof.trace.synthetic import build, dumps  # noqa: E402

APP = str(REPO / "kvprof" / "dashboard" / "app.py")
PAGES = ("Overview", "Timeline", "Distributions", "Sweeps", "Overlap", "Layer", "Compare runs")


def start(page: str | None = None, **query: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    if page:
        at.query_params["page"] = page
    for k, v in query.items():
        at.query_params[k] = v
    return at.run()


def on_kineto(at: AppTest) -> AppTest:
    """These pages' expected numbers are torch.profiler's (the fixture's default source is nsys)."""
    return ok(at.sidebar.radio(key="nav_source::h200").set_value("kineto").run())


def ok(at: AppTest) -> AppTest:
    """No traceback anywhere on the page."""
    assert not at.exception, [e.value for e in at.exception]
    return at


def goto(at: AppTest, page: str) -> AppTest:
    return ok(at.sidebar.radio(key="nav_page").set_value(page).run())


def charts(at: AppTest) -> list[dict[str, Any]]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


class _TableParser(HTMLParser):
    """The <table>s of an st.html block (kvprof.dashboard.tables.html_table) as rows of cell text."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self.tables and self.tables[-1]:
            self.tables[-1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def html_tables(at: AppTest) -> list[pd.DataFrame]:
    """The static tables (st.html blocks of kvprof.dashboard.tables.html_table), header row first."""
    out = []
    for h in at.get("html"):
        if "data-testid='kvprof-table'" not in h.value:
            continue
        parser = _TableParser()
        parser.feed(h.value)
        for rows in parser.tables:
            out.append(pd.DataFrame(rows[1:], columns=rows[0]))
    return out


def tables(at: AppTest) -> list[Any]:
    """Every table on the page (static HTML tables first, then grids), as the text cells shown."""
    return [*html_tables(at), *(t.value for t in at.table), *(d.value for d in at.dataframe)]


def table_with(at: AppTest, *columns: str, n: int = 0) -> Any:
    """The n-th table that has all these columns."""
    return [t for t in tables(at) if set(columns) <= set(t.columns)][n]


def num(v: Any) -> float:
    """A shown cell back to a number ("1,234.5" -> 1234.5, "16,120.000 *" (interpreted) -> 16120.0, "n/a" -> nan)."""
    s = str(v).replace(",", "").removesuffix(" *")
    return float("nan") if s == "n/a" else float(s)


def no_none(at: AppTest) -> None:
    """No table shows None / nan: missing values read n/a."""
    for t in tables(at):
        cells = {str(x) for x in t.to_numpy().ravel()}
        assert not cells & {"None", "nan", "NaN", "<NA>"}, t.columns.tolist()


def texts(elements: Any) -> str:
    """The text as the browser shows it: Markdown backslash escapes (kvprof.dashboard.ui.md) removed."""
    return " | ".join(re.sub(r"\\(.)", r"\1", str(e.value)) for e in elements)


def downloads(at: AppTest) -> list[str]:
    return [d.proto.label for d in at.get("download_button")]


def tree_files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


# ---------------------------------------------------------------------------- pages


def test_overview_verdicts_table_charts_and_widgets(dash_env: dict[str, Path]) -> None:
    at = ok(start())
    assert at.sidebar.selectbox(key="nav_run").value == "h200"
    no_none(at)
    verdicts = table_with(at, "verdict").set_index("variant")["verdict"]
    assert verdicts["triton_fused"] == "fused"
    assert verdicts["two_stream"] == "not fused"
    assert verdicts["sgl_kernel"].startswith("not run (sgl_kernel is not installed")
    table = table_with(at, "speed-up vs baseline")
    # no reference pass in this fixture: the page opens on the less perturbed profiler, and says so
    assert set(table["source"]) == {"nsys"}
    assert "Nsight Systems" in texts(at.markdown)
    at = ok(at.sidebar.radio(key="nav_source::h200").set_value("kineto").run())
    table = table_with(at, "speed-up vs baseline")
    assert set(table["source"]) == {"kineto"}
    assert len(table) == 6
    assert {num(x) for x in table[table["variant"] == "two_stream"]["speed-up vs baseline"]} == {1.0}
    fused = table[(table["variant"] == "triton_fused") & (table["phase"] == "decode")].iloc[0]
    assert num(fused["kernels/write"]) == 1 and num(fused["speed-up vs baseline"]) > 3
    assert num(fused["saving ms/decode step"]) == pytest.approx(0.467, abs=0.01)  # analyze's own projection
    # the headline is the page's source, named
    assert any("saves" in m and "torch.profiler" in m for m in texts(at.markdown).split(" | "))
    figs = charts(at)
    # bars, and the limit lines' legend entries (a line with no points: the label is not over the bars)
    assert len(figs) == 4 and all(t["type"] == "bar" for f in figs for t in f["data"] if t.get("meta") != "limit")
    assert all("torch.profiler" in f["layout"]["title"]["text"] for f in figs)
    assert downloads(at).count("Download chart as HTML") == 4
    assert "Download this view as an HTML report" in downloads(at)

    before = table.set_index(["variant", "phase"])["speed-up vs baseline"]
    ok(at.selectbox(key="ov-baseline").set_value("index_put").run())
    after = table_with(at, "speed-up vs baseline").set_index(["variant", "phase"])["speed-up vs baseline"]
    assert num(after[("index_put", "decode")]) == 1.0
    assert after[("two_stream", "decode")] != before[("two_stream", "decode")]

    ok(at.sidebar.radio(key="nav_source::h200").set_value("nsys").run())
    assert set(table_with(at, "speed-up vs baseline")["source"]) == {"nsys"}

    ok(at.selectbox(key="ov-metric").set_value("kernels per write").run())
    ys = {y for t in charts(at)[2]["data"] for y in _values(t["y"])}
    assert ys == {1.0, 2.0}

    ok(at.sidebar.multiselect(key="nav_variants::h200").set_value(["triton_fused", "two_stream"]).run())
    assert set(table_with(at, "speed-up vs baseline")["variant"]) == {"triton_fused", "two_stream"}


def _values(v: Any) -> list[float]:
    """Plotly JSON arrays: a plain list, or {"dtype", "bdata"} for typed arrays."""
    if isinstance(v, dict) and "bdata" in v:
        import base64

        import numpy as np

        return [float(x) for x in np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))]
    return [float(x) for x in v]


def test_timeline_bars_on_a_us_axis_window_and_trace(dash_env: dict[str, Path]) -> None:
    at = goto(on_kineto(ok(start())), "Timeline")
    (fig,) = charts(at)
    bars = fig["data"]
    assert bars and all(t["type"] == "bar" and t["orientation"] == "h" and "base" in t for t in bars)
    assert fig["layout"]["xaxis"].get("type") in (None, "linear")  # numeric µs, never a date axis
    lanes = {y for t in bars for y in t["y"]}
    assert {"kvprof writes (GPU)", "GPU0 · stream 7"} <= lanes
    assert "hovertemplate" in bars[0] and "grid" in bars[0]["hovertemplate"]
    whole = texts(at.caption)
    assert "of 82 activities" in whole

    ok(at.selectbox(key=next(w.key for w in at.selectbox if w.key.startswith("tl-width"))).set_value("1 ms").run())
    assert "[0.0, 1,000.0] µs" in texts(at.caption)
    ok(at.slider[0].set_value(6000.0).run())
    assert "[6,000.0, 7,000.0] µs" in texts(at.caption)

    summary = json.loads((dash_env["h200"] / "summary.json").read_text())
    nsys = next(t["path"] for t in summary["traces"] if t["source"] == "nsys")
    ok(at.selectbox(key="tl-trace::h200").set_value(nsys).run())
    assert "nsys" in at.selectbox(key="tl-trace::h200").value
    lanes = {y for t in charts(at)[0]["data"] for y in t["y"]}
    assert any(lane.startswith("GPU0 · stream") for lane in lanes) and "kvprof writes (GPU)" in lanes


def test_distributions_kinds_metric_and_layers(dash_env: dict[str, Path]) -> None:
    at = ok(start("distributions"))
    figs = charts(at)
    assert len(figs) == 2
    assert {t["type"] for t in figs[0]["data"]} == {"box"}
    assert figs[0]["layout"]["yaxis"]["type"] == "log"  # a few slow writes do not flatten the boxes
    assert "layer" in figs[1]["layout"]["xaxis"]["title"]["text"]  # by layer
    assert tables(at)  # the layers table
    ok(at.radio(key="dist-kind").set_value("violin").run())
    assert {t["type"] for t in charts(at)[0]["data"]} == {"violin"}
    ok(at.radio(key="dist-kind").set_value("ECDF").run())
    assert {t["type"] for t in charts(at)[0]["data"]} == {"scatter"}
    ok(at.selectbox(key="dist-metric::h200").set_value("launch delay, launch call to GPU start (µs)").run())
    assert "launch delay" in json.dumps(charts(at)[0]["layout"])
    ps = at.selectbox(key="dist-ps::h200")
    opt = ps.options[-1]
    ok(ps.set_value(opt).run())
    layers = table_with(at, "phase", "layer")
    assert set(layers["phase"]) <= {opt.split()[0]}
    assert opt in charts(at)[1]["layout"]["title"]["text"]


def test_sweeps_groups_and_bench_log_log(dash_env: dict[str, Path]) -> None:
    at = ok(start("sweeps", run="synth-before"))
    figs = charts(at)
    assert len(figs) == 2
    run_fig, bench_fig = figs
    assert run_fig["layout"]["xaxis"]["type"] == "log" and run_fig["layout"]["yaxis"]["type"] == "log"
    names = [t["name"] for t in run_fig["data"]]
    assert "two_stream" in names and any(n.startswith("floor at peak 4,800 GB/s") for n in names)
    assert any(n.startswith("measured copy rate 4,300 GB/s") for n in names)
    two = next(t for t in run_fig["data"] if t["name"] == "two_stream")
    assert sorted(_values(two["x"])) == [8.0, 64.0]  # decode bs=8 and bs=64
    assert bench_fig["layout"]["xaxis"]["type"] == "log"
    bench_names = [t["name"] for t in bench_fig["data"]]
    assert {"index_put", "two_stream"} <= set(bench_names)
    assert any("measured copy rate" in n for n in bench_names)
    ok(at.radio(key="sw-phase::synth-before").set_value("prefill").run())
    assert "prefill" in charts(at)[0]["layout"]["title"]["text"]


def test_overlap_per_write_and_one_write(dash_env: dict[str, Path]) -> None:
    at = on_kineto(ok(start("overlap")))
    assert at.selectbox(key="ov-variant::h200").value == "two_stream"
    med = {m.label: m.value for m in at.metric}
    assert med["median overlap · decode bs=8"] == "86.7 %"
    figs = charts(at)
    assert len(figs) == 3
    assert figs[0]["layout"]["yaxis"]["range"] == [-5, 105]
    title0 = figs[2]["layout"]["title"]["text"]
    ok(at.number_input(key="ov-write::two_stream").set_value(10).run())
    assert charts(at)[2]["layout"]["title"]["text"] != title0
    lanes = {y for t in charts(at)[2]["data"] for y in t["y"]}
    assert len(lanes) == 2  # K and V on their two streams


def test_layer_page_of_a_cpu_layer_capture_with_rotary_variants(dash_env: dict[str, Path],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The real CPU capture of --context layer: the rotary comparison's µs per write in the wall clock,
    no saving (n/a with capture's reason) and no chart, no write boundaries, each said in the page."""
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(dash_env["layer-rope"]))
    at = goto(ok(start()), "Layer")
    assert not at.error
    no_none(at)
    headings = texts(at.markdown)
    assert "Rotary fused into the write" in headings and "In the decoder layer: what PDL hides" in headings
    rope = table_with(at, "rotary fused into the write", "saves ms/step")
    # the capture ran rope_triton_fused's Triton kernel in the interpreter (its manifest says so): marked
    assert set(zip(rope["rotary fused into the write"], rope["vs rotary, then the write"])) == {
        ("rope_triton_fused *", "rope_then_triton_fused")}
    assert set(rope["saves ms/step"]) == {"n/a (CPU)", "n/a (prefill)"}
    assert "fused: µs/write (wall clock)" in rope.columns
    assert all(num(x) > 0 for x in rope["fused: µs/write (wall clock)"])
    infos = texts(at.info)
    assert "a CPU's wall clock says nothing of a GPU's decode step" in infos
    assert "this run's traces have no GPU events" in infos
    assert charts(at) == []  # nothing to draw: said instead
    ok(at.sidebar.multiselect(key="nav_variants::layer-rope").set_value(["two_stream", "rope_triton_fused"]).run())
    assert "only variants fused into the rotary ran (rope_triton_fused)" in texts(at.info)


def test_layer_page_of_a_run_without_rotary_or_layer(dash_env: dict[str, Path]) -> None:
    at = goto(ok(start()), "Layer")
    assert not at.error and charts(at) == []
    infos = texts(at.info)
    assert "no rotary variant in this run" in infos and "no decoder-layer context in this run" in infos


def test_compare_runs_ratios(dash_env: dict[str, Path]) -> None:
    at = on_kineto(ok(start("compare")))
    ok(at.selectbox(key="cmp-before").set_value("synth-before").run())
    ok(at.selectbox(key="cmp-after").set_value("synth-after").run())
    df = table_with(at, "ratio after/before")
    assert len(df) == 3 and set(df["variant"]) == {"two_stream"}
    assert (df["ratio after/before"].map(num) < 1).all() and (df["speed-up"].map(num) > 1).all()
    eager = df[df["size"] == "64"].iloc[0].map(lambda v: v if not str(v)[:1].isdigit() else num(v))
    # eager: what a write costs its step (the step's GPU span over its writes, host gaps included)
    # in these synthetic runs the host spaces eager writes 20 µs apart, so halving the
    # kernels' time saves only what shows in the step (launch-bound, as eager writes are)
    assert eager["before µs/write"] == pytest.approx(15.95, abs=0.01)
    assert eager["after µs/write"] == pytest.approx(15.625, abs=0.01)
    assert len(charts(at)) == 2
    ok(at.selectbox(key="cmp-after").set_value("synth-before").run())
    assert "same run" in texts(at.info)


# ---------------------------------------------------------------------------- bad input


def test_cpu_only_trace_reads_as_warnings(dash_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(dash_env["cpu-only"]))
    at = ok(start())
    assert "no GPU events" in texts(at.warning)
    assert at.selectbox(key="ov-metric").value == "host launch µs per write"
    goto(at, "Timeline")
    assert "no GPU events" in texts(at.warning)
    lanes = {y for t in charts(at)[0]["data"] for y in t["y"]}
    assert lanes == {"kvprof writes (host)"}
    goto(at, "Overlap")
    assert "two streams" in texts(at.info)
    for page in ("Distributions", "Sweeps", "Compare runs"):
        goto(at, page)


def test_empty_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty_root_env(tmp_path, monkeypatch)
    at = ok(start())
    assert "No runs under" in texts(at.warning)
    assert not at.error
    for page in PAGES:
        goto(at, page)
        assert not at.error
    goto(at, "Sweeps")
    assert "No bench.json" in texts(at.info)


def test_sweeps_finds_bench_results_where_kvprof_bench_writes_them(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`kvprof bench` without --out writes into $XDG_CACHE_HOME/kvprof/bench/<UTC time>/ (commands/bench.py's
    default_out); the Sweeps page reads them there, the newest first, beside the traces root's."""
    from dashboard_support import cpu_bench
    from kvprof.commands.bench import default_out
    from kvprof.core.bench_result import bench_cache_root

    empty_root_env(tmp_path, monkeypatch)
    assert default_out().parent == bench_cache_root() == tmp_path / "xdg" / "kvprof" / "bench"
    doc = json.dumps(cpu_bench())
    for stamp in ("20261201T000000Z", "20261205T081500Z"):
        (bench_cache_root() / stamp).mkdir(parents=True)
        (bench_cache_root() / stamp / "bench.json").write_text(doc)
    at = ok(start("Sweeps"))
    files = at.multiselect(key="sw-bench-files")
    assert files.options == [f"{tmp_path}/xdg/kvprof/bench/20261205T081500Z/bench.json",
                             f"{tmp_path}/xdg/kvprof/bench/20261201T000000Z/bench.json"]
    assert files.value == files.options[:1]  # the run just made
    assert [c["layout"]["meta"]["chart"] for c in charts(at)] == ["sweep"]
    assert not at.error


def test_missing_root_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROF_DASHBOARD_ROOTS", os.pathsep.join([str(tmp_path / "gone"), str(tmp_path)]))
    monkeypatch.setenv("KVPROF_DASHBOARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KVPROF_DASHBOARD_RUN", raising=False)
    at = ok(start())
    ok(at.sidebar.selectbox(key="nav_root").set_value(str(tmp_path / "gone")).run())
    assert "does not exist" in texts(at.warning) and not at.error


def test_corrupt_run_is_one_error_and_the_rest_works(dash_env: dict[str, Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(dash_env["corrupt"]))
    at = ok(start())
    err = texts(at.error)
    assert "Cannot open corrupt" in err and "truncated or corrupt gzip" in err
    for page in PAGES:
        goto(at, page)
    ok(at.sidebar.selectbox(key="nav_run").set_value("h200").run())
    goto(at, "Overview")
    assert not at.error and len(charts(at)) == 4


def test_unanalysed_run_goes_through_the_pipeline_into_the_cache(dash_env: dict[str, Path],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    root = dash_env["root"]
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(dash_env["h200-raw"]))
    before = tree_files(root)
    at = ok(start())
    assert at.sidebar.selectbox(key="nav_run").value == "h200-raw"
    assert len(tables(at)) >= 3 and len(charts(at)) == 4
    assert tree_files(root) == before  # nothing written into the traces root
    assert list((dash_env["cache"] / "runs").glob("*/summary.json"))


def test_partial_outputs_show_what_there_is(dash_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(dash_env["partial"]))
    at = ok(start())
    assert "events.parquet missing" in texts(at.warning)
    # the Overview needs only summary.json; one variant, the baseline: no saving chart, and a line says why
    assert len(charts(at)) == 3
    assert "no chart of ms saved per decode step: no variant has a decode row" in texts(at.caption)
    goto(at, "Timeline")
    assert "events.parquet is missing" in texts(at.error)
    goto(at, "Distributions")
    assert not at.error and len(charts(at)) == 2  # writes.parquet is there


def _upload(at: AppTest, name: str, payload: bytes, mime: str = "application/octet-stream") -> AppTest:
    return ok(at.file_uploader(key="upload").set_value((name, payload, mime)).run())


def test_upload_not_a_trace(dash_env: dict[str, Path]) -> None:
    at = _upload(ok(start()), "notes.txt", b"hello, not a trace", "text/plain")
    assert "not a trace kvprof can read" in texts(at.error)
    assert at.sidebar.selectbox(key="nav_run").value == "h200"
    assert len(charts(at)) == 4  # the page still works
    _upload(at, "broken.json", b'{"traceEvents": 5}', "application/json")
    assert "not a Chrome/Kineto trace" in texts(at.error) or "traceEvents" in texts(at.error)


def test_upload_too_large(dash_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROF_DASHBOARD_MAX_UPLOAD_MB", "1")
    at = _upload(ok(start()), "huge.pt.trace.json", b" " * (3 << 19))
    assert "limited to 1 MB" in texts(at.error)
    assert len(charts(at)) == 4


def test_upload_a_trace_is_analysed_outside_the_root(dash_env: dict[str, Path]) -> None:
    root = dash_env["root"]
    before = tree_files(root)
    doc, _ = build(synth_spec(2000, 2000))
    at = _upload(ok(start()), "../../mine.pt.trace.json.gz", gzip.compress(dumps(doc)))
    assert at.sidebar.selectbox(key="nav_run").value == "upload: ../../mine.pt.trace.json.gz"
    assert "analysed" in texts(at.success)
    assert len(tables(at)) >= 3 and len(charts(at)) == 3  # one variant: no saving chart (a caption says why)
    assert tree_files(root) == before
    assert not (root.parent / "mine.pt.trace.json.gz").exists()
    goto(at, "Overlap")
    assert at.metric


def test_upload_an_nsys_export(dash_env: dict[str, Path]) -> None:
    at = _upload(ok(start()), "run.sqlite", (FIXTURE / "nsys_run.sqlite").read_bytes())
    assert at.sidebar.selectbox(key="nav_run").value == "upload: run.sqlite"
    assert set(table_with(at, "speed-up vs baseline")["source"]) == {"nsys"}


def test_paths_outside_the_root_are_not_opened(dash_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
                                                tmp_path: Path) -> None:
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(tmp_path))  # not under the root: ignored
    at = ok(start(run="../../etc"))
    assert at.sidebar.selectbox(key="nav_run").value in {e for e in at.sidebar.selectbox(key="nav_run").options}
    assert ".." not in at.sidebar.selectbox(key="nav_run").value


@pytest.mark.slow  # every page of every run in the test root
def test_every_page_for_every_kind_of_run(dash_env: dict[str, Path]) -> None:
    at = ok(start())
    for run in ("h200", "cpu-only", "synth-after", "corrupt", "h200-raw", "layer-rope"):
        ok(at.sidebar.selectbox(key="nav_run").set_value(run).run())
        for page in PAGES:
            goto(at, page)
            if run != "corrupt":
                assert not at.error, (run, page, texts(at.error))
                no_none(at)
