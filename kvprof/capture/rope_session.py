"""A capture session for the MHA layout's rope writers: each write rotates q and k and stores
K and V (``KVPool.set_kv_buffer_with_rope``), as an engine's fused rope + KV-cache write does.

The workload is the MHA session's (pool, slots, phases, warm-up, graphs, ranges) plus what a
rotary embedding reads: q, k and v as views of one projection output ``[tokens, (Hq + 2 Hk) *
D]`` (the strides an engine passes), a float32 cos/sin table of ``max_position`` rows and
the tokens' positions -- consecutive for a prefill chunk, one per request for decode. The
rotation is the model's (``kvprof.kvcache.models.RopeSpec``: its rope_theta, scaling, rotated share
of the head and NeoX or GPT-J style), and each write rotates q and k in place again, as
every layer of a model rotates its own q and k. Writes only: with ``--context
layer`` the rope writers run in the MHA session's decoder layers instead of the layer's
rotary and store (``kvprof.capture.session.MHASession``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvprof.capture.plan import CapturePlan
from kvprof.capture.session import MHASession, PreparedPhase
from kvprof.core.errors import UsageError
from kvprof.kvcache.contracts import Writer
from kvprof.kvcache.layer import DecoderContext, cos_sin_cache
from kvprof.kvcache.workload import PhaseSpec


@dataclass
class RopePhase(PreparedPhase):
    """A phase's slots and inputs plus the rotary embedding's: q, positions, cos/sin table."""

    q: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    cos_sin_cache: torch.Tensor | None = None


class RopeSession(MHASession):
    """``MHASession`` whose writes go through ``set_kv_buffer_with_rope``."""

    def __init__(self, plan: CapturePlan, writer: Writer, device: torch.device, *, instrument: bool = True,
                 context: DecoderContext | None = None) -> None:
        if context is not None:
            raise UsageError(f"{writer.name} in a decoder layer runs in MHASession (session_for picks it)")
        super().__init__(plan, writer, device, instrument=instrument, context=None)
        self.q_heads = self.shape.q_head_num or self.shape.head_num
        # a table that covers every position a phase uses: decode requests at up to
        # the context length's tokens, prefill chunks from position 0
        self.max_position = max([self.plan.context_len, *(p.tokens for p in self.phases)]) + 1

    def prepare(self, spec: PhaseSpec, index: int) -> RopePhase:
        slots = self.allocator.steps(spec)  # checked on the host once
        locs = torch.from_numpy(slots).to(device=self.device, dtype=self.plan.loc_dtype)
        tokens, hq, hk = spec.tokens, self.q_heads, self.shape.head_num
        dim, v_dim = self.shape.head_dim, self.shape.v_head_dim
        gen = torch.Generator(device="cpu").manual_seed(self.plan.seed + index)
        amplitude = 1.0 if self.k_scale is None else float(self.k_scale)
        qkv = torch.randn((tokens, (hq + hk) * dim + hk * v_dim), generator=gen) * amplitude
        qkv = qkv.to(dtype=self.input_dtype, device=self.device)
        q = qkv[:, : hq * dim].view(tokens, hq, dim)
        k = qkv[:, hq * dim : (hq + hk) * dim].view(tokens, hk, dim)
        v = qkv[:, (hq + hk) * dim :].view(tokens, hk, v_dim)
        if spec.phase == "decode":  # one request per token, each at its own length
            positions = torch.randint(0, self.max_position, (tokens,), generator=gen)
        else:
            positions = torch.arange(tokens)
        rope = self.shape.rope
        table = cos_sin_cache(rope, rope.rotary_dim(dim), self.max_position).to(self.device)
        return RopePhase(spec, locs, k, v, q=q, positions=positions.to(self.device), cos_sin_cache=table)

    def step(self, prepared: PreparedPhase, loc: torch.Tensor, mode: str | None = None) -> None:
        if (mode or self.mode) != "writes":
            raise UsageError(f"{self.writer.name} captures writes only")
        assert isinstance(prepared, RopePhase)
        write = self.pool.set_kv_buffer_with_rope
        q, k, v, positions, table = prepared.q, prepared.k, prepared.v, prepared.positions, prepared.cos_sin_cache
        assert q is not None and positions is not None and table is not None  # RopeSession.prepare sets them
        for layer in self.layers:
            write(layer, loc, q, k, v, positions, table, self.shape.rope.is_neox, self.k_scale, self.v_scale)

    def bytes_per_token(self) -> int:
        """q and k read and written back, v read, the K and V rows written."""
        return self.pool.rope_bytes_per_write(1, self.q_heads, self.input_dtype)


__all__ = ["RopePhase", "RopeSession"]
