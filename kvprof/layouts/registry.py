"""The writers of each layout by name, their roles, and the presets that pick a layout.

A layout's writers have their own ``write`` contract (``MLAWriter``, ``PagedWriter``), so they
are listed here per layout rather than beside the MHA writers: ``--variant mla_triton`` on an
MHA pool is refused by name, not by a crash in a kernel.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from kvprof.argtypes import typed_options
from kvprof.core.errors import UsageError
from kvprof.layouts.base import LAYOUTS, LayoutWriter

# (name, module under kvprof.writers, class); the order is the order of tables
WRITERS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "mla": (
        ("mla_index_put", "mla_torch", "MLAIndexPutWriter"),
        ("mla_cat_copy", "mla_torch", "MLACatCopyWriter"),
        ("sglang_mla", "mla_sglang", "SglangMLAWriter"),
        ("mla_triton", "mla_triton", "MLATritonWriter"),
        ("mla_cuda", "layout_cuda", "MLACudaWriter"),
    ),
    "paged": (
        ("paged_index_put", "paged_torch", "PagedIndexPutWriter"),
        ("paged_unfused", "paged_torch", "PagedUnfusedWriter"),
        ("paged_triton", "paged_triton", "PagedTritonWriter"),
        ("paged_cuda", "layout_cuda", "PagedCudaWriter"),
    ),
}
REFERENCE = {"mla": "mla_index_put", "paged": "paged_index_put"}
UNFUSED = {"mla": "mla_cat_copy", "paged": "paged_unfused"}  # the engine's path without a fused kernel
FUSED = {"mla": ("mla_triton", "mla_cuda"), "paged": ("paged_triton", "paged_cuda")}  # kvprof's fused writers
PEERS = {"mla": ("sglang_mla",), "paged": ()}  # the engine's own fused kernel, where installable


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise UsageError(f"unknown layout {layout!r}; choose from {', '.join(LAYOUTS)}")
    return layout


def writer_names(layout: str) -> list[str]:
    check_layout(layout)
    return [name for name, _, _ in WRITERS.get(layout, ())]


def create_writer(layout: str, name: str, **options: object) -> LayoutWriter:
    """A writer of ``layout`` by name (``UsageError`` for an unknown one)."""
    for known, module, cls in WRITERS.get(check_layout(layout), ()):
        if known == name:
            try:
                mod = importlib.import_module(f"kvprof.writers.{module}")
            except ImportError as exc:
                raise UsageError(f"writer {name} cannot be imported: {exc}") from None
            writer_class = getattr(mod, cls)
            try:  # a boolean option given as text ("no") is made a bool, or refused
                return writer_class(**typed_options(writer_class, options, name))
            except TypeError as exc:
                raise UsageError(f"bad option for writer {name}: {exc}") from None
    raise UsageError(f"{name!r} is not a writer of the {layout} layout; known: {', '.join(writer_names(layout))}")


# what a capture of the layout runs when no variants are named (the references drop padded
# slots with a host sync, so they are not captured by default)
CAPTURE_DEFAULTS = {"mla": ("mla_cat_copy", "sglang_mla", "mla_triton", "mla_cuda"),
                    "paged": ("paged_unfused", "paged_triton", "paged_cuda")}


def create_variant(layout: str, name: str, **options: object):  # noqa: ANN201
    """A writer for a capture of ``layout``: the MHA registry's for "mha", else this table's."""
    if check_layout(layout) == "mha":
        from kvprof.writers import create_writer as create_mha_writer

        return create_mha_writer(name, **options)
    return create_writer(layout, name, **options)


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
# which layout an engine writes for a model with ordinary (MHA/GQA) attention
ENGINES = {"sglang": "mha", "vllm": "paged"}


def pick_layout(model: str, layout: str | None = None, engine: str | None = None) -> str:
    """The layout a run uses: given, else the model's (MLA presets -> mla), else the engine's."""
    if engine is not None and engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    mla_model = model.strip().lower() in MLA_PRESETS
    if layout is not None:
        check_layout(layout)
        if mla_model and layout != "mla":
            raise UsageError(f"{model} caches an MLA latent row: it has no {layout} layout")
        if layout == "mla" and not mla_model:
            raise UsageError(f"the mla layout needs an MLA model ({', '.join(MLA_PRESETS)}), got {model!r}")
        return layout
    if mla_model:
        return "mla"
    return ENGINES[engine or "sglang"]
