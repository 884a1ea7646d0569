"""The writer contracts, in one module: what every write implementation of every layout is
held to, below the registry, the writers, the layouts and the pools.

A writer gets a pool's per-layer storage buffers and validated inputs and performs one
layer's write. It says up front what it can run (``unsupported_reason``) so capture can skip
it with a stated reason, and after each write it says which path actually ran, so a silent
fallback is never reported as fused. Four contracts, by layout (``WRITER_CONTRACTS``):

* ``KVWriter`` (MHA store): K and V rows into SGLang's MHA pool;
* ``RopeKVWriter`` (MHA rope): the rotary embedding of q and k plus the K/V store, as engines
  fuse it (SGLang's ``FusedSetKVBufferArg`` / ``apply_rope_inplace_with_kvcache``): q
  ``[T, Hq, D]`` and k ``[T, Hk, D]`` rotated in place, the rotated k stored into the K cache at
  ``loc`` and v ``[T, Hk, Dv]`` into the V cache -- one fused launch, or a rotary kernel
  followed by a store writer. ``cos_sin_cache`` is ``[max_position, rope_dim]`` float32,
  cosines in the first half and sines in the second; ``positions`` ``[T]`` int32/int64;
  ``is_neox`` True rotates the two halves of the first ``rope_dim`` dims (GPT-NeoX), False
  interleaved pairs (GPT-J); dims at and past ``rope_dim`` pass through unrotated;
* ``MLAWriter``: one latent row per token (SGLang's MLA cache), ``PagedWriter``: a
  block-addressed K/V pair (vLLM's paged cache); both are ``LayoutWriter``s, which differ
  from ``KVWriter`` only in what ``write`` takes.

Each contract checks its own calls (``ChecksItsCalls``), whoever calls its writers.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import torch

from kvprof.core.errors import UsageError

# The paths a write reports are part of the writers' contract; their one definition is the
# torch-free vocabulary, which the analysis reads too.
from kvprof.core.vocab import FALLBACK_PREFIX, FUSED, ROPE_FUSED, TWO_COPIES, TWO_STREAMS, is_fused_path  # noqa: F401
from kvprof.kvcache import signature
from kvprof.kvcache.dtypes import short_name
from kvprof.kvcache.validation import (
    buffer_pair_rows,
    check_apart,
    check_buffer_pair,
    check_buffers,
    check_disjoint,
    check_index_range,
    check_loc,
    check_rows,
    check_scale,
    check_write_inputs,
    is_fp8,
)


def convert_pair(
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    dtype: torch.dtype,
    k_scale: float | torch.Tensor | None,
    v_scale: float | torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference conversion, for writers that cannot convert inside their kernel."""
    from kvprof.kvcache.dtypes import convert_for_cache

    return convert_for_cache(cache_k, dtype, k_scale), convert_for_cache(cache_v, dtype, v_scale)


@dataclass
class WriterInfo:
    """What a writer is, for manifests and tables."""

    name: str
    description: str
    fused: bool  # one launch for K and V when its main path runs
    devices: tuple[str, ...]  # device types it can run on ("cpu", "cuda")
    extra: dict[str, str] = field(default_factory=dict)


class ChecksItsCalls:
    """What makes a writer refuse a call it cannot run right, whoever calls it.

    A writer's contract (``KVWriter``, ``RopeKVWriter``, ``MLAWriter``, ``PagedWriter``) says
    in one method, ``check_write``, what its ``write`` relies on (tensors, dtypes, shapes,
    devices, contiguity, no input sharing memory with what is written, slot ranges where
    reading them costs no sync, and the writer's own ``unsupported_reason``), and returns the
    call's arguments as the writer takes them (a strided ``loc`` copied contiguous). Every
    subclass's ``write`` -- kvprof's and any registered later -- runs behind it: defining
    ``write`` in a subclass makes ``write`` check and then call it, and keeps it, unchecked, as
    ``write_unchecked`` for a caller that ran the same checks already (the pools, on their hot
    path). A refused call raises a one-line ``ValueError`` before anything is written or
    rotated.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        impl = cls.__dict__.get("write")
        if impl is None or getattr(impl, "__isabstractmethod__", False) or getattr(impl, "_checks_call", False):
            return

        @functools.wraps(impl)
        def write(self: Any, *args: Any, **kwargs: Any) -> str:
            return impl(self, *self.checked_call(*args, **kwargs))  # type: ignore[no-any-return]

        write._checks_call = True  # type: ignore[attr-defined]
        cls.write = write  # type: ignore[attr-defined]
        cls.write_unchecked = impl  # type: ignore[method-assign]

    # True: this writer's check_write reads nothing of a call but what signature.CALL_KEY keys
    # (each tensor's class, dtype, device, shape, strides and address; every other argument's
    # type and value) and the values check_values reads, so checked_call may take a passed
    # call's result for an equal key. A writer whose own checks read more sets it False.
    checks_by_key: bool = True

    def check_write(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """The contract's checks (each contract defines them); the call's arguments, positional."""
        raise NotImplementedError

    def check_values(self, *args: Any) -> None:
        """The part of ``check_write`` that reads tensors' values (slots and positions in range,
        on a CPU, where reading them costs no device sync), over ``check_write``'s result; run
        again on every call ``checked_call`` takes from its memo."""

    def checked_call(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``check_write(*args)``, what ``write`` runs before the writer's own: where the C++
        helper is loaded (:mod:`kvprof.kvcache.signature`), a call whose key equals that of a
        call the checks passed takes that call's result rebuilt over its own arguments (the
        same tensors, or the same views of them) and runs only ``check_values``. The checks
        read nothing else of a call (``checks_by_key``), so they would pass it and return the
        same; a call they refuse is never kept, and a call whose result holds a copy (a strided
        ``loc`` made contiguous) is checked afresh each time. One C++ call and a dict lookup
        where the checks take 5-25 µs of Python (benchmarks/bench_writer_checks.py). The helper
        is loaded (built, the first time on a machine) at the first call on a CUDA device."""
        call_key = signature.CALL_KEY
        if call_key is None and args and signature.ready(args[0]):  # loaded at the first CUDA write
            call_key = signature.CALL_KEY
        if call_key is None or kwargs or not self.checks_by_key:
            return self.check_write(*args, **kwargs)
        key = call_key(*args)
        if key is None:
            return self.check_write(*args)
        memo: dict[bytes, Any] | None = self.__dict__.get("_passed_calls")
        if memo is None:
            memo = self.__dict__["_passed_calls"] = {}
        plan = memo.get(key)
        if plan is None:
            out = self.check_write(*args)
            plan = rebuild_plan(args, out)
            if plan is not None:
                signature.keep(memo, key, plan)
            return out
        steps, reads_values = plan
        out = args if steps is None else rebuild(args, steps)
        if reads_values:
            self.check_values(*out)
        return out

    def write_unchecked(self, *args: Any) -> str:
        """The writer's own ``write`` without its contract's checks (set per subclass)."""
        raise NotImplementedError(f"{type(self).__name__} defines no write")

    def check_supported(self, buf: torch.Tensor, dtype: torch.dtype, input_dtype: torch.dtype) -> None:
        """Refuse a call this writer says it cannot run (``unsupported_reason`` for ``buf``'s
        device); asked once per (device, cache dtype, input dtype) that it can run, so the
        common call costs one set lookup."""
        index = buf.get_device()  # an int, cheaper than a torch.device: -1 off CUDA
        key = (index if index >= 0 else buf.device.type, dtype, input_dtype)
        seen: set[Any] | None = self.__dict__.get("_supported_calls")
        if seen is not None and key in seen:
            return
        self._ask_supported(buf, dtype, input_dtype, key)

    def _ask_supported(self, buf: torch.Tensor, dtype: torch.dtype, input_dtype: torch.dtype, key: Any) -> None:
        seen: set[Any] | None = self.__dict__.get("_supported_calls")
        reason: str | None = self.unsupported_reason(buf.device, dtype, input_dtype)  # type: ignore[attr-defined]
        if reason:
            raise ValueError(f"{self.name} cannot take this call: {reason}")  # type: ignore[attr-defined]
        if seen is None:
            seen = self.__dict__["_supported_calls"] = set()
        seen.add(key)


_ARG, _VIEW, _CONST = 0, 1, 2


def rebuild_plan(args: tuple[Any, ...], out: tuple[Any, ...]) -> tuple[Any, bool] | None:
    """How a contract's checks made ``out`` from ``args``, to make it again for a call of the
    same key: (steps, or None where ``out`` is ``args`` itself; whether ``check_values`` reads
    values, a CPU tensor among them). Each step takes an argument as it is, a ``view`` of one
    (``[T, H * D]`` rows as ``[T, H, D]``) or a value the checks computed from the key's values
    (``bool(is_neox)``, a default). None where ``out`` holds a tensor made otherwise (a copy)."""
    steps: list[tuple[int, int, Any]] = []
    same = len(out) == len(args)
    for i, o in enumerate(out):
        a = args[i] if i < len(args) else None
        if o is a and i < len(args):
            steps.append((_ARG, i, None))
            continue
        same = False
        if isinstance(o, torch.Tensor):
            if a.__class__ is not torch.Tensor or o.__class__ is not torch.Tensor:
                return None
            try:
                view = a.view(o.shape)
            except RuntimeError:
                return None
            if view.data_ptr() != o.data_ptr() or view.stride() != o.stride():
                return None
            steps.append((_VIEW, i, tuple(o.shape)))
        else:
            steps.append((_CONST, i, o))
    reads_values = any(o.__class__ is torch.Tensor and o.device.type == "cpu" for o in out)
    return (None if same else tuple(steps)), reads_values


def rebuild(args: tuple[Any, ...], steps: tuple[tuple[int, int, Any], ...]) -> tuple[Any, ...]:
    """``out`` of :func:`rebuild_plan` for another call of the same key."""
    return tuple(args[i] if op == _ARG else args[i].view(v) if op == _VIEW else v for op, i, v in steps)


def checked_impl(writer: object) -> Callable[..., str]:
    """The write a caller that ran the contract's checks itself calls: ``write_unchecked``
    where the writer has one, else its ``write``."""
    unchecked = getattr(writer, "write_unchecked", None)
    if unchecked is not None and getattr(type(writer), "write_unchecked", None) is not ChecksItsCalls.write_unchecked:
        return unchecked  # type: ignore[no-any-return]
    return writer.write  # type: ignore[attr-defined,no-any-return]


class KVWriter(ChecksItsCalls, abc.ABC):
    """Base class for write implementations; subclass and register with ``@register``."""

    name: str = ""
    description: str = ""
    fused: bool = False
    devices: tuple[str, ...] = ("cpu", "cuda")
    # True: ``write`` refuses, before any kernel runs, every call that
    # ``kvprof.kvcache.validation.check_write_inputs`` refuses (compiled checks cost nanoseconds), and
    # takes what it copies (a strided ``loc``), so the pool skips its Python checks on the hot
    # path and runs them only to word an error.
    validates_inputs: bool = False
    # True: ``write`` changes the caller's ``cache_k``/``cache_v`` (SGLang's generic write divides
    # them by the scale in place). A caller that hands the same rows to several writers gives such
    # a writer its own copies (bench does); in a layer the rows are made again each step.
    modifies_inputs: bool = False
    # a substring of its kernel's name as traces show it (one kernel per write), where known: the
    # SGLang plugin records it with each write captured into a CUDA graph, so a trace's replayed
    # kernels can be tied to those writes (kvprof.core.sidecar.GraphWrite)
    kernel_name: str | None = None

    def info(self) -> WriterInfo:
        return WriterInfo(self.name, self.description, self.fused, self.devices)

    def unsupported_reason(
        self, device: torch.device, dtype: torch.dtype, input_dtype: torch.dtype | None = None
    ) -> str | None:
        """None when this writer can run here, else why not (one line)."""
        if device.type not in self.devices:
            return f"{self.name} runs on {'/'.join(self.devices)}, not {device.type}"
        return None

    def prepare(self, device: torch.device) -> None:
        """Set up per-device state (streams, compiled code) before any write or graph capture."""

    def launches_pdl(self, device: torch.device) -> bool | None:
        """Whether the write's first kernel launches with programmatic dependent launch (PDL)
        on ``device``: it may then begin before the kernel before it on its stream ends, which
        the analysis reports as PDL overlap (a writer that says False and still begins early
        is a trace anomaly). None: the writer does not say (a library's kernel that decides
        for itself)."""
        return None

    @abc.abstractmethod
    def write(
        self,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        dtype: torch.dtype,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> str:
        """Write one layer's K and V rows at ``loc``; return the path that ran.

        ``k_buf``/``v_buf`` are the pool's storage views (uint8 for fp8 caches) of shape
        ``[size + page_size, heads, dim]``; ``loc`` is 1-D and contiguous; ``cache_k``/``cache_v``
        are the caller's rows, ``[tokens, heads, dim]``, in their own dtype; all checked by
        :meth:`check_write` before this runs, whoever calls it (``ChecksItsCalls``). ``dtype``
        is the cache's logical dtype. Plain arguments, no request object: this is the hot path
        whose host cost kvprof measures.
        """

    def check_write(  # type: ignore[override]
        self,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        dtype: torch.dtype,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> tuple[Any, ...]:
        """The store contract's checks: the buffers (``check_buffers``), the rows and slots as
        the pool checks them (:func:`kvprof.kvcache.validation.check_write_inputs`: a strided ``loc``
        copied, rows viewed as ``[tokens, heads, dim]``, no input sharing memory with a buffer),
        the scales, the writer's ``unsupported_reason`` and, on a CPU, the slots' range."""
        check_buffer_pair(dtype, k_buf, v_buf)
        shape = k_buf.shape
        index = k_buf.get_device()
        loc, cache_k, cache_v = check_write_inputs(loc, cache_k, cache_v, shape[1], shape[2], v_buf.shape[2],
                                                   k_buf.device, index, k_buf, v_buf)
        if k_scale is not None or v_scale is not None:
            check_scale("k_scale", k_scale, k_buf.device)
            check_scale("v_scale", v_scale, k_buf.device)
            if isinstance(k_scale, torch.Tensor) or isinstance(v_scale, torch.Tensor):
                check_apart((k_buf, v_buf), k_scale=k_scale, v_scale=v_scale)  # type: ignore[arg-type]
        self.check_supported(k_buf, dtype, cache_k.dtype)
        out = k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale, v_scale
        self.check_values(*out)
        return out

    def check_values(self, k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor,  # type: ignore[override]
                     *rest: Any) -> None:
        """Slots inside the buffers, read where that costs no device sync (off CUDA)."""
        check_index_range("loc", loc, 0, k_buf.shape[0])


ROPE_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


class RopeKVWriter(ChecksItsCalls, abc.ABC):
    """One layer's rotary embedding of q and k plus the K/V store, as engines run it."""

    name: str = ""
    description: str = ""
    fused: bool = False  # the store is one launch for K and V (as KVWriter.fused)
    rope_fused: bool = False  # rope and the store in ONE launch
    devices: tuple[str, ...] = ("cpu", "cuda")
    kernel_name: str | None = None  # as KVWriter.kernel_name

    def info(self) -> WriterInfo:
        """``extra["rope"]``: "fused" (one launch) or "separate" (a rotary kernel, then a store)."""
        return WriterInfo(self.name, self.description, self.fused, self.devices,
                          {"rope": "fused" if self.rope_fused else "separate"})

    def unsupported_reason(
        self, device: torch.device, dtype: torch.dtype, input_dtype: torch.dtype | None = None
    ) -> str | None:
        """None when this writer can run here, else why not (one line)."""
        if device.type not in self.devices:
            return f"{self.name} runs on {'/'.join(self.devices)}, not {device.type}"
        if input_dtype is not None and input_dtype not in ROPE_INPUTS:
            return f"{self.name} rotates bf16, fp16 or fp32 q/k, not {input_dtype}"
        return None

    def prepare(self, device: torch.device) -> None:
        """Set up per-device state (streams, compiled code) before any write or graph capture."""

    def launches_pdl(self, device: torch.device) -> bool | None:
        """As ``KVWriter.launches_pdl``: PDL on the write's first kernel; None: not said."""
        return None

    @abc.abstractmethod
    def write(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        is_neox: bool,
        dtype: torch.dtype,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> str:
        """Rotate q and k in place, store k (rotated) and v at loc; return the path that ran.

        ``k_buf``/``v_buf`` are the pool's storage views ``[size + page_size, Hk, D]`` (uint8
        for fp8 caches, like ``KVWriter``); ``dtype`` is the cache's logical dtype; fp8 caches
        quantise the rotated k (rounded to k's dtype) and v with the per-tensor scales, as
        :func:`kvprof.kvcache.dtypes.convert_for_cache` does; ``loc`` and ``positions`` are 1-D and
        contiguous. Every input is checked by :meth:`check_write` before this runs, whoever
        calls it (``ChecksItsCalls``).
        """

    def check_write(  # type: ignore[override]
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        is_neox: bool,
        dtype: torch.dtype,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> tuple[Any, ...]:
        """The rope contract's checks (:func:`check_rope_call`) and the writer's own
        ``unsupported_reason``, all before q or k is rotated."""
        q, k, v, loc, positions = check_rope_call(q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, dtype,
                                                  k_scale, v_scale)
        self.check_supported(k_buf, dtype, k.dtype)
        return q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, bool(is_neox), dtype, k_scale, v_scale

    def check_values(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,  # type: ignore[override]
                     k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor, *rest: Any) -> None:
        """Slots inside the buffers and positions inside the table (:func:`check_rope_values`)."""
        check_rope_values(k_buf, loc, positions, cos_sin_cache)


def check_rope_call(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
    loc: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype,
    k_scale: float | torch.Tensor | None = None, v_scale: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`check_rope_inputs`, with the cache buffers checked against the cache's
    ``dtype`` (contiguous, its storage dtype, one device, apart), the scales, and -- where
    reading them costs no device sync, on a CPU -- slots inside the buffers and positions
    inside the cos/sin table, whatever a pool's ``check_slots`` says: a position past the
    table would read memory beyond it. Returns q, k, v (as ``check_rope_inputs``) and loc and
    positions contiguous (copied where strided, as the store contract's ``loc``), so a writer
    may read them as consecutive values."""
    fast = _rope_call_fast(q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, dtype, k_scale, v_scale)
    if fast is not None:
        check_rope_values(k_buf, loc, positions, cos_sin_cache)
        return fast
    check_buffer_pair(dtype, k_buf, v_buf)
    device = k_buf.device
    q, k, v = check_rope_inputs(q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache,
                                k_scale=k_scale, v_scale=v_scale)
    check_scale("k_scale", k_scale, device)
    check_scale("v_scale", v_scale, device)
    check_rope_values(k_buf, loc, positions, cos_sin_cache)
    if not loc.is_contiguous():
        loc = loc.contiguous()
    if not positions.is_contiguous():
        positions = positions.contiguous()
    return q, k, v, loc, positions


def check_rope_values(k_buf: torch.Tensor, loc: torch.Tensor, positions: torch.Tensor,
                      cos_sin_cache: torch.Tensor) -> None:
    """Slots inside the buffers and positions inside the cos/sin table, read where that costs
    no device sync (off CUDA): a position past the table would read memory beyond it."""
    check_index_range("loc", loc, 0, k_buf.shape[0])
    check_index_range("positions", positions, 0, cos_sin_cache.shape[0], "position")


_INDEX_DTYPES = (torch.int32, torch.int64)
_INF = float("inf")


def _rope_call_fast(
    q: Any, k: Any, v: Any, k_buf: Any, v_buf: Any, loc: Any, positions: Any, cos_sin_cache: Any,
    dtype: torch.dtype, k_scale: object, v_scale: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """:func:`check_rope_call`'s common call written out, about a third of its attribute reads
    (a rope write through a pool runs it on every eager call): plain tensors on one device,
    [T, H, D] or [T, H * D] q/k/v with unit stride in D, contiguous int32/int64 loc and
    positions, scales None or positive floats. Returns what check_rope_call returns; None for
    anything else, whose checks (or refusal) the full path then runs. It refuses only through
    :func:`_heads` and :func:`check_disjoint`, which the full path reaches with the same
    tensors after checks this call has passed, and so words the same way."""
    t_cls = torch.Tensor
    if (q.__class__ is not t_cls or k.__class__ is not t_cls or v.__class__ is not t_cls
            or loc.__class__ is not t_cls or positions.__class__ is not t_cls
            or cos_sin_cache.__class__ is not t_cls or not _plain_scales(k_scale, v_scale)):
        return None
    rows = buffer_pair_rows(dtype, k_buf, v_buf)
    if rows is None:
        return None
    heads, dim, v_dim = rows
    device = k_buf.device
    if (q.device != device or k.device != device or v.device != device or loc.device != device
            or positions.device != device or cos_sin_cache.device != device):
        return None
    if loc.dtype not in _INDEX_DTYPES or positions.dtype not in _INDEX_DTYPES:
        return None
    l_shape = loc.shape
    if len(l_shape) != 1 or positions.shape != l_shape or not loc.is_contiguous() or not positions.is_contiguous():
        return None
    tokens = l_shape[0]
    if not (tokens and heads and dim and v_dim):
        return None
    if q.dim() == 2 or k.dim() == 2 or v.dim() == 2:  # [T, H * D] as [T, H, D], as the full checks take it
        q, k, v = _heads(q, "q", tokens, dim), _heads(k, "k", tokens, dim), _heads(v, "v", tokens, v_dim)
    q_shape, k_dtype = q.shape, k.dtype
    if (len(q_shape) != 3 or q_shape[0] != tokens or q_shape[2] != dim or not q_shape[1]
            or k.shape != (tokens, heads, dim) or v.shape != (tokens, heads, v_dim)
            or k_dtype not in ROPE_INPUTS or q.dtype not in ROPE_INPUTS or v.dtype is not k_dtype
            or q.stride(2) != 1 or k.stride(2) != 1):
        return None
    if cos_sin_cache.dtype is not torch.float32 or cos_sin_cache.dim() != 2 or cos_sin_cache.stride(1) != 1:
        return None
    rope_dim = cos_sin_cache.shape[1]
    if rope_dim < 2 or rope_dim % 2 or rope_dim > dim:
        return None
    check_disjoint({"q": q, "k": k, "k_buf": k_buf, "v_buf": v_buf},
                   {"v": v, "loc": loc, "positions": positions, "cos_sin_cache": cos_sin_cache})
    return q, k, v, loc, positions


def _plain_scales(*scales: object) -> bool:
    """Every scale None or a positive finite float (what the common call passes)."""
    return all(s is None or (s.__class__ is float and 0.0 < s < _INF) for s in scales)  # type: ignore[operator]


def check_rope_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
    loc: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
    k_scale: object = None, v_scale: object = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raise ``ValueError`` (one line) for a call no rope writer may run, before anything is
    written; return q, k and v as ``[tokens, heads, dim]`` views (engines also pass
    ``[tokens, heads * dim]``). q/k are rotated in place, so they are never copied and must
    have unit stride in their last dim; v, loc and positions may have any strides. Slot and
    position values are the caller's (reading them would sync the device)."""
    _check_tensors_on(k_buf.device, q=q, k=k, v=v, loc=loc, positions=positions, cos_sin_cache=cos_sin_cache)
    heads, dim = k_buf.shape[1], k_buf.shape[2]
    v_dim = v_buf.shape[2]
    for name, t in (("loc", loc), ("positions", positions)):
        if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int32 or int64 tensor, got {tuple(t.shape)} {t.dtype}")
    tokens = loc.shape[0]
    q = _heads(q, "q", tokens, dim)
    k = _heads(k, "k", tokens, dim)
    v = _heads(v, "v", tokens, v_dim)
    if positions.shape[0] != tokens:
        raise ValueError(f"positions has {positions.shape[0]} tokens but loc has {tokens}")
    if k.dtype not in ROPE_INPUTS or q.dtype not in ROPE_INPUTS:
        raise ValueError(f"q and k must be bf16, fp16 or fp32, got {q.dtype} and {k.dtype}")
    if v.dtype != k.dtype:
        raise ValueError(f"v is {v.dtype} but k is {k.dtype}")
    for name, t, h, d in (("k", k, heads, dim), ("v", v, heads, v_dim)):
        if tuple(t.shape) != (tokens, h, d):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({tokens}, {h}, {d})")
    if q.dim() != 3 or q.shape[0] != tokens or q.shape[2] != dim:
        raise ValueError(f"q has shape {tuple(q.shape)}, expected ({tokens}, heads, {dim})")
    for name, t in (("q", q), ("k", k)):
        if t.numel() and t.stride(2) != 1:
            raise ValueError(f"{name} is rotated in place and needs unit stride in its last dim, got {t.stride()}")
    _check_cos_sin_cache(cos_sin_cache, dim)
    # q and k are rotated in place and the buffers written: none of them may share a byte with
    # any tensor of the call (q and k one tensor, v a view of k, q a view of the cos/sin
    # table, an input inside a buffer...); v, loc, positions, the table and the scales are only read
    check_disjoint({"q": q, "k": k, "k_buf": k_buf, "v_buf": v_buf},
                   {"v": v, "loc": loc, "positions": positions, "cos_sin_cache": cos_sin_cache,
                    "k_scale": k_scale if isinstance(k_scale, torch.Tensor) else None,
                    "v_scale": v_scale if isinstance(v_scale, torch.Tensor) else None})
    return q, k, v


def _check_tensors_on(device: torch.device, **inputs: object) -> None:
    """Every input a tensor on the cache's device; the first that is not, named."""
    for name, t in inputs.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, the cache is on {device}")


def rope_dim_reason(rope_dim: int, head_dim: int) -> str | None:
    """Why a rotary of ``rope_dim`` dims cannot rotate heads of ``head_dim`` (it turns pairs of
    dims: an even count, at least one pair, at most the head), else None."""
    if rope_dim < 2 or rope_dim % 2 or rope_dim > head_dim:
        return f"rope_dim {rope_dim} must be even and in [2, head_dim={head_dim}]"
    return None


def _check_cos_sin_cache(cos_sin_cache: torch.Tensor, dim: int) -> None:
    """``[positions, rope_dim]`` float32 with unit stride in rope_dim, rope_dim even and at most
    ``dim`` (the rotated part of each head)."""
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.dim() != 2:
        raise ValueError(f"cos_sin_cache must be a 2-D float32 tensor, got {tuple(cos_sin_cache.shape)} "
                         f"{cos_sin_cache.dtype}")
    reason = rope_dim_reason(cos_sin_cache.shape[1], dim)
    if reason:
        raise ValueError(f"cos_sin_cache's {reason}")
    if cos_sin_cache.stride(1) != 1:
        raise ValueError(f"cos_sin_cache needs unit stride in its last dim, got {cos_sin_cache.stride()}")


def _heads(t: torch.Tensor, name: str, tokens: int, dim: int) -> torch.Tensor:
    """``[tokens, heads * dim]`` as a ``[tokens, heads, dim]`` view (a view, never a copy:
    q and k are written in place); anything else as it is, for the shape checks to word."""
    if t.dim() == 2 and t.shape[0] == tokens and dim and t.shape[1] % dim == 0:
        try:
            return t.view(tokens, t.shape[1] // dim, dim)
        except RuntimeError:
            raise ValueError(f"{name} of shape {tuple(t.shape)} and strides {t.stride()} has no "
                             f"[{tokens}, heads, {dim}] view") from None
    return t




class LayoutWriter(ChecksItsCalls, abc.ABC):  # noqa: B024 (a base with hooks; each layout adds its own abstract write)
    """Base of the MLA and paged writers (see ``MLAWriter`` / ``PagedWriter`` below for ``write``
    and ``check_write``: each checks its own calls, ``ChecksItsCalls``)."""

    name: str = ""
    layout: str = ""
    description: str = ""
    fused: bool = False  # one launch writes the whole row (MLA) or K and V (paged)
    devices: tuple[str, ...] = ("cpu", "cuda")

    def info(self) -> WriterInfo:
        """What the writer is, for manifests and tables (the MHA writers' record)."""
        return WriterInfo(self.name, self.description, self.fused, self.devices, {"layout": self.layout})

    def unsupported_reason(self, device: torch.device, dtype: torch.dtype,
                           input_dtype: torch.dtype | None = None) -> str | None:
        """None when this writer can run here, else why not (one line)."""
        if device.type not in self.devices:
            return f"{self.name} runs on {'/'.join(self.devices)}, not {device.type}"
        return None

    def prepare(self, device: torch.device) -> None:
        """Per-device set-up before any write or graph capture."""

    def launches_pdl(self, device: torch.device) -> bool | None:
        """As ``KVWriter.launches_pdl``: PDL on the write's first kernel; None: not said."""
        return None



# SGLang's set_mla_kv_buffer never writes this slot (set_mla_kv_buffer_triton's default)
RESERVED_SKIP_SLOT = 0
NO_SKIP = -1


class MLAWriter(LayoutWriter):
    """Writes one layer's latent rows: ``nope`` into columns ``[0, R)``, ``rope`` into ``[R, D)``."""

    layout = "mla"

    @abc.abstractmethod
    def write(self, kv_buf: torch.Tensor, loc: torch.Tensor, nope: torch.Tensor, rope: torch.Tensor,
              dtype: torch.dtype, skip: int) -> str:
        """``kv_buf``: the layer's storage ``[rows, 1, D]`` (uint8 for fp8); ``nope``/``rope``:
        validated ``[tokens, 1, R]`` / ``[tokens, 1, D - R]`` in the caller's dtype (rows
        contiguous, any token stride); ``skip``: a slot never written (-1: none). Returns the
        path that ran. Checked by :meth:`check_write` before this runs, whoever calls it."""

    def check_write(self, kv_buf: torch.Tensor, loc: torch.Tensor, nope: torch.Tensor,  # type: ignore[override]
                    rope: torch.Tensor, dtype: torch.dtype, skip: int) -> tuple[Any, ...]:
        """The MLA contract's checks: ``kv_buf`` a contiguous ``[rows, 1, D]`` buffer in the
        cache's storage dtype; ``loc`` 1-D int32/int64 slots (copied contiguous where strided);
        ``nope`` ``[tokens, 1, R]`` and ``rope`` ``[tokens, 1, D - R]`` (or flat) floats of one
        dtype on the buffer's device; no input sharing memory with the buffer; ``skip`` -1 or a
        slot; the writer's ``unsupported_reason``; on a CPU, slots inside the buffer."""
        device = check_buffers(dtype, 3, kv_buf=kv_buf)
        if kv_buf.shape[1] != 1:
            raise ValueError(f"kv_buf must be [rows, 1, D] (one latent row per slot), got {tuple(kv_buf.shape)}")
        width = kv_buf.shape[2]
        loc = check_loc(loc, device)
        tokens = loc.shape[0]
        if not isinstance(nope, torch.Tensor) or nope.dim() not in (2, 3):
            raise ValueError(f"nope must be a [tokens, 1, R] tensor, got {getattr(nope, 'shape', type(nope).__name__)}")
        r = nope.shape[-1]
        if not 0 < r < width:
            raise ValueError(f"nope has {r} columns; the latent row has {width}, and rope needs some of them")
        nope = check_rows(nope, "nope", tokens, 1, r, device)
        rope = check_rows(rope, "rope", tokens, 1, width - r, device)
        if nope.dtype != rope.dtype:
            raise ValueError(f"nope is {nope.dtype} but rope is {rope.dtype}")
        if isinstance(skip, bool) or not isinstance(skip, int) or skip < NO_SKIP:
            raise ValueError(f"skip must be -1 (none) or a slot, got {skip!r}")
        check_apart((kv_buf,), loc=loc, nope=nope, rope=rope)
        self.check_supported(kv_buf, dtype, nope.dtype)
        out = kv_buf, loc, nope, rope, dtype, skip
        self.check_values(*out)
        return out

    def check_values(self, kv_buf: torch.Tensor, loc: torch.Tensor, *rest: Any) -> None:  # type: ignore[override]
        """Slots inside the buffer, read where that costs no device sync (off CUDA)."""
        check_index_range("loc", loc, 0, kv_buf.shape[0])



PAD_SLOT = -1
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


class PagedWriter(LayoutWriter):
    """Writes one layer's K and V rows at ``slot_mapping`` (-1: skip) into a paged cache."""

    layout = "paged"

    @abc.abstractmethod
    def write(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, dtype: torch.dtype, k_scale: torch.Tensor | None,
              v_scale: torch.Tensor | None) -> str:
        """``k_cache``/``v_cache``: storage ``[num_blocks, block_size, heads, dim]`` (uint8 for
        fp8); ``key``/``value``: validated ``[>= tokens, heads, dim]`` (rows contiguous, any
        token stride); ``k_scale``/``v_scale``: one-element fp32 tensors on the device (fp8
        caches only, else None). Returns the path that ran. Checked by :meth:`check_write`
        before this runs, whoever calls it."""

    def check_write(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,  # type: ignore[override]
                    key: torch.Tensor, value: torch.Tensor, dtype: torch.dtype, k_scale: torch.Tensor | None,
                    v_scale: torch.Tensor | None) -> tuple[Any, ...]:
        """The paged contract's checks: the caches contiguous ``[blocks, block_size, heads,
        dim]`` of one shape in the cache's storage dtype; ``slots`` 1-D int32/int64 (copied
        contiguous where strided); ``key``/``value`` ``[>= tokens, heads, dim]`` floats of one
        dtype, the cache's own (an fp8 cache: fp32/bf16/fp16); an fp8 cache's scales
        one-element fp32 tensors on the device (else None or such a tensor); no input sharing
        memory with a cache; the writer's ``unsupported_reason``; on a CPU, slots in ``[-1,
        slots)``."""
        device = check_buffers(dtype, 4, k_cache=k_cache, v_cache=v_cache)
        if k_cache.shape != v_cache.shape:
            raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
        _, _, heads, dim = k_cache.shape
        slots = check_loc(slots, device, "slot_mapping")
        tokens = slots.shape[0]
        key = check_rows(key, "key", tokens, heads, dim, device, at_least=True)
        value = check_rows(value, "value", tokens, heads, dim, device, at_least=True)
        if key.dtype != value.dtype:
            raise ValueError(f"key is {key.dtype} but value is {value.dtype}")
        fp8 = is_fp8(dtype)
        if fp8 and (is_fp8(key.dtype) or key.dtype == torch.float64):
            raise ValueError(f"an fp8 cache takes fp32/bf16/fp16 inputs, got {key.dtype}")
        if not fp8 and key.dtype != dtype:
            raise ValueError(f"a {short_name(dtype)} cache stores {short_name(dtype)} inputs as they are, "
                             f"got {key.dtype} (vLLM's kv_cache_dtype 'auto')")
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is None and not fp8:
                continue
            if (not isinstance(scale, torch.Tensor) or scale.numel() != 1 or scale.dtype != torch.float32
                    or scale.device != device):
                got = (f"{tuple(scale.shape)} {scale.dtype} on {scale.device}" if isinstance(scale, torch.Tensor)
                       else type(scale).__name__)
                raise ValueError(f"{name} must be a one-element float32 tensor on {device}"
                                 f"{' (an fp8 cache divides by it)' if fp8 else ' or None'}, got {got}")
        check_apart((k_cache, v_cache), slot_mapping=slots, key=key, value=value, k_scale=k_scale, v_scale=v_scale)
        self.check_supported(k_cache, dtype, key.dtype)
        out = k_cache, v_cache, slots, key, value, dtype, k_scale, v_scale
        self.check_values(*out)
        return out

    def check_values(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,  # type: ignore[override]
                     *rest: Any) -> None:
        """Slots in ``[-1, slots)``, read where that costs no device sync (off CUDA)."""
        check_index_range("slot_mapping", slots, PAD_SLOT, k_cache.shape[0] * k_cache.shape[1])




class Writer(Protocol):
    """What every writer offers beside its contract's ``write`` (``KVWriter``, ``RopeKVWriter``,
    ``MLAWriter``, ``PagedWriter`` and any further contract a layout accepts)."""

    name: str
    description: str
    fused: bool
    devices: tuple[str, ...]

    def info(self) -> WriterInfo: ...

    def unsupported_reason(self, device: torch.device, dtype: torch.dtype,
                           input_dtype: torch.dtype | None = None) -> str | None: ...

    def prepare(self, device: torch.device) -> None: ...

    def launches_pdl(self, device: torch.device) -> bool | None: ...


class ContractTable:
    """Layout -> contract name -> the base class a writer of that contract is an instance of.

    The registry checks a built writer against its layout's bases here, and a layout reads its
    contracts from here; an instance, so a test can build its own (``WRITER_CONTRACTS`` is
    kvprof's)."""

    def __init__(self, contracts: Mapping[str, Mapping[str, type]]) -> None:
        self._contracts: dict[str, dict[str, type]] = {layout: dict(c) for layout, c in contracts.items()}

    @property
    def layouts(self) -> tuple[str, ...]:
        return tuple(self._contracts)

    def of(self, layout: str) -> Mapping[str, type]:
        """Contract name -> base class, for ``layout``."""
        return MappingProxyType(self._contracts[check_layout(layout)])

    def bases(self, layout: str) -> tuple[type, ...]:
        return tuple(self.of(layout).values())

    def add(self, layout: str, contract: str, base: type) -> None:
        """Accept writers of another contract within ``layout`` (another ``write`` signature
        over the same pool, e.g. a rotary embedding fused with the store)."""
        known = self._contracts[check_layout(layout)].get(contract)
        if known is not None and known is not base:
            raise ValueError(f"the {layout} layout's {contract!r} contract is {known.__name__} already")
        self._contracts[layout][contract] = base

    def contract_of(self, layout: str, writer: object) -> str | None:
        """The contract ``writer`` implements in ``layout``, None if none."""
        return next((c for c, base in self.of(layout).items() if isinstance(writer, base)), None)

    def copy(self) -> ContractTable:
        return ContractTable(self._contracts)


# the layouts, in table order (their descriptions: kvprof.kvcache.layouts)
LAYOUTS = ("mha", "mla", "paged")


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise UsageError(f"unknown layout {layout!r}; choose from {', '.join(LAYOUTS)}")
    return layout


WRITER_CONTRACTS = ContractTable({
    "mha": {"store": KVWriter, "rope": RopeKVWriter},
    "mla": {"store": MLAWriter},
    "paged": {"store": PagedWriter},
})
