"""Metrics, verdicts, comparison, generic stats, and the analyze/compare commands end to end."""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from kvprof.analysis.compare import Benchmark, compare_groups
from kvprof.analysis.metrics import fused_or_fell_back, paths_verdict
from kvprof.analysis.summary import analyze
from kvprof.commands import analyze as analyze_cmd, compare as compare_cmd
from kvprof.core.run import TraceMeta
from kvprof.core.schema import SCHEMA
from kvprof.trace.load import load
from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build, dumps

REAL = Path(__file__).parent / "fixtures" / "real"


def _args(mod, argv):
    p = argparse.ArgumentParser()
    mod.add_arguments(p)
    return p.parse_args(argv)


def test_real_run_fused_verdicts_and_projection():
    a = analyze(load(REAL))
    v = a.summary.to_json()["variants"]
    assert v["triton_fused"]["fused"] is True and v["triton_fused"]["agree"] is True
    assert v["two_stream"]["fused"] is False and v["index_put"]["fused"] is False
    assert v["sgl_kernel"] == {"available": False, "reason": "sgl_kernel is not installed", "sources": []}
    g = a.groups.set_index(["variant", "source", "phase"])
    # the two sources agree on the replayed decode write cost within 10 %
    for var in ("index_put", "two_stream", "triton_fused"):
        k, n = (g.loc[(var, source, "decode"), "cost_per_write_ns"] for source in ("kineto", "nsys"))
        assert abs(k - n) / n < 0.10
    assert g.loc[("two_stream", "nsys", "decode"), "streams"] == 2
    h = a.summary.to_json()["comparison"]["headline"]
    assert h["variant"] == "triton_fused" and 0.3 < h["saving_per_step_ms"] < 0.7
    assert a.warnings == []


def test_disagreement_between_paths_and_kernels_is_a_warning(tmp_path):
    spec = TraceSpec(variant="liar", fused=True, paths={"fused": 8},
                     phases=[PhaseSpec("prefill", 8, 2)])  # claims fused, launches 2 kernels per write
    doc, _ = build(spec)
    p = tmp_path / "liar.pt.trace.json.gz"
    p.write_bytes(gzip.compress(dumps(doc)))
    a = analyze(load(p))
    v = a.summary.to_json()["variants"]["liar"]
    assert v["fused_by_paths"] is True and v["fused_by_kernels"] is False and v["agree"] is False
    assert any("liar: the writer reported fused" in w for w in a.warnings)


def test_paths_verdict():
    assert paths_verdict({"fused": 3}) == (True, [])
    assert paths_verdict({"fused": 2, "fallback: no sgl_kernel": 1}) == (False, ["no sgl_kernel"])
    assert paths_verdict({"compiled": 4}) == (None, [])
    assert paths_verdict({}) == (None, [])


def test_fallback_is_reported():
    w = pd.DataFrame({"during_capture": [False], "step": [0], "gpu_ops": [2]})
    v, _ = fused_or_fell_back("sgl", TraceMeta(fused=True, paths={"fallback: op missing": 4}), None, w)
    assert v.fell_back and v.fallback_reasons == ["op missing"] and v.agree is True


def test_compare_projection_arithmetic():
    groups = pd.DataFrame([
        {"variant": "two_stream", "source": "nsys", "phase": "decode", "size": 10, "layer": "all",
         "cost_per_write_ns": 3000.0, "gpu_span_ns": 2000.0, "gpu_busy_ns": 4000.0, "host_launch_ns": float("nan"),
         "kernels_per_write": 2.0, "step_gpu_ns": 240000.0},
        {"variant": "fused", "source": "nsys", "phase": "decode", "size": 10, "layer": "all",
         "cost_per_write_ns": 1000.0, "gpu_span_ns": 1000.0, "gpu_busy_ns": 1000.0, "host_launch_ns": float("nan"),
         "kernels_per_write": 1.0, "step_gpu_ns": 80000.0},
    ])
    c = compare_groups(groups, "two_stream", Benchmark(), layers=80)
    r = c["rows"][0]
    assert r["ratio_cost_per_write_ns"] == pytest.approx(1 / 3)
    assert r["saving_per_step_ms"] == pytest.approx(0.16)  # 80 x 2 µs
    assert r["predicted_itl_ms"] == pytest.approx(12.05 - 0.16)
    assert c["headline"]["explains_fraction"] == pytest.approx(0.16 / 0.18)


def test_cpu_only_trace_reports_cpu_side(tmp_path, capsys):
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    x = torch.zeros(100, 8)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("kvprof.step[decode bs=4] #0"):
            for layer in range(2):
                with record_function(f"set_kv_buffer[index_put] L{layer}"):
                    x[torch.arange(4)] = torch.ones(4, 8)
    p = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(p))
    rc = analyze_cmd.run(_args(analyze_cmd, [str(p), "--out", str(tmp_path / "out")]))
    assert rc == 0
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert any("no GPU events (CPU-only trace)" in w for w in s["warnings"])
    assert s["traces"][0]["generic"]["gpu"] is False and s["traces"][0]["generic"]["host_calls_by_name"]
    w = pq.read_table(tmp_path / "out" / "writes.parquet").to_pandas()
    assert len(w) == 2 and set(w["layer"]) == {0, 1} and (w["gpu_ops"] == 0).all() and (w["host_dur_ns"] > 0).all()


def test_analyze_writes_all_outputs_atomically(tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(REAL, run)
    assert analyze_cmd.run(_args(analyze_cmd, [str(run)])) == 0
    for f in ("summary.json", "summary.csv", "events.parquet", "writes.parquet"):
        assert (run / f).is_file()
    assert not list(run.glob(".*tmp*"))
    ev = pq.read_table(run / "events.parquet")
    assert ev.schema.equals(SCHEMA)
    s = json.loads((run / "summary.json").read_text())
    assert s["schema"] == "kvprof.summary/1" and s["groups"]
    out = capsys.readouterr().out
    assert "triton_fused: fused" in out and "predicted" in out
    assert not (run / "compare.json").exists()
    assert compare_cmd.run(_args(compare_cmd, [str(run), "--baseline", "two_stream", "--out", str(run / "cmp")])) == 0
    assert not (run / "compare.json").exists()  # compare writes only into --out
    c = json.loads((run / "cmp" / "compare.json").read_text())
    assert c["headline"]["variant"] == "triton_fused"


def test_compare_unknown_baseline_is_a_usage_error():
    from kvprof.core.errors import UsageError

    with pytest.raises(UsageError, match="baseline 'nope'"):
        compare_cmd.run(_args(compare_cmd, [str(REAL), "--baseline", "nope", "--no-files"]))


def test_foreign_trace_gets_generic_numbers(tmp_path, capsys):
    doc, _ = build(TraceSpec(phases=[PhaseSpec("prefill", 8, 1)],
                             write=WriteSpec([KernelSpec(7, 0, 1000), KernelSpec(21, 200, 1000)])))
    doc.pop("kvprof")
    for e in doc["traceEvents"]:
        if e.get("cat") in ("user_annotation", "gpu_user_annotation"):
            e["name"] = "forward"
    p = tmp_path / "foreign.json"
    p.write_bytes(dumps(doc))
    a = analyze(load(p))
    g = a.summary.to_json()["traces"][0]["generic"]
    assert a.groups.empty and g["gpu"] is True
    assert g["kernels_by_name"][0]["count"] == 8
    assert g["overlap_ns"] == 4 * 800 and len(g["streams"]) == 2
    assert g["launches"]["launching_calls"] == 8


def test_kvprof_trace_loads_in_hta(tmp_path):
    hta = pytest.importorskip("hta.trace_analysis")
    import json

    from kvprof.core.run import hta_metadata_json

    doc, _ = build(TraceSpec(phases=[PhaseSpec("prefill", 8, 2), PhaseSpec("decode", 8, 2, graph=True)]))
    doc["distributedInfo"] = json.loads(hta_metadata_json(0))  # what capture adds to a profile
    d = tmp_path / "hta"
    d.mkdir()
    (d / "t.pt.trace.json.gz").write_bytes(gzip.compress(dumps(doc)))
    ta = hta.TraceAnalysis(trace_dir=str(d))
    df = ta.t.get_trace(0)
    names = ta.t.symbol_table.get_sym_table()
    kernels = df[df["cat"].map(lambda i: names[i]) == "kernel"]
    ours = load(d / "t.pt.trace.json.gz").traces[0].events.to_pandas()
    assert len(kernels) == int((ours["kind"] == "kernel").sum()) == 32
    # the real H200 captures load too
    ta2 = hta.TraceAnalysis(trace_files={0: str(REAL / "two_stream.pt.trace.json.gz")})
    assert len(ta2.t.get_trace(0)) > 0


def test_captured_sample_loads_in_hta_as_is():
    """A trace written by `kvprof capture` (distributedInfo added at capture) needs no fix-up."""
    hta = pytest.importorskip("hta.trace_analysis")
    path = (Path(__file__).resolve().parent.parent / "traces" / "samples" / "h200-llama70b-tp8"
            / "two_stream.pt.trace.json.gz")
    ta = hta.TraceAnalysis(trace_files={0: str(path)})
    df = ta.t.get_trace(0)
    names = ta.t.symbol_table.get_sym_table()
    hta_kernels = int((df["cat"].map(lambda i: names[i]) == "kernel").sum())
    ours = load(path).traces[0].events.to_pandas()
    assert hta_kernels == int((ours["kind"] == "kernel").sum()) > 0
    assert ta.t.meta_data[0]["distributedInfo"]["rank"] == 0


def test_new_gpu_time_charges_back_to_back_pdl_writes_the_distance_between_their_ends():
    """Writes launched with programmatic dependent launch start while the previous one runs
    and wait: their spans overlap, and each adds only what it ends after the last one."""
    import math

    import pandas as pd

    from kvprof.analysis.writes import new_gpu_time

    start = pd.Series([0.0, 600.0, 1200.0, 3000.0, float("nan"), 3100.0], index=[5, 6, 7, 8, 9, 10])
    end = pd.Series([960.0, 1560.0, 2160.0, 3500.0, float("nan"), 3400.0], index=[5, 6, 7, 8, 9, 10])
    new = new_gpu_time(start, end)
    assert new.loc[[5, 6, 7, 8]].tolist() == [960.0, 600.0, 600.0, 500.0]
    assert math.isnan(new.loc[9])
    assert new.loc[10] == 0.0  # wholly inside the write before it
