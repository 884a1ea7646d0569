"""kvprof's rope writers (rope + K/V store) against the float32 reference.

Tolerance, and why: none. The writers rotate in fp32 -- ``x * cos - y * sin`` and
``x * sin + y * cos``, each product and sum rounded to fp32, as the reference computes them
-- and round once, to nearest even, to q/k's dtype. Under Triton's interpreter those are
numpy's fp32 operations; the compiled kernel is launched with fp fusion off, so no fused
multiply-add changes an fp32 result (``gpu/rope_sass_offline.py`` counts FFMA: 0). So q and k
must equal the float32 reference rounded to their dtype, bit for bit, on CPU and GPU alike.
A kernel that contracts into FMAs (SGLang's, compiled by nvcc) would be within one ulp of the
output dtype instead. What is stored is exact too: the K cache holds the rotated k as written
back to k, converted as ``convert_for_cache`` converts it, the V cache ``convert_for_cache(v)``.

GPU runs (``-m gpu``) need the compiled kernel: ``TRITON_INTERPRET=0``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from kvprof.core.vocab import FUSED, ROPE_FUSED, TWO_COPIES, TWO_STREAMS, is_fused_path, is_rope_fused_path
from kvprof.kvcache.contracts import check_rope_inputs
from kvprof.kvcache.dtypes import convert_for_cache, store_dtype_for
from kvprof.kvcache.writers import rope_triton as rt, rope_triton_kernel as rk
from kvprof.kvcache.writers.rope_reference import cos_sin_table, rope_reference
from kvprof.kvcache.writers.rope_tables import RopeConfig, interpreted_rope_config, pick_rope_config

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy overflow in the interpreter

needs_interpreter = pytest.mark.skipif(rt.triton is None or not rk.interpreted(),
                                       reason="the rope kernel on CPU needs TRITON_INTERPRET=1 at import")
needs_compiled = pytest.mark.skipif(rt.triton is None or rk.interpreted(),
                                    reason="GPU tests need the compiled kernel: run with TRITON_INTERPRET=0")
MAX_POS = 64
INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT_OF[t.element_size()])


def make_case(device="cpu", tokens=5, hq=4, hk=2, dim=32, v_dim=None, rope_dim=None, dtype=torch.bfloat16,
              q_dtype=None, rows=24, pos_dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    v_dim = v_dim or dim
    q = torch.randn(tokens, hq, dim, generator=g).to(q_dtype or dtype).to(device)
    k = torch.randn(tokens, hk, dim, generator=g).to(dtype).to(device)
    v = (torch.randn(tokens, hk, v_dim, generator=g) * 4).to(dtype).to(device)
    cs = cos_sin_table(MAX_POS, rope_dim or dim).to(device)
    pos = torch.randint(0, MAX_POS, (tokens,), generator=g).to(pos_dtype).to(device)
    loc = (torch.randperm(rows - 1, generator=g)[:tokens] + 1).to(device)  # distinct, never the dummy slot 0
    return q, k, v, cs, pos, loc


def buffers(rows, hk, dim, v_dim, cache_dtype, device="cpu"):
    store = store_dtype_for(cache_dtype)
    return (torch.zeros(rows, hk, dim, dtype=store, device=device),
            torch.zeros(rows, hk, v_dim, dtype=store, device=device))


def assert_rotated(out: torch.Tensor, ref: torch.Tensor) -> None:
    """``out`` (the kernel's q or k) is the float32 reference rounded to its dtype, bitwise."""
    rounded = ref.to(out.dtype)
    assert torch.equal(bits(out.cpu()), bits(rounded.cpu())), (out.float().cpu() - ref.cpu()).abs().max()


def run_and_check(writer, device, cache_dtype=torch.bfloat16, is_neox=True, k_scale=None, v_scale=None,
                  loc_view=None, pos_view=None, v_view=None, **shape):
    q, k, v, cs, pos, loc = make_case(device, **shape)
    if v_view is not None:
        v = v_view(v)
    if loc_view is not None:
        loc = loc_view(loc)
    if pos_view is not None:
        pos = pos_view(pos)
    rows = shape.get("rows", 24)
    k_buf, v_buf = buffers(rows, k.shape[1], k.shape[2], v.shape[2], cache_dtype, device)
    q0, k0, v0 = q.clone(), k.clone(), v.clone()
    rq, rkey = rope_reference(q0, k0, cs, pos, is_neox)
    path = writer.write(q, k, v, k_buf, v_buf, loc, pos, cs, is_neox, cache_dtype, k_scale, v_scale)
    assert_rotated(q, rq)
    assert_rotated(k, rkey)
    assert torch.equal(v, v0)  # v is only read
    want_k = convert_for_cache(k, cache_dtype, k_scale)  # the rotated k as written back, converted
    want_v = convert_for_cache(v0, cache_dtype, v_scale)
    assert torch.equal(bits(k_buf[loc]), bits(want_k)), "K cache rows differ from convert_for_cache(rotated k)"
    assert torch.equal(bits(v_buf[loc]), bits(want_v)), "V cache rows are not bit-exact"
    untouched = torch.ones(rows, dtype=torch.bool, device=device)
    untouched[loc] = False
    assert not bits(k_buf[untouched]).any() and not bits(v_buf[untouched]).any(), "a row outside loc was written"
    return path


WRITERS = {
    "rope_triton_fused": lambda: rt.RopeTritonFusedWriter(),
    "rope_then_triton_fused": lambda: rt.RopeThenTritonFusedWriter(),
    "rope_then_two_stream": lambda: rt.RopeThenTwoStreamWriter(),
}


# -- CPU (Triton's interpreter) ----------------------------------------------------------------
@needs_interpreter
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("rope_dim", [32, 16, 12], ids=["full", "half", "partial12"])
def test_fused_rotates_and_stores(is_neox, rope_dim):
    assert run_and_check(rt.RopeTritonFusedWriter(), "cpu", is_neox=is_neox, rope_dim=rope_dim) == ROPE_FUSED


@needs_interpreter
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_fused_other_input_dtypes(dtype):
    run_and_check(rt.RopeTritonFusedWriter(), "cpu", dtype=dtype, cache_dtype=dtype, is_neox=False, rope_dim=16)


@needs_interpreter
def test_fused_q_dtype_and_v_head_dim_of_their_own():
    """fp32 q with bf16 k (rounded each to its own dtype), and V rows narrower than K's."""
    run_and_check(rt.RopeTritonFusedWriter(), "cpu", q_dtype=torch.float32, v_dim=16, hq=3, hk=1)


@needs_interpreter
@pytest.mark.parametrize("cache_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("scales", [(None, None), (0.37, 3.0), (0.5, 0.25)], ids=["unscaled", "scaled", "pow2"])
def test_fused_fp8_caches_match_convert_for_cache(cache_dtype, scales):
    """The quantised rows are convert_for_cache of the rounded rotated k and of v, bitwise;
    v is scaled x4 so some values overflow e4m3 and exercise its overflow rule."""
    k_scale, v_scale = scales
    run_and_check(rt.RopeTritonFusedWriter(), "cpu", cache_dtype=cache_dtype, k_scale=k_scale, v_scale=v_scale,
                  rope_dim=16, is_neox=k_scale != 0.5)


@needs_interpreter
def test_fused_fp8_with_tensor_scales_and_fp16_inputs():
    run_and_check(rt.RopeTritonFusedWriter(), "cpu", dtype=torch.float16, cache_dtype=torch.float8_e4m3fn,
                  k_scale=torch.tensor(0.7), v_scale=torch.tensor([1.9]))


@needs_interpreter
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_strided_loc_and_positions_write_the_right_rows(pos_dtype):
    """loc and positions read with their own strides (every other element of a longer tensor):
    a kernel that read them as contiguous would write other rows with other positions."""
    run_and_check(rt.RopeTritonFusedWriter(), "cpu", pos_dtype=pos_dtype,
                  loc_view=lambda t: torch.stack([t, torch.zeros_like(t)], 1).reshape(-1)[::2],
                  pos_view=lambda t: torch.stack([t, t.flip(0)], 1).reshape(-1)[::2])


@needs_interpreter
def test_one_writer_follows_each_call_s_scales_strides_and_dtypes():
    """The launch is memoised per call key (shapes, strides, dtypes, which scales are given),
    the scales' values read per call: one writer called in turn with what changes between an
    engine's calls of one shape -- scales given or not, power-of-two or not, a tensor scale, a
    v whose head dim is strided, another cache dtype -- writes each call's rows as the
    reference does."""
    w = rt.RopeTritonFusedWriter()
    strided_v = (lambda t: torch.stack([t, t], -1).reshape(*t.shape[:-1], -1)[..., ::2])  # noqa: E731
    e4m3 = torch.float8_e4m3fn
    calls = [dict(), dict(cache_dtype=e4m3, k_scale=0.5, v_scale=0.5), dict(cache_dtype=e4m3, k_scale=0.7),
             dict(cache_dtype=e4m3), dict(cache_dtype=e4m3, k_scale=0.5, v_scale=0.25, v_view=strided_v),
             dict(cache_dtype=e4m3, k_scale=torch.tensor(0.7), v_scale=0.5),
             dict(v_view=strided_v), dict(cache_dtype=torch.float16), dict()]
    for call in calls:
        assert run_and_check(w, "cpu", rope_dim=16, **call) == ROPE_FUSED
    # the last call's key is the first's; the tensor scale's (not a power of two) is the 0.5/0.5 call's
    assert len(w.kernel._calls) == 7


@needs_interpreter
def test_q_and_k_as_views_of_one_qkv_tensor_are_rotated_in_place():
    """Engines pass q, k and v as views of one [T, (Hq + 2 Hk) * D] projection output."""
    tokens, hq, hk, dim = 4, 4, 2, 32
    qkv = torch.randn(tokens, (hq + 2 * hk) * dim).to(torch.bfloat16)
    q, k, v = (t.view(tokens, -1, dim) for t in qkv.split([hq * dim, hk * dim, hk * dim], dim=1))
    before = qkv.clone()
    cs = cos_sin_table(MAX_POS, dim)
    pos = torch.arange(tokens) * 7
    loc = torch.tensor([3, 9, 1, 5])
    k_buf, v_buf = buffers(12, hk, dim, dim, torch.bfloat16)
    rq, rkey = rope_reference(q.clone(), k.clone(), cs, pos, True)
    rt.RopeTritonFusedWriter().write(q, k, v, k_buf, v_buf, loc, pos, cs, True, torch.bfloat16)
    assert_rotated(q, rq)
    assert_rotated(k, rkey)
    assert torch.equal(qkv[:, (hq + hk) * dim:], before[:, (hq + hk) * dim:])  # v untouched
    assert torch.equal(k_buf[loc], k) and torch.equal(v_buf[loc], v)


@needs_interpreter
@pytest.mark.parametrize("name", ["rope_then_triton_fused", "rope_then_two_stream"])
def test_separate_writers_match_the_fused_one_bitwise(name):
    """Same rotary kernel, then the store: the cache and q/k equal the fused writer's."""
    writer = WRITERS[name]()
    assert not writer.rope_fused and writer.info().extra["rope"] == "separate"
    path = run_and_check(writer, "cpu", cache_dtype=torch.float8_e4m3fn, k_scale=0.8, v_scale=1.3, rope_dim=16)
    assert path == {"rope_then_triton_fused": FUSED, "rope_then_two_stream": TWO_COPIES}[name]  # the store's path
    q, k, v, cs, pos, loc = make_case()
    outs = []
    for w in (writer, rt.RopeTritonFusedWriter()):
        qq, kk, kb_vb = q.clone(), k.clone(), buffers(24, 2, 32, 32, torch.float8_e4m3fn)
        w.write(qq, kk, v, *kb_vb, loc, pos, cs, False, torch.float8_e4m3fn, 0.8, 1.3)
        outs.append((qq, kk, *kb_vb))
    for a, b in zip(*outs):
        assert torch.equal(bits(a), bits(b))


@needs_interpreter
def test_rope_then_any_registered_store_and_its_name():
    writer = rt.RopeThenStoreWriter("index_put")
    assert writer.name == "rope_then_store" and writer.info().extra["store"] == "index_put"
    run_and_check(writer, "cpu", cache_dtype=torch.float16, dtype=torch.float16)


@needs_interpreter
def test_slots_outside_the_cache_are_refused_on_a_cpu_and_skipped_by_the_kernel():
    """On a CPU the writer reads the slots (no device sync) and refuses one outside the cache
    before anything is rotated; its kernel, where the slots stay the caller's (a GPU), masks
    such a row: driven here through ``write_unchecked``, the same launch."""
    q, k, v, cs, pos, loc = make_case(tokens=3)
    loc = torch.tensor([2, 24, -1])  # rows = 24: the last two are outside
    k_buf, v_buf = buffers(24, 2, 32, 32, torch.bfloat16)
    q0, k0 = q.clone(), k.clone()
    with pytest.raises(ValueError, match="loc has slot -1, outside"):
        rt.RopeTritonFusedWriter().write(q, k, v, k_buf, v_buf, loc, pos, cs, True, torch.bfloat16)
    assert torch.equal(q, q0) and torch.equal(k, k0) and not k_buf.any() and not v_buf.any()
    rt.RopeTritonFusedWriter().write_unchecked(q, k, v, k_buf, v_buf, loc, pos, cs, True, torch.bfloat16)
    assert torch.equal(k_buf[2], k[0]) and torch.equal(v_buf[2], v[0])
    k_buf[2] = 0
    v_buf[2] = 0
    assert not k_buf.any() and not v_buf.any()
    empty = torch.empty(0, 4, 32, dtype=torch.bfloat16)
    assert rt.RopeTritonFusedWriter().write(empty, empty[:, :2], empty[:, :2], k_buf, v_buf, loc[:0], pos[:0], cs,
                                            True, torch.bfloat16) == ROPE_FUSED
    assert not k_buf.any()


@needs_interpreter
def test_forced_launch_shapes_give_the_same_bits():
    """The shape only decides which program handles which token and head; many small
    programs (the GPU decode shape) and one big one must write the same bits, in either order
    of the programs (token-major: one grid axis, head groups fastest), from a persistent grid
    (the host counts two SMs: two or four programs walk 12 or 9 tiles) and with the streaming hints."""
    results = []
    for cfg in (RopeConfig(1, 1, 1), RopeConfig(2, 2, 2), None, RopeConfig(1, 1, 1, token_major=True),
                RopeConfig(2, 2, 2, token_major=True), RopeConfig(4, 1, 1, token_major=True),
                RopeConfig(1, 1, 1, persistent=1), RopeConfig(1, 2, 2, persistent=2, stream=True),
                RopeConfig(2, 1, 1, token_major=True, stream=True), RopeConfig(2, 1, 2, stream=True)):
        q, k, v, cs, pos, loc = make_case(tokens=3, hq=3, hk=1, rope_dim=24)
        k_buf, v_buf = buffers(24, 1, 32, 32, torch.float8_e5m2)
        rt.RopeTritonFusedWriter(config=cfg).write(q, k, v, k_buf, v_buf, loc, pos, cs, False, torch.float8_e5m2,
                                                   0.6, 0.6)
        results.append((q, k, k_buf, v_buf))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(bits(a), bits(b))


@needs_interpreter
def test_every_card_table_shape_gives_the_same_bits():
    """Every launch shape any card's row hands out (``ROPE_TABLES``: a row added for a new
    card is checked here too) writes the bits of the interpreter's own shape, over enough
    tokens (19) that the largest token blocks (16) take two programs, the second ragged."""
    from kvprof.kvcache.writers.rope_tables import ROPE_TABLES

    shapes = sorted({cfg for table in ROPE_TABLES.values() for _, _, cfg in table}, key=repr)
    assert len(shapes) > 1
    results = []
    for cfg in [None, *shapes]:
        q, k, v, cs, pos, loc = make_case(tokens=19, hq=3, hk=1, rope_dim=24, rows=32)
        k_buf, v_buf = buffers(32, 1, 32, 32, torch.bfloat16)
        rt.RopeTritonFusedWriter(config=cfg).write(q, k, v, k_buf, v_buf, loc, pos, cs, True, torch.bfloat16)
        results.append((cfg, (q, k, k_buf, v_buf)))
    k_rows, v_rows = results[0][1][2][loc], results[0][1][3][loc]
    assert k_rows.abs().sum(dim=(1, 2)).all() and v_rows.abs().sum(dim=(1, 2)).all()  # every row written
    for cfg, got in results[1:]:
        for a, b in zip(results[0][1], got):
            assert torch.equal(bits(a), bits(b)), cfg


@needs_interpreter
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=st.integers(1, 5), hq=st.integers(1, 5), hk=st.integers(1, 3), dim=st.sampled_from([8, 20, 32]),
       rope_frac=st.sampled_from([1.0, 0.5, 0.25]), v_dim=st.sampled_from([8, 12, 32]), is_neox=st.booleans(),
       types=st.sampled_from([(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                              (torch.float32, torch.float32), (torch.bfloat16, torch.float8_e4m3fn),
                              (torch.float16, torch.float8_e5m2), (torch.float32, torch.bfloat16)]),
       scale=st.sampled_from([None, 0.3, 2.0]), seed=st.integers(0, 2**16))
def test_fused_any_shape(tokens, hq, hk, dim, rope_frac, v_dim, is_neox, types, scale, seed):
    """Heads, dims and rotary widths that are not powers of two (masked lanes), any dtype pair."""
    rope_dim = max(2, int(dim * rope_frac) // 2 * 2)
    dtype, cache_dtype = types
    run_and_check(rt.RopeTritonFusedWriter(), "cpu", cache_dtype=cache_dtype, is_neox=is_neox, k_scale=scale,
                  v_scale=scale, tokens=tokens, hq=hq, hk=hk, dim=dim, v_dim=v_dim, rope_dim=rope_dim, dtype=dtype,
                  seed=seed)


# -- inputs refused, and what the writers say about themselves --------------------------------
def _refusal_cases():
    q, k, v, cs, pos, loc = make_case(tokens=3)
    bad = {
        "positions float": dict(positions=pos.float()),
        "positions 2-D": dict(positions=pos[:, None]),
        "positions length": dict(positions=pos[:2]),
        "loc not a tensor": dict(loc=[1, 2, 3]),
        "k heads": dict(k=k[:, :1]),
        "v dim": dict(v=v[..., :8]),
        "v dtype": dict(v=v.half()),
        "q last-dim stride": dict(q=q.transpose(1, 2).contiguous().transpose(1, 2)),
        "q dim": dict(q=q[..., :16]),
        "cos_sin fp64": dict(cos_sin_cache=cs.double()),
        "rope_dim odd": dict(cos_sin_cache=cs[:, :7]),
        "rope_dim > head_dim": dict(cos_sin_cache=torch.cat([cs, cs], 1)),
        "int q": dict(q=q.to(torch.int32)),
    }
    return (q, k, v, cs, pos, loc), bad


@pytest.mark.parametrize("case", list(_refusal_cases()[1]))
def test_check_rope_inputs_refuses_in_one_line(case):
    (q, k, v, cs, pos, loc), bad = _refusal_cases()
    k_buf, v_buf = buffers(24, 2, 32, 32, torch.bfloat16)
    args = dict(q=q, k=k, v=v, k_buf=k_buf, v_buf=v_buf, loc=loc, positions=pos, cos_sin_cache=cs)
    check_rope_inputs(**args)  # the good call passes
    args.update(bad[case])
    with pytest.raises(ValueError) as err:
        check_rope_inputs(**args)
    assert "\n" not in str(err.value)


@needs_interpreter
def test_writer_refusals_write_nothing():
    """What the writer itself refuses (non-contiguous cache buffers, no conversion) it refuses
    before its launch: q, k and the cache are unchanged."""
    q, k, v, cs, pos, loc = make_case(tokens=3)
    q0, k0 = q.clone(), k.clone()
    k_buf, v_buf = buffers(24, 2, 64, 32, torch.bfloat16)
    for kb, dtype in ((k_buf[:, :, :32], torch.bfloat16), (k_buf[:, :, :32].contiguous(), torch.int8)):
        with pytest.raises(ValueError):
            rt.RopeTritonFusedWriter().write(q, k, v, kb, v_buf, loc, pos, cs, True, dtype)
        assert torch.equal(q, q0) and torch.equal(k, k0) and not k_buf.any() and not v_buf.any()


def test_info_and_paths():
    fused = rt.RopeTritonFusedWriter()
    assert fused.rope_fused and fused.fused and fused.info().extra["rope"] == "fused"
    assert is_fused_path(ROPE_FUSED) and is_rope_fused_path(ROPE_FUSED)
    assert is_fused_path(FUSED) and not is_rope_fused_path(FUSED) and not is_fused_path(TWO_STREAMS)
    assert rt.RopeThenTwoStreamWriter().fused is False
    assert rt.RopeThenTritonFusedWriter().fused is True


def test_unsupported_reasons():
    fused = rt.RopeTritonFusedWriter()
    assert "rotates bf16, fp16 or fp32" in fused.unsupported_reason(torch.device("cpu"), torch.bfloat16,
                                                                    torch.float8_e4m3fn)
    assert "needs the compiled kernel" in rt.RopeTritonFusedWriter(pdl=True).unsupported_reason(
        torch.device("cpu"), torch.bfloat16)
    if rk.interpreted():
        assert "TRITON_INTERPRET=1" in fused.unsupported_reason(torch.device("cuda"), torch.bfloat16)
        assert fused.unsupported_reason(torch.device("cpu"), torch.float8_e5m2, torch.float16) is None


def test_token_major_launches_one_grid_axis_with_its_mode_bit():
    """The bits test above cannot tell the two orders apart: the grid and the mode bit can."""
    # a plan's fields _launch_plan reads: block_half, block_p, block_dv, no fp8, cols, widths, interpreted, table
    plan = (0, True, 64, 64, 0, 128, False, True, (64, 0, 128), (64, 0, 128), False, False, False, None)
    for major in (False, True):
        kernel = rt.TritonRope("t", RopeConfig(16, 1, 8, token_major=major))
        *_, grid, mode = kernel._launch_plan(4096, 8, 1, 128, plan)
        assert grid == ((256 * 9,) if major else (256, 9))  # 256 token blocks x (8 q groups + 1 k group)
        assert bool(mode & rk.MODE_TOKEN_MAJOR) == major
    assert rk.MODE_TOKEN_MAJOR > rk.MODE_STORE  # a bit of its own


def test_persistent_grid_is_programs_per_sm_capped_at_the_tiles():
    """A persistent shape launches ``persistent`` programs per SM, never more than the tiles;
    the streaming hints are a mode bit of their own."""
    plan = (0, True, 64, 64, 0, 128, False, True, (64, 0, 128), (64, 0, 128), False, False, False, None)
    kernel = rt.TritonRope("t", RopeConfig(16, 1, 8, persistent=4, stream=True))
    *_, grid, mode = kernel._launch_plan(4096, 8, 1, 128, plan, sms=132)
    assert grid == (4 * 132,) and mode & rk.MODE_PERSISTENT and mode & rk.MODE_STREAM
    *_, grid, _ = kernel._launch_plan(16, 8, 1, 128, plan, sms=132)
    assert grid == (9,)  # one token block x 9 head groups: one program per tile
    *_, grid, mode = rt.TritonRope("t", RopeConfig(16, 1, 8))._launch_plan(4096, 8, 1, 128, plan, sms=132)
    assert grid == (256, 9) and not mode & (rk.MODE_PERSISTENT | rk.MODE_STREAM)
    assert len({rk.MODE_TOKEN_MAJOR, rk.MODE_STREAM, rk.MODE_PERSISTENT, rk.MODE_STORE}) == 4
    with pytest.raises(ValueError, match="persistent"):
        RopeConfig(16, 1, 8, persistent=-1)


def test_launch_tables():
    assert pick_rope_config(128, 1) == RopeConfig(1, 1, 1)
    assert pick_rope_config(128, 4096).block_t > 1 and pick_rope_config(256, 10**6) is not None
    cfg = interpreted_rope_config(heads=8, head_elements=128, tokens=4096)
    assert cfg.block_h == 8 and cfg.block_t * cfg.block_h * 128 <= 1 << 20
    with pytest.raises(ValueError):
        RopeConfig(3, 1, 1)


@pytest.mark.slow
def test_kernel_compiles_for_sm90_without_fused_multiply_adds():
    """The interpreter runs Python, not the compiler: a kernel can pass every CPU test and not
    compile. Triton's own ptxas compiles it for sm_90 here, without a GPU."""
    script = Path(__file__).resolve().parents[1] / "gpu" / "rope_sass_offline.py"
    done = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all("FFMA 0," in line for line in lines), done.stdout
    assert "persistent stream" in lines[2] and ", 0 evict-first" not in lines[2]  # the hints reach the SASS


# -- GPU -----------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_compiled
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=["bf16", "e4m3", "e5m2"])
@pytest.mark.parametrize("shape", [dict(tokens=1, hq=32, hk=8, dim=128), dict(tokens=64, hq=8, hk=1, dim=128),
                                   dict(tokens=300, hq=4, hk=2, dim=128, rope_dim=64, rows=1024)],
                         ids=["decode1", "decode64", "prefill-partial"])
@pytest.mark.parametrize("name", list(WRITERS))
def test_gpu_writers(name, is_neox, cache_dtype, shape):
    scales = (0.7, 1.3) if cache_dtype != torch.bfloat16 else (None, None)
    run_and_check(WRITERS[name](), "cuda", cache_dtype=cache_dtype, is_neox=is_neox, k_scale=scales[0],
                  v_scale=scales[1], **{"rows": 256, **shape})


def test_rope_triton_fused_names_its_kernel_as_traces_show_it():
    """The SGLang plugin records ``kernel_name`` with each rope + store write captured into a
    CUDA graph; a replay's kernels are tied to those writes by that name."""
    from kvprof.integrations.sglang import _writer_kernel

    w = rt.RopeTritonFusedWriter()
    assert w.kernel_name == rk.KERNEL_NAME == "rope_kv_kernel"
    if rk.triton is not None:
        assert rk.rope_kv_kernel.__name__ == rk.KERNEL_NAME
    assert _writer_kernel(w) == (rk.KERNEL_NAME, 1)
