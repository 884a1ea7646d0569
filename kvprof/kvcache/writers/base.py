"""The contract between the pool and a write implementation.

A writer gets the pool's per-layer storage buffers and validated inputs and performs
one layer's K+V write. It says up front what it can run
(``unsupported_reason``) so capture can skip it with a stated reason, and after each
write it says which path actually ran, so a silent fallback is never reported as fused.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

# The paths a write reports are part of the writers' contract; their one definition is the
# torch-free vocabulary, which the analysis reads too.
from kvprof.core.vocab import FALLBACK_PREFIX, FUSED, TWO_COPIES, TWO_STREAMS, is_fused_path  # noqa: F401
from kvprof.kvcache.validation import check_apart, check_buffer_pair, check_index_range, check_scale, check_write_inputs


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
            return impl(self, *self.check_write(*args, **kwargs))  # type: ignore[no-any-return]

        write._checks_call = True  # type: ignore[attr-defined]
        cls.write = write  # type: ignore[attr-defined]
        cls.write_unchecked = impl  # type: ignore[method-assign]

    def check_write(self, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """The contract's checks (each contract defines them); the call's arguments, positional."""
        raise NotImplementedError

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
        if index < 0:  # reading the slots costs no device sync off CUDA
            check_index_range("loc", loc, 0, shape[0])
        return k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale, v_scale
