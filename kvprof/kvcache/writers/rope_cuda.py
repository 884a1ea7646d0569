"""kvprof's rope + K/V store as one compiled CUDA launch (csrc/rope_store.cu), built at first use.

What SGLang's ``FusedSetKVBufferArg`` path does in one kernel, with what that kernel lacks:
q and k are rotated in place (GPT-NeoX or GPT-J, partial rotary: dims from ``rope_dim`` on
pass through), the rotated k and v are stored at ``loc`` (any stride), and fp8 caches are
quantised in the same launch with the per-tensor scale, bitwise
``kvprof.kvcache.dtypes.convert_for_cache`` of the rotated k (as written back) and of v. The rotation
is float32 without fused multiply-adds, rounded once to the input dtype.

The launch is tuned for decode: one thread per 16-byte piece of work (a NeoX rope item is a
vector and its partner rope_dim/2 further), so a Llama-3.1-70B TP8 token (8 q heads, 1 KV head
x 128) is 88 threads in one block, where a warp per row would idle most lanes.

Programmatic dependent launch is on by default on sm_90+ (``griddepcontrol.wait`` before the
first load); ``pdl=False``/``True`` forces it, so its effect can be measured. Build:
:mod:`kvprof.kvcache.cuda_build` (``-Xptxas -v``: ``build.log`` holds the register counts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvprof.core.vocab import ROPE_FUSED
from kvprof.kvcache.contracts import RopeKVWriter
from kvprof.kvcache.cuda_build import CudaOp, op_refusal
from kvprof.kvcache.writers.cuda_fused import CudaConfig
from kvprof.kvcache.writers.fp8_jit import uses_pdl
from kvprof.kvcache.writers.triton_convert import KINDS, cached_inverse

CSRC = Path(__file__).with_name("csrc")
EXT_NAME = "kvprof_rope_store"
INPUT_DTYPES = (torch.bfloat16, torch.float16)
FP8_CACHES = (torch.float8_e4m3fn, torch.float8_e5m2)

_OP = CudaOp(EXT_NAME, [CSRC / "rope_store.cpp", CSRC / "rope_store.cu"], "rope_cuda_fused", ["-Xptxas", "-v"])


def build_dir() -> Path:
    """Where the op is built and its ``build.log`` kept."""
    return _OP.build_dir()


def load_extension() -> tuple[Any, str | None]:
    """The compiled module, or None and a one-line reason. Built once per process."""
    return _OP.load()


def cache_support(dtype: torch.dtype, input_dtype: torch.dtype | None) -> str | None:
    """None when the op stores ``input_dtype`` k/v rows into a ``dtype`` cache, else why not
    (q is bf16 or fp16 of its own; the op checks it)."""
    if input_dtype is not None and input_dtype not in INPUT_DTYPES:
        return f"rope_cuda_fused takes bf16 or fp16 q/k/v, not {input_dtype}"
    if dtype in FP8_CACHES:
        return None
    if dtype not in INPUT_DTYPES:
        return f"rope_cuda_fused stores into bf16, fp16 or fp8 caches, not {dtype}"
    if input_dtype is not None and input_dtype != dtype:
        return f"rope_cuda_fused stores {input_dtype} rows into a cache of the same dtype or fp8, not {dtype}"
    return None


class RopeCudaWriter(RopeKVWriter):
    """One compiled CUDA launch: q and k rotated in place, k and v stored at ``loc``."""

    name = "rope_cuda_fused"
    description = ("kvprof's CUDA rope + store (pybind op): one launch rotates q and k in place and stores "
                   "k and v, dtype conversion in-kernel")
    fused = True
    rope_fused = True
    devices = ("cuda",)

    def __init__(self, pdl: bool | None = None, config: CudaConfig | dict[str, int] | None = None) -> None:
        """``pdl``: programmatic dependent launch; None (default) turns it on where the device
        has it (sm_90+). ``config`` forces one launch shape (threads per block, blocks per SM)."""
        if isinstance(config, dict):
            config = CudaConfig(**config)
        self.pdl = pdl
        self.config = config
        self._plans: dict[tuple[Any, ...], tuple[Any, int, float, float]] = {}

    def launches_pdl(self, device: torch.device) -> bool:
        """PDL where the device has it (sm_90+: the op's own choice with ``pdl=None``), or as forced."""
        return uses_pdl(self.pdl, device)

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if device.type != "cuda":
            return f"rope_cuda_fused is a compiled CUDA kernel: it needs a CUDA device, not {device.type}"
        reason = cache_support(dtype, input_dtype)
        if reason:
            return reason
        _, error = load_extension()
        return error

    def prepare(self, device: torch.device) -> None:
        """Build (or load) the op before any write or graph capture."""
        if device.type == "cuda":
            load_extension()

    def _plan(self, in_dtype: torch.dtype, dtype: torch.dtype, is_neox: bool, k_scale: Any,
              v_scale: Any) -> tuple[Any, int, float, float]:
        """The op, its flags and the inverse scales for one combination (cached when the scales
        are Python numbers or None: a tensor scale may change in place, so it is read each call)."""
        reason = cache_support(dtype, in_dtype)
        if reason:
            raise ValueError(reason)
        ext, error = load_extension()
        if ext is None:
            raise RuntimeError(f"rope_cuda_fused cannot run: {error}")
        pdl = (1 << 7) if self.pdl is None else int(self.pdl) << 5  # bit 7: the op decides
        flags = KINDS[dtype] | pdl | int(bool(is_neox)) << 6 | (self.config.bits if self.config else 0)
        k_inv = v_inv = 1.0
        if dtype in FP8_CACHES:
            if k_scale is not None:
                flags |= 8
                k_inv = cached_inverse(k_scale)
            if v_scale is not None:
                flags |= 16
                v_inv = cached_inverse(v_scale)
        plan = (ext.rope_store, flags, k_inv, v_inv)
        if not isinstance(k_scale, torch.Tensor) and not isinstance(v_scale, torch.Tensor) and len(self._plans) < 256:
            self._plans[(in_dtype, dtype, is_neox, k_scale, v_scale)] = plan
        return plan

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
        # One dict lookup and one pybind call on the common path; the op checks shapes,
        # strides, alignment and dtypes in C++ and launches nothing for zero tokens.
        plan = self._plans.get((k.dtype, dtype, is_neox, k_scale, v_scale))
        if plan is None:
            plan = self._plan(k.dtype, dtype, is_neox, k_scale, v_scale)
        op, flags, k_inv, v_inv = plan
        try:
            op(q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, k_inv, v_inv, flags)
        except RuntimeError as exc:  # the op's checks run before it launches: nothing was written
            raise op_refusal(exc, "rope_cuda_fused:") from None
        return ROPE_FUSED
