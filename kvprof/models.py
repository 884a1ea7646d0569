"""Model presets: the KV shapes a serving engine writes, per tensor-parallel rank.

Only what shapes the KV write matters here: layers, KV heads and head dims. With tensor
parallelism each rank keeps ceil(kv_heads / tp) heads (KV heads are replicated when tp
exceeds them), which is why Llama-3.1-70B at TP 8 writes 1 head x 128 per layer.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from kvprof.core.errors import UsageError


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    v_head_dim: int | None = None
    # The rest of a decoder layer, for ``--context layer`` (from config.json: hidden_size,
    # num_attention_heads, intermediate_size). None: derived (q_heads = kv_heads,
    # hidden = q_heads x head_dim, intermediate = 4 x hidden).
    hidden: int | None = None
    q_heads: int | None = None
    intermediate: int | None = None

    def per_rank(self, tp: int) -> RankShape:
        if not isinstance(tp, int) or tp < 1:
            raise UsageError(f"--tp must be a positive integer, got {tp!r}")
        return RankShape(
            model=self.name,
            tp=tp,
            layers=self.layers,
            head_num=math.ceil(self.kv_heads / tp),
            head_dim=self.head_dim,
            v_head_dim=self.v_head_dim or self.head_dim,
            hidden=self.hidden or (self.q_heads or self.kv_heads) * self.head_dim,
            q_head_num=math.ceil((self.q_heads or self.kv_heads) / tp),
            intermediate=math.ceil(
                (self.intermediate or 4 * (self.hidden or (self.q_heads or self.kv_heads) * self.head_dim)) / tp),
        )


@dataclass(frozen=True)
class RankShape:
    """What one rank's pool looks like."""

    model: str
    tp: int
    layers: int
    head_num: int
    head_dim: int
    v_head_dim: int
    # the layer around the write (``--context layer``): hidden size (not split by TP),
    # query heads and MLP width per rank
    hidden: int = 0
    q_head_num: int = 0
    intermediate: int = 0

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


# From each model's config.json (num_hidden_layers, num_key_value_heads, head_dim).
PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("llama-3.1-8b", layers=32, kv_heads=8, head_dim=128, hidden=4096, q_heads=32, intermediate=14336),
        ModelSpec("llama-3.1-70b", layers=80, kv_heads=8, head_dim=128, hidden=8192, q_heads=64, intermediate=28672),
        ModelSpec("llama-3.1-405b", layers=126, kv_heads=8, head_dim=128, hidden=16384, q_heads=128,
                  intermediate=53248),
        ModelSpec("qwen2.5-7b", layers=28, kv_heads=4, head_dim=128, hidden=3584, q_heads=28, intermediate=18944),
        ModelSpec("qwen2.5-72b", layers=80, kv_heads=8, head_dim=128, hidden=8192, q_heads=64, intermediate=29568),
        # MoE: the layer context stands in one expert's MLP width (2 of 8 experts run per token)
        ModelSpec("mixtral-8x7b", layers=32, kv_heads=8, head_dim=128, hidden=4096, q_heads=32, intermediate=14336),
        ModelSpec("llama-3.2-1b", layers=16, kv_heads=8, head_dim=64, hidden=2048, q_heads=32, intermediate=8192),
    )
}

_INLINE = re.compile(
    r"^(?:(?P<name>[\w.\-]+)=)?(?P<layers>\d+)x(?P<heads>\d+)x(?P<dim>\d+)(?:x(?P<vdim>\d+))?$"
)


def resolve_model(name: str, extra: dict[str, ModelSpec] | None = None) -> ModelSpec:
    """A preset name (case-insensitive), one of ``extra``, or an inline ``[name=]LAYERSxKV_HEADSxHEAD_DIM[xV_DIM]``."""
    table = {**PRESETS, **(extra or {})}
    key = name.strip().lower()
    if key in table:
        return table[key]
    match = _INLINE.match(key)
    if match:
        layers, heads, dim = (int(match[g]) for g in ("layers", "heads", "dim"))
        if min(layers, heads, dim) < 1:
            raise UsageError(f"model {name!r}: layers, heads and head dim must be positive")
        vdim = int(match["vdim"]) if match["vdim"] else None
        return ModelSpec(match["name"] or key, layers, heads, dim, vdim)
    raise UsageError(
        f"unknown model {name!r}; presets: {', '.join(PRESETS)} "
        "(or give LAYERSxKV_HEADSxHEAD_DIM, e.g. mymodel=40x8x128)"
    )
