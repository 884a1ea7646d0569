"""Model presets: the KV shapes a serving engine writes, per tensor-parallel rank.

Only what shapes the KV write matters here: layers, KV heads and head dims. With tensor
parallelism each rank keeps ceil(kv_heads / tp) heads (KV heads are replicated when tp
exceeds them), which is why Llama-3.1-70B at TP 8 writes 1 head x 128 per layer. And the
rotary embedding a rope + store write and ``--context layer`` apply: each preset's own.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields, replace

from kvprof.core.errors import Setting, UsageError

ROPE_TYPES = ("default", "llama3")  # config.json's rope_scaling.rope_type; "default": no scaling


@dataclass(frozen=True)
class RopeSpec:
    """A model's rotary embedding as its config.json gives it: ``rope_theta``, ``rope_scaling``
    (``rope_type`` llama3 with its factors, or none), ``partial_rotary_factor`` (the share of
    each head rotated; the rest passes through) and ``max_position_embeddings`` (the cos/sin
    cache's rows); ``is_neox``: GPT-NeoX halves (HF's ``rotate_half``: Llama, Qwen2, Mixtral)
    or GPT-J interleaved pairs. The frequencies themselves: ``kvprof.kvcache.layer.inv_freq``."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0  # llama3 only, as the next three
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    max_position: int = 8192
    partial_rotary: float = 1.0
    is_neox: bool = True

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope_type!r} is not one of {', '.join(ROPE_TYPES)}")
        if not 0 < self.partial_rotary <= 1:
            raise ValueError(f"partial_rotary must be in (0, 1], got {self.partial_rotary}")

    def rotary_dim(self, head_dim: int) -> int:
        """The dims rotated (HF: ``int(head_dim * partial_rotary_factor)``), even."""
        return int(head_dim * self.partial_rotary) // 2 * 2

    def as_dict(self) -> dict[str, object]:
        """The parameters, without llama3's factors where the rope is not scaled."""
        scaled = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position")
        return {f.name: getattr(self, f.name) for f in fields(self)
                if self.rope_type == "llama3" or f.name not in scaled}


# meta-llama/Llama-3.1-{8B,70B,405B} config.json: rope_theta 500000, rope_scaling llama3 x8
LLAMA31_ROPE = RopeSpec(theta=500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                        original_max_position=8192, max_position=131072)


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
    # the rotary embedding; a model without a preset (LAYERSxKV_HEADSxHEAD_DIM) gets Llama-3.1's
    rope: RopeSpec = LLAMA31_ROPE

    def per_rank(self, tp: int) -> RankShape:
        if not isinstance(tp, int) or tp < 1:
            raise UsageError(Setting("tp"), f" must be a positive integer, got {tp!r}")
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
            rope=self.rope,
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
    rope: RopeSpec = LLAMA31_ROPE  # the model's rotary embedding

    def as_dict(self) -> dict[str, object]:
        """The pool's shape (the manifest's ``resolved.shape``); the rope is recorded with the
        layer's kernels (``resolved.layer.rope``)."""
        d = asdict(self)
        d.pop("rope")
        return d


# Qwen/Qwen2.5-{7B,72B}: rope_theta 1e6, no rope_scaling (YaRN is an opt-in for long inputs)
QWEN25_ROPE = RopeSpec(theta=1000000.0, max_position=131072)
# mistralai/Mixtral-8x7B-v0.1: rope_theta 1e6, no rope_scaling
MIXTRAL_ROPE = RopeSpec(theta=1000000.0, max_position=32768)
# meta-llama/Llama-3.2-1B: Llama-3.1's rope with factor 32
LLAMA32_ROPE = replace(LLAMA31_ROPE, factor=32.0)

# From each model's config.json (num_hidden_layers, num_key_value_heads, head_dim; the rope as above).
PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("llama-3.1-8b", layers=32, kv_heads=8, head_dim=128, hidden=4096, q_heads=32, intermediate=14336,
                  rope=LLAMA31_ROPE),
        ModelSpec("llama-3.1-70b", layers=80, kv_heads=8, head_dim=128, hidden=8192, q_heads=64, intermediate=28672,
                  rope=LLAMA31_ROPE),
        ModelSpec("llama-3.1-405b", layers=126, kv_heads=8, head_dim=128, hidden=16384, q_heads=128,
                  intermediate=53248, rope=LLAMA31_ROPE),
        ModelSpec("qwen2.5-7b", layers=28, kv_heads=4, head_dim=128, hidden=3584, q_heads=28, intermediate=18944,
                  rope=QWEN25_ROPE),
        ModelSpec("qwen2.5-72b", layers=80, kv_heads=8, head_dim=128, hidden=8192, q_heads=64, intermediate=29568,
                  rope=QWEN25_ROPE),
        # MoE: the layer context stands in one expert's MLP width (2 of 8 experts run per token)
        ModelSpec("mixtral-8x7b", layers=32, kv_heads=8, head_dim=128, hidden=4096, q_heads=32, intermediate=14336,
                  rope=MIXTRAL_ROPE),
        ModelSpec("llama-3.2-1b", layers=16, kv_heads=8, head_dim=64, hidden=2048, q_heads=32, intermediate=8192,
                  rope=LLAMA32_ROPE),
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
