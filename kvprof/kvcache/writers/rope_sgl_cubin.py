"""sgl-kernel's own rope + K/V store kernel, run from the cubin inside sgl-kernel's wheel.

sgl-kernel's ``apply_rope_with_cos_sin_cache_inplace(..., fused_set_kv_buffer_arg=...)`` (the
op ``apply_rope_pos_ids_cos_sin_cache``) rotates q and k in place and stores the rotated k and v
at ``cache_loc`` with FlashInfer-derived kernels, ``BatchQKApplyRotaryPosIdsCosSinCacheEnhanced
[HeadParallelism]Kernel<save_kv_cache, interleave, head_dim, vec_size, bdx, DType, int64>``
(``csrc/elementwise/pos_enc.cuh``). Like ``sgl_kernel_cubin`` for the store, this module takes
that machine code from the published wheel (``python -m kvprof.kvcache.writers.sgl_cubin_extract``
writes ``sgl_rope.sm_90.cubin`` beside the store's), loads it through the CUDA driver (ctypes:
no compiler, no sgl-kernel import) and launches it as the op's host code does, for sgl-kernel
0.3.21:

* ``vec_size = max(16 / sizeof(DType), head_dim / 32)``, ``bdx = head_dim / vec_size`` threads
  per head row, ``max(128, bdx)`` threads per block, ``bdy`` tokens per block;
* the token-parallel kernel when ``ceil(tokens / bdy)`` blocks fill the device (its occupancy
  times the SM count), else the head-parallel kernel with one block row per q and kv head;
* ``cudaLaunchKernelEx`` with programmatic stream serialization set to ``enable_pdl``, which
  sgl-kernel's Python turns on for the fused call on sm_90+ (the kernels hold
  ``griddepcontrol.wait``/``launch_dependents``);
* q and k are their own outputs (``q_rope = q``, ``k_rope = k``), positions are read as int64
  (``positions.long()``), slots must be int64 (the op asserts it: kvprof converts int32 slots
  first, one more kernel, said in ``description``).

The kernels store k and v in q's dtype (no fp8, no scale: the op asserts ``k_scale is None``),
need v rows of k's head size, rows on 16-byte boundaries, and a rotary size split evenly over
the threads. So the device time of ``sgl_kernel_rope_cubin`` is sgl-kernel's own machine code;
its host path is kvprof's ctypes call, not the op's dispatcher.
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

from kvprof.core.vocab import ROPE_FUSED
from kvprof.kvcache.contracts import RopeKVWriter
from kvprof.kvcache.writers.sgl_cubin import ENV_CUBIN, CudaDriver

ENV_ROPE_CUBIN = "KVPROF_SGL_ROPE_CUBIN"
ROPE_CUBIN_NAME = "sgl_rope.sm_90.cubin"
_DTYPES = {"13__nv_bfloat16": torch.bfloat16, "6__half": torch.float16, "f": torch.float32}
# The save_kv_cache=true instances, int64 ids, with the 0.3.21 parameter list (7 DType*, float*,
# int64*, 4 x uint32, 14 x size_t, int64*). Another signature is not launched blind.
_KERNEL = re.compile(
    rb"\x00(_ZN10flashinfer(?:49|64)BatchQKApplyRotaryPosIdsCosSinCacheEnhanced(Kernel|HeadParallelismKernel)"
    rb"ILb1ELb([01])ELj(\d+)ELj(\d+)ELj(\d+)E(13__nv_bfloat16|6__half|f)lEEvPT4_"
    rb"(?:S3_S3_S3_S3_S3_S3_PfPT5_jjjjmmmmmmmmmmmmmmS6_|S2_S2_S2_S2_S2_S2_PfPT5_jjjjmmmmmmmmmmmmmmS5_))(?=\x00)")
_PDL_ATTRIBUTE = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


@dataclass(frozen=True)
class RopeKernels:
    """One (interleave, head_dim, dtype) instance: its two kernels and launch shape."""

    token_parallel: str
    head_parallel: str
    vec_size: int
    bdx: int


@dataclass(frozen=True)
class RopeCubin:
    path: Path
    image: bytes
    kernels: dict[tuple[bool, int, torch.dtype], RopeKernels]  # (interleave, head_dim, dtype)
    meta: dict[str, Any]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.image).hexdigest()


def launch_shape(head_dim: int, element_size: int) -> tuple[int, int]:
    """(vec_size, bdx) as the op's host code computes them."""
    vec_size = max(16 // element_size, head_dim // 32)
    return vec_size, head_dim // vec_size


def read_rope_cubin(path: str | Path) -> RopeCubin:
    """The cubin at ``path`` and its rope + store kernels; ValueError (one line) if it has none."""
    path = Path(path)
    try:
        image = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read sgl-kernel rope cubin {path}: {exc.strerror or exc}") from None
    if image[:4] != b"\x7fELF":
        raise ValueError(f"{path} is not a cubin (no ELF header)")
    found: dict[tuple[bool, int, torch.dtype], dict[str, Any]] = {}
    for m in _KERNEL.finditer(image):
        kind, interleave, head_dim, vec, bdx, dtype_code = (x.decode() for x in m.groups()[1:])
        dtype = _DTYPES[dtype_code]
        if (int(vec), int(bdx)) != launch_shape(int(head_dim), dtype.itemsize):
            continue  # compiled with another launch shape than the host code kvprof follows
        entry = found.setdefault((interleave == "1", int(head_dim), dtype), {"vec": int(vec), "bdx": int(bdx)})
        entry[kind] = m.group(1).decode()
    kernels = {key: RopeKernels(e["Kernel"], e["HeadParallelismKernel"], e["vec"], e["bdx"])
               for key, e in found.items() if "Kernel" in e and "HeadParallelismKernel" in e}
    if not kernels:
        raise ValueError(f"{path} lacks sgl-kernel's BatchQKApplyRotaryPosIdsCosSinCacheEnhanced kernels "
                         "(with the known signature)")
    meta_path = path.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return RopeCubin(path, image, kernels, meta)


def default_rope_cubin_path() -> Path | None:
    """``$KVPROF_SGL_ROPE_CUBIN``, else beside ``$KVPROF_SGL_CUBIN``, else ``~/.cache/kvprof/sgl/``."""
    env = os.environ.get(ENV_ROPE_CUBIN)
    if env:
        return Path(env)
    for folder in ([Path(os.environ[ENV_CUBIN]).parent] if os.environ.get(ENV_CUBIN) else []) + [
            Path.home() / ".cache" / "kvprof" / "sgl"]:
        if (folder / ROPE_CUBIN_NAME).is_file():
            return folder / ROPE_CUBIN_NAME
    return None


@dataclass(frozen=True)
class RopeLaunch:
    """The op's decisions for one call, before the occupancy test that picks the kernel."""

    key: tuple[bool, int, torch.dtype]
    block: tuple[int, int]  # (bdx, bdy)
    blocks_x: int  # token blocks
    heads: int  # q heads + kv heads (the head-parallel grid's y)
    args: tuple[ctypes._SimpleCData, ...]  # the 28 kernel arguments, typed


def plan_rope_launch(cubin: RopeCubin, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor,
                     v_buf: torch.Tensor, loc: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor,
                     is_neox: bool, *, need_cuda: bool = True) -> RopeLaunch:
    """The op's checks and arguments (``apply_rope_pos_ids_cos_sin_cache``, save_kv_cache), and
    the ones kvprof adds where the op would read or write out of bounds; RuntimeError (one line)
    where either refuses. ``loc`` must be int64 and ``positions`` int64, both contiguous (the
    writer converts). ``need_cuda=False`` lets tests check the decisions on CPU tensors."""
    tensors = (q, k, v, k_buf, v_buf, loc, positions, cos_sin)
    if need_cuda and not all(t.is_cuda for t in tensors):
        raise RuntimeError("sgl_kernel_rope_cubin: all tensors must be CUDA tensors")
    if any(t.dim() != 3 for t in (q, k, v, k_buf, v_buf)):
        raise RuntimeError("sgl_kernel_rope_cubin: q, k, v and the cache rows must be [n, heads, head_dim]")
    if any(t.stride(-1) != 1 for t in (q, k, v, k_buf, v_buf)):
        raise RuntimeError("sgl_kernel_rope_cubin: q, k, v and the caches must be contiguous in their last dim")
    if loc.dtype != torch.int64 or positions.dtype != torch.int64 or not (loc.is_contiguous() and
                                                                          positions.is_contiguous()):
        raise RuntimeError("sgl_kernel_rope_cubin: slots and positions must be contiguous int64")
    if cos_sin.dtype != torch.float32 or cos_sin.dim() != 2 or not cos_sin.is_contiguous():
        raise RuntimeError("sgl_kernel_rope_cubin: cos_sin_cache must be a contiguous float32 [max_position, rope_dim]")
    tokens, hq, dim = q.shape
    hk = k.shape[1]
    dtype = q.dtype
    if k.shape[0] != tokens or k.shape[2] != dim or v.shape[0] != tokens or loc.shape[0] != tokens or \
            positions.shape[0] != tokens:
        raise RuntimeError("sgl_kernel_rope_cubin: q, k, v, slots and positions differ in tokens or head size")
    if any(t.dtype != dtype for t in (k, v, k_buf, v_buf)):
        raise RuntimeError(f"sgl_kernel_rope_cubin: k, v and the caches must be q's dtype ({dtype}): the kernel "
                           "stores them as it reads them, no conversion")
    if v.shape[1:] != k.shape[1:] or tuple(k_buf.shape[1:]) != (hk, dim) or tuple(v_buf.shape[1:]) != (hk, dim):
        raise RuntimeError("sgl_kernel_rope_cubin: v and the cache rows must have k's heads and head size")
    interleave = not is_neox
    key = (interleave, dim, dtype)
    found = cubin.kernels.get(key)
    if found is None:
        raise RuntimeError(f"sgl_kernel_rope_cubin: sgl-kernel has no kernel for head_dim {dim}, {dtype}, "
                           f"{'GPT-J' if interleave else 'NeoX'}")
    rope_dim = cos_sin.shape[1]
    per = found.vec_size if interleave else 2 * found.vec_size
    if rope_dim > dim or rope_dim % per:
        raise RuntimeError(f"sgl_kernel_rope_cubin: rope_dim {rope_dim} must be at most head_dim and a multiple "
                           f"of {per} (the op's threads each rotate {found.vec_size} dims)")
    esize = q.element_size()
    row_tensors = (q, k, v, k_buf, v_buf)
    if any(t.data_ptr() % 16 for t in (*row_tensors, cos_sin)) or any(
            (s * esize) % 16 for t in row_tensors for s in t.stride()[:2]):
        raise RuntimeError("sgl_kernel_rope_cubin: rows must start on 16-byte boundaries (the kernel's vector loads)")
    bdy = max(128, found.bdx) // found.bdx
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    ptr = [u64(t.data_ptr()) for t in (q, k, v, q, k, k_buf, v_buf, cos_sin, positions)]
    sizes = [u32(tokens), u32(hq), u32(hk), u32(rope_dim)]
    strides = [u64(s) for t in (q, k, v, q, k, k_buf, v_buf) for s in t.stride()[:2]]
    args = (*ptr, *sizes, *strides, u64(loc.data_ptr()))
    return RopeLaunch(key, (found.bdx, bdy), (tokens + bdy - 1) // bdy, hq + hk, args)


class _AttrValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("value", ctypes.c_int)]


class _LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttrValue)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


class RopeDriver(CudaDriver):
    """The store's driver calls, plus occupancy and ``cuLaunchKernelEx`` (2-D grids and
    blocks, typed arguments, programmatic stream serialization)."""

    def __init__(self, library: str = "libcuda.so.1") -> None:
        super().__init__(library)
        lib = self._lib
        lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [
            ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                         ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]

    def blocks_per_sm(self, function: int, threads: int) -> int:
        n = ctypes.c_int()
        self._check(self._lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), function, threads, 0),
                    "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return n.value

    def launch_ex(self, function: int, grid: tuple[int, int], block: tuple[int, int], stream: int,
                  args: tuple[ctypes._SimpleCData, ...], pdl: bool) -> None:
        attr = _LaunchAttribute(_PDL_ATTRIBUTE, b"", _AttrValue())
        attr.value.value = int(pdl)
        cfg = _LaunchConfig(grid[0], grid[1], 1, block[0], block[1], 1, 0, stream, ctypes.pointer(attr), 1)
        params = (ctypes.c_void_p * len(args))(*(ctypes.addressof(a) for a in args))
        self._check(self._lib.cuLaunchKernelEx(ctypes.byref(cfg), function, params, None), "cuLaunchKernelEx")


class CubinRopeOp:
    """sgl-kernel's fused rope + store, launched from its cubin as the op's host code does."""

    def __init__(self, cubin: RopeCubin, pdl: bool | None = None, driver: Any = None) -> None:
        self.cubin, self.pdl = cubin, pdl
        self._driver = driver
        self._functions: dict[int, dict[str, int]] = {}
        self._occupancy: dict[tuple[int, str], int] = {}
        self._sms: dict[int, tuple[int, bool]] = {}

    def _for_device(self, index: int) -> dict[str, int]:
        fns = self._functions.get(index)
        if fns is None:
            if self._driver is None:
                self._driver = RopeDriver()
            with torch.cuda.device(index):
                torch.empty(1, device=f"cuda:{index}")  # the runtime's primary context exists and is current
                names = sorted({n for k in self.cubin.kernels.values() for n in (k.token_parallel, k.head_parallel)})
                fns = self._functions[index] = dict(zip(names, self._driver.load_functions(self.cubin.image, names)))
            props = torch.cuda.get_device_properties(index)
            self._sms[index] = (props.multi_processor_count, props.major >= 9)
        return fns

    def prepare(self, device: torch.device) -> None:
        self._for_device(device.index if device.index is not None else torch.cuda.current_device())

    def launches_pdl(self, index: int) -> bool:
        """Whether ``__call__`` on device ``index`` launches with PDL: sm_90+ with ``pdl=None``, else as forced."""
        self._for_device(index)
        return self._sms[index][1] if self.pdl is None else bool(self.pdl)

    def __call__(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin, is_neox: bool) -> None:
        plan = plan_rope_launch(self.cubin, q, k, v, k_buf, v_buf, loc, positions, cos_sin, is_neox)
        if plan.blocks_x == 0:
            return
        index = q.get_device()
        fns = self._for_device(index)
        kernels = self.cubin.kernels[plan.key]
        threads = plan.block[0] * plan.block[1]
        key = (index, kernels.token_parallel)
        if key not in self._occupancy:
            self._occupancy[key] = self._driver.blocks_per_sm(fns[kernels.token_parallel], threads)
        sms, pdl_capable = self._sms[index]
        if plan.blocks_x >= self._occupancy[key] * sms:
            function, grid = fns[kernels.token_parallel], (plan.blocks_x, 1)
        else:
            function, grid = fns[kernels.head_parallel], (plan.blocks_x, plan.heads)
        pdl = pdl_capable if self.pdl is None else self.pdl
        self._driver.launch_ex(function, grid, plan.block, torch.cuda.current_stream(index).cuda_stream, plan.args,
                               pdl)


class SglKernelRopeCubinWriter(RopeKVWriter):
    """sgl-kernel's rope + K/V store (FusedSetKVBufferArg), its own kernels from its wheel's cubin."""

    name = "sgl_kernel_rope_cubin"
    description = ("sgl-kernel apply_rope_with_cos_sin_cache_inplace + fused set-KV's own kernels (cubin from "
                   "the sgl_kernel wheel), launched by kvprof through the CUDA driver; int32 slots converted first")
    fused = True
    rope_fused = True
    devices = ("cuda",)

    def __init__(self, cubin: str | None = None, pdl: bool | None = None) -> None:
        """``cubin``: the extracted cubin (default :func:`default_rope_cubin_path`); ``pdl``:
        programmatic dependent launch, None as sgl-kernel (on for sm_90+)."""
        self.cubin: RopeCubin | None = None
        self._op: CubinRopeOp | None = None
        self._missing = ""
        if not torch.cuda.is_available():
            self._missing = "sgl_kernel_rope_cubin needs CUDA"
            return
        path = Path(cubin) if cubin else default_rope_cubin_path()
        if path is None:
            self._missing = ("no sgl-kernel rope cubin (run python -m kvprof.kvcache.writers.sgl_cubin_extract on a "
                             "machine "
                             f"with network, then set {ENV_ROPE_CUBIN} or {ENV_CUBIN})")
            return
        try:
            self.cubin = read_rope_cubin(path)
            self._op = CubinRopeOp(self.cubin, pdl)
            self._op.prepare(torch.device("cuda", torch.cuda.current_device()))
        except (ValueError, RuntimeError) as exc:
            self._missing = f"sgl-kernel rope cubin unusable: {exc}"
            self._op = None

    def launches_pdl(self, device: torch.device) -> bool:
        """kvprof launches the kernels with PDL as sgl-kernel does: on sm_90+ (``pdl=None``), or as forced."""
        if self._op is None or device.type != "cuda":
            return False
        return self._op.launches_pdl(device.index if device.index is not None else torch.cuda.current_device())

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if self._op is None:
            return self._missing
        reason = super().unsupported_reason(device, dtype, input_dtype)
        if reason:
            return reason
        if input_dtype is not None and dtype != input_dtype:
            return (f"sgl-kernel's fused rope stores k and v as they come ({input_dtype}), not into {dtype} "
                    "(no fp8, no scale)")
        if self.cubin is not None and not any(key[2] == dtype for key in self.cubin.kernels):
            return f"sgl-kernel's rope cubin has no {dtype} kernels"
        return None

    def prepare(self, device: torch.device) -> None:
        if self._op is not None and device.type == "cuda":
            self._op.prepare(device)

    def source(self) -> dict[str, Any]:
        """Where the kernels come from, for manifests and bench results."""
        if self.cubin is None:
            return {}
        return {"cubin": self.cubin.path.name, "cubin_sha256": self.cubin.sha256,
                **{k: self.cubin.meta[k] for k in ("wheel", "wheel_sha256", "member") if k in self.cubin.meta}}

    def shape_reason(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor,
                     v_buf: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool) -> str | None:
        """Why sgl-kernel's op (or kvprof, where the op would go out of bounds) refuses these
        shapes, strides or dtypes; None when it takes them."""
        if self.cubin is None:
            return self._missing
        index = torch.zeros(q.shape[0], dtype=torch.int64)
        try:
            plan_rope_launch(self.cubin, q, k, v, k_buf, v_buf, index, index, cos_sin_cache, is_neox, need_cuda=False)
        except RuntimeError as exc:
            return str(exc)
        return None

    def write(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,  # type: ignore[override]
              k_scale=None, v_scale=None) -> str:
        if self._op is None:
            raise RuntimeError(self._missing)
        if dtype != k_buf.dtype or k_scale is not None or v_scale is not None:
            raise ValueError(f"{self.name} stores k and v unconverted: a cache of their dtype, no scales")
        # sgl-kernel's Python: positions.long(); its op asserts int64 slots (SGLang's are int64)
        loc = loc if loc.dtype == torch.int64 and loc.is_contiguous() else loc.long().contiguous()
        positions = positions.long().contiguous()
        self._op(q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox)
        return ROPE_FUSED


__all__ = ["CubinRopeOp", "ENV_ROPE_CUBIN", "ROPE_CUBIN_NAME", "RopeCubin", "SglKernelRopeCubinWriter",
           "default_rope_cubin_path", "launch_shape", "plan_rope_launch", "read_rope_cubin"]
