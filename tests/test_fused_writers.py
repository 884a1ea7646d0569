"""kvprof's fused writers (triton_fused, cuda_fused) leave the pool bitwise as index_put does.

On CPU triton_fused runs in Triton's interpreter (conftest sets TRITON_INTERPRET=1 before
triton is imported) and exercises the integer emulation of torch's rounding. GPU tests
(``-m gpu``) need the compiled kernels, so run them with ``TRITON_INTERPRET=0``:

    TRITON_INTERPRET=0 python -m pytest tests/test_fused_writers.py -m gpu -q

NaN inputs are left out of the bitwise comparisons: torch itself writes different NaN bits
for the same input depending on device and tensor size; for NaN we check NaN-ness only.
"""

from __future__ import annotations

import math
import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from kernel_convert import convert_with_kernel
from kvprof.kvcache.dtypes import convert_for_cache, store_dtype_for
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.writers import (
    FUSED,
    create_writer,
    cuda_fused as cf,
    triton_convert,
    triton_fused as tf,
    triton_kernel as tk,
)
from kvprof.kvcache.writers.triton_convert import cached_inverse, pow2_exact

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16, *FP8)
INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32}

needs_interpreter = pytest.mark.skipif(
    tf.triton is None or not tk.interpreted(),
    reason="triton_fused on CPU needs TRITON_INTERPRET=1 when it is imported",
)
needs_compiled_triton = pytest.mark.skipif(
    tf.triton is None or tk.interpreted(),
    reason="GPU tests of triton_fused need the compiled kernel: run with TRITON_INTERPRET=0",
)

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy overflow to inf in the interpreter


# -- helpers ---------------------------------------------------------------------------------
def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT_OF[t.element_size()])


def nan_mask(stored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """NaN positions of a storage tensor holding ``dtype`` values."""
    return torch.isnan(stored.view(dtype).float())


def assert_same_bits(ref: torch.Tensor, got: torch.Tensor, dtype: torch.dtype, what: str = "") -> None:
    """Bitwise equal where the reference is not NaN; NaN exactly where the reference is NaN."""
    rn, gn = nan_mask(ref, dtype), nan_mask(got, dtype)
    assert torch.equal(rn, gn), f"{what}: NaN positions differ ({int((rn != gn).sum())})"
    bad = (bits(ref) != bits(got)) & ~rn
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: {int(bad.sum())} elements differ, first at {i}: "
            f"ref {hex(int(bits(ref)[tuple(i)]) & 0xFFFFFFFF)} got {hex(int(bits(got)[tuple(i)]) & 0xFFFFFFFF)}"
        )


def all_16bit(dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    return torch.arange(-32768, 32768, dtype=torch.int32, device=device).to(torch.int16).view(dtype)


def special_fp32(n: int, seed: int, device: str = "cpu") -> torch.Tensor:
    """Random fp32 bit patterns across all exponents, plus the edges of every format."""
    g = np.random.default_rng(seed)
    raw = g.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    edges = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754942e-38, 1.17549435e-38, 448.0, 464.0, 464.00003,
         479.99997, 480.0, 57344.0, 61439.996, 61440.0, 65504.0, 65519.996, 65520.0, 65536.0, 3.4028235e38,
         2.0**-6, 2.0**-9, 2.0**-10, 2.0**-14, 2.0**-16, 2.0**-17, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 2.0**-133],
        dtype=np.float32,
    )
    scaled = (g.standard_normal(n).astype(np.float32) * np.float32(2.0) ** g.integers(-30, 20, n).astype(np.float32))
    x = np.concatenate([edges, -edges, raw, scaled.astype(np.float32)])
    return torch.from_numpy(x).to(device)


# -- exhaustive conversions through the kernel ------------------------------------------------
SCALES_FP8 = (None, 0.5, 3.0, 1 / 448, 7.3)
SCALES_OTHER = (None, 0.5, 7.3)


def _check_conversion(x: torch.Tensor, dtype: torch.dtype, scale, hw: bool | None = None) -> None:
    ref = convert_for_cache(x, dtype, scale)
    got = convert_with_kernel(x, dtype, scale, hw=hw)
    assert got.dtype == ref.dtype
    assert_same_bits(ref, got, dtype, f"{x.dtype}->{dtype} scale={scale}")


@needs_interpreter
@pytest.mark.parametrize("src", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dst,scale", [pytest.param(dst, scale, id=f"{str(dst).removeprefix('torch.')}-scale{scale}")
                                       for dst in CACHE_DTYPES
                                       for scale in (SCALES_FP8 if dst in FP8 else SCALES_OTHER)])
def test_every_16bit_pattern_converts_like_torch(src, dst, scale):
    """One scale per test: all 65536 patterns at five fp8 scales were one test of 5-40 s."""
    _check_conversion(all_16bit(src), dst, scale)


@needs_interpreter
@pytest.mark.parametrize("dst", [torch.bfloat16, torch.float16, *FP8])
def test_fp32_patterns_and_edges_convert_like_torch(dst):
    x = special_fp32(20000, seed=1)
    for scale in (None, 0.5, 1 / 448):
        _check_conversion(x, dst, scale)


@needs_interpreter
@pytest.mark.parametrize("src", FP8)
@pytest.mark.parametrize("dst", CACHE_DTYPES)
def test_every_fp8_pattern_converts_like_torch(src, dst):
    x = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(src)
    for scale in (None, 0.5, 3.0):
        _check_conversion(x, dst, scale)


def test_e4m3_overflow_rule_is_probed():
    sat = tf.e4m3_saturates()
    got = torch.tensor([470.0]).to(torch.float8_e4m3fn).view(torch.uint8).item()
    assert got == (0x7E if sat else 0x7F)


# -- the pool, written by index_put and by a fused writer -------------------------------------
@st.composite
def write_cases(draw, max_tokens: int = 160):
    cache = draw(st.sampled_from(CACHE_DTYPES))
    if cache in FP8:
        inp = draw(st.sampled_from([cache, torch.bfloat16, torch.float16, torch.float32]))
    else:
        inp = draw(st.sampled_from([cache, cache, torch.bfloat16, torch.float16, torch.float32]))
    heads = draw(st.integers(1, 3))
    dim = draw(st.sampled_from([1, 3, 8, 12, 20, 64, 128]))
    vdim = draw(st.one_of(st.just(dim), st.sampled_from([2, 8, 40, 96])))
    page = draw(st.sampled_from([1, 1, 4, 16]))
    tokens = draw(st.one_of(st.integers(0, min(12, max_tokens)), st.integers(min(13, max_tokens), max_tokens)))
    pattern = draw(st.sampled_from(["random", "contiguous", "paged"]))
    loc_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    scaled = draw(st.booleans())
    # powers of two take the kernel's POW2 shortcut (no round trip through the input dtype)
    scales = st.one_of(st.floats(1 / 512, 64), st.sampled_from([0.5, 1.0, 2.0, 2.0**-9, 2.0**6, 2.0**-126]))
    k_scale = draw(scales) if scaled else None
    v_scale = draw(scales) if scaled else None
    strided = draw(st.booleans())  # K/V as slices of one wider qkv-like tensor
    magnitude = draw(st.sampled_from([1.0, 100.0, 1e4, 1e-6]))
    seed = draw(st.integers(0, 2**31 - 1))
    return dict(cache=cache, inp=inp, heads=heads, dim=dim, vdim=vdim, page=page, tokens=tokens,
                pattern=pattern, loc_dtype=loc_dtype, k_scale=k_scale, v_scale=v_scale, strided=strided,
                magnitude=magnitude, seed=seed)


def make_slots(pattern: str, tokens: int, size: int, page: int, g: torch.Generator) -> torch.Tensor:
    """Duplicate-free slots in [1, size + page) following one allocation pattern."""
    if pattern == "contiguous":
        start = int(torch.randint(1, max(2, size - tokens), (1,), generator=g))
        return torch.arange(start, start + tokens)
    if pattern == "paged":
        pages = size // page
        need = -(-tokens // page)
        chosen = torch.randperm(pages, generator=g)[:need] + 1  # page 0 holds the dummy slot
        slots = (chosen[:, None] * page + torch.arange(page)[None, :]).reshape(-1)[:tokens]
        return slots
    return torch.randperm(size + page - 1, generator=g)[:tokens] + 1


def make_rows(tokens: int, heads: int, dim: int, dtype: torch.dtype, magnitude: float, g: torch.Generator,
              device: str, strided: bool) -> torch.Tensor:
    x = torch.randn((tokens, heads, dim), generator=g) * magnitude
    if tokens:
        # a few specials: signed zeros, infinities, overflow and denormal-range values
        specials = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e30, -1e30, 1e-40, 3e-39, 500.0, 61440.0])
        idx = torch.randint(0, x.numel(), (min(8, x.numel()),), generator=g)
        x.view(-1)[idx] = specials[torch.randint(0, len(specials), (len(idx),), generator=g)]
    x = x.to(dtype) if dtype not in FP8 else x.clamp(-400, 400).to(dtype)
    if strided:
        wide = torch.zeros((tokens, heads * dim + 24), dtype=x.dtype)
        wide[:, 8:8 + heads * dim] = x.reshape(tokens, heads * dim)
        return wide.to(device)[:, 8:8 + heads * dim]
    return x.to(device)


def run_case(case: dict, writer, device: str = "cpu") -> None:
    tokens, page = case["tokens"], case["page"]
    size = max(64, 2 * tokens)
    size = -(-size // page) * page
    g = torch.Generator().manual_seed(case["seed"])
    pools = [
        KVPool(size, page, case["cache"], case["heads"], case["dim"], 2, device, writer=w, v_head_dim=case["vdim"])
        for w in (create_writer("index_put"), writer)
    ]
    for layer in (0, 1):
        loc = make_slots(case["pattern"], tokens, size, page, g).to(case["loc_dtype"]).to(device)
        k = make_rows(tokens, case["heads"], case["dim"], case["inp"], case["magnitude"], g, device, case["strided"])
        v = make_rows(tokens, case["heads"], case["vdim"], case["inp"], case["magnitude"], g, device, case["strided"])
        for p in pools:
            p.set_kv_buffer(layer, loc, k, v, case["k_scale"], case["v_scale"])
    assert pools[1].path_counts == {FUSED: 2}
    for name in ("k_buffer", "v_buffer"):
        for layer in (0, 1):
            ref, got = getattr(pools[0], name)[layer], getattr(pools[1], name)[layer]
            assert_same_bits(ref, got, case["cache"], f"{name}[{layer}] {case}")


@needs_interpreter
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=write_cases())
def test_triton_fused_matches_index_put(case):
    run_case(case, create_writer("triton_fused"))


# The interpreter runs every program in Python: its time is the number of programs, token
# blocks x column chunks (up to 14 ms each for a scaled fp8 row here). Up to 24 tokens, and at
# most PROGRAMS programs per launch: several token blocks for every block_t with split up to 8,
# and split 64 over one or two token blocks (its 64 column chunks are its point). Unbounded
# (24 tokens at block_t 1 x split 64 = 1536 programs, twice) one example took 44 s, and the
# 30 examples anywhere from 6 s to 489 s of a CI run.
PROGRAMS = 64


@st.composite
def launch_cases(draw):
    block_t = draw(st.sampled_from([1, 2, 4, 16]))
    split = draw(st.sampled_from([1, 2, 4, 8, 64]))
    case = draw(write_cases(max_tokens=min(24, PROGRAMS // split * block_t)))
    return case, block_t, split


@needs_interpreter
@pytest.mark.slow  # 30 kernel launches under the interpreter
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=launch_cases(), num_warps=st.sampled_from([1, 2, 4]), stream=st.booleans())
def test_triton_fused_launch_shapes_match_index_put(shape, num_warps, stream):
    """Every launch shape writes the same bits: tokens per program, warps and column chunks
    (split larger than the row's block is clamped to it), with or without streaming hints."""
    case, block_t, split = shape
    config = tf.TritonConfig(block_t, num_warps, split, stream)
    run_case(case, create_writer("triton_fused", config=config))


@needs_interpreter
@pytest.mark.parametrize(
    "cache,inp,heads,dim,vdim,tokens",
    [
        (torch.bfloat16, torch.bfloat16, 1, 128, 128, 4096),
        (torch.float8_e4m3fn, torch.bfloat16, 1, 128, 128, 4096),
        (torch.float8_e5m2, torch.float16, 2, 20, 12, 1500),
    ],
)
def test_triton_fused_large_writes(cache, inp, heads, dim, vdim, tokens):
    case = dict(cache=cache, inp=inp, heads=heads, dim=dim, vdim=vdim, page=16, tokens=tokens, pattern="random",
                loc_dtype=torch.int64, k_scale=0.5 if inp != cache else None, v_scale=2.0 if inp != cache else None,
                strided=False, magnitude=50.0, seed=7)
    run_case(case, create_writer("triton_fused"))


@needs_interpreter
def test_triton_fused_launch_bits_follow_each_call_s_strides(monkeypatch):
    """The launch is memoised per token count with the bits of rows packed at their width; a
    call whose rows have another token stride gets its own bits (Triton's packed fp8 cast only
    where the layout is known-good, triton_kernel.fp8_cast_safe), and the next packed call the
    memoised ones. ``convert="hw"`` takes the GPU's cast decision on a CPU; nothing launches."""
    from kvprof.kvcache.writers import triton_fused as tf
    from kvprof.kvcache.writers.triton_kernel import MODE_FP8_INT, MODE_WIDE

    calls: list[tuple] = []

    class Capture:
        def launch(self, grid, args, consts, num_warps, pdl=False, fp_fusion=True, fixed=()):
            calls.append((grid, fixed[1], fixed[2], consts[-1]))

    monkeypatch.setattr(tf, "launcher_for", lambda fn, name=None: Capture())
    w = tf.TritonFusedWriter(convert="hw")
    k_buf = torch.zeros(64, 8, 128, dtype=torch.uint8)
    v_buf = torch.zeros_like(k_buf)
    loc = torch.arange(4)
    packed = torch.randn(4, 8, 128).to(torch.bfloat16)
    odd = torch.randn(4, 8 * 128 + 8).to(torch.bfloat16)[:, :1024].view(4, 8, 128)  # token stride 1032
    for rows in (packed, odd, packed, odd):
        w.write(k_buf, v_buf, loc, rows, rows, torch.float8_e4m3fn, 0.5, 0.5)
    strides = [(c[1], c[2]) for c in calls]
    assert strides == [(1024, 1024), (1032, 1032), (1024, 1024), (1032, 1032)]
    fp8_int = [bool(c[3] & MODE_FP8_INT) for c in calls]
    assert fp8_int == [False, True, False, True]  # 1032 is no multiple of 16: the integer encode
    assert not any(c[3] & MODE_WIDE for c in calls)
    assert len({c[0] for c in calls}) == 1  # one grid for one token count


def test_triton_fused_strided_rows_keep_the_plan_s_own_bits(monkeypatch):
    """fp8 inputs always take the integer routines (a bit of the plan, not of the strides), and
    a pow2 scale's bit is the call's: a call with strided rows recomputes its stride bits
    without dropping either, and the packed call after it gets the memoised ones back."""
    from kvprof.kvcache.writers import triton_fused as tf
    from kvprof.kvcache.writers.triton_kernel import MODE_FP8_INT, MODE_POW2

    modes: list[int] = []

    class Capture:
        def launch(self, grid, args, consts, num_warps, pdl=False, fp_fusion=True, fixed=()):
            modes.append(consts[-1])

    monkeypatch.setattr(tf, "launcher_for", lambda fn, name=None: Capture())
    w = tf.TritonFusedWriter(convert="hw")
    k_buf = torch.zeros(64, 8, 128, dtype=torch.uint8)
    loc = torch.arange(4)
    packed = torch.randn(4, 8, 128).to(torch.float8_e4m3fn)
    odd = torch.randn(4, 8 * 128 + 16).to(torch.float8_e4m3fn)[:, :1024].view(4, 8, 128)  # token stride 1040
    for rows in (packed, odd, packed):
        w.write(k_buf, k_buf.clone(), loc, rows, rows, torch.float8_e5m2, None, None)
    assert all(m & MODE_FP8_INT for m in modes) and modes[0] == modes[2]
    modes.clear()
    x = torch.randn(4, 8, 128).to(torch.bfloat16)
    strided = torch.randn(4, 8 * 128 + 16).to(torch.bfloat16)[:, :1024].view(4, 8, 128)
    for rows, scale in ((x, 0.5), (strided, 0.5), (strided, 0.7), (x, 0.5)):
        w.write(k_buf, k_buf.clone(), loc, rows, rows, torch.float8_e4m3fn, scale, scale)
    assert [bool(m & MODE_POW2) for m in modes] == [True, True, False, True] and modes[0] == modes[3]


@needs_interpreter
def test_triton_fused_zero_tokens_writes_nothing():
    w = create_writer("triton_fused")
    k_buf = torch.zeros(8, 1, 4, dtype=torch.bfloat16)
    v_buf = torch.zeros(8, 1, 4, dtype=torch.bfloat16)
    empty = torch.empty(0, 1, 4, dtype=torch.bfloat16)
    assert w.write(k_buf, v_buf, torch.empty(0, dtype=torch.int64), empty, empty, torch.bfloat16) == FUSED
    assert not k_buf.any() and not v_buf.any()


def _masking_case(writer, device: str) -> None:
    """Slots < 0 or >= rows are skipped: nothing outside the buffer, guards intact. On a GPU
    through ``write`` (slot values stay the caller's there); on a CPU, where ``write`` reads
    them and refuses (test below), through ``write_unchecked``: the same kernel."""
    write = writer.write if device == "cuda" else writer.write_unchecked
    rows, guard, heads, dim = 16, 64, 2, 8
    big_k = torch.full((guard + rows + guard, heads, dim), 7, dtype=torch.uint8, device=device)
    big_v = torch.full((guard + rows + guard, heads, dim), 7, dtype=torch.uint8, device=device)
    k_buf, v_buf = big_k[guard:guard + rows], big_v[guard:guard + rows]
    k_buf.zero_()
    v_buf.zero_()
    loc = torch.tensor([3, -1, rows, rows + 5, -rows, 2**40, 5], dtype=torch.int64, device=device)
    k = torch.full((7, heads, dim), 1.0, dtype=torch.bfloat16, device=device)
    v = torch.full((7, heads, dim), 2.0, dtype=torch.bfloat16, device=device)
    assert write(k_buf, v_buf, loc, k, v, torch.float8_e4m3fn, 0.5, 0.5) == FUSED
    assert bool((big_k[:guard] == 7).all()) and bool((big_k[guard + rows:] == 7).all())
    assert bool((big_v[:guard] == 7).all()) and bool((big_v[guard + rows:] == 7).all())
    one = convert_for_cache(k[:1], torch.float8_e4m3fn, 0.5)[0]
    two = convert_for_cache(v[:1], torch.float8_e4m3fn, 0.5)[0]
    for s in (3, 5):
        assert torch.equal(k_buf[s], one) and torch.equal(v_buf[s], two)
    others = [s for s in range(rows) if s not in (3, 5)]
    assert not k_buf[others].any() and not v_buf[others].any()
    loc32 = torch.tensor([-7, rows, 1], dtype=torch.int32, device=device)
    assert write(k_buf, v_buf, loc32, k[:3], v[:3], torch.float8_e4m3fn, 0.5, 0.5) == FUSED
    assert bool((big_k[:guard] == 7).all()) and bool((big_k[guard + rows:] == 7).all())
    assert torch.equal(k_buf[1], one)


@needs_interpreter
def test_triton_fused_masks_out_of_range_slots():
    _masking_case(create_writer("triton_fused"), "cpu")
    k_buf, v_buf = torch.zeros(16, 2, 8, dtype=torch.uint8), torch.zeros(16, 2, 8, dtype=torch.uint8)
    k = torch.ones(2, 2, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="loc has slot 16, outside"):
        create_writer("triton_fused").write(k_buf, v_buf, torch.tensor([3, 16]), k, k, torch.float8_e4m3fn)
    assert not k_buf.any() and not v_buf.any()


# -- what each writer says when it cannot run -------------------------------------------------
def test_triton_fused_reasons(monkeypatch):
    w = create_writer("triton_fused")
    monkeypatch.setattr(tk, "interpreted", lambda: False)
    reason = w.unsupported_reason(torch.device("cpu"), torch.bfloat16)
    assert reason and "TRITON_INTERPRET=1" in reason and "\n" not in reason
    monkeypatch.setattr(tk, "interpreted", lambda: True)
    assert w.unsupported_reason(torch.device("cpu"), torch.bfloat16) is None
    assert "interpreter" in w.unsupported_reason(torch.device("cuda"), torch.bfloat16)
    assert "no conversion" in w.unsupported_reason(torch.device("cpu"), torch.int8)
    monkeypatch.setattr(tf, "triton", None)
    monkeypatch.setattr(triton_convert, "TRITON_ERROR", "ModuleNotFoundError: No module named 'triton'")
    assert w.unsupported_reason(torch.device("cpu"), torch.bfloat16).startswith("triton is not importable")


def test_triton_config_table():
    # a 1x128 bf16 row at one token: 4 tokens x 4 warps (4 elements per thread, 3 tokens masked)
    assert tf.pick_config(512, 1) == tf.TritonConfig(4, 4)
    assert tf.pick_config(512, 32768).block_t > tf.pick_config(512, 1).block_t
    assert tf.pick_config(4 * 4096, 1) == tf.pick_config(4 * 4096, 1, fp8=True) == tf.TritonConfig(1, 8, 4)
    cfg = tf.TritonConfig(8, 4)
    assert tf.TritonFusedWriter(config={"block_t": 8, "num_warps": 4}).config == cfg
    assert cfg.split == 1 and tf.TritonConfig(1, 1, 8).split == 8
    with pytest.raises(ValueError):
        tf.TritonConfig(3, 4)
    with pytest.raises(ValueError):
        tf.TritonConfig(1, 4, 3)


def test_interpreter_launch_shape_is_few_large_programs():
    """Under the interpreter a program is one numpy pass at a fixed cost: one program for every
    token up to 4096 tokens of 1x128 K+V rows (256 elements), fewer tokens for longer rows."""
    assert [tf.interpreted_config(256, t).block_t for t in (1, 10, 64, 512, 4096, 8192)] == \
        [1, 16, 64, 512, 4096, 4096]
    assert tf.interpreted_config(2 * 1024, 4096).block_t == 512  # 8x128 rows: tile capped at 2**20
    assert tf.interpreted_config(1 << 22, 4).block_t == 1
    assert all(tf.interpreted_config(256, t).split == 1 for t in (1, 4096))
    w = tf.TritonFusedWriter()
    assert w.launch_shape(10, 512, 256, False, interpreted=True) == tf.interpreted_config(256, 10)
    assert w.launch_shape(10, 512, 256, False, interpreted=False) == tf.pick_config(512, 10)


@needs_interpreter
@pytest.mark.parametrize("tokens", [1, 10, 64])
def test_interpreter_shape_and_gpu_table_shape_write_the_same_bits(tokens, monkeypatch):
    """The interpreted path takes its own launch shape; the GPU tables' shape for the same
    write, forced, writes the same bits (both equal index_put's)."""
    used = []
    real = tf.interpreted_config
    monkeypatch.setattr(tf, "interpreted_config", lambda *a: used.append(real(*a)) or used[-1])
    case = dict(cache=torch.float8_e4m3fn, inp=torch.bfloat16, heads=1, dim=128, vdim=128, page=1, tokens=tokens,
                pattern="random", loc_dtype=torch.int64, k_scale=0.5, v_scale=2.0, strided=False, magnitude=50.0,
                seed=tokens)
    run_case(case, create_writer("triton_fused"))
    assert used and used[0].block_t >= tokens  # one program over every token
    run_case(case, create_writer("triton_fused", config=tf.pick_config(2 * 128 * 2, tokens, fp8=True)))


def test_triton_missing_is_n_a_with_an_install_hint(monkeypatch):
    monkeypatch.setattr(tf, "triton", None)
    monkeypatch.setattr(triton_convert, "TRITON_ERROR", "ModuleNotFoundError: No module named 'triton'")
    reason = tf.TritonFusedWriter().unsupported_reason(torch.device("cpu"), torch.bfloat16)
    assert reason and "No module named 'triton'" in reason and "pip install -e '.[triton]'" in reason


def test_pow2_shortcut_only_for_exact_powers_of_two():
    assert all(pow2_exact(x) for x in (1.0, 0.5, 2.0, 2.0**-99, 2.0**99))
    assert not any(pow2_exact(x) for x in (0.0, 3.0, 0.37, float("inf"), float("nan"), 1.0000001))
    # extreme powers of two take the round trip: 464 / inv must stay a normal bf16 for the
    # packed fp8 fix-up's overflow bound
    assert not any(pow2_exact(x) for x in (2.0**-126, 2.0**127, 2.0**-149))


@needs_interpreter
@pytest.mark.parametrize("cache,inp", [(torch.float8_e4m3fn, torch.float32), (torch.float8_e5m2, torch.float32),
                                       (torch.float32, torch.float8_e4m3fn), (torch.float32, torch.float8_e5m2)])
def test_triton_hw_path_with_integer_fp8_codec_in_interpreter(cache, inp):
    """The GPU path's plumbing for layouts that avoid Triton's fp8 cast (FP8_INT): with fp32
    on the other side every step is exact in the interpreter too, so it must match torch."""
    case = dict(cache=cache, inp=inp, heads=1, dim=20, vdim=20, page=1, tokens=13, pattern="random",
                loc_dtype=torch.int32, k_scale=0.37, v_scale=3.0, strided=False, magnitude=100.0, seed=0)
    run_case(case, create_writer("triton_fused", convert="hw"))


def test_fp8_cast_only_on_layouts_checked_against_triton_3_6_ptxas():
    """Triton's packed fp8 cast is used only where its SASS was checked (see _fp8_cast_safe);
    the H200 failure case (1x20 rows, 4 tokens x 2 warps) takes the integer encode."""
    assert not tk.fp8_cast_safe(20, 20, 20, 20, 4, 2, 32, 32)
    assert not tk.fp8_cast_safe(128, 128, 136, 136, 16, 4, 128, 128)  # token stride not a multiple of 16
    assert not tk.fp8_cast_safe(16, 16, 16, 16, 4, 2, 16, 16)  # 1 element per thread
    for rk, bt, nw in ((128, 1, 1), (128, 4, 2), (128, 16, 4), (1024, 1, 4), (1024, 2, 4), (4096, 1, 8)):
        assert tk.fp8_cast_safe(rk, rk, rk, rk, bt, nw, rk, rk)
    from kvprof.kvcache.writers.triton_tables import STORE_TABLES

    for card in STORE_TABLES:  # every card's fp8 table: its own choices for the common shapes
        for rk in (128, 1024, 4096):
            for tokens in (1, 8, 64, 512, 4096, 32768):
                cfg = tf.pick_config(2 * rk * 2, tokens, fp8=True, card=card)
                chunk = rk // cfg.split
                assert tk.fp8_cast_safe(rk, rk, rk, rk, cfg.block_t, cfg.num_warps, chunk, chunk), (card, rk, tokens,
                                                                                                      cfg)


@needs_interpreter
def test_store_kv_fused_on_cpu_is_the_triton_path():
    """Without CUDA the one fused variant runs the portable Triton kernel, and says so."""
    w = create_writer("store_kv_fused")
    assert w.unsupported_reason(torch.device("cpu"), torch.bfloat16) is None
    assert w.kernel_for(torch.device("cpu"), captured=False) == "triton_fused"
    case = dict(cache=torch.float8_e4m3fn, inp=torch.bfloat16, heads=2, dim=64, vdim=64, page=1, tokens=9,
                pattern="random", loc_dtype=torch.int64, k_scale=0.5, v_scale=0.37, strided=False,
                magnitude=10.0, seed=1)
    run_case(case, w)


def test_store_kv_fused_reason_names_both_paths(monkeypatch):
    """Unsupported only when neither kernel can run, and then the reason names both."""
    w = create_writer("store_kv_fused")
    monkeypatch.setattr(tf, "triton", None)
    monkeypatch.setattr(triton_convert, "TRITON_ERROR", "ModuleNotFoundError: No module named 'triton'")
    monkeypatch.setattr(cf, "load_extension", lambda: (None, "no CUDA compiler (nvcc) found"))
    reason = w.unsupported_reason(torch.device("cuda"), torch.bfloat16)
    assert reason == (f"triton is not importable (ModuleNotFoundError: No module named 'triton'): {tf.INSTALL_HINT}; "
                      "and no CUDA compiler (nvcc) found")
    monkeypatch.setattr(cf, "load_extension", lambda: (object(), None))  # the op built: eager path works
    assert w.unsupported_reason(torch.device("cuda"), torch.bfloat16) is None


def test_cuda_fused_reason_on_cpu():
    w = create_writer("cuda_fused")
    assert w.unsupported_reason(torch.device("cpu"), torch.bfloat16) == "cuda_fused needs CUDA"
    if not torch.cuda.is_available():
        reason = w.unsupported_reason(torch.device("cuda"), torch.bfloat16)
        assert reason and "CUDA" in reason and "\n" not in reason


def test_cuda_fused_zero_tokens_launches_nothing():
    """Its own path (as a pool calls it) needs no op for zero tokens; its public write refuses
    a CPU call first (cuda_fused needs CUDA)."""
    w = create_writer("cuda_fused")
    k_buf, v_buf = torch.zeros(4, 1, 2), torch.zeros(4, 1, 2)
    empty = torch.empty(0, 1, 2)
    assert w.write_unchecked(k_buf, v_buf, torch.empty(0, dtype=torch.int32), empty, empty, torch.float32) == FUSED
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cuda_fused cannot take this call: "):
            w.write(k_buf, v_buf, torch.empty(0, dtype=torch.int32), empty, empty, torch.float32)


@pytest.mark.parametrize("module", ["cuda_fused", "layout_cuda"])
def test_cuda_op_build_problems_are_one_line(monkeypatch, tmp_path, module):
    """Both compiled ops (kvprof.kvcache.cuda_build): no nvcc
    or a failing build, is one line naming the log."""
    import importlib

    from kvprof.kvcache import cuda_build as cb

    op = importlib.import_module(f"kvprof.kvcache.writers.{module}")._OP
    monkeypatch.setattr(op, "module", None)
    monkeypatch.setattr(op, "error", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cb, "find_nvcc", lambda: None)
    assert op.load() == (None, "no CUDA compiler (nvcc) found")
    assert op.load() == (None, "no CUDA compiler (nvcc) found")  # decided once per process

    monkeypatch.setattr(op, "error", None)
    monkeypatch.setattr(cb, "find_nvcc", lambda: "/usr/bin/nvcc")
    monkeypatch.setattr(cb, "arch_flags", lambda: ["-gencode=arch=compute_90,code=sm_90"])
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    import torch.utils.cpp_extension as cpp

    seen = {}

    def failing_load(**kwargs):
        seen.update(kwargs)
        os.write(1, b"nvcc error: something long\n" * 50)  # as ninja writes, to fd 1
        raise RuntimeError(f"Error building extension '{op.name}'\nlots\nof\nlines")

    monkeypatch.setattr(cpp, "load", failing_load)
    ext, reason = op.load()
    assert ext is None and "\n" not in reason
    assert reason.startswith(f"{op.label} build failed (RuntimeError: Error building extension")
    assert str(tmp_path) in reason and reason.endswith("build.log")
    assert "nvcc error" in (op.build_dir() / "build.log").read_text()
    assert seen["name"] == op.name and seen["build_directory"] == str(op.build_dir())
    assert seen["extra_cuda_cflags"][:2] == ["-O3", "-gencode=arch=compute_90,code=sm_90"]
    assert all(Path(s).is_file() for s in seen["sources"])  # the op's own .cpp and .cu, shipped in the package
    if module == "cuda_fused":
        assert cf.build_dir() == op.build_dir() and cf.load_extension() == (None, reason)


# -- GPU: the compiled kernels (run on the H200 with TRITON_INTERPRET=0) ----------------------
GPU_WRITERS = [
    ("triton_fused", {}),
    ("triton_fused", {"convert": "int"}),
    ("triton_fused", {"pdl": False}),
    ("triton_fused", {"config": {"block_t": 2, "num_warps": 1, "split": 4}}),
    ("cuda_fused", {}),
    ("cuda_fused", {"pdl": True}),
    ("cuda_fused", {"pdl": False, "hw_fp8": False}),  # c10's integer fp8 routine
    ("store_kv_fused", {}),
]


def _gpu_writer(name: str, options: dict):
    if name in ("triton_fused", "store_kv_fused") and (tf.triton is None or tk.interpreted()):
        pytest.skip(f"{name} GPU tests need TRITON_INTERPRET=0")
    w = create_writer(name, **options)
    reason = w.unsupported_reason(torch.device("cuda"), torch.bfloat16)
    if reason:
        pytest.fail(f"{name} cannot run on this GPU: {reason}")
    return w


@pytest.mark.gpu
@pytest.mark.parametrize("name,options", GPU_WRITERS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(case=write_cases(max_tokens=5000))
def test_gpu_fused_matches_index_put(name, options, case):
    run_case(case, _gpu_writer(name, options), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("name,options", [*GPU_WRITERS,
                                          ("triton_fused", {"config": {"block_t": 1, "num_warps": 8, "split": 4,
                                                                       "stream": True}})])
@pytest.mark.parametrize("heads,dim,tokens", [(1, 128, 32768), (8, 128, 4096), (32, 128, 257), (5, 96, 999)])
@pytest.mark.parametrize("cache,inp", [(torch.bfloat16, torch.bfloat16), (torch.float8_e4m3fn, torch.bfloat16)])
def test_gpu_fused_large_writes(name, options, heads, dim, tokens, cache, inp):
    case = dict(cache=cache, inp=inp, heads=heads, dim=dim, vdim=dim, page=1, tokens=tokens, pattern="random",
                loc_dtype=torch.int32, k_scale=0.5 if inp != cache else None, v_scale=0.5 if inp != cache else None,
                strided=False, magnitude=100.0, seed=3)
    run_case(case, _gpu_writer(name, options), "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("config", [None, {"block_t": 1, "num_warps": 1}, {"block_t": 4, "num_warps": 2},
                                    {"block_t": 16, "num_warps": 4}, {"block_t": 1, "num_warps": 1, "split": 4}])
@pytest.mark.parametrize("dim", [20, 16, 128])
@pytest.mark.parametrize("scale", [None, 0.5])
def test_gpu_triton_small_rows_fp8(pdl, config, dim, scale):
    """Regression: on the H200 (torch 2.11, triton 3.6) hypothesis found triton_fused writing
    0xFC into odd elements of a 1x20 fp8 e4m3 row from bf16 input (4 tokens x 2 warps): the
    ptxas bundled with Triton 3.6 merges the stack pointer R1 into Triton's packed fp8 cast
    when a thread holds its elements in pairs (see _fp8_cast_safe). Such layouts now take the
    integer encode. The message lists the differing elements with their inputs."""
    w = _gpu_writer("triton_fused", {"pdl": pdl, "config": config})
    g = torch.Generator().manual_seed(0)
    k = make_rows(13, 1, dim, torch.bfloat16, 1.0, g, "cuda", False)
    k_buf = torch.zeros(64, 1, dim, dtype=torch.uint8, device="cuda")
    v_buf = torch.zeros_like(k_buf)
    loc = torch.arange(1, 14, device="cuda", dtype=torch.int32)
    w.write(k_buf, v_buf, loc, k, k, torch.float8_e4m3fn, scale, scale)
    ref = convert_for_cache(k, torch.float8_e4m3fn, scale)
    for got in (k_buf[1:14], v_buf[1:14]):
        nan_ref, nan_got = nan_mask(ref, torch.float8_e4m3fn), nan_mask(got, torch.float8_e4m3fn)
        bad = ((ref != got) & ~(nan_ref & nan_got)).nonzero().tolist()
        detail = [(tuple(i), float(k[tuple(i)]), hex(int(ref[tuple(i)])), hex(int(got[tuple(i)]))) for i in bad[:8]]
        assert not bad, f"{len(bad)} elements differ (index, input, ref, got): {detail}"


@pytest.mark.gpu
@pytest.mark.parametrize("name,options", GPU_WRITERS)
def test_gpu_fused_masks_out_of_range_slots(name, options):
    _masking_case(_gpu_writer(name, options), "cuda")


def _writer_convert(writer, x: torch.Tensor, dtype: torch.dtype, scale, dim: int) -> torch.Tensor:
    """Convert every element of x through a writer: tokens of one row of ``dim`` elements."""
    n = x.numel() // dim
    x = x[: n * dim].reshape(n, 1, dim)
    k_buf = torch.zeros((n, 1, dim), dtype=store_dtype_for(dtype), device=x.device)
    v_buf = torch.zeros_like(k_buf)
    loc = torch.arange(n, device=x.device)
    writer.write(k_buf, v_buf, loc, x, x, dtype, scale, scale)
    return k_buf


@pytest.mark.gpu
@pytest.mark.parametrize("name,options", [(n, o) for n, o in GPU_WRITERS if n == "cuda_fused"])
@pytest.mark.parametrize("src", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("dst", CACHE_DTYPES)
def test_gpu_conversions_exhaustive(name, options, src, dst):
    """Every bf16/fp16 bit pattern (and random/edge fp32) on the vector and the scalar path."""
    w = _gpu_writer(name, options)
    x = all_16bit(src, "cuda") if src != torch.float32 else special_fp32(1 << 16, 5, "cuda")[: 1 << 16]
    for scale in SCALES_FP8 if dst in FP8 else SCALES_OTHER:
        ref = convert_for_cache(x, dst, scale)
        for dim in (8, 1):
            got = _writer_convert(w, x, dst, scale, dim).reshape(-1)
            assert_same_bits(ref[: got.numel()], got, dst, f"{name}{options} {src}->{dst} scale={scale} dim={dim}")


@pytest.mark.gpu
@pytest.mark.parametrize("hw", [True, False])
@pytest.mark.parametrize("src", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dst", CACHE_DTYPES)
def test_gpu_triton_convert_kernel_exhaustive(hw, src, dst):
    if tf.triton is None or tk.interpreted():
        pytest.skip("needs TRITON_INTERPRET=0")
    x = all_16bit(src, "cuda")
    for scale in SCALES_FP8 if dst in FP8 else SCALES_OTHER:
        _check_conversion(x, dst, scale, hw=hw)


@pytest.mark.gpu
@pytest.mark.parametrize("name,options", GPU_WRITERS)
def test_gpu_fused_in_cuda_graph(name, options):
    """Captured once, replayed with new slots and rows: the same bits as index_put."""
    w = _gpu_writer(name, options)
    heads, dim, size, tokens = 1, 128, 4096, 64
    ref = KVPool(size, 1, torch.float8_e4m3fn, heads, dim, 1, "cuda", writer=create_writer("index_put"))
    pool = KVPool(size, 1, torch.float8_e4m3fn, heads, dim, 1, "cuda", writer=w, check_slots=False)
    loc = torch.zeros(tokens, dtype=torch.int64, device="cuda")
    k = torch.zeros(tokens, heads, dim, dtype=torch.bfloat16, device="cuda")
    v = torch.zeros_like(k)
    pool.set_kv_buffer(0, loc, k, v, 0.5, 0.5)  # warm-up (compiles outside capture)
    pool.k_buffer[0].zero_()
    pool.v_buffer[0].zero_()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        pool.set_kv_buffer(0, loc, k, v, 0.5, 0.5)
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        loc.copy_(torch.randperm(size, generator=g)[:tokens] + 1)
        k.copy_(torch.randn(tokens, heads, dim, generator=g) * 100)
        v.copy_(torch.randn(tokens, heads, dim, generator=g))
        graph.replay()
        ref.set_kv_buffer(0, loc, k, v, 0.5, 0.5)
    torch.cuda.synchronize()
    assert torch.equal(ref.k_buffer[0], pool.k_buffer[0]) and torch.equal(ref.v_buffer[0], pool.v_buffer[0])


@pytest.mark.gpu
@pytest.mark.parametrize("name,options", GPU_WRITERS)
def test_gpu_fused_rows_not_contiguous_inside(name, options):
    """Rows whose heads are not adjacent (a [heads, tokens, dim] tensor transposed) are copied
    by the writer, not rejected, and land bitwise as index_put writes them."""
    w = _gpu_writer(name, options)
    g = torch.Generator().manual_seed(5)
    k = (torch.randn(4, 9, 64, generator=g) * 10).to(torch.bfloat16).cuda().transpose(0, 1)
    v = (torch.randn(4, 9, 64, generator=g)).to(torch.bfloat16).cuda().transpose(0, 1)
    assert not k.is_contiguous() and k.stride(1) != 64
    loc = torch.randperm(40, generator=g)[:9].cuda() + 1
    for cache in (torch.bfloat16, torch.float8_e4m3fn):
        bufs = [torch.zeros(41, 4, 64, dtype=store_dtype_for(cache), device="cuda") for _ in range(4)]
        create_writer("index_put").write(bufs[0], bufs[1], loc, k, v, cache, 0.5, 0.5)
        assert w.write(bufs[2], bufs[3], loc, k, v, cache, 0.5, 0.5) == FUSED
        assert torch.equal(bufs[0], bufs[2]) and torch.equal(bufs[1], bufs[3]), (name, options, cache)


@pytest.mark.gpu
def test_gpu_store_kv_fused_picks_the_op_eagerly_and_triton_when_captured():
    w = _gpu_writer("store_kv_fused", {})
    dev = torch.device("cuda")
    assert w.kernel_for(dev, captured=False) == "cuda_fused"
    assert w.kernel_for(dev, captured=True) == "triton_fused"
    calls = []
    for inner in (w.cuda, w.triton):  # store_kv_fused calls its inner writers' own write (it checked)
        orig = inner.write_unchecked
        inner.write_unchecked = lambda *a, orig=orig, name=inner.name, **k: (calls.append(name), orig(*a, **k))[1]
    k = torch.randn(4, 1, 128, device="cuda").to(torch.bfloat16)
    buf = torch.zeros(16, 1, 128, dtype=torch.bfloat16, device="cuda")
    loc = torch.arange(1, 5, device="cuda")
    w.write(buf, buf.clone(), loc, k, k, torch.bfloat16)
    w.triton.write_unchecked(buf, buf.clone(), loc, k, k, torch.bfloat16)  # compile outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.write(buf, buf.clone(), loc, k, k, torch.bfloat16)
    assert calls == ["cuda_fused", "triton_fused", "triton_fused"]


@pytest.mark.gpu
def test_gpu_nan_inputs_stay_nan():
    """NaN in, NaN out (bits not compared: torch has no single NaN encoding to match)."""
    x = torch.tensor([float("nan"), -float("nan"), 1.0], device="cuda").to(torch.bfloat16)
    x = x.repeat(64).reshape(-1, 1, 8)
    for name, options in GPU_WRITERS:
        if name == "triton_fused" and tk.interpreted():
            continue
        w = create_writer(name, **options)
        for dst in CACHE_DTYPES:
            if dst == torch.bfloat16:
                continue
            buf = torch.zeros((x.shape[0], 1, 8), dtype=store_dtype_for(dst), device="cuda")
            w.write(buf, buf.clone(), torch.arange(x.shape[0], device="cuda"), x, x, dst, 0.5, 0.5)
            ref = convert_for_cache(x, dst, 0.5)
            assert torch.equal(nan_mask(buf, dst), nan_mask(ref, dst)), (name, options, dst)
    warnings.warn("NaN bit patterns were not compared (see the module docstring)", stacklevel=1)


def test_gpu_test_list_is_consistent():
    assert all(n in ("triton_fused", "cuda_fused", "store_kv_fused") for n, _ in GPU_WRITERS)
    assert not math.isnan(cached_inverse(0.5))


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [None, 0.5, 2.0, 7.3, 1 / 448])
@pytest.mark.parametrize("heads,dim,tokens", [(8, 128, 1), (32, 128, 8), (1, 128, 4096)])
def test_gpu_packed_fp8_fixup_is_on_and_gives_tritons_bits(scale, heads, dim, tokens):
    """bf16 -> e4m3fn under torch 2.11's rule takes the packed fix-up by default
    (MODE bit 14); Triton's per-element fix-up (packed_fp8=False) writes the same bytes, and
    both match index_put, including overflow (|x| * inv > 464) of either sign."""
    if tf.triton is None or tk.interpreted():
        pytest.skip("needs TRITON_INTERPRET=0")
    g = torch.Generator().manual_seed(tokens)
    k = (torch.randn(tokens, heads, dim, generator=g) * 300).to(torch.bfloat16).cuda()
    k.view(-1)[:8] = torch.tensor([464, -464, 465, -470, 928, -1e4, 232, -233], dtype=torch.bfloat16)
    loc = (torch.randperm(8191, generator=g)[:tokens] + 1).cuda()
    outs = []
    for packed in (True, False):
        w = tf.TritonFusedWriter(packed_fp8=packed)
        k_buf = torch.zeros(8192, heads, dim, dtype=torch.uint8, device="cuda")
        v_buf = torch.zeros_like(k_buf)
        w.write(k_buf, v_buf, loc, k, k, torch.float8_e4m3fn, scale, scale)
        (plan,) = w._plans.values()
        assert bool(plan[6] & tk.MODE_PACKED) == (packed and not tf.e4m3_saturates())
        outs.append(k_buf[loc])
    ref = convert_for_cache(k, torch.float8_e4m3fn, scale)
    assert_same_bits(ref, outs[0], torch.float8_e4m3fn, f"packed scale={scale}")
    assert torch.equal(outs[0], outs[1])


# -- where a Triton writer's kernel can run -----------------------------------------------------
@pytest.mark.parametrize(("device", "interpreted", "env", "pdl", "expected"), [
    ("cpu", True, "1", None, None),
    ("cuda", False, None, True, None),
    ("cpu", False, None, None, "mla_triton on CPU runs in Triton's interpreter: set TRITON_INTERPRET=1 before "
     "kvprof.kvcache.writers.mla_triton is imported (kvprof capture sets it when it is unset, before any writer is "
     "imported)"),
    ("cpu", False, "1", None, "(it is set now, but was not at import)"),
    ("cpu", False, "0", None, "(TRITON_INTERPRET=0 is set, which turns the interpreter off)"),
    ("cuda", True, "1", True, "mla_triton was imported with TRITON_INTERPRET=1: its kernel would run in the "
     "interpreter on the host, not on the GPU (unset it, or set TRITON_INTERPRET=0)"),
    ("cpu", True, "1", True, "mla_triton(pdl=True) needs the compiled kernel on a CUDA device"),
])
def test_placement_reason_is_one_rule_for_every_triton_writer(monkeypatch, device, interpreted, env, pdl, expected):
    from kvprof.kvcache.writers.fp8_jit import placement_reason

    if env is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", env)
    got = placement_reason("mla_triton", "kvprof.kvcache.writers.mla_triton", interpreted, torch.device(device), pdl)
    if expected is None:
        assert got is None
    else:
        assert got is not None and got.endswith(expected) and "\n" not in got


@pytest.mark.skipif(tf.triton is None, reason="triton is not installed")
@pytest.mark.parametrize(("layout", "name"), [("mha", "triton_fused"), ("mla", "mla_triton"),
                                              ("paged", "paged_triton")])
def test_triton_writers_refuse_pdl_on_a_cpu_with_the_shared_reason(layout, name):
    from kvprof.kvcache.layouts import registry

    writer = create_writer(name, pdl=True) if layout == "mha" else registry.create_writer(layout, name, pdl=True)
    dtype = torch.bfloat16
    reason = writer.unsupported_reason(torch.device("cpu"), dtype)
    assert reason == f"{name}(pdl=True) needs the compiled kernel on a CUDA device" or (
        not tk.interpreted() and reason is not None
        and reason.startswith(f"{name} on CPU runs in Triton's interpreter"))


@pytest.mark.parametrize("layout, name, module", [("mha", "triton_fused", "triton_fused"),
                                                  ("mha", "rope_triton_fused", "rope_triton"),
                                                  ("mla", "mla_triton", "mla_triton"),
                                                  ("paged", "paged_triton", "paged_triton")])
def test_every_triton_writer_names_the_install_without_triton(monkeypatch, layout, name, module):
    """Without triton each layout's Triton writer gives the same reason: the import error and the extra to install."""
    import importlib

    monkeypatch.setattr(importlib.import_module(f"kvprof.kvcache.writers.{module}"), "triton", None)
    monkeypatch.setattr(triton_convert, "TRITON_ERROR", "ModuleNotFoundError: No module named 'triton'")
    reason = create_writer(name, layout=layout).unsupported_reason(torch.device("cpu"), torch.bfloat16)
    hint = triton_convert.INSTALL_HINT
    assert reason == f"triton is not importable (ModuleNotFoundError: No module named 'triton'): {hint}"
