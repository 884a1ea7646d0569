"""The MLA latent layout: SGLang's ``MLATokenToKVPool`` (the pool: ``kvprof.kvcache.mla_pool``,
its writers' contract: ``kvprof.kvcache.contracts.MLAWriter``) and the models that pick it."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from kvprof.kvcache.layouts.layout import Layout, register_layout


@dataclass(frozen=True)
class MLAShape:
    """What an MLA model's pool looks like (the latent row is not split by tensor parallelism)."""

    name: str
    layers: int
    kv_lora_rank: int
    qk_rope_head_dim: int


# From each model's config.json (num_hidden_layers, kv_lora_rank, qk_rope_head_dim).
MLA_PRESETS: dict[str, MLAShape] = {s.name: s for s in (
    MLAShape("deepseek-v3", 61, 512, 64),
    MLAShape("deepseek-r1", 61, 512, 64),
    MLAShape("deepseek-v2", 60, 512, 64),
    MLAShape("deepseek-v2-lite", 27, 512, 64),
)}


class MLALayout(Layout):
    """One latent row per token and layer (SGLang's ``MLATokenToKVPool``); ``write``'s ``k`` is
    the latent row's nope part, ``v`` its rope part (SGLang's DeepSeek write)."""

    name = "mla"
    presets = MappingProxyType(MLA_PRESETS)


LAYOUT = register_layout(MLALayout())
