"""kvprof's fused store into vLLM's paged (flash) cache in Triton: one launch for K and V.

One program handles ``block_t`` tokens (a ``[block_t, heads x dim]`` tile of K and one of V,
loaded as contiguous row vectors: 16-byte accesses for rows of 8 bf16 multiples), with any
token stride (vLLM's key/value are views of the fused QKV output). A slot of -1 is padding
and is masked in the kernel, as are slots past the cache (the pool checks them already).
fp8: ``clamp(float(x) / scale)`` with an IEEE division (``div_rn``) by the scale read from
its device tensor, then a saturating round-to-nearest-even cast, bitwise vLLM's rule.
With programmatic dependent launch (sm_90+) back-to-back writes overlap one launch with the
previous kernel's tail; the kernel waits before its first load.
"""

from __future__ import annotations

from typing import Any

import torch

from kvprof.kvcache import signature
from kvprof.kvcache.contracts import PagedWriter
from kvprof.kvcache.devinfo import decorates_triton_kernels
from kvprof.kvcache.signature import keep
from kvprof.kvcache.writers import triton_launch
from kvprof.kvcache.writers.card_tables import device_card
from kvprof.kvcache.writers.fp8_jit import (
    fp8_bits,
    hw_cast_safe,
    interpreted,
    pdl_capable,
    placement_reason,
    tl,
    triton,
    uses_pdl,
)
from kvprof.kvcache.writers.layout_tables import paged_shape
from kvprof.kvcache.writers.triton_convert import triton_missing
from kvprof.kvcache.writers.triton_launch import launcher_for

decorates_triton_kernels(__name__)  # before its kernels are decorated: Triton reads TRITON_INTERPRET then

FUSED = "fused"
_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


if triton is not None:
    from kvprof.kvcache.writers.triton_rows import program_tokens

    @triton.jit(do_not_specialize=["tokens", "num_slots"])
    def _paged_store_kernel(k_cache, v_cache, slots, key, value, k_scale, v_scale, tokens, num_slots,
                            k_stride, v_stride, RW: tl.constexpr, BLOCK: tl.constexpr, FULL: tl.constexpr,
                            BLOCK_T: tl.constexpr, FP8: tl.constexpr, E4M3: tl.constexpr, HW: tl.constexpr,
                            WIDE: tl.constexpr, PDL: tl.constexpr):
        tok, tmask, slot = program_tokens(slots, tokens, BLOCK_T, WIDE, PDL)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        in_mask = tmask[:, None] if FULL else tmask[:, None] & (col[None, :] < RW)
        k = tl.load(key + tok[:, None] * k_stride + col[None, :], mask=in_mask)
        v = tl.load(value + tok[:, None] * v_stride + col[None, :], mask=in_mask)
        if FP8:
            ks = tl.load(k_scale)
            vs = tl.load(v_scale)
            k = fp8_bits(tl.math.div_rn(k.to(tl.float32), ks), E4M3, True, HW)
            v = fp8_bits(tl.math.div_rn(v.to(tl.float32), vs), E4M3, True, HW)
        ok = tmask & (slot >= 0) & (slot < num_slots)
        if WIDE:
            row = slot.to(tl.int64) * RW
        else:
            row = slot.to(tl.int32) * RW
        o_mask = ok[:, None] if FULL else ok[:, None] & (col[None, :] < RW)
        tl.store(k_cache + row[:, None] + col[None, :], k.to(k_cache.dtype.element_ty, bitcast=True), mask=o_mask)
        tl.store(v_cache + row[:, None] + col[None, :], v.to(v_cache.dtype.element_ty, bitcast=True), mask=o_mask)


class PagedTritonWriter(PagedWriter):
    """One Triton launch per layer writes K and V at ``slot_mapping``, fp8 conversion in-kernel."""

    name = "paged_triton"
    description = "kvprof's fused Triton store into vLLM's paged cache: K and V in one launch, -1 skipped"
    fused = True

    def __init__(self, block_t: int | None = None, num_warps: int | None = None, split: int | None = None,
                 pdl: bool | None = None) -> None:
        """``block_t``/``num_warps``/``split`` force one launch shape (tuning); ``pdl``:
        programmatic dependent launch, None: on where it exists (compiled kernel, sm_90+)."""
        self.block_t, self.num_warps, self.split, self.pdl = block_t, num_warps, split, pdl
        self._plans: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        # the tensors' C++ signature, the dtype and whether scales are given -> (kept launch, the ints after them)
        self._signed: dict[tuple[Any, ...], tuple[triton_launch.SignedLaunch, tuple[Any, ...]]] = {}

    def launches_pdl(self, device: torch.device) -> bool:
        """PDL where the compiled kernel runs on sm_90+ (``pdl=None``), or as forced."""
        return triton is not None and uses_pdl(self.pdl, device, compiled=not interpreted(_paged_store_kernel))

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        reason = super().unsupported_reason(device, dtype, input_dtype)
        if reason:
            return reason
        if triton is None:
            return triton_missing()
        placement = placement_reason("paged_triton", __name__, interpreted(_paged_store_kernel), device, self.pdl)
        if placement:
            return placement
        if input_dtype is not None and input_dtype != dtype and not (
                dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and input_dtype in _INPUTS):
            return f"paged_triton has no conversion from {input_dtype} to {dtype}"
        return None

    def write(self, k_cache, v_cache, slots, key, value, dtype, k_scale, v_scale):  # type: ignore[override]
        signed = None
        if signature.SIGNATURE is not None:  # the launcher's C++ helper: one call reads every tensor
            signed = (signature.SIGNATURE(k_cache, v_cache, slots, key, value) if k_scale is None else
                      signature.SIGNATURE(k_cache, v_cache, slots, key, value, k_scale, v_scale))
            if signed is not None:
                hit = self._signed.get((signed[0], dtype, k_scale is None))
                if hit is not None:
                    ptrs = signed[1] if k_scale is not None else (*signed[1], signed[1][2], signed[1][2])
                    if hit[0](_paged_store_kernel, (*ptrs, *hit[1])):
                        return FUSED
        tokens = slots.shape[0]
        if tokens == 0:
            return FUSED
        ks, vs = key.stride(0), value.stride(0)
        plan_key = (tokens, k_cache.shape, k_cache.get_device(), dtype, ks, vs)
        plan = self._plans.get(plan_key) or self._plan(plan_key, k_cache, dtype, tokens, ks, vs)
        grid, fixed, consts, warps, pdl = plan
        no_scale = k_scale is None
        if no_scale:
            k_scale = v_scale = slots  # never read: FP8 is off
        # the cache's slots and the token strides: fixed for a model, keyed by value
        launcher = launcher_for(_paged_store_kernel, "_paged_store_kernel")
        args = (k_cache, v_cache, slots, key, value, k_scale, v_scale, tokens)
        if signed is None:
            launcher.launch(grid, args, consts, warps, pdl, True, fixed)
            return FUSED
        found = launcher.launch_signed(grid, args, consts, warps, pdl, True, fixed, _paged_store_kernel)
        if found is not None:
            keep(self._signed, (signed[0], dtype, no_scale), (found, (tokens, *fixed, *consts)))
        return FUSED

    def _plan(self, plan_key: tuple[Any, ...], k_cache: torch.Tensor, dtype: torch.dtype, tokens: int, ks: int,
              vs: int) -> tuple[Any, ...]:
        """Everything a write of ``tokens`` tokens launches with but the tensors and scales:
        computed once per (tokens, cache, dtype, strides), as the MHA writers memoise theirs."""
        rw = k_cache.shape[2] * k_cache.shape[3]
        num_slots = k_cache.shape[0] * k_cache.shape[1]
        fp8 = dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
        shape = paged_shape(tokens, rw, fp8=fp8, card=device_card(k_cache.device)[0] if k_cache.is_cuda else None)
        bt, warps, split = (self.block_t or shape.block_t, self.num_warps or shape.num_warps,
                            self.split or shape.split)
        block = triton.next_power_of_2(rw)
        split = max(1, min(split, block // 16))
        compiled = k_cache.is_cuda and not interpreted(_paged_store_kernel)
        hw = compiled
        pdl = compiled and (self.pdl if self.pdl is not None else pdl_capable(k_cache.device))
        chunk = block // split
        if hw and fp8 and not (hw_cast_safe(rw, ks, bt * chunk, warps) and hw_cast_safe(rw, vs, bt * chunk, warps)):
            hw = False
        wide = num_slots * rw >= 2**31 or (tokens + bt) * max(ks, vs, rw) >= 2**31
        if len(self._plans) > 4096:  # prefill token counts are many: bounded memo
            self._plans.clear()
        plan = self._plans[plan_key] = ((-(-tokens // bt), split), (num_slots, ks, vs),
                                        (rw, chunk, block == rw, bt, fp8, dtype == torch.float8_e4m3fn, hw, wide, pdl),
                                        warps, pdl)
        return plan
