"""What a KV-cache layout is: one ``Layout`` per cache kvprof models, MHA beside MLA and paged.

A layout names its pool class and how a workload writes one layer into it, the contract(s)
its writers implement (base classes: a writer is checked against them when it is built),
the roles of its built-in writers (the bit-exact reference, the engine's unfused path,
the engine's own fused kernels, kvprof's fused writers), what a capture runs by default,
and the model presets that pick it. The writers themselves are in the one registry,
``kvprof.kvcache.writers.registry``, keyed by (layout, name).

This module imports no torch at run time, so the registry can name layouts without loading
their pools; ``get_layout`` imports a layout's module when it is first asked for.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from kvprof.core.errors import UsageError

if TYPE_CHECKING:
    from collections import Counter

    import torch

    from kvprof.kvcache.writers.base import WriterInfo

# the layouts, in table order, and the module whose ``LAYOUT`` describes each
LAYOUTS = ("mha", "mla", "paged")
_MODULES = {"mha": "kvprof.kvcache.layouts.mha", "mla": "kvprof.kvcache.layouts.mla",
            "paged": "kvprof.kvcache.layouts.paged"}
# which layout an engine writes for a model with ordinary (MHA/GQA) attention
ENGINES = {"sglang": "mha", "vllm": "paged"}


class Writer(Protocol):
    """What every writer offers beside its layout's ``write`` (``KVWriter``, ``MLAWriter``,
    ``PagedWriter`` and any further contract a layout accepts)."""

    name: str
    description: str
    fused: bool
    devices: tuple[str, ...]

    def info(self) -> WriterInfo: ...

    def unsupported_reason(self, device: torch.device, dtype: torch.dtype,
                           input_dtype: torch.dtype | None = None) -> str | None: ...

    def prepare(self, device: torch.device) -> None: ...

    def launches_pdl(self, device: torch.device) -> bool | None: ...


class WritePool(Protocol):
    """What every layout's pool offers a workload beside its own write call."""

    path_counts: Counter[str]
    start_layer: int
    layer_num: int

    @property
    def writer(self) -> Writer: ...

    def bytes_per_write(self, tokens: int, input_dtype: torch.dtype | None = None) -> int: ...

    def describe(self) -> dict[str, Any]: ...


PoolT = TypeVar("PoolT", bound=WritePool)


class Layout(abc.ABC, Generic[PoolT]):
    """One cache layout: its pool, its writers' contracts and roles, its capture defaults and presets."""

    name: str
    pool_class: type[PoolT]
    reference: str  # the bit-exact reference writer (plain copies)
    unfused: str  # the engine's write without a fused kernel: what fused writers are held against
    fused: tuple[str, ...]  # kvprof's fused writers
    peers: tuple[str, ...]  # the engine's own fused kernels, where installable
    capture_defaults: tuple[str, ...]  # what a capture runs when no variants are named
    # models whose cache only this layout holds: naming one picks the layout
    presets: Mapping[str, Any] = MappingProxyType({})

    def __init__(self, writer_contracts: Mapping[str, type]) -> None:
        self._contracts: dict[str, type] = dict(writer_contracts)

    @property
    def writer_contracts(self) -> Mapping[str, type]:
        """Contract name -> the base class a writer of that contract is an instance of."""
        return MappingProxyType(self._contracts)

    @property
    def writer_bases(self) -> tuple[type, ...]:
        return tuple(self._contracts.values())

    def add_writer_contract(self, contract: str, base: type) -> None:
        """Accept writers of another contract within this layout (another ``write`` signature
        over the same pool, e.g. a rotary embedding fused with the store)."""
        known = self._contracts.get(contract)
        if known is not None and known is not base:
            raise ValueError(f"the {self.name} layout's {contract!r} contract is {known.__name__} already")
        self._contracts[contract] = base

    def contract_of(self, writer: object) -> str | None:
        """The contract ``writer`` implements here, None if none (it is not a writer of this layout)."""
        return next((c for c, base in self._contracts.items() if isinstance(writer, base)), None)

    def roles(self) -> dict[str, tuple[str, ...]]:
        """The built-in writers by role, for tables and for checking the variant table agrees."""
        return {"reference": (self.reference,), "unfused": (self.unfused,), "peer": self.peers,
                "fused": self.fused}

    @abc.abstractmethod
    def make_pool(self, *args: Any, instrument: bool = False, variant: str | None = None, **kwargs: Any) -> PoolT:
        """The layout's pool (its own constructor arguments); with ``instrument`` its writes are
        NVTX and torch.profiler ranges named by ``variant`` (default: the writer's name)."""

    @abc.abstractmethod
    def write(self, pool: PoolT, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              k_scale: Any = None, v_scale: Any = None) -> None:
        """One layer's write as the engine calls it: ``k``/``v`` are the layout's two inputs
        (MHA and paged: keys and values; MLA: the latent row's nope and rope parts)."""


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise UsageError(f"unknown layout {layout!r}; choose from {', '.join(LAYOUTS)}")
    return layout


def get_layout(name: str) -> Layout[Any]:
    """The layout named ``name`` (``UsageError`` for an unknown one)."""
    module = importlib.import_module(_MODULES[check_layout(name)])
    layout: Layout[Any] = module.LAYOUT
    return layout


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
