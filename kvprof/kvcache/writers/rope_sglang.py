"""SGLang's own rope + K/V store kernels, called from an installed SGLang, as peers of kvprof's.

* ``sglang_rope_store``: ``sglang.kernels.ops.attention.rope.apply_rope_inplace_with_kvcache``,
  the CUDA kernel compiled at first use through apache-tvm-ffi that SGLang 0.5.23 runs for
  models that pass ``FusedSetKVBufferArg`` (its ``enable_fused_set_kv_buffer``: CUDA and a bf16
  pool). It rotates q and k in place and stores the rotated k and v in one launch, with the
  same arguments as SGLang's ``forward_cuda``: the cache rows viewed 2-D, slots and positions
  of one index dtype. Where SGLang does not fuse -- fp8 caches (no scale in that kernel),
  partial rotary or a V head size of its own (the kernel needs ``rope_dim == head_dim == v
  head_dim``), head sizes its kernel has no fused variant for -- it runs what SGLang runs
  instead: the rotary kernel alone (``apply_rope_inplace`` on the first ``rope_dim`` dims),
  then ``store_cache`` (:mod:`kvprof.kvcache.writers.sglang_store_cache`), reported as
  ``fallback: <why>``.
* ``sglang_triton_rope_cache``: SGLang's Triton ``fused_qk_rope_reshape_and_cache`` (the
  kernel SGLang's ROCm path fuses with), flash layout: the pool's rows are viewed as pages of
  one slot ``[rows, 1, Hk, D]``; ``q_out``/``k_out`` are q and k themselves, so they are
  rotated in place as the contract asks (each program reads its row before writing it). Its
  constraints are the kernel's asserts: a power-of-two head size, ``rope_dim == head_dim ==
  v head_dim``, Hq a multiple of Hk, and a cache of the input's dtype; it reads ``loc`` and
  ``positions`` with unit stride, so strided ones are copied first. The kernel leaves k of a
  token whose slot is negative unrotated (it rotates k only where it stores it).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import torch

from kvprof.core.vocab import FALLBACK_PREFIX, ROPE_FUSED
from kvprof.kvcache.contracts import RopeKVWriter, checked_impl
from kvprof.kvcache.dtypes import FP8_DTYPES

_SGLANG_JIT_DTYPES = (torch.bfloat16, torch.float16)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}"


def find_sglang_rope() -> tuple[Any, Any, str]:
    """(apply_rope_inplace_with_kvcache, apply_rope_inplace, "") from SGLang, or (None, None, why not)."""
    if not torch.cuda.is_available():
        return None, None, "SGLang's apply_rope_inplace_with_kvcache is a CUDA kernel (no CUDA device here)"
    try:
        from sglang.kernels.ops.attention.rope import apply_rope_inplace, apply_rope_inplace_with_kvcache
    except Exception as exc:  # noqa: BLE001 - ImportError, or SGLang's own import-time failures
        return None, None, f"SGLang's apply_rope_inplace_with_kvcache is not importable ({_first_line(exc)})"
    return apply_rope_inplace_with_kvcache, apply_rope_inplace, ""


def sglang_fuses(rope_dim: int, element_size: int) -> bool:
    """Whether SGLang's ``FusedRopeKernel`` (jit/csrc/elementwise/rope.cuh) has its fused store
    for this rotary size: ``kDimPerThread = gcd(16 / element size, rope_dim)`` elements per
    thread, ``kWorkThreads`` the smallest power of two with ``kWorkThreads * kDimPerThread >=
    rope_dim`` (at most its 128-thread block), fused when that product is exactly rope_dim."""
    per_thread = math.gcd(16 // element_size, rope_dim)
    threads = 1
    while threads * per_thread < rope_dim:
        threads *= 2
    return threads <= 128 and threads * per_thread == rope_dim


class SglangRopeStoreWriter(RopeKVWriter):
    """SGLang's JIT rope + store (one launch), or its rotary kernel then store_cache where SGLang does not fuse."""

    name = "sglang_rope_store"
    description = ("SGLang's apply_rope_inplace_with_kvcache JIT kernel (one launch: rope, K and V), "
                   "as SGLang's FusedSetKVBufferArg path calls it")
    fused = True
    rope_fused = True
    devices = ("cuda",)

    def __init__(self) -> None:
        self._fused_op, self._rope_op, self._missing = find_sglang_rope()
        self._store: Any = None  # SGLang's store_cache writer, for the unfused path (built when first needed)

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if self._fused_op is None:
            return self._missing
        reason = super().unsupported_reason(device, dtype, input_dtype)
        if reason:
            return reason
        if input_dtype is not None and input_dtype not in _SGLANG_JIT_DTYPES:
            return f"SGLang's rope kernels take bf16 or fp16 q/k, not {input_dtype}"
        if dtype not in _SGLANG_JIT_DTYPES:
            return self._store_writer().unsupported_reason(device, dtype, input_dtype)
        return None

    def prepare(self, device: torch.device) -> None:
        """Nothing per device: SGLang compiles the kernel per (style, rope_dim, dtypes) at its
        first call (outside any graph capture: capture's warm-up writes run eagerly first)."""

    def _store_writer(self) -> Any:
        if self._store is None:
            from kvprof.kvcache.writers.sglang_store_cache import SglangStoreCacheWriter

            self._store = SglangStoreCacheWriter()
        return self._store

    def unfused_reason(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope_dim: int,
                       dtype: torch.dtype) -> str | None:
        """Why SGLang would not fuse this write (None: it does)."""
        if dtype != k.dtype or k.dtype not in _SGLANG_JIT_DTYPES:
            return f"SGLang fuses rope and store only into a cache of k's dtype, not {k.dtype} into {dtype}"
        if q.element_size() != k.element_size():
            return f"SGLang's fused rope needs q and k of one element size, not {q.dtype} and {k.dtype}"
        dim = k.shape[-1]
        if rope_dim != dim or v.shape[-1] != dim:
            return (f"SGLang's fused rope + store needs rope_dim == head_dim == v head_dim, not "
                    f"{rope_dim}/{dim}/{v.shape[-1]}")
        if not q.stride(1) == k.stride(1) == v.stride(1) == dim:
            return (f"SGLang's fused rope + store needs q, k and v rows head_dim apart, not "
                    f"{q.stride(1)}/{k.stride(1)}/{v.stride(1)}")
        if not sglang_fuses(rope_dim, k.element_size()):
            return f"SGLang's fused rope + store has no variant for rope_dim {rope_dim} in {k.dtype}"
        return None

    def write(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,  # type: ignore[override]
              k_scale=None, v_scale=None) -> str:
        if self._fused_op is None:
            raise RuntimeError(self._missing)
        rope_dim = cos_sin_cache.shape[-1]
        why = self.unfused_reason(q, k, v, rope_dim, dtype)
        if why is None:
            rows = k_buf.shape[0]
            # the kernel reads slots and positions contiguous and of one index type (SGLang's: both int64)
            pos = positions if positions.dtype == loc.dtype else positions.to(loc.dtype)
            self._fused_op(q, k, v, k_buf.view(rows, -1), v_buf.view(rows, -1), cos_sin_cache, pos.contiguous(),
                           loc.contiguous(), is_neox=is_neox, rope_dim=rope_dim)
            return ROPE_FUSED
        # what SGLang runs without the fusion: its rotary kernel, then set_kv_buffer's store_cache
        self._rope_op(q[..., :rope_dim], k[..., :rope_dim], cos_sin_cache, positions, is_neox=is_neox,
                      rope_dim=rope_dim)
        from kvprof.kvcache.validation import check_buffers_inputs

        # the store's rows, as the pool passes them
        loc, cache_k, cache_v = check_buffers_inputs(k_buf, v_buf, loc, k, v)
        store_path = checked_impl(self._store_writer())(k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale, v_scale)
        return f"{FALLBACK_PREFIX} {why}; SGLang's rotary kernel, then store_cache ({store_path})"


_TRITON_MODULE = "sglang.kernels.ops.attention.fused_qk_rope_reshape_and_cache"


def find_sglang_triton_rope() -> tuple[Any, Any, str]:
    """(fused_qk_rope_reshape_and_cache, its Triton kernel, "") from SGLang, or (None, None, why not).

    SGLang's module imports only torch and triton, while ``import sglang`` takes seconds and
    patches transformers: unless SGLang is imported already, the installed file is loaded on
    its own (the same code); a file that needs more of SGLang is imported the usual way."""
    module = sys.modules.get(_TRITON_MODULE)
    if module is None:
        try:
            spec = importlib.util.find_spec("sglang")
            folders = list(spec.submodule_search_locations or []) if spec else []
            if not folders:
                return None, None, ("SGLang's fused_qk_rope_reshape_and_cache is not importable (SGLang is not "
                                    "installed)")
            path = Path(folders[0], *_TRITON_MODULE.split(".")[1:]).with_suffix(".py")
            name = "kvprof_sglang_" + path.stem
            module = sys.modules.get(name)
            if module is None:
                file_spec = importlib.util.spec_from_file_location(name, path)
                if file_spec is None or file_spec.loader is None:
                    raise ImportError(f"no {path}")
                module = importlib.util.module_from_spec(file_spec)
                file_spec.loader.exec_module(module)
                sys.modules[name] = module
        except Exception:  # noqa: BLE001 - the file needs more of SGLang: import it as SGLang does
            try:
                module = importlib.import_module(_TRITON_MODULE)
            except Exception as exc:  # noqa: BLE001 - ImportError (no triton), or SGLang's import-time failures
                return None, None, f"SGLang's fused_qk_rope_reshape_and_cache is not importable ({_first_line(exc)})"
    return module.fused_qk_rope_reshape_and_cache, module._fused_qk_rope_reshape_and_cache_kernel, ""


class SglangTritonRopeCacheWriter(RopeKVWriter):
    """SGLang's Triton fused_qk_rope_reshape_and_cache: rope of q and k and the K/V store in one launch."""

    name = "sglang_triton_rope_cache"
    description = "SGLang's Triton fused_qk_rope_reshape_and_cache (one launch: rope, K and V), flash layout"
    fused = True
    rope_fused = True
    devices = ("cpu", "cuda")

    def __init__(self) -> None:
        self._op, self._kernel, self._missing = find_sglang_triton_rope()

    def _interpreted(self) -> bool:
        from triton.runtime.interpreter import InterpretedFunction

        return isinstance(self._kernel, InterpretedFunction)

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if self._op is None:
            return self._missing
        reason = super().unsupported_reason(device, dtype, input_dtype)
        if reason:
            return reason
        from kvprof.kvcache.writers.fp8_jit import placement_reason

        reason = placement_reason(self.name, "sglang.kernels.ops.attention.fused_qk_rope_reshape_and_cache",
                                  self._interpreted(), device, None)
        if reason:
            return reason
        if dtype in FP8_DTYPES:
            return (f"{self.name} stores fp8 only with SGLang's own scale rounding (rotated k straight to fp8, not "
                    "through k's dtype) and SGLang runs it so only on ROCm; kvprof runs it for caches of k's dtype")
        if input_dtype is not None and dtype != input_dtype:
            return f"{self.name} stores into a cache of k's dtype ({input_dtype}), not {dtype}"
        if device.type == "cpu" and dtype == torch.bfloat16:
            return (f"{self.name} on CPU runs in Triton's interpreter, whose bf16 arithmetic is wrong in this kernel "
                    "(negation and products of bf16 values); bf16 runs on CUDA")
        return None

    @staticmethod
    def shape_reason(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                     cos_sin_cache: torch.Tensor, is_neox: bool) -> str | None:
        """Why the kernel cannot take these shapes (its asserts, and q returned as a 2-D view), or None."""
        _, hq, dim = q.shape
        hk, v_dim = k.shape[1], v.shape[-1]
        rope_dim = cos_sin_cache.shape[-1]
        if rope_dim != dim or v_dim != dim or dim & (dim - 1) or hq % hk:
            return (f"sglang_triton_rope_cache needs rope_dim == head_dim == v head_dim, a power of two, and Hq a "
                    f"multiple of Hk; got rope_dim {rope_dim}, head_dim {dim}, v {v_dim}, Hq {hq}, Hk {hk}")
        if q.stride(2) != 1 or q.stride(1) != dim:
            return (f"sglang_triton_rope_cache returns q viewed [tokens, Hq * head_dim]: q's heads must be adjacent, "
                    f"got strides {tuple(q.stride())}")
        return None

    def write(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,  # type: ignore[override]
              k_scale=None, v_scale=None) -> str:
        if self._op is None:
            raise RuntimeError(self._missing)
        if dtype != k.dtype or k_buf.dtype != k.dtype:
            raise ValueError(f"{self.name} stores into a cache of k's dtype, not {k.dtype} into {dtype}")
        why = self.shape_reason(q, k, v, k_buf, v_buf, cos_sin_cache, is_neox)
        if why:
            raise ValueError(why)
        if not q.shape[0]:
            return ROPE_FUSED
        rows, hk, dim = k_buf.shape[0], k.shape[1], k.shape[2]
        self._op(q, k, v, k_buf.view(rows, 1, hk, dim), v_buf.view(rows, 1, hk, v.shape[-1]), loc.contiguous(),
                 positions.contiguous(), cos_sin_cache, None, None, is_neox, flash_layout=True, apply_scale=False,
                 q_out=q, k_out=k, output_zeros=False)
        return ROPE_FUSED


__all__ = ["SglangRopeStoreWriter", "SglangTritonRopeCacheWriter", "find_sglang_rope", "find_sglang_triton_rope",
           "sglang_fuses"]
