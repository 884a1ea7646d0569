"""The rest of a decoder layer around each KV write, for ``--context layer``.

In an engine the write sits between the QKV projection and attention: launch gaps,
programmatic dependent launch and a second stream behave differently there than in 80
writes back to back. This module builds one rank's layer at the preset's per-rank shapes
(RMSNorm, QKV GEMM, rotary embedding, the write, attention over the cached tokens, output
projection, RMSNorm, gate/up GEMM, SiLU x up, down GEMM, residual adds) with distinct
weights per layer, so weights stream from memory as in a real step. Tensor-parallel
all-reduces are not modelled (one rank, one process).

As SGLang builds it: q, k and v are views of the QKV GEMM's output; the rotary embedding
(the model's own, ``kvprof.kvcache.models.RopeSpec``: Llama-3.1's rope_theta 500000 with llama3
frequency scaling, Qwen2.5's 1e6 unscaled, ...) rotates q and k in place in one launch,
so the store receives K and V as two strided views of one tensor. A write that absorbs the
rotary (a ``RopeKVWriter``) replaces both: the layer hands it the q, k and v views, the
positions and the cos/sin cache.

Decode attention reads the pool as an engine's decode kernel does: SGLang's Triton
``decode_attention_fwd`` over a ``kv_indptr``/``kv_indices`` layout, where request ``r``'s
tokens are its ``ctx`` cached slots ``[1 + r * ctx, 1 + (r + 1) * ctx)`` followed by the
slot its new token was just written to, so attention reads what the write stored. Where
that kernel cannot run (SGLang not installed; a CPU, where Triton only interprets) torch's
SDPA gathers the same rows, and ``LayerKernels`` says which ran and why. Prefill attends
causally over its own chunk (SDPA).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kvprof.core.errors import Setting, UsageError
from kvprof.core.layer_kernels import SGLANG_DECODE, TORCH_ROTARY, TORCH_SDPA, TRITON_ROTARY, LayerKernels
from kvprof.kvcache.models import LLAMA31_ROPE, RankShape, RopeSpec

CONTEXTS = ("none", "layer")
DEFAULT_CONTEXT_LEN = 4096
ATTENTION_CHOICES = ("auto", "sglang_triton", "sdpa")
ROTARY_CHOICES = ("auto", "triton", "torch")
MAX_KV_SPLITS = 8  # SGLang's --triton-attention-num-kv-splits default

WriteFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]  # (layer, loc, k, v)
# (layer, loc, q, k, v, positions, cos_sin_cache, is_neox): rotate q and k in place, store k and v
RopeWriteFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool],
                       None]


def inv_freq(spec: RopeSpec, rope_dim: int) -> torch.Tensor:
    """``spec``'s inverse frequencies over ``rope_dim`` rotated dims: ``theta``'s plain ones, or
    Llama-3's scaled ones (SGLang's Llama3RotaryEmbedding) for ``rope_type`` llama3."""
    inv = 1.0 / (spec.theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
    if spec.rope_type == "default":
        return inv
    low_wavelen = spec.original_max_position / spec.low_freq_factor
    high_wavelen = spec.original_max_position / spec.high_freq_factor
    wavelen = 2 * math.pi / inv
    smooth = ((spec.original_max_position / wavelen - spec.low_freq_factor)
              / (spec.high_freq_factor - spec.low_freq_factor))
    mid = (1 - smooth) * inv / spec.factor + smooth * inv
    return torch.where(wavelen < high_wavelen, inv, torch.where(wavelen > low_wavelen, inv / spec.factor, mid))


def cos_sin_cache(spec: RopeSpec, rope_dim: int, rows: int | None = None) -> torch.Tensor:
    """``[rows, rope_dim]`` float32 (default ``spec.max_position`` rows), cosines then sines, as
    SGLang's ``cos_sin_cache``."""
    t = torch.arange(rows or spec.max_position, dtype=torch.float32)
    freqs = torch.outer(t, inv_freq(spec, rope_dim))
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).contiguous()


def layer_weight_bytes(shape: RankShape, dtype: torch.dtype) -> tuple[int, int]:
    """(bytes of one layer's weights, bytes built once: the cos/sin cache), so that a guard
    can say how many layers fit as well as whether they do."""
    elem = torch.empty((), dtype=_layer_dtype(dtype)).element_size()
    h, d, q, kv, i = shape.hidden, shape.head_dim, shape.q_head_num, shape.head_num, shape.intermediate
    per_layer = 2 * h + h * (q + 2 * kv) * d + q * d * h + h * 2 * i + i * h
    return per_layer * elem, shape.rope.max_position * shape.rope.rotary_dim(d) * 4


def weight_bytes(shape: RankShape, dtype: torch.dtype, layers: int | None = None) -> int:
    """Bytes of the weights a ``DecoderContext`` of ``layers`` layers builds (default: every
    layer of the model) and of its cos/sin cache: the estimate a guard checks before allocating."""
    per_layer, fixed = layer_weight_bytes(shape, dtype)
    return per_layer * (shape.layers if layers is None else layers) + fixed


def _layer_dtype(dtype: torch.dtype) -> torch.dtype:
    """The layer's activations and weights: the input dtype where it is a float one, else bf16."""
    return dtype if dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.bfloat16


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class Rotary:
    """The layer's rotary embedding: q and k rotated in place at their positions.

    ``kernel``: "triton" -- kvprof's rotary-only Triton kernel (the rope writers' kernel with
    the store compiled out), one launch for q and k, compiled on a GPU; "torch" -- torch ops
    over q and k as one view when they are adjacent in the QKV output (a few elementwise
    kernels, the same arithmetic in float32, so the same bits); "auto" -- Triton on CUDA,
    torch on a CPU, where Triton only interprets (a tenth of a second a call)."""

    def __init__(self, head_dim: int, device: torch.device, spec: RopeSpec = LLAMA31_ROPE, kernel: str = "auto",
                 rows: int | None = None) -> None:
        if kernel not in ROTARY_CHOICES:
            raise UsageError(f"unknown rotary kernel {kernel!r}; choose from {', '.join(ROTARY_CHOICES)}")
        self.spec = spec
        self.is_neox = spec.is_neox
        self.cos_sin_cache = cos_sin_cache(spec, spec.rotary_dim(head_dim), rows).to(device)
        self._triton: Any = None
        self.kernel, self.reason = TORCH_ROTARY, None
        if kernel == "torch":
            self.reason = "asked for"
        elif kernel == "auto" and device.type != "cuda":
            self.reason = "on a CPU kvprof's Triton rotary kernel runs only in Triton's interpreter"
        else:
            try:
                from kvprof.kvcache.writers.rope_triton import TritonRope

                rope = TritonRope("layer_rotary")
                why = rope.unsupported_reason(device, None)
            except ImportError as exc:
                rope, why = None, f"kvprof's Triton rotary kernel is not importable ({_first_line(exc)})"
            if why is None:
                self._triton, self.kernel = rope, TRITON_ROTARY
            elif kernel == "triton":
                raise UsageError(f"the layer's Triton rotary cannot run on {device}: {why}")
            else:
                self.reason = why

    def __call__(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> None:
        if self._triton is not None:
            self._triton.rotate(q, k, positions, self.cos_sin_cache, self.is_neox)
            return
        table = self.cos_sin_cache[positions]  # [T, rope_dim]
        half = table.shape[1] // 2
        cos, sin = table[:, None, :half], table[:, None, half:]
        both = _adjacent(q, k)
        for x in (both,) if both is not None else (q, k):
            _rotate_(x, cos, sin, self.is_neox, 2 * half)


def _adjacent(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor | None:
    """q and k as one ``[T, Hq + Hk, D]`` view when k's heads follow q's in memory (the QKV output)."""
    if q.dim() != 3 or q.stride()[1:] != k.stride()[1:] or q.stride(0) != k.stride(0) or q.stride(2) != 1:
        return None
    if k.data_ptr() != q.data_ptr() + q.shape[1] * q.stride(1) * q.element_size() or q.shape[2] != k.shape[2]:
        return None
    return q.as_strided((q.shape[0], q.shape[1] + k.shape[1], q.shape[2]), q.stride())


def _rotate_(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool, rope_dim: int) -> None:
    """Rotate ``x`` in place in float32 and round once, as kvprof.kvcache.writers.rope_reference does."""
    if is_neox:
        a, b = x[..., : rope_dim // 2], x[..., rope_dim // 2 : rope_dim]
    else:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
    fa, fb = a.float(), b.float()  # float32 x: the views themselves, so both results before either copy
    ra, rb = fa * cos - fb * sin, fa * sin + fb * cos
    a.copy_(ra)
    b.copy_(rb)


def split_qkv(qkv: torch.Tensor, q_heads: int, kv_heads: int,
              head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q ``[T, Hq, D]``, k and v ``[T, Hk, D]``: views of one QKV output ``[T, (Hq + 2 Hk) D]``, never copies."""
    qd, kvd = q_heads * head_dim, kv_heads * head_dim
    return (qkv[:, :qd].view(-1, q_heads, head_dim), qkv[:, qd : qd + kvd].view(-1, kv_heads, head_dim),
            qkv[:, qd + kvd :].view(-1, kv_heads, head_dim))


@dataclass
class DecodeMeta:
    """One batch size's decode attention metadata (SGLang's forward metadata): built once,
    before any graph is captured; only the new tokens' slots change per step."""

    kv_indptr: torch.Tensor  # [B + 1] int32
    kv_indices: torch.Tensor  # [B * (ctx + 1)] int64: the cached slots, then the new token's
    new_slots: torch.Tensor  # [B] view of kv_indices: each request's last entry
    num_kv_splits: torch.Tensor  # [B] int32
    attn_logits: torch.Tensor  # [B, Hq, MAX_KV_SPLITS, D] float32
    attn_lse: torch.Tensor  # [B, Hq, MAX_KV_SPLITS] float32


def _sglang_decode() -> tuple[Any, Any]:
    """SGLang's decode attention and its split planner (imported on first use: ``import
    sglang`` takes seconds)."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton

    return decode_attention_fwd, get_num_kv_splits_triton


def pick_attention(device: torch.device, choice: str = "auto") -> tuple[str, str | None, Any]:
    """(kernel, why not SGLang's, SGLang's functions or None). ``auto`` runs SGLang's Triton
    decode kernel on CUDA and SDPA on a CPU: there the kernel runs only in Triton's
    interpreter, about half a second a call at 2 requests x 256 tokens on a 2-core host
    (too slow for every layer of every step), and its bf16 results are wrong there."""
    if choice not in ATTENTION_CHOICES:
        raise UsageError(f"unknown attention kernel {choice!r}; choose from {', '.join(ATTENTION_CHOICES)}")
    if choice == "sdpa":
        return TORCH_SDPA, "asked for", None
    if choice == "auto" and device.type != "cuda":
        return TORCH_SDPA, ("on a CPU SGLang's Triton decode attention runs only in Triton's interpreter: "
                            "seconds per step, and its bf16 results are wrong there"), None
    try:
        fns = _sglang_decode()
    except Exception as exc:  # noqa: BLE001 - ImportError, or SGLang's own import-time failures
        why = f"SGLang's decode_attention_fwd is not importable ({_first_line(exc)})"
        if choice == "sglang_triton":
            raise UsageError(why) from None
        return TORCH_SDPA, why, None
    return SGLANG_DECODE, None, fns


class DecoderContext:
    """One rank's decoder layers; ``step`` runs them all, calling the write where it goes.

    ``layers``: how many to build (the first N of the model's; default all): a step that
    writes N layers (``--layers``) needs only their weights."""

    def __init__(self, shape: RankShape, dtype: torch.dtype, device: torch.device, context_len: int,
                 seed: int = 0, *, attention: str = "auto", rotary: str = "auto",
                 k_scale: float | None = None, v_scale: float | None = None, layers: int | None = None) -> None:
        if min(shape.hidden, shape.q_head_num, shape.intermediate) < 1:
            raise UsageError(f"model {shape.model!r} has no layer shapes for ", Setting("context"), " layer")
        if shape.q_head_num % shape.head_num:
            raise UsageError(f"{shape.q_head_num} query heads per rank do not share {shape.head_num} KV heads evenly")
        if shape.v_head_dim != shape.head_dim:
            raise UsageError(Setting("context"), " layer needs V rows as wide as K rows")
        if shape.head_dim % 2:
            raise UsageError(Setting("context"), f" layer rotates head dims in pairs; {shape.head_dim} is odd")
        if context_len < 1:
            raise UsageError(Setting("context_len"), f" must be positive, got {context_len}")
        built = shape.layers if layers is None else layers
        if not 1 <= built <= shape.layers:
            raise UsageError(Setting("layers"), f" must be between 1 and {shape.layers}, got {built}")
        self.shape = shape
        self.dtype = _layer_dtype(dtype)
        self.device = device
        self.context_len = context_len
        self.k_scale, self.v_scale = k_scale, v_scale  # fp8 caches: read back as stored x scale
        # drawn on the device: a 70B rank's weights are 17 GB, too many to draw on the host
        gen = torch.Generator(device=device).manual_seed(seed + 7919)
        h, d = shape.hidden, shape.head_dim
        q, kv, inter = shape.q_head_num, shape.head_num, shape.intermediate

        def w(*dims: int) -> torch.Tensor:
            t = torch.randn(dims, generator=gen, device=device, dtype=self.dtype)
            return t.mul_(dims[0] ** -0.5)

        self.layers = [
            LayerWeights(
                norm1=torch.ones(h, device=device, dtype=self.dtype), qkv=w(h, (q + 2 * kv) * d), o=w(q * d, h),
                norm2=torch.ones(h, device=device, dtype=self.dtype), gate_up=w(h, 2 * inter), down=w(inter, h),
            )
            for _ in range(built)
        ]
        rope = shape.rope  # the model's own (config.json's rope_theta, rope_scaling, partial rotary, style)
        self.rotary = Rotary(d, device, rope, rotary, rows=max(rope.max_position, context_len + 1))
        self.attention_kernel, self.attention_reason, self._sglang = pick_attention(device, attention)
        # SGLang's backend launches it with programmatic dependent launch on sm_90+
        self._attention_pdl = device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
        self.kernels = LayerKernels(self.attention_kernel, self.attention_reason, self.rotary.kernel,
                                    self.rotary.reason, rope=rope.as_dict())
        self._hidden: dict[int, torch.Tensor] = {}
        self._positions: dict[tuple[int, bool], torch.Tensor] = {}
        self._decode: dict[int, DecodeMeta] = {}

    def slots_needed(self, batch: int) -> int:
        """Pool rows the decode attention reads for ``batch`` requests (slot 0 excluded)."""
        return batch * self.context_len + 1

    def hidden_input(self, tokens: int) -> torch.Tensor:
        """A fixed input per token count (a graph replays from static buffers, as engines do)."""
        if tokens not in self._hidden:
            gen = torch.Generator(device="cpu").manual_seed(tokens)
            x = torch.randn((tokens, self.shape.hidden), generator=gen)
            self._hidden[tokens] = x.to(device=self.device, dtype=self.dtype)
        return self._hidden[tokens]

    def positions(self, tokens: int, decode: bool) -> torch.Tensor:
        """Each decode request's new token follows its ``ctx`` cached ones; a prefill chunk
        starts at 0. Static per token count."""
        key = (tokens, decode)
        if key not in self._positions:
            pos = torch.full((tokens,), self.context_len) if decode else torch.arange(tokens)
            self._positions[key] = pos.to(device=self.device, dtype=torch.int64)
        return self._positions[key]

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return split_qkv(qkv, self.shape.q_head_num, self.shape.head_num, self.shape.head_dim)

    def decode_meta(self, batch: int) -> DecodeMeta:
        """SGLang's decode metadata for ``batch`` requests of ``ctx`` cached tokens plus the new one."""
        meta = self._decode.get(batch)
        if meta is not None:
            return meta
        s, ctx, dev = self.shape, self.context_len, self.device
        cached = torch.arange(1, 1 + batch * ctx, dtype=torch.int64).view(batch, ctx)
        indices = torch.cat((cached, torch.zeros(batch, 1, dtype=torch.int64)), dim=1).to(dev)
        indptr = (torch.arange(batch + 1, dtype=torch.int32) * (ctx + 1)).to(dev)
        splits = torch.full((batch,), MAX_KV_SPLITS, dtype=torch.int32, device=dev)
        if self._sglang is not None:  # SGLang's planner, as its Triton backend runs it per batch
            seq_lens = torch.full((batch,), ctx + 1, dtype=torch.int32, device=dev)
            cores = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 1
            self._sglang[1][(1,)](splits, seq_lens, batch, 1, s.q_head_num, s.head_num, MAX_KV_SPLITS, cores,
                                  MAX_NUM_SEQ=max(256, 1 << (batch - 1).bit_length()))
        meta = DecodeMeta(
            kv_indptr=indptr, kv_indices=indices.view(-1), new_slots=indices[:, ctx], num_kv_splits=splits,
            attn_logits=torch.empty((batch, s.q_head_num, MAX_KV_SPLITS, s.head_dim), dtype=torch.float32, device=dev),
            attn_lse=torch.empty((batch, s.q_head_num, MAX_KV_SPLITS), dtype=torch.float32, device=dev),
        )
        self._decode[batch] = meta
        return meta

    def prepare_step(self, loc: torch.Tensor, decode: bool) -> None:
        """The step's attention metadata, before the step (and outside a captured graph, as
        SGLang updates its forward metadata before a replay): each decode request's last
        token is the slot its new K/V row is written to this step."""
        if decode:
            self.decode_meta(loc.shape[0]).new_slots.copy_(loc)

    def _decode_attention(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor,
                          meta: DecodeMeta) -> torch.Tensor:
        s = self.shape
        batch = q.shape[0]
        if self._sglang is not None:
            o = torch.empty((batch, s.q_head_num, s.head_dim), dtype=q.dtype, device=q.device)
            self._sglang[0](q, k_buf, v_buf, o, meta.kv_indptr, meta.kv_indices, meta.attn_logits, meta.attn_lse,
                            meta.num_kv_splits, MAX_KV_SPLITS, s.head_dim ** -0.5, self.k_scale or 1.0,
                            self.v_scale or 1.0, use_pdl=self._attention_pdl)
            return o.view(batch, -1)
        # SDPA: the same rows gathered ([batch, kv, ctx + 1, dim]), fp8 read back with its scales
        n = self.context_len + 1
        kc = k_buf.index_select(0, meta.kv_indices).view(batch, n, s.head_num, s.head_dim).transpose(1, 2)
        vc = v_buf.index_select(0, meta.kv_indices).view(batch, n, s.head_num, s.head_dim).transpose(1, 2)
        if kc.dtype != q.dtype:
            kc, vc = kc.to(q.dtype), vc.to(q.dtype)
            if self.k_scale is not None:
                kc = kc * self.k_scale
            if self.v_scale is not None:
                vc = vc * self.v_scale
        qq = q.reshape(batch, s.head_num, s.q_head_num // s.head_num, s.head_dim)  # [batch, kv, group, dim]
        return F.scaled_dot_product_attention(qq, kc, vc).reshape(batch, -1)

    def _prefill_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal over the chunk itself, query heads grouped on their KV head."""
        s = self.shape
        tokens = q.shape[0]
        qq = q.reshape(tokens, s.head_num, s.q_head_num // s.head_num, s.head_dim).permute(1, 2, 0, 3)
        kk = k.permute(1, 0, 2).unsqueeze(1)  # [kv, 1, tokens, dim]
        vv = v.permute(1, 0, 2).unsqueeze(1)
        out = F.scaled_dot_product_attention(qq, kk.expand_as(qq), vv.expand_as(qq), is_causal=True)
        return out.permute(2, 0, 1, 3).reshape(tokens, -1)

    def step(self, loc: torch.Tensor, write: WriteFn | None, layer_ids: list[int],
             buffers: Callable[[int], tuple[torch.Tensor, torch.Tensor]], decode: bool,
             reduce: Callable[[torch.Tensor], None] | None = None,
             rope_write: RopeWriteFn | None = None) -> torch.Tensor:
        """Every layer once (after ``prepare_step``). ``write``: the store after the layer's
        rotary (``set_kv_buffer``);
        ``rope_write``: a write that rotates q and k itself, instead of the rotary and the
        store; neither leaves the store out (the rest of the step: rotary, attention...).
        ``reduce``: the tensor-parallel all-reduce (in place) of the attention output and of
        the MLP output, where a TP layer has them."""
        s = self.shape
        if len(layer_ids) > len(self.layers):
            raise UsageError(f"a step of {len(layer_ids)} layers in a decoder context built for {len(self.layers)}")
        tokens = loc.shape[0]
        x = self.hidden_input(tokens)
        positions = self.positions(tokens, decode)
        meta = self.decode_meta(tokens) if decode else None
        rotary = self.rotary
        for layer_id, wt in zip(layer_ids, self.layers):
            h = F.rms_norm(x, (s.hidden,), wt.norm1)
            q, k, v = self.split_qkv(h @ wt.qkv)
            if rope_write is not None:
                rope_write(layer_id, loc, q, k, v, positions, rotary.cos_sin_cache, rotary.is_neox)
            else:
                rotary(q, k, positions)
                if write is not None:
                    write(layer_id, loc, k, v)
            if meta is not None:
                k_buf, v_buf = buffers(layer_id)
                attn = self._decode_attention(q, k_buf, v_buf, meta)
            else:
                attn = self._prefill_attention(q, k, v)
            out = attn @ wt.o
            if reduce is not None:
                reduce(out)
            x = x + out
            h = F.rms_norm(x, (s.hidden,), wt.norm2)
            gate, up = (h @ wt.gate_up).chunk(2, dim=-1)
            out = (F.silu(gate) * up) @ wt.down
            if reduce is not None:
                reduce(out)
            x = x + out
        return x


@dataclass
class LayerWeights:
    norm1: torch.Tensor
    qkv: torch.Tensor  # [hidden, (q + 2 kv) * dim]
    o: torch.Tensor  # [q * dim, hidden]
    norm2: torch.Tensor
    gate_up: torch.Tensor  # [hidden, 2 * intermediate]
    down: torch.Tensor  # [intermediate, hidden]


__all__ = ["ATTENTION_CHOICES", "CONTEXTS", "DEFAULT_CONTEXT_LEN", "LLAMA31_ROPE", "DecodeMeta", "DecoderContext",
           "LayerKernels", "RopeSpec", "Rotary", "SGLANG_DECODE", "TORCH_ROTARY", "TORCH_SDPA", "TRITON_ROTARY",
           "cos_sin_cache", "inv_freq", "layer_weight_bytes", "pick_attention", "split_qkv", "weight_bytes"]
