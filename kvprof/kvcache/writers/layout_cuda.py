"""kvprof's fused MLA and paged stores as a compiled CUDA op (csrc/layout_store.cu), built at
first use: the eager launch path (one pybind call into a ``<<<>>>`` launch) beside the Triton
writers' (a Triton launch from Python costs ~15 µs of host time). Same bits as the Triton
writers and the references: SGLang's cast for MLA, vLLM's division and saturation for paged.

Build: :mod:`kvprof.kvcache.cuda_build` (first use, ``-O3``, sm_90 plus the current
device's arch, the output in ``build.log``); a failed build is one line and the writer
reports itself unavailable with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvprof.kvcache.contracts import MLAWriter, PagedWriter
from kvprof.kvcache.cuda_build import CudaOp, op_refusal
from kvprof.kvcache.writers.fp8_jit import torch_e4m3_saturates

CSRC = Path(__file__).with_name("csrc")
EXT_NAME = "kvprof_layout_store"
FUSED = "fused"
_OUT = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}
_INPUTS = (torch.float32, torch.bfloat16, torch.float16)

_OP = CudaOp(EXT_NAME, [CSRC / "layout_store.cpp", CSRC / "layout_store.cu"], "layout_store", ["-std=c++17"])


def load_extension() -> tuple[Any, str | None]:
    """The compiled module, or None and a one-line reason. Built once per process."""
    return _OP.load()


def _reason(name: str, device: torch.device, dtype: torch.dtype, input_dtype: torch.dtype | None) -> str | None:
    if device.type != "cuda":
        return f"{name} needs CUDA"
    if input_dtype is not None and input_dtype not in _INPUTS:
        return f"{name} takes fp32/bf16/fp16 inputs, not {input_dtype}"
    if input_dtype is not None and input_dtype != dtype and dtype not in _OUT:
        return f"{name} has no conversion from {input_dtype} to {dtype}"
    return load_extension()[1]


class MLACudaWriter(MLAWriter):
    """One compiled launch per layer writes whole latent rows, SGLang's cast in the kernel."""

    name = "mla_cuda"
    description = "kvprof's fused MLA store as a compiled CUDA op (eager launch path)"
    fused = True
    devices = ("cuda",)

    def launches_pdl(self, device: torch.device) -> bool:
        """kvprof's layout op launches without programmatic dependent launch."""
        return False

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        return _reason(self.name, device, dtype, input_dtype)

    def write(self, kv_buf, loc, nope, rope, dtype, skip):  # type: ignore[override]
        ext, error = load_extension()
        if ext is None:
            raise RuntimeError(f"mla_cuda cannot run: {error}")
        out = 0 if nope.dtype == dtype else _OUT.get(dtype, -1)
        if out < 0 or nope.dtype not in _INPUTS:
            raise ValueError(f"mla_cuda has no conversion from {nope.dtype} to {dtype}")
        try:
            ext.mla_store(kv_buf, loc, nope, rope, skip, out, out == 1 and torch_e4m3_saturates())
        except RuntimeError as exc:  # the op's checks run before it launches: nothing was written
            raise op_refusal(exc, "layout_store:") from None
        return FUSED


class PagedCudaWriter(PagedWriter):
    """One compiled launch per layer writes K and V at ``slot_mapping`` (-1 skipped)."""

    name = "paged_cuda"
    description = "kvprof's fused paged store as a compiled CUDA op (eager launch path)"
    fused = True
    devices = ("cuda",)

    def launches_pdl(self, device: torch.device) -> bool:
        """kvprof's layout op launches without programmatic dependent launch."""
        return False

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        return _reason(self.name, device, dtype, input_dtype)

    def write(self, k_cache, v_cache, slots, key, value, dtype, k_scale, v_scale):  # type: ignore[override]
        ext, error = load_extension()
        if ext is None:
            raise RuntimeError(f"paged_cuda cannot run: {error}")
        out = _OUT.get(dtype, 0)
        if key.dtype not in _INPUTS or (out == 0 and key.dtype != dtype):
            raise ValueError(f"paged_cuda has no conversion from {key.dtype} to {dtype}")
        try:
            ext.paged_store(k_cache, v_cache, slots, key, value, k_scale, v_scale, out)
        except RuntimeError as exc:  # the op's checks run before it launches: nothing was written
            raise op_refusal(exc, "layout_store:") from None
        return FUSED
