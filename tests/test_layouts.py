"""The MLA and paged layouts: every writer bitwise equal to its layout's reference, and bad
input refused before any kernel runs.

Hypothesis draws dtypes, row shapes, token counts, slot patterns (-1 padding and block
tables for the paged cache; slot 0, which set_mla_kv_buffer skips, for MLA), input values
that overflow, underflow and are infinite, inputs with a token stride (views of a wider
tensor), and scales. The fused Triton writers run under Triton's interpreter here.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from kvprof.core.errors import ResourceError, UsageError
from kvprof.kvcache.layouts import get_layout, registry
from kvprof.kvcache.layouts.workload import BlockTables, graph_size
from kvprof.kvcache.mla_pool import MLAPool
from kvprof.kvcache.paged_pool import PagedPool

MLA_WRITERS = ["mla_cat_copy", "mla_triton", "sglang_mla"]
PAGED_WRITERS = ["paged_unfused", "paged_triton"]
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _values(gen: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, spread: float) -> torch.Tensor:
    """Normal values scaled by ``spread``, with some huge, tiny, infinite and zero entries."""
    x = torch.randn(shape, generator=gen) * spread
    pick = torch.rand(shape, generator=gen)
    x = torch.where(pick < 0.02, torch.full_like(x, 1e6), x)
    x = torch.where((pick > 0.02) & (pick < 0.03), x * 1e-6, x)
    x = torch.where((pick > 0.03) & (pick < 0.035), torch.full_like(x, -float("inf")), x)
    x = torch.where((pick > 0.035) & (pick < 0.04), torch.zeros_like(x), x)
    return x.to(dtype)


def _strided(x: torch.Tensor, extra: int) -> torch.Tensor:
    """The same rows as a view of a wider tensor (token stride > row length)."""
    if not extra:
        return x
    wide = torch.zeros((x.shape[0], *x.shape[1:-1], x.shape[-1] + extra), dtype=x.dtype)
    wide[..., : x.shape[-1]] = x
    return wide[..., : x.shape[-1]]


def _skip_or_fail(reason: str) -> None:
    """Skip, except in CI (KVPROF_REQUIRE_SGLANG=1), where SGLang must be there."""
    if os.environ.get("KVPROF_REQUIRE_SGLANG") == "1":
        pytest.fail(f"KVPROF_REQUIRE_SGLANG=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _writer(layout: str, name: str):
    w = registry.create_writer(layout, name)
    reason = w.unsupported_reason(torch.device("cpu"), torch.bfloat16)
    if reason:
        (_skip_or_fail if name == "sglang_mla" else pytest.skip)(reason)
    return w


# -- MLA -----------------------------------------------------------------------------------
@st.composite
def mla_cases(draw):
    cache = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32, *FP8]))
    inp = draw(st.sampled_from([cache, torch.bfloat16, torch.float32, torch.float16] if cache in FP8 else [cache]))
    rank = draw(st.sampled_from([16, 24, 64, 512]))
    rope = draw(st.sampled_from([8, 16, 64]))
    tokens = draw(st.one_of(st.just(0), st.integers(1, 40), st.integers(41, 300)))
    with_zero = draw(st.booleans())
    split = draw(st.booleans())
    extra = draw(st.sampled_from([0, 0, 8, 64]))
    loc_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    spread = draw(st.sampled_from([1.0, 300.0, 3e4]))
    return cache, inp, rank, rope, tokens, with_zero, split, extra, loc_dtype, spread, draw(st.integers(0, 2**16))


def _mla_run(name: str, case) -> None:
    cache, inp, rank, rope, tokens, with_zero, split, extra, loc_dtype, spread, seed = case
    writer = _writer("mla", name)
    if cache in FP8 and inp != cache and writer.unsupported_reason(torch.device("cpu"), cache, inp):
        pytest.skip("conversion not offered")
    size = max(2 * tokens, 16)
    pools = [MLAPool(size, 1, cache, rank, rope, 2, writer=w)
             for w in (registry.create_writer("mla", "mla_index_put"), writer)]
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(size + 1, generator=gen)[:tokens]
    if with_zero and tokens:  # slot 0 once: two tokens there would leave the winner to each writer's order
        slots = torch.randperm(size, generator=gen)[:tokens] + 1
        slots[tokens // 2] = 0
    loc = slots.to(loc_dtype)
    for p in pools:  # a first write, so skipped rows must keep non-zero contents
        first = _values(torch.Generator().manual_seed(1), (size + 1, 1, rank + rope), inp, 1.0)
        p.set_kv_buffer(3 - 2, torch.arange(size + 1), first)
    nope = _strided(_values(gen, (tokens, 1, rank), inp, spread), extra)
    rp = _strided(_values(gen, (tokens, 1, rope), inp, spread), extra)
    row = _strided(_values(gen, (tokens, rank + rope), inp, spread), extra)
    for p in pools:
        if split:
            p.set_mla_kv_buffer(1, loc, nope, rp)
        else:
            p.set_kv_buffer(1, loc, row)
    ref, got = pools[0].kv_buffer[0], pools[1].kv_buffer[0]
    bad = (ref != got).any(dim=-1).any(dim=-1)
    assert not bad.any(), f"{name}: rows {bad.nonzero().flatten()[:8].tolist()} differ from the reference"


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "mla_triton" else n
                                  for n in MLA_WRITERS])  # mla_triton: 30 interpreted launches
@SETTINGS
@given(case=mla_cases())
def test_mla_writers_match_reference(name: str, case) -> None:
    _mla_run(name, case)


def test_mla_split_skips_slot_zero_and_whole_row_does_not() -> None:
    pool = MLAPool(8, 1, torch.bfloat16, 16, 8, 1, writer=registry.create_writer("mla", "mla_triton"))
    ones = torch.ones(2, 1, 16, dtype=torch.bfloat16)
    pool.set_mla_kv_buffer(0, torch.tensor([0, 3]), ones, torch.ones(2, 1, 8, dtype=torch.bfloat16))
    assert pool.kv_buffer[0][0].abs().sum() == 0 and pool.kv_buffer[0][3].abs().sum() == 24
    pool.set_kv_buffer(0, torch.tensor([0]), torch.full((1, 24), 2.0, dtype=torch.bfloat16))
    assert (pool.kv_buffer[0][0] == 2).all()


@pytest.mark.parametrize("dtype,inp", [(torch.bfloat16, torch.bfloat16), (torch.float8_e4m3fn, torch.bfloat16),
                                       (torch.float8_e5m2, torch.float16)])
@pytest.mark.parametrize("name", ["mla_index_put", "mla_triton", "mla_cat_copy"])
def test_mla_pool_matches_sglangs_real_pool(name: str, dtype: torch.dtype, inp: torch.dtype) -> None:
    """The same writes into SGLang's MLATokenToKVPool (its own code, on CPU) and into kvprof's
    MLA pool leave identical buffers, for whole rows and for the nope/rope split."""
    try:
        from sglang.srt.mem_cache import memory_pool
        from sglang.srt.runtime_context import get_parallel
    except Exception as exc:  # noqa: BLE001  not installed, or does not import here
        _skip_or_fail(f"SGLang does not import: {exc}")

    # one rank without decode-context parallelism, as a single-GPU server publishes it
    with get_parallel().override(dcp_enabled=False, attn_dcp_size=1, attn_dcp_rank=0):
        _compare_with_sglang(memory_pool, name, dtype, inp)


def _compare_with_sglang(memory_pool, name: str, dtype: torch.dtype, inp: torch.dtype) -> None:
    from types import SimpleNamespace

    size, page, layers, rank, rope = 40, 4, 3, 32, 16
    try:
        theirs = memory_pool.MLATokenToKVPool(size, page, dtype, rank, rope, layers, "cpu", False, start_layer=2)
    except Exception as exc:  # an SGLang whose pool needs its server context
        _skip_or_fail(f"SGLang's MLATokenToKVPool does not build on CPU here: {type(exc).__name__}: {exc}")
    ours = MLAPool(size, page, dtype, rank, rope, layers, writer=_writer("mla", name), start_layer=2)
    assert [tuple(b.shape) for b in theirs.kv_buffer] == [tuple(b.shape) for b in ours.kv_buffer]
    assert theirs.kv_buffer[0].dtype == ours.kv_buffer[0].dtype
    gen = torch.Generator().manual_seed(5)
    for step in range(4):
        layer = 2 + step % layers
        loc = torch.randperm(size + page, generator=gen)[:17]
        loc[3] = 0  # the dummy slot: whole-row writes write it, split writes skip it
        if step % 2:
            nope = _values(gen, (17, 1, rank), inp, 100.0)
            rp = _values(gen, (17, 1, rope), inp, 100.0)
            theirs.set_mla_kv_buffer(SimpleNamespace(layer_id=layer), loc, nope, rp)
            ours.set_mla_kv_buffer(SimpleNamespace(layer_id=layer), loc, nope, rp)
        else:
            row = _values(gen, (17, 1, rank + rope), inp, 100.0)
            theirs.set_kv_buffer(SimpleNamespace(layer_id=layer), loc, row, None)
            ours.set_kv_buffer(SimpleNamespace(layer_id=layer), loc, row, None)
    for layer in range(2, 2 + layers):
        assert torch.equal(theirs.kv_buffer[layer - 2], ours.kv_buffer[layer - 2]), f"layer {layer}"
        a, b = theirs.get_value_buffer(layer), ours.get_value_buffer(layer)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.view(torch.uint8) if dtype in FP8 else a, b.view(torch.uint8) if dtype in FP8 else b)


# -- paged ---------------------------------------------------------------------------------
@st.composite
def paged_cases(draw):
    cache = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32, *FP8]))
    inp = draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32] if cache in FP8 else [cache]))
    heads = draw(st.integers(1, 4))
    dim = draw(st.sampled_from([8, 24, 64, 128]))
    block = draw(st.sampled_from([1, 4, 16]))
    phase = draw(st.sampled_from(["decode", "prefill", "padding"]))
    tokens = draw(st.one_of(st.integers(1, 40), st.integers(41, 300)))
    extra = draw(st.sampled_from([0, 0, 8, 3 * 128]))
    surplus = draw(st.sampled_from([0, 0, 5]))  # key/value rows past slot_mapping (graph padding)
    k_scale = draw(st.sampled_from([None, 1.0, 0.37, 3.0, 0.0137, "tensor"]))
    loc_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    spread = draw(st.sampled_from([1.0, 300.0, 3e4]))
    seed = draw(st.integers(0, 2**16))
    return cache, inp, heads, dim, block, phase, tokens, extra, surplus, k_scale, loc_dtype, spread, seed


def _paged_slots(phase: str, tokens: int, blocks: int, block: int, seed: int) -> np.ndarray:
    tables = BlockTables(blocks, block, seed)
    if phase == "decode":
        return tables.decode(tokens, 3 * block)
    if phase == "prefill":
        return tables.prefill(tokens, chunk=max(block, 7))
    slots = np.full(tokens, -1)  # every token padding, or some
    if tokens > 2:
        slots[::3] = tables.prefill(len(slots[::3]))
    return slots


def _paged_run(name: str, case) -> None:
    cache, inp, heads, dim, block, phase, tokens, extra, surplus, k_scale, loc_dtype, spread, seed = case
    blocks = 5 * (tokens + 8) + -(-4 * tokens // block)
    pools = [PagedPool(blocks, block, cache, heads, dim, 2, writer=w)
             for w in (registry.create_writer("paged", "paged_index_put"), _writer("paged", name))]
    slots = torch.from_numpy(_paged_slots(phase, tokens, blocks, block, seed)).to(loc_dtype)
    n = slots.shape[0]
    gen = torch.Generator().manual_seed(seed)
    key = _strided(_values(gen, (n + surplus, heads, dim), inp, spread), extra)
    value = _strided(_values(gen, (n + surplus, heads * dim), inp, spread), extra)
    ks = torch.tensor([0.05]) if k_scale == "tensor" else k_scale
    vs = torch.tensor(2.5, dtype=torch.float64) if k_scale == "tensor" else (None if k_scale is None else 1.7)
    for p in pools:
        p.key_cache[1].fill_(7)  # rows a -1 slot must leave alone hold something
        p.reshape_and_cache_flash(1, key, value, slots, ks, vs)
    for what, a, b in (("K", pools[0].key_cache[1], pools[1].key_cache[1]),
                       ("V", pools[0].value_cache[1], pools[1].value_cache[1])):
        bad = (a != b).flatten(2).any(dim=-1)
        assert not bad.any(), f"{name}: {what} rows {bad.nonzero()[:8].tolist()} differ from the reference"


@pytest.mark.parametrize("name", PAGED_WRITERS)
@SETTINGS
@given(case=paged_cases())
def test_paged_writers_match_reference(name: str, case) -> None:
    _paged_run(name, case)


def test_paged_padding_slots_are_skipped() -> None:
    pool = PagedPool(4, 4, torch.bfloat16, 1, 8, 1, writer=registry.create_writer("paged", "paged_triton"))
    pool.key_cache[0].fill_(3)
    pool.reshape_and_cache_flash(0, torch.ones(3, 1, 8, dtype=torch.bfloat16),
                                 torch.ones(3, 1, 8, dtype=torch.bfloat16),
                                 torch.tensor([-1, 5, -1]))
    flat = pool.key_cache[0].view(-1, 8)
    assert (flat[5] == 1).all() and (flat[torch.arange(16) != 5] == 3).all()


def test_paged_fp8_is_vllms_division_and_saturation() -> None:
    """Where dividing differs from multiplying by the reciprocal, and past the fp8 range."""
    pool = PagedPool(2, 4, torch.float8_e4m3fn, 1, 16, 1, writer=registry.create_writer("paged", "paged_triton"))
    x = torch.tensor([[1000.0, -1e9, float("inf"), 0.1, 3.0, 7.0, 1e-5, 448.0, 464.0, 465.0, 0.0, -0.0,
                       5.5, 6.5, 9.1, 13.0]])
    pool.reshape_and_cache_flash(0, x.view(1, 1, 16), x.view(1, 1, 16), torch.tensor([2]), 0.3, 0.3)
    got = pool.get_kv_cache(0)[0].view(-1, 16)[2].float()
    want = (x / torch.full((1,), 0.3)).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    assert torch.equal(got, want.flatten())
    assert got[0] == 448 and got[1] == -448 and got[2] == 448


# -- refusals ------------------------------------------------------------------------------
def _bomb(layout: str):
    """A writer that fails the test if it is ever called: refusals happen before any kernel."""
    base = {"mla": "mla_index_put", "paged": "paged_index_put"}[layout]
    w = registry.create_writer(layout, base)

    def write(*args, **kwargs):
        raise AssertionError("the writer ran on a call that should have been refused")

    w.write = write  # type: ignore[method-assign]
    w.write_unchecked = write  # type: ignore[method-assign]  (what the pools call after their checks)
    return w


MLA_BAD = [
    (lambda p: p.set_kv_buffer(0, torch.tensor([1.0]), torch.zeros(1, 24)), "int32 or int64"),
    (lambda p: p.set_kv_buffer(0, torch.tensor([[1]]), torch.zeros(1, 24)), "1-D"),
    (lambda p: p.set_kv_buffer(0, torch.tensor([1, 2]), torch.zeros(1, 24)), "tokens"),
    (lambda p: p.set_kv_buffer(0, torch.tensor([1]), torch.zeros(1, 23)), "expected (1, 24)"),
    (lambda p: p.set_kv_buffer(0, torch.tensor([9]), torch.zeros(1, 24)), "past the last slot"),
    (lambda p: p.set_kv_buffer(0, torch.tensor([-1]), torch.zeros(1, 24)), "negative"),
    (lambda p: p.set_kv_buffer(5, torch.tensor([1]), torch.zeros(1, 24)), "not in this pool"),
    (lambda p: p.set_kv_buffer(True, torch.tensor([1]), torch.zeros(1, 24)), "not a layer id"),
    (lambda p: p.set_kv_buffer(0, torch.tensor([1]), torch.zeros(1, 24, dtype=torch.int32)), "floating point"),
    (lambda p: p.set_kv_buffer(0, torch.tensor([1]), torch.zeros(1, 24), None, 0.5), "no k_scale"),
    (lambda p: p.set_mla_kv_buffer(0, torch.tensor([1]), torch.zeros(1, 16), torch.zeros(1, 8, dtype=torch.float16)),
     "but cache_k_rope"),
    (lambda p: p.set_mla_kv_buffer(0, torch.tensor([1]), torch.zeros(1, 16), torch.zeros(1, 9)), "cache_k_rope rows"),
    (lambda p: p.set_mla_kv_buffer(0, torch.tensor([1]), "x", torch.zeros(1, 8)), "must be a tensor"),
]


@pytest.mark.parametrize("call,words", MLA_BAD)
def test_mla_bad_input_refused_before_any_kernel(call, words: str) -> None:
    pool = MLAPool(8, 1, torch.bfloat16, 16, 8, 2, writer=_bomb("mla"))
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        call(pool)


PAGED_BAD = [
    (lambda p, k: p.reshape_and_cache_flash(0, k, k, torch.tensor([-2])), "only -1"),
    (lambda p, k: p.reshape_and_cache_flash(0, k, k, torch.tensor([16])), "past the last slot"),
    (lambda p, k: p.reshape_and_cache_flash(0, k, k, torch.tensor([1, 2])), "tokens"),
    (lambda p, k: p.reshape_and_cache_flash(0, k, k.float(), torch.tensor([1])), "but value"),
    (lambda p, k: p.reshape_and_cache_flash(0, k.half(), k.half(), torch.tensor([1])), "as they are"),
    (lambda p, k: p.reshape_and_cache_flash(0, k, k[:, :, :4], torch.tensor([1])), "value rows"),
    (lambda p, k: p.reshape_and_cache_flash(0, k, k, torch.tensor([1.0])), "int32 or int64"),
    (lambda p, k: p.reshape_and_cache_flash(0, k, k, torch.tensor([1]), 0.0), "positive"),
    (lambda p, k: p.reshape_and_cache_flash(0, k, k, torch.tensor([1]), torch.ones(2)), "one-element"),
    (lambda p, k: p.reshape_and_cache_flash(0, k, k, torch.tensor([1]), None, "2"), "positive number"),
    (lambda p, k: p.reshape_and_cache_flash(3, k, k, torch.tensor([1])), "not in this pool"),
]


@pytest.mark.parametrize("call,words", PAGED_BAD)
def test_paged_bad_input_refused_before_any_kernel(call, words: str) -> None:
    pool = PagedPool(4, 4, torch.bfloat16, 1, 8, 2, writer=_bomb("paged"))
    with pytest.raises(ValueError, match=words):
        call(pool, torch.zeros(1, 1, 8, dtype=torch.bfloat16))


def test_bad_construction_and_names_refused() -> None:
    with pytest.raises(ValueError, match="kv_lora_rank"):
        MLAPool(8, 1, torch.bfloat16, 0, 8, 1, writer=registry.create_writer("mla", "mla_index_put"))
    with pytest.raises(ValueError, match="paged writer"):
        PagedPool(4, 4, torch.bfloat16, 1, 8, 1, writer=registry.create_writer("mla", "mla_index_put"))
    with pytest.raises(ResourceError, match="would need"):
        PagedPool(10**9, 1024, torch.bfloat16, 8, 128, 80, writer=registry.create_writer("paged", "paged_index_put"))
    with pytest.raises(UsageError, match="not a writer of the mla layout"):
        registry.create_writer("mla", "paged_triton")
    with pytest.raises(UsageError, match="unknown layout"):
        registry.writer_names("mqa")


def test_presets_pick_layouts() -> None:
    assert registry.pick_layout("deepseek-v3") == "mla"
    assert registry.pick_layout("llama-3.1-70b", engine="vllm") == "paged"
    assert registry.pick_layout("llama-3.1-70b") == "mha"
    with pytest.raises(UsageError, match="no paged layout"):
        registry.pick_layout("deepseek-v3", layout="paged")
    with pytest.raises(UsageError, match="needs an MLA model"):
        registry.pick_layout("llama-3.1-8b", layout="mla")


def test_block_tables_are_fragmented_and_padded() -> None:
    tables = BlockTables(256, 16, seed=3)
    slots = tables.decode(13, 100)
    assert slots.size == graph_size(13) == 16 and (slots[13:] == -1).all() and (slots[:13] >= 0).all()
    pre = tables.prefill(200, chunk=64)
    blocks = np.unique(pre // 16)
    assert len(pre) == 200 and len(np.unique(pre)) == 200
    assert (np.diff(blocks) != 1).any()  # scattered, not one run
    with pytest.raises(UsageError, match="blocks"):
        BlockTables(2, 16).prefill(100)


def test_instrumented_layout_pools_name_their_writes_like_the_mha_pool() -> None:
    """Under torch.profiler each write is a range named WRITE_RANGE_FORMAT (variant, layer);
    a refused call raises the pool's error and leaves no range."""
    from kvprof.core.vocab import WRITE_RANGE_FORMAT
    from kvprof.kvcache.instrument import make_layout_pool

    mla = make_layout_pool("mla", 8, 1, torch.bfloat16, 16, 8, 2, writer=registry.create_writer("mla", "mla_triton"),
                           instrument=True, start_layer=3)
    paged = make_layout_pool("paged", 4, 4, torch.bfloat16, 1, 8, 2,
                             writer=registry.create_writer("paged", "paged_unfused"), instrument=True)
    row = torch.ones(2, 1, 24, dtype=torch.bfloat16)
    kv = torch.ones(2, 1, 8, dtype=torch.bfloat16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        mla.set_kv_buffer(4, torch.tensor([1, 2]), row)
        mla.set_mla_kv_buffer(3, torch.tensor([1, 2]), row[..., :16], row[..., 16:])
        paged.set_kv_buffer(1, torch.tensor([-1, 6]), kv, kv)
        with pytest.raises(ValueError, match="not in this pool"):
            mla.set_kv_buffer(9, torch.tensor([1]), row[:1])
    names = [e.name for e in prof.events()]
    for variant, layer in (("mla_triton", 4), ("mla_triton", 3), ("paged_unfused", 1)):
        assert names.count(WRITE_RANGE_FORMAT.format(variant=variant, layer=layer)) == 1
    assert not any(n.startswith("set_kv_buffer[") and n.endswith(" L9") for n in names)
    assert mla.writer.info().extra == {"layout": "mla"} and (mla.kv_buffer[1][1] == 1).all()


def test_compiled_layout_writers_say_why_they_cannot_run_here() -> None:
    """mla_cuda / paged_cuda are CUDA-only compiled ops: on this device a one-line reason."""
    for layout, name in (("mla", "mla_cuda"), ("paged", "paged_cuda")):
        w = registry.create_writer(layout, name)
        reason = w.unsupported_reason(torch.device("cpu"), torch.bfloat16, torch.bfloat16)
        assert reason and "\n" not in reason and "CUDA" in reason
        assert w.fused and name in get_layout(layout).fused


def test_layout_bench_runs_and_reads_like_the_mha_bench(tmp_path) -> None:
    """One small point per layout on CPU: every variant checked against its reference, the
    target and ratios derived, files written that the dashboard's bench reader takes."""
    from kvprof.bench import layouts as lb
    from kvprof.dashboard.frames import bench_frame

    result = lb.run(["mla", "paged"], torch.device("cpu"), tokens=[3], replays=1, eager_repeats=1)
    recs = result["records"]
    assert {r["layout"] for r in recs} == {"mla", "paged"}
    odd = [r for r in recs if r["status"] not in ("ok", "unavailable")]
    assert not odd, odd
    ok = [r for r in recs if r["status"] == "ok"]
    assert {r["variant"] for r in ok} >= {"mla_cat_copy", "mla_triton", "paged_unfused", "paged_triton"}
    assert all(r["target_us"] > 1.2 and isinstance(r["meets_target"], bool) for r in ok)
    lb.write_files(result, tmp_path)
    doc = json.loads((tmp_path / "bench.json").read_text())
    frame = bench_frame({"layouts": doc})
    assert len(frame) == len(recs) and (tmp_path / "bench.csv").read_text().startswith("layout,")
    assert any("mla_triton: target met at" in line for line in lb.verdicts(result))
    assert len(lb.table(result).splitlines()) == len(recs) + 1


def _table_shapes(fn, fp8: bool) -> list:
    """Every shape a table hands out, over every card's row, token counts and row lengths."""
    from kvprof.kvcache.writers.layout_tables import MLA_TABLES, PAGED_TABLES

    return sorted({fn(t, row, fp8, card) for card in (*MLA_TABLES, *PAGED_TABLES)
                   for t in (1, 8, 64, 512, 4096, 1 << 20) for row in (128, 576, 1024, 8192)}, key=repr)


@pytest.mark.parametrize("fp8", [False, True])
def test_every_tuned_mla_shape_matches_the_reference(fp8: bool) -> None:
    """The tables' shapes (streaming stores included) at a size the interpreter runs quickly."""
    from kvprof.kvcache.writers.layout_tables import mla_shape
    from kvprof.kvcache.writers.mla_triton import MLATritonWriter

    _writer("mla", "mla_triton")  # skips where Triton cannot run
    cache = torch.float8_e4m3fn if fp8 else torch.bfloat16
    gen = torch.Generator().manual_seed(3)
    for shape in _table_shapes(mla_shape, fp8):
        w = MLATritonWriter(block_t=shape.block_t, num_warps=shape.num_warps, stream=shape.stream)
        pools = [MLAPool(40, 1, cache, 512, 64, 1, writer=x)
                 for x in (registry.create_writer("mla", "mla_index_put"), w)]
        loc = torch.randperm(41, generator=gen)[:19]
        latent = _values(gen, (19, 1, 576), torch.bfloat16, 300.0)
        for p in pools:
            p.set_mla_kv_buffer(0, loc, latent[..., :512], latent[..., 512:])
        assert torch.equal(pools[0].kv_buffer[0], pools[1].kv_buffer[0]), shape


@pytest.mark.parametrize("fp8", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_every_tuned_paged_shape_matches_the_reference(fp8: bool) -> None:
    from kvprof.kvcache.writers.layout_tables import paged_shape
    from kvprof.kvcache.writers.paged_triton import PagedTritonWriter

    _writer("paged", "paged_triton")
    cache = torch.float8_e4m3fn if fp8 else torch.bfloat16
    gen = torch.Generator().manual_seed(4)
    for shape in _table_shapes(paged_shape, fp8):
        w = PagedTritonWriter(block_t=shape.block_t, num_warps=shape.num_warps, split=shape.split)
        pools = [PagedPool(8, 16, cache, 1, 128, 1, writer=x)
                 for x in (registry.create_writer("paged", "paged_index_put"), w)]
        slots = torch.from_numpy(_paged_slots("padding", 21, 8, 16, 5))
        key = _values(gen, (21, 1, 128), torch.bfloat16, 300.0)
        for p in pools:
            p.reshape_and_cache_flash(0, key, key * 2, slots, 0.5 if fp8 else None, 0.25 if fp8 else None)
        assert torch.equal(pools[0].key_cache[0], pools[1].key_cache[0]), shape
        assert torch.equal(pools[0].value_cache[0], pools[1].value_cache[0]), shape
