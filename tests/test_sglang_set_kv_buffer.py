"""SGLang's generic MHA write (its set_kv_buffer: div_ in place, .to, .view, store) as variants,
and bench keeping the rows it hands every variant unchanged around a writer that divides them."""

from __future__ import annotations

import pytest
import torch

from kvprof.bench.run import BenchPoint, bench_variant, make_case
from kvprof.core.vocab import CONVERT_THEN_STORE, TWO_COPIES
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.writers import create_writer, sglang_set_kv_buffer as mod

FP8 = torch.float8_e4m3fn


def _rows(tokens: int = 6, heads: int = 2, dim: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn((tokens, heads, dim), generator=g).to(torch.bfloat16)
    v = torch.randn((tokens, heads, dim), generator=g).to(torch.bfloat16)
    return k, v


def _pools(writer: object, cache: torch.dtype, rows: int = 20, heads: int = 2, dim: int = 16) -> tuple[KVPool, KVPool]:
    ref = KVPool(rows, 1, cache, heads, dim, 1, torch.device("cpu"), writer=create_writer("index_put"))
    got = KVPool(rows, 1, cache, heads, dim, 1, torch.device("cpu"), writer=writer)
    return ref, got


def _check_generic(writer: object) -> None:
    """The fp8 write leaves the pool as kvprof's reference does and divides the caller's rows in
    place, as SGLang's set_kv_buffer does; a cache of the rows' dtype is a plain store."""
    k, v = _rows()
    k0, v0 = k.clone(), v.clone()
    loc = torch.tensor([1, 5, 9, 3, 17, 12])
    ref, got = _pools(writer, FP8)
    ref.set_kv_buffer(0, loc, k, v, 0.5, 0.25)
    assert torch.equal(k, k0) and torch.equal(v, v0)  # the reference never changes its inputs
    got.set_kv_buffer(0, loc, k, v, 0.5, 0.25)
    assert got.path_counts == {CONVERT_THEN_STORE: 1}
    assert torch.equal(ref.k_buffer[0], got.k_buffer[0]) and torch.equal(ref.v_buffer[0], got.v_buffer[0])
    assert torch.equal(k, k0 / 0.5) and torch.equal(v, v0 / 0.25)  # SGLang's div_: in place
    k, v = _rows(seed=1)
    ref, got = _pools(writer, torch.bfloat16)
    for p in (ref, got):
        p.set_kv_buffer(0, loc, k, v)
    assert torch.equal(ref.k_buffer[0], got.k_buffer[0]) and torch.equal(ref.v_buffer[0], got.v_buffer[0])


def test_torch_version_is_sglangs_ops_in_place() -> None:
    writer = create_writer("set_kv_buffer_torch")
    assert writer.modifies_inputs and not writer.fused
    _check_generic(writer)


@pytest.mark.slow  # imports SGLang (about 10 s)
def test_sglangs_own_set_kv_buffer() -> None:
    pytest.importorskip("sglang.srt.mem_cache.memory_pool")
    writer = create_writer("sglang_set_kv_buffer")
    assert writer.unsupported_reason(torch.device("cpu"), FP8, torch.bfloat16) is None
    assert writer.modifies_inputs
    _check_generic(writer)


def test_sglang_missing_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mod, "find_sglang_pool", lambda: (None, "SGLang's MHATokenToKVPool is not importable (x)"))
    writer = mod.SglangSetKVBufferWriter()
    assert writer.unsupported_reason(torch.device("cpu"), FP8, torch.bfloat16) == (
        "SGLang's MHATokenToKVPool is not importable (x)")


def test_bench_gives_a_writer_that_divides_its_rows_its_own_copy() -> None:
    """Before: the variant divided the rows every later variant was handed (and checked against)."""
    case = make_case(BenchPoint(2, 16, "fp8_e4m3", "bf16", 4), torch.device("cpu"), 1 << 16, 0)
    k0, v0 = case.k.clone(), case.v.clone()
    rows = bench_variant(case, "set_kv_buffer_torch", create_writer("set_kv_buffer_torch"), replays=2,
                         eager_repeats=2, modes=("eager",))
    assert [r.status for r in rows] == ["ok"], rows
    assert rows[0].paths == {CONVERT_THEN_STORE: rows[0].paths[CONVERT_THEN_STORE]}
    assert torch.equal(case.k, k0) and torch.equal(case.v, v0)
    after = bench_variant(case, "index_put", create_writer("index_put"), replays=2, eager_repeats=2, modes=("eager",))
    assert after[0].status == "ok" and set(after[0].paths) == {TWO_COPIES}


@pytest.mark.parametrize("name", ["set_kv_buffer_torch", pytest.param("sglang_set_kv_buffer", marks=pytest.mark.slow)])
def test_rows_that_share_memory_are_divided_in_a_copy(name: str) -> None:
    """An expanded K (one row read for every token), which div_ cannot write in place (SGLang's own
    call raises there): the write divides a copy, stores the reference rows, leaves K as it was."""
    pytest.importorskip("sglang.srt.mem_cache.memory_pool") if name.startswith("sglang") else None
    k, v = _rows()
    k = k[:1].expand(6, 2, 16)
    k0, v0 = k.clone(), v.clone()
    loc = torch.tensor([1, 5, 9, 3, 17, 12])
    ref, got = _pools(create_writer(name), FP8)
    ref.set_kv_buffer(0, loc, k, v, 0.5, 0.5)
    got.set_kv_buffer(0, loc, k, v, 0.5, 0.5)
    assert torch.equal(ref.k_buffer[0], got.k_buffer[0]) and torch.equal(ref.v_buffer[0], got.v_buffer[0])
    assert torch.equal(k, k0) and torch.equal(v, v0 / 0.5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sglang_set_kv_buffer", "set_kv_buffer_torch"])
def test_generic_write_on_cuda_in_a_graph(name: str) -> None:
    """On CUDA (SGLang's store_cache where SGLang imports): the fp8 write from a replayed CUDA graph
    leaves the pool as the reference does; each replay divides the rows again (in place)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (run gpu/run_gpu_checks.sh on the H200)")
    writer = create_writer(name)
    dev = torch.device("cuda")
    reason = writer.unsupported_reason(dev, FP8, torch.bfloat16)
    if reason:
        pytest.skip(reason)
    k, v = (x.to(dev) for x in _rows(tokens=8, heads=1, dim=128))
    loc = torch.tensor([1, 5, 9, 3, 17, 12, 30, 2], device=dev)
    ref = KVPool(64, 1, FP8, 1, 128, 1, dev, writer=create_writer("index_put"))
    got = KVPool(64, 1, FP8, 1, 128, 1, dev, writer=writer)
    kk, vv = k.clone(), v.clone()
    got.set_kv_buffer(0, loc, kk, vv, 0.5, 0.5)  # eager first: store_cache compiles here
    ref.set_kv_buffer(0, loc, k, v, 0.5, 0.5)
    assert torch.equal(ref.k_buffer[0], got.k_buffer[0]) and torch.equal(ref.v_buffer[0], got.v_buffer[0])
    assert torch.equal(kk, k / 0.5)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got.set_kv_buffer(0, loc, kk, vv, 0.5, 0.5)
    kk.copy_(k)
    vv.copy_(v)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(ref.k_buffer[0], got.k_buffer[0]) and torch.equal(ref.v_buffer[0], got.v_buffer[0])
