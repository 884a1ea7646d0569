"""sgl-kernel's ``store_kv_cache`` kernels, run from the cubin inside sgl-kernel's wheel.

Why it exists: sgl-kernel's op often cannot be loaded where kvprof's bench runs on a GPU (its
wheel pins another torch; a GPU host may have no package registry: docs/benchmarks.md), yet the
peer kvprof compares with is that op's kernel. The kernel is plain device code in the wheel's fatbinary, with
no torch in it: ``python -m kvprof.kvcache.writers.sgl_cubin_extract`` takes the cubin that holds
``store_kv_cache_256x1<T>`` and ``store_kv_cache_128x2<T>`` (T = int32/int64 slots) out
of the published wheel, and this module loads it through the CUDA driver (ctypes: no
compiler, no sgl-kernel import) and launches it as the op's host code does (sgl-kernel
``csrc/memory/store.cu``): rows viewed as ``[tokens, -1]`` of 8-byte words, one warp per
token, 256 threads per block, the 256x1 kernel when a row is a multiple of 256 bytes, the
128x2 kernel when it is a multiple of 128, an error otherwise (which the writer reports
as a fallback, as for the op).

So the device time of ``sgl_kernel_cubin`` is sgl-kernel's own machine code. Its host
launch path is kvprof's ctypes call, not the op's dispatcher: eager host times of this
variant say nothing about sgl-kernel, and the bench does not compare against them.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvprof.kvcache.writers.sgl_kernel import SglKernelWriter

ENV_CUBIN = "KVPROF_SGL_CUBIN"
THREADS = 256  # the op's block size: 8 warps, one token per warp

# The op's kernels, by their mangled names: (u64* k_cache, u64* v_cache, const T* loc,
# size_t length, const u64* k, const u64* v, size_t cache_stride, size_t input_stride,
# size_t items). Another signature in a newer wheel is not launched blind: no match, no kernel.
_KERNEL = re.compile(rb"\x00(_ZN\w*?store_kv_cache_(256x1|128x2)I([il])EEvPmS1_PKT_mPKmS6_mmm)(?=\x00)")


@dataclass(frozen=True)
class StoreCubin:
    """One extracted cubin and the four kernels found in it."""

    path: Path
    image: bytes
    kernels: dict[tuple[str, str], str]  # ("256x1" | "128x2", "i32" | "i64") -> mangled name
    meta: dict[str, Any]  # what kvprof.kvcache.writers.sgl_cubin_extract recorded beside it (wheel, hashes)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.image).hexdigest()


def read_cubin(path: str | Path) -> StoreCubin:
    """The cubin at ``path`` and its kernels; ValueError (one line) if it has none of them."""
    path = Path(path)
    try:
        image = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read sgl-kernel cubin {path}: {exc.strerror or exc}") from None
    if image[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not a cubin (no ELF header)")
    kernels: dict[tuple[str, str], str] = {}
    for m in _KERNEL.finditer(image):
        kernels[(m.group(2).decode(), {"i": "i32", "l": "i64"}[m.group(3).decode()])] = m.group(1).decode()
    missing = sorted({(a, b) for a in ("256x1", "128x2") for b in ("i32", "i64")} - set(kernels))
    if missing:
        raise ValueError(f"{path} lacks sgl-kernel's store_kv_cache kernels {missing} (with the known signature)")
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return StoreCubin(path, image, kernels, meta)


def default_cubin_path() -> Path | None:
    """``$KVPROF_SGL_CUBIN``, else ``~/.cache/kvprof/sgl/store_kv_cache.sm_90.cubin``."""
    env = os.environ.get(ENV_CUBIN)
    if env:
        return Path(env)
    candidate = Path.home() / ".cache" / "kvprof" / "sgl" / "store_kv_cache.sm_90.cubin"
    return candidate if candidate.is_file() else None


@dataclass(frozen=True)
class Launch:
    """What the op's host code decides for one call: the kernel and its nine arguments."""

    kernel: tuple[str, str]
    grid: int
    args: tuple[int, ...]


def plan_launch(k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, *, need_cuda: bool = True) -> Launch:
    """The op's checks and launch shape (sgl-kernel ``store_kv_cache``), on 2-D views.
    Raises RuntimeError with the op's reason where the op would. ``need_cuda=False`` lets
    tests check the decisions on CPU tensors."""
    max_tokens, num_tokens = k_cache.shape[0], out_loc.shape[0]
    k_cache, v_cache = k_cache.view(max_tokens, -1), v_cache.view(max_tokens, -1)
    k, v = k.view(num_tokens, -1), v.view(num_tokens, -1)
    if need_cuda and not all(t.is_cuda for t in (k_cache, v_cache, out_loc, k, v)):
        raise RuntimeError("All tensors must be CUDA tensors")
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise RuntimeError("k_cache and v_cache must have the same size and strides")
    if k.shape != v.shape or k.stride() != v.stride():
        raise RuntimeError("k and v must have the same size and strides")
    if k.stride(-1) != 1 or k_cache.stride(-1) != 1:
        raise RuntimeError("k and k_cache must be contiguous in head.")
    if k.shape[-1] != k_cache.shape[-1]:
        raise RuntimeError("k and k_cache must have the same head size")
    if out_loc.dim() != 1 or not out_loc.is_contiguous():
        raise RuntimeError("out_loc must be a 1D contiguous tensor")
    if out_loc.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"out_loc must be of type int32 or int64, got: {out_loc.dtype}")
    # The kernels move 8-byte words; the op does not check this (a misaligned row would be a
    # sticky CUDA error that ends the process), so kvprof refuses it here instead.
    elem = k.element_size()
    if any(t.data_ptr() % 8 for t in (k_cache, v_cache, k, v)) or (elem * k.stride(-2)) % 8:
        raise RuntimeError("kvprof: rows must be 8-byte aligned for sgl-kernel's 8-byte copies")
    size_bytes = elem * k.shape[-1]
    if size_bytes % 256 == 0:
        kind, items = "256x1", size_bytes // 256
    elif size_bytes % 128 == 0:
        kind, items = "128x2", size_bytes // 128
    else:
        raise RuntimeError("The last dimension size bytes of k and v must be divisible by 128 at least, got: "
                           f"{size_bytes}")
    warps = THREADS // 32
    grid = (num_tokens + warps - 1) // warps
    args = (k_cache.data_ptr(), v_cache.data_ptr(), out_loc.data_ptr(), num_tokens, k.data_ptr(), v.data_ptr(),
            elem * k_cache.stride(-2) // 8, elem * k.stride(-2) // 8, items)
    return Launch((kind, "i32" if out_loc.dtype == torch.int32 else "i64"), grid, args)


class CudaDriver:
    """The few CUDA driver calls needed to load a cubin and launch from it (ctypes)."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        try:
            self._lib = ctypes.CDLL(library)
        except OSError as exc:
            raise RuntimeError(f"cannot load the CUDA driver ({library}): {exc}") from None
        lib = self._lib
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = ctypes.c_char_p()
            self._lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: {(name.value or b'CUDA error %d' % rc).decode()}")

    def load_functions(self, image: bytes, names: list[str]) -> list[int]:
        """Load ``image`` into the current context; the handles of ``names`` in it."""
        module = ctypes.c_void_p()
        self._check(self._lib.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData")
        out = []
        for name in names:
            fn = ctypes.c_void_p()
            self._check(self._lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                        f"cuModuleGetFunction({name[:40]}...)")
            if fn.value is None:  # a successful lookup gives a handle
                raise RuntimeError(f"cuModuleGetFunction({name[:40]}...) gave no function")
            out.append(fn.value)
        return out

    def launch(self, function: int, grid: int, block: int, stream: int, args: tuple[int, ...]) -> None:
        """All nine arguments are 8-byte values (pointers or size_t)."""
        values = (ctypes.c_uint64 * len(args))(*args)
        params = (ctypes.c_void_p * len(args))(*(ctypes.addressof(values) + 8 * i for i in range(len(args))))
        self._check(self._lib.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, stream, params, None),
                    "cuLaunchKernel")


class CubinStoreOp:
    """A stand-in for ``torch.ops.sgl_kernel.store_kv_cache`` with sgl-kernel's own kernels."""

    def __init__(self, cubin: StoreCubin, driver: Any = None) -> None:
        self.cubin = cubin
        self._driver = driver
        self._functions: dict[int, dict[tuple[str, str], int]] = {}  # by device index

    def _for_device(self, index: int) -> dict[tuple[str, str], int]:
        fns = self._functions.get(index)
        if fns is None:
            if self._driver is None:
                self._driver = CudaDriver()
            with torch.cuda.device(index):
                torch.empty(1, device=f"cuda:{index}")  # the runtime's primary context exists and is current
                keys = sorted(self.cubin.kernels)
                handles = self._driver.load_functions(self.cubin.image, [self.cubin.kernels[k] for k in keys])
            fns = self._functions[index] = dict(zip(keys, handles))
        return fns

    def prepare(self, device: torch.device) -> None:
        self._for_device(device.index if device.index is not None else torch.cuda.current_device())

    def __call__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, out_loc: torch.Tensor, k: torch.Tensor,
                 v: torch.Tensor) -> None:
        plan = plan_launch(k_cache, v_cache, out_loc, k, v)
        if plan.grid == 0:
            return
        index = k_cache.get_device()
        function = self._for_device(index)[plan.kernel]
        stream = torch.cuda.current_stream(index).cuda_stream
        self._driver.launch(function, plan.grid, THREADS, stream, plan.args)


class SglKernelCubinWriter(SglKernelWriter):
    """sgl-kernel's store kernels, from its wheel's cubin, behind SGLang's write semantics."""

    name = "sgl_kernel_cubin"
    description = ("sgl-kernel store_kv_cache's own kernels (cubin from the sgl_kernel wheel), launched by "
                   "kvprof through the CUDA driver; fallback to two index_put where the op would fail")
    fused = True
    devices = ("cuda",)

    def launches_pdl(self, device: torch.device) -> bool:
        """kvprof launches the cubin's kernels with ``cuLaunchKernel``: no launch attributes, no PDL."""
        return False

    def __init__(self, cubin: str | None = None, op: Any = None, devices: tuple[str, ...] | None = None) -> None:
        """``cubin``: the extracted cubin (default ``$KVPROF_SGL_CUBIN``); ``op``/``devices``:
        a stand-in op for tests, as for ``sgl_kernel``."""
        self.cubin: StoreCubin | None = None
        missing = None
        if op is None:
            op, missing = self._load(cubin)
        super().__init__(op=op, devices=devices, missing=missing)

    def _load(self, cubin: str | None) -> tuple[Any, str]:
        if not torch.cuda.is_available():
            return None, "sgl_kernel_cubin needs CUDA"
        path = Path(cubin) if cubin else default_cubin_path()
        if path is None:
            return None, ("no sgl-kernel cubin (run python -m kvprof.kvcache.writers.sgl_cubin_extract on a machine "
                           "with "
                          f"network, then set {ENV_CUBIN})")
        try:
            self.cubin = read_cubin(path)
            op = CubinStoreOp(self.cubin)
            op.prepare(torch.device("cuda", torch.cuda.current_device()))
        except (ValueError, RuntimeError) as exc:
            return None, f"sgl-kernel cubin unusable: {exc}"
        return op, ""

    def prepare(self, device: torch.device) -> None:
        if isinstance(self._op, CubinStoreOp) and device.type == "cuda":
            self._op.prepare(device)

    def source(self) -> dict[str, Any]:
        """Where the kernels come from, for manifests and bench results."""
        if self.cubin is None:
            return {}
        return {"cubin": self.cubin.path.name, "cubin_sha256": self.cubin.sha256,
                **{k: self.cubin.meta[k] for k in ("wheel", "wheel_sha256", "member") if k in self.cubin.meta}}
