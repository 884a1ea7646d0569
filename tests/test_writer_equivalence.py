"""Every CPU-runnable writer leaves the pool bitwise identical to the index_put reference.

triton_fused has its own, deeper property tests (tests/test_fused_writers.py); the GPU
writers are checked on the H200 (-m gpu). Here: two_stream, sgl_kernel's path logic with
a stand-in op, torch_compile, and third-party writers, over dtypes (with scales), row
sizes that are not multiples of 128 bytes, loc dtypes, token counts and slot patterns.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.workload import PhaseSpec, SlotAllocator
from kvprof.kvcache.writers import create_writer
from kvprof.kvcache.writers.sgl_kernel import SglKernelWriter

CACHES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]
INPUTS = {torch.float8_e4m3fn: [torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn],
          torch.float8_e5m2: [torch.bfloat16, torch.float32]}


def _fake_op(k_cache, v_cache, loc, k, v):
    if k.shape[1] * k.element_size() % 128 or k.shape[1] != v.shape[1]:
        raise RuntimeError("Last dim size bytes of k/v must be divisible by 128")
    k_cache[loc] = k
    v_cache[loc] = v


@st.composite
def cases(draw, max_tokens: int = 4096):
    cache = draw(st.sampled_from(CACHES))
    inp = draw(st.sampled_from(INPUTS.get(cache, [cache, torch.float32])))
    heads = draw(st.integers(1, 4))
    dim = draw(st.sampled_from([8, 24, 48, 64, 96, 128]))
    vdim = draw(st.sampled_from([dim, dim, 16, 40]))
    pattern = draw(st.sampled_from(["random", "contiguous", "paged"]))
    page = draw(st.sampled_from([4, 16])) if pattern == "paged" else 1
    tokens = draw(st.one_of(st.just(0), st.integers(1, 64), st.integers(65, max_tokens)))
    loc_dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    scale = draw(st.sampled_from([None, 0.5, 3.0, 0.0137])) if inp != cache else None
    seed = draw(st.integers(0, 2**16))
    return cache, inp, heads, dim, vdim, pattern, page, tokens, loc_dtype, scale, seed


def _check(writer, case) -> None:
    cache, inp, heads, dim, vdim, pattern, page, tokens, loc_dtype, scale, seed = case
    size = max(2 * tokens, 64)
    size += (-size) % page
    pools = [KVPool(size, page, cache, heads, dim, 2, "cpu", writer=w, v_head_dim=vdim)
             for w in (create_writer("index_put"), writer)]
    if tokens:
        slots = SlotAllocator(size + page, pattern, page, seed).steps(PhaseSpec("prefill", tokens, 1, False))[0]
    else:
        slots = np.empty(0, dtype=np.int64)
    loc = torch.from_numpy(slots).to(loc_dtype)
    gen = torch.Generator().manual_seed(seed)
    k = (torch.randn(tokens, heads, dim, generator=gen) * 4).to(inp)
    v = (torch.randn(tokens, heads, vdim, generator=gen) * 4).to(inp)
    for p in pools:
        p.set_kv_buffer(1, loc, k, v, scale, scale)
    ref, got = pools
    for a, b in zip(ref.k_buffer + ref.v_buffer, got.k_buffer + got.v_buffer):
        assert torch.equal(a.view(torch.uint8) if a.dtype != torch.uint8 else a,
                           b.view(torch.uint8) if b.dtype != torch.uint8 else b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_two_stream_matches_index_put(case):
    _check(create_writer("two_stream"), case)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_sgl_kernel_path_logic_matches_index_put(case):
    _check(SglKernelWriter(op=_fake_op, devices=("cpu",)), case)


_COMPILED = None


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(max_tokens=512))
def test_torch_compile_matches_index_put(case):
    global _COMPILED
    if _COMPILED is None:
        torch._dynamo.reset()  # torch.compile's cache is per function: another file's compiles count too
        _COMPILED = create_writer("torch_compile")  # one writer: compile once per dtype combination
    _check(_COMPILED, case)
