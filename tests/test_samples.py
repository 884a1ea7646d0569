"""The committed H200 samples (traces/samples/): what they must show, and each profiler against the reference.

Made by gpu/run_gpu_checks.sh (capture step) on an H200; the command is in
traces/samples/README.md. These tests read only the committed files: they run on CPU.
"""

from __future__ import annotations

import gzip
from functools import cache
from pathlib import Path

import orjson
import pandas as pd
import pytest

from kvprof.analysis.summary import analyze
from kvprof.core.timings import StepTimings
from kvprof.trace.load import load_run

SAMPLES = Path(__file__).resolve().parent.parent / "traces" / "samples"
RUN = SAMPLES / "h200-llama70b-tp8"
VARIANTS = ("index_put", "two_stream", "triton_fused")
# planted in the environment of the capture by gpu/run_gpu_checks.sh
PLANTED = (b"kvprof-planted-9c41e7d2b85a", b"hf_kvprofPlantedTokenValue0123456789")


@cache
def analysis():
    """The whole capture analysed once (about 15 s on a loaded 2-core machine): every test that
    reads it is marked slow, since the first of them to run pays for it."""
    return analyze(load_run(RUN))


def measured(source: str) -> pd.DataFrame:
    w = analysis().writes
    return w[(w["source"] == source) & ~w["during_capture"].astype(bool)]


def test_samples_are_complete():
    manifest = orjson.loads((RUN / "manifest.json").read_bytes())
    assert manifest["device"]["name"] == "NVIDIA H200"
    assert manifest["config"]["resolved"]["shape"]["head_num"] == 1  # Llama-3.1-70B at TP 8
    for v in VARIANTS:
        files = manifest["variants"][v]["files"]
        for key in ("torch_trace", "nsys_rep", "nsys_sqlite"):
            assert (RUN / files[key]).is_file(), (v, key)
    assert (RUN / "step_timings.json").is_file()
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total < 20 << 20


@pytest.mark.slow
@pytest.mark.parametrize("source", ["kineto", "nsys"])
def test_kernels_per_write(source):
    w = measured(source)
    decode = w[w["phase"] == "decode"]
    assert set(decode["graph"]) == {True}  # decode steps were CUDA-graph replays
    for variant, kernels in (("triton_fused", 1), ("index_put", 2), ("two_stream", 2)):
        vw = w[w["variant"] == variant]
        assert len(vw) > 0
        assert set(vw["kernels"]) == {kernels}, (variant, vw["kernels"].value_counts().to_dict())
    two = decode[decode["variant"] == "two_stream"]
    assert set(two["streams"]) == {2}  # K and V on two streams in the graph
    assert set(decode[decode["variant"] == "index_put"]["streams"]) == {1}


@pytest.mark.slow
def test_fused_verdicts_agree():
    variants = analysis().summary.to_json()["variants"]
    for v in ("triton_fused", "cuda_fused", "store_kv_fused", "sgl_kernel_cubin"):
        assert variants[v]["fused"] is True and variants[v]["agree"] is True, v
    for v in ("index_put", "two_stream"):
        assert variants[v]["fused"] is False and variants[v]["agree"] is True


def _per_group(source: str) -> pd.DataFrame:
    w = measured(source)
    return w.groupby(["variant", "phase", "size"]).agg(
        writes=("write_id", "size"), kernels=("kernels", "median"), streams=("streams", "median"),
        gpu_busy_ns=("gpu_busy_ns", "median"), gpu_new_ns=("gpu_new_ns", "median"), graph=("graph", "all"))


@pytest.mark.slow
def test_torch_profiler_and_nsys_see_the_same_writes():
    """Same writes, kernels and streams per write. Their times are not compared with each
    other: each is compared with the reference below."""
    k, n = _per_group("kineto"), _per_group("nsys")
    assert list(k.index) == list(n.index)
    pd.testing.assert_series_equal(k["writes"], n["writes"])
    pd.testing.assert_series_equal(k["kernels"], n["kernels"])
    pd.testing.assert_series_equal(k["streams"], n["streams"])


def _groups() -> pd.DataFrame:
    g = pd.DataFrame(analysis().summary.to_json()["groups"])
    return g[g["layer"].astype(str) == "all"]


@pytest.mark.slow
def test_every_point_has_reference_figures():
    timings = StepTimings.from_json((RUN / "step_timings.json").read_bytes())
    manifest = orjson.loads((RUN / "manifest.json").read_bytes())
    ran = [v for v, e in manifest["variants"].items() if e["available"]]
    points = {(p["phase"], p["size"]) for p in manifest["phases"]}
    ref = timings.select(pass_="reference")
    assert {(r.variant, r.phase, r.size) for r in ref} == {(v, p, s) for v in ran for p, s in points}
    assert all(r.clock == "cuda_events" and len(r.samples_ns) == 200 for r in ref)
    g = _groups()
    assert len(g[g["source"] == "reference"]) == len(ran) * len(points)


@pytest.mark.slow
def test_observer_rows_are_each_reading_over_the_reference():
    summary = analysis().summary.to_json()
    g = _groups().set_index(["variant", "source", "phase", "size"])
    rows = summary["observer"]["rows"]
    assert len(rows) == 2 * len(g.xs("reference", level="source"))  # both profilers at every point
    for r in rows:
        reading = g.loc[(r["variant"], r["source"], r["phase"], r["size"]), "cost_per_write_ns"]
        reference = g.loc[(r["variant"], "reference", r["phase"], r["size"]), "cost_per_write_ns"]
        assert r["ratio_per_write"] == pytest.approx(reading / reference)
        assert r["flagged"] == (abs(r["ratio_per_write"] - 1) > 0.1 or abs(r["ratio_per_step"] - 1) > 0.1)


@pytest.mark.slow
def test_headlines_come_from_the_reference():
    summary = analysis().summary.to_json()
    assert summary["trusted_sources"][0] == "reference"
    head = summary["comparison"]["headline"]
    assert head["source"] == "reference" and head["size"] == 10


@pytest.mark.slow
def test_both_profilers_slow_the_decode_graphs_they_watch():
    """docs/observer-effect.md: per-node tracing of a replayed graph slows it (each profiled
    pass timed its own steps with the reference's CUDA events)."""
    rows = [r for r in analysis().summary.to_json()["observer"]["rows"] if r["phase"] == "decode"]
    for source in ("kineto", "nsys"):
        slow = [r["pass_slowdown"] for r in rows if r["source"] == source]
        assert len(slow) == 18 and min(slow) > 1.0 and sorted(slow)[len(slow) // 2] > 1.5, (source, slow)


def _bytes_of(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def test_no_planted_secret_in_any_sample_file():
    files = [p for p in SAMPLES.rglob("*") if p.is_file()]
    assert files
    for path in files:
        data = _bytes_of(path)
        for secret in PLANTED:
            assert secret not in data, path


def test_nsys_reports_checked_on_the_h200():
    """A .nsys-rep cannot be scrubbed; the GPU script exported each one unscrubbed and counted."""
    log = (SAMPLES / "secret-check.txt").read_text()
    lines = [line for line in log.splitlines() if line.startswith("planted secret in")]
    assert len(lines) >= 2 * len(VARIANTS)
    assert all(line.endswith(": 0 matching lines") for line in lines), log
