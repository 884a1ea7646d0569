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
from importlib import metadata
from pathlib import Path
from typing import Any

from kvprof.core.sidecar import (
    NATIVE_INDEX_PUT,
    NATIVE_STORE_CACHE,
    NATIVE_TWO_STREAMS,
    ROPE_VARIANT,
    SIDECAR_SCHEMA,
    CapturedGraph,
    GraphWrite,
    Sidecar,
    SidecarDevice,
    SidecarPool,
    encode_sidecar,
)
from kvprof.core.vocab import GRAPH_REPLAY_RANGE_FORMAT, ROPE_FUSED

ENV_ON = "KVPROF_SGLANG"
ENV_WRITER = "KVPROF_SGLANG_WRITER"
ENV_DIR = "KVPROF_SGLANG_DIR"
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

# The kernel (a substring of its name, as traces show it) and the launches of one write on each of
# SGLang's own paths: what the sidecar's graph record says a replayed write's kernels are
NATIVE_KERNELS: dict[str, tuple[str, int]] = {
    NATIVE_STORE_CACHE: ("store_kvcache_kernel", 1),  # SGLang's JIT kernel (kvcache.cuh)
    NATIVE_INDEX_PUT: ("index_put", 2),  # K, then V: torch's index_put_kernel_impl
    NATIVE_TWO_STREAMS: ("index_put", 2),  # the same, V on SGLang's alt stream under capture
    ROPE_FUSED: ("fused_rope_store_kernel", 1),  # SGLang's JIT rope + store (rope.cuh)
}
# torch's CUDA graph class: its captures note the writes recorded into each graph, its replays
# carry a range naming the graph (kvprof.core.vocab.GRAPH_REPLAY_RANGE_FORMAT)
GRAPH_METHODS = ("capture_begin", "capture_end", "replay")

# What the sidecar's write_paths count: which entry point wrote, or that a named writer fell back
WRITE_SET_KV_BUFFER = "set_kv_buffer"
WRITE_FUSED_INTO_ROPE = "fused into rope"
WRITE_FALLBACK = "fallback"

log = logging.getLogger("kvprof.sglang")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def sglang_version() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


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
    state.hooked = hooked
    if hooked:
        log.info("kvprof: KV-write ranges on %s%s", ", ".join(hooked),
                 f"; writer {state.writer_name}" if state.writer_name else "")
        GRAPHS.hook = hook_graphs()
        atexit.register(state.write_sidecar)


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


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


class _RangeMaker:
    """kvprof's NVTX domain and torch's record_function, looked up once for the hooks' ranges."""

    def __init__(self) -> None:
        import nvtx
        import torch

        from kvprof.core.vocab import NVTX_DOMAIN

        self.domain = nvtx.get_domain(NVTX_DOMAIN)
        self.profiler_enabled = torch._C._autograd._profiler_enabled
        self.record_function = torch.profiler.record_function


class _Ranges(_RangeMaker):
    """kvprof's write ranges (NVTX and record_function), names and attributes made once each."""

    def __init__(self) -> None:
        super().__init__()
        self.names: dict[tuple[str, int | None], str] = {}
        self.attrs: dict[tuple[str, int | None, int], Any] = {}

    def of(self, variant: str, layer_id: int | None, tokens: int) -> tuple[str, Any]:
        """(range name, NVTX attributes); without a layer id the name has no ``L<layer>``
        (a form the analysis reads as layer -1)."""
        from kvprof.core.vocab import WRITE_RANGE_FORMAT

        key = (variant, layer_id)
        name = self.names.get(key)
        if name is None:
            name = WRITE_RANGE_FORMAT.format(variant=variant, layer=layer_id)
            if layer_id is None:
                name = name.rsplit(" L", 1)[0]
            self.names[key] = name
        akey = (variant, layer_id, tokens)
        attr = self.attrs.get(akey)
        if attr is None:
            from kvprof.instrument import variant_color

            attr = self.attrs[akey] = self.domain.get_event_attributes(
                message=name, color=variant_color(variant), category=variant, payload=tokens)
        return name, attr

    def run(self, name: str, attr: Any, write: Any, *args: Any) -> Any:
        """``write(*args)`` inside the range (and a record_function range while a profiler records)."""
        local = _LOCAL
        local.depth = 1
        self.domain.push_range(attr)
        try:
            if self.profiler_enabled():
                with self.record_function(name):
                    return write(*args)
            return write(*args)
        finally:
            self.domain.pop_range()
            local.depth = 0
            local.write = None


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
                return ranges.run(name, attr, route.write, pool, prepared)
        name, attr = ranges.of(variant, layer_id, tokens)
        state.seen(pool, hooked, variant)
        local.write = (variant, layer_id, tokens, *_native_kernel(state.pools[id(pool)].get("native_path")))
        return ranges.run(name, attr, _native, original, args, kwargs, state, native_path,
                          WRITE_FALLBACK if fell_back else WRITE_SET_KV_BUFFER)

    hook.__name__ = f"kvprof_{cls_name}_{method}"
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
        found = layers.find(k_buffer)
        if found is None:
            state.note("K buffer of no pool kvprof has seen (range without a layer)")
            layer_id = None
        else:
            pool, index, layer_id = found
            state.seen(pool, ROPE_FUNCTION, ROPE_VARIANT)
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
    """(kernel name substring, kernels per write) of one of SGLang's own paths, or (None, 1)."""
    return NATIVE_KERNELS.get(native, (None, 1)) if isinstance(native, str) else (None, 1)


def _writer_kernel(writer: Any) -> tuple[str | None, int]:
    """(a substring of the writer's kernel name, kernels per write) where the writer says it
    (``kernel_name``), else (None, 1): its graph-replayed writes are then counted by name only."""
    name = getattr(writer, "kernel_name", None)
    return (name if isinstance(name, str) and name else None), 1


class _Graphs:
    """The writes each CUDA graph captured, in capture order (``CapturedGraph``), and the
    number each graph gets; SGLang captures its graphs on the thread that runs the model."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.lock = threading.Lock()
        self.next_id = 0
        self.graphs: list[CapturedGraph] = []
        self.empty = 0  # graphs captured without a KV write
        self.ids: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.with_writes: set[int] = set()
        self.hook: str | None = None

    def begin(self, graph: Any) -> None:
        with self.lock:
            gid = self.next_id
            self.next_id += 1
        try:
            self.ids[graph] = gid
        except TypeError:  # not weakly referable: its replays get no range
            pass
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        stack.append((gid, []))

    def end(self) -> bool:
        """The innermost capture on this thread ended; True when it recorded writes."""
        stack = getattr(self.local, "stack", None)
        if not stack:
            return False
        gid, writes = stack.pop()
        with self.lock:
            if writes:
                self.graphs.append(CapturedGraph(graph=gid, writes=writes))
                self.with_writes.add(gid)
            else:
                self.empty += 1
        return bool(writes)

    def note(self, path: str) -> None:
        """A write counted as ``path``: recorded into the graph being captured on this thread, if any."""
        stack = getattr(self.local, "stack", None)
        if not stack:
            return
        what = getattr(_LOCAL, "write", None)
        if what is None:
            return
        variant, layer_id, tokens, kernel, kernels = what
        stack[-1][1].append(GraphWrite(layer=layer_id if type(layer_id) is int else -1, variant=variant, path=path,
                                       tokens=int(tokens), kernel=kernel, kernels=int(kernels)))

    def replay_range(self, graph: Any) -> str | None:
        """The range name a replay of ``graph`` runs in, or None for a graph without writes."""
        try:
            gid = self.ids.get(graph)
        except TypeError:
            return None
        return GRAPH_REPLAY_RANGE_FORMAT.format(graph=gid) if gid in self.with_writes else None


GRAPHS = _Graphs()


def hook_graphs(cls: Any = None) -> str:
    """Wrap ``torch.cuda.CUDAGraph``'s capture_begin, capture_end and replay (SGLang's graph
    backends capture through them): where it was hooked, or why not (then graph-replayed writes
    are counted by kernel name only). Never raises."""
    if cls is None:
        try:
            import torch

            cls = getattr(torch.cuda, "CUDAGraph", None)
        except Exception as exc:  # noqa: BLE001 - a torch without CUDA graphs
            return f"not hooked: torch.cuda does not import ({_line(exc)})"
    if not isinstance(cls, type):
        return "not hooked: this torch has no torch.cuda.CUDAGraph"
    missing = [m for m in GRAPH_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        return f"not hooked: torch.cuda.CUDAGraph has no {', '.join(missing)}"
    where = f"{cls.__module__}.{cls.__qualname__}.{{{','.join(GRAPH_METHODS)}}}"
    if getattr(getattr(cls, "capture_begin"), "_kvprof_graph_hook", False):  # noqa: B009 - a type's attribute
        return where
    begin, end, replay = (getattr(cls, m) for m in GRAPH_METHODS)
    graphs, state = GRAPHS, STATE

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        graphs.begin(self)
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            graphs.end()
            raise

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return end(self, *args, **kwargs)
        finally:
            if graphs.end():
                state.write_sidecar()

    def replay_hooked(self: Any, *args: Any, **kwargs: Any) -> Any:
        name = graphs.replay_range(self)
        if name is None:
            return replay(self, *args, **kwargs)
        return _replay_ranges().run(name, replay, self, *args, **kwargs)

    for m, fn in zip(GRAPH_METHODS, (capture_begin, capture_end, replay_hooked)):
        fn.__name__ = f"kvprof_{m}"
        fn.__wrapped__ = getattr(cls, m)  # type: ignore[attr-defined]
        fn._kvprof_graph_hook = True  # type: ignore[attr-defined]
        setattr(cls, m, fn)
    log.info("kvprof: CUDA graph captures noted through %s", where)
    return where


class _ReplayRanges(_RangeMaker):
    """A range around a graph replay: NVTX, and record_function while a profiler records."""

    def __init__(self) -> None:
        super().__init__()
        self.attrs: dict[str, Any] = {}

    def run(self, name: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        attr = self.attrs.get(name)
        if attr is None:
            attr = self.attrs[name] = self.domain.get_event_attributes(message=name)
        self.domain.push_range(attr)
        try:
            if self.profiler_enabled():
                with self.record_function(name):
                    return fn(*args, **kwargs)
            return fn(*args, **kwargs)
        finally:
            self.domain.pop_range()


_REPLAY_RANGES: list[_ReplayRanges] = []


def _replay_ranges() -> _ReplayRanges:
    if not _REPLAY_RANGES:
        _REPLAY_RANGES.append(_ReplayRanges())
    return _REPLAY_RANGES[0]


def _native(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any], state: _State, path: str,
            write_path: str) -> Any:
    state.count(path, write_path)
    return original(*args, **kwargs)


_LOCAL = threading.local()


class _Route:
    """A pool's writes through a kvprof writer, with SGLang's checks kept."""

    KNOWN = ("layer", "loc_info", "cache_k", "cache_v", "k_scale", "v_scale", "layer_id_override", "dcp_kv_mask")

    def __init__(self, writer: Any, pool: Any, mod: Any, state: _State) -> None:
        from kvprof.validation import check_write_inputs
        from kvprof.writers.base import checked_impl

        self.writer = writer
        # the route runs the store contract's checks on the engine's call itself (check_write_inputs,
        # unsupported_reason, SGLang's own slot checks): it calls the writer's own write
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
        loc_info, loc, idx, k, v, k_scale, v_scale = call
        pool._check_physical_write_loc(loc_info, "set_kv_buffer (MHA)")
        if self.oob is not None:
            self.oob(loc, 0, self.rows, "set_kv_buffer (MHA)")
        path = self.write_impl(pool.k_buffer[idx], pool.v_buffer[idx], loc, k, v, pool.dtype, k_scale, v_scale)
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
        try:
            loc, k, v = self.check(loc, call.get("cache_k"), call.get("cache_v"), pool.head_num, pool.head_dim,
                                   pool.v_head_dim, self.device, self.device_index, pool.k_buffer[idx],
                                   pool.v_buffer[idx])
        except ValueError as exc:
            return f"input kvprof's checks refuse ({exc})"
        in_dtype = k.dtype
        if in_dtype not in self.input_ok:
            self.input_ok[in_dtype] = self.writer.unsupported_reason(self.device, pool.dtype, in_dtype)
        refused = self.input_ok[in_dtype]
        if refused:
            return refused
        return (loc_info, loc, idx, k, v, call.get("k_scale"), call.get("v_scale"))


class _RopeRoute:
    """A pool's fused rope + store writes through a kvprof rope writer (``RopeKVWriter``): the
    arguments SGLang's kernel would get, with the layer's own 3-D K/V buffers."""

    def __init__(self, writer: Any, pool: Any, device: Any, state: _State) -> None:
        from kvprof.writers.base import checked_impl
        from kvprof.writers.rope_base import check_rope_call

        self.writer = writer
        # the route runs the rope contract's checks itself (check_rope_call, unsupported_reason):
        # it calls the writer's own write
        self.write_impl = checked_impl(writer)
        self.dtype = pool.dtype  # not the pool: kvprof must not keep a pool SGLang has let go
        self.state = state
        self.device = device
        self.check = check_rope_call
        self.names = _rope_params()
        self.input_ok: dict[Any, str | None] = {}

    def write(self, call: tuple[Any, ...]) -> None:
        path = self.write_impl(*call, self.dtype)
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
            q, k, v, loc, positions = self.check(q, k, fused.value, k_buf, v_buf, loc, positions,  # type: ignore[arg-type]
                                                 table, pool.dtype)
        except ValueError as exc:
            return f"rope + store: input kvprof's checks refuse ({exc})"
        in_dtype = k.dtype
        if in_dtype not in self.input_ok:
            self.input_ok[in_dtype] = self.writer.unsupported_reason(self.device, pool.dtype, in_dtype)
        refused = self.input_ok[in_dtype]
        if refused:
            return refused
        return (q, k, v, k_buf, v_buf, loc, positions, table, bool(call.get("is_neox")))


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
            inner = getattr(pool, "full_kv_pool", None)  # a hybrid pool's full-attention pool
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
        self.by_ptr = by_ptr


def _weak(pool: Any) -> Any:
    try:
        return weakref.ref(pool)
    except TypeError:  # a pool class with __slots__: held for the process, as SGLang holds it
        return lambda: pool


def _deref(ref: Any) -> Any:
    return ref()


def _buffer_ptr(pool: Any, index: int) -> int | None:
    try:
        return int(pool.k_buffer[index].data_ptr())
    except (AttributeError, IndexError, TypeError):
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


class _State:
    """What this process did, for the sidecar; the writer and each pool's route."""

    def __init__(self) -> None:
        self.writer_name: str | None = None
        self.writer: Any = None
        self.writer_error: str | None = None
        self.hooked: list[str] = []
        self.pools: dict[int, dict[str, Any]] = {}
        self.routes: dict[int, _Route | None] = {}
        self.rope_routes: dict[int, tuple[Any, _RopeRoute | None]] = {}
        self.paths: dict[str, int] = {}
        self.write_paths: dict[str, int] = {}
        self.fallbacks: dict[str, int] = {}
        self.unattributed: dict[str, int] = {}
        self.device: SidecarDevice | None = None
        self.lock = threading.Lock()

    def count(self, path: str, write_path: str) -> None:
        """One write: ``path`` in detail (whose kernel, which path), ``write_path`` which entry
        point wrote it (set_kv_buffer, fused into rope) or that the named writer fell back."""
        self.paths[path] = self.paths.get(path, 0) + 1
        self.write_paths[write_path] = self.write_paths.get(write_path, 0) + 1
        GRAPHS.note(path)

    def note(self, reason: str) -> None:
        """A write counted and ranged without its layer (logged once per reason)."""
        n = self.unattributed.get(reason, 0)
        if not n:
            log.warning("kvprof: a KV write with no layer: %s", reason)
        self.unattributed[reason] = n + 1

    def fallback(self, reason: str) -> None:
        n = self.fallbacks.get(reason, 0)
        if not n:
            log.warning("kvprof: %s: SGLang's own write for %s", self.writer_name, reason)
        self.fallbacks[reason] = n + 1
        self.paths["sglang:fallback"] = self.paths.get("sglang:fallback", 0) + 1

    def _writer(self) -> Any:
        if self.writer is None and self.writer_error is None:
            if self.writer_name is None:  # the hooks ask only once a writer is named
                self.writer_error = "no writer named"
                return None
            try:
                from kvprof.writers import create_writer

                self.writer = create_writer(self.writer_name)
            except Exception as exc:  # noqa: BLE001 - an unknown name or a writer that fails to build
                self.writer_error = _line(exc)
                log.warning("kvprof: writer %s unavailable (%s): SGLang's own writes", self.writer_name,
                            self.writer_error)
        return self.writer

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

    def pool_info(self, pool: Any) -> dict[str, Any]:
        return self.pools.setdefault(id(pool), {})

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

    def sidecar(self) -> Sidecar:
        import msgspec

        from kvprof import __version__

        rank, tp_rank, tp_size = _ranks()
        with GRAPHS.lock:
            graphs, empty = list(GRAPHS.graphs), GRAPHS.empty
        return Sidecar(
            schema=SIDECAR_SCHEMA, kvprof_version=__version__, sglang_version=sglang_version(),
            pid=os.getpid(), rank=rank, tp_rank=tp_rank, tp_size=tp_size,
            hooked=list(self.hooked), writer=self.writer_name, writer_error=self.writer_error,
            pools=[msgspec.convert(p, SidecarPool) for p in list(self.pools.values())],
            paths=dict(self.paths), write_paths=dict(self.write_paths),
            fallbacks=dict(self.fallbacks), unattributed=dict(self.unattributed), device=self.device,
            graphs=graphs, graphs_without_writes=empty, graph_hook=GRAPHS.hook,
        )

    def write_sidecar(self) -> Path | None:
        """Write (or rewrite) this process's sidecar; a failure is logged, never raised."""
        if not self.pools:
            return None
        with self.lock:
            try:
                from kvprof.core.atomic import atomic_write_bytes
                from kvprof.core.rundir import RunDir

                doc = self.sidecar()
                path = sidecar_dir() / RunDir.sidecar_name(doc.tp_rank, doc.pid)
                atomic_write_bytes(path, encode_sidecar(doc))
                return path
            except Exception as exc:  # noqa: BLE001 - a sidecar must never take the server down
                log.warning("kvprof: cannot write the SGLang sidecar (%s)", _line(exc))
                return None


STATE = _State()


def _is_rope_writer(writer: Any) -> bool:
    """Whether ``writer`` implements the MHA layout's rope + store contract (not the store's)."""
    from kvprof.layouts import get_layout

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
    return Path(os.environ.get(ENV_DIR) or os.environ.get("SGLANG_TORCH_PROFILER_DIR") or "/tmp")


def describe_pool(pool: Any, hooked: str, variant: str) -> dict[str, Any]:
    """Shapes and dtypes of one pool, read defensively (attribute names vary by pool); its native
    path is set_kv_buffer's predicted one, or fused_into_rope where its first write was SGLang's rope."""
    from kvprof.dtypes import short_name

    def dt(x: Any) -> Any:
        try:
            return short_name(x)
        except (KeyError, ValueError, TypeError):
            return str(x) if x is not None else None

    out: dict[str, Any] = {"class": type(pool).__name__, "hooked": hooked, "variant": variant,
                           "native_path": ROPE_FUSED if hooked == ROPE_FUNCTION else native_path(pool)}
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
    try:
        import msgspec
        import torch

        from kvprof.devinfo import device_properties

        dev = torch.device(pool.device)
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        return msgspec.convert(device_properties(dev), SidecarDevice)
    except Exception as exc:  # noqa: BLE001 - a description only
        log.warning("kvprof: cannot describe the pool's device (%s)", _line(exc))
        return None


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
