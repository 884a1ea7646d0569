"""Real CPU captures, labelled for what they are and compared as what they are.

A CPU run is timed with the wall clock (no CUDA events, no GPU time): the report, the
dashboard's landing view, analyze and compare say so, and show no share of the ITL and no
saving per decode step where capture prints n/a. compare names its columns before_*/after_*,
lists rows measured in one run only, names both runs with their capture time, and refuses
(exit 7) to gate runs that measure different things.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import time
from pathlib import Path

import pytest

from kvprof.cli import main
from kvprof.core.run import Manifest, captured_text
from kvprof.core.rundir import RunDir

pytest.importorskip("plotly")
pytestmark = pytest.mark.slow  # four real captures and an app run: about 11 s idle, 40 s on a busy machine

TINY = ["--batch-sizes", "1", "--phase", "decode", "--steps", "6", "--warmup", "1", "--no-progress"]


def capture(out: Path, run_id: str, *extra: str, variants: str = "index_put,two_stream") -> Path:
    assert main(["capture", "--device", "cpu", *TINY, "--variants", variants, "--out", str(out), "--run-id", run_id,
                 *extra]) == 0
    return out / run_id


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """base, then new one second later (capture times to the second), a run of index_put only,
    and one with two torch threads."""
    root = tmp_path_factory.mktemp("cpu-runs")
    out = {"base": capture(root, "base")}
    time.sleep(1.1)
    out["new"] = capture(root, "new")
    out["one"] = capture(root, "one", variants="index_put")
    out["threads"] = capture(root, "threads", "--threads", "2")
    return out


def summary_doc(run: Path) -> dict:
    return RunDir(run).read_summary().to_json()


# -- 1. labels ----------------------------------------------------------------------------------

def test_the_landing_view_of_a_cpu_run_says_wall_clock_and_draws_no_empty_chart(runs):
    from kvprof.dashboard.landing import build
    from kvprof.dashboard.tables import landing_table

    land = build("base", summary_doc(runs["base"]))
    assert land.source == "reference" and land.timing.clock == "wall" and not land.timing.gpu
    assert land.timing.words == "the reference pass (no profiler attached, wall clock)"
    names = [name for name, _ in land.figures]
    assert names == ["cost"]  # no "ms saved per decode step" chart drawn empty
    cost = land.figures[0][1]
    assert cost.layout.yaxis.title.text == "µs per write (wall clock)"
    assert "GPU" not in cost.layout.title.text and "CUDA" not in cost.layout.title.text
    notes = " ".join(land.notes)
    assert "no chart of ms saved per decode step: a CPU's wall clock says nothing of a GPU's decode step" in notes
    assert "share of ITL: n/a (CPU)" in notes
    assert land.frame["share_pct"].isna().all() and land.frame["saving_ms"].isna().all()
    table = landing_table(land.frame, land.timing)
    assert "µs/write (wall clock)" in table.columns and "GPU µs/write" not in table.columns
    assert set(table["writes' share of ITL %"]) == {"n/a (CPU)"}
    assert set(table["saves ms/step"]) == {"n/a (CPU)"}


def test_the_html_report_of_a_cpu_run_names_its_clock(runs, tmp_path):
    out = tmp_path / "r.html"
    assert main(["report", str(runs["base"]), "--html", str(out)]) == 0
    text = out.read_text()
    sub = text[text.index("<p class='sub'>"):]
    sub = sub[:sub.index("</p>")]
    assert "source: the reference pass (no profiler attached, wall clock)" in sub
    assert "CUDA events" not in text
    assert text.count("Plotly.newPlot") == 1
    assert "µs/write (wall clock)" in text and "n/a (CPU)" in text


def test_the_analysis_records_the_clock_once(runs):
    s = RunDir(runs["base"]).read_summary()
    assert s.reference is not None and s.reference["clock"] == ["wall"]
    assert s.timing("reference").how == "wall clock" and s.timing("kineto").gpu is False
    steps = json.loads(RunDir(runs["base"]).timings().read_text())
    modes = {r["mode"] for r in steps["records"] if r["pass"] == "reference"}
    # a CPU reference pass times the machine between its steps: torch's index_put, and numpy's that checks it
    assert modes == {"writes", "control", "control_numpy"}


# -- 4. compare's rows and columns ---------------------------------------------------------------

def test_run_vs_run_columns_are_before_and_after(runs, capsys):
    assert main(["compare", str(runs["base"]), str(runs["new"]), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    header = list(rows[0])
    assert "before_cost_per_write_ns" in header and "after_cost_per_write_ns" in header
    assert not [c for c in header if c.startswith("baseline_")]
    ref = [r for r in rows if r["source"] == "reference"]
    assert ref and all(r["before_cost_per_write_ns"] and r["after_cost_per_write_ns"] for r in ref)
    # every row names its clock, and a CPU run's is never GPU time
    assert {r["source"]: r["clock"] for r in rows} == {"reference": "wall clock",
                                                       "kineto": "host trace (no GPU activity)"}


def test_compare_json_of_a_cpu_run_names_the_wall_clock(runs, capsys):
    assert main(["compare", str(runs["base"]), "--baseline", "index_put", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and {r["clock"] for r in rows if r["source"] == "reference"} == {"wall clock"}
    assert not [r for r in rows if "GPU" in r["clock"] and "no GPU" not in r["clock"]]


def test_compare_of_the_h200_sample_names_its_gpu_clocks(capsys):
    run = Path(__file__).resolve().parents[1] / "traces" / "samples" / "h200-llama70b-tp8"
    assert main(["compare", str(run), "--baseline", "two_stream", "--format", "json"]) == 0
    clocks = {(r["source"], r["clock"]) for r in json.loads(capsys.readouterr().out)["rows"]}
    assert clocks == {("reference", "CUDA events"), ("kineto", "GPU trace"), ("nsys", "GPU trace")}


def test_rows_with_no_cost_are_one_line_and_rows_of_one_run_are_listed(runs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["compare", str(runs["base"]), str(runs["one"])]) == 0
    out = capsys.readouterr().out
    assert "n/a (no GPU time)" not in out  # no row of n/a cells
    assert "not shown: 2 kineto row(s) with no cost per write in either run" in out
    table = [line for line in out.splitlines() if line.startswith("│")]
    two_stream = [line for line in table if "two_stream" in line]
    assert len(two_stream) == 1 and "only in before" in two_stream[0]
    assert main(["compare", str(runs["base"]), str(runs["one"]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    only = [r for r in doc["rows"] if r["only_in"]]
    assert {(r["variant"], r["source"], r["only_in"]) for r in only} == {
        ("two_stream", "reference", "before"), ("two_stream", "kineto", "before")}
    assert all(r["after_cost_per_write_ns"] is None for r in only)


# -- 3. capture time ------------------------------------------------------------------------------

def test_capture_records_when_it_started(runs):
    base, new = (RunDir(runs[k]).read_manifest() for k in ("base", "new"))
    assert base.captured is not None and new.captured is not None and base.captured < new.captured
    assert base.captured.utcoffset() is not None and captured_text(base).startswith("captured 20")
    old = Manifest.from_json({k: v for k, v in base.to_json().items() if k != "captured_at"})
    assert old.captured is None and captured_text(old) == "capture time unknown: captured before kvprof recorded it"
    bad = Manifest.from_json({**base.to_json(), "captured_at": "yesterday"})
    assert bad.captured_at is None and any("captured_at" in w for w in bad.warnings)


def test_compare_names_both_runs_with_their_capture_time(runs, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    base, new = runs["base"], runs["new"]
    times = [captured_text(RunDir(r).read_manifest()) for r in (base, new)]
    assert main(["compare", str(base), str(new)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"before: {base} ({times[0]}) -> after: {new} ({times[1]})"
    assert "captured after" not in out
    assert main(["compare", str(new), str(base)]) == 0
    out = capsys.readouterr().out
    assert f"note: the before run ({new}) was captured after the after run ({base}); the order given is kept" in out
    assert main(["compare", str(base), str(new), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["runs"]["before"]["captured_at"] < doc["runs"]["after"]["captured_at"]


# -- 2. runs that cannot be compared --------------------------------------------------------------

def test_the_gate_refuses_runs_that_measure_different_things(runs, capsys):
    rc = main(["compare", str(runs["base"]), str(runs["threads"]), "--fail-if-slower", "5"])
    assert rc == 7
    out, err = capsys.readouterr()
    lines = [line for line in (out + err).splitlines() if line.startswith("not comparable:")]
    assert lines == ["not comparable: torch threads: 1 in BASE, 2 in NEW"]
    # without the gate the same difference is a warning, and the table is still shown
    assert main(["compare", str(runs["base"]), str(runs["threads"])]) == 0
    assert "warning: not comparable: torch threads: 1 in BASE, 2 in NEW" in capsys.readouterr().out


def test_identical_settings_are_comparable_and_judged(runs, capsys):
    rc = main(["compare", str(runs["base"]), str(runs["new"]), "--fail-if-slower", "1000", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gate"]["comparable"] and doc["gate"]["passed"]
    assert {r["noise"] for r in doc["gate"]["rows"]} == {"control", "control check"}


def test_dashboard_pairs_runs_by_capture_time_not_file_time(runs):
    from kvprof.dashboard.views.compare import RunIdentity, pair_by_capture

    base, new = (RunDir(runs[k]).read_manifest() for k in ("base", "new"))
    ident = {lab: RunIdentity("x86_64", "llama-3.1-70b", m.captured, captured_text(m), m)
             for lab, m in (("new", new), ("base", base))}
    assert pair_by_capture(ident, "new")[:2] == ("base", "new")
    assert pair_by_capture(ident, "base")[:2] == ("base", "new")
    # a re-analysed base has the newest summary.json; the pairing does not look at it
    os.utime(RunDir(runs["base"]).summary)
    assert pair_by_capture(ident, "base")[:2] == ("base", "new")
    unknown = {**ident, "base": RunIdentity("x86_64", "llama-3.1-70b", None, captured_text(None))}
    _, _, why = pair_by_capture(unknown, "new")
    assert "capture time unknown for base" in why


def test_dashboard_compare_page_pairs_by_capture_time_after_a_new_analyze(runs, tmp_path, monkeypatch, capsys):
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    root = runs["base"].parent
    monkeypatch.setenv("KVPROF_DASHBOARD_ROOTS", str(root))
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(runs["base"]))
    monkeypatch.setenv("KVPROF_DASHBOARD_CACHE", str(tmp_path / "cache"))
    assert main(["analyze", str(runs["base"]), "--quiet"]) == 0  # base's summary.json is now the newest
    capsys.readouterr()
    app = Path(__file__).resolve().parents[1] / "kvprof" / "dashboard" / "app.py"
    at = AppTest.from_file(str(app), default_timeout=90)
    at.query_params["page"] = "compare"
    at = at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key="cmp-before").value == "base" and at.selectbox(key="cmp-after").value == "new"
    times = [captured_text(RunDir(runs[k]).read_manifest()) for k in ("base", "new")]
    captions = " | ".join(re.sub(r"\\(.)", r"\1", str(c.value)) for c in at.caption)  # Markdown escapes removed
    assert "by capture time" in captions and times[0] in captions and times[1] in captions

