"""kvprof's fused K+V write as a compiled CUDA op (csrc/store_kv.cu), built at first use.

Why it exists next to ``triton_fused``: the host launch path. Eagerly, a Triton launch
from Python costs about 15 µs of host time, sgl-kernel's op 8.6 µs; this op is one pybind
call straight into a ``<<<>>>`` (or ``cudaLaunchKernelEx``) launch, with the small arguments
packed into one integer. The kernel converts the dtype as torch does (``__float2bfloat16_rn``,
``__float2half_rn``, c10's fp8 rule), so results are bitwise ``convert_for_cache``'s for
non-NaN inputs.

Build: :mod:`kvprof.kvcache.cuda_build` (first use, ``-O3``, sm_90 plus the current
device's arch), with ``-Xptxas -v`` so that ``build.log`` also holds the register counts.

Programmatic dependent launch is on by default on sm_90+ (the kernel waits with
``griddepcontrol.wait`` before its first load); ``pdl=False``/``True`` forces it, so its
effect can be measured.
fp8 caches are converted with the hardware instruction plus a fix-up to c10's overflow rule
(``hw_fp8=True``, the default; bitwise c10's, verified exhaustively by the GPU tests): c10's
integer routine (``hw_fp8=False``) made large fp8 writes compute-bound (8x128 x 32768
tokens: 78 µs against 54 µs).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvprof.kvcache.contracts import FUSED, KVWriter
from kvprof.kvcache.cuda_build import CudaOp, op_refusal
from kvprof.kvcache.validation import check_buffers_inputs
from kvprof.kvcache.writers.fp8_jit import uses_pdl
from kvprof.kvcache.writers.triton_convert import KINDS, cached_inverse

CSRC = Path(__file__).with_name("csrc")
EXT_NAME = "kvprof_store_kv"


@dataclass(frozen=True)
class CudaConfig:
    """Threads per block (a power of two, 32..512) and the grid cap in blocks per SM."""

    threads: int
    blocks_per_sm: int

    def __post_init__(self) -> None:
        if self.threads < 32 or self.threads > 512 or self.threads & (self.threads - 1):
            raise ValueError(f"threads must be a power of two in [32, 512], got {self.threads}")
        if not 1 <= self.blocks_per_sm <= 255:
            raise ValueError(f"blocks_per_sm must be in [1, 255], got {self.blocks_per_sm}")

    @functools.cached_property
    def bits(self) -> int:
        """This config in the op's ``flags`` (bits 8-11 log2 threads, 12-19 blocks per SM)."""
        return (self.threads.bit_length() - 1) << 8 | self.blocks_per_sm << 12


# The default launch shape lives in the op (store_kv.cpp, one place): 128 threads per block
# up to 512 tokens, 256 above, grid capped at 8 blocks per SM. Each block row handles one
# token at a time with 2 vectors of K and V per thread in flight (1 when converting), grid-stride loop.


_OP = CudaOp(EXT_NAME, [CSRC / "store_kv.cpp", CSRC / "store_kv.cu"], "cuda_fused", ["-Xptxas", "-v"])


def build_dir() -> Path:
    """Where the op is built and its ``build.log`` kept (``kernel_facts`` reads the .so there)."""
    return _OP.build_dir()


def load_extension() -> tuple[Any, str | None]:
    """The compiled module, or None and a one-line reason. Built once per process."""
    return _OP.load()


class CudaFusedWriter(KVWriter):
    """One compiled CUDA launch writes K and V rows at ``loc``, converting dtype in-kernel."""

    name = "cuda_fused"
    description = "kvprof's fused CUDA C++ store (pybind op): one launch for K and V, dtype conversion in-kernel"
    fused = True
    devices = ("cuda",)
    validates_inputs = True  # store_kv.cpp checks what the pool checks, before launching

    def __init__(self, pdl: bool | None = None, config: CudaConfig | dict[str, int] | None = None,
                 hw_fp8: bool = True) -> None:
        """``pdl``: programmatic dependent launch; None (default) lets the op turn it on where
        the device has it (sm_90+), as triton_fused does. ``config`` forces one launch shape
        (tuning); ``hw_fp8=False`` uses c10's integer fp8 routine (the reference; slower,
        compute-bound for large fp8 writes) instead of the hardware conversion plus fix-up.
        Both give torch's bits."""
        if isinstance(config, dict):
            config = CudaConfig(**config)
        self.pdl = pdl
        self.hw_fp8 = bool(hw_fp8)
        self.config = config
        self._plans: dict[tuple[Any, ...], tuple[Any, int, float, float]] = {}

    def launches_pdl(self, device: torch.device) -> bool:
        """PDL where the device has it (sm_90+: the op's own choice with ``pdl=None``), or as forced."""
        return uses_pdl(self.pdl, device)

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if device.type != "cuda":
            return "cuda_fused needs CUDA"
        for d in (dtype, input_dtype):
            if d is not None and d not in KINDS:
                return f"cuda_fused has no conversion for {d}"
        _, error = load_extension()
        return error

    def _plan(self, in_dtype: torch.dtype, dtype: torch.dtype, k_scale: Any,
              v_scale: Any) -> tuple[Any, int, float, float]:
        """The op, its flags and the inverse scales for one (dtypes, scales) combination.
        Cached when the scales are Python numbers or None (a tensor scale may change in place,
        so it is read on every call)."""
        ext, error = load_extension()
        if ext is None:
            raise RuntimeError(f"cuda_fused cannot run: {error}")
        if dtype not in KINDS or in_dtype not in KINDS:
            raise ValueError(f"cuda_fused has no conversion from {in_dtype} to {dtype}")
        pdl = (1 << 7) if self.pdl is None else int(self.pdl) << 5  # bit 7: the op decides
        flags = KINDS[dtype] | pdl | self.hw_fp8 << 6 | (self.config.bits if self.config else 0)
        k_inv = v_inv = 1.0
        if in_dtype != dtype:
            if k_scale is not None:
                flags |= 8
                k_inv = cached_inverse(k_scale)
            if v_scale is not None:
                flags |= 16
                v_inv = cached_inverse(v_scale)
        plan = (ext.store_kv, flags, k_inv, v_inv)
        if not isinstance(k_scale, torch.Tensor) and not isinstance(v_scale, torch.Tensor) and len(self._plans) < 256:
            self._plans[(in_dtype, dtype, k_scale, v_scale)] = plan
        return plan

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
        # The eager host path is this writer's reason to exist: the common call does one dict
        # lookup and one pybind call; shapes, strides, alignment, zero tokens and the launch
        # shape are checked and chosen in C++ (store_kv.cpp), where they cost nanoseconds.
        plan = self._plans.get((cache_k.dtype, dtype, k_scale, v_scale))
        if plan is None:
            if not loc.shape[0]:
                check_buffers_inputs(k_buf, v_buf, loc, cache_k, cache_v)  # what the op would check
                return FUSED  # nothing to launch, on any device (no op needed)
            plan = self._plan(cache_k.dtype, dtype, k_scale, v_scale)
        op, flags, k_inv, v_inv = plan
        try:
            op(k_buf, v_buf, loc, cache_k, cache_v, k_inv, v_inv, flags)
        except RuntimeError as exc:
            _copy_and_launch(exc, op, k_buf, v_buf, loc, cache_k, cache_v, k_inv, v_inv, flags)
        return FUSED


def _copy_and_launch(exc: RuntimeError, op: Any, k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor,
                     cache_k: torch.Tensor, cache_v: torch.Tensor, k_inv: float, v_inv: float, flags: int) -> None:
    """After the op refused a strided ``loc`` or rows with a non-contiguous inside (rare: the
    pool hands contiguous ones), before launching anything: copy what it refused and launch
    again; any other refusal is raised."""
    while True:
        text = str(exc)
        if NOT_LOC_CONTIGUOUS in text and not loc.is_contiguous():
            loc = loc.contiguous()
        elif NOT_ROW_CONTIGUOUS in text and not (cache_k.is_contiguous() and cache_v.is_contiguous()):
            cache_k, cache_v = cache_k.contiguous(), cache_v.contiguous()
        else:
            raise op_refusal(exc, "cuda_fused:") from None
        try:
            op(k_buf, v_buf, loc, cache_k, cache_v, k_inv, v_inv, flags)
            return
        except RuntimeError as again:
            exc = again


# The op's messages for input rows that are not contiguous and for a strided loc (the
# writer then copies them; store_kv.cpp checks loc before the rows).
NOT_ROW_CONTIGUOUS = "cuda_fused: input rows must be contiguous"
NOT_LOC_CONTIGUOUS = "cuda_fused: loc must be contiguous"
