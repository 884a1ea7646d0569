"""kvprof's write implementations of every layout (one module per writer or family).

Each is registered by (layout, name) in the one registry, ``kvprof.kvcache.registry``, from
the variant table (``kvprof.core.variants``: the entry's ``module:factory``); the contracts
they implement are ``kvprof.kvcache.contracts``. The names below are the registry's and the
contracts', for callers that build writers.
"""

from __future__ import annotations

from kvprof.kvcache.contracts import (
    FALLBACK_PREFIX,
    FUSED,
    ROPE_FUSED,
    TWO_COPIES,
    TWO_STREAMS,
    KVWriter,
    is_fused_path,
)
from kvprof.kvcache.registry import BUILTINS, REGISTRY, WriterRegistry, builtin, create_writer, register, writer_names

__all__ = [
    "BUILTINS", "FALLBACK_PREFIX", "FUSED", "ROPE_FUSED", "TWO_COPIES", "TWO_STREAMS", "KVWriter", "REGISTRY",
    "WriterRegistry", "builtin", "create_writer", "is_fused_path", "register", "writer_names",
]
