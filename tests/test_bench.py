"""kvprof bench on CPU: it runs, checks correctness first, and derives its columns from one run."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from kvprof.bench.run import BenchPoint, derive, fused_verdicts, grid, run_bench
from kvprof.cli import main
from kvprof.core.bench_result import BenchResult, BenchRow, BenchTarget

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "traces" / "samples" / "h200-bench" / "bench.json"


def _result(records: list[dict], device: str = "NVIDIA H200") -> BenchResult:
    """A result from hand-written records (fields a record leaves out take their defaults)."""
    return BenchResult.from_json({"device": {"name": device}, "records": records})


def test_bench_cpu_small_grid(tmp_path, capsys):
    rc = main(["bench", "--variants", "index_put,two_stream,sgl_kernel", "--shapes", "1x128,2x96",
               "--dtypes", "bf16,fp8_e4m3<-bf16", "--tokens", "1,16", "--eager-repeats", "3",
               "--out", str(tmp_path)])
    assert rc == 0
    result = orjson.loads((tmp_path / "bench.json").read_bytes())
    recs = result["records"]
    assert {r["variant"] for r in recs} == {"index_put", "two_stream", "sgl_kernel"}
    assert len(recs) == 2 * 2 * 2 * 3  # shapes x dtypes x tokens x variants, eager only on CPU
    ok = [r for r in recs if r["status"] == "ok"]
    assert len(ok) == 16 and all(r["median_us"] > 0 and r["mode"] == "eager" for r in ok)
    assert all(r["status"] == "unavailable" and "sgl-kernel" in r["reason"] for r in recs
               if r["variant"] == "sgl_kernel")
    assert result["limits"]["copy_rate_gbs"] > 0
    assert result["settings"]["target_fixed_us"] == 1.2 and result["settings"]["target_rate_fraction"] == 0.9
    assert (tmp_path / "bench.csv").read_text().startswith("shape,heads,dim")
    assert "index_put" in capsys.readouterr().out
    assert BenchResult.from_json((tmp_path / "bench.json").read_bytes()).to_json() == result


def test_cpu_bench_times_with_one_thread_and_records_it(tmp_path, capsys):
    import torch

    before = torch.get_num_threads()
    assert main(["bench", "--device", "cpu", "--variants", "index_put", "--shapes", "1x8", "--tokens", "1",
                 "--eager-repeats", "4", "--out", str(tmp_path / "a")]) == 0
    assert BenchResult.from_json((tmp_path / "a" / "bench.json").read_bytes()).settings.torch_threads == 1
    assert torch.get_num_threads() == before  # given back afterwards
    assert "torch threads 1" in " ".join(capsys.readouterr().out.split())  # as wrapped at any width
    assert main(["bench", "--device", "cpu", "--variants", "index_put", "--shapes", "1x8", "--tokens", "1",
                 "--eager-repeats", "4", "--threads", "2", "--out", str(tmp_path / "b")]) == 0
    assert orjson.loads((tmp_path / "b" / "bench.json").read_bytes())["settings"]["torch_threads"] == 2


def test_help_states_the_cpu_defaults(capsys):
    from kvprof.bench.grids import CPU_GRID, CPU_THREADS

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for value in (CPU_GRID.shapes_text(), CPU_GRID.dtypes_text(), CPU_GRID.tokens_text()):
        assert f"{value} on CPU" in text
    assert f"default: {CPU_THREADS} on CPU" in text


def test_table_fits_the_terminal_and_says_why_a_figure_is_missing(tmp_path, capsys, monkeypatch):
    from kvprof.bench.render import fmt_median_iqr

    monkeypatch.setenv("COLUMNS", "72")
    assert main(["bench", "--device", "cpu", "--variants", "index_put,two_stream,sgl_kernel,cuda_fused",
                 "--shapes", "1x8", "--dtypes", "bf16", "--tokens", "1,3", "--eager-repeats", "4",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    table, wrote = out.split("\nwrote ")  # the last line names the files: a path is as long as it is
    assert max(map(len, table.splitlines())) <= 72 and "bench.json" in wrote
    doc = BenchResult.from_json((tmp_path / "bench.json").read_bytes())
    for r in (r for r in doc.records if r.variant == "index_put"):  # each median with its IQR beside it
        assert re.search(rf"│ +{re.escape(fmt_median_iqr(r.median_us, r.iqr_us))} │", out)
    # the CUDA-only writers have no figure on a CPU: named once with why, not a column of "-"
    assert "not shown, n/a (needs CUDA): sgl_kernel, cuda_fused" in out
    assert "unavailable" not in out.split("not shown")[0] and " - " not in out


def test_tables_wider_than_the_console_are_split_with_the_point_columns_in_each():
    from rich.console import Console

    from kvprof.bench.render import render_table

    result = BenchResult.from_json(GOLDEN.read_bytes())
    console = Console(width=90, record=True, color_system=None)
    render_table(result, console)
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 90
    assert "CUDA-graph replay, µs per write: median (IQR) [1/" in text
    parts = re.findall(r"\[(\d+)/(\d+)\]", text)
    heads = re.findall(r"┃ shape +┃ dtype +┃ tokens +┃", text)
    assert len(parts) >= 2 and len(heads) == len(parts)  # every part of every table leads with the point
    for v in result.variants:  # a column, or named under the tables with why it has no figure
        assert re.search(rf"┃ *{v} *┃", text) or re.search(rf"not shown, n/a \([^)]*\): .*\b{v}\b", text), v


def test_bench_target_is_a_recorded_option(tmp_path, capsys):
    rc = main(["bench", "--variants", "index_put", "--shapes", "1x64", "--dtypes", "bf16", "--tokens", "4",
               "--eager-repeats", "2", "--target-fixed-us", "2.5", "--target-rate-fraction", "0.5",
               "--out", str(tmp_path)])
    assert rc == 0
    doc = orjson.loads((tmp_path / "bench.json").read_bytes())
    assert doc["settings"]["target_fixed_us"] == 2.5 and doc["settings"]["target_rate_fraction"] == 0.5
    assert doc["settings"]["target"] == "2.5 µs + bytes / (0.5 x copy rate)"
    (rec,) = doc["records"]
    rate = doc["limits"]["copy_rate_gbs"]
    assert rec["target_us"] == pytest.approx(2.5 + rec["bytes"] / (0.5 * rate * 1e3))
    assert "2.5 µs + bytes / (0.5 x copy rate)" in capsys.readouterr().out


@pytest.mark.parametrize("flag,value", [("--target-rate-fraction", "0"), ("--target-rate-fraction", "1.5"),
                                        ("--target-fixed-us", "-1"), ("--target-fixed-us", "nan")])
def test_bad_target_is_one_line(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", flag, value, "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "out").exists()


def test_bench_rejects_unknown_variant(tmp_path, capsys):
    assert main(["bench", "--variants", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown variant" in capsys.readouterr().err


def test_bytes_moved_counts_inputs_and_rows():
    p = BenchPoint(heads=1, dim=128, cache_dtype="fp8_e4m3", input_dtype="bf16", tokens=10)
    assert p.bytes_moved() == 10 * 2 * 128 * (1 + 2)


def test_derive_ratios_and_target():
    recs = [BenchRow(1, 128, "bf16", "bf16", 1, v, "graph", "ok", bytes=4300, median_us=us)
            for v, us in (("a", 1.0), ("b", 2.0))]
    a, b = derive(recs, {"copy_rate_gbs": 4300.0, "empty_kernel_us": 0.5})
    assert a.ratio_to == {"b": 2.0} and b.ratio_to == {"a": 0.5}
    assert a.gbs == pytest.approx(4.3) and a.target_us == pytest.approx(1.2 + 4300 / (0.9 * 4300 * 1e3))
    assert a.meets_target and not b.meets_target
    (a,) = derive([a], {"copy_rate_gbs": 4300.0}, BenchTarget(0.5, 0.5))
    assert a.target_us == pytest.approx(0.5 + 4300 / (0.5 * 4300 * 1e3)) and not a.meets_target


def test_wrong_writer_is_reported_not_timed(monkeypatch):
    from kvprof.kvcache.writers.index_put import IndexPutWriter

    class Broken(IndexPutWriter):
        name = "broken"

        def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):
            super().write(k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale, v_scale)
            v_buf[loc[:1]] = 0  # loses one V row
            return "fused"

    import sys
    import types

    mod = types.ModuleType("broken_writer_mod")
    mod.make = Broken
    monkeypatch.setitem(sys.modules, "broken_writer_mod", mod)
    import torch

    result = run_bench(grid([(1, 64)], [("bf16", "bf16")], [4]), ["broken_writer_mod:make"], torch.device("cpu"),
                       eager_repeats=2)
    (rec,) = result.records
    assert rec.status == "wrong" and "V differs" in rec.reason


def test_unwritable_output_is_one_line_before_measuring(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = main(["bench", "--variants", "index_put", "--shapes", "1x8", "--tokens", "1", "--out", str(blocker / "sub")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 6 and len(err) == 1 and err[0].startswith("kvprof bench: error: cannot create output folder")


def test_eager_records_carry_host_time(tmp_path):
    import torch

    result = run_bench(grid([(1, 64)], [("bf16", "bf16")], [4]), ["index_put"], torch.device("cpu"), eager_repeats=3)
    (rec,) = result.records
    # on CPU the write runs on the host, so its host time is its wall time, give or take
    assert 0 < rec.host_us <= rec.median_us * 1.5 and rec.host_iqr_us >= 0
    # and the writer alone (no pool checks) is timed beside it
    assert 0 < rec.writer_host_us and rec.writer_host_iqr_us >= 0


def test_fused_verdicts_use_a_measured_sgl_kernel_over_the_reference():
    def rec(variant, mode, us, host=None, dtype="bf16"):
        r = {"variant": variant, "mode": mode, "status": "ok", "shape": "1x128", "dtype": dtype, "tokens": 1,
             "cache_dtype": dtype.split("<-")[0], "input_dtype": "bf16", "median_us": us, "target_us": 1.3,
             "meets_target": us <= 1.3}
        if host is not None:
            r["host_us"] = host
        return r

    result = {"device": {"name": "NVIDIA H200"}, "records": [
        rec("triton_fused", "graph", 1.2), rec("sgl_kernel", "graph", 1.1),
        rec("triton_fused", "eager", 20.0, host=9.0), rec("sgl_kernel", "eager", 20.0, host=9.5),
        rec("triton_fused", "graph", 1.25, dtype="fp8_e4m3<-bf16")]}
    v = fused_verdicts(BenchResult.from_json(result), "triton_fused")
    assert v["vs_sgl"] == {"compared": 1, "slower": ["1x128 bf16 1 tok 1.20 > 1.10 µs"],
                           "source": "measured: sgl_kernel"}
    assert v["eager_host"]["over"] == [] and v["eager_host"]["compared"] == 1
    assert v["fp8_vs_bf16"]["slower"] == ["1x128 fp8_e4m3<-bf16 1 tok 1.25 > bf16 1.20 µs"]
    assert v["eager_host"]["basis"] == "pool"  # records without the writer column
    assert v["fp8_vs_bf16"]["within_noise"] == []  # no spread recorded: a difference is a difference
    result["device"]["name"] = "NVIDIA A100"  # the reference numbers apply to an H200 only
    result["records"] = [r for r in result["records"] if r["variant"] != "sgl_kernel"]
    v = fused_verdicts(BenchResult.from_json(result), "triton_fused")
    assert v["vs_sgl"]["compared"] == 0 and v["eager_host"]["compared"] == 0


def test_fused_verdicts_compare_with_sgl_kernels_cubin_in_graphs_only():
    """sgl_kernel_cubin runs sgl-kernel's own kernels, so it is the graph peer where the op is
    missing (at every dtype, bf16 and fp8 alike); its eager host time is kvprof's ctypes launch,
    never a stand-in for the op's, and the op itself still wins where both ran."""
    def rec(variant, mode, us, dtype="bf16", host=None):
        return {"variant": variant, "mode": mode, "status": "ok", "shape": "8x128", "dtype": dtype, "tokens": 8,
                "cache_dtype": dtype.split("<-")[0], "input_dtype": "bf16", "median_us": us, "host_us": host}

    result = {"device": {"name": "NVIDIA H100 80GB HBM3"}, "records": [
        rec("triton_fused", "graph", 0.7), rec("sgl_kernel_cubin", "graph", 1.9),
        rec("triton_fused", "graph", 0.8, "fp8_e4m3<-bf16"), rec("sgl_kernel_cubin", "graph", 0.75, "fp8_e4m3<-bf16"),
        rec("triton_fused", "eager", 30.0, host=30.0), rec("sgl_kernel_cubin", "eager", 40.0, host=40.0)]}
    v = fused_verdicts(BenchResult.from_json(result), "triton_fused")
    assert v["vs_sgl"] == {"compared": 2, "slower": ["8x128 fp8_e4m3<-bf16 8 tok 0.80 > 0.75 µs"],
                           "source": "measured: sgl_kernel_cubin"}
    assert v["eager_host"]["compared"] == 0  # no host limit from the cubin's ctypes launch, none on an H100
    result["records"].append(rec("sgl_kernel", "graph", 2.0))
    v = fused_verdicts(BenchResult.from_json(result), "triton_fused")
    assert v["vs_sgl"]["compared"] == 2 and v["vs_sgl"]["source"] == "measured: sgl_kernel; measured: sgl_kernel_cubin"


def test_eager_host_verdict_judges_the_writer_and_reports_the_pool():
    """With the writer column present the check is on the writer's launch path (the
    counterpart of sgl-kernel's op), and the pool's and two index_put's host times on the
    same host are reported beside it, not dropped."""
    def rec(variant, tokens, host, writer_host):
        return {"variant": variant, "mode": "eager", "status": "ok", "shape": "1x128", "dtype": "bf16",
                "tokens": tokens, "cache_dtype": "bf16", "input_dtype": "bf16", "median_us": 30.0,
                "host_us": host, "writer_host_us": writer_host}

    result = {"device": {"name": "NVIDIA H200"}, "records": [
        rec("cuda_fused", 1, 9.5, 7.0), rec("cuda_fused", 8, 8.0, 8.9),
        rec("index_put", 1, 30.0, 27.0), rec("index_put", 8, 31.0, 29.0)]}
    e = fused_verdicts(BenchResult.from_json(result), "cuda_fused")["eager_host"]
    assert e["basis"] == "writer" and e["compared"] == 2
    assert e["over"] == ["1x128 bf16 8 tok 8.90 > 8.60 µs"]
    assert e["median_us"] == 7.95 and e["pool_median_us"] == 8.75 and e["pool_over"] == 1
    assert e["index_put_median_us"] == 28.0


def test_fp8_verdict_separates_differences_within_the_spread():
    def rec(dtype, tokens, us, iqr):
        return {"variant": "triton_fused", "mode": "graph", "status": "ok", "shape": "8x128", "dtype": dtype,
                "tokens": tokens, "cache_dtype": dtype.split("<-")[0], "input_dtype": "bf16", "median_us": us,
                "iqr_us": iqr, "target_us": 2.0, "meets_target": True}

    result = {"device": {"name": "NVIDIA H200"}, "records": [
        rec("bf16", 1, 0.700, 0.006), rec("fp8_e4m3<-bf16", 1, 0.704, 0.005),   # +4 ns, spread 6 ns
        rec("bf16", 8, 0.700, 0.006), rec("fp8_e4m3<-bf16", 8, 0.730, 0.005),   # +30 ns: slower
        rec("bf16", 64, 0.800, 0.006), rec("fp8_e4m3<-bf16", 64, 0.790, 0.005)]}
    f = fused_verdicts(BenchResult.from_json(result), "triton_fused")["fp8_vs_bf16"]
    assert f["compared"] == 3 and len(f["slower"]) == 2
    assert f["within_noise"] == ["8x128 fp8_e4m3<-bf16 1 tok 0.70 > bf16 0.70 µs"]


def test_small_points_of_judged_variants_are_timed_over_several_allocations():
    import torch

    from kvprof.bench.run import FLOOR_ALLOCATIONS, BenchPoint, floor_allocations

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    small, large = BenchPoint(8, 128, "bf16", "bf16", 64), BenchPoint(8, 128, "bf16", "bf16", 4096)
    assert FLOOR_ALLOCATIONS > 1
    for variant in ("triton_fused", "cuda_fused", "store_kv_fused", "sgl_kernel", "sgl_kernel_cubin"):
        assert floor_allocations(small, variant, cuda) == FLOOR_ALLOCATIONS
        assert floor_allocations(large, variant, cuda) == 1 and floor_allocations(small, variant, cpu) == 1
    assert floor_allocations(small, "index_put", cuda) == 1


def test_golden_h200_bench_loads_and_round_trips():
    """The committed H200 run (traces/samples/h200-bench, docs/benchmarks.md's source) reads as
    typed rows, and writing it back gives the same document."""
    doc = orjson.loads(GOLDEN.read_bytes())
    result = BenchResult.from_json(doc)
    assert result.complete and result.device_name == "NVIDIA H200" and len(result.records) == len(doc["records"])
    assert result.settings.target == BenchTarget()  # recorded before the target was a setting: the default
    back = result.to_json()
    assert back["records"] == doc["records"] and back["limits"] == doc["limits"] and back["device"] == doc["device"]
    # the target's words are written from its two figures: in µs now, "us" in the older file
    assert back["settings"].pop("target") == doc["settings"]["target"].replace(" us ", " µs ")
    assert {k: v for k, v in back["settings"].items() if not k.startswith("target_")} == \
        {k: v for k, v in doc["settings"].items() if k != "target"}


def test_golden_h200_bench_verdicts_hold_on_its_records():
    """What docs/benchmarks.md and the README state about the committed run, checked as
    properties of its records: every verdict is recomputed from the medians it names."""
    result = BenchResult.from_json(GOLDEN.read_bytes())
    assert result.sources["sgl_kernel_cubin"]["wheel"].startswith("sgl_kernel-0.3.21-")
    assert 0 < result.limits["empty_pdl_kernel_us"] < result.limits["empty_kernel_us"]
    graph = {(r.variant, r.key): r for r in result.records if r.mode == "graph" and r.ok}
    points = {key for _, key in graph}
    assert len(points) == 72
    for variant in ("triton_fused", "store_kv_fused"):
        v = fused_verdicts(result, variant)
        assert v["target"] == {"met": 72, "points": 72, "missed": []}  # the doc's "at every point"
        assert all(graph[(variant, k)].median_us <= graph[(variant, k)].target_us for k in points)
        assert v["vs_sgl"] == {"compared": 72, "slower": [], "source": "measured: sgl_kernel_cubin"}
        f = v["fp8_vs_bf16"]
        slower = [k for k in points if k[1] == "fp8_e4m3<-bf16"
                  and graph[(variant, k)].median_us > graph[(variant, (k[0], "bf16", k[2], k[3]))].median_us]
        assert f["compared"] == 24 and len(f["slower"]) == len(slower) > 0
        assert all(k[2] <= 64 for k in slower)  # only writes of a few tokens, at the latency floor
    small = [r for r in result.records if r.variant in ("triton_fused", "store_kv_fused", "cuda_fused")
             and r.mode == "graph" and r.ok and r.bytes <= result.settings.floor_allocations["max_bytes_per_write"]]
    assert small and all(len(r.allocation_us) == result.settings.floor_allocations["count"] for r in small)
    cuda = fused_verdicts(result, "cuda_fused")["eager_host"]
    assert cuda["basis"] == "writer" and cuda["compared"] == 72 and cuda["over"] == []
    assert cuda["median_us"] < cuda["pool_median_us"] < result_ref_eager_host_us()


def result_ref_eager_host_us() -> float:
    from kvprof.bench import reference

    return reference.load().eager_host_us


def test_reference_numbers_are_data_with_provenance():
    from kvprof.bench import reference

    ref = reference.load()
    assert ref.applies("NVIDIA H200") and not ref.applies("NVIDIA A100") and not ref.applies(None)
    assert len(ref.graph_us) == 6 and all(us > 0 for us in ref.graph_us.values()) and ref.eager_host_us > 0
    assert {"card", "what", "date"} <= ref.provenance.keys()


def test_old_bench_files_still_load():
    """A record of an older kvprof (no heads/dim/dtype fields, no writer column) reads with defaults."""
    result = BenchResult.from_json({"records": [{"shape": "8x128", "dtype": "fp8_e4m3<-bf16", "tokens": 8,
                                                 "variant": "triton_fused", "mode": "graph", "status": "ok",
                                                 "median_us": 0.7}]})
    (r,) = result.records
    assert (r.heads, r.dim, r.cache_dtype, r.input_dtype) == (8, 128, "fp8_e4m3", "bf16")
    assert r.writer_host_us is None and result.settings.target == BenchTarget() and result.variants == ["triton_fused"]
    with pytest.raises(ValueError, match="no records"):
        BenchResult.from_json(b'{"kind": "kvprof-bench"}')


def test_fused_verdicts_compare_with_sglang_store_cache_in_graphs_and_cold_writes():
    """SGLang's JIT store_cache is judged per mode: graph replays against graph replays, one write
    after an L2 flush against the same; a slower point within the larger IQR is said to be so."""
    def rec(variant, mode, us, iqr=0.001, tokens=1):
        return {"variant": variant, "mode": mode, "status": "ok", "shape": "32x128", "dtype": "bf16",
                "tokens": tokens, "cache_dtype": "bf16", "input_dtype": "bf16", "median_us": us, "iqr_us": iqr}

    result = _result([rec("triton_fused", "graph", 0.70), rec("sglang_store_cache", "graph", 0.72),
                      rec("triton_fused", "graph", 275.0, 0.1, 32768),
                      rec("sglang_store_cache", "graph", 274.95, 0.2, 32768),
                      rec("triton_fused", "cold", 0.93), rec("sglang_store_cache", "cold", 0.81)])
    v = fused_verdicts(result, "triton_fused")["vs_store_cache"]
    assert v["graph"] == {"compared": 2, "slower": ["32x128 bf16 32768 tok 275.000 > 274.950 µs"],
                          "within_noise": ["32x128 bf16 32768 tok 275.000 > 274.950 µs"]}
    assert v["cold"] == {"compared": 1, "slower": ["32x128 bf16 1 tok 0.930 > 0.810 µs"], "within_noise": []}
    from kvprof.bench.render import verdict_lines

    lines = [x for x in verdict_lines(result) if "store_cache" in x]
    assert lines == ["triton_fused: slower than SGLang's store_cache at 1/2 graph points, 1 of them by less than the "
                     "spread: 32x128 bf16 32768 tok 275.000 > 274.950 µs",
                     "triton_fused: slower than SGLang's store_cache at 1/1 cold single-write points, 0 of them by "
                     "less than the spread: 32x128 bf16 1 tok 0.930 > 0.810 µs"]


def test_cold_and_graph_modes_need_cuda_and_are_refused_in_one_line(tmp_path, capsys):
    assert main(["bench", "--modes", "cold", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "need a CUDA device" in err[0]
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--modes", "warm", "--out", str(tmp_path / "o")])
    assert exit_.value.code == 2 and "graph, eager and/or cold" in capsys.readouterr().err


def test_settings_record_the_modes_and_old_files_read_without_them():
    from kvprof.core.bench_result import BenchSettings

    s = BenchSettings(modes=["graph", "cold"])
    assert BenchSettings.from_json(s.to_json()).modes == ["graph", "cold"]
    assert BenchSettings.from_json({}).modes == []


@pytest.mark.gpu
def test_cold_write_is_timed_as_a_graph_node_on_a_flushed_l2(tmp_path, capsys):
    """On CUDA: --modes graph,cold gives both rows per point; a cold write reads its rows from
    DRAM, so it is not cheaper than the same write replayed warm (beyond the spread)."""
    assert main(["bench", "--variants", "triton_fused", "--shapes", "8x128", "--dtypes", "bf16", "--tokens", "1,4096",
                 "--modes", "graph,cold", "--replays", "30", "--out", str(tmp_path)]) == 0
    doc = orjson.loads((tmp_path / "bench.json").read_bytes())
    rows = {(r["tokens"], r["mode"]): r for r in doc["records"] if r["status"] == "ok"}
    assert set(rows) == {(1, "graph"), (1, "cold"), (4096, "graph"), (4096, "cold")}
    assert doc["settings"]["modes"] == ["graph", "cold"]
    for t in (1, 4096):
        cold, warm = rows[(t, "cold")], rows[(t, "graph")]
        assert 0 < cold["median_us"] < 100
        assert cold["median_us"] >= warm["median_us"] - max(cold["iqr_us"], warm["iqr_us"])


def test_a_cpu_bench_marks_interpreted_writers_and_judges_no_gpu_target(capsys, monkeypatch):
    """On a CPU the Triton writers run in Triton's interpreter: their columns carry `*` with the
    reason once, and the GPU target (graph replays) is neither printed as missed nor counted."""
    from rich.console import Console

    from kvprof.bench.render import render_table, verdict_lines
    from kvprof.bench.run import _runs_interpreted
    from kvprof.kvcache.writers import create_writer

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _runs_interpreted(create_writer("triton_fused")) and not _runs_interpreted(create_writer("index_put"))
    point = {"heads": 1, "dim": 128, "cache_dtype": "bf16", "input_dtype": "bf16", "tokens": 1, "mode": "eager",
             "status": "ok", "bytes": 1024, "gbs": 0.2, "pct_copy_rate": 1.0, "target_us": 1.25,
             "meets_target": False}
    doc = {"device": {"name": "x86_64", "type": "cpu"},
           "settings": {"variants": ["index_put", "triton_fused"], "interpreted": ["triton_fused"]},
           "records": [{**point, "variant": "index_put", "median_us": 8.0, "iqr_us": 0.1},
                       {**point, "variant": "triton_fused", "median_us": 4400.0, "iqr_us": 60.0}]}
    result = BenchResult.from_json(doc)
    assert result.settings.interpreted == ["triton_fused"]
    assert result.settings.to_json()["interpreted"] == ["triton_fused"]
    render_table(result, Console(width=200, file=None))
    out = capsys.readouterr().out
    assert "triton_fused *" in out and "* ran under Triton's interpreter" in out
    assert "not shown, n/a (a GPU target): target, ok" in out and " NO " not in out
    assert not [line for line in verdict_lines(result) if "target met" in line]


def test_a_cpu_bench_defaults_to_the_quick_grid_and_full_is_a_flag(monkeypatch):
    """On a CPU the default grid is the quick one (a bench of every default writer in about
    half a minute); --grid full gives the grid that took minutes; CUDA's default stays full."""
    import argparse

    import torch

    from kvprof.bench import grids
    from kvprof.bench.run import default_grid
    from kvprof.commands.bench import add_arguments

    cpu = torch.device("cpu")
    quick = default_grid(cpu)
    assert len(quick) == grids.CPU_QUICK_GRID.points < grids.CPU_GRID.points
    assert len(default_grid(cpu, size="full")) == grids.CPU_GRID.points
    assert len(default_grid(cpu, "rope")) == grids.CPU_QUICK_ROPE_GRID.points < grids.CPU_ROPE_GRID.points
    assert grids.default_grid("cuda") is grids.CUDA_GRID and grids.default_rope_grid("cuda") is grids.CUDA_ROPE_GRID
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args([]).grid is None and p.parse_args(["--grid", "full"]).grid == "full"


def test_bench_tells_its_progress_which_point_and_variant_runs():
    """The progress display names each point and variant (interpreted ones with `*`) and
    advances once per variant and point."""
    import torch

    from kvprof.bench.run import run_bench

    class Recorder:
        def __init__(self) -> None:
            self.seen: list[str] = []
            self.steps = 0

        def describe(self, text: str) -> None:
            self.seen.append(text)

        def advance(self) -> None:
            self.steps += 1

    bar = Recorder()
    run_bench(grid([(1, 8)], [("bf16", "bf16")], [1, 3]), ["index_put", "two_stream"], torch.device("cpu"),
              eager_repeats=2, progress=bar)
    assert bar.steps == 4
    assert "1x8 bf16 3 tok: two_stream" in bar.seen and "copy rate" in bar.seen


def test_interpreted_writers_take_few_samples_and_the_table_says_how_many(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from kvprof.bench.run import INTERPRETED_REPEATS

    assert main(["bench", "--device", "cpu", "--variants", "index_put,triton_fused", "--shapes", "1x16",
                 "--dtypes", "bf16", "--tokens", "1", "--eager-repeats", "6", "--out", str(tmp_path)]) == 0
    doc = BenchResult.from_json((tmp_path / "bench.json").read_bytes())
    samples = {r.variant: r.samples for r in doc.records if r.ok}
    assert samples == {"index_put": 6, "triton_fused": INTERPRETED_REPEATS}
    out = " ".join(capsys.readouterr().out.split())
    assert f"not a kernel's, {INTERPRETED_REPEATS} samples (triton_fused)" in out
