"""The shadow check inside a CUDA graph: one kernel per checked write, counts kept on the device.

A write captured into a CUDA graph runs again at every replay, with no Python around it, so
the eager check (torch operations after the hooked call, counts read later) cannot follow it:
captured, its operations would rerun at every replay and overwrite their own results. Instead
the capture records one kernel right after the write that compares each token's K and V rows
in the cache with the write's inputs, bitwise, and adds what it found to a small counts row
that lives outside the graph's memory: replays that ran, rows held, rows wrong, replays with a
wrong row, the first wrong slot. The host reads the rows when the sidecar is written.

One program walks the tokens in tiles, so a write's totals need no atomics and the kernel
costs one launch inside the graph (a decode write's few rows). Which tokens are held: a slot
in ``[0, rows)`` that is not the engine's dummy ``pad`` (padding tokens' slot); in a captured
decode step each other token has its own slot.
"""

from __future__ import annotations

from typing import Any

import triton
import triton.language as tl

# the counts row: [replays, rows held, rows wrong, replays with a wrong row, first wrong slot]
REPLAYS, HELD, WRONG, MISMATCHED, FIRST = range(5)
COUNTS = 5


# every size, stride and pointer is a plain runtime argument (no specialisation on value or
# alignment): one compiled kernel per element width and slot dtype, built before any capture
# (``warm``), since building or loading a kernel inside a capture would break the engine's graph
_SCALARS = ["slots_ptr", "n", "k_ptr", "v_ptr", "k_tok", "k_head", "v_tok", "v_head", "kc_ptr", "vc_ptr",
            "kc_blk", "kc_off", "kc_head", "vc_blk", "vc_off", "vc_head", "block_size", "rows", "pad",
            "counts_ptr", "heads", "dim"]


def _jit(fn: Any) -> Any:
    try:  # alignment is specialised apart from values in newer Triton
        return triton.jit(fn, do_not_specialize=_SCALARS, do_not_specialize_on_alignment=_SCALARS)
    except TypeError:
        return triton.jit(fn, do_not_specialize=_SCALARS)


@_jit
def _shadow_rows_kernel(slots_ptr, n, k_ptr, v_ptr, k_tok, k_head, v_tok, v_head,
                        kc_ptr, vc_ptr, kc_blk, kc_off, kc_head, vc_blk, vc_off, vc_head,
                        block_size, rows, pad, counts_ptr, heads, dim,
                        BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr):
    t_ar = tl.arange(0, BLOCK_T)
    e_ar = tl.arange(0, BLOCK_E)
    held = tl.zeros([BLOCK_T], dtype=tl.int32)
    wrong = tl.zeros([BLOCK_T], dtype=tl.int32)
    first = tl.full([1], -1, dtype=tl.int64)
    for t0 in range(0, n, BLOCK_T):
        t = (t0 + t_ar).to(tl.int64)
        tm = t < n
        slot = tl.load(slots_ptr + t, mask=tm, other=-1).to(tl.int64)
        ok = tm & (slot >= 0) & (slot < rows) & (slot != pad)
        s = tl.where(ok, slot, 0)
        k_base = (s // block_size) * kc_blk + (s % block_size) * kc_off
        v_base = (s // block_size) * vc_blk + (s % block_size) * vc_off
        bad_t = tl.zeros([BLOCK_T], dtype=tl.int32)
        for e0 in range(0, heads * dim, BLOCK_E):
            e = e0 + e_ar
            head = (e // dim).to(tl.int64)
            d = (e % dim).to(tl.int64)
            m = ok[:, None] & (e < heads * dim)[None, :]
            k_in = tl.load(k_ptr + t[:, None] * k_tok + (head * k_head + d)[None, :], mask=m, other=0)
            k_at = tl.load(kc_ptr + k_base[:, None] + (head * kc_head + d)[None, :], mask=m, other=0)
            v_in = tl.load(v_ptr + t[:, None] * v_tok + (head * v_head + d)[None, :], mask=m, other=0)
            v_at = tl.load(vc_ptr + v_base[:, None] + (head * vc_head + d)[None, :], mask=m, other=0)
            bad_t += tl.sum(((k_in != k_at) | (v_in != v_at)).to(tl.int32), axis=1)
        bad = ok & (bad_t > 0)
        held += ok.to(tl.int32)
        wrong += bad.to(tl.int32)
        # the first wrong token of this tile (its slot), kept where none was found before
        first_t = tl.min(tl.where(bad, t, n), axis=0)
        slot_t = tl.sum(tl.where(t == first_t, slot, 0), axis=0)
        first = tl.where((first < 0) & (first_t < n), slot_t, first)
    n_held = tl.sum(held, axis=0).to(tl.int64)
    n_wrong = tl.sum(wrong, axis=0).to(tl.int64)
    tl.store(counts_ptr + 0, tl.load(counts_ptr + 0) + 1)
    tl.store(counts_ptr + 1, tl.load(counts_ptr + 1) + n_held)
    tl.store(counts_ptr + 2, tl.load(counts_ptr + 2) + n_wrong)
    tl.store(counts_ptr + 3, tl.load(counts_ptr + 3) + (n_wrong > 0).to(tl.int64))
    seen = tl.load(counts_ptr + 4 + tl.arange(0, 1))
    tl.store(counts_ptr + 4 + tl.arange(0, 1), tl.where(seen < 0, first, seen))


_INT = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


def compare_rows(slots: Any, k: Any, v: Any, k_cache: Any, v_cache: Any, rows: int, pad: int | None,
                 counts: Any) -> None:
    """Launch the comparison of one write (recorded into a graph when called inside a capture).

    ``slots`` [n]; ``k``/``v`` [n, heads, dim] in the cache's dtype, each row's dim contiguous;
    ``k_cache``/``v_cache`` [blocks, block_size, heads, dim] views (a pool of rows: block_size 1),
    dim contiguous; ``counts`` an int64 row of ``COUNTS`` on the same device (FIRST starts at -1).
    The caller has checked shapes, dtypes and strides (``refusal``)."""
    import torch

    as_int = getattr(torch, _INT[k.element_size()])
    n, heads, dim = (int(x) for x in k.shape)
    _shadow_rows_kernel[(1,)](
        slots, n, k.view(as_int), v.view(as_int), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.view(as_int), v_cache.view(as_int), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), int(k_cache.shape[1]), rows,
        -2 if pad is None else pad, counts, heads, dim, BLOCK_T=BLOCK_T, BLOCK_E=BLOCK_E)


BLOCK_T, BLOCK_E = 16, 256  # tokens x row elements per step
_WARM: set[tuple[Any, ...]] = set()


def warm(device: Any) -> None:
    """Build and load the kernel for every element width and slot dtype on ``device`` (once per
    process): called before a capture begins, so that none is built inside one."""
    import torch

    for size in sorted(_INT):
        for slot_dtype in (torch.int64, torch.int32):
            key = (str(device), size, slot_dtype)
            if key in _WARM:
                continue
            el = getattr(torch, _INT[size])
            rows = torch.zeros(2, 1, 1, 2, dtype=el, device=device)
            x = torch.zeros(1, 1, 2, dtype=el, device=device)
            counts = torch.tensor([0, 0, 0, 0, -1], dtype=torch.int64, device=device)
            compare_rows(torch.zeros(1, dtype=slot_dtype, device=device), x, x, rows, rows, 2, None, counts)
            _WARM.add(key)


def refusal(slots: Any, k: Any, v: Any, k_cache: Any, v_cache: Any) -> str | None:
    """Why this write cannot be compared inside a graph, or None."""
    if k.dim() != 3 or v.shape != k.shape or slots.dim() != 1 or slots.shape[0] != k.shape[0]:
        return "K/V are not [tokens, heads, dim] with one slot each"
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or tuple(k_cache.shape[2:]) != tuple(k.shape[1:]):
        return "the cache's rows are not the write's heads x dim"
    if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype:
        return "inputs converted on the way into the cache (fp8): not compared inside a CUDA graph"
    if k.element_size() not in _INT or any(t.stride(-1) != 1 for t in (k, v, k_cache, v_cache)):
        return "a row's elements are not contiguous"
    if slots.dtype.is_floating_point or slots.dtype.is_complex:
        return "slots are not integers"
    return None
