"""Writers by name, third-party writers, and honest path reporting."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from kvprof.core.errors import UsageError
from kvprof.pool import KVPool
from kvprof.writers import FUSED, TWO_COPIES, KVWriter, WriterRegistry, create_writer, writer_names
from kvprof.writers.sgl_kernel import SglKernelWriter
from kvprof.writers.two_stream import TwoStreamWriter


def test_builtins_registered_in_order():
    names = writer_names()
    assert names[:8] == ["index_put", "two_stream", "sgl_kernel", "sgl_kernel_cubin", "triton_fused", "cuda_fused",
                         "store_kv_fused", "torch_compile"]


def test_unknown_variant_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown variant 'nope'"):
        create_writer("nope")


class CountingWriter(KVWriter):
    name = "counting"
    description = "test writer"

    def __init__(self, tag: str = "x") -> None:
        self.calls = 0
        self.tag = tag

    def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):
        self.calls += 1
        k_buf[loc] = cache_k
        v_buf[loc] = cache_v
        return "custom"


def test_module_function_spec(monkeypatch):
    mod = types.ModuleType("third_party_writer")
    mod.make = lambda **kw: CountingWriter(**kw)
    monkeypatch.setitem(sys.modules, "third_party_writer", mod)
    w = create_writer("third_party_writer:make", tag="y")
    assert isinstance(w, CountingWriter) and w.tag == "y"
    with pytest.raises(UsageError, match="has no writer factory 'missing'"):
        create_writer("third_party_writer:missing")
    with pytest.raises(UsageError, match="cannot import writer module"):
        create_writer("no_such_module_xyz:make")


def test_factory_must_return_a_writer(monkeypatch):
    mod = types.ModuleType("bad_writer_mod")
    mod.make = lambda: object()
    monkeypatch.setitem(sys.modules, "bad_writer_mod", mod)
    with pytest.raises(UsageError, match="not a KVWriter"):
        create_writer("bad_writer_mod:make")


def test_entry_points_are_discovered(monkeypatch):
    from importlib import metadata

    class EP:
        name = "from_plugin"
        value = "plugin_mod:make"

        def load(self):
            return lambda **kw: CountingWriter()

    monkeypatch.setattr(metadata, "entry_points", lambda group: [EP()] if group == "kvprof.writers" else [])
    reg = WriterRegistry()
    assert "from_plugin" in reg.names()
    assert isinstance(reg.create("from_plugin"), CountingWriter)


def test_registry_refuses_duplicates_and_bad_names():
    reg = WriterRegistry()
    reg.register("a", CountingWriter)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a", CountingWriter)
    with pytest.raises(ValueError, match="identifier"):
        reg.register("not a name", CountingWriter)


def _pool(writer, dtype=torch.bfloat16, dim=64):
    return KVPool(32, 1, dtype, 1, dim, 1, "cpu", writer=writer)


def test_pool_counts_paths():
    w = CountingWriter()
    pool = _pool(w)
    k = torch.randn(2, 1, 64).to(torch.bfloat16)
    pool.set_kv_buffer(0, torch.tensor([1, 2]), k, k)
    assert pool.path_counts == {"custom": 1} and w.calls == 1


def test_two_stream_on_cpu_reports_two_copies_not_streams():
    w = create_writer("two_stream")
    assert w.unsupported_reason(torch.device("cpu"), torch.bfloat16) is None
    pool = _pool(w)
    k = torch.randn(2, 1, 64).to(torch.bfloat16)
    pool.set_kv_buffer(0, torch.tensor([1, 2]), k, k)
    assert pool.path_counts == {TWO_COPIES: 1}
    assert "needs CUDA streams" in TwoStreamWriter(always=True).unsupported_reason(torch.device("cpu"), torch.bfloat16)


def test_sgl_kernel_unavailable_on_cpu_says_why():
    reason = create_writer("sgl_kernel").unsupported_reason(torch.device("cpu"), torch.bfloat16)
    assert reason and "sgl-kernel" in reason


def _fake_store_kv_cache(k_cache, v_cache, loc, k, v):
    """Behaves like sgl-kernel's op: 2-D views, rows must be a multiple of 128 bytes."""
    if k.shape[1] * k.element_size() % 128:
        raise RuntimeError("Last dim size bytes of k/v must be divisible by 128, got: 96")
    k_cache[loc] = k
    v_cache[loc] = v


def test_sgl_kernel_fused_path_is_reported_fused():
    pool = _pool(SglKernelWriter(op=_fake_store_kv_cache, devices=("cpu",)), dim=64)  # 128 B rows
    k = torch.randn(3, 1, 64).to(torch.bfloat16)
    loc = torch.tensor([4, 5, 6])
    pool.set_kv_buffer(0, loc, k, k)
    assert pool.path_counts == {FUSED: 1}
    assert torch.equal(pool.get_key_buffer(0)[loc], k)


def test_sgl_kernel_silent_fallback_is_made_visible():
    pool = _pool(SglKernelWriter(op=_fake_store_kv_cache, devices=("cpu",)), dim=48)  # 96 B rows
    k = torch.randn(3, 1, 48).to(torch.bfloat16)
    loc = torch.tensor([4, 5, 6])
    pool.set_kv_buffer(0, loc, k, k)
    (path,) = pool.path_counts
    assert path.startswith("fallback:") and "divisible by 128" in path
    assert torch.equal(pool.get_key_buffer(0)[loc], k)  # the fallback still wrote the rows
