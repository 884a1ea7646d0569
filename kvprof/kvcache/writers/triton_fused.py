"""kvprof's own fused K+V write in Triton: one launch stores both rows for every token,
converting the dtype in the same kernel, bitwise PyTorch's reference
(:func:`kvprof.kvcache.dtypes.convert_for_cache`) for every non-NaN input.

The parts: the kernel and its inline PTX (:mod:`kvprof.kvcache.writers.triton_kernel`), the
rounding (:mod:`kvprof.kvcache.writers.triton_convert`), the launch shapes
(:mod:`kvprof.kvcache.writers.triton_tables`); this module decides, per call, which compile-time
flags and launch shape a write takes. On a GPU (sm_90+) it launches with programmatic
dependent launch by default, so back-to-back writes overlap one launch with the previous
kernel's tail (the latency floor of a write of a few tokens; docs/benchmarks.md). On CPU
the kernel runs under Triton's interpreter (``TRITON_INTERPRET=1`` when this is imported;
``kvprof capture`` sets it on a CPU when the environment does not say), with its own
launch shape (:func:`kvprof.kvcache.writers.triton_tables.interpreted_config`).
"""

from __future__ import annotations

from typing import Any

import torch

from kvprof.kvcache import signature
from kvprof.kvcache.contracts import FUSED, KVWriter, WriterInfo
from kvprof.kvcache.signature import keep
from kvprof.kvcache.writers import triton_kernel as kernel
from kvprof.kvcache.writers.card_tables import device_card
from kvprof.kvcache.writers.fp8_jit import placement_reason, uses_pdl
from kvprof.kvcache.writers.triton_convert import (
    FP8_DTYPES,
    INSTALL_HINT,
    INT32_MAX,
    KINDS,
    e4m3_saturates,
    next_pow2,
    scaled_launch,
    triton,
    triton_missing,
)
from kvprof.kvcache.writers.triton_kernel import (
    KERNEL_NAME,
    MODE_FP8_INT,
    MODE_K_SCALED,
    MODE_PACKED,
    MODE_POW2,
    MODE_STREAM,
    MODE_V_SCALED,
    MODE_WIDE,
)
from kvprof.kvcache.writers.triton_launch import launcher_for
from kvprof.kvcache.writers.triton_tables import (
    TRITON_TABLE,
    TRITON_TABLE_FP8,
    Table,
    TritonConfig,
    interpreted_config,
    pick_config,
    store_tables,
)


class TritonFusedWriter(KVWriter):
    """One Triton launch writes K and V rows at ``loc``, converting dtype in the kernel."""

    name = "triton_fused"
    kernel_name = KERNEL_NAME
    description = "kvprof's fused Triton store: one launch for K and V, dtype conversion in-kernel"
    fused = True
    devices = ("cpu", "cuda")

    def __init__(self, config: TritonConfig | dict[str, int | bool] | None = None, convert: str = "auto",
                 pdl: bool | None = None, packed_fp8: bool = True) -> None:
        """``config`` forces one launch shape (tuning); ``convert`` is 'auto', 'hw' or 'int'
        (the integer emulation of torch's rounding also runs on a GPU, for comparison);
        ``pdl``: programmatic dependent launch. None (default) turns it on where it exists
        (compiled kernel, sm_90+): back-to-back small writes then overlap one kernel's launch
        with the previous one's tail (docs/benchmarks.md). The kernel waits (griddepcontrol.wait)
        before its first load, so it never reads what the previous kernel is still writing. ``packed_fp8=False``
        keeps Triton's own per-element fp8 fix-up instead of the packed one (to compare)."""
        if isinstance(config, dict):
            config = TritonConfig(int(config["block_t"]), int(config["num_warps"]), int(config.get("split", 1)),
                                  bool(config.get("stream", False)))
        if convert not in ("auto", "hw", "int"):
            raise ValueError(f"convert must be 'auto', 'hw' or 'int', got {convert!r}")
        self.config = config
        self.convert = convert
        self.pdl = pdl
        self.packed_fp8 = bool(packed_fp8)
        self._plans: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._calls: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # a call's tokens, buffers, dtypes -> its launch
        # the tensors' C++ signature and the other arguments -> ((constexprs, their power-of-two variant,
        # scaled, the ints after the scales), the kept launches by constexprs)
        self._signed: dict[tuple[Any, ...], tuple[tuple[Any, ...], dict[Any, Any]]] = {}

    def launches_pdl(self, device: torch.device) -> bool:
        """PDL where the compiled kernel runs on sm_90+ (``pdl=None``), or as forced."""
        return triton is not None and uses_pdl(self.pdl, device, compiled=not kernel.interpreted())

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        reason = super().unsupported_reason(device, dtype, input_dtype)
        if reason:
            return reason
        if triton is None:
            return triton_missing()
        placement = placement_reason("triton_fused", __name__, kernel.interpreted(), device, self.pdl)
        if placement:
            return placement
        for d in (dtype, input_dtype):
            if d is not None and d not in KINDS:
                return f"triton_fused has no conversion for {d}"
        return None

    def _plan(self, k_buf: torch.Tensor, v_buf: torch.Tensor, in_dtype: torch.dtype, dtype: torch.dtype,
              key: tuple[Any, ...]) -> tuple[Any, ...]:
        """Everything that depends only on the buffers and dtypes, computed once."""
        if not (k_buf.is_contiguous() and v_buf.is_contiguous()):
            raise ValueError("triton_fused needs contiguous K/V cache buffers")
        if dtype not in KINDS or in_dtype not in KINDS:
            raise ValueError(f"triton_fused has no conversion from {in_dtype} to {dtype}")
        rows = k_buf.shape[0]
        rk = k_buf[0].numel()
        rv = v_buf[0].numel()
        in_size = torch.empty((), dtype=in_dtype).element_size()
        interpreted = kernel.interpreted()
        compiled = k_buf.is_cuda and not interpreted
        hw = {"hw": True, "int": False}.get(self.convert, compiled)
        pdl = self.pdl
        if pdl is None:
            pdl = compiled and torch.cuda.get_device_capability(k_buf.device)[0] >= 9
        same = in_dtype == dtype
        base = kernel.mode_bits(KINDS[in_dtype], KINDS[dtype], False, False, hw, e4m3_saturates(), False, bool(pdl))
        # fp8 inputs (converted): always the integer routines; fp8 outputs: the hardware cast
        # where the layout is known-good (see triton_kernel.fp8_cast_safe), decided per call
        if hw and not same and in_dtype in FP8_DTYPES:
            base |= MODE_FP8_INT
        fp8_hw = hw and not same and in_dtype not in FP8_DTYPES and dtype in FP8_DTYPES
        if self.packed_fp8 and kernel.packed_e4m3(hw, in_dtype, dtype):
            base |= MODE_PACKED  # ignored where a launch takes FP8_INT
        pow2_ok = not same and in_dtype in (torch.bfloat16, torch.float32) and dtype in FP8_DTYPES
        # the launch table of this card's row (kvprof.kvcache.writers.card_tables), or its fallback
        tables = store_tables(device_card(k_buf.device)[0]) if compiled else None
        plan = (rows, rk, rv, next_pow2(rk), next_pow2(rv), (rk + rv) * in_size, base, same,
                bool(pdl), fp8_hw, pow2_ok, dtype in FP8_DTYPES, interpreted, tables)
        self._plans[key] = plan
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
        signed = None
        if signature.SIGNATURE is not None:  # the launcher's C++ helper: one call reads the five tensors
            signed = signature.SIGNATURE(k_buf, v_buf, loc, cache_k, cache_v)
            if signed is not None:
                hit = self._signed.get((signed[0], dtype, k_scale is None, v_scale is None))
                if hit is not None:
                    (consts, pow2_consts, scaled, tail), kept = hit
                    k_inv = v_inv = 1.0
                    if scaled:
                        k_inv, v_inv, consts = scaled_launch(k_scale, v_scale, consts, pow2_consts)
                    launch = kept.get(consts)
                    if launch is not None and launch(kernel.store_kv_kernel, (*signed[1], k_inv, v_inv, *tail,
                                                                              *consts)):
                        return FUSED
        tokens = loc.shape[0]
        if tokens == 0:
            return FUSED
        call = self._calls.get((tokens, k_buf.shape, v_buf.shape, k_buf.get_device(), cache_k.dtype, dtype,
                                k_scale is None, v_scale is None))
        if call is None:
            call = self._call_plan(tokens, k_buf, v_buf, cache_k.dtype, dtype, k_scale is None, v_scale is None)
        rows, rk, rv, grid, consts, pow2_consts, scaled, num_warps, pdl, stride_mode, fixed = call
        in_k, in_v = cache_k, cache_v
        cache_k, k_stride = _rows(cache_k, rk)
        cache_v, v_stride = _rows(cache_v, rv)
        k_inv = v_inv = 1.0
        if scaled:
            k_inv, v_inv, consts = scaled_launch(k_scale, v_scale, consts, pow2_consts)
        if k_stride != rk or v_stride != rv:  # rows not packed: the bits that depend on the token strides
            plan, block_t, split, unpacked = stride_mode
            consts = consts[:-1] + (unpacked | (consts[-1] & MODE_POW2) | _stride_bits(
                plan, tokens, block_t, num_warps, split, k_stride, v_stride),)
            fixed = (rows, k_stride, v_stride)
        # the cache's rows and the token strides: fixed for a model, keyed by value
        launcher = launcher_for(kernel.store_kv_kernel, KERNEL_NAME)
        args = (k_buf, v_buf, loc, cache_k, cache_v, k_inv, v_inv, tokens)
        if signed is None or cache_k is not in_k or cache_v is not in_v:  # rows copied: not the tensors signed
            launcher.launch(grid, args, consts, num_warps, pdl, True, fixed)
            return FUSED
        found = launcher.launch_signed(grid, args, consts, num_warps, pdl, True, fixed, kernel.store_kv_kernel)
        key = (signed[0], dtype, k_scale is None, v_scale is None)
        hit = self._signed.get(key)
        if hit is None:  # this signature's constexprs (its rows' stride bits) without and with the power-of-two bit
            plain = consts[:-1] + (consts[-1] & ~MODE_POW2,)
            pow2 = None if pow2_consts is None else consts[:-1] + (consts[-1] | MODE_POW2,)
            hit = keep(self._signed, key, ((plain, pow2, scaled, (tokens, *fixed)), {}))
        if found is not None:
            hit[1][consts] = found
        return FUSED

    def _call_plan(self, tokens: int, k_buf: torch.Tensor, v_buf: torch.Tensor, in_dtype: torch.dtype,
                   dtype: torch.dtype, no_k_scale: bool, no_v_scale: bool) -> tuple[Any, ...]:
        """What :meth:`write` needs of a call of ``tokens`` rows into these buffers, once per
        (tokens, buffer shapes, device, dtypes, which scales are given): the grid, the
        constexprs of rows packed at their width (the common call; with the fp8 power-of-two
        bit in ``pow2_consts`` where the scales allow it), and what a call with other token
        strides needs to redo its stride bits. Bounded memo: prefill token counts are many."""
        key = (k_buf.shape, v_buf.shape, k_buf.device, in_dtype, dtype)
        plan = self._plans.get(key) or self._plan(k_buf, v_buf, in_dtype, dtype, key)
        rows, rk, rv, bk, bv, row_bytes, mode, same, pdl, _, pow2_ok, fp8_out, interpreted, tables = plan
        cfg = self.config or self.launch_shape(tokens, row_bytes, bk + bv, fp8_out, interpreted, tables)
        block_t, num_warps, split = cfg.block_t, cfg.num_warps, min(cfg.split, bk, bv)
        scaled = not same and not (no_k_scale and no_v_scale)
        if scaled:
            mode |= (0 if no_k_scale else MODE_K_SCALED) | (0 if no_v_scale else MODE_V_SCALED)
        if cfg.stream:
            mode |= MODE_STREAM
        packed = mode | _stride_bits(plan, tokens, block_t, num_warps, split, rk, rv)
        consts = (rk, rv, bk, bv, block_t, split, packed)
        pow2_consts = consts[:-1] + (packed | MODE_POW2,) if scaled and pow2_ok else None
        if len(self._calls) > 4096:
            self._calls.clear()
        call = (rows, rk, rv, ((tokens + block_t - 1) // block_t, split), consts, pow2_consts, scaled, num_warps, pdl,
                (plan, block_t, split, mode), (rows, rk, rv))
        self._calls[(tokens, k_buf.shape, v_buf.shape, k_buf.get_device(), in_dtype, dtype, no_k_scale,
                     no_v_scale)] = call
        return call

    @staticmethod
    def launch_shape(tokens: int, row_bytes: int, row_elements: int, fp8: bool, interpreted: bool,
                     tables: tuple[Table, Table] | None = None) -> TritonConfig:
        """The GPU tables' shape (``tables``: a card's (16-bit, fp8) tables, default the
        fallback's), or under Triton's interpreter its own (few large programs: the
        interpreter pays per program, not per element; see triton_tables)."""
        if interpreted:
            return interpreted_config(row_elements, tokens)
        return pick_config(row_bytes, tokens, table=tables[1 if fp8 else 0] if tables else None, fp8=fp8)

    def info(self) -> WriterInfo:
        """``extra["interpreted"]`` when the kernel runs under Triton's interpreter (on the host,
        in numpy): its times are the interpreter's, not a GPU's."""
        info = super().info()
        if triton is not None and kernel.interpreted():
            info.extra["interpreted"] = "Triton's interpreter on the host"
        return info


def _stride_bits(plan: tuple[Any, ...], tokens: int, block_t: int, num_warps: int, split: int, k_stride: int,
                 v_stride: int) -> int:
    """The mode bits that depend on the rows' token strides: the exact integer fp8 encode where
    Triton's packed cast is not known-good for the layout (triton_kernel.fp8_cast_safe), and
    64-bit offsets where 32 bits would overflow."""
    rows, rk, rv, bk, bv = plan[:5]
    bits = 0
    if plan[9] and not kernel.fp8_cast_safe(rk, rv, k_stride, v_stride, block_t, num_warps, bk // split, bv // split):
        bits |= MODE_FP8_INT
    if rows * max(rk, rv) > INT32_MAX or (tokens + block_t) * max(k_stride, v_stride, rk, rv) > INT32_MAX:
        bits |= MODE_WIDE
    return bits


def _rows(t: torch.Tensor, row: int) -> tuple[torch.Tensor, int]:
    """Rows must be contiguous after the token dimension (any token stride); copy if not.
    Returns the tensor and its token stride (``row``, a row's elements, where the whole tensor
    is contiguous: one call on the eager write's host path)."""
    if t.is_contiguous():
        return t, row
    st = t.stride()
    if st[-1] != 1 or len(st) > 3 or (len(st) == 3 and st[1] != t.shape[2]):
        t = t.contiguous()
        st = t.stride()
    return t, st[0]


__all__ = ["INSTALL_HINT", "KINDS", "TRITON_TABLE", "TRITON_TABLE_FP8", "TritonConfig", "TritonFusedWriter",
           "e4m3_saturates", "interpreted_config", "pick_config"]
