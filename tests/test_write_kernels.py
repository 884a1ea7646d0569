"""KV-write kernels by name in traces with no kvprof ranges, per rank, SGLang's folder layout.

Two fixtures, both SGLang-style folders (``<profile id>-TP-<rank>.trace.json.gz``, one per
rank, no ``distributedInfo``):
- real: kvprof's H200 traces (tests/fixtures/real) with every kvprof range and the capture
  metadata removed, so only PyTorch's own index_put kernels are left to find; the right
  count is what kvprof's own attribution found in the untouched trace;
- synthesized: Kineto JSON written here with SGLang's kernel name (``store_kvcache_kernel``,
  from kernels/jit/csrc/elementwise/kvcache.cuh) and ``ProfilerStep#N`` ranges, durations
  chosen so the per-step shares are known exactly.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from kvprof.analysis.write_kernels import (
    BUILTIN_PATTERNS,
    classify,
    patterns_with,
    write_kernel_summary,
)
from kvprof.cli import main
from kvprof.core.errors import UsageError
from kvprof.trace.load import load, load_dir, sglang_rank

REAL = Path(__file__).parent / "fixtures" / "real"
SGLANG_STORE = "void sglang::store_kvcache_kernel<256l, 256l, 32u, true, long>(sglang::StoreKVCacheParams)"
GEMM = "nvjet_tst_128x64_64x8_2x1_v_bz_TNT"
GATHER = ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<"
          "at::native::index_kernel_impl<at::native::OpaqueType<2> > > >(long)")


def _strip_kvprof(src: Path, dst: Path) -> None:
    """The real trace without kvprof's ranges and metadata: what a foreign profiler would record."""
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    doc.pop("kvprof", None)
    doc.pop("distributedInfo", None)
    keep = [e for e in doc["traceEvents"]
            if not re.match(r"^(set_kv_buffer\[|kvprof\.)", str(e.get("name", "")))]
    assert len(keep) < len(doc["traceEvents"])  # there were ranges to remove
    doc["traceEvents"] = keep
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)


def _kvprof_writes(path: Path) -> int:
    return load(path).traces[0].attribution["writes"]


def test_sglang_trace_names_give_the_rank():
    assert sglang_rank("1733412345.123-TP-3.trace.json.gz") == 3
    assert sglang_rank("pre-1733412345.1-TP-12-DP-1-EXTEND.trace.json.gz") == 12
    assert sglang_rank("cuda_graph_capture-DecodeRunner-TP-0.json.gz") == 0
    assert sglang_rank("index_put.pt.trace.json.gz") is None


def test_builtin_patterns_pick_the_write_kernels_only():
    import pandas as pd

    names = pd.Series([SGLANG_STORE, GEMM, GATHER,
                       ("void store_kv_cache_256x1<long>(unsigned long*, unsigned long*, long const*, unsigned long, "
                       "unsigned long const*, unsigned long, unsigned long, unsigned long, unsigned long)"),
                       "void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, 0>(...)",
                       "void sglang::set_mla_kv_buffer_kernel<576l, false>(sglang::SetMlaKVBufferParams)",
                       ("void sglang::fused_rope_store_kernel<true, 128l, true, __nv_bfloat16, __nv_bfloat16, long, "
                        "128u>(sglang::FusedRopeStoreParams)"),
                       ("void sglang::fused_rope_kernel<true, 128l, true, __nv_bfloat16, __nv_bfloat16, long, "
                        "128u>(sglang::FusedRopeParams)")])
    got = list(classify(names, list(BUILTIN_PATTERNS)))
    assert got == ["sglang_store_cache", None, None, "sgl_kernel_store_kv_cache", "vllm_reshape_and_cache",
                   "sglang_set_mla_kv_buffer", "sglang_fused_rope_store", None]  # rope alone writes nothing


def test_kvprof_own_write_kernels_are_found_by_the_names_its_traces_show():
    """triton_fused's Triton kernel (its function's name, as Kineto and nsys show it) and the
    CUDA writers' kernel are kvprof writes; the plugin's graph record names the Triton one, and
    that name is not a substring of the CUDA kernel's (a replay would take the wrong kernels)."""
    import pandas as pd

    from kvprof.kvcache.writers import create_writer, triton_kernel

    assert create_writer("triton_fused").kernel_name == triton_kernel.KERNEL_NAME == "_store_kv_kernel"
    if triton_kernel.triton is not None:
        assert triton_kernel.store_kv_kernel.__name__ == triton_kernel.KERNEL_NAME
    cuda = "void kvprof::store_kv_kernel<kvprof::CopyOp<uint4> >(kvprof::Params)"  # as in the H200 samples
    assert triton_kernel.KERNEL_NAME not in cuda
    got = list(classify(pd.Series([triton_kernel.KERNEL_NAME, cuda]), list(BUILTIN_PATTERNS)))
    assert got == ["kvprof_fused", "kvprof_fused"]


def test_bad_regex_is_a_usage_error():
    """Called from Python the error names the setting by its field (the command line: its flag,
    test_bad_write_kernels_regex_is_one_line)."""
    with pytest.raises(UsageError, match="^write_kernel_regex: not a regular expression"):
        patterns_with("store_(")
    assert patterns_with("store_")[0].source == "write_kernel_regex"


def test_real_traces_without_ranges_two_ranks(tmp_path: Path):
    """Real H200 traces, kvprof ranges removed: index_put kernels found per rank, 2 per write."""
    run = tmp_path / "sglang_profile"
    run.mkdir()
    expected = {}
    for rank, name in enumerate(("index_put", "two_stream")):
        src = REAL / f"{name}.pt.trace.json.gz"
        expected[rank] = _kvprof_writes(src)
        _strip_kvprof(src, run / f"1790857026.51-TP-{rank}.trace.json.gz")
    assert all(expected.values())
    loaded = load_dir(run)
    assert sorted(t.events.column("rank").to_pylist()[0] for t in loaded.traces) == [0, 1]
    assert all(t.attribution.get("writes", 0) == 0 for t in loaded.traces)  # no kvprof ranges left
    section = write_kernel_summary(loaded)
    by_rank = {t["rank"]: t for t in section["traces"]}
    for rank, writes in expected.items():
        fam = {f["family"]: f for f in by_rank[rank]["families"]}
        assert set(fam) == {"index_put"}
        assert fam["index_put"]["kernels"] == 2 * writes
        assert fam["index_put"]["writes"] == writes
        assert 0 < by_rank[rank]["share"] < 1
        assert by_rank[rank]["write_kernel_ns"] == fam["index_put"]["total_ns"] > 0
        assert 0 < by_rank[rank]["write_ns"] <= by_rank[rank]["write_kernel_ns"]  # two streams overlap


def _kineto(path: Path, steps: list[list[tuple[str, int]]], gap: int = 1000) -> None:
    """A Kineto trace: per step a ProfilerStep GPU range over back-to-back kernels (name, ns)."""
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    t = 1_000_000  # ns
    corr = 1
    for i, kernels in enumerate(steps):
        start = t
        for name, dur in kernels:
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": t / 1000,
                           "dur": dur / 1000, "args": {"device": 0, "stream": 7, "correlation": corr,
                                                        "grid": [1, 1, 1], "block": [128, 1, 1]}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 100, "tid": 100,
                           "ts": (t - 5000) / 1000, "dur": 3.0, "args": {"correlation": corr}})
            corr += 1
            t += dur
        events.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{i}", "pid": 0, "tid": 7,
                       "ts": start / 1000, "dur": (t - start) / 1000, "args": {}})
        t += gap
    doc = {"schemaVersion": 1, "traceEvents": events, "displayTimeUnit": "ms"}
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)


def test_synthesized_sglang_folder_per_rank_and_step(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch):
    """SGLang's kernel names, 2 ranks, merged file skipped, per-step shares known by construction."""
    run = tmp_path / "prof"
    run.mkdir()
    layers = 4
    # rank 0: step 0 = 4 writes of 1000 ns + 4 GEMMs of 4000 ns (share 0.2); step 1 the same with
    # 2000 ns writes (share 1/3). rank 1: 500 ns writes, 4500 ns GEMMs (share 0.1), 2 steps.
    r0 = [[(SGLANG_STORE, w), (GEMM, 4000)] * layers for w in (1000, 2000)]
    r1 = [[(SGLANG_STORE, 500), (GEMM, 4500), (GATHER, 0)] * layers for _ in range(2)]
    r1 = [[k for k in s if k[1]] for s in r1]
    _kineto(run / "1733412345.5-TP-0.trace.json.gz", r0)
    _kineto(run / "1733412345.5-TP-1.trace.json.gz", r1)
    _kineto(run / "merged-1733412345.5.trace.json.gz", r0 + r1)  # SGLang's merge: must not double count
    (run / "kvprof-sglang.TP-0.pid-11.json").write_text(json.dumps(
        {"schema": "kvprof.sglang_sidecar/1", "pid": 11, "rank": 0, "tp_rank": 0, "tp_size": 2,
         "pools": [], "writer": None,
         "paths": {"sglang:sglang_mha": 5, "sglang:fused_into_rope": 7},
         "write_paths": {"set_kv_buffer": 5, "fused into rope": 7}}))
    loaded = load_dir(run)
    assert len(loaded.traces) == 2 and len(loaded.sidecars) == 1
    assert any("merged-" in w for w in loaded.warnings)
    section = write_kernel_summary(loaded)
    by_rank = {t["rank"]: t for t in section["traces"]}
    assert set(by_rank) == {0, 1}
    f0 = by_rank[0]["families"][0]
    assert (f0["family"], f0["kernels"], f0["writes"], f0["total_ns"]) == ("sglang_store_cache", 8, 8, 12000)
    assert f0["per_write_ns"] == 1500
    assert by_rank[0]["step_source"] == "ProfilerStep" and by_rank[0]["steps_count"] == 2
    assert [round(s["share"], 6) for s in by_rank[0]["steps"]] == [0.2, round(1 / 3, 6)]
    assert by_rank[1]["families"][0]["kernels"] == 8
    assert [round(s["share"], 6) for s in by_rank[1]["steps"]] == [0.1, 0.1]

    # the command: the table per rank, summary.json with the section, a user pattern on top
    out = tmp_path / "out"
    monkeypatch.setenv("COLUMNS", "200")  # piped tables are 120 wide by default: this checks content, not width
    assert main(["analyze", str(run), "--out", str(out), "--write-kernels", r"^nvjet_"]) == 0
    printed = capsys.readouterr().out
    assert "KV-write kernels by name" in printed and "sglang_store_cache" in printed and "user" in printed
    # the sidecar's paths, by entry point: TP rank, pid, writer, set_kv_buffer, fused into rope, fallback
    (row,) = [line for line in printed.splitlines() if "SGLang's own" in line]
    assert [c.strip() for c in row.split("│")[1:7]] == ["0", "11", "SGLang's own", "5", "7", "0"]
    summary = json.loads((out / "summary.json").read_text())
    wk = summary["write_kernels"]
    fams = {(t["rank"], f["family"]): f["kernels"] for t in wk["traces"] for f in t["families"]}
    assert fams == {(0, "sglang_store_cache"): 8, (0, "user"): 8, (1, "sglang_store_cache"): 8, (1, "user"): 8}
    assert wk["sidecars"][0]["tp_size"] == 2
    # the user's pattern's source, as the command line records it: its flag
    assert wk["patterns"][0] == {"family": "user", "regex": "^nvjet_", "kernels_per_write": 1,
                                 "source": "--write-kernels"}


def test_bad_write_kernels_regex_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    run = tmp_path / "p"
    run.mkdir()
    _kineto(run / "1-TP-0.trace.json.gz", [[(SGLANG_STORE, 100)]])
    code = main(["analyze", str(run), "--no-files", "--write-kernels", "store_("])
    err = capsys.readouterr().err
    assert code == 2 and "--write-kernels" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def _names_trace(tmp_path: Path, name: str) -> Path:
    from kvprof.trace.synthetic import KernelSpec, TraceSpec, WriteSpec, build, dumps

    doc, _ = build(TraceSpec(write=WriteSpec([KernelSpec(7, 0, 2500, name=name)])))
    p = tmp_path / "t.json"
    p.write_bytes(dumps(doc))
    return p


@pytest.mark.parametrize(("pattern", "budget", "rc"), [("^(a+)+$", "5", 0), ("(a|aa)+$", "0.5", 2)])
def test_catastrophic_backtracking_ends_within_the_budget(tmp_path, pattern, budget, rc):
    """``--write-kernels '^(a+)+$'`` on 41-character names ran past 60 s; it now finishes (the
    regex package does not backtrack on it) or stops at the budget with one line."""
    import os
    import subprocess
    import sys

    p = _names_trace(tmp_path, "a" * 40 + "!")
    env = {**os.environ, "KVPROF_REGEX_TIMEOUT_S": budget}
    proc = subprocess.Popen([sys.executable, "-m", "kvprof", "analyze", str(p), "--no-files",
                             "--write-kernels", pattern], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        _, err = proc.communicate(timeout=40)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == rc, err
    if rc:
        assert err.count("\n") == 1 and "took more than 0.5 s" in err and "KVPROF_REGEX_TIMEOUT_S" in err, err


@pytest.mark.parametrize("value", ["0", "-1", "nan", "x"])
def test_a_bad_match_budget_is_a_usage_error(monkeypatch, value):
    import pandas as pd

    monkeypatch.setenv("KVPROF_REGEX_TIMEOUT_S", value)
    with pytest.raises(UsageError, match="KVPROF_REGEX_TIMEOUT_S"):
        classify(pd.Series(["k"]), list(BUILTIN_PATTERNS))
