"""The committed H200 samples (traces/samples/): what they must show, and that both profilers agree.

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
from kvprof.trace.load import load_run

SAMPLES = Path(__file__).resolve().parent.parent / "traces" / "samples"
RUN = SAMPLES / "h200-llama70b-tp8"
VARIANTS = ("index_put", "two_stream", "triton_fused")
# planted in the environment of the capture by gpu/run_gpu_checks.sh
PLANTED = (b"kvprof-planted-9c41e7d2b85a", b"hf_kvprofPlantedTokenValue0123456789")


@cache
def analysis():
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
    total = sum(p.stat().st_size for p in SAMPLES.rglob("*") if p.is_file())
    assert total < 20 << 20


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


def test_fused_verdicts_agree():
    variants = analysis().summary["variants"]
    for v in ("triton_fused", "cuda_fused", "store_kv_fused", "sgl_kernel_cubin"):
        assert variants[v]["fused"] is True and variants[v]["agree"] is True, v
    for v in ("index_put", "two_stream"):
        assert variants[v]["fused"] is False and variants[v]["agree"] is True


def _per_group(source: str) -> pd.DataFrame:
    w = measured(source)
    return w.groupby(["variant", "phase", "size"]).agg(
        writes=("write_id", "size"), kernels=("kernels", "median"), streams=("streams", "median"),
        gpu_busy_ns=("gpu_busy_ns", "median"), gpu_new_ns=("gpu_new_ns", "median"), graph=("graph", "all"))


def test_torch_profiler_and_nsys_agree():
    """Same writes, kernels and streams per write; GPU time within 10 %: for replays the time
    each write adds to the timeline (a kernel launched with PDL starts during the previous
    write and waits, and how long it waits depends on the profiler: cuda_fused's kernel
    durations differ 2.8x between the two at decode bs=1), for eager writes their busy time."""
    k, n = _per_group("kineto"), _per_group("nsys")
    assert list(k.index) == list(n.index)
    pd.testing.assert_series_equal(k["writes"], n["writes"])
    pd.testing.assert_series_equal(k["kernels"], n["kernels"])
    pd.testing.assert_series_equal(k["streams"], n["streams"])
    time = k["graph"].map({True: "gpu_new_ns", False: "gpu_busy_ns"})
    ratio = pd.Series({i: n.loc[i, time[i]] / k.loc[i, time[i]] for i in k.index})
    assert ((ratio - 1).abs() <= 0.10).all(), ratio.to_dict()


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
