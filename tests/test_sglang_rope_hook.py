"""The plugin's hook on SGLang's fused rope + store, on its own: no SGLang import. The pools are
stand-ins with SGLang's attribute names, the hooked function is a stand-in with the signature of
``apply_rope_with_cos_sin_cache_inplace`` whose store is kvprof's float32 reference rounded once.
What these check is the plugin's own logic (the K-buffer -> layer map, which calls count, the
routes and their refusals); tests/test_sglang_plugin.py runs the hook inside SGLang's package."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvprof.integrations import sglang as plugin_mod
from kvprof.kvcache.writers.rope_reference import cos_sin_table, rope_reference

HQ, HK, D, SIZE = 4, 2, 64, 31


class Pool:
    """The attributes of SGLang's MHATokenToKVPool that the plugin reads."""

    def __init__(self, layers: int = 3, start: int = 0, ids: tuple[int, ...] | None = None,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        self.size, self.page_size, self.dtype, self.store_dtype = SIZE, 1, dtype, dtype
        self.head_num, self.head_dim, self.v_head_dim = HK, D, D
        self.layer_num, self.start_layer, self.device = layers, start, "cpu"
        self.kv_cache_layout, self.is_quantized_kv_cache = "nhd", False
        self.k_buffer = [torch.zeros(SIZE + 1, HK, D, dtype=dtype) for _ in range(layers)]
        self.v_buffer = [torch.zeros(SIZE + 1, HK, D, dtype=dtype) for _ in range(layers)]
        if ids is not None:
            self.model_layer_ids = ids


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor, *,
               is_neox: bool, rope_dim: int = 0, fused_args: Any = None) -> None:
    """SGLang's wrapper, with kvprof's float32 reference (rounded once) where its CUDA op runs."""
    rq, rk = rope_reference(q, k, cos_sin_cache, positions, is_neox, rope_dim or None)
    q.copy_(rq)
    k.copy_(rk)
    if fused_args is not None:
        fused_args.k_buffer[fused_args.cache_loc] = k.reshape(k.shape[0], -1)
        fused_args.v_buffer[fused_args.cache_loc] = fused_args.value


def fused_arg(pool: Pool, index: int, v: torch.Tensor, loc: torch.Tensor) -> SimpleNamespace:
    """What create_fused_set_kv_buffer_arg builds on CUDA: the layer's buffers as 2-D views."""
    kb, vb = pool.k_buffer[index], pool.v_buffer[index]
    return SimpleNamespace(value=v, k_buffer=kb.view(kb.shape[0], -1), v_buffer=vb.view(vb.shape[0], -1),
                           cache_loc=loc)


def inputs(tokens: int = 5, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, HQ, D, generator=g).bfloat16()
    k = torch.randn(tokens, HK, D, generator=g).bfloat16()
    v = torch.randn(tokens, HK * D, generator=g).bfloat16()
    loc = torch.randperm(SIZE, generator=g)[:tokens] + 1
    pos = torch.randint(0, 512, (tokens,), generator=g)
    return q, k, v, loc, pos


TABLE = cos_sin_table(512, D)


@pytest.fixture
def hook(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """A fresh plugin state and layer map, and the rope hook made over them."""
    monkeypatch.setenv("KVPROF_SGLANG_DIR", str(tmp_path))
    monkeypatch.setattr(plugin_mod, "STATE", plugin_mod._State())
    monkeypatch.setattr(plugin_mod, "LAYERS", plugin_mod._LayerMap(current=lambda: None))
    monkeypatch.setattr(plugin_mod, "_ranks", lambda: (0, 0, 1))  # SGLang's parallel context: none here
    monkeypatch.setattr(plugin_mod, "_rope_params", lambda: ["q", "k", "cos_sin_cache", "positions", "is_neox",
                                                              "rope_dim", "fused_args"])
    return plugin_mod._make_rope_hook()


def call(hook: Any, pool: Pool | None, index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         loc: torch.Tensor, pos: torch.Tensor, fused: bool = True, **extra: Any) -> None:
    args = fused_arg(pool, index, v, loc) if fused and pool is not None else None
    if fused and pool is None:  # buffers of no pool
        kb, vb = torch.zeros(SIZE + 1, HK * D, dtype=k.dtype), torch.zeros(SIZE + 1, HK * D, dtype=k.dtype)
        args = SimpleNamespace(value=v, k_buffer=kb, v_buffer=vb, cache_loc=loc)
    hook(apply_rope, q=q, k=k, cos_sin_cache=TABLE, positions=pos, is_neox=True, fused_args=args, **extra)


def test_layer_map_names_each_buffer_by_address():
    pool, later = Pool(start=4), Pool(layers=2, ids=(3, 11))
    shared = Pool(layers=2)
    shared.k_buffer[1] = shared.k_buffer[0]  # one buffer for two layers: no single layer
    asked = []
    layers = plugin_mod._LayerMap(current=lambda: asked.append(1) or None)
    layers.add(pool)
    layers.add(shared)
    assert layers.find(pool.k_buffer[1].view(SIZE + 1, -1)) == (pool, 1, 5)  # start_layer + index
    assert layers.find(shared.k_buffer[0]) is None
    stray = torch.zeros(4, 4)
    assert layers.find(stray) is None and layers.find(stray) is None
    assert len(asked) == 3  # SGLang's current pool asked once per address not in the map, not again
    layers.add(later)  # a hybrid pool's child: model_layer_ids name its layers
    assert layers.find(later.k_buffer[1]) == (later, 1, 11)
    pool.k_buffer[2] = torch.zeros_like(pool.k_buffer[2])  # buffers made again: the map follows
    assert layers.find(pool.k_buffer[2]) == (pool, 2, 6)


def test_layer_map_does_not_keep_a_pool_alive():
    import gc
    import weakref

    pool = Pool(layers=1)
    layers = plugin_mod._LayerMap(current=lambda: None)
    layers.add(pool)
    buf = pool.k_buffer[0]
    assert layers.find(buf) == (pool, 0, 0)
    gone = weakref.ref(pool)
    del pool
    gc.collect()
    assert gone() is None and layers.find(buf) is None


def test_layer_map_asks_sglang_for_its_current_pool():
    child = Pool(layers=2)
    root = SimpleNamespace(full_kv_pool=child)  # a hybrid pool: its K buffers are its child's
    layers = plugin_mod._LayerMap(current=lambda: root)
    assert layers.find(child.k_buffer[1]) == (child, 1, 1)


def test_rope_only_calls_are_not_writes(hook: Any):
    q, k, v, loc, pos = inputs()
    call(hook, Pool(), 0, q, k, v, loc, pos, fused=False)
    expected = rope_reference(*inputs()[:2], TABLE, pos, True)
    assert torch.equal(q, expected[0].bfloat16())  # the rotation ran
    assert plugin_mod.STATE.paths == {} and plugin_mod.STATE.pools == {}


def test_fused_writes_counted_and_ranged_per_layer(hook: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pool = Pool(start=2)
    plugin_mod.LAYERS.add(pool)  # as the pool-init hook does
    ranged: list[str] = []
    run = plugin_mod._Ranges.run
    monkeypatch.setattr(plugin_mod._Ranges, "run", lambda self, name, *a: ranged.append(name) or run(self, name, *a))
    for index in range(3):
        call(hook, pool, index, *inputs(seed=index))
    call(hook, None, 0, *inputs())  # buffers of no pool kvprof has seen
    names = sorted(ranged)
    assert names == ["set_kv_buffer[sglang_fused_rope]"] + [f"set_kv_buffer[sglang_fused_rope] L{i}"
                                                             for i in (2, 3, 4)]
    state = plugin_mod.STATE
    assert state.paths == {"sglang:fused_into_rope": 4} and state.write_paths == {"fused into rope": 4}
    assert list(state.unattributed.values()) == [1] and not state.fallbacks
    (side,) = tmp_path.glob("kvprof-sglang.TP-0.pid-*.json")
    doc = json.loads(side.read_text())
    assert doc["pools"][0]["native_path"] == "fused_into_rope" and doc["pools"][0]["class"] == "Pool"


def test_rope_writer_takes_the_write(hook: Any):
    """KVPROF_SGLANG_WRITER=rope_triton_fused (Triton's interpreter): the same bits as the
    reference path in the pool, and q/k rotated in place as SGLang's kernel does."""
    plugin_mod.STATE.writer_name = "rope_triton_fused"
    ours, theirs = Pool(), Pool()
    plugin_mod.LAYERS.add(ours)
    q, k, v, loc, pos = inputs()
    q2, k2 = q.clone(), k.clone()
    call(hook, ours, 1, q, k, v, loc, pos)
    apply_rope(q2, k2, TABLE, pos, is_neox=True, fused_args=fused_arg(theirs, 1, v, loc))
    assert torch.equal(q, q2) and torch.equal(k, k2)
    assert all(torch.equal(a, b) for a, b in zip(ours.k_buffer + ours.v_buffer, theirs.k_buffer + theirs.v_buffer))
    assert bool(ours.k_buffer[1].view(torch.uint8).any())
    assert plugin_mod.STATE.paths == {"writer:rope_triton_fused:fused_into_rope": 1}
    assert plugin_mod.STATE.write_paths == {"fused into rope": 1}


def test_rope_writer_falls_back_with_its_reason(hook: Any):
    plugin_mod.STATE.writer_name = "rope_triton_fused"
    pool = Pool()
    plugin_mod.LAYERS.add(pool)
    q, k, v, loc, pos = inputs()
    call(hook, pool, 0, q, k, v, loc, pos.short())  # int16 positions: kvprof's checks refuse them
    call(hook, None, 0, *inputs())
    with pytest.raises(ValueError, match="rope_dim 32"):  # SGLang's own call judges it (here: the stand-in)
        call(hook, pool, 0, *inputs(), rope_dim=32)  # a rope_dim that is not the table's
    state = plugin_mod.STATE
    assert state.paths == {"sglang:fallback": 3, "sglang:fused_into_rope": 3}
    assert state.write_paths == {"fallback": 3}
    reasons = list(state.fallbacks)
    assert "input kvprof's checks refuse (positions must be a 1-D int32 or int64" in reasons[0]
    assert "no pool kvprof has seen" in reasons[1] and "rope_dim 32" in reasons[2]
    assert all("\n" not in r for r in reasons)


def test_each_route_refuses_the_other_kind_of_writer(hook: Any):
    """A store writer leaves SGLang's rope + store alone (said once per pool, not a fallback);
    a rope writer leaves set_kv_buffer alone."""
    state = plugin_mod.STATE
    state.writer_name = "triton_fused"
    pool = Pool()
    plugin_mod.LAYERS.add(pool)
    call(hook, pool, 0, *inputs())
    call(hook, pool, 1, *inputs())
    assert state.paths == {"sglang:fused_into_rope": 2} and not state.fallbacks
    assert "triton_fused is a store writer" in state.pools[id(pool)]["rope_route_reason"]

    rope_state = plugin_mod._State()
    rope_state.writer_name = "rope_triton_fused"
    route, reason = rope_state._build_route(pool)
    assert route is None and "rope_triton_fused is a rope + store writer" in str(reason)
