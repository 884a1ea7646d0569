"""Programmatic dependent launch (PDL): what the writers say, what the manifest records, and how
the analysis reports a write that began before the work before it on its stream ended --
as PDL overlap where the writer launches with PDL, as a trace anomaly where it does not,
never as a negative gap or as two streams at once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from kvprof.analysis.early_start import predecessors
from kvprof.analysis.metrics import group_metrics, measured
from kvprof.analysis.summary import analyze
from kvprof.analysis.writes import gpu_work_rows, per_write_table
from kvprof.capture.config import CaptureConfig
from kvprof.capture.plan import plan_variants, resolve, trace_extra, variant_entry
from kvprof.core.run import Manifest, VariantEntry
from kvprof.kvcache.contracts import LAYOUTS, LayoutWriter
from kvprof.kvcache.layouts.registry import create_writer, writer_names
from kvprof.kvcache.writers import KVWriter, fp8_jit
from kvprof.kvcache.writers.cuda_fused import CudaFusedWriter
from kvprof.kvcache.writers.mla_sglang import SglangMLAWriter
from kvprof.kvcache.writers.rope_cuda import RopeCudaWriter
from kvprof.kvcache.writers.store_kv_fused import StoreKVFusedWriter
from kvprof.kvcache.writers.torch_compile import TorchCompileWriter
from kvprof.kvcache.writers.triton_fused import TritonFusedWriter
from kvprof.report.console import groups_table
from kvprof.trace.load import load
from kvprof.trace.synthetic import FUSED_KERNEL, KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build
from kvprof.trace.table import to_frame

SAMPLE = Path(__file__).resolve().parent.parent / "traces" / "samples" / "h200-llama70b-tp8"
LAYERS = [0, 1, 2, 3, 4]
# a library's kernel decides for itself whether it launches with PDL: those writers do not say
LIBRARY_KERNELS = {"sgl_kernel", "torch_compile", "sglang_store_cache", "sglang_rope_store",
                   "sglang_triton_rope_cache", "sglang_mla"}
SLOW_TO_BUILD = {"torch_compile": (TorchCompileWriter, KVWriter), "sglang_mla": (SglangMLAWriter, LayoutWriter)}


# -- what the writers say -------------------------------------------------------------------

def test_every_writer_says_whether_it_launches_with_pdl():
    """On a CPU nothing launches with PDL; only a library's kernel leaves it unsaid. (Building
    torch_compile and sglang_mla imports their libraries, seconds: their classes are asked.)"""
    said = {}
    for layout in LAYOUTS:
        for name in writer_names(layout):
            if name not in SLOW_TO_BUILD:
                said[name] = create_writer(layout, name).launches_pdl(torch.device("cpu"))
    assert {n for n, v in said.items() if v is None} == LIBRARY_KERNELS - set(SLOW_TO_BUILD)
    assert all(v is False for n, v in said.items() if n not in LIBRARY_KERNELS)
    for cls, base in SLOW_TO_BUILD.values():
        assert cls.launches_pdl is base.launches_pdl  # the base's None: not said


@pytest.fixture
def sm(monkeypatch):
    """Pretend CUDA device 0 has compute capability major ``sm`` (pdl_capable's cache)."""
    def set_major(major: int) -> torch.device:
        monkeypatch.setitem(fp8_jit._PDL_BY_DEVICE, 0, major >= 9)
        return torch.device("cuda", 0)
    return set_major


def test_kvprofs_cuda_kernels_launch_with_pdl_on_sm90_unless_told_not_to(sm):
    hopper = sm(9)
    assert CudaFusedWriter().launches_pdl(hopper) and RopeCudaWriter().launches_pdl(hopper)
    assert StoreKVFusedWriter().launches_pdl(hopper)
    assert CudaFusedWriter(pdl=False).launches_pdl(hopper) is False
    # Triton's interpreter (these tests) runs on the host: no PDL even on a Hopper device
    assert TritonFusedWriter().launches_pdl(hopper) is False
    ampere = sm(8)
    assert CudaFusedWriter().launches_pdl(ampere) is False and RopeCudaWriter().launches_pdl(ampere) is False


def test_the_manifest_and_the_trace_record_the_writers_word():
    config = CaptureConfig(variants=["index_put", "triton_fused", "sglang_store_cache"], phases=["decode"],
                           decode_sizes=[1], device="cpu")
    planned = {p.name: p for p in plan_variants(resolve(config, torch.device("cpu")))}
    entries = {n: variant_entry(p) for n, p in planned.items()}
    assert entries["index_put"].pdl_launch is False and entries["triton_fused"].pdl_launch is False
    assert entries["sglang_store_cache"].pdl_launch is None  # not run here (no CUDA), nothing said
    assert trace_extra(entries["index_put"]) == {"pdl_launch": False}
    assert "pdl_launch" not in trace_extra(entries["sglang_store_cache"])
    manifest = Manifest(variants={"a": VariantEntry(pdl_launch=True), "b": VariantEntry()})
    back = Manifest.from_json(json.loads(json.dumps(manifest.to_json())))
    assert back.variants["a"].pdl_launch is True and back.variants["b"].pdl_launch is None
    warnings: list[str] = []
    bad = VariantEntry.from_json("c", {"available": True, "pdl_launch": "yes"}, warnings)
    assert bad.pdl_launch is None and warnings  # not a bool: dropped, and said


# -- the analysis on synthetic traces (read and attributed as a capture's are) --------------

def _trace(tmp: Path, variant: str, write: list[KernelSpec], gap_ns: int, pdl: bool | None) -> Path:
    """Graph replays of ``len(LAYERS)`` writes, ``gap_ns`` apart (negative: each write begins
    that long before the one before it ends), with the capture's ``pdl_launch`` record."""
    spec = TraceSpec(variant=variant, layers=LAYERS, phases=[PhaseSpec("decode", 8, 3, graph=True)],
                     write=WriteSpec(write), write_gap_ns=gap_ns, fused=len(write) == 1, with_sync=False)
    doc, _ = build(spec)
    if pdl is not None:
        doc["kvprof"]["pdl_launch"] = pdl
    path = tmp / f"{variant}-{pdl}.pt.trace.json"
    path.write_text(json.dumps(doc))
    return path


FUSED = [KernelSpec(7, 0, 2000, FUSED_KERNEL)]


def test_a_write_begun_before_its_predecessor_ended_is_pdl_overlap_not_a_negative_gap(tmp_path):
    loaded = load(_trace(tmp_path, "triton_fused", FUSED, -300, True))
    assert not [w for w in loaded.warnings + loaded.traces[0].warnings if "overlap" in w]
    result = analyze(loaded)
    w = measured(result.writes).sort_values("gpu_start_ns")
    first_of_replay = w["layer"].to_numpy() == LAYERS[0]
    # every write after the first of its replay began 300 ns before the one before it ended
    assert (w["same_stream_early_ns"].to_numpy()[~first_of_replay] == 300).all()
    assert (w["gap_before_ns"].to_numpy()[~first_of_replay] == 0).all()  # clipped at 0, never -300
    launch = w["gap_before_ns"].to_numpy()[first_of_replay]  # the replay's launch before it; none before the first
    assert np.isnan(launch[0]) and (launch[1:] > 0).all()
    (g,) = result.summary.groups
    assert g["writes"] == 15 and g["same_stream_early"] == 12
    assert g["same_stream_early_ns"] == g["same_stream_early_max_ns"] == 300 and g["gap_before_ns"] == 0
    assert g["pdl_launch"] is True and result.summary.variants["triton_fused"].pdl_launch is True
    assert g["overlap_frac"] == 0  # one stream: not concurrency between streams
    assert not [m for m in result.summary.warnings if "anomaly" in m]
    steps_table, _ = groups_table(result.summary.groups, "kineto", result.summary)[1]
    cells = {c.header: [str(x) for x in c._cells] for c in steps_table.columns}
    assert cells["PDL"] == ["yes"] and cells["PDL overlap"] == ["12/15, 0.30, max 0.30"] and cells["gap µs"] == ["0.00"]


def test_an_early_start_without_pdl_is_a_trace_anomaly(tmp_path):
    result = analyze(load(_trace(tmp_path, "index_put", FUSED, -300, False)))
    (note,) = [m for m in result.summary.warnings if "anomaly" in m]
    assert note.startswith("index_put (kineto): 12 of 15 writes began before the work before them")
    assert "0.30 µs" in note and "does not launch with programmatic dependent launch" in note
    table, _ = groups_table(result.summary.groups, "kineto", result.summary)[1]
    cells = {c.header: [str(x) for x in c._cells] for c in table.columns}
    assert cells["PDL"] == ["no"] and cells["PDL overlap"] == ["12/15, 0.30, max 0.30, anomaly"]
    # where the run does not say, the early start is reported but not judged
    quiet = analyze(load(_trace(tmp_path, "index_put", FUSED, -300, None)))
    assert quiet.summary.groups[0]["same_stream_early"] == 12 and quiet.summary.groups[0]["pdl_launch"] is None
    assert not [m for m in quiet.summary.warnings if "anomaly" in m]


def test_overlap_with_another_stream_is_not_pdl(tmp_path):
    """K on stream 7, V on stream 9 running past the next write's K: streams at once, as before."""
    two = [KernelSpec(7, 0, 1000, "k"), KernelSpec(9, 200, 2000, "v")]
    loaded = load(_trace(tmp_path, "two_stream", two, -500, False))
    assert [w for w in loaded.traces[0].warnings if "on different streams" in w]  # the cut may mix layers
    result = analyze(loaded)
    w = measured(result.writes)
    assert (w["same_stream_early_ns"].fillna(0) == 0).all()  # K began after the K before it ended
    assert result.summary.groups[0]["same_stream_early"] == 0
    assert not [m for m in result.summary.warnings if "anomaly" in m]
    assert (w["gap_before_ns"].dropna() >= 0).all()


def test_predecessors_on_a_hand_made_event_table():
    """Two streams; the write's own stream decides PDL overlap, any stream the start after."""
    work = pd.DataFrame({
        "start_ns": [0, 100, 900, 1000, 1400], "dur_ns": [1000, 1500, 300, 200, 100],
        "stream": [7, 9, 7, 7, 9], "device": [0, 0, 0, 0, 0], "write_id": [-1, -1, 0, 1, 2]})
    p = predecessors(work, np.array([0, 1, 2, 3]), np.array([900.0, 1000.0, 1400.0, np.nan]))
    # write 0 began 100 ns before the kernel on its stream ended (PDL), 700 ns before stream 9's
    assert p.same_stream_early_ns[0] == 100 and p.start_after_ns[0] == -700
    # write 1: its stream's work before it (write 0) ended at 1200: 200 ns early
    assert p.same_stream_early_ns[1] == 200
    # write 2 on stream 9: stream 9's kernel ended at 1600 -> 200 ns early; stream 7's end does not count
    assert p.same_stream_early_ns[2] == 200 and p.first_lane[2] != p.first_lane[0]
    assert np.isnan(p.same_stream_early_ns[3]) and np.isnan(p.gap_before_ns[3])  # no GPU work
    assert (p.gap_before_ns[:3] == 0).all()


# -- the committed H200 trace (Llama-3.1-70B TP8, CUDA graphs, PDL on sm_90) ----------------

def _sample_groups(name: str) -> tuple[pd.DataFrame, list[str]]:
    loaded = load(SAMPLE / name)
    t = loaded.traces[0]
    ev = to_frame(t.events)
    writes = per_write_table(t, ev)
    assert len(gpu_work_rows(ev))
    return group_metrics(writes, pd.DataFrame()).set_index(["phase", "size"]), t.warnings


@pytest.mark.parametrize("name, medians, maxima", [
    ("triton_fused.pt.trace.json.gz", (224, 224, 224), (417, 384, 417)),
    ("triton_fused.sqlite", (320, 224, 224), (448, 352, 288)),
    ("cuda_fused.pt.trace.json.gz", (1152, 3072, 7488), (3680, 3745, 9760)),
])
def test_the_h200_sample_shows_pdl_overlap_in_fused_replays(name, medians, maxima):
    groups, warnings = _sample_groups(name)
    for size, median, most in zip((1, 10, 64), medians, maxima):
        g = groups.loc[("decode", size)]
        # 80 writes a replay, 3 replays: each but a replay's first began before the write before it ended
        assert (g["writes"], g["same_stream_early"]) == (240, 234)
        assert (g["same_stream_early_ns"], g["same_stream_early_max_ns"]) == (median, most)
        assert g["gap_before_ns"] == 0
    assert groups.loc[("prefill", 4096), "same_stream_early"] == 0  # eager: each launch waits for the host
    assert not [w for w in warnings if "overlap" in w]


def test_the_h200_samples_plain_copies_never_begin_early():
    groups, _ = _sample_groups("index_put.pt.trace.json.gz")
    assert (groups["same_stream_early"] == 0).all() and len(groups) == 4
