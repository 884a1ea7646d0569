"""kvprof's fused K+V write as a compiled CUDA op (csrc/store_kv.cu), built at first use.

Why it exists next to ``triton_fused``: the host launch path. Eagerly, a Triton launch
from Python costs about 15 µs of host time, sgl-kernel's op 8.6 µs; this op is one pybind
call straight into a ``<<<>>>`` (or ``cudaLaunchKernelEx``) launch, with the small arguments
packed into one integer. The kernel converts the dtype as torch does (``__float2bfloat16_rn``,
``__float2half_rn``, c10's fp8 rule), so results are bitwise ``convert_for_cache``'s for
non-NaN inputs.

Build: ``torch.utils.cpp_extension.load`` into ``$TORCH_EXTENSIONS_DIR`` or
``~/.cache/kvprof/torch_extensions``, ``-O3``, sm_90 plus the current device's arch,
``-Xptxas -v``; the whole build output (register counts included) is appended to
``build.log`` there. A failed build is one line naming that log, never a traceback.

Programmatic dependent launch is on by default on sm_90+ (the kernel waits with
``griddepcontrol.wait`` before its first load); ``pdl=False``/``True`` forces it, so its
effect can be measured.
fp8 caches are converted with the hardware instruction plus a fix-up to c10's overflow rule
(``hw_fp8=True``, the default; bitwise c10's, verified exhaustively on the H200): c10's
integer routine (``hw_fp8=False``) made large fp8 writes compute-bound (8x128 x 32768
tokens: 78 us against 54 us).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvprof.validation import check_buffers_inputs
from kvprof.writers.base import FUSED, KVWriter
from kvprof.writers.triton_convert import KINDS, cached_inverse

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


def build_dir() -> Path:
    base = os.environ.get("TORCH_EXTENSIONS_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "kvprof" / "torch_extensions"
    tag = f"torch{torch.__version__.split('+')[0]}_cu{(torch.version.cuda or 'none').replace('.', '')}"
    return root / f"{EXT_NAME}_{tag}"


def find_nvcc() -> str | None:
    """nvcc from CUDA_HOME (as torch's build uses it) or PATH."""
    try:
        from torch.utils.cpp_extension import CUDA_HOME
    except Exception:
        CUDA_HOME = None  # noqa: N806
    if CUDA_HOME:
        candidate = Path(CUDA_HOME) / "bin" / "nvcc"
        if candidate.exists():
            return str(candidate)
    return shutil.which("nvcc")


def _arch_flags() -> list[str]:
    flags = ["-gencode=arch=compute_90,code=sm_90"]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}{minor}"
        if arch != "90":
            flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    return flags


@contextlib.contextmanager
def _output_to(log: Path):
    """Send fds 1 and 2 (ninja, nvcc, ptxas) to ``log`` for the duration."""
    sys.stdout.flush()
    sys.stderr.flush()
    with open(log, "ab") as f:
        f.write(f"\n===== build at {time.strftime('%Y-%m-%d %H:%M:%S')} =====\n".encode())
        f.flush()
        saved = os.dup(1), os.dup(2)
        try:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


_EXT: Any = None
_EXT_ERROR: str | None = None


def load_extension() -> tuple[Any, str | None]:
    """The compiled module, or None and a one-line reason. Built once per process."""
    global _EXT, _EXT_ERROR
    if _EXT is not None or _EXT_ERROR is not None:
        return _EXT, _EXT_ERROR
    if not torch.cuda.is_available():
        _EXT_ERROR = "needs CUDA (torch.cuda is not available)"
        return None, _EXT_ERROR
    if find_nvcc() is None:
        _EXT_ERROR = "no CUDA compiler (nvcc) found"
        return None, _EXT_ERROR
    directory = build_dir()
    log = directory / "build.log"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        from torch.utils.cpp_extension import load

        with _output_to(log):
            _EXT = load(
                name=EXT_NAME,
                sources=[str(CSRC / "store_kv.cpp"), str(CSRC / "store_kv.cu")],
                extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3", *_arch_flags(), "-Xptxas", "-v"],
                build_directory=str(directory),
                verbose=True,
            )
    except Exception as exc:  # compiler error, missing ninja, ABI mismatch...
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        _EXT_ERROR = f"cuda_fused build failed ({type(exc).__name__}: {first}); see {log}"
        return None, _EXT_ERROR
    return _EXT, None


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

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if device.type != "cuda":
            return "cuda_fused needs CUDA"
        for d in (dtype, input_dtype):
            if d is not None and d not in KINDS:
                return f"cuda_fused has no conversion for {d}"
        _, error = load_extension()
        return error

    def _plan(self, in_dtype: torch.dtype, dtype: torch.dtype, k_scale: Any, v_scale: Any) -> tuple[Any, int, float, float]:
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
            # rows with a non-contiguous inside are rare (the pool hands contiguous rows)
            if NOT_ROW_CONTIGUOUS not in str(exc):
                raise
            op(k_buf, v_buf, loc, cache_k.contiguous(), cache_v.contiguous(), k_inv, v_inv, flags)
        return FUSED


# The op's message for input rows that are not contiguous (the writer then copies them).
NOT_ROW_CONTIGUOUS = "cuda_fused: input rows must be contiguous"
