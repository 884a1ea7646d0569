"""The vLLM plugin's own logic without vLLM: layer names, the packed cache as rows of one head
(the route's mapping, against vLLM's packed layout built here with torch), the refusal of the
CPU backend's packed blocks, the fused-op hook and the forward-step ledger. vLLM itself runs in
tests/test_vllm_plugin.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvprof.integrations import core, vllm as plugin_mod


@pytest.fixture
def state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.setenv("KVPROF_VLLM_DIR", str(tmp_path))
    fresh = plugin_mod._State()
    monkeypatch.setattr(plugin_mod, "STATE", fresh)
    monkeypatch.setattr(plugin_mod, "_ranks", lambda: (0, 0, 1))
    return fresh


@pytest.mark.parametrize(("name", "layer"), [("model.layers.3.self_attn.attn", 3), ("layers.0.attn", 0),
                                             ("model.decoder.attn", None), ("a.1.b.2", None), (None, None)])
def test_layer_number(name: Any, layer: int | None) -> None:
    assert plugin_mod.layer_number(name) == layer


class TritonAttentionImpl:
    """The attributes of vLLM's CUDA backends' implementation the route reads."""

    def __init__(self, head_size: int) -> None:
        self.head_size, self.kv_cache_dtype, self.attn_type = head_size, "auto", "decoder"


class CPUAttentionBackendImpl(TritonAttentionImpl):
    isa = "vec"


@pytest.mark.parametrize(("dtype", "heads", "dim", "writer"), [(torch.bfloat16, 2, 64, "paged_index_put"),
                                                             (torch.float16, 3, 32, "paged_unfused"),
                                                             (torch.float32, 1, 16, "paged_triton")])
def test_route_writes_where_the_packed_layout_puts_each_row(state: Any, dtype: torch.dtype, heads: int, dim: int,
                                                            writer: str) -> None:
    """vLLM's packed [blocks, heads, block_size, 2*head_size] cache: token t's head h goes to
    cache[slot // bs, h, slot % bs, :D] (K) and [..., D:] (V); -1 slots untouched; nothing else."""
    blocks, bs, tokens = 5, 4, 9
    gen = torch.Generator().manual_seed(heads)
    impl = TritonAttentionImpl(dim)
    cache = torch.randn(blocks, heads, bs, 2 * dim, generator=gen).to(dtype)
    qkv = torch.randn(tokens + 2, 3, heads, dim, generator=gen).to(dtype)
    key, value = qkv[:, 1], qkv[:, 2]  # strided views, two padded rows, as vLLM passes them
    slots = torch.randperm(blocks * bs, generator=gen)[:tokens]
    slots[[2, 6]] = -1
    expected = cache.clone()
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expected[s // bs, :, s % bs, :dim] = key[t]
            expected[s // bs, :, s % bs, dim:] = value[t]
    state.writer_name = writer
    route, reason = plugin_mod._Route.build(state, impl, cache)
    assert route is not None, reason
    prepared = route.prepare(impl, None, key, value, cache, slots)
    assert not isinstance(prepared, str), prepared
    route.write(prepared)
    assert torch.equal(cache.view(torch.uint8), expected.view(torch.uint8))
    (key,) = state.paths
    assert key.startswith(f"writer:{writer}:") and state.paths[key] == 1


def test_cpu_backend_packed_blocks_are_refused(state: Any) -> None:
    impl = CPUAttentionBackendImpl(64)
    cache = torch.zeros(2, 2, 16, 128, dtype=torch.bfloat16)
    why = plugin_mod.kv_views(impl, cache)
    assert isinstance(why, str) and "packs each block for its ISA (vec" in why
    other = type("SomeNewImpl", (TritonAttentionImpl,), {})(64)
    assert "kvprof does not know how it reads its cache" in str(plugin_mod.kv_views(other, cache))
    wrong = TritonAttentionImpl(32)
    assert "is not [blocks, heads, block_size, 2*32]" in str(plugin_mod.kv_views(wrong, cache))


def test_fused_op_hook_ranges_counts_and_passes_through(state: Any, tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []

    def concat_and_cache_mla_rope_fused(positions: Any, q_pe: Any, k_pe: Any, kv_c: Any, cos_sin_cache: Any,
                                        is_neox: bool, slot_mapping: Any, kv_cache: Any, kv_cache_dtype: str,
                                        kv_cache_scale: Any) -> None:
        calls.append((slot_mapping, kv_cache))

    hook = plugin_mod.make_op_hook(concat_and_cache_mla_rope_fused, "concat_and_cache_mla_rope_fused",
                                   "vllm_mla_fused_rope", "kv_cache", "slot_mapping")
    cache = torch.zeros(4, 16, 576)
    state.layer_names[cache.data_ptr()] = "model.layers.5.self_attn.attn"
    slots = torch.arange(6)
    hook(None, None, None, None, None, True, slots, cache, "auto", None)
    assert calls == [(slots, cache)]
    assert state.paths == {"vllm:vllm_mla_fused_rope": 1}
    assert state.ledger.seen == {5: 6}
    (side,) = tmp_path.glob("kvprof-vllm.TP-0.pid-*.json")
    doc = json.loads(side.read_text())
    assert doc["engine"] == "vllm" and doc["pools"][0]["native_path"] == "concat_and_cache_mla_rope_fused"
    assert plugin_mod.make_op_hook(hook, "x", "y", "kv_cache", "slot_mapping") is None  # hooked once


def test_forward_step_ledger(state: Any) -> None:
    """A step asks each layer with a cache for its slots; a layer sharing another's cache, one
    whose cache is not allocated, and a FULL-graph step are not expected of the hooks."""
    layers = {"model.layers.0.attn": SimpleNamespace(kv_sharing_target_layer_name=None, kv_cache=torch.ones(2)),
              "model.layers.1.attn": SimpleNamespace(kv_sharing_target_layer_name="model.layers.0.attn",
                                                     kv_cache=torch.ones(2)),
              "model.layers.2.attn": SimpleNamespace(kv_sharing_target_layer_name=None, kv_cache=torch.ones(0)),
              "model.layers.3.attn": SimpleNamespace(kv_sharing_target_layer_name=None, kv_cache=torch.ones(2))}
    slots = {name: torch.arange(7) for name in layers}
    plugin_mod.note_step(state, SimpleNamespace(slot_mapping=slots, no_compile_layers=layers,
                                                cudagraph_runtime_mode=SimpleNamespace(name="NONE")))
    plugin_mod.note_step(state, SimpleNamespace(slot_mapping=slots, no_compile_layers=layers,
                                                cudagraph_runtime_mode=SimpleNamespace(name="FULL")))
    plugin_mod.note_step(state, SimpleNamespace(slot_mapping={}, no_compile_layers=layers))  # a dummy run
    record = state.ledger.record()
    assert (record.steps, record.graph_steps, record.expected) == (2, 1, {"0": 7, "3": 7})
    core.GRAPHS.begin(object())  # writes captured into a graph are no step's
    try:
        state.saw(0, 7)
    finally:
        core.GRAPHS.end()
    state.saw(0, 7)
    assert state.ledger.seen == {0: 7}


def test_plugin_from_its_variables(state: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """plugin() as vLLM calls it: off without KVPROF_VLLM; with it, KVPROF_VLLM_WRITER names the
    writer, a layer's construction hooks its implementation class once, and that class's writes
    are ranged, routed and described in the sidecar (in KVPROF_VLLM_DIR). The layer class is a
    stand-in module's (vLLM is not imported here); torch's CUDA graph class is left alone."""
    import sys

    class TritonAttentionImpl:  # the CUDA backends' attributes the hook and route read
        head_size, kv_cache_dtype, attn_type = 16, "auto", "decoder"

        def do_kv_cache_update(self, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> None:
            raise AssertionError("vLLM's own write ran: the route should have taken it")

    class Attention:
        def __init__(self, name: str) -> None:
            self.layer_name, self.impl = name, TritonAttentionImpl()

    stand_in = SimpleNamespace(Attention=Attention)
    monkeypatch.setitem(sys.modules, "kvprof_test_vllm_layers", stand_in)  # type: ignore[arg-type]
    monkeypatch.setattr(plugin_mod, "LAYER_CLASSES", (("kvprof_test_vllm_layers", "Attention"),))
    monkeypatch.setattr(plugin_mod, "FUSED_OPS", ())
    monkeypatch.setattr(plugin_mod, "_hook_forward_context", lambda: None)
    monkeypatch.setattr(plugin_mod.core, "hook_graphs", lambda *a: "not hooked: a test")
    monkeypatch.setattr(plugin_mod.atexit, "register", lambda fn: None)
    monkeypatch.delenv("KVPROF_VLLM", raising=False)
    monkeypatch.setenv("KVPROF_VLLM_WRITER", "paged_index_put")
    plugin_mod.plugin()
    assert state.hooked == [] and state.writer_name is None  # off

    monkeypatch.setenv("KVPROF_VLLM", "1")
    plugin_mod.plugin()
    assert state.writer_name == "paged_index_put" and state.hooked == ["Attention.__init__"]
    layers = [Attention(f"model.layers.{i}.self_attn.attn") for i in range(2)]
    assert state.hooked == ["Attention.__init__", "TritonAttentionImpl.do_kv_cache_update"]  # hooked once
    cache = torch.zeros(3, 2, 4, 32)
    key, value = torch.ones(2, 2, 16), torch.full((2, 2, 16), 2.0)
    for layer in layers:
        layer.impl.do_kv_cache_update(layer, key, value, cache, torch.tensor([5, -1]))
    assert torch.equal(cache[1, :, 1, :16], key[0]) and torch.equal(cache[1, :, 1, 16:], value[0])
    assert int((cache != 0).any(-1).sum()) == 2  # one token of two heads; the -1 slot skipped
    assert state.paths == {"writer:paged_index_put:two_index_puts": 2}
    assert state.ledger.seen == {0: 2, 1: 2}
    (side,) = tmp_path.glob("kvprof-vllm.TP-0.pid-*.json")
    pool = json.loads(side.read_text())["pools"][0]
    assert (pool["class"], pool["variant"], pool["route"], pool["head_num"]) == (
        "TritonAttentionImpl", "vllm_mha", "writer:paged_index_put", 2)
    monkeypatch.setattr(TritonAttentionImpl, "do_kv_cache_update",
                        TritonAttentionImpl.do_kv_cache_update.__wrapped__)  # as it was
