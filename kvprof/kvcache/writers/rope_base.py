"""The contract of a write that also runs the rotary embedding (rope + K/V store).

Engines fuse the KV-cache store into the rotary kernel (SGLang's ``FusedSetKVBufferArg`` /
``apply_rope_inplace_with_kvcache``): q ``[T, Hq, D]`` and k ``[T, Hk, D]`` are rotated in
place, the rotated k is stored into the K cache at ``loc`` and v ``[T, Hk, Dv]`` into the V
cache. A ``RopeKVWriter`` is one implementation of that unit of work -- one fused launch, or
a rotary kernel followed by a store writer -- so both are measured behind one contract.

``cos_sin_cache`` is ``[max_position, rope_dim]`` float32, cosines in the first half and
sines in the second; ``positions`` ``[T]`` int32/int64; ``is_neox`` True rotates the two
halves of the first ``rope_dim`` dims (GPT-NeoX), False interleaved pairs (GPT-J); dims at
and past ``rope_dim`` pass through unrotated (partial rotary).
"""

from __future__ import annotations

import abc
from typing import Any

import torch

from kvprof.core.vocab import ROPE_FUSED  # noqa: F401  (the path a one-launch write reports)
from kvprof.kvcache.validation import check_buffer_pair, check_disjoint, check_index_range, check_scale
from kvprof.kvcache.writers.base import ChecksItsCalls, WriterInfo

ROPE_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


class RopeKVWriter(ChecksItsCalls, abc.ABC):
    """One layer's rotary embedding of q and k plus the K/V store, as engines run it."""

    name: str = ""
    description: str = ""
    fused: bool = False  # the store is one launch for K and V (as KVWriter.fused)
    rope_fused: bool = False  # rope and the store in ONE launch
    devices: tuple[str, ...] = ("cpu", "cuda")
    kernel_name: str | None = None  # as KVWriter.kernel_name

    def info(self) -> WriterInfo:
        """``extra["rope"]``: "fused" (one launch) or "separate" (a rotary kernel, then a store)."""
        return WriterInfo(self.name, self.description, self.fused, self.devices,
                          {"rope": "fused" if self.rope_fused else "separate"})

    def unsupported_reason(
        self, device: torch.device, dtype: torch.dtype, input_dtype: torch.dtype | None = None
    ) -> str | None:
        """None when this writer can run here, else why not (one line)."""
        if device.type not in self.devices:
            return f"{self.name} runs on {'/'.join(self.devices)}, not {device.type}"
        if input_dtype is not None and input_dtype not in ROPE_INPUTS:
            return f"{self.name} rotates bf16, fp16 or fp32 q/k, not {input_dtype}"
        return None

    def prepare(self, device: torch.device) -> None:
        """Set up per-device state (streams, compiled code) before any write or graph capture."""

    def launches_pdl(self, device: torch.device) -> bool | None:
        """As ``KVWriter.launches_pdl``: PDL on the write's first kernel; None: not said."""
        return None

    @abc.abstractmethod
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
        """Rotate q and k in place, store k (rotated) and v at loc; return the path that ran.

        ``k_buf``/``v_buf`` are the pool's storage views ``[size + page_size, Hk, D]`` (uint8
        for fp8 caches, like ``KVWriter``); ``dtype`` is the cache's logical dtype; fp8 caches
        quantise the rotated k (rounded to k's dtype) and v with the per-tensor scales, as
        :func:`kvprof.kvcache.dtypes.convert_for_cache` does; ``loc`` and ``positions`` are 1-D and
        contiguous. Every input is checked by :meth:`check_write` before this runs, whoever
        calls it (``ChecksItsCalls``).
        """

    def check_write(  # type: ignore[override]
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
    ) -> tuple[Any, ...]:
        """The rope contract's checks (:func:`check_rope_call`) and the writer's own
        ``unsupported_reason``, all before q or k is rotated."""
        q, k, v, loc, positions = check_rope_call(q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, dtype,
                                                  k_scale, v_scale)
        self.check_supported(k_buf, dtype, k.dtype)
        return q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, bool(is_neox), dtype, k_scale, v_scale


def check_rope_call(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
    loc: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, dtype: torch.dtype,
    k_scale: float | torch.Tensor | None = None, v_scale: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`check_rope_inputs`, with the cache buffers checked against the cache's
    ``dtype`` (contiguous, its storage dtype, one device, apart), the scales, and -- where
    reading them costs no device sync, on a CPU -- slots inside the buffers and positions
    inside the cos/sin table, whatever a pool's ``check_slots`` says: a position past the
    table would read memory beyond it. Returns q, k, v (as ``check_rope_inputs``) and loc and
    positions contiguous (copied where strided, as the store contract's ``loc``), so a writer
    may read them as consecutive values."""
    check_buffer_pair(dtype, k_buf, v_buf)
    device = k_buf.device
    q, k, v = check_rope_inputs(q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache,
                                k_scale=k_scale, v_scale=v_scale)
    check_scale("k_scale", k_scale, device)
    check_scale("v_scale", v_scale, device)
    check_index_range("loc", loc, 0, k_buf.shape[0])
    check_index_range("positions", positions, 0, cos_sin_cache.shape[0], "position")
    if not loc.is_contiguous():
        loc = loc.contiguous()
    if not positions.is_contiguous():
        positions = positions.contiguous()
    return q, k, v, loc, positions


def check_rope_inputs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
    loc: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
    k_scale: object = None, v_scale: object = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raise ``ValueError`` (one line) for a call no rope writer may run, before anything is
    written; return q, k and v as ``[tokens, heads, dim]`` views (engines also pass
    ``[tokens, heads * dim]``). q/k are rotated in place, so they are never copied and must
    have unit stride in their last dim; v, loc and positions may have any strides. Slot and
    position values are the caller's (reading them would sync the device)."""
    _check_tensors_on(k_buf.device, q=q, k=k, v=v, loc=loc, positions=positions, cos_sin_cache=cos_sin_cache)
    heads, dim = k_buf.shape[1], k_buf.shape[2]
    v_dim = v_buf.shape[2]
    for name, t in (("loc", loc), ("positions", positions)):
        if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int32 or int64 tensor, got {tuple(t.shape)} {t.dtype}")
    tokens = loc.shape[0]
    q = _heads(q, "q", tokens, dim)
    k = _heads(k, "k", tokens, dim)
    v = _heads(v, "v", tokens, v_dim)
    if positions.shape[0] != tokens:
        raise ValueError(f"positions has {positions.shape[0]} tokens but loc has {tokens}")
    if k.dtype not in ROPE_INPUTS or q.dtype not in ROPE_INPUTS:
        raise ValueError(f"q and k must be bf16, fp16 or fp32, got {q.dtype} and {k.dtype}")
    if v.dtype != k.dtype:
        raise ValueError(f"v is {v.dtype} but k is {k.dtype}")
    for name, t, h, d in (("k", k, heads, dim), ("v", v, heads, v_dim)):
        if tuple(t.shape) != (tokens, h, d):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected ({tokens}, {h}, {d})")
    if q.dim() != 3 or q.shape[0] != tokens or q.shape[2] != dim:
        raise ValueError(f"q has shape {tuple(q.shape)}, expected ({tokens}, heads, {dim})")
    for name, t in (("q", q), ("k", k)):
        if t.numel() and t.stride(2) != 1:
            raise ValueError(f"{name} is rotated in place and needs unit stride in its last dim, got {t.stride()}")
    _check_cos_sin_cache(cos_sin_cache, dim)
    # q and k are rotated in place and the buffers written: none of them may share a byte with
    # any tensor of the call (q and k one tensor, v a view of k, q a view of the cos/sin
    # table, an input inside a buffer...); v, loc, positions, the table and the scales are only read
    check_disjoint({"q": q, "k": k, "k_buf": k_buf, "v_buf": v_buf},
                   {"v": v, "loc": loc, "positions": positions, "cos_sin_cache": cos_sin_cache,
                    "k_scale": k_scale if isinstance(k_scale, torch.Tensor) else None,
                    "v_scale": v_scale if isinstance(v_scale, torch.Tensor) else None})
    return q, k, v


def _check_tensors_on(device: torch.device, **inputs: object) -> None:
    """Every input a tensor on the cache's device; the first that is not, named."""
    for name, t in inputs.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, the cache is on {device}")


def rope_dim_reason(rope_dim: int, head_dim: int) -> str | None:
    """Why a rotary of ``rope_dim`` dims cannot rotate heads of ``head_dim`` (it turns pairs of
    dims: an even count, at least one pair, at most the head), else None."""
    if rope_dim < 2 or rope_dim % 2 or rope_dim > head_dim:
        return f"rope_dim {rope_dim} must be even and in [2, head_dim={head_dim}]"
    return None


def _check_cos_sin_cache(cos_sin_cache: torch.Tensor, dim: int) -> None:
    """``[positions, rope_dim]`` float32 with unit stride in rope_dim, rope_dim even and at most
    ``dim`` (the rotated part of each head)."""
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.dim() != 2:
        raise ValueError(f"cos_sin_cache must be a 2-D float32 tensor, got {tuple(cos_sin_cache.shape)} "
                         f"{cos_sin_cache.dtype}")
    reason = rope_dim_reason(cos_sin_cache.shape[1], dim)
    if reason:
        raise ValueError(f"cos_sin_cache's {reason}")
    if cos_sin_cache.stride(1) != 1:
        raise ValueError(f"cos_sin_cache needs unit stride in its last dim, got {cos_sin_cache.stride()}")


def _heads(t: torch.Tensor, name: str, tokens: int, dim: int) -> torch.Tensor:
    """``[tokens, heads * dim]`` as a ``[tokens, heads, dim]`` view (a view, never a copy:
    q and k are written in place); anything else as it is, for the shape checks to word."""
    if t.dim() == 2 and t.shape[0] == tokens and dim and t.shape[1] % dim == 0:
        try:
            return t.view(tokens, t.shape[1] // dim, dim)
        except RuntimeError:
            raise ValueError(f"{name} of shape {tuple(t.shape)} and strides {t.stride()} has no "
                             f"[{tokens}, heads, {dim}] view") from None
    return t


__all__ = ["ROPE_INPUTS", "RopeKVWriter", "check_rope_call", "check_rope_inputs", "rope_dim_reason"]
