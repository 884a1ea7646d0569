"""sgl-kernel's fused ``store_kv_cache`` op, with the wrapper's fallback made visible.

sgl-kernel's ``set_kv_buffer_kernel`` catches any RuntimeError from the op (no op, rows
not a multiple of 128 bytes, K and V of different widths, CPU tensors) and silently does
two index_put copies. This writer runs the same op with the same fallback, but returns
``fallback: <why>`` instead of pretending, so a report can never call it fused.
sgl-kernel is imported only where CUDA is present (it pins its own torch and loads CUDA
libraries at import).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvprof.kvcache.contracts import FALLBACK_PREFIX, FUSED, KVWriter
from kvprof.kvcache.dtypes import convert_for_cache, store_dtype_for

StoreOp = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def find_store_op() -> tuple[StoreOp | None, str]:
    """The op, or None and why it is not there."""
    if not torch.cuda.is_available():
        return None, "sgl-kernel needs CUDA (not imported on a machine without it)"
    try:
        import sgl_kernel  # noqa: F401  (registers torch.ops.sgl_kernel)
    except Exception as exc:  # ImportError, or an ABI mismatch with this torch
        return None, f"sgl-kernel not installed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    try:
        return torch.ops.sgl_kernel.store_kv_cache, ""
    except (AttributeError, RuntimeError):
        return None, "sgl-kernel is installed but has no store_kv_cache op"


def sglang_convert(x: torch.Tensor, dtype: torch.dtype, scale: float | torch.Tensor | None) -> torch.Tensor:
    """The conversion SGLang runs before the op, as its kernels: ``x.div_(scale)`` then
    ``.to(dtype)``, two kernels per tensor (``div`` here: kvprof never mutates the caller's
    rows). CUDA's division by a Python number multiplies by its fp32 reciprocal, which is the
    reference's rounding (bench and tests check the bits); tensor scales take the reference."""
    if isinstance(scale, torch.Tensor) or not x.is_cuda:
        return convert_for_cache(x, dtype, scale)
    if x.dtype != dtype:
        if scale is not None:
            x = x.div(scale)
        x = x.to(dtype)
    store = store_dtype_for(dtype)
    return x.view(store) if store != dtype else x


class SglKernelWriter(KVWriter):
    name = "sgl_kernel"
    description = "sgl-kernel store_kv_cache (one launch), wrapper fallback to two index_put"
    fused = True
    devices: tuple[str, ...] = ("cuda",)

    def __init__(self, op: StoreOp | None = None, devices: tuple[str, ...] | None = None,
                 missing: str | None = None) -> None:
        # ``op``/``devices`` let tests drive the path logic with a stand-in op on CPU;
        # ``missing``: why there is no op (a subclass that looked for its own).
        if op is None and missing is None:
            op, missing = find_store_op()
        self._missing = missing or ""
        self._op = op
        if devices is not None:
            self.devices = devices

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if self._op is None:
            return self._missing
        return super().unsupported_reason(device, dtype, input_dtype)

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
        if cache_k.dtype != k_buf.dtype or cache_v.dtype != v_buf.dtype:
            cache_k, cache_v = sglang_convert(cache_k, dtype, k_scale), sglang_convert(cache_v, dtype, v_scale)
        if self._op is None:
            reason = self._missing
        else:
            rows, tokens = k_buf.shape[0], loc.shape[0]
            try:
                self._op(
                    k_buf.view(rows, -1),
                    v_buf.view(rows, -1),
                    loc,
                    cache_k.reshape(tokens, -1),
                    cache_v.reshape(tokens, -1),
                )
                return FUSED
            except RuntimeError as exc:
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        k_buf[loc] = cache_k
        v_buf[loc] = cache_v
        return FALLBACK_PREFIX + " " + reason
