"""HolisticTraceAnalysis (HTA) on kvprof runs: ``RUN/hta/<variant>/`` is a folder
``TraceAnalysis(trace_dir=...)`` reads, and its breakdowns agree with kvprof's own event table.

HTA reads every .json/.gz in a folder as one trace per rank, so a run folder (manifest,
summaries, one trace per variant) is not one; capture adds the per-variant folders. On a
CPU capture HTA sees no GPU stream: its kernel breakdown is empty and its temporal
breakdown has no kernel to start from. On the committed H200 capture both run once HTA's
rounding of ns timestamps is off (HTA_DISABLE_NS_ROUNDING=1), and are checked against the
same trace read by kvprof.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import kvprof.api as kv
from kvprof.cli import main

hta = pytest.importorskip("hta.trace_analysis")

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "traces" / "samples" / "h200-llama70b-tp8"
STEPS = 2
# what HTA 0.5 logs when a trace has no iterations or no rank, or two traces share a rank
UNWANTED = ("ProfilerStep not found", "There is only one iteration", "If the trace file does not have the rank",
            "File ")
TINY = ["--steps", str(STEPS), "--warmup", "1", "--batch-sizes", "1", "--phase", "decode", "--no-progress",
        "--no-summary"]


@contextmanager
def hta_warnings() -> Iterator[list[str]]:
    """What HTA logs at WARNING and above while the block runs (its logger does not propagate)."""
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep(level=logging.WARNING)
    log = logging.getLogger("hta")
    log.addHandler(handler)
    try:
        yield seen
    finally:
        log.removeHandler(handler)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cpu")
    assert main(["capture", "--device", "cpu", *TINY, "--variants", "index_put", "--out", str(out),
                 "--run-id", "r"]) == 0
    return out / "r"


def gpu_events(trace: Path):
    """kvprof's own reading of a trace: its GPU work (kernels, copies, fills)."""
    ev = kv.open_run(trace).traces[0].events.to_pandas()
    return ev[ev["kind"].isin(["kernel", "memcpy", "memset"])]


def test_capture_gives_each_variant_a_folder_hta_reads_as_one_rank(cpu_run):
    folder = cpu_run / "hta" / "index_put"
    (trace,) = folder.iterdir()
    original = cpu_run / "index_put.pt.trace.json.gz"
    assert trace.name == original.name and not trace.is_symlink() and os.path.samefile(trace, original)
    with hta_warnings() as warned:
        analysis = hta.TraceAnalysis(trace_dir=str(folder))
    # one trace with its rank, and the measured steps as HTA's iterations (prof.step() after each)
    assert not [w for w in warned if w.startswith(UNWANTED)], warned
    assert sorted(analysis.t.get_all_traces()) == [0]
    assert [int(s) for s in analysis.get_profiler_steps()] == list(range(STEPS))


def test_hta_breakdowns_on_a_cpu_capture_have_no_gpu_kernel_to_work_on(cpu_run):
    analysis = hta.TraceAnalysis(trace_dir=str(cpu_run / "hta" / "index_put"))
    frame = analysis.t.get_trace(0)
    names = analysis.t.symbol_table.get_sym_table()
    assert len(frame) > 0 and (frame["stream"] == -1).all()  # every event is the host's
    assert any(names[i].startswith("set_kv_buffer[index_put]") for i in frame["name"].unique())
    by_type, per_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
    assert by_type.empty and per_kernel.empty
    # HTA 0.5 spans the temporal breakdown from the first GPU kernel to the last; with none
    # it indexes an empty frame (hta/analyzers/breakdown_analysis.py, _get_idle_time_for_kernels)
    with pytest.raises(IndexError):
        analysis.get_temporal_breakdown(visualize=False)


@pytest.fixture(scope="module")
def h200_folders(tmp_path_factory) -> dict[str, Path]:
    """The committed H200 run's manifest and torch.profiler traces, given their HTA folders."""
    run = tmp_path_factory.mktemp("h200")
    for p in [H200 / "manifest.json", *sorted(H200.glob("*.pt.trace.json.gz"))]:
        shutil.copyfile(p, run / p.name)
    return kv.hta_folders(run)


def test_hta_breakdowns_on_the_h200_capture_agree_with_kvprof(h200_folders, monkeypatch):
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    assert sorted(h200_folders) == sorted(p.name.split(".")[0] for p in H200.glob("*.pt.trace.json.gz"))
    for variant, folder in h200_folders.items():
        (trace,) = folder.iterdir()
        ours = gpu_events(trace)
        analysis = hta.TraceAnalysis(trace_dir=str(folder))
        t = analysis.get_temporal_breakdown(visualize=False).iloc[0]
        span_us = ((ours["start_ns"] + ours["dur_ns"]).max() - ours["start_ns"].min()) / 1e3
        assert t["kernel_time(us)"] == pytest.approx(span_us, abs=1e-3), variant
        assert t["idle_time(us)"] + t["compute_time(us)"] + t["non_compute_time(us)"] == pytest.approx(span_us)
        assert 0 < t["compute_time(us)"] and 0 <= t["non_compute_time(us)"] < t["compute_time(us)"]
        by_type, per_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
        assert per_kernel["sum (us)"].sum() == pytest.approx(ours["dur_ns"].sum() / 1e3, abs=1e-3), variant
        assert set(per_kernel["kernel_type"]) == {"COMPUTATION", "MEMORY"}
        # the per-type frame is the same busy time (the union of compute kernels) in whole µs per
        # interval (docs/formats.md): low for ~1 µs kernels
        typed = by_type.set_index("kernel_type")["sum"]["COMPUTATION"]
        union = t["compute_time(us)"]
        assert typed < union and (variant != "index_put" or typed < 0.85 * union)


def test_hta_iterations_keep_every_measured_steps_kernels(tmp_path, monkeypatch):
    """A GPU-shaped trace as capture writes it (kvprof.trace.synthetic: graph-replayed decode
    steps, eager prefill steps) with the ProfilerStep ranges that prof.step() after each step
    draws: HTA's iteration filter keeps the kernels of every measured step, the ones of graph
    replays (correlated with their cudaGraphLaunch) included, and drops only the tail range."""
    import gzip

    from kvprof.trace.synthetic import PhaseSpec, TraceSpec, build, dumps

    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    doc, expected = build(TraceSpec(phases=[PhaseSpec("decode", 8, 3, graph=True), PhaseSpec("prefill", 64, 2)]))
    events = doc["traceEvents"]
    steps = sorted((e for e in events if str(e.get("name", "")).startswith("kvprof.step[")), key=lambda e: e["ts"])
    trace_end = max(e["ts"] + e.get("dur", 0) for e in events if e.get("ph") == "X")
    start = min(e["ts"] for e in events if e.get("ph") == "X")
    for i, end in enumerate([*(s["ts"] + s["dur"] for s in steps), trace_end + 5.0]):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 450, "tid": 450,
                       "ts": start, "dur": round(end - start, 3), "args": {"External id": 90_000 + i}})
        start = end
    folder = tmp_path / "hta" / "two_stream"
    folder.mkdir(parents=True)
    (folder / "two_stream.pt.trace.json.gz").write_bytes(gzip.compress(dumps(doc)))
    with hta_warnings() as warned:
        analysis = hta.TraceAnalysis(trace_dir=str(folder))
    assert not [w for w in warned if w.startswith(UNWANTED)], warned
    assert [int(s) for s in analysis.get_profiler_steps()] == list(range(len(steps)))
    kernels = gpu_events(folder / "two_stream.pt.trace.json.gz")
    assert len(kernels) == 2 * len(expected["writes"])  # two copies per write, every step
    _, per_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
    assert per_kernel["sum (us)"].sum() == pytest.approx(kernels["dur_ns"].sum() / 1e3)
    t = analysis.get_temporal_breakdown(visualize=False).iloc[0]
    span_us = ((kernels["start_ns"] + kernels["dur_ns"]).max() - kernels["start_ns"].min()) / 1e3
    assert t["kernel_time(us)"] == pytest.approx(span_us)


def test_hta_rounding_turns_sub_microsecond_gpu_events_negative(h200_folders, monkeypatch):
    """Why the call sets HTA_DISABLE_NS_ROUNDING=1: HTA 0.5 rounds a ns-precision event's start
    up and its end down, so a 0.67 µs copy lasts -1 µs and its temporal breakdown fails its
    own check that the non-compute time is not negative."""
    monkeypatch.delenv("HTA_DISABLE_NS_ROUNDING", raising=False)
    analysis = hta.TraceAnalysis(trace_dir=str(h200_folders["index_put"]))
    assert (analysis.t.get_trace(0)["dur"] < 0).any()
    with pytest.raises(AssertionError):
        analysis.get_temporal_breakdown(visualize=False)


def test_hta_folders_are_made_again_whole_and_refuse_what_is_not_a_run(tmp_path, h200_folders):
    run = next(iter(h200_folders.values())).parent.parent
    (run / "hta" / "stale").mkdir()
    assert kv.hta_folders(run) == h200_folders
    assert sorted(p.name for p in (run / "hta").iterdir()) == sorted(h200_folders)
    with pytest.raises(Exception, match="manifest.json"):
        kv.hta_folders(tmp_path)


@pytest.mark.gpu
def test_hta_on_a_fresh_gpu_capture(tmp_path, monkeypatch):
    """On the H200: a capture with prof.step() after each measured step is HTA's iterations
    (no "ProfilerStep not found"), and the breakdowns agree with kvprof's reading."""
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    assert main(["capture", "--device", "cuda", *TINY, "--variants", "index_put,triton_fused", "--out",
                 str(tmp_path), "--run-id", "g"]) == 0
    for variant in ("index_put", "triton_fused"):
        folder = tmp_path / "g" / "hta" / variant
        with hta_warnings() as warned:
            analysis = hta.TraceAnalysis(trace_dir=str(folder))
        assert not [w for w in warned if w.startswith(UNWANTED)], warned
        assert [int(s) for s in analysis.get_profiler_steps()] == list(range(STEPS))
        t = analysis.get_temporal_breakdown(visualize=False).iloc[0]
        assert t["compute_time(us)"] > 0
        assert t["idle_time(us)"] + t["compute_time(us)"] + t["non_compute_time(us)"] == \
            pytest.approx(t["kernel_time(us)"])
        _, per_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
        assert per_kernel["sum (us)"].sum() > 0
