"""Run folders for the dashboard tests, built once per session from real and synthetic traces.

Why these: the real H200 fixture (tests/fixtures/real) for every page with real numbers; a
copy of it without analyze outputs (the dashboard must run kvprof's pipeline, into its
cache, not the root); a CPU-only trace (no GPU events); a corrupt run; two synthetic
two-stream runs whose K/V kernels differ in length (before/after with a known ratio);
a bench.json from kvprof bench on the CPU; a real CPU capture of the decoder-layer context
with the rotary variants (tests/fixtures/layer-rope-cpu). Not a folder: a GPU layer run's
summary built from typed step timings and write boundaries (no GPU here).
"""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pytest

from kvprof.analysis.layer_step import WriteBoundary, layer_steps
from kvprof.analysis.reference import reference_groups
from kvprof.core.timings import StepSamples, StepTimings
from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build, dumps

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `dashboards` is a folder of the checkout, not an installed package
    sys.path.insert(0, str(REPO))
FIXTURE = REPO / "tests" / "fixtures" / "real"
LAYER_ROPE = REPO / "tests" / "fixtures" / "layer-rope-cpu"  # a real CPU capture: --context layer, rotary variants
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "ac2g"}


def synth_spec(k_ns: int, v_ns: int) -> TraceSpec:
    """A two-stream write (K on stream 7, V on 21, overlapping) in decode bs=8 and 64, eager and graph."""
    return TraceSpec(
        variant="two_stream", layers=[0, 1, 2, 3],
        phases=[PhaseSpec("decode", 8, 3, graph=True), PhaseSpec("decode", 64, 3), PhaseSpec("prefill", 512, 2)],
        write=WriteSpec([KernelSpec(7, 0, k_ns), KernelSpec(21, 300, v_ns)]))


def write_trace(path: Path, doc: dict) -> Path:
    path.write_bytes(gzip.compress(dumps(doc), compresslevel=1))
    return path


def cpu_only(doc: dict) -> dict:
    """The same capture as if no GPU had been there: no kernels, flows, GPU annotations or syncs."""
    events = [e for e in doc["traceEvents"] if e.get("cat") not in GPU_CATS and e.get("ph") not in ("s", "f")]
    return {**doc, "traceEvents": events, "deviceProperties": []}


def analyse_in_place(d: Path) -> None:
    from kvprof.dashboard.data import analyse_to

    analyse_to(d, d)


def layer_rope_run(dest: Path) -> Path:
    """The CPU layer capture with the rotary variants, analysed in ``dest`` (a new folder)."""
    shutil.copytree(LAYER_ROPE, dest, ignore=shutil.ignore_patterns("README.md"))
    analyse_in_place(dest)
    return dest


def build_root(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Path] = {}
    h200 = root / "h200"
    shutil.copytree(FIXTURE, h200)
    analyse_in_place(h200)
    runs["h200"] = h200
    raw = root / "h200-raw"
    shutil.copytree(FIXTURE, raw)
    runs["h200-raw"] = raw
    runs["layer-rope"] = layer_rope_run(root / "layer-rope")
    cpu = root / "cpu-only"
    cpu.mkdir()
    doc, _ = build(replace(synth_spec(2500, 2500), phases=[PhaseSpec("decode", 8, 2), PhaseSpec("prefill", 256, 2)]))
    write_trace(cpu / "two_stream.pt.trace.json.gz", cpu_only(doc))
    analyse_in_place(cpu)
    runs["cpu-only"] = cpu
    bad = root / "corrupt"
    bad.mkdir()
    good = (FIXTURE / "index_put.pt.trace.json.gz").read_bytes()
    (bad / "index_put.pt.trace.json.gz").write_bytes(good[: len(good) // 3])  # truncated gzip
    (bad / "manifest.json").write_text(json.dumps({"variants": {"index_put": {
        "available": True, "files": {"torch_trace": "index_put.pt.trace.json.gz"}}}}))
    runs["corrupt"] = bad
    for name, (k, v) in {"synth-before": (2600, 2600), "synth-after": (1300, 1300)}.items():
        d = root / name
        d.mkdir()
        doc, _ = build(synth_spec(k, v))
        write_trace(d / "two_stream.pt.trace.json.gz", doc)
        analyse_in_place(d)
        runs[name] = d
    part = root / "partial"  # analyze's summary and writes, no events table and no traces to redo it
    part.mkdir()
    for n in ("summary.json", "writes.parquet"):
        shutil.copy2(runs["synth-after"] / n, part / n)
    runs["partial"] = part
    bench = root / "bench-cpu"
    bench.mkdir()
    (bench / "bench.json").write_bytes(orjson.dumps(cpu_bench(), option=orjson.OPT_SERIALIZE_NUMPY))
    runs["bench"] = bench / "bench.json"
    samples = root / "h200-llama70b-tp8"  # the committed H200 samples' analysed outputs (files, not links)
    samples.mkdir()
    for f in (REPO / "kvprof" / "samples" / "h200-llama70b-tp8").iterdir():
        shutil.copy(f, samples / f.name)
    runs["samples"] = samples
    return runs


def cpu_bench() -> dict:
    """kvprof bench on the CPU, smallest useful grid: real records, eager mode only."""
    import torch

    from kvprof.bench.run import grid, run_bench

    return run_bench(grid([(1, 128)], [("bf16", "bf16")], [1, 16, 128]), ["index_put", "two_stream"],
                     torch.device("cpu"), eager_repeats=2).to_json()


# ---------------------------------------------------------------------------- a GPU layer run, typed

LAYERS = 80
# µs one layer's write adds to the step, per variant: figures chosen for these tests, in the order of
# the H200 layer run (lab/results/h200-2026-12-04/layer-rope.txt); the step samples scatter at random
ADDS_US = {"two_stream": 3.8, "rope_then_two_stream": 4.6, "rope_then_triton_fused": 2.2, "rope_triton_fused": 1.6,
           "sglang_rope_store": 1.8}
POINTS = (("decode", 1), ("decode", 10), ("prefill", 512))


def gpu_layer_timings(variants: tuple[str, ...], seed: int = 0) -> StepTimings:
    """A reference pass of a --context layer run on a GPU: CUDA-event steps with and without the
    write and of the writes alone, 20 per series."""
    rng = np.random.default_rng(seed)
    t = StepTimings(context="layer", context_len=4096)
    for v in variants:
        for phase, size in POINTS:
            bare = 900_000.0 + 2_000.0 * size
            added = LAYERS * ADDS_US[v] * 1e3
            for mode, med, n in (("layer", bare + added, LAYERS), ("layer_no_write", bare, 0),
                                 ("writes", 0.9 * added, LAYERS)):
                samples = med + rng.normal(0.0, 4_000.0, 20)
                t.add(StepSamples(v, "reference", phase, size, mode, graph=phase == "decode", writes_per_step=n,
                                  clock="cuda_events", samples_ns=tuple(float(x) for x in samples)))
    return t


def write_boundary(variant: str, early: int, overlap_ns: float | None, second: int = 0,
                   wait_ns: float | None = None, size: int = 10, source: str = "kineto") -> WriteBoundary:
    """One variant's writes on a traced layer's GPU timeline, 240 of them: ``early`` began before
    their predecessor ended (on its stream), by ``overlap_ns``."""
    return WriteBoundary(variant=variant, source=source, phase="decode", size=size, writes=240, critical_ns=2_000.0,
                         start_after_ns=-overlap_ns if early == 240 and overlap_ns else 500.0, early_starts=early,
                         early_overlap_ns=overlap_ns, same_stream_early=early, next_after_ns=300.0, early_next=0,
                         second_stream=second, stream_wait_ns=wait_ns)


GPU_BOUNDARIES = [write_boundary("two_stream", 0, None, second=240, wait_ns=540.0),
                  write_boundary("rope_then_triton_fused", 240, 770.0),
                  write_boundary("rope_triton_fused", 171, 130.0),
                  write_boundary("rope_triton_fused", 120, 150.0, size=1)]


def gpu_layer_summary(variants: tuple[str, ...] = ("two_stream", "rope_then_triton_fused", "rope_triton_fused",
                                                   "sglang_rope_store"),
                      boundaries: list[WriteBoundary] | None = None) -> tuple[dict, StepTimings]:
    """summary.json of a --context layer run on a GPU as analyze lays it out, from typed inputs: the
    reference groups and layer_steps by kvprof.analysis (reference_groups, layer_steps) from
    ``gpu_layer_timings``, and ``boundaries`` as a kineto trace with GPU events would give them."""
    timings = gpu_layer_timings(variants)
    groups = reference_groups(timings, "mha")
    steps = layer_steps(timings, GPU_BOUNDARIES if boundaries is None else boundaries, ["reference", "kineto"])
    assert steps is not None
    return {"groups": groups.to_dict("records"), "reference": {"clock": ["cuda_events"], "context": "layer"},
            "traces": [{"source": "kineto", "path": f"{v}.pt.trace.json.gz", "gpu_events": 5000} for v in variants],
            "variants": {v: {"available": True, "fused": v != "two_stream"} for v in variants},
            "trusted_sources": ["reference", "kineto"], "comparison": {"baseline": "two_stream", "layers": LAYERS},
            "device": {"name": "a GPU"}, "layer_steps": steps.to_json()}, timings


_BUILT: dict[Path, dict[str, Path]] = {}


@pytest.fixture(scope="session")
def dash_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Built once per session even though each test module imports the fixture (one definition each)."""
    base = tmp_path_factory.getbasetemp()
    if base not in _BUILT:
        _BUILT[base] = build_root(tmp_path_factory.mktemp("dash") / "root")
    return _BUILT[base]


@pytest.fixture()
def dash_env(dash_runs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """The dashboard pointed at the test root, with its own cache folder, opening the H200 run."""
    root = dash_runs["h200"].parent
    monkeypatch.setenv("KVPROF_DASHBOARD_ROOTS", str(root))
    monkeypatch.setenv("KVPROF_DASHBOARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(dash_runs["h200"]))
    monkeypatch.delenv("KVPROF_DASHBOARD_MAX_UPLOAD_MB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # no kvprof bench results of this machine's user
    return {**dash_runs, "root": root, "cache": tmp_path / "cache"}


def empty_root_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The dashboard pointed at an empty traces root (returned), with its own cache, opening no run."""
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("KVPROF_DASHBOARD_ROOTS", str(empty))
    monkeypatch.setenv("KVPROF_DASHBOARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("KVPROF_DASHBOARD_RUN", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # no kvprof bench results of this machine's user
    return empty
