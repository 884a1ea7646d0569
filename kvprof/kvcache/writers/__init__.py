"""kvprof's write implementations of every layout, one module per writer or family, and the
registry callers use (``REGISTRY``, ``create_writer``, ``writer_names``, ``register``).

Importing this package registers kvprof's own writers into the one registry below it
(``kvprof.kvcache.registry``), from the variant table (``kvprof.core.variants``: each entry's
layout, name and ``module:factory``); each writer's module is imported only when the writer is
first built (triton, compilers and sgl-kernel load on demand). The contracts the writers
implement are ``kvprof.kvcache.contracts``.
"""

from __future__ import annotations

import importlib

from kvprof.core import variants
from kvprof.core.errors import UsageError
from kvprof.kvcache.contracts import (
    FALLBACK_PREFIX,
    FUSED,
    ROPE_FUSED,
    TWO_COPIES,
    TWO_STREAMS,
    KVWriter,
    Writer,
    is_fused_path,
)
from kvprof.kvcache.registry import (
    REGISTRY,
    WriterFactory,
    WriterRegistry,
    create_writer,
    register,
    typed_options,
    writer_names,
)


def builtin(name: str, spec: str) -> WriterFactory:
    """A factory for kvprof's writer ``spec`` ("module:factory", the variant table's), imported
    only when it is built (triton, compilers, sgl-kernel)."""
    module, _, attr = spec.partition(":")

    def factory(**options: object) -> Writer:
        try:
            mod = importlib.import_module(module)
        except ImportError as exc:
            raise UsageError(f"writer {name} cannot be imported: {exc}") from None
        writer_class = getattr(mod, attr)
        try:  # a boolean option given as text ("no") is made a bool, or refused
            writer: Writer = writer_class(**typed_options(writer_class, options, name))
        except TypeError as exc:  # unknown option names
            raise UsageError(f"bad option for writer {name}: {exc}") from None
        return writer

    return factory


# (layout, name, "module:factory") of kvprof's own writers, in the variant table's order
BUILTINS: tuple[tuple[str, str, str], ...] = variants.builtin_writers()
for _layout, _name, _spec in BUILTINS:
    register(_name, builtin(_name, _spec), layout=_layout)

__all__ = [
    "BUILTINS", "FALLBACK_PREFIX", "FUSED", "ROPE_FUSED", "TWO_COPIES", "TWO_STREAMS", "KVWriter", "REGISTRY",
    "WriterRegistry", "builtin", "create_writer", "is_fused_path", "register", "writer_names",
]
