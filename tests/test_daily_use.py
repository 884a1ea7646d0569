"""Daily use: a long default command says what it is doing before its slow imports."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from kvprof.core.errors import UsageError


class _Bar:
    made: list[_Bar] = []

    def __init__(self, total, enabled=None, *, description="", width=14) -> None:
        self.texts = [description]
        self.total = total
        self.closed = False
        _Bar.made.append(self)

    def describe(self, text: str) -> None:
        self.texts.append(text)

    def set_total(self, total: int) -> None:
        self.total = total

    def advance(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def bars(monkeypatch):
    import kvprof.commands.progress

    _Bar.made = []
    monkeypatch.setattr(kvprof.commands.progress, "StepProgress", _Bar)
    return _Bar.made


def test_capture_shows_its_bar_before_it_loads_torch_and_closes_it_on_error(bars, monkeypatch):
    import kvprof.commands.capture as cmd

    def refuse(args):
        assert bars and bars[0].texts == ["loading torch"]  # on screen before the config (and torch) loads
        raise UsageError("refused")

    monkeypatch.setattr(cmd, "config_from_args", refuse)
    with pytest.raises(UsageError):
        cmd.run(argparse.Namespace(progress=True))
    assert bars[0].closed


def test_bench_shows_its_bar_before_it_loads_torch_and_closes_it_on_error(bars, monkeypatch):
    import kvprof.kvcache.devinfo
    from kvprof.commands import bench

    def refuse(name):
        assert bars and bars[0].texts == ["loading torch"]
        raise UsageError("refused")

    monkeypatch.setattr(kvprof.kvcache.devinfo, "resolve_device", refuse)
    with pytest.raises(UsageError):
        bench.run(argparse.Namespace(progress=True, device="cpu"))
    assert bars[0].closed


SGLANG_NSYS = Path(__file__).resolve().parent.parent / "traces" / "samples" / "h200-sglang" / "nsys-sglang"


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_variants_never_cuts_a_name_and_names_what_it_left_out(columns, capsys, monkeypatch):
    from kvprof.cli import main
    from kvprof.kvcache.writers import writer_names

    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["variants", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(map(len, lines)) <= columns and "…" not in out
    first_cells = {line.split("│")[1].strip().removesuffix(" *") for line in lines if line.startswith("│ ")}
    assert set(writer_names()) <= first_cells  # every name whole, in its own cell
    if columns < 120:
        assert f"not shown at {columns} columns: description" in " ".join(out.split())


@pytest.mark.parametrize("columns", [80, 120])
def test_analyze_kv_write_table_keeps_its_headers_and_names_whole(columns, capsys, monkeypatch):
    from kvprof.cli import main

    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["analyze", str(SGLANG_NSYS), "--no-files"]) == 0
    out = capsys.readouterr().out
    kv = out[out.index("SGLang plugin: KV writes by path"):]  # the plugin's table and the KV-write kernels'
    assert "…" not in kv and max(map(len, kv.splitlines())) <= columns
    assert "sglang_store_cache" in kv and "kernels" in kv and "writes" in kv
    assert "not shown at" in " ".join(kv.split())  # what was left out is named under the table


def test_fit_table_drops_columns_in_their_order_and_never_the_names():
    from rich.console import Console

    from kvprof.report.cells import FitCol, fit_table

    cols = [FitCol("name", "left"), FitCol("a figure", drop=2), FitCol("another", drop=1),
            FitCol("why", "left", wrap=True)]
    rows = [["a_long_writer_name_here", "12,345.6", "7.0", "n/a (a reason in several words)"]]
    for width, gone in ((200, []), (70, []), (60, ["another"]), (50, ["another", "a figure"]),
                        (30, ["another", "a figure"])):
        table, notes = fit_table(None, cols, rows, width)
        console = Console(width=max(width, 60), record=True, file=None)
        with console.capture() as cap:
            console.print(table)
        text = cap.get()
        assert "a_long_writer_name_here" in text and "…" not in text
        assert [c.header for c in table.columns] == [c.header for c in cols if c.header not in gone] or gone == []
        assert bool(notes) == bool(gone)
        if gone:
            assert notes[0].startswith(f"not shown at {width} columns: {', '.join(gone)}")
        if width >= 50:  # narrower than a name and the shortest text column: wider, never cut
            assert max(map(len, text.splitlines())) <= width


@pytest.mark.parametrize("name", ["rope_then_store", "rope_then_two_stream", "rope_then_triton_fused",
                                  "rope_triton_fused", "triton_fused"])
def test_writers_whose_triton_kernel_runs_interpreted_say_so(name, monkeypatch):
    """The rope_then_* writers run kvprof's Triton rotary kernel: on a CPU, in Triton's
    interpreter, so their info says interpreted (capture, variants and bench mark them `*`)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from kvprof.bench.run import _runs_interpreted
    from kvprof.kvcache.writers import create_writer

    assert _runs_interpreted(create_writer(name))


def test_bench_derives_nothing_from_an_interpreted_winner(capsys):
    """A CPU bench whose best kvprof write is interpreted: GB/s, % copy and the ratios read
    n/a (interpreted), not 0; the target reads µs."""
    from rich.console import Console

    from kvprof.bench.render import render_table
    from kvprof.core.bench_result import BenchResult

    point = {"heads": 1, "dim": 128, "cache_dtype": "bf16", "input_dtype": "bf16", "tokens": 1, "mode": "eager",
             "status": "ok", "bytes": 1024}
    doc = {"device": {"name": "x86_64", "type": "cpu"}, "limits": {"copy_rate_gbs": 10.0},
           "settings": {"variants": ["two_stream", "triton_fused"], "interpreted": ["triton_fused"]},
           "records": [{**point, "variant": "two_stream", "median_us": 8.0, "iqr_us": 0.1},
                       {**point, "variant": "triton_fused", "median_us": 4400.0, "iqr_us": 60.0, "gbs": 0.0002,
                        "pct_copy_rate": 0.002, "ratio_to": {"two_stream": 0.0018}}]}
    render_table(BenchResult.from_json(doc), Console(width=250, file=None))
    out = " ".join(capsys.readouterr().out.split())
    assert "triton_fused *" in out and "n/a (interpreted)" in out
    assert "│ 0 │" not in out and "0.00 │" not in out
    assert "1.2 µs + bytes" in out and " us " not in out


def test_layer_savings_follow_the_one_rule():
    """A CPU's layer-step saving with no spread, or within it, is noise; one against an
    interpreted variant is interpreted; the capture's line never calls either measured."""
    from kvprof.analysis.layer_step import StepSaving
    from kvprof.report.layer_steps import saving_figure, saving_lines

    def saving(variant: str, saving_ns: float, spread_ns: float | None, clock: str = "wall") -> dict:
        return StepSaving(variant, "two_stream", "decode", 8, 2, clock, 1e6, None, 1e6 + saving_ns, None, saving_ns,
                          spread_ns, None, None).to_json()

    raw = {"against": ["two_stream"], "savings": [saving("triton_fused", 20.124e6, None),
                                                  saving("index_put", 0.2e6, 0.5e6)], "boundaries": [], "notes": []}
    lines = " ".join(saving_lines(raw, 8))
    assert "measured step saving" not in lines and "+20.124 (noise: no spread to judge it) vs two_stream" in lines
    assert "+0.200 (noise: within the steps' spread) ± 0.500 vs two_stream" in lines
    lines = " ".join(saving_lines(raw, 8, {"triton_fused"}))
    assert "triton_fused +20.124 * vs two_stream" in lines
    from kvprof.analysis.layer_step import StepSaving as S

    gpu = S.from_json(saving("cuda_fused", 0.3e6, 0.1e6, clock="cuda_events"))
    assert saving_figure(gpu).trusted


def test_a_negative_reference_cost_is_never_printed_as_a_figure():
    from rich.console import Console

    from kvprof.report.console import reference_table

    row = {"variant": "triton_fused", "phase": "decode", "size": 8, "steps": 6, "step_ns": 9e6, "step_iqr_ns": 2e6,
           "cost_per_write_ns": -3_810_580.0, "attribution": "wall", "context": "layer", "write_share": -0.2,
           "writes_only_step_ns": 1e6, "source": "reference"}
    table, notes = reference_table([row], 200)
    console = Console(width=200, record=True, file=None)
    with console.capture() as cap:
        console.print(table)
    text = cap.get() + "\n".join(notes)
    assert "-3810" not in text and "-3,810" not in text and "-20" not in text
    assert "n/a here (negative: noise" in text and "cost/wr µs" in text
    assert "9,000.0" in text  # thousands separated


def _landing_summary() -> dict:
    row = {"layer": "all", "source": "reference", "phase": "decode", "size": 8, "writes": 12, "steps": 6,
           "step_ns": 9e6, "step_iqr_ns": 1e5, "attribution": "wall"}
    return {"schema": "kvprof.summary/1", "input": "r", "input_kind": "run",
            "device": {"name": "x86_64"}, "reference": {"clock": ["wall"]},
            "variants": {"two_stream": {"available": True}, "index_put": {"available": True},
                         "triton_fused": {"available": True, "interpreted": True}},
            "groups": [{**row, "variant": "two_stream", "cost_per_write_ns": 9_000.0},
                       {**row, "variant": "index_put", "cost_per_write_ns": -3_810_580.0},
                       {**row, "variant": "triton_fused", "cost_per_write_ns": 16_120_000.0}]}


def test_the_landing_view_labels_negative_and_interpreted_costs_and_never_draws_a_negative_bar():
    """The dashboard's landing view and the HTML report (one Landing): a negative cost reads
    n/a (negative: noise) and has no bar, an interpreted one is marked `*`, hatched, and a note
    says the bar is the interpreter's time."""
    from kvprof.dashboard import landing, tables

    land = landing.build("r", _landing_summary(), source="reference", baseline="two_stream")
    text = tables.landing_table(land.frame, land.timing).to_string()
    assert "-3,810" not in text and "-3810" not in text and "n/a (negative: noise)" in text
    assert "triton_fused *" in text and "16,120.000 µs *" not in text and "16,120.000 *" in text
    fig = dict(land.figures)["cost"]
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert "index_put" not in bars and "triton_fused *" in bars
    assert bars["triton_fused *"].marker.pattern.shape == "/" and all(y > 0 for t in bars.values() for y in t.y)
    notes = " ".join(land.notes)
    assert "interpreter's time" in notes and "n/a (negative: noise)" in notes and "index_put" in notes


def test_a_negative_reference_figure_in_the_observer_table_is_a_reading_and_warnings_speak_plainly():
    """The observer table's reference column holds the reference pass's cost, which a decoder
    layer's noise can make negative: read as it is (views label it), not flagged as impossible;
    what is impossible is named by table and row, not summary observer.rows[2]."""
    from kvprof.core.summary import Summary

    doc = {"schema": "kvprof.summary/1", "input": "r", "input_kind": "run", "groups": [
               {"variant": "two_stream", "source": "kineto", "phase": "decode", "size": 8, "cost_per_write_ns": -5.0}],
           "observer": {"rows": [{"variant": "two_stream", "source": "kineto", "phase": "decode", "size": 8,
                                  "reference_cost_per_write_ns": -3_810_580.0, "cost_per_write_ns": 9000.0}]}}
    s = Summary.from_json(doc)
    assert s.observer["rows"][0]["reference_cost_per_write_ns"] == -3_810_580.0
    (why,) = s.invalid
    assert why.startswith("the summary's groups table, row 1 (two_stream kineto decode 8): cost_per_write_ns")
    assert "rows[" not in why and "n/a in every view" in why


def test_bench_csv_says_which_medians_are_interpreted():
    import csv
    import io

    from kvprof.bench.render import to_csv
    from kvprof.core.bench_result import BenchResult

    point = {"heads": 1, "dim": 128, "cache_dtype": "bf16", "input_dtype": "bf16", "tokens": 1, "mode": "eager",
             "bytes": 1024}
    doc = {"device": {"name": "x86_64", "type": "cpu"},
           "settings": {"variants": ["two_stream", "triton_fused", "cuda_fused"], "interpreted": ["triton_fused"]},
           "records": [{**point, "variant": "two_stream", "status": "ok", "median_us": 8.0},
                       {**point, "variant": "triton_fused", "status": "ok", "median_us": 4400.0},
                       {**point, "variant": "cuda_fused", "status": "unavailable", "reason": "needs CUDA"}]}
    rows = {r["variant"]: r["figure"] for r in csv.DictReader(io.StringIO(to_csv(BenchResult.from_json(doc))))}
    assert rows == {"two_stream": "measured", "triton_fused": "interpreted", "cuda_fused": "n/a"}


def test_summary_csv_says_which_costs_are_interpreted_or_noise(tmp_path):
    import pandas as pd

    from kvprof.core.summary import Summary, VariantVerdict
    from kvprof.report.files import groups_csv

    summary = Summary("r", "run", variants={"triton_fused": VariantVerdict(interpreted=True)})
    groups = pd.DataFrame({"variant": ["two_stream", "triton_fused", "two_stream"], "source": ["kineto"] * 2 + [
        "reference"], "cost_per_write_ns": [9000.0, 1.6e7, -3.8e6]})
    assert list(groups_csv(groups, summary)["figure"]) == ["measured", "interpreted", "negative"]


def test_the_comparison_table_marks_interpreted_variants_and_derives_nothing_from_them():
    from rich.console import Console

    from kvprof.report.console import comparison_view

    row = {"source": "reference", "phase": "decode", "size": 8, "cost_per_write_ns": 4.4e6,
           "baseline_cost_per_write_ns": 9e3, "ratio_cost_per_write_ns": 488.9, "saving_per_step_ms": -350.0,
           "saving_share_of_itl": -29.0, "predicted_itl_ms": 362.0}
    cmp = {"baseline": "two_stream", "layers": 80, "interpreted": ["triton_fused"],
           "rows": [{**row, "variant": "triton_fused"}, {**row, "variant": "index_put", "ratio_cost_per_write_ns": 1.1,
                                                        "cost_per_write_ns": 9.9e3, "saving_per_step_ms": -0.07}]}
    table, notes = comparison_view(cmp, 200)
    console = Console(width=200, record=True, file=None)
    with console.capture() as cap:
        console.print(table)
    text = cap.get()
    line = next(x for x in text.splitlines() if "triton_fused" in x)
    assert "triton_fused *" in line and "488" not in line and "-350" not in line and "n/a (interpreted)" in line
    assert "1.10" in next(x for x in text.splitlines() if "index_put" in x)


def test_variants_shows_its_bar_before_it_loads_torch_and_closes_it_on_error(bars, monkeypatch):
    """`kvprof variants` loads torch and builds every writer (seconds on a small CPU): its bar is on
    screen first, says which writer it builds, and is gone whatever happens."""
    import kvprof.kvcache.devinfo
    from kvprof.commands import variants

    def refuse(name):
        assert bars and bars[0].texts == ["loading torch"]
        raise UsageError("refused")

    monkeypatch.setattr(kvprof.kvcache.devinfo, "resolve_device", refuse)
    with pytest.raises(UsageError):
        variants.run(argparse.Namespace(device="cpu", cache_dtype="bf16", input_dtype=None))
    assert bars[0].closed
    monkeypatch.undo()
    import kvprof.commands.progress

    monkeypatch.setattr(kvprof.commands.progress, "StepProgress", _Bar)
    _Bar.made.clear()
    assert variants.run(argparse.Namespace(device="cpu", cache_dtype="bf16", input_dtype=None)) == 0
    from kvprof.kvcache.writers import writer_names

    assert _Bar.made[0].total == len(writer_names()) and "building two_stream" in _Bar.made[0].texts
    assert _Bar.made[0].closed


def test_building_the_torch_compile_writer_compiles_nothing_until_it_writes(monkeypatch):
    """Listing or checking the variants builds every writer: torch.compile (which imports Dynamo,
    most of `kvprof variants`' time on a CPU) waits for the first write."""
    import torch

    from kvprof.kvcache.writers import create_writer

    calls = []

    def compile_(fn, **kw):
        calls.append(fn.__name__)
        return fn

    monkeypatch.setattr(torch, "compile", compile_)
    w = create_writer("torch_compile")
    assert w.unsupported_reason(torch.device("cpu"), torch.bfloat16, torch.bfloat16) is None and calls == []
    k, v = torch.zeros(4, 1, 2), torch.zeros(4, 1, 2)
    w.write(k, v, torch.tensor([1]), torch.ones(1, 1, 2), torch.full((1, 1, 2), 2.0), torch.float32)
    w.write(k, v, torch.tensor([2]), torch.ones(1, 1, 2), torch.ones(1, 1, 2), torch.float32)
    assert calls == ["_store"] and k[1].eq(1).all() and v[1].eq(2).all() and k[2].eq(1).all()


def test_run_vs_run_table_marks_interpreted_costs_and_derives_nothing_from_untrusted_ones():
    """`kvprof compare RUN RUN2`'s table: a cost the run timed in the interpreter is marked `*`, a
    negative one reads n/a (negative: noise), and no ratio or saving comes from either."""
    from rich.console import Console

    from kvprof.report.console import run_comparison_table

    row = {"source": "reference", "phase": "decode", "size": 8, "before_cost_per_write_ns": 9e3,
           "after_cost_per_write_ns": 4.5e3, "ratio_cost_per_write_ns": 0.5, "saving_per_step_ms": 0.36}
    doc = {"layers": 80, "interpreted": {"before": ["triton_fused"], "after": ["triton_fused"]}, "rows": [
        {**row, "variant": "two_stream"},
        {**row, "variant": "triton_fused", "before_cost_per_write_ns": 1.612e7, "after_cost_per_write_ns": 8.06e6,
         "saving_per_step_ms": 644.8},
        {**row, "variant": "index_put", "before_cost_per_write_ns": -3_810_580.0, "ratio_cost_per_write_ns": -0.001,
         "saving_per_step_ms": -305.0}]}
    console = Console(width=200, record=True, file=None)
    with console.capture() as cap:
        console.print(run_comparison_table(doc))
    lines = {x.split("│")[1].strip(): x for x in cap.get().splitlines() if x.startswith("│ ")}
    assert "16,120.00 *" in lines["triton_fused *"] and "8,060.00 *" in lines["triton_fused *"]
    assert lines["triton_fused *"].count("n/a (interpreted)") == 2 and "644" not in lines["triton_fused *"]
    assert "-3,810" not in lines["index_put"] and lines["index_put"].count("n/a (negative: noise)") == 3
    assert "0.50" in lines["two_stream"] and "0.360" in lines["two_stream"]
