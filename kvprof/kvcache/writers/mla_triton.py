"""kvprof's fused MLA latent-row store in Triton: one launch writes nope and rope for every token.

One program handles ``block_t`` tokens: a ``[block_t, next_pow2(R)]`` tile of the nope part
and a ``[block_t, next_pow2(P)]`` tile of the rope part (contiguous row vectors: 16-byte
accesses, DeepSeek-V3's 512 + 64 values are 1024 + 128 bytes in bf16, no lane masked),
stored side by side as whole latent rows, with SGLang's cast (``.to(dtype)``, no scale) done
in the kernel. With programmatic dependent launch (sm_90+) back-to-back writes overlap one
launch with the previous kernel's tail; the kernel waits before its first load.
The rows are loaded before the slots are used, so the slot load's latency overlaps them;
slots outside ``[0, rows)`` and the skipped slot are masked in the kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from kvprof.kvcache import signature
from kvprof.kvcache.contracts import MLAWriter
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
    torch_e4m3_saturates,
    triton,
    uses_pdl,
)
from kvprof.kvcache.writers.layout_tables import mla_shape
from kvprof.kvcache.writers.triton_convert import triton_missing
from kvprof.kvcache.writers.triton_launch import launcher_for

decorates_triton_kernels(__name__)  # before its kernels are decorated: Triton reads TRITON_INTERPRET then

FUSED = "fused"
_SAME, _TO_E4M3, _TO_E5M2 = 0, 1, 2
_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


if triton is not None:
    from kvprof.kvcache.writers.triton_rows import program_tokens

    @triton.jit(do_not_specialize=["tokens", "rows", "skip"])
    def _mla_store_kernel(buf, loc, nope, rope, tokens, rows, skip, nope_stride, rope_stride,
                          R: tl.constexpr, P: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
                          BLOCK_T: tl.constexpr, CONV: tl.constexpr, SAT: tl.constexpr, HW_R: tl.constexpr,
                          HW_P: tl.constexpr, WIDE: tl.constexpr, PDL: tl.constexpr,
                          STREAM: tl.constexpr):
        """One program writes ``BLOCK_T`` whole rows: a ``[BLOCK_T, BLOCK_R]`` tile of nope
        and a ``[BLOCK_T, BLOCK_P]`` tile of rope, each a power of two wide (DeepSeek-V3's 512
        and 64 need no column mask), stored side by side at ``slot * (R + P)``."""
        tok, tmask, slot = program_tokens(loc, tokens, BLOCK_T, WIDE, PDL)
        cr = tl.arange(0, BLOCK_R)
        cp = tl.arange(0, BLOCK_P)
        r_mask = tmask[:, None] if R == BLOCK_R else tmask[:, None] & (cr[None, :] < R)
        p_mask = tmask[:, None] if P == BLOCK_P else tmask[:, None] & (cp[None, :] < P)
        # row loads do not depend on the slots: issued while the slot load is in flight
        x_n = tl.load(nope + tok[:, None] * nope_stride + cr[None, :], mask=r_mask)
        x_p = tl.load(rope + tok[:, None] * rope_stride + cp[None, :], mask=p_mask)
        if CONV != 0:
            x_n = fp8_bits(x_n.to(tl.float32), CONV == 1, SAT, HW_R)
            x_p = fp8_bits(x_p.to(tl.float32), CONV == 1, SAT, HW_P)
        ok = tmask & (slot >= 0) & (slot < rows) & (slot != skip)
        if WIDE:
            row = slot.to(tl.int64) * (R + P)
        else:
            row = slot.to(tl.int32) * (R + P)
        o_r = ok[:, None] if R == BLOCK_R else ok[:, None] & (cr[None, :] < R)
        o_p = ok[:, None] if P == BLOCK_P else ok[:, None] & (cp[None, :] < P)
        if STREAM:  # streaming stores (.cs): large writes scatter rows that this kernel never reads
            tl.store(buf + row[:, None] + cr[None, :], x_n.to(buf.dtype.element_ty, bitcast=True), mask=o_r,
                     cache_modifier=".cs")
            tl.store(buf + row[:, None] + R + cp[None, :], x_p.to(buf.dtype.element_ty, bitcast=True), mask=o_p,
                     cache_modifier=".cs")
        else:
            tl.store(buf + row[:, None] + cr[None, :], x_n.to(buf.dtype.element_ty, bitcast=True), mask=o_r)
            tl.store(buf + row[:, None] + R + cp[None, :], x_p.to(buf.dtype.element_ty, bitcast=True), mask=o_p)


class MLATritonWriter(MLAWriter):
    """One Triton launch per layer writes whole latent rows, casting in the kernel."""

    name = "mla_triton"
    description = "kvprof's fused Triton MLA store: nope + rope in one launch, fp8 cast in-kernel"
    fused = True

    def __init__(self, block_t: int | None = None, num_warps: int | None = None, pdl: bool | None = None,
                 stream: bool | None = None) -> None:
        """``block_t``/``num_warps``/``stream`` (streaming stores) force one launch shape
        (tuning); None: the tuned table (``kvprof.kvcache.writers.layout_tables``).
        ``pdl``: programmatic dependent launch; None turns it on where it exists (compiled
        kernel, sm_90+), as kvprof's MHA writer does."""
        self.block_t, self.num_warps, self.pdl, self.stream = block_t, num_warps, pdl, stream
        self._plans: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        # the tensors' C++ signature, the dtype and the skipped slot -> (kept launch, the ints after the tensors)
        self._signed: dict[tuple[Any, ...], tuple[triton_launch.SignedLaunch, tuple[Any, ...]]] = {}

    def launches_pdl(self, device: torch.device) -> bool:
        """PDL where the compiled kernel runs on sm_90+ (``pdl=None``), or as forced."""
        return triton is not None and uses_pdl(self.pdl, device, compiled=not interpreted(_mla_store_kernel))

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        reason = super().unsupported_reason(device, dtype, input_dtype)
        if reason:
            return reason
        if triton is None:
            return triton_missing()
        placement = placement_reason("mla_triton", __name__, interpreted(_mla_store_kernel), device, self.pdl)
        if placement:
            return placement
        if input_dtype is not None:
            return _conversion_reason(input_dtype, dtype)
        return None

    def write(self, kv_buf, loc, nope, rope, dtype, skip):  # type: ignore[override]
        signed = None
        if signature.SIGNATURE is not None:  # the launcher's C++ helper: one call reads the four tensors
            signed = signature.SIGNATURE(kv_buf, loc, nope, rope)
            if signed is not None:
                hit = self._signed.get((signed[0], dtype, skip, type(skip)))
                if hit is not None and hit[0](_mla_store_kernel, (*signed[1], *hit[1])):
                    return FUSED
        tokens = loc.shape[0]
        ns, ps = nope.stride(0), rope.stride(0)
        key = (tokens, kv_buf.shape, kv_buf.get_device(), nope.dtype, dtype, nope.shape[-1], rope.shape[-1], ns, ps)
        plan = self._plans.get(key) or self._plan(key, kv_buf, nope, rope, dtype, tokens, ns, ps)
        grid, rows, consts, warps, pdl = plan
        if rows >= 0:  # the buffer's rows, the skipped slot and the strides: fixed for a model, keyed by value
            launcher = launcher_for(_mla_store_kernel, "_mla_store_kernel")
            args, fixed = (kv_buf, loc, nope, rope, tokens), (rows, skip, ns, ps)
            if signed is None:
                launcher.launch(grid, args, consts, warps, pdl, True, fixed)
                return FUSED
            found = launcher.launch_signed(grid, args, consts, warps, pdl, True, fixed, _mla_store_kernel)
            if found is not None:
                keep(self._signed, (signed[0], dtype, skip, type(skip)), (found, (tokens, *fixed, *consts)))
        return FUSED

    def _plan(self, key: tuple[Any, ...], kv_buf: torch.Tensor, nope: torch.Tensor, rope: torch.Tensor,
              dtype: torch.dtype, tokens: int, ns: int, ps: int) -> tuple[Any, ...]:
        """Everything a write of ``tokens`` tokens launches with but the tensors: computed once
        per (tokens, buffer, dtypes, widths, strides), as the MHA writers memoise theirs
        (the eager write's host path). A conversion it has not is refused at any token count."""
        reason = _conversion_reason(nope.dtype, dtype)
        if reason:
            raise ValueError(reason)
        if len(self._plans) > 4096:  # prefill token counts are many: bounded memo
            self._plans.clear()
        if tokens == 0:
            empty: tuple[Any, ...] = ((0,), -1, (), 0, False)  # nothing to launch
            self._plans[key] = empty
            return empty
        conv = _SAME if nope.dtype == dtype else (_TO_E4M3 if dtype == torch.float8_e4m3fn else _TO_E5M2)
        r, p = nope.shape[-1], rope.shape[-1]
        rows = kv_buf.shape[0]
        card = device_card(kv_buf.device)[0] if kv_buf.is_cuda else None  # this card's tables (card_tables)
        shape = mla_shape(tokens, r + p, fp8=conv != _SAME, card=card)
        bt, warps = self.block_t or shape.block_t, self.num_warps or shape.num_warps
        stream = shape.stream if self.stream is None else self.stream
        block_r, block_p = triton.next_power_of_2(r), triton.next_power_of_2(p)
        compiled = kv_buf.is_cuda and not interpreted(_mla_store_kernel)
        # the hardware fp8 cast per part, where its register layout is known-good
        hw_r = compiled and bool(conv) and hw_cast_safe(r, ns, bt * block_r, warps)
        hw_p = compiled and bool(conv) and hw_cast_safe(p, ps, bt * block_p, warps)
        pdl = compiled and (self.pdl if self.pdl is not None else pdl_capable(kv_buf.device))
        wide = rows * (r + p) >= 2**31 or (tokens + bt) * max(ns, ps) >= 2**31
        consts = (r, p, block_r, block_p, bt, conv, conv == _TO_E4M3 and torch_e4m3_saturates(), hw_r, hw_p, wide,
                  pdl, stream)
        plan = self._plans[key] = ((-(-tokens // bt),), rows, consts, warps, pdl)
        return plan


def _conversion_reason(input_dtype: torch.dtype, dtype: torch.dtype) -> str | None:
    if input_dtype == dtype:
        return None
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and input_dtype in _INPUTS:
        return None
    return f"mla_triton stores {dtype} from {dtype} or, for fp8 caches, from fp32/bf16/fp16; got {input_dtype}"
