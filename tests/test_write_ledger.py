"""The write ledger: per forward step, the writes the engine was asked to make against the writes
a hook saw, and what analyze prints from it.

SGLang's side runs the plugin's hooks as SGLang's HookRegistry would call them (an AROUND hook
gets the original first) over stand-in pools with SGLang's attribute names: ``forward_context``
(a step: its batch's ``out_cache_loc`` times the pool's layers), ``RadixAttention.forward`` (a
``save_kv_cache=False`` call names the path) and the bypass paths, whose parameter names are read
from SGLang 0.5.23's real functions where its package imports (``bf16_rope_scale_store``,
``fused_fp8_qkv_kv_cache``); their CUDA kernels are stand-ins that store the rows. The vLLM side
runs in vLLM itself (tests/test_vllm_plugin.py); SGLang's real forward steps in
tests/test_sglang_plugin.py (``test_write_ledger_in_sglang_forward_steps``)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvprof.cli import main
from kvprof.core.sidecar import SIDECAR_SCHEMA, Sidecar, SidecarLedger, encode_sidecar
from kvprof.integrations import core, sglang as plugin_mod
from kvprof.report.write_kernels import ledger_lines

HK, D, SIZE, LAYERS = 2, 64, 31, 3


class Pool:
    """The attributes of SGLang's MHATokenToKVPool that the plugin reads."""

    def __init__(self) -> None:
        self.size, self.page_size, self.dtype, self.store_dtype = SIZE, 1, torch.bfloat16, torch.bfloat16
        self.head_num, self.head_dim, self.v_head_dim = HK, D, D
        self.layer_num, self.start_layer, self.device = LAYERS, 0, "cpu"
        self.kv_cache_layout, self.is_quantized_kv_cache = "nhd", False
        self.k_buffer = [torch.zeros(SIZE + 1, HK, D, dtype=torch.bfloat16) for _ in range(LAYERS)]
        self.v_buffer = [torch.zeros(SIZE + 1, HK, D, dtype=torch.bfloat16) for _ in range(LAYERS)]


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    monkeypatch.setenv("KVPROF_SGLANG_DIR", str(tmp_path))
    monkeypatch.setattr(plugin_mod, "STATE", plugin_mod._State())
    monkeypatch.setattr(plugin_mod, "LAYERS", plugin_mod._LayerMap(current=lambda: None))
    monkeypatch.setattr(plugin_mod, "GRAPHS", core.Graphs())
    monkeypatch.setattr(plugin_mod, "_ranks", lambda: (0, 0, 1))
    return plugin_mod


# SGLang 0.5.23's parameter names of the bypass paths, where SGLang does not import here
PARAMS_0_5_23 = {
    "bf16_rope_scale_store": ["qkv", "query", "key_cache", "value_cache", "cos_sin", "positions", "locations",
                              "value_scale"],
    "fused_fp8_qkv_kv_cache": ["q", "k", "v", "k_cache", "v_cache", "cache_loc", "k_scale", "v_scale"],
    "fused_qk_norm_rope_swa_store": ["q", "kv", "q_norm_weight", "kv_norm_weight", "q_rms_eps", "kv_rms_eps",
                                     "rope_head_dim", "cos_cache", "sin_cache", "positions", "swa_cache",
                                     "swa_loc", "swa_page_size", "q_out", "dtype", "bf16_store", "fp8_2buff",
                                     "swa_rope_cache", "k_nope_out", "k_rope_out", "q_rope_out"],
    "HPCOpsAttnBackend.fused_qk_rope_store_kv_fp8": ["self", "layer", "forward_batch", "qkv", "cos_sin_cache",
                                                     "q_norm_weight", "k_norm_weight", "qk_norm_policy"],
    "DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused_norm_rope": [
        "self", "layer_id", "swa_loc", "kv", "kv_weight", "eps", "freqs_cis", "positions", "q"],
    "DeepSeekV4TokenToKVPool.set_unified_key_buffer_radix_fused_norm_rope": [
        "self", "layer_id", "swa_loc", "kv", "kv_weight", "eps", "freqs_cis", "positions"],
    "DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused": ["self", "layer_id", "swa_loc", "cache_k"],
    "DeepSeekV4TokenToKVPool.set_swa_key_buffer": ["self", "layer_id", "loc", "cache_nope_fp8_rope_bf16_pack"],
    "DeepSeekV4TokenToKVPool.set_extra_key_buffer_fused": ["self", "layer_id", "loc", "cache_k", "freqs_cis"],
    "DeepSeekV4TokenToKVPool.set_extra_key_buffer": ["self", "layer_id", "loc", "cache_nope_fp8_rope_bf16_pack"],
    "DeepSeekV4TokenToKVPool.set_index_k_fused": ["self", "layer_id", "loc", "cache_k"],
    "DeepSeekV4TokenToKVPool.set_index_k_fp4": ["self", "layer_id", "loc", "cache_k"],
    "DeepSeekV4TokenToKVPool.set_index_k_scale_buffer": ["self", "layer_id", "loc", "index_k", "index_k_scale"],
    "compress_norm_rope_store": ["kv", "plan", "norm_weight", "norm_eps", "freq_cis", "out_loc", "kvcache",
                                 "page_size", "use_fp4", "bf16_store", "kvcache_scale", "rope_cache",
                                 "fp4_k_write_metadata", "layout", "fp8_2buff", "kvcache_rope"],
    "index_k_rope_pack": ["x", "freqs", "rope_dim", "positions", "cache", "loc"],
    "index_k_norm_rope_pack_store": ["input", "norm_weight", "eps", "freqs_cis", "positions", "loc", "cache", "ratio"],
}


def _params(bypass: plugin_mod.Bypass) -> list[str]:
    """The real function's parameter names where SGLang imports here, else the 0.5.23 ones."""
    try:
        return plugin_mod._param_names(plugin_mod._resolve(bypass.module, bypass.function))
    except Exception:  # noqa: BLE001 - SGLang not installed: its signatures as of 0.5.23
        return PARAMS_0_5_23[bypass.function]


def _bypass(plugin: Any, function: str) -> Any:
    return next(b for b in plugin.BYPASSES if b.function == function)


def store(**kw: Any) -> None:
    """The bypass kernels' stand-in: the rows stored at their slots."""
    k_cache = kw.get("key_cache", kw.get("k_cache"))
    loc = kw.get("locations", kw.get("cache_loc"))
    k_cache[loc] = 1


@pytest.mark.slow  # imports SGLang's attention backends (about 8 s on a 2-core machine)
def test_sglang_0_5_23_bypass_signatures_are_what_the_hooks_read() -> None:
    """Where SGLang imports, its bypass functions take the slots and the K cache or layer the hooks
    read, with the names of 0.5.23."""
    pytest.importorskip("sglang")
    assert {b.function for b in plugin_mod.BYPASSES} == set(PARAMS_0_5_23)
    for bypass in plugin_mod.BYPASSES:
        params = _params(bypass)
        assert params == PARAMS_0_5_23[bypass.function]
        assert bypass.loc in params and (bypass.k_cache in params or bypass.layer in params), (bypass.function, params)
        assert bypass.pool is None or bypass.pool in params, (bypass.function, params)


@contextlib.contextmanager
def _forward_context(ctx: Any, *, forward_batch: Any = None) -> Any:
    """SGLang's forward_context, as far as the hook sees it."""
    yield


def _step(plugin: Any, pool: Pool, tokens: int, write: Any, inner: Any = None) -> None:
    """One forward step inside the hooked forward_context; ``write(layer, loc)`` is the model's
    write (it returns the attention call's save_kv_cache); ``inner()``, if given, runs inside a
    nested forward_context of the same step after the layers (a graph runner's)."""
    ctx = SimpleNamespace(attn_backend=SimpleNamespace(token_to_kv_pool=pool))
    batch = SimpleNamespace(out_cache_loc=torch.arange(1, tokens + 1))
    attention = plugin._make_attention_hook()
    step = plugin._make_step_hook()
    with step(_forward_context, ctx, forward_batch=batch):
        for layer in range(LAYERS):
            layer_obj = SimpleNamespace(layer_id=layer)
            save = write(layer, batch.out_cache_loc)
            attention(lambda *a, **k: None, layer_obj, None, None, None, batch, save)
        if inner is not None:
            with step(_forward_context, ctx, forward_batch=batch):
                inner()


def test_every_write_through_a_bypass_is_seen(plugin: Any) -> None:
    """A model that passes save_kv_cache=False and writes through bf16_rope_scale_store: each
    write ranged as its own variant, counted, and the ledger says every write was seen."""
    pool = Pool()
    plugin.LAYERS.add(pool)
    bypass = _bypass(plugin, "bf16_rope_scale_store")
    hook = plugin._make_bypass_hook(bypass, _params(bypass))

    def write(layer: int, loc: torch.Tensor) -> bool:
        hook(store, qkv=None, query=None, key_cache=pool.k_buffer[layer], value_cache=pool.v_buffer[layer],
             cos_sin=None, positions=None, locations=loc, value_scale=1.0)
        return False  # the model's attention call: save_kv_cache=False

    for tokens in (5, 1, 1):
        _step(plugin, pool, tokens, write)
    state = plugin.STATE
    assert state.paths == {"sglang:sglang_bf16_rope_store": 3 * LAYERS}
    assert state.write_paths == {"fused into rope": 3 * LAYERS}
    assert all((pool.k_buffer[i][1:6] == 1).all() for i in range(LAYERS))
    ledger = state.ledger.record()
    assert ledger is not None and ledger.steps == 3
    assert ledger.expected == ledger.seen == {str(i): 7 for i in range(LAYERS)}
    rows, lines = ledger_lines(json.loads(encode_sidecar(state.sidecar())))
    assert rows == [] and "every write was seen: 21 tokens asked of 3 layers over 3 steps" in lines[0]
    (pool_info,) = state.pools.values()
    assert pool_info["native_path"] == "bf16_rope_scale_store" and pool_info["variant"] == "sglang_bf16_rope_store"


def test_writes_no_hook_saw_are_named(plugin: Any) -> None:
    """Layer 1 writes through a kernel kvprof does not hook, after save_kv_cache=False: the ledger
    counts its tokens unseen and names the path; the hooked layers are seen."""
    pool = Pool()
    plugin.LAYERS.add(pool)
    bypass = _bypass(plugin, "fused_fp8_qkv_kv_cache")
    hook = plugin._make_bypass_hook(bypass, _params(bypass))

    def write(layer: int, loc: torch.Tensor) -> bool:
        if layer == 1:
            pool.k_buffer[1][loc] = 2  # the model's own kernel: no hook
            return False
        hook(store, q=None, k=None, v=None, k_cache=pool.k_buffer[layer], v_cache=pool.v_buffer[layer],
             cache_loc=loc)
        return True

    _step(plugin, pool, 4, write)
    doc = json.loads(encode_sidecar(plugin.STATE.sidecar()))
    rows, lines = ledger_lines(doc)
    assert rows == [("1", 4, 0, 4)]
    assert "4 of 12 tokens asked were written where no hook saw them, over 1 steps" in lines[0]
    assert "save_kv_cache=False L1: the model writes K/V itself (4 tokens)" in lines[1]


def test_graph_replay_steps_and_captured_writes_are_kept_apart(plugin: Any) -> None:
    """Writes captured into a CUDA graph are no step's; a step that replays a graph is counted apart."""
    pool = Pool()
    plugin.LAYERS.add(pool)
    bypass = _bypass(plugin, "fused_fp8_qkv_kv_cache")
    hook = plugin._make_bypass_hook(bypass, _params(bypass))
    graphs = plugin.GRAPHS
    graphs.begin(object())
    hook(store, q=None, k=None, v=None, k_cache=pool.k_buffer[0], v_cache=pool.v_buffer[0],
         cache_loc=torch.arange(1, 3))
    graphs.end()

    def replayed(layer: int, loc: torch.Tensor) -> bool:
        graphs.replays += layer == 0
        return True

    _step(plugin, pool, 2, replayed)
    ledger = plugin.STATE.ledger.record()
    assert ledger is not None and (ledger.steps, ledger.graph_steps) == (1, 1)
    assert ledger.expected == {} and ledger.seen == {}
    _, lines = ledger_lines(json.loads(encode_sidecar(plugin.STATE.sidecar())))
    assert "1 of them replayed CUDA graphs" in lines[0]


def test_analyze_prints_the_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """analyze on an engine's folder: the ledger's verdict per process, from the sidecars."""
    from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build, dumps

    folder = tmp_path / "engine"
    folder.mkdir()
    doc, _ = build(TraceSpec(variant="vllm_mha", layers=[0, 1], phases=[PhaseSpec("decode", 8, 2)],
                             write=WriteSpec([KernelSpec(7, 0, 1000, name="reshape_and_cache_flash_kernel")])))
    del doc["kvprof"]  # the engine's own trace: no kvprof capture metadata
    (folder / "engine.pt.trace.json").write_bytes(dumps(doc))
    for pid, seen in ((11, {"0": 8, "1": 8}), (12, {"0": 8})):
        side = Sidecar(schema=SIDECAR_SCHEMA, engine="vllm", pid=pid, tp_rank=0, tp_size=1,
                       ledger=SidecarLedger(steps=4, expected={"0": 8, "1": 8}, seen=seen))
        (folder / f"kvprof-vllm.TP-0.pid-{pid}.json").write_bytes(encode_sidecar(side))
    assert main(["analyze", str(folder), "--no-files"]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "write ledger (vllm TP 0 pid 11): every write was seen: 16 tokens asked of 2 layers over 4 steps" in printed
    assert "write ledger (vllm TP 0 pid 12): 8 of 16 tokens asked were written where no hook saw them" in printed
    assert "no hook named their path" in printed


def test_nested_contexts_are_one_step_and_a_capture_is_none(plugin: Any) -> None:
    """A forward_context inside the step's (a graph runner's, TBO's) is part of that step, one without
    a batch around it bounds nothing; a forward that captured a CUDA graph is no step, its warm-up
    writes dropped with it; a failed step too."""
    pool = Pool()
    plugin.LAYERS.add(pool)
    bypass = _bypass(plugin, "fused_fp8_qkv_kv_cache")
    hook = plugin._make_bypass_hook(bypass, _params(bypass))

    def write(layer: int, loc: torch.Tensor) -> bool:
        hook(store, q=None, k=None, v=None, k_cache=pool.k_buffer[layer], v_cache=pool.v_buffer[layer],
             cache_loc=loc)
        return False

    ctx = SimpleNamespace(attn_backend=SimpleNamespace(token_to_kv_pool=pool))
    with plugin._make_step_hook()(_forward_context, ctx):  # a scope without a batch around the step
        _step(plugin, pool, 3, write, inner=lambda: None)
    graphs = plugin.GRAPHS

    def capture() -> None:
        graphs.begin(object())
        hook(store, q=None, k=None, v=None, k_cache=pool.k_buffer[0], v_cache=pool.v_buffer[0],
             cache_loc=torch.arange(1, 3))
        graphs.end()

    _step(plugin, pool, 2, write, inner=capture)  # warm-up writes of 2 tokens per layer, then a capture
    with pytest.raises(RuntimeError):
        def fail(layer: int, loc: torch.Tensor) -> bool:
            raise RuntimeError("the forward failed")
        _step(plugin, pool, 4, fail)
    ledger = plugin.STATE.ledger.record()
    assert ledger is not None and (ledger.steps, ledger.graph_steps) == (1, 0)
    assert ledger.expected == ledger.seen == {str(i): 3 for i in range(LAYERS)}
    assert ledger.unseen_paths == {f"save_kv_cache=False L{i}: the model writes K/V itself": 3 for i in range(LAYERS)}
    assert plugin.STATE.paths == {"sglang:sglang_trtllm_fp8_qkv": 2 * LAYERS + 1}


class SwaPool(Pool):
    """DeepSeek-V4's pool as the plugin reads it: each layer's SWA buffer from get_swa_raw_buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.swa = [torch.zeros(4, 2 * D * HK, dtype=torch.uint8) for _ in range(LAYERS)]

    def get_swa_raw_buffer(self, layer_id: int) -> torch.Tensor:
        return self.swa[layer_id - self.start_layer]


def test_dsv4_swa_store_ranged_with_its_layer(plugin: Any) -> None:
    """DeepSeek-V4's fused_qk_norm_rope_swa_store: a call that stores (swa_cache, swa_loc) is ranged
    and seen, its layer from its SWA buffer's address; a call without swa_cache only rotates: no
    range, nothing counted."""
    pool = SwaPool()
    pool.start_layer = 2
    plugin.LAYERS.add(pool)
    hook = plugin._make_bypass_hook(_bypass(plugin, "fused_qk_norm_rope_swa_store"),
                                    PARAMS_0_5_23["fused_qk_norm_rope_swa_store"])
    calls: list[Any] = []
    kernel = lambda *a, **k: calls.append(k) or "q"  # noqa: E731 - the kernel's stand-in

    def write(layer: int, loc: torch.Tensor) -> bool:
        assert hook(kernel, None, None, None, None, 1e-6, 1e-6, 64, None, None, None) == "q"  # rotate only
        hook(kernel, q=None, kv=None, q_norm_weight=None, kv_norm_weight=None, q_rms_eps=1e-6, kv_rms_eps=1e-6,
             rope_head_dim=64, cos_cache=None, sin_cache=None, positions=None,
             swa_cache=pool.get_swa_raw_buffer(layer + 2), swa_loc=loc)
        return False

    ctx = SimpleNamespace(attn_backend=SimpleNamespace(token_to_kv_pool=pool))
    batch = SimpleNamespace(out_cache_loc=torch.arange(1, 4))
    with plugin._make_step_hook()(_forward_context, ctx, forward_batch=batch):
        for layer in range(LAYERS):
            write(layer, batch.out_cache_loc)
    state = plugin.STATE
    assert len(calls) == 2 * LAYERS
    assert state.paths == {"sglang:sglang_dsv4_swa_store": LAYERS} and state.unattributed == {}
    ledger = state.ledger.record()
    assert ledger is not None and ledger.expected == ledger.seen == {str(i): 3 for i in range(2, 2 + LAYERS)}
    (info,) = state.pools.values()
    assert info["native_path"] == "fused_qk_norm_rope_swa_store"


def test_hpc_ops_fused_store_ranged_with_its_layer(plugin: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hpc_ops backend's fused_qk_rope_store_kv_fp8 (HunYuan V3): layer from its attention
    layer, tokens from its batch's out_cache_loc; the ledger sees every write."""
    pool = Pool()
    plugin.LAYERS.add(pool)
    monkeypatch.setattr(plugin, "_current_pool", lambda: pool)
    hook = plugin._make_bypass_hook(_bypass(plugin, "HPCOpsAttnBackend.fused_qk_rope_store_kv_fp8"),
                                    PARAMS_0_5_23["HPCOpsAttnBackend.fused_qk_rope_store_kv_fp8"])
    backend = object()

    def write(layer: int, loc: torch.Tensor) -> bool:
        batch = SimpleNamespace(out_cache_loc=loc)
        kernel = lambda self, layer, forward_batch, *a, **k: pool.k_buffer[layer.layer_id].index_fill_(  # noqa: E731
            0, forward_batch.out_cache_loc, 3)
        if layer == 0:  # positional, as a caller may pass it
            hook(kernel, backend, SimpleNamespace(layer_id=layer), batch, None, None, None, None, 2)
        else:
            hook(kernel, backend, layer=SimpleNamespace(layer_id=layer), forward_batch=batch, qkv=None,
                 cos_sin_cache=None, q_norm_weight=None, k_norm_weight=None, qk_norm_policy=2)
        return False

    for tokens in (4, 1):
        _step(plugin, pool, tokens, write)
    state = plugin.STATE
    assert state.paths == {"sglang:sglang_hpc_ops_fp8": 2 * LAYERS}
    assert all((pool.k_buffer[i][1:5] == 3).all() for i in range(LAYERS))
    ledger = state.ledger.record()
    assert ledger is not None and ledger.expected == ledger.seen == {str(i): 5 for i in range(LAYERS)}
    (info,) = state.pools.values()
    assert info["variant"] == "sglang_hpc_ops_fp8" and info["native_path"] == "fused_qk_rope_store_kv_fp8"


def test_pool_layers_of_hybrid_and_swa_pools(plugin: Any) -> None:
    """The layers asked of a step: an SWA pool's full and sliding-window layers together (each
    inner pool's model_layer_ids), a hybrid linear pool's full-attention layers only, a plain
    pool's start_layer .. + layer_num."""
    full, swa = Pool(), Pool()
    full.model_layer_ids, swa.model_layer_ids = (3, 7), (0, 1, 2, 4, 5, 6)
    assert plugin.pool_layers(SimpleNamespace(full_kv_pool=full, swa_kv_pool=swa, layer_num=8)) == list(range(8))
    assert plugin.pool_layers(SimpleNamespace(full_kv_pool=full, layer_num=8)) == [3, 7]
    plain = Pool()
    plain.start_layer = 4
    assert plugin.pool_layers(plain) == [4, 5, 6]


class Dsv4Pool(Pool):
    """The attributes of SGLang's DeepSeekV4TokenToKVPool that the plugin reads: a sliding-window pool
    of the stage's layers numbered from 0, no full pool, the stage's own start_layer and layer_num."""

    def __init__(self) -> None:
        super().__init__()
        self.swa_kv_pool = SimpleNamespace(layer_num=LAYERS, start_layer=0)


def test_dsv4_pool_setters_seen_with_their_layer(plugin: Any) -> None:
    """DeepSeek-V4's pool setters (a pipeline stage starting at layer 4): each call ranged with the
    layer id the model passes, its pool described; the SWA writes (the step's tokens) seen by the
    ledger, the compressed cache's (a row per 4 tokens) counted and ranged but left out of the
    ledger's asked-against-seen count; captured writes recorded with their kernels."""
    pool = Dsv4Pool()
    pool.start_layer = 4
    assert plugin.pool_layers(pool) == [4, 5, 6]
    swa = _bypass(plugin, "DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused_norm_rope")
    extra = _bypass(plugin, "DeepSeekV4TokenToKVPool.set_extra_key_buffer_fused")
    swa_hook = plugin._make_bypass_hook(swa, PARAMS_0_5_23[swa.function])
    extra_hook = plugin._make_bypass_hook(extra, PARAMS_0_5_23[extra.function])
    stored: list[Any] = []

    def kernel(self: Any, *a: Any, **k: Any) -> None:  # the kernels' stand-in
        stored.append(self)

    def step(tokens: int, capture: bool = False) -> None:
        ctx = SimpleNamespace(attn_backend=SimpleNamespace(token_to_kv_pool=pool))
        batch = SimpleNamespace(out_cache_loc=torch.arange(1, tokens + 1))
        with plugin._make_step_hook()(_forward_context, ctx, forward_batch=batch):
            if capture:  # as SGLang's graph runner captures, inside its forward
                plugin.GRAPHS.begin(object())
            for layer in (4, 5, 6):
                if layer == 4:  # positional, as a caller may pass it
                    swa_hook(kernel, pool, layer, batch.out_cache_loc, None, None, 1e-6, None, None)
                else:
                    swa_hook(kernel, pool, layer_id=layer, swa_loc=batch.out_cache_loc, kv=None, kv_weight=None,
                             eps=1e-6, freqs_cis=None, positions=None)
            extra_hook(kernel, pool, layer_id=5, loc=batch.out_cache_loc[::4], cache_k=None)
            if capture:
                plugin.GRAPHS.end()

    step(8)
    step(1)
    step(1, capture=True)  # no step of the ledger's: its writes are the graph's
    graphs = plugin.GRAPHS
    state = plugin.STATE
    assert stored == [pool] * 3 * 4
    assert state.paths == {"sglang:sglang_dsv4_swa_norm_rope": 9, "sglang:sglang_dsv4_compressed": 3}
    ledger = state.ledger.record()
    assert ledger is not None and ledger.steps == 2
    assert ledger.expected == ledger.seen == {"4": 9, "5": 9, "6": 9} and ledger.unseen_paths == {}
    (info,) = state.pools.values()
    assert info["class"] == "Dsv4Pool" and info["native_path"] == "fused_k_norm_rope_flashmla"
    ((_, writes),) = [(g.graph, g.writes) for g in graphs.snapshot()[0]]
    assert [(w.layer, w.variant, w.tokens, w.kernel, w.kernels) for w in writes] == [
        (4, "sglang_dsv4_swa_norm_rope", 1, "fused_k_norm_rope_flashmla", 1),
        (5, "sglang_dsv4_swa_norm_rope", 1, "fused_k_norm_rope_flashmla", 1),
        (6, "sglang_dsv4_swa_norm_rope", 1, "fused_k_norm_rope_flashmla", 1),
        (5, "sglang_dsv4_compressed", 1, "fused_store_flashmla_cache", 1)]


def test_dsv4_compressor_store_named_by_its_cache(plugin: Any) -> None:
    """compress_norm_rope_store is given the layer's cache and no layer: its layer comes from the
    cache's address among the pool's per-layer caches (compressed KV or index keys), and its kernel,
    for the graph record, from its call (the 128-wide index keys' kernel, fp4 or not, or the
    512-wide latent's); a cache of no pool kvprof knows gets a range without a layer."""
    pool = Dsv4Pool()
    extra = {5: torch.zeros(4, 64, dtype=torch.uint8), 6: torch.zeros(4, 64, dtype=torch.uint8)}
    index = {5: torch.zeros(4, 32, dtype=torch.uint8)}
    pool.start_layer = 4
    pool.get_extra_key_buffer = lambda layer_id: extra[layer_id]  # type: ignore[attr-defined]
    pool.get_index_k_with_scale_buffer = lambda layer_id: index[layer_id]  # type: ignore[attr-defined]
    plugin.LAYERS.add(pool)
    store = _bypass(plugin, "compress_norm_rope_store")
    hook = plugin._make_bypass_hook(store, PARAMS_0_5_23[store.function])
    kernel = lambda kv, plan, **k: k["kvcache"].view(-1).__setitem__(0, 1)  # noqa: E731 - the kernel's stand-in
    loc = torch.arange(2)
    graphs = plugin.GRAPHS
    graphs.begin(object())
    hook(kernel, torch.zeros(2, 512), None, freq_cis=None, out_loc=loc, kvcache=extra[6].view(torch.uint8), page_size=4)
    hook(kernel, torch.zeros(2, 512), None, freq_cis=None, out_loc=loc, kvcache=extra[5], page_size=4)
    hook(kernel, torch.zeros(2, 128), None, freq_cis=None, out_loc=loc, kvcache=index[5], page_size=4)
    hook(kernel, torch.zeros(2, 128), None, freq_cis=None, out_loc=loc, kvcache=index[5], page_size=4, use_fp4=True)
    hook(kernel, torch.zeros(2, 512), None, freq_cis=None, out_loc=loc, kvcache=torch.zeros(8, dtype=torch.uint8),
         page_size=4)
    graphs.end()
    ((_, writes),) = [(g.graph, g.writes) for g in graphs.snapshot()[0]]
    assert [(w.layer, w.kernel, w.tokens) for w in writes] == [
        (6, "fused_norm_rope_flashmla", 2), (5, "fused_norm_rope_flashmla", 2), (5, "fused_norm_rope_indexer", 2),
        (5, "fused_norm_rope_indexer_fp4", 2), (-1, "fused_norm_rope_flashmla", 2)]
    assert bool(extra[5][0, 0]) and bool(extra[6][0, 0]) and bool(index[5][0, 0])
    state = plugin.STATE
    assert state.paths == {"sglang:sglang_dsv4_compress_store": 5}
    assert state.unattributed == {
        "compress_norm_rope_store: K cache of no pool kvprof has seen (range without a layer)": 1}
