"""The layouts' fused writers on a GPU: the compiled kernels (hardware fp8 casts, 16-byte
accesses) bitwise equal to the references, every bf16/fp16 value included, and replayable in
CUDA graphs. Run on the H200 by gpu/layouts_bench.sh (``pytest -m gpu tests/test_layouts_gpu.py``)."""

from __future__ import annotations

import pytest
import torch

from kvprof.kvcache.layouts import registry
from kvprof.kvcache.layouts.workload import BlockTables
from kvprof.kvcache.mla_pool import MLAPool
from kvprof.kvcache.paged_pool import PagedPool

pytestmark = pytest.mark.gpu
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _every_value(dtype: torch.dtype, cols: int) -> torch.Tensor:
    """Every 16-bit pattern of ``dtype`` (NaNs dropped: their bits have no single reference), as rows."""
    x = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    x = x[~torch.isnan(x.float())]
    x = torch.cat([x, x[: (-x.numel()) % cols]])
    return x.view(-1, cols).cuda()


def _skip_unsupported(name: str, layout: str, cache: torch.dtype, inp: torch.dtype) -> None:
    """Skip (with its reason) a peer that refuses this point; kvprof's writers never do."""
    reason = registry.create_writer(layout, name).unsupported_reason(torch.device("cuda"), cache, inp)
    if reason and name.startswith(("vllm_", "sglang_")):
        pytest.skip(reason)


def _mla_pair(name: str, cache: torch.dtype, rank: int = 512, rope: int = 64, rows: int = 40000):
    return [MLAPool(rows, 1, cache, rank, rope, 1, "cuda", writer=registry.create_writer("mla", w))
            for w in ("mla_index_put", name)]


@pytest.mark.parametrize("name", ["mla_triton", "mla_cuda", "sglang_mla", "vllm_concat_and_cache_mla"])
@pytest.mark.parametrize("cache,inp", [(torch.bfloat16, torch.bfloat16), (torch.float8_e4m3fn, torch.bfloat16),
                                       (torch.float8_e5m2, torch.bfloat16), (torch.float8_e4m3fn, torch.float16),
                                       (torch.float8_e4m3fn, torch.float32)])
@pytest.mark.parametrize("tokens", [1, 7, 64, 513, 4096])
def test_mla_fused_matches_reference_on_gpu(name: str, cache, inp, tokens: int) -> None:
    pools = _mla_pair(name, cache)
    if pools[1].writer.unsupported_reason(torch.device("cuda"), cache, inp):
        pytest.skip(pools[1].writer.unsupported_reason(torch.device("cuda"), cache, inp))
    gen = torch.Generator().manual_seed(tokens)
    latent = (torch.randn((tokens, 1, 576), generator=gen) * 300).to(inp).cuda()
    loc = (torch.randperm(39999, generator=gen)[:tokens] + 1).cuda()  # slot 0 once (set_kv_buffer writes it)
    loc[tokens // 2] = 0
    for p in pools:
        p.set_mla_kv_buffer(0, loc, latent[..., :512], latent[..., 512:])
        p.set_kv_buffer(0, loc.flip(0), latent)
    assert torch.equal(pools[0].kv_buffer[0], pools[1].kv_buffer[0])


@pytest.mark.parametrize("name", ["mla_triton", "mla_cuda", "vllm_concat_and_cache_mla"])
@pytest.mark.parametrize("cache", FP8)
@pytest.mark.parametrize("inp", [torch.bfloat16, torch.float16])
def test_mla_fused_converts_every_value(name, cache, inp) -> None:
    _skip_unsupported(name, "mla", cache, inp)
    rows = _every_value(inp, 576)
    pools = _mla_pair(name, cache, rows=rows.shape[0] + 1)
    loc = torch.arange(1, rows.shape[0] + 1, device="cuda")
    for p in pools:
        p.set_mla_kv_buffer(0, loc, rows[:, :512], rows[:, 512:])
    assert torch.equal(pools[0].kv_buffer[0], pools[1].kv_buffer[0])


def _paged_pair(name: str, cache: torch.dtype, heads: int, dim: int, blocks: int = 4096, block: int = 16):
    return [PagedPool(blocks, block, cache, heads, dim, 1, "cuda", writer=registry.create_writer("paged", w))
            for w in ("paged_index_put", name)]


@pytest.mark.parametrize("name", ["paged_triton", "paged_cuda", "paged_unfused", "vllm_reshape_and_cache_flash"])
@pytest.mark.parametrize("cache,inp", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                       (torch.float8_e4m3fn, torch.bfloat16), (torch.float8_e5m2, torch.bfloat16),
                                       (torch.float8_e4m3fn, torch.float32)])
@pytest.mark.parametrize("heads,dim", [(1, 128), (8, 128), (2, 96)])
@pytest.mark.parametrize("tokens", [1, 13, 512, 4096])
def test_paged_fused_matches_reference_on_gpu(name: str, cache, inp, heads: int, dim: int, tokens: int) -> None:
    _skip_unsupported(name, "paged", cache, inp)
    pools = _paged_pair(name, cache, heads, dim)
    tables = BlockTables(4096, 16, seed=tokens)
    slots = torch.from_numpy(tables.decode(tokens, 100) if tokens <= 512 else tables.prefill(tokens)).cuda()
    gen = torch.Generator().manual_seed(tokens)
    qkv = (torch.randn((slots.shape[0] + 3, 10 * heads * dim), generator=gen) * 500).to(inp).cuda()
    key = qkv[:, 8 * heads * dim: 9 * heads * dim].view(-1, heads, dim)
    value = qkv[:, 9 * heads * dim:].view(-1, heads, dim)
    scale = torch.tensor([0.37], device="cuda")
    for p in pools:
        p.reshape_and_cache_flash(0, key, value, slots, scale, 1.3)
    assert torch.equal(pools[0].key_cache[0], pools[1].key_cache[0])
    assert torch.equal(pools[0].value_cache[0], pools[1].value_cache[0])


@pytest.mark.parametrize("name", ["paged_triton", "paged_cuda", "vllm_reshape_and_cache_flash"])
@pytest.mark.parametrize("cache", FP8)
@pytest.mark.parametrize("inp", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scale", [1.0, 0.37, 3.0])
def test_paged_fused_converts_every_value(name, cache, inp, scale: float) -> None:
    _skip_unsupported(name, "paged", cache, inp)
    rows = _every_value(inp, 128)
    pools = _paged_pair(name, cache, 1, 128, blocks=rows.shape[0] // 16 + 1)
    slots = torch.arange(rows.shape[0], device="cuda")
    for p in pools:
        p.reshape_and_cache_flash(0, rows.view(-1, 1, 128), rows.view(-1, 1, 128), slots, scale, scale)
    assert torch.equal(pools[0].key_cache[0], pools[1].key_cache[0])


@pytest.mark.parametrize("layout,name", [("mla", "mla_triton"), ("mla", "mla_cuda"), ("mla", "mla_cat_copy"),
                                         ("paged", "paged_triton"), ("paged", "paged_cuda"),
                                         ("paged", "paged_unfused"), ("mla", "vllm_concat_and_cache_mla"),
                                         ("paged", "vllm_reshape_and_cache_flash")])
def test_writers_replay_in_cuda_graphs(layout: str, name: str) -> None:
    """Captured once, replayed with new slots and inputs written into the captured tensors."""
    _skip_unsupported(name, layout, torch.float8_e4m3fn, torch.bfloat16)
    if layout == "mla":
        pools = _mla_pair(name, torch.float8_e4m3fn, rows=1000)
        latent = torch.zeros((64, 1, 576), dtype=torch.bfloat16, device="cuda")
        loc = torch.zeros(64, dtype=torch.int64, device="cuda")

        def step(p):
            p.set_mla_kv_buffer(0, loc, latent[..., :512], latent[..., 512:])
    else:
        pools = _paged_pair(name, torch.float8_e4m3fn, 1, 128, blocks=100)
        latent = torch.zeros((64, 1, 128), dtype=torch.bfloat16, device="cuda")
        loc = torch.full((64,), -1, dtype=torch.int64, device="cuda")
        scale = torch.tensor([0.5], device="cuda")

        def step(p):
            p.reshape_and_cache_flash(0, latent, latent, loc, scale, scale)
    ref, got = pools
    got.check_slots = False
    step(got)  # warm up (compile) outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(got)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        latent.copy_(torch.randn(latent.shape, generator=gen).to(torch.bfloat16))
        new = torch.randperm(999, generator=gen)[:64] + 1
        if layout == "paged":
            new[::5] = -1
        loc.copy_(new)
        graph.replay()
        step(ref)
    torch.cuda.synchronize()
    a = ref.kv_buffer[0] if layout == "mla" else ref.key_cache[0]
    b = got.kv_buffer[0] if layout == "mla" else got.key_cache[0]
    assert torch.equal(a, b)


@pytest.mark.parametrize("layout", ["mla", "paged"])
@pytest.mark.parametrize("skip", [0, -1])
def test_vllm_peers_int32_slots_and_skip(layout: str, skip: int) -> None:
    """int32 slots are widened (vLLM's kernels read int64); MLA: the reserved slot 0 is never
    written by the skip kernel, and with no reserved slot vLLM's kernel runs verbatim."""
    name = "vllm_concat_and_cache_mla" if layout == "mla" else "vllm_reshape_and_cache_flash"
    _skip_unsupported(name, layout, torch.bfloat16, torch.bfloat16)
    gen = torch.Generator().manual_seed(5)
    if layout == "mla":
        pools = _mla_pair(name, torch.bfloat16, rows=300)
        latent = torch.randn((64, 1, 576), generator=gen).to(torch.bfloat16).cuda()
        # slot 0 once, at token 3: a second token at slot 0 (randperm put one at token 35) left which of the
        # two lands there to each kernel's order, where vLLM's and index_put's differ
        loc = (torch.randperm(299, generator=gen)[:64] + 1).to(torch.int32).cuda()
        loc[3] = 0
        for p in pools:
            if skip == 0:
                p.set_mla_kv_buffer(0, loc, latent[..., :512], latent[..., 512:])
            else:
                p.set_kv_buffer(0, loc, latent)
        assert torch.equal(pools[0].kv_buffer[0], pools[1].kv_buffer[0])
        assert dict(pools[1].path_counts) == {"slots_int64_then_fused": 1}
    else:
        pools = _paged_pair(name, torch.bfloat16, 1, 128, blocks=40)
        rows = torch.randn((64, 1, 128), generator=gen).to(torch.bfloat16).cuda()
        loc = torch.randperm(640, generator=gen)[:64].to(torch.int32).cuda()
        loc[::7] = -1
        for p in pools:
            p.reshape_and_cache_flash(0, rows, rows, loc)
        assert torch.equal(pools[0].key_cache[0], pools[1].key_cache[0])
