"""kvprof's SGLang plugin: the engine's own KV writes, named as kvprof names its writes.

SGLang calls every entry point of the group ``sglang.srt.plugins`` early in each of its
processes (``sglang.srt.plugins.load_plugins``) and then applies the hooks registered
with its ``HookRegistry``. With ``KVPROF_SGLANG=1`` this plugin puts an AROUND hook on
the KV write entry points of SGLang's pools (``TARGETS``): each call opens kvprof's NVTX
range (domain ``kvprof``, message ``set_kv_buffer[<variant>] L<layer>``, payload = tokens)
and, while a torch profiler records, a ``record_function`` range of the same name, so
``kvprof analyze`` ties kernels to writes in SGLang's traces exactly as in a kvprof
capture. Without the variable the plugin does nothing, so installing kvprof next to
SGLang changes nothing until asked.

``KVPROF_SGLANG_WRITER=<variant>`` routes ``MHATokenToKVPool.set_kv_buffer`` through a
kvprof writer. SGLang's checks still run (physical write loc, its async out-of-bounds
probe); what the writer replaces is SGLang's conversion and ``store_cache``/``index_put``.
Any call it cannot take (quantized or non-NHD pools, a DCP mask, an unknown argument, an
input the writer refuses) goes to SGLang's own path, logged once per reason and counted.
Differences from SGLang's path, by design: the writer converts dtype inside its kernel
and does not divide the caller's K/V in place (SGLang's ``cache_k.div_(k_scale)`` does);
slot 0, SGLang's reserved padding slot, is written like any slot (SGLang's
``store_cache`` skips it, its ``index_put`` path writes it: nothing reads it); slots
outside the buffer are masked by the fused writers where ``store_cache`` would stop on a
device assert (the size limit).

Models that fuse the KV write into their rotary embedding (SGLang on CUDA with a bf16
cache: Qwen3-MoE, GPT-OSS, Bailing-MoE, ...) never call ``set_kv_buffer``: they pass a
``FusedSetKVBufferArg`` to the rotary embedding, whose ``forward_cuda`` hands it to
``apply_rope_with_cos_sin_cache_inplace`` (``ROPE_FUNCTION``), one launch that rotates q and k
and stores K and V. The plugin hooks that function (the one place every such write passes
through; calls without the argument only rotate and get no range). The argument carries the
layer's K buffer but not its layer id: the plugin maps the buffer's address to the layer
through the pools it has seen (created after it loaded, written through ``set_kv_buffer``,
or SGLang's current pool) -- ``_LayerMap``. Those writes get the same range family
(``set_kv_buffer[sglang_fused_rope] L<layer>``), and ``KVPROF_SGLANG_WRITER`` naming a rope +
store writer (``rope_triton_fused``, ...) puts it in place of SGLang's fused kernel.

Every process that writes leaves a sidecar ``kvprof-sglang.TP-<rank>.pid-<pid>.json`` in
``KVPROF_SGLANG_DIR`` (default: ``SGLANG_TORCH_PROFILER_DIR``, else ``/tmp`` as SGLang's
profiler): rank, TP size, pool class and shapes, dtype, the writer and how many calls took
which path (``paths``: SGLang's or the writer's, in detail; ``write_paths``: "set_kv_buffer",
"fused into rope" or "fallback"), SGLang's version. ``kvprof analyze`` reads it next to SGLang's traces.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvprof.core.sidecar import (
    NATIVE_INDEX_PUT,
    NATIVE_STORE_CACHE,
    NATIVE_TWO_STREAMS,
    ROPE_VARIANT,
    SidecarDevice,
)
from kvprof.core.vocab import ROPE_FUSED
from kvprof.integrations import core

# The engine-neutral parts this adapter uses, under the names it has always had
GRAPH_METHODS = core.GRAPH_METHODS
_LOCAL = core.LOCAL
_Graphs = core.Graphs
_Ranges = core.Ranges
_ReplayRanges = core.ReplayRanges
_line = core.line
_native = core.native
_truthy = core.truthy
_writer_kernel = core.writer_kernel

# The adapter's engine: its switches (KVPROF_SGLANG, ..._WRITER, ..._DIR), its package, the
# sidecar's folder (SGLang's profiler folder when KVPROF_SGLANG_DIR is unset) and its ranks
SGLANG = core.Engine(name="sglang", package="sglang", ranks=lambda: _ranks(),
                     default_dir=lambda: os.environ.get("SGLANG_TORCH_PROFILER_DIR"))
ENV_ON = SGLANG.env_on
ENV_WRITER = SGLANG.env_writer
ENV_DIR = SGLANG.env_dir
MEMORY_POOL = "sglang.srt.mem_cache.memory_pool"

# (class in sglang.srt.mem_cache.memory_pool, method, variant named in the ranges). Only
# classes that define the method themselves: subclasses that inherit it get the hook with
# it. Pools that only delegate to an inner pool (hybrid, SWA) are left out: the inner
# pool's write carries the range.
TARGETS: tuple[tuple[str, str, str], ...] = (
    ("MHATokenToKVPool", "set_kv_buffer", "sglang_mha"),
    ("MHATokenToKVPoolFP4", "set_kv_buffer", "sglang_mha_fp4"),
    ("MHATokenToKVPoolMXFP8", "set_kv_buffer", "sglang_mha_mxfp8"),
    ("MLATokenToKVPool", "set_kv_buffer", "sglang_mla"),
    ("MLATokenToKVPool", "set_mla_kv_buffer", "sglang_mla"),
    ("MLATokenToKVPoolFP4", "set_kv_buffer", "sglang_mla_fp4"),
    ("MLATokenToKVPoolFP4", "set_mla_kv_buffer", "sglang_mla_fp4"),
    ("MHATokenToKOnlyPool", "set_kv_buffer", "sglang_k_only"),
    ("MiniMaxSparseKVPool", "set_kv_buffer", "sglang_minimax_sparse"),
)
ROUTABLE = ("MHATokenToKVPool", "set_kv_buffer")  # the one write a kvprof writer may take over

# SGLang's rope + KV store: the kernel wrapper every FusedSetKVBufferArg passes through on CUDA
# (its caller is RotaryEmbedding.forward_cuda, which its subclasses inherit). Hooking the
# function rather than the forward methods: they accept the argument on every platform but
# only forward_cuda's JIT branch writes with it (the others assert it is None), and the
# function's arguments are the write's own (q, k, table, positions, style, the buffers).
# ROCm's fused path (forward_cuda's HIP branch, fused_qk_rope_reshape_and_cache) does not pass
# through it and is not hooked.
ROPE_MODULE = "sglang.kernels.ops.attention.rope"
ROPE_FUNCTION = "apply_rope_with_cos_sin_cache_inplace"
ROPE_ARG = "fused_args"
POOL_INIT = ("MHATokenToKVPool", "__init__")  # where the plugin first sees a pool and its K buffers

# The kernel (its identifier, matched in a trace's name by kvprof.core.sidecar.kernel_matches) and the
# launches of one write on each of SGLang's own paths: what the sidecar's graph record says a replayed
# write's kernels are
NATIVE_KERNELS: dict[str, tuple[str, int]] = {
    NATIVE_STORE_CACHE: ("store_kvcache_kernel", 1),  # SGLang's JIT kernel (kvcache.cuh)
    NATIVE_INDEX_PUT: ("index_put", 2),  # K, then V: torch's index_put_kernel_impl
    NATIVE_TWO_STREAMS: ("index_put", 2),  # the same, V on SGLang's alt stream under capture
    ROPE_FUSED: ("fused_rope_store_kernel", 1),  # SGLang's JIT rope + store (rope.cuh)
}
# Paths that write K/V around set_kv_buffer (a model passes save_kv_cache=False to its attention
# and writes itself, or its pool has setters of its own): each its own variant, ranged and counted
# like the others. A function's module attribute is what SGLang's callers import at call time (they
# import it inside the function that calls it), and SGLang's HookRegistry rebinds names imported
# earlier, so replacing it reaches every call; a method (``Class.method``) is hooked on its class,
# which its subclasses inherit.
class Bypass:
    """One bypass path: where it is (``module``, ``function``: a function or ``Class.method``), the
    variant its ranges name, and where its call carries the write: ``loc`` the parameter with the
    slots (``forward_batch``: that batch's ``out_cache_loc``); its layer from ``k_cache``, the
    parameter with the layer's K cache (its address names the layer, ``_LayerMap``), or ``layer``,
    the one with the attention layer (its ``layer_id``) or the layer id itself; ``pool`` the one
    with the pool written (``self`` for a pool's own setter; else the pool the K cache belongs to,
    or SGLang's current one). ``kernel``/``kernels``: the kernel one write launches (an identifier,
    matched in a trace as ``kvprof.core.sidecar.kernel_matches`` does) and how many, for the CUDA
    graph record; where the call picks its kernel, ``kernel`` is a function of the call's arguments
    by name that names it. ``asked``: False for a cache whose rows are not the step's tokens (a compressed
    cache: a row per ``ratio`` tokens), which the ledger's asked-against-seen count by layer leaves
    out (its range and path count stand). ``unchecked``: why the shadow check cannot hold its rows."""

    def __init__(self, module: str, function: str, variant: str, loc: str, write_path: str, native: str, *,
                 k_cache: str | None = None, layer: str | None = None, pool: str | None = None,
                 kernel: str | Callable[[dict[str, Any]], str | None] | None = None, kernels: int = 1,
                 asked: bool = True,
                 unchecked: str = "its K/V are computed inside its kernel") -> None:
        self.module, self.function, self.variant = module, function, variant
        self.k_cache, self.layer, self.loc, self.write_path, self.native = k_cache, layer, loc, write_path, native
        self.pool, self.kernel, self.kernels, self.asked, self.unchecked = pool, kernel, kernels, asked, unchecked


DSV4_POOL = "sglang.srt.mem_cache.deepseek_v4_memory_pool"
# DeepSeek-V4's pool setters: the layer id (absolute, as the model passes it) and the slots in the
# layer's own cache; the write is quantized (FlashMLA's paged fp8 + bf16 rope layout, or fp4/e4m3)
# inside the kernel, so its rows are not the inputs' and the shadow check cannot hold them
_DSV4_LAYOUT = "its rows are quantized into its cache's paged layout inside its kernel"
_DSV4_COMPRESSED = "compressed cache"


def _compress_store_kernel(call: dict[str, Any]) -> str | None:
    """The kernel compress_norm_rope_store launches on CUDA (fused_norm_rope_v2.cuh): the indexer's
    (its 128-wide keys; fp4 with ``use_fp4``) or the FlashMLA latent's (512 wide)."""
    dim = getattr(call.get("kv"), "shape", (None,))[-1]
    if dim == 128:
        return "fused_norm_rope_indexer_fp4" if call.get("use_fp4") else "fused_norm_rope_indexer"
    return "fused_norm_rope_flashmla"


def _dsv4(method: str, variant: str, loc: str, write_path: str, kernel: str, **kw: Any) -> Bypass:
    return Bypass(DSV4_POOL, f"DeepSeekV4TokenToKVPool.{method}", variant, loc, write_path, kernel,
                  layer="layer_id", pool="self", kernel=kernel, **kw)


BYPASSES: tuple[Bypass, ...] = (
    # RotaryEmbedding.try_bf16_rope_store (MiMo-V2): NeoX rope on packed bf16 QKV, K and scaled V stored
    Bypass("sglang.kernels.ops.attention.rope", "bf16_rope_scale_store", "sglang_bf16_rope_store",
           "locations", "fused into rope", "bf16_rope_scale_store", k_cache="key_cache"),
    # the trtllm_mha backend's fp8 path: K/V (and q) quantized and stored in one kernel, no set_kv_buffer
    Bypass("sglang.kernels.ops.kvcache.fused_fp8_qkv_kv_cache", "fused_fp8_qkv_kv_cache",
           "sglang_trtllm_fp8_qkv", "cache_loc", "fused fp8 qkv", "fused_fp8_qkv_kv_cache", k_cache="k_cache"),
    # DeepSeek-V4: Q and KV norm + rope, the latent KV stored into the layer's SWA pool buffer
    # (get_swa_raw_buffer) at swa_loc; called without swa_cache it only normalises and rotates
    Bypass("sglang.kernels.ops.attention.fused_qk_norm_rope_store", "fused_qk_norm_rope_swa_store",
           "sglang_dsv4_swa_store", "swa_loc", "fused into rope", "fused_qk_norm_rope_swa_store",
           k_cache="swa_cache"),
    # the hpc_ops backend (HunYuan V3 on an fp8 cache): QK norm + rope + fp8 quant + the paged KV write
    Bypass("sglang.srt.layers.attention.hpc_ops_backend", "HPCOpsAttnBackend.fused_qk_rope_store_kv_fp8",
           "sglang_hpc_ops_fp8", "forward_batch", "fused into rope", "fused_qk_rope_store_kv_fp8",
           layer="layer"),
    # DeepSeek-V4's pool (DeepSeekV4TokenToKVPool), each layer's latent KV (MQA: K = V) in its SWA
    # cache, the step's tokens: the model's _compute_kv_to_cache (KV norm + rope + store, one JIT
    # kernel; the trtllm backend's uniform-fp8 pool runs _kv_norm_rope_fp8_store instead)
    _dsv4("set_swa_key_buffer_radix_fused_norm_rope", "sglang_dsv4_swa_norm_rope", "swa_loc", "fused into rope",
          "fused_k_norm_rope_flashmla", unchecked=f"{_DSV4_LAYOUT}, after its norm and rope"),
    # the DSpark draft's unified cache (ROCm): norm + rope in place, then one scatter of bf16 rows
    # (a slot < 0, an uncommitted verify token, is skipped by the scatter and still counted here)
    _dsv4("set_unified_key_buffer_radix_fused_norm_rope", "sglang_dsv4_unified_norm_rope", "swa_loc",
          "fused into rope", "_scatter_loc_kernel"),
    # finished rows into the SWA cache: the attention backend's store_cache (bf16-sourced quantization,
    # the DSA prefill-CP path), and the packed (fp8 nope, bf16 rope, scales) store
    _dsv4("set_swa_key_buffer_radix_fused", "sglang_dsv4_swa", "swa_loc", "set_swa_key_buffer",
          "fused_store_flashmla_cache", unchecked=_DSV4_LAYOUT),
    _dsv4("set_swa_key_buffer", "sglang_dsv4_swa", "loc", "set_swa_key_buffer", "_set_k_and_s_triton_kernel",
          unchecked=_DSV4_LAYOUT),
    # the compressors' output: a layer's compressed KV (one row per compress_ratio tokens), which its
    # sparse attention reads beside the SWA rows, and the C4 indexer's keys (a K-only cache its
    # top-k scoring reads, as MHATokenToKOnlyPool's): KV the model keeps, but not the step's tokens
    _dsv4("set_extra_key_buffer_fused", "sglang_dsv4_compressed", "loc", _DSV4_COMPRESSED,
          "fused_store_flashmla_cache", asked=False, unchecked=_DSV4_LAYOUT),
    _dsv4("set_extra_key_buffer", "sglang_dsv4_compressed", "loc", _DSV4_COMPRESSED, "_set_k_and_s_triton_kernel",
          asked=False, unchecked=_DSV4_LAYOUT),
    _dsv4("set_index_k_fused", "sglang_dsv4_index_k", "loc", _DSV4_COMPRESSED, "fused_store_indexer_cache",
          asked=False, unchecked=_DSV4_LAYOUT),
    _dsv4("set_index_k_fp4", "sglang_dsv4_index_k", "loc", _DSV4_COMPRESSED, "_store_fp4_index_k_cache_kernel",
          asked=False, unchecked=_DSV4_LAYOUT),
    _dsv4("set_index_k_scale_buffer", "sglang_dsv4_index_k", "loc", _DSV4_COMPRESSED, "_set_k_and_s_triton_kernel",
          asked=False, unchecked="its K and scales are stored as the cache's quantized rows"),
    # the compressors' fused stores on CUDA, given the layer's cache and no layer (its address names
    # it): the C4/C128 compressor's norm + rope + store (compressor_v2's all-in-one path) into the
    # compressed KV or the indexer's keys, its kernel picked by the call (_compress_store_kernel), and
    # the low compress ratios' index-key stores (called without a cache they only pack: no range)
    Bypass("sglang.kernels.ops.attention.dsv4.compress", "compress_norm_rope_store", "sglang_dsv4_compress_store",
           "out_loc", _DSV4_COMPRESSED, "compress_norm_rope_store", k_cache="kvcache", asked=False,
           kernel=_compress_store_kernel, unchecked=f"{_DSV4_LAYOUT}, after its compression, norm and rope"),
    Bypass("sglang.kernels.ops.attention.dsv4.fp4_indexer", "index_k_rope_pack", "sglang_dsv4_index_k", "loc",
           _DSV4_COMPRESSED, "index_k_rope_pack", k_cache="cache", kernel="_index_k_rope_pack_kernel", asked=False,
           unchecked=_DSV4_LAYOUT),
    Bypass("sglang.kernels.ops.attention.dsv4.fp4_indexer_rope", "index_k_norm_rope_pack_store",
           "sglang_dsv4_index_k", "loc", _DSV4_COMPRESSED, "index_k_norm_rope_pack_store", k_cache="cache",
           kernel="index_k_kernel", asked=False, unchecked=_DSV4_LAYOUT),
)
# The write ledger's two points: each forward step, and each attention call that passes
# save_kv_cache=False (the model writes K/V itself: named where writes go unseen). The step is the
# outermost forward_context(ctx, forward_batch=...) with a batch on the thread: ModelRunner._forward_raw
# opens one around every forward (eager, split prefill, either CUDA-graph runner), and the module
# imports where SGLang's server dependencies are missing (ModelRunner's does not: fastapi, uvicorn).
# Contexts with a batch opened inside it (the graph runners', TBO's) are part of its step; those
# without one (PDmux's, a draft loop's scope) are nobody's boundary.
STEP_TARGET = ("sglang.srt.model_executor.forward_context", "forward_context")
ATTENTION_TARGET = ("sglang.srt.layers.radix_attention", "RadixAttention", "forward")

# What the sidecar's write_paths count: which entry point wrote, or that a named writer fell back
WRITE_SET_KV_BUFFER = "set_kv_buffer"
WRITE_FUSED_INTO_ROPE = "fused into rope"
WRITE_FALLBACK = "fallback"

log = logging.getLogger("kvprof.sglang")


def sglang_version() -> str | None:
    return core.package_version("sglang")


def plugin() -> None:
    """SGLang's entry point: register the hooks when ``KVPROF_SGLANG=1``, else nothing."""
    if not _truthy(os.environ.get(ENV_ON)):
        return
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except Exception as exc:  # noqa: BLE001 - no SGLang, or one without the plugin framework
        log.warning("kvprof: SGLang's HookRegistry is not importable (%s): no KV-write ranges", _line(exc))
        return
    state = STATE
    state.writer_name = (os.environ.get(ENV_WRITER) or "").strip() or None
    state.shadow_on()
    hooked = []
    for cls_name, method, variant in TARGETS:
        reason = _target_problem(cls_name, method)
        if reason:
            log.warning("kvprof: not hooking %s.%s: %s", cls_name, method, reason)
            continue
        hook = _make_hook(cls_name, method, variant)
        if hook is None:
            continue
        HookRegistry.register(f"{MEMORY_POOL}.{cls_name}.{method}", hook, HookType.AROUND)
        hooked.append(f"{cls_name}.{method}")
    reason = _target_problem(*POOL_INIT)
    if reason:
        log.warning("kvprof: not hooking %s.%s: %s", *POOL_INIT, reason)
    else:
        HookRegistry.register(f"{MEMORY_POOL}.{'.'.join(POOL_INIT)}", _pool_init_hook, HookType.AROUND)
    reason = _rope_problem()
    if reason:
        log.warning("kvprof: not hooking %s.%s: %s", ROPE_MODULE, ROPE_FUNCTION, reason)
    else:
        hook = _make_rope_hook()
        if hook is not None:
            HookRegistry.register(f"{ROPE_MODULE}.{ROPE_FUNCTION}", hook, HookType.AROUND)
            hooked.append(ROPE_FUNCTION)
    for bypass in BYPASSES:
        where = _hook_function(HookRegistry, HookType, bypass.module, bypass.function,
                               lambda fn, bypass=bypass: _make_bypass_hook(bypass, _param_names(fn)))
        if where:
            hooked.append(bypass.function)
    if _hook_function(HookRegistry, HookType, *STEP_TARGET, lambda fn: _make_step_hook()):
        hooked.append(STEP_TARGET[1])
    mod_name, cls_name, method = ATTENTION_TARGET
    reason = _method_problem(mod_name, cls_name, method)
    if reason:
        log.warning("kvprof: not hooking %s.%s.%s (write ledger): %s", mod_name, cls_name, method, reason)
    else:
        HookRegistry.register(f"{mod_name}.{cls_name}.{method}", _make_attention_hook(), HookType.AROUND)
        hooked.append(f"{cls_name}.{method}")
    if hook_canary():
        hooked.append(f"{CANARY_MODULE}.{CANARY_FUNCTION}")
    state.hooked = hooked
    if hooked:
        log.info("kvprof: KV-write ranges on %s%s", ", ".join(hooked),
                 f"; writer {state.writer_name}" if state.writer_name else "")
        GRAPHS.hook = hook_graphs()
        atexit.register(state.write_sidecar)


def _target_problem(cls_name: str, method: str) -> str | None:
    """Why a target cannot be hooked in this SGLang (None: it can)."""
    import importlib

    try:
        mod = importlib.import_module(MEMORY_POOL)
    except Exception as exc:  # noqa: BLE001 - its import errors vary with what is installed
        return f"{MEMORY_POOL} does not import ({_line(exc)})"
    cls = getattr(mod, cls_name, None)
    if not isinstance(cls, type):
        return f"this SGLang has no {cls_name}"
    if method not in cls.__dict__:
        return f"this SGLang's {cls_name} has no {method} of its own"
    return None


def _rope_problem() -> str | None:
    """Why SGLang's rope + store function cannot be hooked here (None: it can)."""
    import importlib

    try:
        mod = importlib.import_module(ROPE_MODULE)
    except Exception as exc:  # noqa: BLE001 - its import errors vary with what is installed
        return f"{ROPE_MODULE} does not import ({_line(exc)})"
    fn = getattr(mod, ROPE_FUNCTION, None)
    if not callable(fn):
        return f"this SGLang has no {ROPE_FUNCTION}"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError) as exc:
        return f"cannot read its signature ({_line(exc)})"
    if ROPE_ARG not in params:
        return f"this SGLang's {ROPE_FUNCTION} takes no {ROPE_ARG}"
    return None


class _Args:
    """Where a target's arguments sit, read once from its signature (keyword or position)."""

    def __init__(self, fn: Any) -> None:
        params = list(inspect.signature(fn).parameters)
        self.names = params
        self.layer = params.index("layer") if "layer" in params else 1
        loc_name = next((n for n in ("loc_info", "loc") if n in params), None)
        self.loc_name = loc_name or (params[2] if len(params) > 2 else "loc")
        self.loc = params.index(self.loc_name) if self.loc_name in params else 2
        self.override = params.index("layer_id_override") if "layer_id_override" in params else None

    def get(self, args: tuple[Any, ...], kwargs: dict[str, Any], pos: int | None, name: str) -> Any:
        if name in kwargs:
            return kwargs[name]
        if pos is not None and pos < len(args):
            return args[pos]
        return None


def _make_hook(cls_name: str, method: str, variant: str) -> Any:
    import importlib

    cls = getattr(importlib.import_module(MEMORY_POOL), cls_name)
    try:
        where = _Args(cls.__dict__[method])
    except (TypeError, ValueError) as exc:
        log.warning("kvprof: not hooking %s.%s: cannot read its signature (%s)", cls_name, method, _line(exc))
        return None
    ranges = _Ranges()
    local = _LOCAL
    state = STATE
    routable = (cls_name, method) == ROUTABLE
    native_path = f"sglang:{variant}"
    hooked = f"{cls_name}.{method}"
    layer_pos, loc_pos, loc_name, override_pos = where.layer, where.loc, where.loc_name, where.override
    names = where.names

    def hook(original: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(local, "depth", 0) or not args:
            return original(*args, **kwargs)  # a write inside a hooked write: one range only
        pool = args[0]
        override = where.get(args, kwargs, override_pos, "layer_id_override")
        if override is not None:
            layer_id = override
        else:
            layer = where.get(args, kwargs, layer_pos, "layer")
            layer_id = getattr(layer, "layer_id", layer)
        loc = where.get(args, kwargs, loc_pos, loc_name)
        loc = getattr(loc, "loc", loc)  # SGLang's KVWriteLoc or a bare tensor
        tokens = getattr(loc, "shape", None)
        if type(layer_id) is not int or not tokens or len(tokens) != 1:
            return original(*args, **kwargs)  # a call SGLang itself will judge: no range
        tokens = int(tokens[0])
        state.saw(layer_id, tokens)
        snap = None
        mode = state.shadow_due(getattr(pool, "device", None)) if state.shadow.every else ""
        if mode:
            snap = shadow_snapshot(state, pool, routable, variant, names, args, kwargs, layer_id, loc, mode)
        route = state.route_for(pool) if routable and state.writer_name else None
        fell_back = False
        if route is not None:
            prepared = route.prepare(pool, args, kwargs)
            if isinstance(prepared, str):
                state.fallback(prepared)
                route, fell_back = None, True
            else:
                name, attr = ranges.of(route.writer.name, layer_id, tokens)
                state.seen(pool, hooked, variant)
                local.write = (route.writer.name, layer_id, tokens, *_writer_kernel(route.writer))
                out = ranges.run(name, attr, route.write, pool, prepared)
                if snap is not None:
                    shadow_check(state, pool, snap, route.writer.name, divide=False, mode=mode)
                return out
        name, attr = ranges.of(variant, layer_id, tokens)
        state.seen(pool, hooked, variant)
        local.write = (variant, layer_id, tokens, *_native_kernel(state.pools[id(pool)].get("native_path")))
        out = ranges.run(name, attr, _native, original, args, kwargs, state, native_path,
                         WRITE_FALLBACK if fell_back else WRITE_SET_KV_BUFFER)
        if snap is not None:
            shadow_check(state, pool, snap, variant, divide=True, mode=mode)
        return out

    hook.__name__ = f"kvprof_{cls_name}_{method}"
    return hook


def shadow_snapshot(state: _State, pool: Any, routable: bool, variant: str, names: list[str],
                    args: tuple[Any, ...], kwargs: dict[str, Any], layer_id: int, loc: Any,
                    mode: str = core.EAGER) -> tuple[Any, ...] | None:
    """A sampled ``set_kv_buffer`` call's inputs, K/V copied before the write where SGLang's own path
    divides them in place: (layer index, slots, K, V, scales); None where the shadow check
    cannot hold this call (the reason counted)."""
    shadow = state.shadow
    if not routable or type(pool).__name__ != ROUTABLE[0]:
        shadow.skip(f"{variant}: not checked (the shadow check holds MHATokenToKVPool.set_kv_buffer's rows)")
        return None
    if getattr(pool, "is_quantized_kv_cache", False):
        shadow.skip(f"{variant}: quantized KV cache (its quant method writes it)")
        return None
    if getattr(pool, "use_hnd", False) or getattr(pool, "kv_cache_layout", "nhd") != "nhd":
        shadow.skip(f"{variant}: layout {getattr(pool, 'kv_cache_layout', '?')} (not one row per slot)")
        return None
    call = dict(zip(names[1:], args[1:]))
    call.update(kwargs)
    if call.get("dcp_kv_mask") is not None:
        shadow.skip(f"{variant}: a DCP mask (rows written only where it says)")
        return None
    k: Any = call.get("cache_k")
    v: Any = call.get("cache_v")
    idx = layer_id - (getattr(pool, "start_layer", 0) or 0)
    if not hasattr(k, "clone") or not hasattr(v, "clone") or not hasattr(loc, "clone") or \
            not 0 <= idx < len(pool.k_buffer):
        shadow.skip(f"{variant}: K, V or the slots are not tensors of this pool's layers")
        return None
    k_scale, v_scale = call.get("k_scale"), call.get("v_scale")
    # SGLang's own path divides the caller's K/V in place (cache_k.div_(k_scale)) where it converts
    # them for the cache: only then are they copied first; the slots are only read
    # (inside a graph capture nothing is copied: a converted write is not compared there)
    divides = mode == core.EAGER and k.dtype != pool.dtype and (k_scale is not None or v_scale is not None)
    return idx, loc.detach().long(), k.detach().clone() if divides else k.detach(), \
        v.detach().clone() if divides else v.detach(), k_scale, v_scale


def shadow_check(state: _State, pool: Any, snap: tuple[Any, ...], variant: str, divide: bool,
                 mode: str = core.EAGER) -> None:
    """Compare the rows the write left with its inputs (``kvprof.integrations.core.Shadow``), or,
    inside a CUDA graph capture, record the kernel that compares them at every replay: SGLang's
    dummy slot 0 (and, eagerly, slots several tokens share) are not held to a row. Never raises."""
    idx, slots, k, v, k_scale, v_scale = snap
    try:
        k_buf, v_buf = pool.k_buffer[idx], pool.v_buffer[idx]
        n, rows = int(slots.shape[0]), int(k_buf.shape[0])
        if mode == core.IN_GRAPH:
            layer_id = idx + (getattr(pool, "start_layer", 0) or 0)
            rows_shape = tuple(k_buf.shape[1:])
            if k.numel() != n * k_buf[0].numel() or v.numel() != n * v_buf[0].numel():
                state.shadow.skip(f"{variant}: K/V rows are not [tokens, heads, dim] of this pool")
                return
            state.shadow.compare_in_graph(layer_id, variant, slots, k.view(n, *rows_shape), v.view(n, *rows_shape),
                                          k_buf.unsqueeze(1), v_buf.unsqueeze(1), rows, pad=0)
            return
        k_want = core.to_store(k, pool.dtype, k_scale, divide)
        v_want = core.to_store(v, pool.dtype, v_scale, divide)
        if k_want.numel() != n * k_buf[0].numel() or v_want.numel() != n * v_buf[0].numel():
            state.shadow.skip(f"{variant}: K/V rows are not [tokens, heads, dim] of this pool")
            return
        safe = slots.clamp(0, rows - 1)
        layer_id = idx + (getattr(pool, "start_layer", 0) or 0)
        state.shadow.compare(layer_id, variant, slots, k_buf[safe], v_buf[safe], k_want, v_want, rows, pad=0)
    except Exception as exc:  # noqa: BLE001 - the check never stops the engine
        state.shadow.skip(f"{variant}: comparison failed ({_line(exc)})")


# SGLang's KV canary (--kv-canary log|raise): every violation it reports, logged or raised, is
# formatted by this function of its reporter (looked up at call time), one call per violation
CANARY_MODULE = "sglang.srt.kv_canary.runner.violation_reporter"
CANARY_FUNCTION = "_format_violation"
CANARY_FIRST = 8


class Canary:
    """SGLang's canary violations, as its reporter formatted them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.violations = 0
        self.total = 0
        self.by_reason: dict[str, int] = {}
        self.first: list[str] = []

    def note(self, message: str, total: Any) -> bool:
        """One violation (SGLang's message); True for the first (the sidecar is written then)."""
        lines = str(message).splitlines()
        line = next((x for x in lines if x.startswith("kv_canary violation:")), lines[0] if lines else "")
        reason = next((w.split("=", 1)[1] for w in line.split() if w.startswith("fail_reason=")), "unknown")
        with self.lock:
            self.violations += 1
            self.total = max(self.total, int(total) if isinstance(total, int) else 0)
            self.by_reason[reason[:200]] = self.by_reason.get(reason[:200], 0) + 1
            if len(self.first) < CANARY_FIRST:
                self.first.append(line[:2000])
            return self.violations == 1


def hook_canary(module: Any = None) -> bool:
    """Wrap SGLang's canary reporter's formatter (``CANARY_MODULE.CANARY_FUNCTION``) so each violation
    it reports is counted in the sidecar too; False (logged) where this SGLang has none."""
    import importlib

    try:
        mod = module or importlib.import_module(CANARY_MODULE)
    except Exception as exc:  # noqa: BLE001 - an SGLang without the canary
        log.info("kvprof: SGLang's KV canary not read (%s)", _line(exc))
        return False
    fmt = getattr(mod, CANARY_FUNCTION, None)
    if not callable(fmt):
        log.info("kvprof: SGLang's KV canary not read (no %s.%s)", CANARY_MODULE, CANARY_FUNCTION)
        return False
    if getattr(fmt, "_kvprof_canary_hook", False):
        return True

    def format_violation(*args: Any, **kwargs: Any) -> Any:
        message = fmt(*args, **kwargs)
        try:
            if STATE.canary.note(message, kwargs.get("total")):
                STATE.write_sidecar()
        except Exception as exc:  # noqa: BLE001 - SGLang's report goes on whatever kvprof does
            log.debug("kvprof: canary violation not counted (%s)", _line(exc))
        return message

    format_violation._kvprof_canary_hook = True  # type: ignore[attr-defined]
    format_violation.__wrapped__ = fmt  # type: ignore[attr-defined]
    setattr(mod, CANARY_FUNCTION, format_violation)
    return True


def _method_problem(mod_name: str, cls_name: str, method: str) -> str | None:
    """Why ``mod_name.cls_name.method`` cannot be hooked here (None: it can)."""
    import importlib

    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - its import errors vary with what is installed
        return f"{mod_name} does not import ({_line(exc)})"
    cls = getattr(mod, cls_name, None)
    if not isinstance(cls, type) or not callable(cls.__dict__.get(method)):
        return f"this SGLang has no {cls_name}.{method} of its own"
    return None


def _resolve(mod_name: str, dotted: str) -> Any:
    """``mod_name``'s attribute ``dotted`` (``function`` or ``Class.method``), or None."""
    import importlib

    obj: Any = importlib.import_module(mod_name)
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
    return obj


def _param_names(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _hook_function(registry: Any, hook_type: Any, mod_name: str, function: str, make: Any) -> str | None:
    """An AROUND hook ``make(fn)`` on ``mod_name.function`` (a function or ``Class.method``): its
    path, or None (why logged) where it is not here or its hook cannot be made."""
    try:
        fn = _resolve(mod_name, function)
    except Exception as exc:  # noqa: BLE001 - its import errors vary with what is installed
        log.warning("kvprof: not hooking %s.%s: %s does not import (%s)", mod_name, function, mod_name, _line(exc))
        return None
    if not callable(fn):
        log.warning("kvprof: not hooking %s.%s: this SGLang has no %s", mod_name, function, function)
        return None
    try:
        hook = make(fn)
    except (TypeError, ValueError) as exc:
        log.warning("kvprof: not hooking %s.%s: cannot read its signature (%s)", mod_name, function, _line(exc))
        return None
    registry.register(f"{mod_name}.{function}", hook, hook_type.AROUND)
    return f"{mod_name}.{function}"


def _make_bypass_hook(bypass: Bypass, params: list[str] | None = None) -> Any:
    """The AROUND hook on one bypass path: its write ranged (layer from its K cache's address, or from
    its attention layer or layer id), counted as ``sglang:<variant>``, recorded into a CUDA graph being
    captured with its kernel, and seen by the ledger where its rows are the step's tokens
    (``Bypass.asked``). ``params``: the function's parameter names (read from SGLang's function when
    not given)."""
    if params is None:
        params = _param_names(_resolve(bypass.module, bypass.function))
    where = {name: (params.index(name) if name in params else None)
             for name in (bypass.k_cache, bypass.layer, bypass.loc, bypass.pool) if name}
    ranges = _Ranges()
    local = _LOCAL
    native_key = SGLANG.native_key(bypass.variant)
    name_of = bypass.function.rsplit(".", 1)[-1]
    unchecked = f"{bypass.variant}: not checked ({bypass.unchecked})"

    def arg(args: tuple[Any, ...], kwargs: dict[str, Any], name: str | None) -> Any:
        if name is None:
            return None
        if name in kwargs:
            return kwargs[name]
        pos = where.get(name)
        return args[pos] if pos is not None and pos < len(args) else None

    def hook(original: Any, *args: Any, **kwargs: Any) -> Any:
        state = STATE
        loc = arg(args, kwargs, bypass.loc)
        if bypass.loc == "forward_batch":
            loc = getattr(loc, "out_cache_loc", None)
        k_cache = arg(args, kwargs, bypass.k_cache)
        layer = arg(args, kwargs, bypass.layer)
        layer_id = layer if type(layer) is int else getattr(layer, "layer_id", None)
        shape = getattr(loc, "shape", None)
        if getattr(local, "depth", 0) or not shape or len(shape) != 1 or \
                not (hasattr(k_cache, "data_ptr") or type(layer_id) is int):
            return original(*args, **kwargs)  # no write in this call, or one SGLang itself will judge: no range
        tokens = int(shape[0])
        if state.shadow.every and state.shadow_due(getattr(k_cache, "device", None)):
            state.shadow.skip(unchecked)
        found = LAYERS.find(k_cache) if hasattr(k_cache, "data_ptr") else None
        if found is not None:
            pool, _, layer_id = found
            state.seen(pool, name_of, bypass.variant)
        elif type(layer_id) is int:
            pool = arg(args, kwargs, bypass.pool) if bypass.pool else None
            pool = pool if pool is not None else _current_pool()
            if pool is not None:
                state.seen(pool, name_of, bypass.variant)
        else:
            state.note(f"{name_of}: K cache of no pool kvprof has seen (range without a layer)")
            layer_id = None
        if bypass.asked:
            state.saw(layer_id, tokens)
        name, attr = ranges.of(bypass.variant, layer_id, tokens)
        kernel = bypass.kernel
        if callable(kernel):
            call = dict(zip(params, args))
            call.update(kwargs)
            try:
                kernel = kernel(call)
            except Exception as exc:  # noqa: BLE001 - a name for the record only: never stop the write
                log.debug("kvprof: %s's kernel not named (%s)", name_of, _line(exc))
                kernel = None
        local.write = (bypass.variant, layer_id, tokens, kernel, bypass.kernels)
        return ranges.run(name, attr, _native, original, args, kwargs, state, native_key, bypass.write_path)

    hook.__name__ = f"kvprof_{name_of}"
    return hook


_STEP_LOCAL = threading.local()  # forward_context calls open on this thread (the outermost is the step)


class _Step:
    """What the hooked ``forward_context`` returns: SGLang's own context manager, inside a ledger
    step when it is the thread's outermost one with a batch (contexts without one, around it or
    inside it, are no step's boundary). The step asks the batch's tokens
    (``out_cache_loc``, read on entry) of each layer of the forward context's pool
    (``ctx.attn_backend.token_to_kv_pool``); a forward that captured a CUDA graph is no step, one
    that replayed a graph with writes is a graph step (``Ledger.end``)."""

    def __init__(self, inner: Any, ctx: Any, batch: Any) -> None:
        self.inner, self.ctx, self.batch = inner, ctx, batch
        self.outer = False
        self.asked: dict[int, int] | None = None
        self.marks = (0, 0)

    def __enter__(self) -> Any:
        if self.batch is None:  # a context without a batch (PDmux's backend, a draft loop's scope): no step
            return self.inner.__enter__()
        local = _STEP_LOCAL
        depth = getattr(local, "depth", 0)
        self.outer = depth == 0
        local.depth = depth + 1
        if self.outer:
            try:
                loc: Any = getattr(self.batch, "out_cache_loc", None)
                shape = getattr(loc, "shape", None)
                tokens = int(shape[0]) if shape else 0
                pool = getattr(getattr(self.ctx, "attn_backend", None), "token_to_kv_pool", None)
                self.asked = dict.fromkeys(pool_layers(pool), tokens) if tokens else {}
            except Exception as exc:  # noqa: BLE001 - the ledger must never stop a step
                log.debug("kvprof: ledger step not noted (%s)", _line(exc))
                self.asked = None
            graphs = GRAPHS
            self.marks = (graphs.next_id, graphs.replays)
            STATE.ledger.begin()
        try:
            return self.inner.__enter__()
        except BaseException:
            self._close(failed=True)
            raise

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self.inner.__exit__(*exc)
        finally:
            self._close(failed=exc[0] is not None)

    def _close(self, failed: bool) -> None:
        if self.batch is None:
            return
        local = _STEP_LOCAL
        local.depth = max(getattr(local, "depth", 1) - 1, 0)
        if not self.outer:
            return
        self.outer = False
        graphs = GRAPHS
        captured = graphs.next_id != self.marks[0]
        STATE.ledger.end(None if failed or captured else self.asked, graph=graphs.replays != self.marks[1])


def _make_step_hook() -> Any:
    """The AROUND hook on SGLang's ``forward_context``: its context manager inside a ledger step
    (``_Step``)."""

    def hook(original: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = args[0] if args else kwargs.get("ctx")
        return _Step(original(*args, **kwargs), ctx, kwargs.get("forward_batch"))

    hook.__name__ = "kvprof_forward_context"
    return hook


def pool_layers(pool: Any) -> list[int]:
    """The layer ids a KV pool keeps a cache for: ``model_layer_ids`` where a hybrid pool has them,
    else ``start_layer`` .. ``start_layer + layer_num``. A pool made of inner pools answers for them:
    a hybrid linear pool's full-attention pool (its other layers keep no KV), an SWA pool's full
    and sliding-window pools together. A pool with a sliding-window pool and no full one
    (DeepSeek-V4's: every layer of the stage keeps its SWA rows there, numbered from 0 within the
    stage) answers with its own layers."""
    inner = [p for p in (getattr(pool, "full_kv_pool", None), getattr(pool, "swa_kv_pool", None)) if p is not None]
    if inner and getattr(pool, "full_kv_pool", None) is not None:
        return sorted({layer for p in inner for layer in pool_layers(p)})
    ids = getattr(pool, "model_layer_ids", None)
    if isinstance(ids, (list, tuple)) and ids:
        return [int(i) for i in ids]
    num = getattr(pool, "layer_num", None)
    start = getattr(pool, "start_layer", 0) or 0
    return list(range(start, start + num)) if type(num) is int else []


def _make_attention_hook() -> Any:
    """RadixAttention.forward: a call with save_kv_cache=False is a model writing K/V itself,
    noted (per layer) as the path where the ledger's unseen writes went."""

    def hook(original: Any, *args: Any, **kwargs: Any) -> Any:
        save = kwargs.get("save_kv_cache", args[5] if len(args) > 5 else True)
        if save is False and args:
            try:
                batch = kwargs.get("forward_batch", args[4] if len(args) > 4 else None)
                loc: Any = getattr(batch, "out_cache_loc", None)
                tokens = int(loc.shape[0]) if getattr(loc, "shape", None) else 0
                layer = getattr(args[0], "layer_id", None)
                if tokens and not GRAPHS.capturing():
                    STATE.ledger.bypass(f"save_kv_cache=False L{layer}: the model writes K/V itself", tokens)
            except Exception as exc:  # noqa: BLE001 - a note only
                log.debug("kvprof: save_kv_cache=False not noted (%s)", _line(exc))
        return original(*args, **kwargs)

    hook.__name__ = "kvprof_RadixAttention_forward"
    return hook


def _rope_params() -> list[str]:
    """The parameter names of SGLang's rope + store function, in order."""
    import importlib

    return list(inspect.signature(getattr(importlib.import_module(ROPE_MODULE), ROPE_FUNCTION)).parameters)


def _make_rope_hook() -> Any:
    """The AROUND hook on SGLang's rope + store function: a range and a count for every call
    that writes (``fused_args`` given), the named rope writer in SGLang's place where it can."""
    fused_pos = _rope_params().index(ROPE_ARG)
    ranges = _Ranges()
    local = _LOCAL
    state = STATE
    layers = LAYERS
    native_path = f"sglang:{ROPE_FUSED}"

    def hook(original: Any, *args: Any, **kwargs: Any) -> Any:
        fused = kwargs.get(ROPE_ARG)
        if fused is None and len(args) > fused_pos:
            fused = args[fused_pos]
        if fused is None or getattr(local, "depth", None):
            return original(*args, **kwargs)  # the rotary embedding only: no KV write
        loc = getattr(fused, "cache_loc", None)
        tokens = getattr(loc, "shape", None)
        k_buffer = getattr(fused, "k_buffer", None)
        if not tokens or len(tokens) != 1 or not hasattr(k_buffer, "data_ptr"):
            return original(*args, **kwargs)  # a call SGLang itself will judge: no range
        tokens = int(tokens[0])
        if state.shadow.every and state.shadow_due(getattr(k_buffer, "device", None)):
            state.shadow.skip(f"{ROPE_VARIANT}: not checked (rope + store rotates K inside its kernel)")
        found = layers.find(k_buffer)
        if found is None:
            state.note("K buffer of no pool kvprof has seen (range without a layer)")
            layer_id = None
        else:
            pool, index, layer_id = found
            state.seen(pool, ROPE_FUNCTION, ROPE_VARIANT)
        state.saw(layer_id, tokens)
        fell_back = False
        if state.writer_name:
            if found is None:
                state.fallback("rope + store: its K buffer is in no pool kvprof has seen")
                fell_back = True
            elif (route := state.rope_route_for(found[0])) is not None:
                prepared = route.prepare(found, args, kwargs)
                if isinstance(prepared, str):
                    state.fallback(prepared)
                    fell_back = True
                else:
                    name, attr = ranges.of(route.writer.name, layer_id, tokens)
                    local.write = (route.writer.name, layer_id, tokens, *_writer_kernel(route.writer))
                    return ranges.run(name, attr, route.write, prepared)
        name, attr = ranges.of(ROPE_VARIANT, layer_id, tokens)
        local.write = (ROPE_VARIANT, layer_id, tokens, *NATIVE_KERNELS[ROPE_FUSED])
        return ranges.run(name, attr, _native, original, args, kwargs, state, native_path,
                          WRITE_FALLBACK if fell_back else WRITE_FUSED_INTO_ROPE)

    hook.__name__ = f"kvprof_{ROPE_FUNCTION}"
    return hook


def _pool_init_hook(original: Any, *args: Any, **kwargs: Any) -> Any:
    """A pool, once built: its K buffers are where SGLang's fused rope + store writes."""
    out = original(*args, **kwargs)
    if args:
        LAYERS.add(args[0])
    return out


def _native_kernel(native: Any) -> tuple[str | None, int]:
    """(kernel identifier, kernels per write) of one of SGLang's own paths, or (None, 1)."""
    return NATIVE_KERNELS.get(native, (None, 1)) if isinstance(native, str) else (None, 1)


GRAPHS = core.GRAPHS


def hook_graphs(cls: Any = None) -> str:
    """Wrap ``torch.cuda.CUDAGraph``'s capture_begin, capture_end and replay (SGLang's graph
    backends capture through them): where it was hooked, or why not (then graph-replayed writes
    are counted by kernel name only). Never raises (``kvprof.integrations.core.hook_graphs``)."""
    state = STATE
    return core.hook_graphs(cls, lambda: GRAPHS, state.write_sidecar)


class _Route:
    """A pool's writes through a kvprof writer, with SGLang's checks kept."""

    KNOWN = ("layer", "loc_info", "cache_k", "cache_v", "k_scale", "v_scale", "layer_id_override", "dcp_kv_mask")

    def __init__(self, writer: Any, pool: Any, mod: Any, state: _State) -> None:
        from kvprof.kvcache.contracts import checked_impl
        from kvprof.kvcache.validation import check_write_inputs

        self.writer = writer
        # the route runs the store contract's checks through the writer's checked_call (kept per
        # call key: a repeated call is one C++ call and a lookup), SGLang's own slot checks, and
        # then the writer's own write; check_write_inputs and unsupported_reason word a refusal
        self.write_impl = checked_impl(writer)
        self.state = state
        self.check = check_write_inputs
        self.unwrap = getattr(mod, "unwrap_write_loc", None)
        self.oob = getattr(mod, "maybe_detect_oob", None)
        self.rows = pool.size + pool.page_size
        import torch

        dev = torch.device(pool.device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        self.device = dev
        self.device_index = dev.index if dev.type == "cuda" else -1
        self.input_ok: dict[Any, str | None] = {}

    def write(self, pool: Any, call: tuple[Any, ...]) -> None:
        """The write through kvprof's writer, after SGLang's own checks on the write loc."""
        loc_info, checked = call
        pool._check_physical_write_loc(loc_info, "set_kv_buffer (MHA)")
        if self.oob is not None:
            self.oob(checked[2], 0, self.rows, "set_kv_buffer (MHA)")
        path = self.write_impl(*checked)
        self.state.count(f"writer:{self.writer.name}:{path}", WRITE_SET_KV_BUFFER)

    def prepare(self, pool: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | str:
        """The write's arguments for ``write``, or why this call is SGLang's to write."""
        if len(args) > len(self.KNOWN) + 1:
            return f"{len(args) - 1} positional arguments (kvprof knows {len(self.KNOWN)})"
        for key in kwargs:
            if key not in self.KNOWN:
                return f"unknown argument {key!r}"
        call = dict(zip(self.KNOWN, args[1:]))
        call.update(kwargs)
        if call.get("dcp_kv_mask") is not None:
            return "a DCP mask (SGLang's masked kernel writes it)"
        loc_info = call.get("loc_info")
        loc = self.unwrap(loc_info)[0] if self.unwrap else loc_info
        override = call.get("layer_id_override")
        layer_id = override if override is not None else getattr(call.get("layer"), "layer_id", None)
        if type(layer_id) is not int or not 0 <= layer_id - pool.start_layer < pool.layer_num:
            return f"layer {layer_id!r} is not in this pool"
        idx = layer_id - pool.start_layer
        k_buf, v_buf = pool.k_buffer[idx], pool.v_buffer[idx]
        try:
            return (loc_info, self.writer.checked_call(k_buf, v_buf, loc, call.get("cache_k"), call.get("cache_v"),
                                                       pool.dtype, call.get("k_scale"), call.get("v_scale")))
        except ValueError as exc:
            refusal = exc
        # refused: the pool's input checks, or the writer's unsupported_reason, word it for the log
        try:
            _, k, _ = self.check(loc, call.get("cache_k"), call.get("cache_v"), pool.head_num, pool.head_dim,
                                 pool.v_head_dim, self.device, self.device_index, k_buf, v_buf)
        except ValueError as exc:
            return f"input kvprof's checks refuse ({exc})"
        in_dtype = k.dtype
        if in_dtype not in self.input_ok:
            self.input_ok[in_dtype] = self.writer.unsupported_reason(self.device, pool.dtype, in_dtype)
        return self.input_ok[in_dtype] or f"input kvprof's checks refuse ({refusal})"


class _RopeRoute:
    """A pool's fused rope + store writes through a kvprof rope writer (``RopeKVWriter``): the
    arguments SGLang's kernel would get, with the layer's own 3-D K/V buffers."""

    def __init__(self, writer: Any, pool: Any, device: Any, state: _State) -> None:
        from kvprof.kvcache.contracts import check_rope_call, checked_impl

        self.writer = writer
        # the route runs the rope contract's checks through the writer's checked_call (kept per
        # call key: a repeated call is one C++ call and a lookup) and then the writer's own write;
        # check_rope_call and unsupported_reason word a refusal for the log
        self.write_impl = checked_impl(writer)
        self.dtype = pool.dtype  # not the pool: kvprof must not keep a pool SGLang has let go
        self.state = state
        self.device = device
        self.check = check_rope_call
        self.names = _rope_params()
        self.input_ok: dict[Any, str | None] = {}

    def write(self, call: tuple[Any, ...]) -> None:
        path = self.write_impl(*call)
        self.state.count(f"writer:{self.writer.name}:{path}", WRITE_FUSED_INTO_ROPE)

    def prepare(self, found: tuple[Any, int, int], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[Any, ...] | str:
        """The writer's arguments, or why this call is SGLang's to write (worded for the log)."""
        if len(args) > len(self.names):
            return f"rope + store: {len(args)} positional arguments (kvprof knows {len(self.names)})"
        for key in kwargs:
            if key not in self.names:
                return f"rope + store: unknown argument {key!r}"
        call: dict[str, Any] = dict(zip(self.names, args))
        call.update(kwargs)
        pool, index, _ = found
        if index <= _SWA:
            return "rope + store: its K buffer is a layer's DeepSeek-V4 cache, not a K buffer"
        fused: Any = call[ROPE_ARG]  # the hook passes only calls that have it
        table: Any = call.get("cos_sin_cache")
        rope_dim = call.get("rope_dim") or 0
        if rope_dim and rope_dim != getattr(table, "shape", (0,))[-1]:
            return f"rope + store: rope_dim {rope_dim} is not the cos/sin table's width"
        k_buf, v_buf = pool.k_buffer[index], pool.v_buffer[index]
        if getattr(fused.v_buffer, "data_ptr", lambda: None)() != v_buf.data_ptr():
            return "rope + store: its V buffer is not its layer's"
        loc, positions, q, k = fused.cache_loc, call.get("positions"), call.get("q"), call.get("k")
        try:
            return self.writer.checked_call(q, k, fused.value, k_buf, v_buf, loc, positions, table,  # type: ignore[no-any-return]
                                            bool(call.get("is_neox")), pool.dtype)
        except ValueError as exc:
            refusal = exc
        # refused: the rope checks, or the writer's unsupported_reason, word it for the log
        try:
            q, k, v, loc, positions = self.check(q, k, fused.value, k_buf, v_buf, loc, positions,  # type: ignore[arg-type]
                                                 table, pool.dtype)
        except ValueError as exc:
            return f"rope + store: input kvprof's checks refuse ({exc})"
        in_dtype = k.dtype
        if in_dtype not in self.input_ok:
            self.input_ok[in_dtype] = self.writer.unsupported_reason(self.device, pool.dtype, in_dtype)
        refused = self.input_ok[in_dtype]
        return refused or f"rope + store: input kvprof's checks refuse ({refusal})"


class _LayerMap:
    """Which layer of which pool a K buffer is. SGLang's fused rope + store gets the layer's K
    buffer (``FusedSetKVBufferArg.k_buffer``, a 2-D view of ``pool.k_buffer[i]``) and no layer
    id: the buffer's address names it. Pools come from the pool-init hook, from writes through
    ``set_kv_buffer``, and, when an address is unknown, from SGLang's forward context (the pool
    ``create_fused_set_kv_buffer_arg`` read it from). The layer id of buffer ``i`` is the pool's
    ``model_layer_ids[i]`` where a hybrid pool gave it one, else ``start_layer + i``."""

    def __init__(self, current: Any = None) -> None:
        self.current = current or _current_pool
        # weak references (where the pool allows them): a pool SGLang lets go of, with its
        # buffers, is not kept alive by kvprof
        self.pools: list[Any] = []
        self.by_ptr: dict[int, tuple[Any, int, int] | None] = {}  # None: several layers share it
        self.missed: set[int] = set()
        self.lock = threading.Lock()

    def add(self, pool: Any) -> None:
        with self.lock:
            if any(_deref(r) is pool for r in self.pools):
                return
            self.pools = [r for r in self.pools if _deref(r) is not None] + [_weak(pool)]
            self.missed.clear()

    def find(self, k_buffer: Any) -> tuple[Any, int, int] | None:
        """(pool, index in its k_buffer, layer id), or None when no known pool holds it."""
        ptr = k_buffer.data_ptr()
        hit = self._alive(self.by_ptr.get(ptr), ptr)
        if hit is not None:
            return hit
        if ptr in self.missed:
            return None
        pool = self.current()
        if pool is not None:
            self.add(pool)
            for name in ("full_kv_pool", "swa_kv_pool"):  # a hybrid or SWA pool's inner pools
                inner = getattr(pool, name, None)
                if inner is not None:
                    self.add(inner)
        self._rebuild()
        hit = self._alive(self.by_ptr.get(ptr), ptr)
        if hit is None:
            self.missed.add(ptr)
        return hit

    @staticmethod
    def _alive(entry: tuple[Any, int, int] | None, ptr: int) -> tuple[Any, int, int] | None:
        """The entry with its pool, if the pool lives and its buffer is still at ``ptr``."""
        if entry is None:
            return None
        pool = _deref(entry[0])
        return (pool, entry[1], entry[2]) if pool is not None and _buffer_ptr(pool, entry[1]) == ptr else None

    def _rebuild(self) -> None:
        by_ptr: dict[int, tuple[Any, int, int] | None] = {}
        with self.lock:
            refs = [(r, p) for r, p in ((r, _deref(r)) for r in self.pools) if p is not None]
        for ref, pool in refs:
            bufs = getattr(pool, "k_buffer", None)
            if not isinstance(bufs, (list, tuple)):
                continue
            ids = getattr(pool, "model_layer_ids", None)
            ids = ids if isinstance(ids, (list, tuple)) and len(ids) == len(bufs) else None
            start = getattr(pool, "start_layer", 0) or 0
            for i, buf in enumerate(bufs):
                ptr = buf.data_ptr() if hasattr(buf, "data_ptr") else None
                if not ptr:
                    continue
                entry = (ref, i, int(ids[i]) if ids else start + i)
                by_ptr[ptr] = None if ptr in by_ptr else entry
        for ref, pool in refs:  # DeepSeek-V4's pools: each layer's caches, from the pool's own getters
            getters = [g for g in LAYER_BUFFER_GETTERS if callable(getattr(pool, g, None))]
            if not getters:
                continue
            for layer_id in pool_layers(pool):
                for getter in getters:
                    index = _getter_index(getter, layer_id)
                    ptr = _buffer_ptr(pool, index)
                    if ptr:
                        by_ptr[ptr] = None if ptr in by_ptr else (ref, index, layer_id)
        self.by_ptr = by_ptr


def _weak(pool: Any) -> Any:
    try:
        return weakref.ref(pool)
    except TypeError:  # a pool class with __slots__: held for the process, as SGLang holds it
        return lambda: pool


def _deref(ref: Any) -> Any:
    return ref()


# The per-layer caches a pool hands out by layer id (DeepSeek-V4's: the SWA rows, the compressed KV,
# the indexer's keys as one buffer or as its fp4 payload, the unified ring): the address of each
# names its layer for a kernel that is given the cache and no layer (the fused stores). A layer the
# pool keeps no such cache for is skipped (its getter raises); a buffer several layers share (the
# low compress ratios' shared pool layers) names none. Under HiCache the compressed-cache getters wait
# for their layer's load (as for SGLang's own callers of them): the map is rebuilt only when a
# cache's address is unknown (the first such write of a pool), and that rebuild waits once for every
# layer's load.
LAYER_BUFFER_GETTERS = ("get_swa_raw_buffer", "get_extra_key_buffer", "get_index_k_with_scale_buffer",
                        "get_index_k_fp4_payload_buffer", "get_unified_kv")
# A _LayerMap entry's index at or below this is no K buffer's: it is the cache that getter
# ``LAYER_BUFFER_GETTERS[j]`` gives for layer ``L``, where ``_SWA - index == L * len(getters) + j``
_SWA = -1


def _getter_index(getter: str, layer_id: int) -> int:
    return _SWA - (layer_id * len(LAYER_BUFFER_GETTERS) + LAYER_BUFFER_GETTERS.index(getter))


def _buffer_ptr(pool: Any, index: int) -> int | None:
    if index <= _SWA:
        layer_id, j = divmod(_SWA - index, len(LAYER_BUFFER_GETTERS))
        return _getter_ptr(pool, LAYER_BUFFER_GETTERS[j], layer_id)
    try:
        return int(pool.k_buffer[index].data_ptr())
    except (AttributeError, IndexError, TypeError):
        return None


def _getter_ptr(pool: Any, getter: str, layer_id: int) -> int | None:
    """The address of the cache ``pool.<getter>(layer_id)`` gives, or None (a layer without one)."""
    try:
        return int(getattr(pool, getter)(layer_id).data_ptr())
    except Exception:  # noqa: BLE001 - a layer the pool keeps no such cache for, in its own words
        return None


def _current_pool() -> Any:
    """SGLang's KV pool of the forward pass now running, or None outside one."""
    try:
        from sglang.srt.model_executor.forward_context import get_token_to_kv_pool, has_forward_context

        return get_token_to_kv_pool() if has_forward_context() else None
    except Exception as exc:  # noqa: BLE001 - another SGLang, or no attention backend yet
        log.debug("kvprof: no SGLang forward context (%s)", _line(exc))
        return None


LAYERS = _LayerMap()


class _State(core.PluginState):
    """What this process did, for the sidecar (``kvprof.integrations.core.PluginState``); the
    writer and each pool's route."""

    def __init__(self) -> None:
        super().__init__(SGLANG)
        self.routes: dict[int, _Route | None] = {}
        self.rope_routes: dict[int, tuple[Any, _RopeRoute | None]] = {}
        self.canary = Canary()

    def canary_record(self) -> Any:
        from kvprof.core.sidecar import SidecarCanary

        c = self.canary
        with c.lock:
            if not c.violations:
                return None
            return SidecarCanary(violations=c.violations, total=c.total, by_reason=dict(c.by_reason),
                                 first=list(c.first))

    def graphs(self) -> core.Graphs:
        return GRAPHS

    def ranks(self) -> tuple[int, int, int]:
        return _ranks()

    def route_for(self, pool: Any) -> _Route | None:
        """This pool's route (built once); None: the pool is SGLang's to write, reason logged once."""
        key = id(pool)
        if key in self.routes:
            return self.routes[key]
        route, reason = self._build_route(pool)
        self.routes[key] = route
        if route is None:
            log.warning("kvprof: %s not used for %s: %s", self.writer_name, type(pool).__name__, reason)
        self.pool_info(pool).update(route=(f"writer:{self.writer_name}" if route else "sglang"),
                                    route_reason=reason)
        return route

    def rope_route_for(self, pool: Any) -> _RopeRoute | None:
        """This pool's route for SGLang's fused rope + store writes, as ``route_for`` (held with
        a weak reference to its pool, so a new pool at a freed pool's id gets its own)."""
        key = id(pool)
        held = self.rope_routes.get(key)
        if held is not None and _deref(held[0]) is pool:
            return held[1]
        route, reason = self._build_rope_route(pool)
        self.rope_routes[key] = (_weak(pool), route)
        if route is None:
            log.warning("kvprof: %s not used for %s's fused rope + store: %s", self.writer_name,
                        type(pool).__name__, reason)
        self.pool_info(pool).update(rope_route=(f"writer:{self.writer_name}" if route else "sglang"),
                                    rope_route_reason=reason)
        return route

    def _build_route(self, pool: Any) -> tuple[_Route | None, str | None]:
        import importlib

        writer = self._writer()
        if writer is None:
            return None, f"writer {self.writer_name} unavailable ({self.writer_error})"
        if _is_rope_writer(writer):
            return None, f"{writer.name} is a rope + store writer: set_kv_buffer has no rotary embedding to run"
        mod = importlib.import_module(MEMORY_POOL)
        base = mod.MHATokenToKVPool
        if getattr(type(pool), "_store_kv_layer", None) is not getattr(base, "_store_kv_layer", None):
            return None, f"{type(pool).__name__} writes its own layout (_store_kv_layer)"
        dev, reason = _pool_device(pool, writer)
        if reason:
            return None, reason
        writer.prepare(dev)
        return _Route(writer, pool, mod, self), None

    def _build_rope_route(self, pool: Any) -> tuple[_RopeRoute | None, str | None]:
        writer = self._writer()
        if writer is None:
            return None, f"writer {self.writer_name} unavailable ({self.writer_error})"
        if not _is_rope_writer(writer):
            return None, (f"{writer.name} is a store writer: SGLang's rope + store stays one launch "
                          "(name a rope + store writer, e.g. rope_triton_fused)")
        dev, reason = _pool_device(pool, writer)
        if reason:
            return None, reason
        writer.prepare(dev)
        return _RopeRoute(writer, pool, dev, self), None

    def seen(self, pool: Any, hooked: str, variant: str) -> None:
        """A pool's first write: described in the sidecar, and its K buffers known by address."""
        info = self.pools.get(id(pool))
        if info is not None and info.get("class"):
            return
        info = self.pool_info(pool)
        info.update(describe_pool(pool, hooked, variant))
        if self.device is None:
            self.device = describe_device(pool)
        LAYERS.add(pool)
        self.write_sidecar()


STATE = _State()


def _is_rope_writer(writer: Any) -> bool:
    """Whether ``writer`` implements the MHA layout's rope + store contract (not the store's)."""
    from kvprof.kvcache.layouts import get_layout

    return get_layout("mha").contract_of(writer) == "rope"


def _pool_device(pool: Any, writer: Any) -> tuple[Any, str | None]:
    """(the pool's device, None), or (None, why kvprof's writer cannot write this pool)."""
    import torch

    if getattr(pool, "is_quantized_kv_cache", False):
        return None, "quantized KV cache (SGLang's quant method writes it)"
    if getattr(pool, "use_hnd", False) or getattr(pool, "kv_cache_layout", "nhd") != "nhd":
        return None, f"layout {getattr(pool, 'kv_cache_layout', '?')} (kvprof writes NHD rows)"
    try:
        dev = torch.device(pool.device)
    except (TypeError, RuntimeError) as exc:
        return None, f"device {pool.device!r} ({_line(exc)})"
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    reason = writer.unsupported_reason(dev, pool.dtype)
    if reason:
        return None, reason
    bufs = list(pool.k_buffer) + list(pool.v_buffer)
    if not all(b.is_contiguous() and b.dim() == 3 and b.shape[0] == pool.size + pool.page_size for b in bufs):
        return None, "K/V buffers are not contiguous [slots, heads, dim] tensors"
    return dev, None


def sidecar_dir() -> Path:
    return SGLANG.sidecar_dir()


def describe_pool(pool: Any, hooked: str, variant: str) -> dict[str, Any]:
    """Shapes and dtypes of one pool, read defensively (attribute names vary by pool); its native
    path is set_kv_buffer's predicted one, or fused_into_rope where its first write was SGLang's rope."""
    from kvprof.kvcache.dtypes import short_name

    def dt(x: Any) -> Any:
        try:
            return short_name(x)
        except (KeyError, ValueError, TypeError):
            return str(x) if x is not None else None

    out: dict[str, Any] = {"class": type(pool).__name__, "hooked": hooked, "variant": variant,
                           "native_path": ROPE_FUSED if hooked == ROPE_FUNCTION else
                           next((b.native for b in BYPASSES if b.function.rsplit(".", 1)[-1] == hooked), None)
                           or native_path(pool)}
    for key in ("size", "page_size", "head_num", "head_dim", "v_head_dim", "layer_num", "start_layer",
                "kv_lora_rank", "qk_rope_head_dim"):
        value = getattr(pool, key, None)
        if type(value) is int:
            out[key] = value
    layout = getattr(pool, "kv_cache_layout", None)
    if isinstance(layout, str):
        out["kv_cache_layout"] = layout
    out["dtype"] = dt(getattr(pool, "dtype", None))
    out["store_dtype"] = dt(getattr(pool, "store_dtype", None))
    out["device"] = str(getattr(pool, "device", None))
    out["quantized"] = bool(getattr(pool, "is_quantized_kv_cache", False))
    return out


def describe_device(pool: Any) -> SidecarDevice | None:
    """The pool's device as kvprof's manifest describes one (name, peak bandwidth and its source);
    None where it cannot be read (never raises: the sidecar goes without it)."""
    return core.describe_device(getattr(pool, "device", None))


def native_path(pool: Any) -> str:
    """Which of SGLang's MHA paths its own conditions pick for this pool (a prediction from
    ``_set_kv_buffer_impl``'s tests, not an observation): store_cache, two streams under
    graph capture, or index_put."""
    try:
        import importlib

        mod = importlib.import_module(MEMORY_POOL)
        if getattr(pool, "is_quantized_kv_cache", False):
            return "quantized"
        if getattr(pool, "kv_cache_layout", "nhd") != "nhd" or getattr(pool, "use_hnd", False):
            return f"layout:{getattr(pool, 'kv_cache_layout', '?')}"
        row_dim, v_row_dim = getattr(pool, "row_dim", None), getattr(pool, "v_row_dim", None)
        if row_dim is None:
            return "unknown"
        size = pool.store_dtype.itemsize
        if (getattr(mod, "_is_cuda", False) or getattr(mod, "_is_hip", False)) and \
                mod.can_use_store_cache(row_dim * size, v_row_dim * size):
            return NATIVE_STORE_CACHE
        if getattr(pool, "alt_stream", None) is not None:
            return NATIVE_TWO_STREAMS
        return NATIVE_INDEX_PUT
    except Exception as exc:  # noqa: BLE001 - a prediction only: never fail the write for it
        return f"unknown ({_line(exc)})"


def _ranks() -> tuple[int, int, int]:
    """(global rank, TP rank, TP size): SGLang's parallel context, else torch.distributed, else 0/0/1."""
    rank, tp_rank, tp_size = 0, None, None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = dist.get_rank()
            tp_rank, tp_size = rank, dist.get_world_size()
    except (RuntimeError, ValueError) as exc:
        log.debug("kvprof: no torch.distributed rank (%s)", _line(exc))
    try:
        from sglang.srt.runtime_context import get_parallel

        par = get_parallel()
        tp_rank, tp_size = int(par.tp_rank), int(par.tp_size)
    except Exception as exc:  # noqa: BLE001 - not initialised (a bare pool) or another SGLang
        log.debug("kvprof: no SGLang parallel context (%s)", _line(exc))
    return rank, (tp_rank if tp_rank is not None else rank), (tp_size if tp_size is not None else 1)

