"""GPU-only behaviour of the stream-based and graph paths (run on the H200: gpu/run_gpu_checks.sh)."""

from __future__ import annotations

import pytest
import torch

from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.writers import TWO_COPIES, TWO_STREAMS, create_writer

pytestmark = pytest.mark.gpu


def _pools(variant: str, **opts):
    dev = torch.device("cuda")
    ref = KVPool(4096, 1, torch.bfloat16, 1, 128, 2, dev, writer=create_writer("index_put"))
    w = create_writer(variant, **opts)
    w.prepare(dev)
    got = KVPool(4096, 1, torch.bfloat16, 1, 128, 2, dev, writer=w)
    return ref, got


def _inputs(tokens: int, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    loc = (torch.randperm(4095, generator=g)[:tokens] + 1).cuda()
    k = torch.randn(tokens, 1, 128, generator=g).to(torch.bfloat16).cuda()
    v = torch.randn(tokens, 1, 128, generator=g).to(torch.bfloat16).cuda()
    return loc, k, v


def test_two_stream_uses_its_second_stream_only_under_graph_capture():
    ref, got = _pools("two_stream")
    loc, k, v = _inputs(10)
    got.set_kv_buffer(0, loc, k, v)
    assert got.path_counts == {TWO_COPIES: 1}
    static = loc.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got.set_kv_buffer(1, static, k, v)
    assert got.path_counts[TWO_STREAMS] == 1
    graph.replay()
    torch.cuda.synchronize()
    ref.set_kv_buffer(0, loc, k, v)
    ref.set_kv_buffer(1, loc, k, v)
    for a, b in zip(ref.k_buffer + ref.v_buffer, got.k_buffer + got.v_buffer):
        assert torch.equal(a, b)


def test_two_stream_always_overlaps_eagerly_too():
    ref, got = _pools("two_stream", always=True)
    loc, k, v = _inputs(33)
    got.set_kv_buffer(0, loc, k, v)
    torch.cuda.synchronize()
    assert got.path_counts == {TWO_STREAMS: 1}
    ref.set_kv_buffer(0, loc, k, v)
    assert torch.equal(ref.k_buffer[0], got.k_buffer[0]) and torch.equal(ref.v_buffer[0], got.v_buffer[0])


@pytest.mark.parametrize("variant", ["index_put", "two_stream", "triton_fused", "cuda_fused"])
def test_graph_replay_writes_new_slots_each_step(variant):
    ref, got = _pools(variant)
    static = torch.zeros(16, dtype=torch.int64, device="cuda")
    _, k, v = _inputs(16)
    graph = torch.cuda.CUDAGraph()
    got.set_kv_buffer(0, static + 1, k, v)  # warm-up (compiles)
    torch.cuda.synchronize()
    got.k_buffer[0].zero_()
    got.v_buffer[0].zero_()
    with torch.cuda.graph(graph):
        got.set_kv_buffer(0, static, k, v)
    for step in range(3):
        loc, _, _ = _inputs(16, seed=step + 1)
        static.copy_(loc)
        graph.replay()
        ref.set_kv_buffer(0, loc, k, v)
    torch.cuda.synchronize()  # (capture records kernels, it runs none)
    assert torch.equal(ref.k_buffer[0], got.k_buffer[0]) and torch.equal(ref.v_buffer[0], got.v_buffer[0])


def test_sgl_kernel_says_whether_it_is_installed():
    w = create_writer("sgl_kernel")
    reason = w.unsupported_reason(torch.device("cuda"), torch.bfloat16)
    try:
        import sgl_kernel  # noqa: F401
    except Exception:  # noqa: BLE001
        assert reason and "not installed" in reason
        return
    try:  # an sgl-kernel without the op (or a stand-in package) imports but cannot run
        op = torch.ops.sgl_kernel.store_kv_cache
    except (AttributeError, RuntimeError):
        assert reason == "sgl-kernel is installed but has no store_kv_cache op"
    else:
        assert op is not None and reason is None
