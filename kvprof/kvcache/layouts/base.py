"""What the MLA and paged pools and writers share: the writer's self-description and the checks
on slots, devices and scales that run before any kernel (what a layout is: ``layout.py``; the
check for inputs sharing memory with a buffer is :func:`kvprof.kvcache.validation.check_apart`, the MHA
pool's too).

A layout writer differs from the MHA ``KVWriter`` only in what ``write`` takes (one latent
row for MLA, a block-addressed K/V pair for the paged cache), so it says up front what it
can run (``unsupported_reason``) and returns the path that ran, as the MHA writers do.
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from kvprof.kvcache.dtypes import FP8_DTYPES
from kvprof.kvcache.validation import FLOAT_INPUTS, check_scale
from kvprof.kvcache.writers.base import ChecksItsCalls, WriterInfo


class LayoutWriter(ChecksItsCalls, abc.ABC):  # noqa: B024 (a base with hooks; each layout adds its own abstract write)
    """Base of the MLA and paged writers (see ``kvprof.kvcache.layouts.mla`` / ``.paged`` for ``write``
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


def check_positive(**values: Any) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_cache_dtype(dtype: Any) -> None:
    if dtype not in FLOAT_INPUTS:
        raise ValueError(f"unsupported cache dtype {dtype}")


def check_loc(loc: Any, device: torch.device, name: str = "loc") -> torch.Tensor:
    """1-D int32/int64 slots on the pool's device; returns them contiguous (the kernels read
    consecutive slots: a strided view is copied)."""
    if not isinstance(loc, torch.Tensor):
        raise ValueError(f"{name} must be a tensor of slot indices, got {type(loc).__name__}")
    if loc.dtype is not torch.int64 and loc.dtype is not torch.int32:
        raise ValueError(f"{name} must be an int32 or int64 tensor, got {loc.dtype}")
    if loc.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(loc.shape)}")
    if loc.device != device:
        raise ValueError(f"{name} is on {loc.device}, the pool is on {device}")
    return loc if loc.is_contiguous() else loc.contiguous()


def check_rows(t: Any, name: str, tokens: int, heads: int, dim: int, device: torch.device,
               at_least: bool = False) -> torch.Tensor:
    """A float tensor of ``[tokens, heads, dim]`` or ``[tokens, heads * dim]`` on ``device``,
    returned as ``[tokens, heads, dim]`` with contiguous rows (any token stride; copied only
    where a row is not contiguous). ``at_least``: more tokens than ``tokens`` are allowed
    (vLLM pads inputs for CUDA graphs; only the first ``tokens`` rows are written)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the pool is on {device}")
    if t.dtype not in FLOAT_INPUTS:
        raise ValueError(f"{name} must be floating point, got {t.dtype}")
    if t.dim() == 0 or (t.shape[0] < tokens if at_least else t.shape[0] != tokens):
        got = t.shape[0] if t.dim() else "a scalar"
        raise ValueError(f"{name} has {got} tokens but the slots have {tokens}")
    if tuple(t.shape[1:]) not in ((heads, dim), (heads * dim,)):
        raise ValueError(f"{name} rows have shape {tuple(t.shape[1:])}, expected ({heads}, {dim})")
    t = t.reshape(t.shape[0], heads, dim) if t.dim() == 2 else t
    if t.stride(2) != 1 or (heads > 1 and t.stride(1) != dim):
        t = t.contiguous()
    return t


def slot_range(loc: torch.Tensor) -> tuple[int, int]:
    """Smallest and largest slot (one device sync)."""
    lo, hi = (int(x) for x in torch.aminmax(loc))
    return lo, hi


def capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def layer_index(layer: Any, layer_id_override: int | None, start_layer: int, layer_num: int) -> int:
    """The buffer index of ``layer`` (an int or an object with ``layer_id``), or a one-line error."""
    layer_id = layer_id_override if layer_id_override is not None else getattr(layer, "layer_id", layer)
    if isinstance(layer_id, bool) or not isinstance(layer_id, int):
        raise ValueError(f"layer {layer_id!r} is not a layer id (an int)")
    idx = layer_id - start_layer
    if not 0 <= idx < layer_num:
        raise ValueError(f"layer {layer_id!r} is not in this pool "
                         f"(layers {start_layer}..{start_layer + layer_num - 1})")
    return idx


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def check_scale_value(name: str, scale: Any, device: torch.device) -> None:
    """None, a positive finite number, or a one-element floating tensor on the pool's device (the
    writers' own check, :func:`kvprof.kvcache.validation.check_scale`)."""
    check_scale(name, scale, device, "the pool")
