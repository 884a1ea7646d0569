"""sgl_kernel_cubin: sgl-kernel's own store kernels, loaded from its wheel's cubin.

On CPU: the cubin reader, the host decisions copied from sgl-kernel's op (kernel choice,
grid, arguments in 8-byte words, the op's refusals), the writer's reasons, and the
extraction script's one-line errors. On a GPU (``-m gpu``, needs ``KVPROF_SGL_CUBIN``, set
by gpu/run_gpu_checks.sh): bitwise equal to index_put eagerly and inside a CUDA graph,
with both kernels and both slot dtypes, and the op's fallback where rows are too short.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from kvprof.kvcache.writers import FUSED, create_writer
from kvprof.kvcache.writers.sgl_cubin import THREADS, plan_launch, read_cubin

ROOT = Path(__file__).resolve().parents[1]
SIG = b"EEvPmS1_PKT_mPKmS6_mmm"


def _fake_cubin(path: Path, kinds=("256x1", "128x2"), slots=("i", "l")) -> Path:
    names = [b"_ZN40_GLOBAL__N__x_8_store_cu_y20store_kv_cache_" + k.encode() + b"I" + s.encode() + SIG
             for k in kinds for s in slots]
    # an ELF's string table: NUL-separated, with section names that embed the same symbols
    strtab = b"\x00".join([b"", b".text." + names[0], *names, b""])
    path.write_bytes(b"\x7fELF" + b"\x00" * 60 + strtab)
    return path


def test_reads_the_four_kernels_from_a_cubin(tmp_path):
    cub = read_cubin(_fake_cubin(tmp_path / "s.cubin"))
    assert sorted(cub.kernels) == [("128x2", "i32"), ("128x2", "i64"), ("256x1", "i32"), ("256x1", "i64")]
    assert cub.kernels[("256x1", "i64")].endswith("store_kv_cache_256x1Il" + SIG.decode())
    assert not cub.kernels[("256x1", "i32")].startswith(".text.") and len(cub.sha256) == 64


@pytest.mark.parametrize("make, match", [
    (lambda p: p.write_bytes(b"not an elf"), "not a cubin"),
    (lambda p: _fake_cubin(p, kinds=("256x1",)), "lacks sgl-kernel's store_kv_cache kernels"),
    (lambda p: None, "cannot read sgl-kernel cubin"),
])
def test_a_bad_cubin_is_one_line(tmp_path, make, match):
    path = tmp_path / "bad.cubin"
    make(path)
    with pytest.raises(ValueError, match=match) as info:
        read_cubin(path)
    assert "\n" not in str(info.value)


def _args(heads, dim, tokens, dtype=torch.bfloat16, loc_dtype=torch.int64, rows=64):
    k_cache = torch.zeros(rows, heads, dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    loc = torch.arange(1, tokens + 1, dtype=loc_dtype)
    k = torch.ones(tokens, heads, dim, dtype=dtype)
    return k_cache, v_cache, loc, k, k.clone()


@pytest.mark.parametrize("heads, dim, dtype, kernel, items", [
    (1, 128, torch.bfloat16, "256x1", 1),   # 256-byte rows: one 256-byte step per warp
    (8, 128, torch.bfloat16, "256x1", 8),
    (32, 128, torch.float16, "256x1", 32),
    (1, 128, torch.uint8, "128x2", 1),      # an fp8 row of 128 bytes: half a warp each for K and V
    (1, 64, torch.bfloat16, "128x2", 1),
    (3, 64, torch.bfloat16, "128x2", 3),    # 384 bytes: a multiple of 128, not of 256
])
def test_launch_decisions_are_the_ops(heads, dim, dtype, kernel, items):
    args = _args(heads, dim, 10, dtype)
    plan = plan_launch(*args, need_cuda=False)
    words = heads * dim * args[0].element_size() // 8
    assert plan.kernel == (kernel, "i64")
    assert plan.grid == 2  # 10 tokens, one warp per token, 8 warps per 256-thread block
    assert plan.args[3] == 10 and plan.args[6:] == (words, words, items)
    assert THREADS == 256


def test_int32_slots_pick_the_int32_kernels():
    assert plan_launch(*_args(8, 128, 3, loc_dtype=torch.int32), need_cuda=False).kernel == ("256x1", "i32")


@pytest.mark.parametrize("change, match", [
    (lambda a: (a[0], a[1], a[2], a[3][:, :, :40].contiguous(), a[4][:, :, :40].contiguous()),
     "must have the same head size"),
    (lambda a: (a[0], a[1][:, :, :64].contiguous(), a[2], a[3], a[4]), "k_cache and v_cache must have the same"),
    (lambda a: (a[0], a[1], a[2].float(), a[3], a[4]), "out_loc must be of type int32 or int64"),
    (lambda a: (a[0][:, :, :20].contiguous(), a[1][:, :, :20].contiguous(), a[2], a[3][:, :, :20].contiguous(),
                a[4][:, :, :20].contiguous()), "divisible by 128 at least, got: 40"),
])
def test_the_ops_refusals_are_kept(change, match):
    with pytest.raises(RuntimeError, match=match):
        plan_launch(*change(_args(1, 128, 4)), need_cuda=False)


def test_cpu_tensors_are_refused_as_by_the_op():
    with pytest.raises(RuntimeError, match="All tensors must be CUDA tensors"):
        plan_launch(*_args(1, 128, 4))


def test_the_writer_says_why_it_cannot_run_here(monkeypatch, tmp_path):
    w = create_writer("sgl_kernel_cubin")
    reason = w.unsupported_reason(torch.device("cpu"), torch.bfloat16)
    assert reason and "\n" not in reason
    if not torch.cuda.is_available():
        assert "needs CUDA" in reason


def _script(*args, **kw):
    return subprocess.run([sys.executable, "-m", "kvprof.kvcache.writers.sgl_cubin_extract", *args],
                          capture_output=True, text=True, **kw)


def test_extraction_errors_are_one_line(tmp_path):
    r = _script("--wheel", str(tmp_path / "missing.whl"), "--out", str(tmp_path / "o"))
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and "no wheel at" in r.stderr
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    r = _script("--wheel", str(bad), "--out", str(tmp_path / "o"))
    assert r.returncode == 1 and "not a wheel" in r.stderr and "Traceback" not in r.stderr
    empty = tmp_path / "sgl_kernel-0-cp310-abi3-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(empty, "w") as z:
        z.writestr("sgl_kernel/__init__.py", "")
    r = _script("--wheel", str(empty), "--out", str(tmp_path / "o"))
    assert r.returncode == 1 and "has no sm90 common_ops library" in r.stderr
    assert not (tmp_path / "o" / "store_kv_cache.sm_90.cubin").exists()


# ----------------------------------------------------------------------------- GPU
def _cubin_writer():
    if not os.environ.get("KVPROF_SGL_CUBIN"):
        pytest.skip("KVPROF_SGL_CUBIN is not set (python -m kvprof.kvcache.writers.sgl_cubin_extract, "
                    "then gpu/run_gpu_checks.sh sets it)")
    w = create_writer("sgl_kernel_cubin")
    assert w.unsupported_reason(torch.device("cuda"), torch.bfloat16) is None
    return w


def _pools(w, heads, dim, cache, rows=8192):
    from kvprof.kvcache.pool import KVPool

    ref = KVPool(rows, 1, cache, heads, dim, 1, "cuda", writer=create_writer("index_put"))
    got = KVPool(rows, 1, cache, heads, dim, 1, "cuda", writer=w)
    return ref, got


@pytest.mark.gpu
@pytest.mark.parametrize("heads, dim, cache, inp", [
    (1, 128, torch.bfloat16, torch.bfloat16), (8, 128, torch.bfloat16, torch.bfloat16),
    (1, 64, torch.float16, torch.float16), (32, 128, torch.float16, torch.float16),
    (1, 128, torch.float8_e4m3fn, torch.bfloat16), (8, 128, torch.float8_e4m3fn, torch.bfloat16),
])
@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
def test_sgl_kernels_match_index_put_eagerly_and_in_a_graph(heads, dim, cache, inp, loc_dtype):
    w = _cubin_writer()
    scale = 0.5 if cache != inp else None
    g = torch.Generator().manual_seed(heads * dim)
    for tokens in (1, 9, 1000):
        ref, got = _pools(w, heads, dim, cache)
        loc = (torch.randperm(8191, generator=g)[:tokens] + 1).to(loc_dtype).cuda()
        k = torch.randn(tokens, heads, dim, generator=g).to(inp).cuda()
        v = torch.randn(tokens, heads, dim, generator=g).to(inp).cuda()
        ref.set_kv_buffer(0, loc, k, v, scale, scale)
        got.set_kv_buffer(0, loc, k, v, scale, scale)
        assert got.path_counts == {FUSED: 1}
        assert torch.equal(ref.k_buffer[0], got.k_buffer[0]) and torch.equal(ref.v_buffer[0], got.v_buffer[0])
        # captured: the driver launch goes into the graph on the capturing stream
        graph_pool = _pools(w, heads, dim, cache)[1]
        graph_pool.check_slots = False
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graph_pool.set_kv_buffer(0, loc, k, v, scale, scale)
        assert not graph_pool.k_buffer[0].any()  # capture runs nothing
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(ref.k_buffer[0], graph_pool.k_buffer[0])
        assert torch.equal(ref.v_buffer[0], graph_pool.v_buffer[0])


@pytest.mark.gpu
def test_rows_the_op_refuses_fall_back_and_say_so():
    w = _cubin_writer()
    ref, got = _pools(w, 1, 20, torch.bfloat16)  # 40-byte rows: neither kernel applies
    loc = torch.arange(1, 5).cuda()
    k = torch.randn(4, 1, 20).to(torch.bfloat16).cuda()
    ref.set_kv_buffer(0, loc, k, k)
    got.set_kv_buffer(0, loc, k, k)
    (path,) = got.path_counts
    assert path.startswith("fallback:") and "divisible by 128" in path
    assert torch.equal(ref.k_buffer[0], got.k_buffer[0])
