"""vLLM's own cache kernels as peer writers: ``reshape_and_cache_flash_kernel`` (paged layout)
and ``concat_and_cache_mla_kernel`` (MLA layout), compiled from vLLM's source.

vLLM's CUDA wheel is built for its own torch and is too big to carry to a GPU machine, so
the kernels' source is taken out of a vLLM source tree with ``python -m
kvprof.kvcache.writers.vllm_src_extract VLLM_SRC --out DIR`` (nothing of vLLM is part of
kvprof) and compiled at first use into a small op (``csrc/vllm_peers.cu``, launched with
vLLM's grid and block; sm_90 plus the current device's arch, ``-DENABLE_FP8`` as vLLM's build
sets it). ``DIR`` is ``$KVPROF_VLLM_SRC``, else ``.gpu/vllm`` under the current directory.
Where the source, CUDA or nvcc is missing or the build fails, the writers say so in one line
and are unavailable.

Differences from a vLLM call, each stated: vLLM's kernels read int64 slots, so an int32
``loc`` is widened first (one more kernel; the path says ``slots_int64_then_fused``); the MLA
layout's reserved slot (SGLang's slot 0, ``set_mla_kv_buffer``) is honoured by
``concat_and_cache_mla_skip_kernel``, vLLM's kernel with one comparison added (with no
reserved slot, ``set_kv_buffer``, vLLM's kernel runs verbatim). fp8 MLA caches: vLLM divides
by a scale (1.0 here) and saturates; the MLA layout casts as torch's ``.to`` does, so only
e4m3 where torch's cast saturates too is offered.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from kvprof.kvcache.contracts import MLAWriter, PagedWriter
from kvprof.kvcache.cuda_build import CudaOp, op_refusal
from kvprof.kvcache.writers.fp8_jit import torch_e4m3_saturates

CSRC = Path(__file__).with_name("csrc")
FUSED = "fused"
WIDENED = "slots_int64_then_fused"
_CODE = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2}
_INPUTS = (torch.float32, torch.bfloat16, torch.float16)
HEADER = "vllm_cache_kernels.cuh"


def source_dir() -> Path:
    """Where the extracted vLLM kernels are: ``$KVPROF_VLLM_SRC`` or ``.gpu/vllm``."""
    return Path(os.environ.get("KVPROF_VLLM_SRC") or ".gpu/vllm").resolve()


_OPS: dict[Path, CudaOp] = {}


def load_extension() -> tuple[Any, str | None]:
    """The compiled op, or None and a one-line reason (built once per process and source folder)."""
    src = source_dir()
    if not (src / "include" / HEADER).is_file():
        return None, (f"vLLM's kernel source is not at {src} (extract it with python -m "
                      "kvprof.kvcache.writers.vllm_src_extract VLLM_SRC --out DIR; set KVPROF_VLLM_SRC=DIR)")
    op = _OPS.get(src)
    if op is None:
        op = _OPS[src] = CudaOp("kvprof_vllm_peers", [CSRC / "vllm_peers.cu"], "vllm_peers",
                                ["-std=c++17", "-DENABLE_FP8", f"-I{src / 'include'}"])
    return op.load()


def _slots(loc: torch.Tensor) -> tuple[torch.Tensor, str]:
    return (loc, FUSED) if loc.dtype == torch.int64 else (loc.to(torch.int64), WIDENED)


class VllmPagedWriter(PagedWriter):
    """vLLM's ``reshape_and_cache_flash_kernel``, launched as vLLM launches it."""

    name = "vllm_reshape_and_cache_flash"
    description = "vLLM's reshape_and_cache_flash kernel, compiled from vLLM's source"
    fused = True
    devices = ("cuda",)

    def launches_pdl(self, device: torch.device) -> bool:
        """vLLM's kernel launches without programmatic dependent launch."""
        return False

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if device.type != "cuda":
            return f"{self.name} is a CUDA kernel"
        if input_dtype is not None and input_dtype not in _INPUTS:
            return f"{self.name} takes fp32/bf16/fp16 inputs, not {input_dtype}"
        if input_dtype is not None and input_dtype != dtype and dtype not in _CODE:
            return f"{self.name} has no conversion from {input_dtype} to {dtype}"
        return load_extension()[1]

    def write(self, k_cache, v_cache, slots, key, value, dtype, k_scale, v_scale):  # type: ignore[override]
        ext, error = load_extension()
        if ext is None:
            raise RuntimeError(f"{self.name} cannot run: {error}")
        code = _CODE.get(dtype, 0)
        if key.dtype not in _INPUTS or (code == 0 and key.dtype != dtype):
            raise ValueError(f"{self.name} has no conversion from {key.dtype} to {dtype}")
        slots, path = _slots(slots)
        try:
            ext.reshape_and_cache_flash(key, value, k_cache, v_cache, slots, code, k_scale, v_scale)
        except RuntimeError as exc:
            raise op_refusal(exc, "vllm_peers:") from None
        return path


class VllmMLAWriter(MLAWriter):
    """vLLM's ``concat_and_cache_mla_kernel`` on the MLA layout's rows (block size 1)."""

    name = "vllm_concat_and_cache_mla"
    description = "vLLM's concat_and_cache_mla kernel, compiled from vLLM's source"
    fused = True
    devices = ("cuda",)

    def __init__(self) -> None:
        self._scale: dict[torch.device, torch.Tensor] = {}

    def launches_pdl(self, device: torch.device) -> bool:
        """vLLM's kernel launches without programmatic dependent launch."""
        return False

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if device.type != "cuda":
            return f"{self.name} is a CUDA kernel"
        if input_dtype is not None and input_dtype not in _INPUTS:
            return f"{self.name} takes fp32/bf16/fp16 inputs, not {input_dtype}"
        if dtype in _CODE and (dtype != torch.float8_e4m3fn or not torch_e4m3_saturates()):
            return (f"{self.name} saturates when it casts to {dtype}; the MLA layout casts as torch's .to does, "
                    "which does not here")
        if input_dtype is not None and input_dtype != dtype and dtype not in _CODE:
            return f"{self.name} has no conversion from {input_dtype} to {dtype}"
        return load_extension()[1]

    def prepare(self, device: torch.device) -> None:
        """The scale tensor (1.0: the MLA layout casts without scaling), made outside any graph capture."""
        if device.type == "cuda" and device not in self._scale:
            self._scale[device] = torch.ones(1, dtype=torch.float32, device=device)

    def write(self, kv_buf, loc, nope, rope, dtype, skip):  # type: ignore[override]
        ext, error = load_extension()
        if ext is None:
            raise RuntimeError(f"{self.name} cannot run: {error}")
        code = _CODE.get(dtype, 0)
        if nope.dtype not in _INPUTS or (code == 0 and nope.dtype != dtype):
            raise ValueError(f"{self.name} has no conversion from {nope.dtype} to {dtype}")
        self.prepare(kv_buf.device)
        slots, path = _slots(loc)
        tokens = slots.shape[0]
        try:
            ext.concat_and_cache_mla(nope.reshape(tokens, nope.shape[-1]) if tokens else nope.view(0, nope.shape[-1]),
                                     rope.reshape(tokens, rope.shape[-1]) if tokens else rope.view(0, rope.shape[-1]),
                                     kv_buf, slots, code, self._scale[kv_buf.device] if code else None, skip)
        except RuntimeError as exc:
            raise op_refusal(exc, "vllm_peers:") from None
        return path
