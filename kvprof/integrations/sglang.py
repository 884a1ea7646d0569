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

Every process that writes leaves a sidecar ``kvprof-sglang.TP-<rank>.pid-<pid>.json`` in
``KVPROF_SGLANG_DIR`` (default: ``SGLANG_TORCH_PROFILER_DIR``, else ``/tmp`` as SGLang's
profiler): rank, TP size, pool class and shapes, dtype, the writer and how many calls took
which path, SGLang's version. ``kvprof analyze`` reads it next to SGLang's traces.
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import threading
from importlib import metadata
from pathlib import Path
from typing import Any

ENV_ON = "KVPROF_SGLANG"
ENV_WRITER = "KVPROF_SGLANG_WRITER"
ENV_DIR = "KVPROF_SGLANG_DIR"
SIDECAR_SCHEMA = "kvprof.sglang_sidecar/1"
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
    state.hooked = hooked
    if hooked:
        log.info("kvprof: KV-write ranges on %s%s", ", ".join(hooked),
                 f"; writer {state.writer_name}" if state.writer_name else "")
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

    import nvtx
    import torch

    from kvprof.instrument import variant_color
    from kvprof.core.vocab import NVTX_DOMAIN, WRITE_RANGE_FORMAT

    cls = getattr(importlib.import_module(MEMORY_POOL), cls_name)
    try:
        where = _Args(cls.__dict__[method])
    except (TypeError, ValueError) as exc:
        log.warning("kvprof: not hooking %s.%s: cannot read its signature (%s)", cls_name, method, _line(exc))
        return None
    domain = nvtx.get_domain(NVTX_DOMAIN)
    profiler_enabled = torch._C._autograd._profiler_enabled
    record_function = torch.profiler.record_function
    names: dict[tuple[str, int], str] = {}
    attrs: dict[tuple[str, int, int], Any] = {}
    local = _LOCAL
    state = STATE
    routable = (cls_name, method) == ROUTABLE
    layer_pos, loc_pos, loc_name, override_pos = where.layer, where.loc, where.loc_name, where.override

    def range_of(name_variant: str, layer_id: int, tokens: int) -> tuple[str, Any]:
        key = (name_variant, layer_id)
        name = names.get(key)
        if name is None:
            name = names[key] = WRITE_RANGE_FORMAT.format(variant=name_variant, layer=layer_id)
        akey = (name_variant, layer_id, tokens)
        attr = attrs.get(akey)
        if attr is None:
            attr = attrs[akey] = domain.get_event_attributes(
                message=name, color=variant_color(name_variant), category=name_variant, payload=tokens)
        return name, attr

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
        call: tuple[Any, ...] = ()
        route = state.route_for(pool) if routable and state.writer_name else None
        if route is not None:
            prepared = route.prepare(pool, args, kwargs)
            if isinstance(prepared, str):
                state.fallback(prepared)
                route = None
            else:
                call = prepared
        name, attr = range_of(route.writer.name if route else variant, layer_id, tokens)
        state.seen(pool, cls_name, method, variant)
        local.depth = 1
        domain.push_range(attr)
        try:
            if profiler_enabled():
                with record_function(name):
                    return route.write(pool, call) if route else _native(original, args, kwargs, state, variant)
            return route.write(pool, call) if route else _native(original, args, kwargs, state, variant)
        finally:
            domain.pop_range()
            local.depth = 0

    hook.__name__ = f"kvprof_{cls_name}_{method}"
    return hook


def _native(original: Any, args: tuple[Any, ...], kwargs: dict[str, Any], state: _State, variant: str) -> Any:
    state.count(f"sglang:{variant}")
    return original(*args, **kwargs)


_LOCAL = threading.local()


class _Route:
    """A pool's writes through a kvprof writer, with SGLang's checks kept."""

    KNOWN = ("layer", "loc_info", "cache_k", "cache_v", "k_scale", "v_scale", "layer_id_override", "dcp_kv_mask")

    def __init__(self, writer: Any, pool: Any, mod: Any, state: _State) -> None:
        from kvprof.validation import check_write_inputs

        self.writer = writer
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
        path = self.writer.write(pool.k_buffer[idx], pool.v_buffer[idx], loc, k, v, pool.dtype, k_scale, v_scale)
        self.state.count(f"writer:{self.writer.name}:{path}")

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


class _State:
    """What this process did, for the sidecar; the writer and each pool's route."""

    def __init__(self) -> None:
        self.writer_name: str | None = None
        self.writer: Any = None
        self.writer_error: str | None = None
        self.hooked: list[str] = []
        self.pools: dict[int, dict[str, Any]] = {}
        self.routes: dict[int, _Route | None] = {}
        self.paths: dict[str, int] = {}
        self.fallbacks: dict[str, int] = {}
        self.lock = threading.Lock()

    def count(self, path: str) -> None:
        self.paths[path] = self.paths.get(path, 0) + 1

    def fallback(self, reason: str) -> None:
        n = self.fallbacks.get(reason, 0)
        if not n:
            log.warning("kvprof: %s: SGLang's own write for %s", self.writer_name, reason)
        self.fallbacks[reason] = n + 1
        self.count("sglang:fallback")

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

    def _build_route(self, pool: Any) -> tuple[_Route | None, str | None]:
        import importlib

        import torch

        mod = importlib.import_module(MEMORY_POOL)
        writer = self._writer()
        if writer is None:
            return None, f"writer {self.writer_name} unavailable ({self.writer_error})"
        base = mod.MHATokenToKVPool
        if getattr(pool, "is_quantized_kv_cache", False):
            return None, "quantized KV cache (SGLang's quant method writes it)"
        if getattr(pool, "use_hnd", False) or getattr(pool, "kv_cache_layout", "nhd") != "nhd":
            return None, f"layout {getattr(pool, 'kv_cache_layout', '?')} (kvprof writes NHD rows)"
        if getattr(type(pool), "_store_kv_layer", None) is not getattr(base, "_store_kv_layer", None):
            return None, f"{type(pool).__name__} writes its own layout (_store_kv_layer)"
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
        writer.prepare(dev)
        return _Route(writer, pool, mod, self), None

    def pool_info(self, pool: Any) -> dict[str, Any]:
        return self.pools.setdefault(id(pool), {})

    def seen(self, pool: Any, cls_name: str, method: str, variant: str) -> None:
        info = self.pools.get(id(pool))
        if info is not None and info.get("class"):
            return
        info = self.pool_info(pool)
        info.update(describe_pool(pool, cls_name, method, variant))
        self.write_sidecar()

    def sidecar(self) -> dict[str, Any]:
        from kvprof import __version__

        rank, tp_rank, tp_size = _ranks()
        return {
            "schema": SIDECAR_SCHEMA, "kvprof_version": __version__, "sglang_version": sglang_version(),
            "pid": os.getpid(), "rank": rank, "tp_rank": tp_rank, "tp_size": tp_size,
            "hooked": self.hooked, "writer": self.writer_name, "writer_error": self.writer_error,
            "pools": list(self.pools.values()), "paths": dict(self.paths), "fallbacks": dict(self.fallbacks),
        }

    def write_sidecar(self) -> Path | None:
        """Write (or rewrite) this process's sidecar; a failure is logged, never raised."""
        if not self.pools:
            return None
        with self.lock:
            try:
                import orjson

                from kvprof.core.atomic import atomic_write_bytes
                from kvprof.core.rundir import RunDir

                doc = self.sidecar()
                path = sidecar_dir() / RunDir.sidecar_name(doc["tp_rank"], doc["pid"])
                atomic_write_bytes(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2))
                return path
            except Exception as exc:  # noqa: BLE001 - a sidecar must never take the server down
                log.warning("kvprof: cannot write the SGLang sidecar (%s)", _line(exc))
                return None


STATE = _State()


def sidecar_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or os.environ.get("SGLANG_TORCH_PROFILER_DIR") or "/tmp")


def describe_pool(pool: Any, cls_name: str, method: str, variant: str) -> dict[str, Any]:
    """Shapes and dtypes of one pool, read defensively (attribute names vary by pool)."""
    from kvprof.dtypes import short_name

    def dt(x: Any) -> Any:
        try:
            return short_name(x)
        except (KeyError, ValueError, TypeError):
            return str(x) if x is not None else None

    out: dict[str, Any] = {"class": type(pool).__name__, "hooked": f"{cls_name}.{method}", "variant": variant,
                           "native_path": native_path(pool)}
    for key in ("size", "page_size", "head_num", "head_dim", "v_head_dim", "layer_num", "start_layer",
                "kv_lora_rank", "qk_rope_head_dim", "kv_cache_layout"):
        value = getattr(pool, key, None)
        if isinstance(value, (int, str)):
            out[key] = value
    out["dtype"] = dt(getattr(pool, "dtype", None))
    out["store_dtype"] = dt(getattr(pool, "store_dtype", None))
    out["device"] = str(getattr(pool, "device", None))
    out["quantized"] = bool(getattr(pool, "is_quantized_kv_cache", False))
    return out


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
            return "store_cache"
        if getattr(pool, "alt_stream", None) is not None:
            return "index_put (two streams under graph capture)"
        return "index_put"
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
