"""What a KV-cache layout is: one ``Layout`` per cache kvprof models, MHA beside MLA and paged.

A layout names the contract(s) its writers implement (``kvprof.kvcache.contracts``: a writer is
checked against them when it is built), the roles of its built-in writers (the bit-exact
reference, the engine's unfused path, the engine's own fused kernels, kvprof's fused writers)
and what a capture runs by default -- both read from the variant table,
``kvprof.core.variants`` -- and the model presets that pick it. The writers themselves are in
the one registry, ``kvprof.kvcache.registry``, keyed by (layout, name); the pools that hold a
layout's cache sit above the layouts (``kvprof.kvcache.pool``, ``mla_pool``, ``paged_pool``;
``kvprof.kvcache.instrument.make_layout_pool`` builds any of them).

Each layout module (``mha``, ``mla``, ``paged``) registers its ``Layout`` here when it is
imported, and ``kvprof.kvcache.layouts`` imports all three: importing this module imports the
package first, so ``get_layout`` always finds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from kvprof.core import variants
from kvprof.core.errors import UsageError
from kvprof.kvcache.contracts import WRITER_CONTRACTS, ContractTable, Writer, check_layout

if TYPE_CHECKING:
    from collections import Counter

    import torch

# which layout an engine writes for a model with ordinary (MHA/GQA) attention
ENGINES = {"sglang": "mha", "vllm": "paged"}


class WritePool(Protocol):
    """What every layout's pool offers a workload beside its own write calls."""

    path_counts: Counter[str]
    start_layer: int
    layer_num: int

    @property
    def writer(self) -> Writer: ...

    def bytes_per_write(self, tokens: int, input_dtype: torch.dtype | None = None) -> int: ...

    def describe(self) -> dict[str, Any]: ...

    def write_layer(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_scale: Any = None, v_scale: Any = None) -> None: ...


PoolT = TypeVar("PoolT", bound=WritePool)


class Layout:
    """One cache layout: its writers' contracts and roles, its capture defaults and presets."""

    name: str
    # models whose cache only this layout holds: naming one picks the layout
    presets: Mapping[str, Any] = MappingProxyType({})

    def __init__(self, contracts: ContractTable = WRITER_CONTRACTS) -> None:
        self._contracts = contracts

    @property
    def writer_contracts(self) -> Mapping[str, type]:
        """Contract name -> the base class a writer of that contract is an instance of."""
        return self._contracts.of(self.name)

    @property
    def writer_bases(self) -> tuple[type, ...]:
        return self._contracts.bases(self.name)

    def add_writer_contract(self, contract: str, base: type) -> None:
        """Accept writers of another contract within this layout (another ``write`` signature
        over the same pool, e.g. a rotary embedding fused with the store)."""
        self._contracts.add(self.name, contract, base)

    def contract_of(self, writer: object) -> str | None:
        """The contract ``writer`` implements here, None if none (it is not a writer of this layout)."""
        return self._contracts.contract_of(self.name, writer)

    # the roles of the layout's built-in store writers, from the variant table
    @property
    def reference(self) -> str:
        """The bit-exact reference writer (plain copies)."""
        return variants.store_roles(self.name)["reference"][0]

    @property
    def unfused(self) -> str:
        """The engine's write without a fused kernel: what fused writers are held against."""
        return variants.store_roles(self.name)["unfused"][0]

    @property
    def fused(self) -> tuple[str, ...]:
        """kvprof's fused writers."""
        return variants.store_roles(self.name)["fused"]

    @property
    def peers(self) -> tuple[str, ...]:
        """The engine's own fused kernels, where installable."""
        return variants.store_roles(self.name)["peer"]

    @property
    def capture_defaults(self) -> tuple[str, ...]:
        """What a capture runs when no variants are named."""
        return variants.capture_defaults(self.name)

    def roles(self) -> dict[str, tuple[str, ...]]:
        """The built-in writers by role, for tables and for checking the variant table agrees."""
        return dict(variants.store_roles(self.name))

    def write(self, pool: WritePool, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              k_scale: Any = None, v_scale: Any = None) -> None:
        """One layer's write as the engine calls it: ``k``/``v`` are the layout's two inputs
        (MHA and paged: keys and values; MLA: the latent row's nope and rope parts)."""
        pool.write_layer(layer, loc, k, v, k_scale, v_scale)


_REGISTERED: dict[str, Layout] = {}


def register_layout(layout: Layout) -> Layout:
    """Make ``layout`` the one ``get_layout`` returns for its name (each layout module's last line)."""
    check_layout(layout.name)
    if layout.name in _REGISTERED:
        raise ValueError(f"the {layout.name} layout is registered already")
    _REGISTERED[layout.name] = layout
    return layout


def get_layout(name: str) -> Layout:
    """The layout named ``name`` (``UsageError`` for an unknown one)."""
    return _REGISTERED[check_layout(name)]


def pick_layout(model: str, layout: str | None = None, engine: str | None = None) -> str:
    """The layout a run uses: given, else the model's (MLA presets -> mla), else the engine's."""
    if engine is not None and engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    mla = get_layout("mla").presets
    mla_model = model.strip().lower() in mla
    if layout is not None:
        check_layout(layout)
        if mla_model and layout != "mla":
            raise UsageError(f"{model} caches an MLA latent row: it has no {layout} layout")
        if layout == "mla" and not mla_model:
            raise UsageError(f"the mla layout needs an MLA model ({', '.join(mla)}), got {model!r}")
        return layout
    if mla_model:
        return "mla"
    return ENGINES[engine or "sglang"]
