"""The dashboard's pure parts: frames (shaping), charts (figures), data (paths, uploads) and the
``kvprof dashboard`` command line, without a Streamlit server."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from dashboard_support import REPO, dash_runs  # noqa: E402,F401
from kvprof.analysis.compare import compare_groups  # noqa: E402
from kvprof.commands import dashboard as dash_cmd  # noqa: E402
from kvprof.dashboard import charts, data, frames  # noqa: E402


def fake_kernels(n: int, streams: int = 4, seed: int = 0) -> pd.DataFrame:
    """``n`` GPU activities spread over ``streams`` streams, the columns events.parquet has."""
    rng = np.random.default_rng(seed)
    start = np.sort(rng.integers(0, n * 2_000, n))
    return pd.DataFrame({
        "trace": "t", "source": "kineto", "kind": "kernel", "name": "k" + pd.Series(rng.integers(0, 5, n)).astype(str),
        "device": 0, "stream": rng.integers(0, streams, n) * 4 + 7, "start_ns": start,
        "dur_ns": rng.integers(500, 3_000, n), "grid": "2,1,1", "block": "128,1,1",
        "write_id": np.where(rng.random(n) < 0.8, np.arange(n) // 2, -1), "variant": "two_stream",
        "layer": (np.arange(n) // 2) % 80, "phase": "decode", "size": 10, "step": 0, "correlation": np.arange(n),
        "graph_launch": -1,
    })


def test_window_bins_past_100k_kernels_to_the_bar_budget() -> None:
    k = fake_kernels(250_000)
    t = time.perf_counter()
    rows = frames.lane_rows(k, k.iloc[0:0], float(k["start_ns"].min()))
    end = float(rows["start_us"].add(rows["dur_us"]).max())
    bars, info = frames.window(rows, 0.0, end, 2000)
    fig = charts.timeline(bars)
    took = time.perf_counter() - t
    assert info["binned"] and info["in_window"] == 250_000
    assert len(bars) <= 2000 and int(bars["count"].sum()) == 250_000  # every kernel is in some bar
    assert sum(len(tr["y"]) for tr in fig.data) == len(bars)
    assert took < 5.0, took
    narrow, ninfo = frames.window(rows, 1000.0, 1010.0, 2000)  # a 10 µs window: single kernels again
    assert not ninfo["binned"] and (narrow["count"] == 1).all()


def test_timeline_is_horizontal_bars_with_base_on_a_numeric_axis() -> None:
    k = fake_kernels(50, streams=2)
    rows = frames.lane_rows(k, k.iloc[0:0], float(k["start_ns"].min()))
    fig = charts.timeline(rows)
    assert all(tr.type == "bar" and tr.orientation == "h" and tr.base is not None for tr in fig.data)
    assert fig.layout.xaxis.type in (None, "linear", "-")
    lanes = list(fig.layout.yaxis.categoryarray)
    assert lanes == ["GPU0 · stream 11", "GPU0 · stream 7"]  # top to bottom: stream 7 first


def test_overview_numbers_are_analyzes(dash_runs: dict[str, Path]) -> None:
    summary = data.read_summary(str(dash_runs["h200"] / "summary.json"), 0)
    groups = frames.groups_frame(summary)
    comp = frames.comparison(groups, "two_stream", 80, 12.05, 11.87)
    ref = compare_groups(groups, "two_stream", None, 80)
    assert [r["ratio_cost_per_write_ns"] for r in comp["rows"]] == [r["ratio_cost_per_write_ns"] for r in ref["rows"]]
    table = frames.overview_frame(groups, comp, summary, "two_stream")
    def nsys_decode(df: pd.DataFrame) -> pd.Series:
        return df[(df["variant"] == "triton_fused") & (df["source"] == "nsys") & (df["phase"] == "decode")].iloc[0]

    row, g = nsys_decode(table), nsys_decode(groups)
    assert row["GPU µs/write"] == pytest.approx(g["cost_per_write_ns"] / 1e3)
    r = next(r for r in ref["rows"] if (r["variant"], r["source"], r["phase"]) == ("triton_fused", "nsys", "decode"))
    assert row["speed-up vs baseline"] == pytest.approx(1 / r["ratio_cost_per_write_ns"])
    assert row["saving ms/decode step"] == pytest.approx(r["saving_per_step_ms"])
    assert row["verdict"] == "fused"


def test_compare_runs_of_a_run_with_itself_is_one(dash_runs: dict[str, Path]) -> None:
    groups = frames.groups_frame(data.read_summary(str(dash_runs["h200"] / "summary.json"), 0))
    df, warns = frames.compare_runs(groups, groups, [("two_stream", "two_stream"), ("index_put", "sgl_kernel")],
                                    80, 12.05, 11.87)
    both = df[df["only in"] == "both"]
    assert len(both) == 4 and (both["ratio after/before"] == 1).all() and (both["saving µs/write"] == 0).all()
    # index_put's rows have no sgl_kernel to pair with: listed as the before run's only, not dropped
    one = df[df["only in"] == "before"]
    assert len(one) == 4 and set(one["variant"]) == {"index_put -> sgl_kernel"}
    assert one["before µs/write"].notna().all() and one["after µs/write"].isna().all()
    assert warns == []


def test_floor_lines_are_bytes_over_rate() -> None:
    pairs = pd.DataFrame({"tokens": [8, 8, 64], "bytes": [8192, 8192, 65536]})
    fl = frames.floor_lines(pairs, {"peak": 4800.0, "none": None})
    assert list(fl["line"].unique()) == ["peak"]
    assert fl["us"].tolist() == pytest.approx([8192 / 4.8e6, 65536 / 4.8e6])


def test_sweep_and_distribution_figures() -> None:
    pts = pd.DataFrame({"variant": ["a", "a", "b"], "tokens": [1, 10, 1], "us": [1.0, 2.0, 3.0]})
    fig = charts.sweep(pts, pd.DataFrame(columns=["line", "tokens", "us"]), "t")
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    df = pd.DataFrame({"variant": ["a"] * 4, "phase": "decode", "phase_size": ["decode bs=1"] * 4, "size": 1,
                       "layer": [0, 1, 0, 1],
                       "step": 0, "write_id": range(4), "value": [1.0, 2.0, 3.0, 4.0]})
    for kind, t in (("box", "box"), ("violin", "violin"), ("ecdf", "scatter")):
        assert {tr.type for tr in charts.distribution(df, "m", kind).data} == {t}
    assert charts.distribution(df.iloc[0:0], "m").layout.annotations  # empty: says why


def test_ecdf_of_only_infinite_values_falls_back_to_a_linear_axis() -> None:
    # all values > 0 but none finite: no log range exists (it used to fail on log_ticks(None))
    df = pd.DataFrame({"variant": ["a"] * 2, "phase": "decode", "phase_size": ["decode bs=1"] * 2, "size": 1,
                       "layer": 0, "step": 0, "write_id": range(2), "value": [np.inf, np.inf]})
    fig = charts.distribution(df, "GB/s", "ecdf", scale="log")
    assert fig.layout.xaxis.type != "log"
    assert {tr.type for tr in fig.data} == {"scatter"}


# ---------------------------------------------------------------------------- paths and uploads


def test_contained_refuses_traversal_and_symlinks_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "manifest.json").write_text('{"variants": {}}')
    assert data.contained(root, Path("run")) == (root / "run").resolve()
    with pytest.raises(data.PathError):
        data.contained(root, Path("../outside"))
    with pytest.raises(data.PathError):
        data.contained(root, outside)
    (root / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(data.PathError):
        data.contained(root, Path("link"))
    assert [e.rel for e in data.discover_runs(root)] == []  # the symlinked run outside is not offered


def test_manifest_pointing_outside_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    run = root / "evil"
    run.mkdir(parents=True)
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    (run / "manifest.json").write_text(
        '{"variants": {"x": {"available": true, "files": {"torch_trace": "../../secret.json"}}}}')
    with pytest.raises(data.PathError, match="outside the traces root"):
        data.ensure_outputs(run, root)
    with pytest.raises(data.PathError):
        data.ensure_outputs(tmp_path, root)


def test_upload_limits_and_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROF_DASHBOARD_CACHE", str(tmp_path / "cache"))
    with pytest.raises(data.DashboardError, match="limit is 1 MB"):
        data.analyse_upload("big.json", b"x" * (2 << 20), limit=1 << 20)
    with pytest.raises(data.DashboardError, match="empty"):
        data.analyse_upload("e.json", b"", limit=1 << 20)
    with pytest.raises(data.DashboardError, match="not a trace"):
        data.analyse_upload("../../x.json", b"hello", limit=1 << 20)
    assert not (tmp_path / "cache" / "uploads").exists() or not any((tmp_path / "cache" / "uploads").iterdir())
    assert data.upload_suffix("A.PT.TRACE.JSON.GZ") == ".json.gz"
    assert data.upload_suffix("../../etc/passwd") == ".bin"
    assert data.max_upload_bytes({"KVPROF_DASHBOARD_MAX_UPLOAD_MB": "3"}) == 3 << 20
    assert data.max_upload_bytes({}) == 200 << 20


# ---------------------------------------------------------------------------- the command


def _args(**kw: object) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    dash_cmd.add_arguments(p)
    ns = p.parse_args([])
    for k, v in kw.items():
        setattr(ns, k, v)
    return ns


def test_the_server_imports_every_page_once_streamlit_is_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamlit import runtime

    from kvprof.dashboard import serve

    names = serve.page_modules()
    assert {"kvprof.dashboard.views.overview", "kvprof.dashboard.views.timeline", "pyarrow.parquet"} <= set(names)
    monkeypatch.setattr(runtime, "exists", lambda: False)
    assert serve.warm(wait_s=0.05) == []  # no runtime: nothing imported early (its caches would warn)

    class Running:
        state = runtime.RuntimeState.NO_SESSIONS_CONNECTED

    monkeypatch.setattr(runtime, "exists", lambda: True)
    monkeypatch.setattr(runtime, "get_instance", lambda: Running)
    assert serve.warm() == names


def test_dashboard_command_line(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    cmd, env = dash_cmd.streamlit_command(_args(run_dir=str(run), port=9123))
    assert cmd[1:4] == ["-m", "kvprof.dashboard.serve", "run"] and cmd[4].endswith("kvprof/dashboard/app.py")
    flags = dict(zip(cmd[5::2], cmd[6::2]))
    assert flags["--server.address"] == "127.0.0.1" and flags["--server.port"] == "9123"
    assert flags["--server.maxUploadSize"] == "200" and flags["--browser.gatherUsageStats"] == "false"
    assert env["KVPROF_DASHBOARD_ROOTS"] == str(run.parent.resolve())
    assert env["KVPROF_DASHBOARD_RUN"] == str(run.resolve())
    from kvprof.core.errors import UsageError

    with pytest.raises(UsageError):
        dash_cmd.streamlit_command(_args(port=0))
    with pytest.raises(UsageError, match="not under any --root"):
        dash_cmd.streamlit_command(_args(run_dir=str(tmp_path), root=[run]))
    with pytest.raises(UsageError, match="not a folder"):
        dash_cmd.streamlit_command(_args(run_dir=str(tmp_path / "missing")))


def test_kvprof_dashboard_starts_on_localhost(dash_runs: dict[str, Path], tmp_path: Path) -> None:
    """`kvprof dashboard RUN` through the facade's background server: healthy, banner printed, stopped."""
    import kvprof.api as kv

    env = {**os.environ, "KVPROF_DASHBOARD_CACHE": str(tmp_path / "cache")}
    server = kv.dashboard_server(dash_runs["h200"], env=env, cwd=REPO, log=tmp_path / "server.log")
    with server.running(limit_s=60) as url:
        assert server.healthy()
    assert server.process is not None and server.process.returncode is not None  # stopped and reaped
    assert url.rstrip("/") in server.output()


def test_stale_summary_is_noticed(tmp_path: Path) -> None:
    (tmp_path / "summary.json").write_text("{}")
    trace = tmp_path / "a.pt.trace.json.gz"
    trace.write_bytes(b"x")
    assert data.stale_traces(tmp_path) == []  # written together (a checkout): not stale
    later = time.time() + 3600
    os.utime(trace, (later, later))
    assert data.stale_traces(tmp_path) == ["a.pt.trace.json.gz"]


# ---------------------------------------------------------------------------- chart correctness


def _label_at(fig, name: str) -> tuple[float, str]:  # noqa: ANN001
    """(the line's value, its label) for one limit line: the label is a legend entry in the
    line's colour and dash, never an annotation over the plot, where it covered bars and lines."""
    shape = next(s for s in fig.layout.shapes if s.name == name)
    (entry,) = [t for t in fig.data if t.legendgroup == name]
    assert entry.meta == "limit" and entry.showlegend and list(entry.y) == [None]
    assert (entry.line.color, entry.line.dash) == (shape.line.color, shape.line.dash)
    assert not [a for a in fig.layout.annotations if a.name == name]
    return float(shape.y0), str(entry.name)


def test_baseline_line_is_at_1x_on_a_log_axis_and_named_in_the_legend() -> None:
    df = pd.DataFrame({"variant": ["two_stream", "triton_fused", "two_stream", "triton_fused"], "source": "nsys",
                       "phase": ["decode", "decode", "prefill", "prefill"], "size": [8, 8, 512, 512],
                       "speed-up vs baseline": [1.0, 4.0, 1.0, 0.5]})
    fig = charts.speedup_bars(df, "two_stream")
    value, label = _label_at(fig, "limit:two_stream = 1x")
    assert value == 1.0 and label == "two_stream = 1x"
    lo, hi = (10 ** r for r in fig.layout.yaxis.range)
    assert 0.5 / charts.MARGIN == pytest.approx(lo) and 4.0 * charts.MARGIN == pytest.approx(hi)


def test_sweep_range_is_the_data_and_limits_are_named_in_the_legend() -> None:
    pts = pd.DataFrame({"variant": ["triton_fused"] * 3, "tokens": [1, 64, 4096], "us": [2.0, 3.0, 40.0]})
    floors = pd.DataFrame({"line": "floor at peak", "tokens": [1, 64, 4096], "us": [1e-4, 6e-3, 0.4]})
    fig = charts.sweep(pts, floors, "t", hlines={"empty kernel node 0.60 µs": 0.6, "empty PDL node 0.65 µs": 0.65})
    lo, hi = (10 ** r for r in fig.layout.yaxis.range)
    assert lo == pytest.approx(0.6 / charts.MARGIN) and hi == pytest.approx(40 * charts.MARGIN)  # not 1e-4
    styles = set()
    for name, at in (("limit:empty kernel node 0.60 µs", 0.6), ("limit:empty PDL node 0.65 µs", 0.65)):
        value, label = _label_at(fig, name)
        assert value == at and label == name.removeprefix("limit:")
        styles.add(next(s.line.dash for s in fig.layout.shapes if s.name == name))
    assert len(styles) == 2  # neighbouring lines drawn differently
    assert not fig.layout.annotations  # no text inside the plot
    assert all("e" not in t and "M" not in t for t in fig.layout.yaxis.ticktext)  # 0.5, 1, 2, 5 ... not 2 5 2 5


def test_no_saving_line_has_no_label_over_the_bars() -> None:
    df = pd.DataFrame({"variant": ["index_put", "triton_fused", "store_kv_fused"], "phase": "decode",
                       "phase_size": "decode bs=64", "saving_ms": [-0.2, 0.19, 0.19],
                       "saving_spread_ms": [0.002, 0.002, 0.002], "share_pct": [1.0, 1.0, 1.0]})
    fig = charts.landing_saving(df, "t")
    value, label = _label_at(fig, "limit:no saving")
    assert value == 0.0 and label == "no saving"


def test_bars_of_one_panel_a_hundredfold_apart_get_a_log_axis() -> None:
    """A CPU run: index_put and two_stream (11 µs) beside the interpreted triton_fused (4,476 µs) were flat
    lines at 0 on a linear axis."""
    rows = []
    for v, cost in (("index_put", 11.1), ("two_stream", 11.5), ("triton_fused", 4476.0)):
        for ph, size, k in (("decode", 1, 1.0), ("prefill", 4096, 90.0)):
            rows.append({"variant": v, "phase": ph, "size": size, "phase_size": f"{ph} {size}",
                         "cost_us": cost * k, "cost_lo_us": cost * k * 0.9, "cost_hi_us": cost * k * 1.1})
    fig = charts.landing_cost(pd.DataFrame(rows), "t", axis="µs per write (wall clock)")
    assert fig.layout.yaxis.type == "log" and fig.layout.yaxis2.type == "log"
    assert fig.layout.yaxis.title.text == "µs per write (wall clock) (log)"
    lo, hi = (10 ** r for r in fig.layout.yaxis.range)
    assert lo <= 11.1 * 0.9 and hi >= 4476 * 1.1  # every bar and whisker inside
    close = pd.DataFrame(rows).assign(cost_us=lambda d: d["cost_us"].where(d["variant"] != "triton_fused", 20.0))
    assert charts.landing_cost(close, "t").layout.yaxis.type == "linear"  # within 20x: linear, from 0
    cmp = pd.DataFrame({"variant": ["index_put", "triton_fused"], "phase": "decode", "size": 1,
                        "before µs/write": [11.0, 4400.0], "after µs/write": [12.0, 4500.0]})
    assert charts.before_after(cmp).layout.yaxis.type == "log"
    bars = pd.DataFrame({"variant": ["index_put", "triton_fused"], "phase": "decode", "phase_size": "decode bs=1",
                         "size": 1, "value": [11.0, 4400.0]})
    assert charts.metric_bars(bars, "µs").layout.yaxis.type == "log"


def test_lines_that_lie_on_one_another_differ_in_dash_and_marker() -> None:
    pts = pd.DataFrame({"variant": ["triton_fused"] * 3 + ["store_kv_fused"] * 3, "tokens": [1, 64, 4096] * 2,
                        "us": [0.69, 0.70, 7.2] * 2})
    for fig in (charts.sweep(pts, pd.DataFrame(columns=["line", "tokens", "us"]), "t"),
                charts.per_layer(pd.DataFrame({"variant": ["triton_fused", "store_kv_fused"] * 4,
                                               "layer": [0, 0, 1, 1, 2, 2, 3, 3], "value": [0.69] * 8}), "µs")):
        a, b = [t for t in fig.data if t.legendgroup in ("triton_fused", "store_kv_fused")]
        assert a.line.color != b.line.color
        assert a.line.dash != b.line.dash and a.marker.symbol != b.marker.symbol


def test_each_size_of_the_overlap_charts_has_its_own_colour() -> None:
    df = pd.DataFrame({"phase_size": ["decode bs=1", "decode bs=10", "decode bs=64", "prefill tokens=4096"] * 2,
                       "order": range(8), "overlap_pct": [70.0, 85, 86, 0] * 2, "write_id": range(8), "layer": 0,
                       "step": 0, "span_us": 1.0})
    for fig in (charts.overlap_scatter(df, "two_stream"), charts.overlap_hist(df, "two_stream")):
        colours = [t.marker.color for t in fig.data]
        assert len(colours) == 4 and len(set(colours)) == 4


def test_one_colour_per_variant_from_the_variant_table() -> None:
    from kvprof.core import variants

    df = pd.DataFrame({"variant": ["index_put", "triton_fused"], "source": "nsys", "phase": "decode",
                       "phase_size": "decode bs=1", "size": 1, "value": [3.0, 1.0]})
    for fig in (charts.metric_bars(df, "m"),
                charts.distribution(df.assign(layer=0, step=0, write_id=0), "m")):
        for tr in fig.data:
            assert tr.marker.color == variants.colour(tr.legendgroup)


def test_decode_and_prefill_get_their_own_axes_and_timeline_units() -> None:
    df = pd.DataFrame({"variant": ["a", "a"], "source": "nsys", "phase": ["decode", "prefill"],
                       "phase_size": ["decode bs=1", "prefill tokens=4096"], "size": [1, 4096], "value": [1.0, 600.0]})
    fig = charts.metric_bars(df, "µs")
    assert fig.layout.yaxis.range[1] < 2 and fig.layout.yaxis2.range[1] > 600
    rows = pd.DataFrame({"lane": "kvprof writes (host)", "start_us": [0.0, 5e6], "dur_us": [10.0, 10.0], "name": "w",
                         "variant": "a", "kind": "write", "grid": "", "block": "", "count": 1, "busy_us": 10.0,
                         "detail": ""})
    tl = charts.timeline(rows)
    assert tl.layout.meta["unit"] == "s" and "(s)" in tl.layout.xaxis.title.text


def test_tables_never_show_none() -> None:
    from kvprof.dashboard.tables import display

    df = pd.DataFrame({"a": [None, "x"], "b": [float("nan"), 1234.5678], "c": [True, None], "d": [1, 2]})
    shown = display(df)
    assert shown.to_numpy().ravel().tolist() == ["n/a", "n/a", "yes", "1", "x", "1,235", "n/a", "2"]


def test_static_table_is_escaped_text_cells_with_no_none() -> None:
    """html_table: the cells of display, HTML-escaped (a kernel or file name cannot inject markup)."""
    from kvprof.dashboard.tables import TABLE_TESTID, display, html_table

    df = pd.DataFrame({"name<b>": ["<img src=x onerror=alert(1)>", None], "µs": [float("nan"), 1234.5678]})
    out = html_table(df)
    assert f"data-testid='{TABLE_TESTID}'" in out
    assert "<img" not in out and "&lt;img src=x onerror=alert(1)&gt;" in out and "<th>name&lt;b&gt;</th>" in out
    cells = [c.split("</td>")[0] for c in out.split("<td>")[1:]]
    assert cells == ["&lt;img src=x onerror=alert(1)&gt;", "n/a", "n/a", "1,235"]
    assert [c.replace("&lt;", "<").replace("&gt;", ">") for c in cells] == display(df).to_numpy().ravel().tolist()


def test_summary_is_read_without_its_layers_table(dash_runs: dict[str, Path]) -> None:
    """The per-layer table (most of summary.json) is its own cached frame; every other read skips it."""
    p = dash_runs["samples"] / "summary.json"
    full = orjson.loads(p.read_bytes())
    s = data.read_summary(str(p), data.stamp(p))
    assert "layers" not in s and set(s) == set(full) - {"layers"}
    layers = data.read_layers(str(p), data.stamp(p))
    assert len(layers) == len(full["layers"]) and set(layers["layer"].astype(str)) - {"all"}
    pd.testing.assert_frame_equal(data.read_groups(str(p), data.stamp(p)), frames.groups_frame(full))


@pytest.mark.parametrize("run", ["samples", "h200"])
def test_cached_landing_is_landing_build(dash_runs: dict[str, Path], run: str) -> None:
    """memo.landing_for (shared across sessions, writes read only when a spread needs them) shows what
    landing.build with every input shows."""
    from kvprof.dashboard import landing, memo, tables

    out = data.RunOutputs(run, dash_runs[run])
    s = out.summary()
    variants = frames.variants_in(s, out.groups())
    base = landing.default_baseline(s, variants)
    assert base is not None
    got = memo.landing_for(out, memo.Settings(None, tuple(variants), base, 80, 12.05, 11.87))
    want = landing.build(run, s, out.writes(), None, variants, base, 80)
    pd.testing.assert_frame_equal(got.frame, want.frame)
    assert got.headline == want.headline and got.notes == want.notes
    assert [f.to_json() for _, f in got.figures] == [f.to_json() for _, f in want.figures]
    assert memo.landing_for(out, memo.Settings(None, tuple(variants), base, 80, 12.05, 11.87)) is got  # shared
    # the samples' spreads all come from the step IQR: their landing view needs no writes.parquet
    assert tables.spread_needs_writes(out.groups(), str(got.source)) == (run == "h200")


def test_the_sidebar_shows_a_root_short(tmp_path: Path) -> None:
    from kvprof.dashboard.data import root_label

    home, cwd = tmp_path / "home", tmp_path / "home" / "work"
    assert root_label(cwd / "traces" / "samples", cwd=cwd, home=home) == "traces/samples"
    assert root_label(cwd, cwd=cwd, home=home) == "."
    assert root_label(home / "runs", cwd=cwd, home=home) == "~/runs"
    assert root_label(tmp_path / "elsewhere", cwd=cwd, home=home) == str(tmp_path / "elsewhere")
    assert root_label("/data/traces", cwd=Path("/"), home=home) == "/data/traces"


def test_the_default_roots_offer_traces_of_the_working_folder(tmp_path: Path) -> None:
    """Where `kvprof capture` writes by default (./traces): offered after the samples once it exists,
    never the working folder itself."""
    assert tmp_path / "traces" not in data.configured_roots({}, cwd=tmp_path)
    (tmp_path / "traces").mkdir()
    roots = data.configured_roots({}, cwd=tmp_path)
    assert roots[0] == data.DEFAULT_ROOT.resolve() and roots[-1] == (tmp_path / "traces").resolve()
    assert tmp_path.resolve() not in roots
    assert data.configured_roots({data.ENV_ROOTS: str(tmp_path)}, cwd=tmp_path) == [tmp_path.resolve()]  # as given
