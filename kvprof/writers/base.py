"""The contract between the pool and a write implementation.

A writer gets the pool's per-layer storage buffers and validated inputs and performs
one layer's K+V write. It says up front what it can run
(``unsupported_reason``) so capture can skip it with a stated reason, and after each
write it says which path actually ran, so a silent fallback is never reported as fused.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field

import torch

# The paths a write reports are part of the writers' contract; their one definition is the
# torch-free vocabulary, which the analysis reads too.
from kvprof.core.vocab import FALLBACK_PREFIX, FUSED, TWO_COPIES, TWO_STREAMS, is_fused_path  # noqa: F401


def convert_pair(
    cache_k: torch.Tensor,
    cache_v: torch.Tensor,
    dtype: torch.dtype,
    k_scale: float | torch.Tensor | None,
    v_scale: float | torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference conversion, for writers that cannot convert inside their kernel."""
    from kvprof.dtypes import convert_for_cache

    return convert_for_cache(cache_k, dtype, k_scale), convert_for_cache(cache_v, dtype, v_scale)


@dataclass
class WriterInfo:
    """What a writer is, for manifests and tables."""

    name: str
    description: str
    fused: bool  # one launch for K and V when its main path runs
    devices: tuple[str, ...]  # device types it can run on ("cpu", "cuda")
    extra: dict[str, str] = field(default_factory=dict)


class KVWriter(abc.ABC):
    """Base class for write implementations; subclass and register with ``@register``."""

    name: str = ""
    description: str = ""
    fused: bool = False
    devices: tuple[str, ...] = ("cpu", "cuda")
    # True: ``write`` refuses, before any kernel runs, every call that
    # ``kvprof.validation.check_write_inputs`` refuses (compiled checks cost nanoseconds), and
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
        are the caller's rows, ``[tokens, heads, dim]``, in their own dtype; all already
        validated by the pool (:func:`kvprof.validation.check_write_inputs`: no input shares
        memory with a buffer). ``dtype`` is the cache's logical dtype. Plain arguments, no
        request object: this is the hot path whose host cost kvprof measures.
        """
