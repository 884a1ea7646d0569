"""Writers by name, third-party writers, and honest path reporting."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

from kvprof.core.errors import UsageError
from kvprof.kvcache.contracts import WRITER_CONTRACTS, MLAWriter, RopeKVWriter
from kvprof.kvcache.instrument import POOLS, make_layout_pool
from kvprof.kvcache.layouts import LAYOUTS, get_layout
from kvprof.kvcache.layouts.mha import MHALayout
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.registry import entry_point_groups
from kvprof.kvcache.writers import FUSED, TWO_COPIES, KVWriter, WriterRegistry, create_writer, writer_names
from kvprof.kvcache.writers.sgl_kernel import SglKernelWriter
from kvprof.kvcache.writers.two_stream import TwoStreamWriter


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


# -- one registry for every layout -----------------------------------------------------------
class LatentWriter(MLAWriter):
    name = "latent"
    description = "test MLA writer"

    def write(self, kv_buf, loc, nope, rope, dtype, skip):
        kv_buf[loc] = torch.cat((nope, rope), dim=-1).to(kv_buf.dtype)
        return "latent"


class RopeStoreBase:
    """Stands in for a second MHA writer contract (another ``write`` signature, not a KVWriter)."""

    name = "rope_store"
    description = "test rope + store writer"
    fused = True
    devices = ("cpu",)


def test_a_name_is_keyed_by_its_layout():
    reg = WriterRegistry()
    reg.register("same", CountingWriter)
    reg.register("same", LatentWriter, layout="mla")
    assert reg.names() == ["same"] and reg.names("mla") == ["same"] and reg.names("paged") == []
    assert isinstance(reg.create("same"), CountingWriter)
    assert isinstance(reg.create("same", layout="mla"), LatentWriter)
    with pytest.raises(UsageError, match="'same': not a writer of the paged layout"):
        reg.create("same", layout="paged")
    with pytest.raises(ValueError, match="unknown layout 'mqa'"):
        reg.register("w", CountingWriter, layout="mqa")
    with pytest.raises(UsageError, match="unknown layout 'mqa'"):
        reg.names("mqa")


def test_builtins_of_every_layout_are_in_the_one_registry():
    assert writer_names("mla") == ["mla_index_put", "mla_cat_copy", "sglang_mla", "vllm_concat_and_cache_mla",
                                   "mla_triton", "mla_cuda"]
    assert writer_names("paged") == ["paged_index_put", "paged_unfused", "vllm_reshape_and_cache_flash",
                                     "paged_triton", "paged_cuda"]
    assert isinstance(create_writer("mla_index_put", layout="mla"), MLAWriter)
    with pytest.raises(UsageError, match="not a writer of the mha layout"):
        create_writer("mla_index_put")


def test_a_writer_is_checked_against_its_layouts_contract(monkeypatch):
    mod = types.ModuleType("layout_writer_mod")
    mod.latent = LatentWriter
    mod.mha = CountingWriter
    monkeypatch.setitem(sys.modules, "layout_writer_mod", mod)
    w = create_writer("layout_writer_mod:latent", layout="mla")
    assert isinstance(w, LatentWriter) and get_layout("mla").contract_of(w) == "store"
    with pytest.raises(UsageError, match="returned CountingWriter, not a MLAWriter"):
        create_writer("layout_writer_mod:mha", layout="mla")
    with pytest.raises(UsageError, match="returned LatentWriter, not a KVWriter"):
        create_writer("layout_writer_mod:latent")


def test_entry_points_are_read_per_layout(monkeypatch):
    from importlib import metadata

    class EP:
        value = "plugin_mod:make"

        def __init__(self, name, target):
            self.name, self.target = name, target

        def load(self):
            return self.target

    groups = {"kvprof.writers": [EP("old_style", CountingWriter)],
              "kvprof.writers.mha": [EP("new_style", CountingWriter)],
              "kvprof.writers.mla": [EP("plugin_latent", LatentWriter)]}
    monkeypatch.setattr(metadata, "entry_points", lambda group: groups.get(group, []))
    reg = WriterRegistry()
    assert reg.names() == ["old_style", "new_style"] and reg.names("mla") == ["plugin_latent"]
    assert isinstance(reg.create("plugin_latent", layout="mla"), LatentWriter)
    assert entry_point_groups("paged") == ("kvprof.writers.paged",)


def test_a_layout_takes_a_second_writer_contract():
    """A writer that is not a KVWriter belongs to the MHA layout once its contract is added."""
    table = WRITER_CONTRACTS.copy()  # its own table: the one kvprof uses keeps its contracts
    mha = MHALayout(table)
    reg = WriterRegistry(table)
    reg.register("rope_store", RopeStoreBase)
    with pytest.raises(UsageError, match="returned RopeStoreBase, not a KVWriter or RopeKVWriter"):
        reg.create("rope_store")
    mha.add_writer_contract("other", RopeStoreBase)
    w = reg.create("rope_store")
    assert mha.contract_of(w) == "other" and mha.contract_of(CountingWriter()) == "store"
    assert mha.writer_bases == (KVWriter, RopeKVWriter, RopeStoreBase)
    with pytest.raises(ValueError, match="'other' contract is RopeStoreBase already"):
        mha.add_writer_contract("other", CountingWriter)
    assert get_layout("mha").writer_bases == (KVWriter, RopeKVWriter)  # kvprof's rope writers' contract


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layouts_roles_are_its_registered_writers(layout):
    """The roles a layout declares name writers of that layout, with the variant table's role."""
    from kvprof.core.variants import Role, info

    spec = get_layout(layout)
    names = writer_names(layout)
    expected = {"reference": Role.REFERENCE, "unfused": Role.BASELINE, "peer": Role.PEER, "fused": Role.KVPROF}
    for role, members in spec.roles().items():
        for name in members:
            assert name in names and info(name).role is expected[role], (role, name)
    assert set(spec.capture_defaults) <= set(names)
    assert spec.name == layout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_layout_writes_one_layer_as_its_engine_calls_it(layout):
    """Layout.write on the layout's plain pool with its reference writer stores the inputs."""
    spec = get_layout(layout)
    writer = create_writer(spec.reference, layout=layout)
    args = {"mha": (8, 1, torch.bfloat16, 2, 4, 1), "mla": (8, 1, torch.bfloat16, 4, 4, 1),
            "paged": (2, 4, torch.bfloat16, 2, 4, 1)}[layout]
    pool = make_layout_pool(layout, *args, writer=writer)
    assert isinstance(pool, POOLS[layout][0]) and not isinstance(pool, POOLS[layout][1])
    k = torch.randn(2, 2 if layout != "mla" else 1, 4).to(torch.bfloat16)
    spec.write(pool, 0, torch.tensor([3, 5]), k, k)
    assert pool.path_counts.total() == 1
    if layout == "mla":
        assert torch.equal(pool.get_key_buffer(0)[torch.tensor([3, 5])], torch.cat((k, k), dim=-1))
        with pytest.raises(ValueError, match="no k_scale"):
            spec.write(pool, 0, torch.tensor([3]), k[:1], k[:1], k_scale=2.0)
    elif layout == "paged":
        assert torch.equal(pool.get_kv_cache(0)[0].reshape(8, 2, 4)[torch.tensor([3, 5])], k)
    else:
        assert torch.equal(pool.get_key_buffer(0)[torch.tensor([3, 5])], k)


@pytest.mark.slow  # a fresh interpreter (torch's import)
def test_listing_and_building_reference_writers_imports_no_kernel_toolkit():
    """Built-ins load on demand: naming every layout's writers and building the references
    imports neither triton nor sgl-kernel nor SGLang."""
    probe = ("import sys, kvprof.kvcache.writers as w\n"
             "from kvprof.kvcache.layouts import LAYOUTS, get_layout\n"
             "for l in LAYOUTS:\n"
             "    w.writer_names(l); w.create_writer(get_layout(l).reference, layout=l)\n"
             "print(sorted(m for m in ('triton', 'sgl_kernel', 'sglang') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
