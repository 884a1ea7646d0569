"""Layout-first helpers over the one writer registry (``kvprof.kvcache.registry``) and the
layouts (``kvprof.kvcache.layouts.layout``): a writer of a layout by name, a capture's variant, the
layout a model picks. No table of its own: the writers are the registry's, the roles,
capture defaults and presets each layout's.
"""

from __future__ import annotations

from kvprof.kvcache.contracts import Writer, check_layout
from kvprof.kvcache.layouts.layout import ENGINES, pick_layout
from kvprof.kvcache.layouts.mla import MLA_PRESETS, MLAShape
from kvprof.kvcache.writers import REGISTRY

__all__ = ["ENGINES", "MLA_PRESETS", "MLAShape", "check_layout", "create_variant", "create_writer", "pick_layout",
           "writer_names"]


def writer_names(layout: str) -> list[str]:
    return REGISTRY.names(layout)


def create_writer(layout: str, name: str, **options: object) -> Writer:
    """A writer of ``layout`` by name or ``module:function`` (``UsageError`` for an unknown one)."""
    return REGISTRY.create(name, layout=layout, **options)


create_variant = create_writer  # a capture's variant: a --variants name or a --writer spec
