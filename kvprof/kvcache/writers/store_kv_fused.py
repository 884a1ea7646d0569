"""kvprof's fused write as one variant: the compiled op eagerly, the Triton kernel in graphs.

Why two kernels behind one name: the two places a write runs want different things.
Eagerly, a small write is bound by the host launch path, where the compiled CUDA op
(``cuda_fused``: one pybind call into a ``<<<>>>`` launch) costs a few µs and a Triton
launch from Python 30-50 µs. Inside a CUDA graph the launch path is paid once, at capture,
and only device time is left, where ``triton_fused`` is the faster kernel in kvprof's
measurements (docs/benchmarks.md). So: while the current stream is capturing, the Triton kernel; else
the compiled op when a compiler built it, and the Triton kernel as the portable path
(no nvcc, or a CPU under Triton's interpreter). Both write the same bits (bitwise
``index_put``), so the choice never changes the cache, only the cost. Which kernel ran
shows in every trace by name (``_store_kv_kernel`` vs ``store_kv_kernel<...>``);
``kernel_for`` says which one a call will use.
"""

from __future__ import annotations

from typing import Any

import torch

from kvprof.kvcache.contracts import KVWriter, WriterInfo, checked_impl
from kvprof.kvcache.validation import check_buffers_inputs
from kvprof.kvcache.writers.cuda_fused import CudaFusedWriter
from kvprof.kvcache.writers.triton_fused import TritonFusedWriter


class StoreKVFusedWriter(KVWriter):
    """One launch for K and V: the compiled CUDA op eagerly, the Triton kernel when captured."""

    name = "store_kv_fused"
    description = ("kvprof's fused write: compiled CUDA op for eager launches, Triton kernel inside "
                   "CUDA-graph capture; Triton alone where no compiler")
    fused = True
    devices = ("cpu", "cuda")
    # the compiled op checks its calls; the Triton path (captured, or no compiler) is checked
    # here in Python first, where host time is paid once at capture or is Triton's anyway
    validates_inputs = True

    def __init__(self) -> None:
        self.triton = TritonFusedWriter()
        self.cuda = CudaFusedWriter()
        self._eager: dict[int, KVWriter] = {}  # by device index (-1: CPU), set by prepare

    def launches_pdl(self, device: torch.device) -> bool:
        """Its two kernels (the CUDA op eagerly, the Triton kernel in graphs) both launch with
        PDL where the device has it."""
        return bool(self.triton.launches_pdl(device) or self.cuda.launches_pdl(device))

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        triton_reason = self.triton.unsupported_reason(device, dtype, input_dtype)
        if triton_reason is None or device.type != "cuda":
            return triton_reason
        cuda_reason = self.cuda.unsupported_reason(device, dtype, input_dtype)
        return None if cuda_reason is None else f"{triton_reason}; and {cuda_reason}"

    def prepare(self, device: torch.device) -> None:
        self._eager_writer(device)

    def _eager_writer(self, device: torch.device) -> KVWriter:
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        key = device.index if device.type == "cuda" else -1
        writer = self._eager.get(key)
        if writer is None:
            use_cuda = device.type == "cuda" and self.cuda.unsupported_reason(device, torch.bfloat16) is None
            writer = self._eager[key] = self.cuda if use_cuda else self.triton
        return writer

    def kernel_for(self, device: torch.device, captured: bool) -> str:
        """The writer that a call on ``device`` uses, captured or eager."""
        if captured and device.type == "cuda" and self.triton.unsupported_reason(device, torch.bfloat16) is None:
            return self.triton.name
        return self._eager_writer(device).name

    def info(self) -> WriterInfo:
        """``extra["interpreted"]`` as triton_fused's, unless the compiled op was picked for
        the eager writes: where the Triton kernel runs in Triton's interpreter, so does this."""
        info = super().info()
        why = self.triton.info().extra.get("interpreted")
        if why and not any(w is self.cuda for w in self._eager.values()):
            info.extra["interpreted"] = why
        return info

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
        writer: Any
        if loc.is_cuda and _capturing():
            writer = self.triton if self.kernel_for(loc.device, True) == self.triton.name else self.cuda
        else:
            writer = self._eager.get(loc.get_device()) or self._eager_writer(loc.device)
        if writer is self.triton:
            loc, cache_k, cache_v = check_buffers_inputs(k_buf, v_buf, loc, cache_k, cache_v)
        return checked_impl(writer)(k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale, v_scale)


# The capture check runs on every eager write (the host path this variant exists for): the
# C binding directly saves the Python wrapper's frame. A CPU build of torch has only a dummy
# there (it is never called: the check follows loc.is_cuda), so it keeps the wrapper.
_capturing = (torch._C._cuda_isCurrentStreamCapturing if torch.version.cuda
              else torch.cuda.is_current_stream_capturing)
