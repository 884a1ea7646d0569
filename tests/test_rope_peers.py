"""The CUDA rope writer and SGLang's rope peers, on CPU: what each refuses and why (one line),
and SGLang's Triton ``fused_qk_rope_reshape_and_cache`` run in Triton's interpreter against
kvprof's float32 reference.

Tolerance, and why: none. The interpreter computes the kernel's ``x * cos + rotate(x) * sin``
with numpy's float32 products and sums, each rounded (no fused multiply-add), so q and k equal
the reference rounded to their dtype bit for bit; the caches hold the rotated k as written
back and v, unchanged (a cache of the input's dtype). On a GPU the same kernel contracts into
FMAs (tests/test_rope_gpu.py allows for it). bf16 is not run here: the interpreter's bf16
arithmetic is wrong in this kernel, which the writer says (tested below).
"""

from __future__ import annotations

import pytest
import torch

from kvprof.core.vocab import ROPE_FUSED
from kvprof.kvcache.dtypes import convert_for_cache
from kvprof.kvcache.writers import rope_cuda, rope_sglang
from kvprof.kvcache.writers.rope_reference import cos_sin_table, rope_reference

CPU = torch.device("cpu")
CUDA = torch.device("cuda")


def make_case(tokens=5, hq=4, hk=2, dim=32, rope_dim=None, dtype=torch.float16, rows=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, hq, dim, generator=g).to(dtype)
    k = torch.randn(tokens, hk, dim, generator=g).to(dtype)
    v = (torch.randn(tokens, hk, dim, generator=g) * 4).to(dtype)
    cs = cos_sin_table(64, rope_dim or dim)
    pos = torch.randint(0, 64, (tokens,), generator=g)
    loc = torch.randperm(rows - 1, generator=g)[:tokens] + 1
    return q, k, v, cs, pos, loc


# -- rope_cuda_fused: refusals on a machine without CUDA ---------------------------------------
def test_rope_cuda_fused_says_it_needs_cuda_in_one_line():
    w = rope_cuda.RopeCudaWriter()
    reason = w.unsupported_reason(CPU, torch.bfloat16, torch.bfloat16)
    assert reason == "rope_cuda_fused is a compiled CUDA kernel: it needs a CUDA device, not cpu"
    info = w.info()
    assert (info.name, info.fused, info.devices, info.extra) == ("rope_cuda_fused", True, ("cuda",), {"rope": "fused"})


@pytest.mark.parametrize(("cache", "inp", "want"), [
    (torch.bfloat16, torch.bfloat16, None),
    (torch.float16, torch.float16, None),
    (torch.float8_e4m3fn, torch.bfloat16, None),
    (torch.float8_e5m2, torch.float16, None),
    (torch.bfloat16, torch.float32, "rope_cuda_fused takes bf16 or fp16 q/k/v, not torch.float32"),
    (torch.float16, torch.bfloat16,
     "rope_cuda_fused stores torch.bfloat16 rows into a cache of the same dtype or fp8, not torch.float16"),
    (torch.float32, None, "rope_cuda_fused stores into bf16, fp16 or fp8 caches, not torch.float32"),
])
def test_rope_cuda_fused_cache_and_input_dtypes(cache, inp, want):
    assert rope_cuda.cache_support(cache, inp) == want
    if want is not None:  # said before the op is even looked for
        assert rope_cuda.RopeCudaWriter().unsupported_reason(CUDA, cache, inp) == want


def test_rope_cuda_fused_without_cuda_reports_the_build_reason_and_write_refuses_in_one_line():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    w = rope_cuda.RopeCudaWriter()
    assert w.unsupported_reason(CUDA, torch.bfloat16, torch.bfloat16) == "needs CUDA (torch.cuda is not available)"
    q, k, v, cs, pos, loc = make_case(dtype=torch.bfloat16)
    k_buf, v_buf = torch.zeros(16, 2, 32, dtype=torch.bfloat16), torch.zeros(16, 2, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError) as err:  # its contract asks unsupported_reason before anything runs
        w.write(q, k, v, k_buf, v_buf, loc, pos, cs, True, torch.bfloat16)
    assert str(err.value) == f"rope_cuda_fused cannot take this call: {w.unsupported_reason(q.device, torch.bfloat16)}"
    with pytest.raises(RuntimeError) as err:  # its own path, as a pool would call it, says so too
        w.write_unchecked(q, k, v, k_buf, v_buf, loc, pos, cs, True, torch.bfloat16)
    assert str(err.value) == "rope_cuda_fused cannot run: needs CUDA (torch.cuda is not available)"


def test_rope_cuda_fused_launch_shape_is_checked():
    with pytest.raises(ValueError, match="threads must be a power of two"):
        rope_cuda.RopeCudaWriter(config={"threads": 48, "blocks_per_sm": 4})
    assert rope_cuda.RopeCudaWriter(config={"threads": 64, "blocks_per_sm": 2}).config.bits == 6 << 8 | 2 << 12


# -- sglang_rope_store ------------------------------------------------------------------------
def test_sglang_rope_store_says_why_not_here():
    w = rope_sglang.SglangRopeStoreWriter()
    reason = w.unsupported_reason(CUDA, torch.bfloat16, torch.bfloat16)
    if torch.cuda.is_available():
        assert reason is None or "SGLang" in reason
    else:
        assert reason == "SGLang's apply_rope_inplace_with_kvcache is a CUDA kernel (no CUDA device here)"
    assert w.info().extra == {"rope": "fused"}


@pytest.mark.parametrize(("rope_dim", "size", "fused"), [
    (128, 2, True), (64, 2, True), (256, 2, True), (1024, 2, True), (2048, 2, False),
    (80, 2, False), (96, 2, False), (192, 2, False), (32, 2, True), (128, 4, True),
])
def test_sglang_fuses_exactly_the_rotary_sizes_its_kernel_has(rope_dim, size, fused):
    """kSupportFused of SGLang's FusedRopeKernel: 128 bf16 = 16 threads x 8; 80 would need 16 x 5."""
    assert rope_sglang.sglang_fuses(rope_dim, size) is fused


def test_sglang_rope_store_falls_back_where_sglang_does_not_fuse():
    w = rope_sglang.SglangRopeStoreWriter()
    q, k, v, _, _, _ = make_case(dim=128, dtype=torch.bfloat16)
    assert w.unfused_reason(q, k, v, 128, torch.bfloat16) is None
    assert w.unfused_reason(q, k, v, 64, torch.bfloat16) == (
        "SGLang's fused rope + store needs rope_dim == head_dim == v head_dim, not 64/128/128")
    assert w.unfused_reason(q, k, v, 128, torch.float8_e4m3fn) == (
        "SGLang fuses rope and store only into a cache of k's dtype, not torch.bfloat16 into torch.float8_e4m3fn")
    q80, k80, v80, _, _, _ = make_case(dim=80, dtype=torch.bfloat16)
    assert w.unfused_reason(q80, k80, v80, 80, torch.bfloat16) == (
        "SGLang's fused rope + store has no variant for rope_dim 80 in torch.bfloat16")
    qkv = torch.zeros(5, 8 * 128, dtype=torch.bfloat16)
    qs, ks, vs = qkv[:, :512].view(5, 4, 128), qkv[:, 512:768].view(5, 2, 128), qkv[:, 768:].view(5, 2, 128)
    assert w.unfused_reason(qs, ks, vs, 128, torch.bfloat16) is None  # views of one qkv row, as SGLang's


# -- sglang_triton_rope_cache under Triton's interpreter --------------------------------------
TRITON_PEER = rope_sglang.SglangTritonRopeCacheWriter()
needs_peer = pytest.mark.skipif(TRITON_PEER.unsupported_reason(CPU, torch.float16, torch.float16) is not None,
                                reason=str(TRITON_PEER.unsupported_reason(CPU, torch.float16, torch.float16)))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


@needs_peer
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
def test_sglang_triton_peer_matches_the_reference(is_neox, dtype):
    q, k, v, cs, pos, loc = make_case(dtype=dtype)
    k_buf, v_buf = torch.zeros(16, 2, 32, dtype=dtype), torch.zeros(16, 2, 32, dtype=dtype)
    rq, rk = rope_reference(q, k, cs, pos, is_neox)
    v0 = v.clone()
    assert TRITON_PEER.write(q, k, v, k_buf, v_buf, loc, pos, cs, is_neox, dtype) == ROPE_FUSED
    assert torch.equal(bits(q), bits(rq.to(dtype))) and torch.equal(bits(k), bits(rk.to(dtype)))
    assert torch.equal(bits(k_buf[loc]), bits(convert_for_cache(k, dtype, None)))
    assert torch.equal(bits(v_buf[loc]), bits(v0)) and torch.equal(v, v0)
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[loc] = False
    assert not k_buf[untouched].any() and not v_buf[untouched].any()


@needs_peer
def test_sglang_triton_peer_takes_strided_slots_and_positions():
    q, k, v, cs, pos, loc = make_case(tokens=3)
    loc2 = torch.stack([loc, torch.zeros_like(loc)], 1).reshape(-1)[::2]  # stride 2
    pos2 = torch.stack([pos, pos], 1).reshape(-1).to(torch.int32)[::2]
    k_buf, v_buf = torch.zeros(16, 2, 32, dtype=torch.float16), torch.zeros(16, 2, 32, dtype=torch.float16)
    rq, rk = rope_reference(q, k, cs, pos, True)
    TRITON_PEER.write(q, k, v, k_buf, v_buf, loc2, pos2, cs, True, torch.float16)
    assert torch.equal(q, rq.half()) and torch.equal(k_buf[loc], rk.half())


@needs_peer
def test_sglang_triton_peer_refusals_in_one_line():
    w = TRITON_PEER
    assert w.unsupported_reason(CPU, torch.bfloat16, torch.bfloat16) == (
        "sglang_triton_rope_cache on CPU runs in Triton's interpreter, whose bf16 arithmetic is wrong in this kernel "
        "(negation and products of bf16 values); bf16 runs on CUDA")
    assert "fp8" in str(w.unsupported_reason(CPU, torch.float8_e4m3fn, torch.float16))
    assert w.unsupported_reason(CPU, torch.bfloat16, torch.float16) == (
        "sglang_triton_rope_cache stores into a cache of k's dtype (torch.float16), not torch.bfloat16")
    q, k, v, cs, pos, loc = make_case(rope_dim=16)
    k_buf, v_buf = torch.zeros(16, 2, 32, dtype=torch.float16), torch.zeros(16, 2, 32, dtype=torch.float16)
    q0 = q.clone()
    with pytest.raises(ValueError) as err:
        w.write(q, k, v, k_buf, v_buf, loc, pos, cs, True, torch.float16)
    assert "\n" not in str(err.value) and "rope_dim 16, head_dim 32" in str(err.value)
    assert torch.equal(q, q0) and not k_buf.any()  # refused before anything ran


# -- sgl_kernel_rope_cubin: the cubin reader and the op's host decisions, on CPU ---------------
ROPE_SIG = {"bf16": ("13__nv_bfloat16", "S3_S3_S3_S3_S3_S3_PfPT5_jjjjmmmmmmmmmmmmmmS6_"),
            "fp16": ("6__half", "S3_S3_S3_S3_S3_S3_PfPT5_jjjjmmmmmmmmmmmmmmS6_")}


def _rope_cubin(path, entries=(("0", 128, 8, 16, "bf16"), ("1", 64, 8, 8, "fp16")),
                kinds=("Kernel", "HeadParallelismKernel")):
    names = []
    for interleave, dim, vec, bdx, dt in entries:
        code, sig = ROPE_SIG[dt]
        for kind in kinds:
            base = f"BatchQKApplyRotaryPosIdsCosSinCacheEnhanced{kind}"
            names.append(f"_ZN10flashinfer{len(base)}{base}ILb1ELb{interleave}ELj{dim}ELj{vec}ELj{bdx}E{code}lEEvPT4_{sig}")
    # the save_kv_cache=false instances are in the wheel too, and are not taken
    names.append(names[0].replace("ILb1ELb", "ILb0ELb"))
    path.write_bytes(b"\x7fELF" + b"\x00" * 60 + b"\x00".join([b"", *(n.encode() for n in names), b""]))
    return path


def test_rope_cubin_reader_takes_the_fused_instances_with_their_launch_shape(tmp_path):
    from kvprof.kvcache.writers.rope_sgl_cubin import launch_shape, read_rope_cubin

    cub = read_rope_cubin(_rope_cubin(tmp_path / "r.cubin"))
    assert sorted(cub.kernels, key=str) == [(False, 128, torch.bfloat16), (True, 64, torch.float16)]
    k = cub.kernels[(False, 128, torch.bfloat16)]
    assert (k.vec_size, k.bdx) == (8, 16) == launch_shape(128, 2)
    assert "ILb1ELb0ELj128" in k.token_parallel
    assert "64BatchQKApplyRotaryPosIdsCosSinCacheEnhancedHeadParallelism" in k.head_parallel
    assert launch_shape(512, 2) == (16, 32) and launch_shape(128, 4) == (4, 32)


@pytest.mark.parametrize("make, match", [
    (lambda p: p.write_bytes(b"not an elf"), "not a cubin"),
    (lambda p: _rope_cubin(p, kinds=("Kernel",)), "lacks sgl-kernel's BatchQKApplyRotaryPosIdsCosSinCacheEnhanced"),
    # a launch shape the host code would not pick
    (lambda p: _rope_cubin(p, entries=(("0", 128, 4, 32, "bf16"),)), "lacks"),
    (lambda p: None, "cannot read sgl-kernel rope cubin"),
])
def test_a_bad_rope_cubin_is_one_line(tmp_path, make, match):
    from kvprof.kvcache.writers.rope_sgl_cubin import read_rope_cubin

    path = tmp_path / "bad.cubin"
    make(path)
    with pytest.raises(ValueError, match=match) as info:
        read_rope_cubin(path)
    assert "\n" not in str(info.value)


def _rope_args(tokens=5, hq=8, hk=1, dim=128, rope_dim=None, dtype=torch.bfloat16):
    rows = max(32, 2 * tokens + 2)
    q, k, v, cs, pos, loc = make_case(tokens=tokens, hq=hq, hk=hk, dim=dim, rope_dim=rope_dim, dtype=dtype, rows=rows)
    k_buf = torch.zeros(rows, hk, dim, dtype=dtype)
    return [q, k, v, k_buf, torch.zeros_like(k_buf), loc, pos, cs]


@pytest.mark.parametrize("tokens, block, blocks", [(1, (16, 8), 1), (8, (16, 8), 1), (9, (16, 8), 2),
                                                   (600, (16, 8), 75)])
def test_rope_launch_decisions_are_the_ops(tmp_path, tokens, block, blocks):
    from kvprof.kvcache.writers.rope_sgl_cubin import plan_rope_launch, read_rope_cubin

    cub = read_rope_cubin(_rope_cubin(tmp_path / "r.cubin"))
    args = _rope_args(tokens)
    plan = plan_rope_launch(cub, *args, True, need_cuda=False)
    assert (plan.key, plan.block, plan.blocks_x, plan.heads) == ((False, 128, torch.bfloat16), block, blocks, 9)
    q, k, v, k_buf, v_buf, loc, pos, cs = args
    values = [a.value for a in plan.args]
    assert len(values) == 28 and values[:9] == [t.data_ptr() for t in (q, k, v, q, k, k_buf, v_buf, cs, pos)]
    assert values[9:13] == [tokens, 8, 1, 128]  # nnz, q heads, kv heads, rotary dim (uint32)
    assert values[13:27] == [1024, 128, 128, 128, 128, 128, 1024, 128, 128, 128, 128, 128, 128, 128]
    assert values[27] == loc.data_ptr() and [type(a).__name__ for a in plan.args[9:13]] == ["c_uint"] * 4


@pytest.mark.parametrize("change, match", [
    (lambda a: a.__setitem__(5, a[5].int()), "slots and positions must be contiguous int64"),
    (lambda a: a.__setitem__(3, a[3].half()), "k, v and the caches must be q's dtype"),
    (lambda a: a.__setitem__(7, a[7][:, :8].contiguous()), "rope_dim 8 must be at most head_dim and a multiple of 16"),
    (lambda a: a.__setitem__(2, a[2][:, :, :64]), "v and the cache rows must have k's heads and head size"),
    (lambda a: a.__setitem__(0, torch.zeros(5, 8, 128, dtype=torch.bfloat16).to(torch.float32)),
     "k, v and the caches must be q's dtype"),
])
def test_the_rope_ops_refusals_are_one_line(tmp_path, change, match):
    from kvprof.kvcache.writers.rope_sgl_cubin import plan_rope_launch, read_rope_cubin

    cub = read_rope_cubin(_rope_cubin(tmp_path / "r.cubin"))
    args = _rope_args()
    change(args)
    with pytest.raises(RuntimeError, match=match) as info:
        plan_rope_launch(cub, *args, True, need_cuda=False)
    assert "\n" not in str(info.value)
    with pytest.raises(RuntimeError, match="no kernel for head_dim 64, torch.bfloat16, NeoX"):
        plan_rope_launch(cub, *_rope_args(dim=64), True, need_cuda=False)
    with pytest.raises(RuntimeError, match="all tensors must be CUDA tensors"):
        plan_rope_launch(cub, *_rope_args(), True)


def test_sgl_kernel_rope_cubin_says_why_not_here():
    from kvprof.kvcache.writers.rope_sgl_cubin import SglKernelRopeCubinWriter

    w = SglKernelRopeCubinWriter()
    reason = w.unsupported_reason(CUDA, torch.bfloat16, torch.bfloat16)
    if not torch.cuda.is_available():
        assert reason == "sgl_kernel_rope_cubin needs CUDA"
    assert w.info().extra == {"rope": "fused"} and w.rope_fused
