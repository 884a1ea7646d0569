"""Every rope + store writer on a CUDA device against the float32 reference (``-m gpu``; run on
the H200 by ``gpu/run_gpu_checks.sh rope``, with ``TRITON_INTERPRET=0``).

Tolerances, and why:
* kvprof's writers compute the rotation in float32 with every product and sum rounded, as the
  reference does (rope_cuda_fused: ``__fmul_rn``/``__fadd_rn``, no FMA contraction;
  rope_triton_fused: fp fusion off), then round once to q/k's dtype: q and k must equal the
  reference rounded to their dtype, bit for bit.
* SGLang's and sgl-kernel's kernels are compiled with multiply-add contraction (nvcc's default
  ``--fmad=true``, Triton's default fp fusion; sgl-kernel's cubin also flushes float32 subnormals,
  which these inputs never reach): an FMA skips the rounding of one product, which moves the float32
  result by at most one float32 rounding of a product, <= 2^-23 x the row's largest |x| (|cos|,
  |sin| <= 1); after the rounding to the output dtype that is one unit in its last place plus
  that. That is their bound here.
* For every writer the K cache holds exactly the rotated k as written back to k, converted by
  ``convert_for_cache`` (fp8: the per-tensor scale, in the launch), the V cache
  ``convert_for_cache(v)``, bit for bit; rows outside ``loc`` stay untouched.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvprof.core.vocab import FALLBACK_PREFIX, ROPE_FUSED
from kvprof.kvcache.contracts import RopeKVWriter
from kvprof.kvcache.dtypes import convert_for_cache, store_dtype_for
from kvprof.kvcache.writers.rope_reference import cos_sin_table, rope_reference

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
MAX_POS = 4096
INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _cuda_fused(**options: object) -> Callable[[], RopeKVWriter]:
    def make() -> RopeKVWriter:
        from kvprof.kvcache.writers.rope_cuda import RopeCudaWriter

        return RopeCudaWriter(**options)  # type: ignore[arg-type]

    return make


def _triton(kind: str, **config: object) -> Callable[[], RopeKVWriter]:
    def make() -> RopeKVWriter:
        from kvprof.kvcache.writers import rope_triton as rt

        if kind == "fused":
            return rt.RopeTritonFusedWriter(config=config or None)  # type: ignore[arg-type]
        return rt.RopeThenStoreWriter(kind)

    return make


def _sgl_kernel_cubin() -> RopeKVWriter:
    from kvprof.kvcache.writers.rope_sgl_cubin import SglKernelRopeCubinWriter

    return SglKernelRopeCubinWriter()


def _sglang(kind: str) -> Callable[[], RopeKVWriter]:
    def make() -> RopeKVWriter:
        from kvprof.kvcache.writers import rope_sglang

        return rope_sglang.SglangRopeStoreWriter() if kind == "jit" else rope_sglang.SglangTritonRopeCacheWriter()

    return make


# name -> (factory, bitwise rotation)
WRITERS: dict[str, tuple[Callable[[], RopeKVWriter], bool]] = {
    "rope_cuda_fused": (_cuda_fused(), True),
    "rope_cuda_fused_no_pdl": (_cuda_fused(pdl=False), True),
    "rope_cuda_fused_pdl": (_cuda_fused(pdl=True), True),
    "rope_cuda_fused_small_grid": (_cuda_fused(config={"threads": 32, "blocks_per_sm": 1}), True),
    "rope_triton_fused": (_triton("fused"), True),
    # the programs token-major (one axis, head groups fastest), few and many tokens per program
    "rope_triton_fused_token_major": (_triton("fused", block_t=16, block_h=1, num_warps=8, token_major=True), True),
    "rope_triton_fused_token_major_t1": (_triton("fused", block_t=1, block_h=2, num_warps=4, token_major=True),
                                         True),
    # a persistent grid (2 programs per SM walk the tiles) with the streaming cache hints
    "rope_triton_fused_persistent": (_triton("fused", block_t=16, block_h=1, num_warps=8, persistent=2, stream=True),
                                     True),
    "rope_then_cuda_fused": (_triton("cuda_fused"), True),
    "sglang_rope_store": (_sglang("jit"), False),
    "sglang_triton_rope_cache": (_sglang("triton"), False),
    "sgl_kernel_rope_cubin": (_sgl_kernel_cubin, False),  # nvcc's FMA contraction, and FTZ
}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT_OF[t.element_size()])


def make_case(tokens=5, hq=4, hk=2, dim=64, v_dim=None, rope_dim=None, dtype=torch.bfloat16, q_dtype=None,
              rows=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    v_dim = v_dim or dim
    rows = rows or max(2 * tokens + 8, 32)
    q = torch.randn(tokens, hq, dim, generator=g).to(q_dtype or dtype).to(CUDA)
    k = torch.randn(tokens, hk, dim, generator=g).to(dtype).to(CUDA)
    v = (torch.randn(tokens, hk, v_dim, generator=g) * 4).to(dtype).to(CUDA)
    cs = cos_sin_table(MAX_POS, rope_dim or dim).to(CUDA)
    pos = torch.randint(0, MAX_POS, (tokens,), generator=g).to(CUDA)
    loc = (torch.randperm(rows - 1, generator=g)[:tokens] + 1).to(CUDA)  # distinct, never slot 0
    return q, k, v, cs, pos, loc, rows


def writer_or_skip(name: str, cache: torch.dtype, inp: torch.dtype) -> tuple[RopeKVWriter, bool]:
    make, exact = WRITERS[name]
    try:
        writer = make()
    except ImportError as exc:
        pytest.skip(f"{name}: {exc}")
    reason = writer.unsupported_reason(CUDA, cache, inp)
    if reason:
        pytest.skip(reason)
    return writer, exact


def assert_rotated(out: torch.Tensor, ref: torch.Tensor, before: torch.Tensor, exact: bool) -> None:
    want = ref.to(out.dtype)
    if exact:
        assert torch.equal(bits(out), bits(want)), (out.float() - ref).abs().max()
        return
    spacing = torch.finfo(out.dtype).eps * torch.exp2(torch.floor(torch.log2(
        want.float().abs().clamp_min(torch.finfo(out.dtype).tiny))))
    row_max = before.float().abs().amax(dim=-1, keepdim=True)
    bound = spacing + row_max * 2.0**-23
    diff = (out.float() - want.float()).abs()
    assert bool((diff <= bound).all()), f"{int((diff > bound).sum())} values beyond one ulp + 2^-23 x row max"


def run_and_check(name: str, cache=torch.bfloat16, is_neox=True, k_scale=None, v_scale=None, loc_view=None,
                  pos_view=None, **shape) -> tuple[str, RopeKVWriter]:
    q, k, v, cs, pos, loc, rows = make_case(**shape)
    writer, exact = writer_or_skip(name, cache, k.dtype)
    call_loc = loc_view(loc) if loc_view else loc
    call_pos = pos_view(pos) if pos_view else pos
    store = store_dtype_for(cache)
    k_buf = torch.zeros(rows, k.shape[1], k.shape[2], dtype=store, device=CUDA)
    v_buf = torch.zeros(rows, v.shape[1], v.shape[2], dtype=store, device=CUDA)
    why = getattr(writer, "shape_reason", lambda *a: None)(q, k, v, k_buf, v_buf, cs, is_neox)
    if why:  # a peer's kernel that does not take these shapes (its own asserts), said by the peer
        pytest.skip(why)
    q0, k0, v0 = q.clone(), k.clone(), v.clone()
    rq, rk = rope_reference(q0, k0, cs, pos, is_neox)
    path = writer.write(q, k, v, k_buf, v_buf, call_loc, call_pos, cs, is_neox, cache, k_scale, v_scale)
    torch.cuda.synchronize()
    assert_rotated(q, rq, q0, exact)
    assert_rotated(k, rk, k0, exact)
    assert torch.equal(v, v0), "v is only read"
    assert torch.equal(bits(k_buf[loc]), bits(convert_for_cache(k, cache, k_scale))), "K cache != rotated k, converted"
    assert torch.equal(bits(v_buf[loc]), bits(convert_for_cache(v0, cache, v_scale))), "V cache rows are not bit-exact"
    untouched = torch.ones(rows, dtype=torch.bool, device=CUDA)
    untouched[loc] = False
    assert not bits(k_buf[untouched]).any() and not bits(v_buf[untouched]).any(), "a row outside loc was written"
    return path, writer


LLAMA70B_TP8 = {"hq": 8, "hk": 1, "dim": 128}
CASES = {
    "llama70b_tp8_1": dict(tokens=1, **LLAMA70B_TP8),
    "llama70b_tp8_64": dict(tokens=64, **LLAMA70B_TP8),
    "llama70b_tp8_600": dict(tokens=600, **LLAMA70B_TP8),  # above 512 tokens: the wider default blocks
    "llama70b_tp8_4096": dict(tokens=4096, **LLAMA70B_TP8),
    "gptj_gqa": dict(is_neox=False, tokens=7, hq=4, hk=2, dim=64),
    "partial_rotary": dict(tokens=5, hq=4, hk=2, dim=128, rope_dim=64),
    "partial_gptj": dict(is_neox=False, tokens=5, hq=4, hk=2, dim=128, rope_dim=32),
    "narrow_rows": dict(tokens=9, hq=3, hk=1, dim=36, rope_dim=12),  # 4-byte vectors
    "v_dim_of_its_own": dict(tokens=6, hq=4, hk=2, dim=64, v_dim=32),
    "fp16": dict(cache=torch.float16, dtype=torch.float16, tokens=33, hq=8, hk=1, dim=128),
    "fp8_e4m3_pow2_scale": dict(cache=torch.float8_e4m3fn, k_scale=0.5, v_scale=0.25, tokens=17, **LLAMA70B_TP8),
    "fp8_e4m3_scale": dict(cache=torch.float8_e4m3fn, k_scale=1.7, v_scale=0.37, tokens=17, **LLAMA70B_TP8),
    "fp8_e4m3_unscaled_gptj": dict(cache=torch.float8_e4m3fn, is_neox=False, tokens=8, **LLAMA70B_TP8),
    "fp8_e5m2_fp16": dict(cache=torch.float8_e5m2, dtype=torch.float16, k_scale=0.3, v_scale=2.0, tokens=8,
                          **LLAMA70B_TP8),
    "strided_loc_int32_pos": dict(tokens=12, hq=4, hk=2, dim=64,
                                  loc_view=lambda t: torch.stack([t, t], 1).reshape(-1)[::2],
                                  pos_view=lambda t: torch.stack([t, t, t], 1).reshape(-1).to(torch.int32)[::3]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(WRITERS))
def test_rope_writer_matches_the_reference(name: str, case: str) -> None:
    path, writer = run_and_check(name, **CASES[case])
    if name.startswith("rope_cuda_fused") or name in ("sglang_triton_rope_cache", "sgl_kernel_rope_cubin"):
        assert path == ROPE_FUSED
    elif writer.rope_fused:  # SGLang's JIT path: fused where SGLang fuses, else its named fallback
        assert path == ROPE_FUSED or path.startswith(FALLBACK_PREFIX), path
    else:  # rope, then a store writer: the store's path
        assert path != ROPE_FUSED, path


def test_sglang_rope_store_fuses_where_sglang_does():
    assert run_and_check("sglang_rope_store", **CASES["llama70b_tp8_64"])[0] == ROPE_FUSED
    path, _ = run_and_check("sglang_rope_store", **CASES["partial_rotary"])
    assert path.startswith(FALLBACK_PREFIX) and "rope_dim == head_dim" in path, path


def test_q_and_k_as_views_of_one_qkv_tensor_are_rotated_in_place():
    """The engines' layout: q, k, v split from one qkv row, rotated through the views."""
    for name in ("rope_cuda_fused", "sglang_rope_store", "sglang_triton_rope_cache", "sgl_kernel_rope_cubin"):
        writer, exact = writer_or_skip(name, torch.bfloat16, torch.bfloat16)
        g = torch.Generator().manual_seed(1)
        tokens, hq, hk, dim, rows = 10, 8, 1, 128, 64
        qkv = torch.randn(tokens, (hq + 2 * hk) * dim, generator=g).bfloat16().to(CUDA)
        q, k, v = (t.view(tokens, -1, dim) for t in qkv.split([hq * dim, hk * dim, hk * dim], dim=1))
        cs = cos_sin_table(MAX_POS, dim).to(CUDA)
        pos = torch.randint(0, MAX_POS, (tokens,), generator=g).to(CUDA)
        loc = (torch.randperm(rows - 1, generator=g)[:tokens] + 1).to(CUDA)
        q0, k0, v0 = q.clone(), k.clone(), v.clone()
        rq, rk = rope_reference(q0, k0, cs, pos, True)
        k_buf = torch.zeros(rows, hk, dim, dtype=torch.bfloat16, device=CUDA)
        v_buf = torch.zeros_like(k_buf)
        writer.write(q, k, v, k_buf, v_buf, loc, pos, cs, True, torch.bfloat16)
        assert_rotated(qkv[:, : hq * dim].view(tokens, hq, dim), rq, q0, exact)
        assert_rotated(qkv[:, hq * dim: (hq + hk) * dim].view(tokens, hk, dim), rk, k0, exact)
        assert torch.equal(k_buf[loc], k) and torch.equal(v_buf[loc], v0), name


def test_rope_cuda_fused_q_of_the_other_16_bit_type():
    """fp16 q with bf16 k/v (SGLang's fp16-q feed), and bf16 q with fp16 k/v."""
    from kvprof.kvcache.writers.rope_cuda import RopeCudaWriter

    for q_dtype, dtype in ((torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)):
        q, k, v, cs, pos, loc, rows = make_case(tokens=9, hq=8, hk=1, dim=128, dtype=dtype, q_dtype=q_dtype)
        k_buf = torch.zeros(rows, 1, 128, dtype=dtype, device=CUDA)
        v_buf = torch.zeros_like(k_buf)
        q0, k0 = q.clone(), k.clone()
        rq, rk = rope_reference(q0, k0, cs, pos, True)
        RopeCudaWriter().write(q, k, v, k_buf, v_buf, loc, pos, cs, True, dtype)
        assert_rotated(q, rq, q0, True)
        assert_rotated(k, rk, k0, True)
        assert torch.equal(k_buf[loc], k)


def test_rope_cuda_fused_skips_bad_slots_and_positions_and_zero_tokens():
    """Slots outside [0, rows) are not written (q and k still rotated); a token whose position
    is outside the cos/sin table is left alone entirely; zero tokens launch nothing."""
    from kvprof.kvcache.writers.rope_cuda import RopeCudaWriter

    w = RopeCudaWriter()
    q, k, v, cs, pos, loc, rows = make_case(tokens=4, hq=8, hk=1, dim=128)
    loc[1], loc[2], pos[3] = -1, rows, MAX_POS
    k_buf = torch.zeros(rows, 1, 128, dtype=torch.bfloat16, device=CUDA)
    v_buf = torch.zeros_like(k_buf)
    q0, k0 = q.clone(), k.clone()
    rq, rk = rope_reference(q0[:3], k0[:3], cs, pos[:3], True)
    assert w.write(q, k, v, k_buf, v_buf, loc, pos, cs, True, torch.bfloat16) == ROPE_FUSED
    assert_rotated(q[:3], rq, q0[:3], True)
    assert_rotated(k[:3], rk, k0[:3], True)
    assert torch.equal(q[3], q0[3]) and torch.equal(k[3], k0[3])
    written = k_buf.view(rows, -1).any(dim=1)
    assert written.nonzero().flatten().tolist() == [int(loc[0])]
    empty = torch.empty(0, 8, 128, dtype=torch.bfloat16, device=CUDA)
    none = torch.empty(0, 1, 128, dtype=torch.bfloat16, device=CUDA)
    idx = torch.empty(0, dtype=torch.int64, device=CUDA)
    assert w.write(empty, none, none, k_buf, v_buf, idx, idx, cs, True, torch.bfloat16) == ROPE_FUSED


def test_rope_cuda_fused_pdl_in_a_replayed_graph_gives_the_eager_bits():
    """Three layers' writes captured in one CUDA graph with programmatic dependent launch on:
    each replay rotates again, exactly as three more eager calls without PDL do."""
    from kvprof.kvcache.writers.rope_cuda import RopeCudaWriter

    runs = []
    for pdl, graphed in ((True, True), (False, False)):
        w = RopeCudaWriter(pdl=pdl)
        layers = [make_case(tokens=10, hq=8, hk=1, dim=128, seed=s) for s in range(3)]
        bufs = [torch.zeros(c[6], 1, 128, dtype=torch.uint8, device=CUDA) for c in layers]
        vbufs = [torch.zeros_like(b) for b in bufs]

        def step(w=w, layers=layers, bufs=bufs, vbufs=vbufs) -> None:
            for (q, k, v, cs, pos, loc, _), kb, vb in zip(layers, bufs, vbufs):
                w.write(q, k, v, kb, vb, loc, pos, cs, True, torch.float8_e4m3fn, 0.5, 0.5)

        if graphed:
            step()  # warm up (builds the op) outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            for _ in range(2):
                graph.replay()
        else:
            for _ in range(3):
                step()
        torch.cuda.synchronize()
        runs.append([bits(t).clone() for c in layers for t in c[:2]] + [b.clone() for b in bufs + vbufs])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: {**c, "q": c["q"].float()}, "rope_cuda_fused: q, k, v must be bf16 or fp16"),
    (lambda c: {**c, "v": c["v"].half()}, "rope_cuda_fused: k and v differ in dtype"),
    (lambda c: {**c, "cs": c["cs"][:, :63]}, "rope_cuda_fused: rope_dim (cos_sin_cache's last dim) must be even"),
    (lambda c: {**c, "loc": c["loc"][:-1]}, "rope_cuda_fused: loc must be a 1-D int32 or int64 tensor"),
    (lambda c: {**c, "k_buf": c["k_buf"][:, :, :32]}, "rope_cuda_fused: cache buffers must be contiguous"),
    (lambda c: {**c, "q": c["q"][:, :1].expand(5, 4, 64)},
     "rope_cuda_fused: q and k rows must not overlap"),
])
def test_rope_cuda_fused_refuses_bad_calls_in_one_line_before_writing(change, message):
    from kvprof.kvcache.writers.rope_cuda import RopeCudaWriter

    q, k, v, cs, pos, loc, rows = make_case()
    k_buf = torch.zeros(rows, 2, 64, dtype=torch.bfloat16, device=CUDA)
    call = change({"q": q, "k": k, "v": v, "k_buf": k_buf, "v_buf": torch.zeros_like(k_buf), "loc": loc,
                   "pos": pos, "cs": cs})
    args = (call["q"], call["k"], call["v"], call["k_buf"], call["v_buf"], call["loc"], call["pos"], call["cs"], True,
            torch.bfloat16)
    # the op's own checks, as a pool calls the writer (write_unchecked, after its own checks): the op's
    # TORCH_CHECK, raised before anything launched, as the one-line ValueError every writer refuses with
    with pytest.raises(ValueError) as err:
        RopeCudaWriter().write_unchecked(*args)
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)
    assert not k_buf.any()
    # called directly, the rope contract's checks refuse first where they see the fault, else the op
    with pytest.raises((ValueError, RuntimeError)) as err:
        RopeCudaWriter().write(*args)
    assert not k_buf.any()
