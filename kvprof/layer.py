"""The rest of a decoder layer around each KV write, for ``--context layer``.

In an engine the write sits between the QKV projection and attention: launch gaps,
programmatic dependent launch and a second stream behave differently there than in 80
writes back to back. This module builds one rank's layer at the preset's per-rank shapes
(RMSNorm, QKV GEMM, a rotary-like elementwise on q and k, the write, attention over the
cached tokens, output projection, RMSNorm, gate/up GEMM, SiLU x up, down GEMM, residual
adds) with distinct weights per layer, so weights stream from memory as in a real step.
Tensor-parallel all-reduces are not modelled (one rank, one process).

Attention reads the pool's own K/V buffers: request ``r``'s context is the slot range
``[1 + r * ctx, 1 + (r + 1) * ctx)``, a view (no gather), so the attention kernel reads
what the cache holds, ``ctx`` tokens per request, while the new token's K/V row goes to
the workload's slots. Prefill attends causally over its own chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvprof.core.errors import UsageError
from kvprof.models import RankShape

CONTEXTS = ("none", "layer")
DEFAULT_CONTEXT_LEN = 4096

WriteFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]  # (layer, loc, k, v)


@dataclass
class LayerWeights:
    norm1: torch.Tensor
    qkv: torch.Tensor  # [hidden, (q + 2 kv) * dim]
    o: torch.Tensor  # [q * dim, hidden]
    norm2: torch.Tensor
    gate_up: torch.Tensor  # [hidden, 2 * intermediate]
    down: torch.Tensor  # [intermediate, hidden]


def weight_bytes(shape: RankShape, dtype: torch.dtype) -> int:
    """Bytes of every layer's weights: the memory estimate a guard checks before allocating."""
    elem = torch.empty((), dtype=dtype).element_size()
    h, d, q, kv, i = shape.hidden, shape.head_dim, shape.q_head_num, shape.head_num, shape.intermediate
    per_layer = 2 * h + h * (q + 2 * kv) * d + q * d * h + h * 2 * i + i * h
    return per_layer * shape.layers * elem


class DecoderContext:
    """One rank's decoder layers; ``step`` runs them all, calling ``write`` where the KV write goes."""

    def __init__(self, shape: RankShape, dtype: torch.dtype, device: torch.device, context_len: int,
                 seed: int = 0) -> None:
        if min(shape.hidden, shape.q_head_num, shape.intermediate) < 1:
            raise UsageError(f"model {shape.model!r} has no layer shapes for --context layer")
        if shape.q_head_num % shape.head_num:
            raise UsageError(f"{shape.q_head_num} query heads per rank do not share {shape.head_num} KV heads evenly")
        if shape.v_head_dim != shape.head_dim:
            raise UsageError("--context layer needs V rows as wide as K rows")
        if context_len < 1:
            raise UsageError(f"--context-len must be positive, got {context_len}")
        self.shape = shape
        self.dtype = dtype if dtype in (torch.float16, torch.bfloat16, torch.float32) else torch.bfloat16
        self.device = device
        self.context_len = context_len
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
            for _ in range(shape.layers)
        ]
        angle = torch.rand(d // 2, generator=gen, device=device) * 6.2831853
        self.cos = angle.cos().to(device=device, dtype=self.dtype)
        self.sin = angle.sin().to(device=device, dtype=self.dtype)
        self._hidden: dict[int, torch.Tensor] = {}

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

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Rotary-like: one elementwise pass over [tokens, heads, dim] with fixed angles."""
        a, b = x[..., ::2], x[..., 1::2]
        return torch.cat((a * self.cos - b * self.sin, a * self.sin + b * self.cos), dim=-1)

    def _attention(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, decode: bool,
                   k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        s = self.shape
        tokens = q.shape[0]
        group = s.q_head_num // s.head_num
        if decode:
            ctx = self.context_len
            # [batch, kv, ctx, dim] views of the pool (fp8 caches are read as the compute dtype)
            kc = k_buf[1 : 1 + tokens * ctx].view(tokens, ctx, s.head_num, s.head_dim).transpose(1, 2)
            vc = v_buf[1 : 1 + tokens * ctx].view(tokens, ctx, s.head_num, s.head_dim).transpose(1, 2)
            if kc.dtype != q.dtype:
                kc, vc = kc.to(q.dtype), vc.to(q.dtype)
            qq = q.view(tokens, s.head_num, group, s.head_dim)  # [batch, kv, group, dim]
            out = F.scaled_dot_product_attention(qq, kc, vc)
            return out.reshape(tokens, s.q_head_num * s.head_dim)
        # prefill: causal over the chunk itself, query heads grouped on their KV head
        qq = q.view(tokens, s.head_num, group, s.head_dim).permute(1, 2, 0, 3)  # [kv, group, tokens, dim]
        kk = k_new.permute(1, 0, 2).unsqueeze(1)  # [kv, 1, tokens, dim]
        vv = v_new.permute(1, 0, 2).unsqueeze(1)
        out = F.scaled_dot_product_attention(qq, kk.expand_as(qq), vv.expand_as(qq), is_causal=True)
        return out.permute(2, 0, 1, 3).reshape(tokens, s.q_head_num * s.head_dim)

    def step(self, loc: torch.Tensor, write: WriteFn | None, layer_ids: list[int],
             buffers: Callable[[int], tuple[torch.Tensor, torch.Tensor]], decode: bool,
             reduce: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """Every layer once; ``write`` None leaves the KV write out (the step's cost without it).
        ``reduce``: the tensor-parallel all-reduce (in place) of the attention output and of
        the MLP output, where a TP layer has them."""
        s = self.shape
        x = self.hidden_input(loc.shape[0])
        qd, kvd = s.q_head_num * s.head_dim, s.head_num * s.head_dim
        for layer_id, wt in zip(layer_ids, self.layers):
            h = F.rms_norm(x, (s.hidden,), wt.norm1)
            qkv = h @ wt.qkv
            q = self._rotate(qkv[:, :qd].view(-1, s.q_head_num, s.head_dim))
            k = self._rotate(qkv[:, qd : qd + kvd].view(-1, s.head_num, s.head_dim))
            v = qkv[:, qd + kvd :].view(-1, s.head_num, s.head_dim)  # a strided view, as engines pass it
            if write is not None:
                write(layer_id, loc, k, v)
            k_buf, v_buf = buffers(layer_id)
            attn = self._attention(q.reshape(-1, qd), k_buf, v_buf, decode, k, v)
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


__all__ = ["CONTEXTS", "DEFAULT_CONTEXT_LEN", "DecoderContext", "weight_bytes"]
