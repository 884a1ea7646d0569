"""One registry of write implementations, by name.

Built-ins register themselves when ``kvprof.writers`` is imported. Third parties either
declare an entry point in the group ``kvprof.writers`` (``name = "pkg.mod:factory"``)
or pass ``--writer pkg.mod:factory`` on the command line. A factory is any callable
returning a ``KVWriter`` (a subclass itself works).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib import metadata

from kvprof.argtypes import typed_options
from kvprof.core.errors import UsageError
from kvprof.writers.base import KVWriter

WriterFactory = Callable[..., KVWriter]

ENTRY_POINT_GROUP = "kvprof.writers"


class WriterRegistry:
    """Name -> factory. An instance, not module state, so tests can build their own."""

    def __init__(self) -> None:
        self._factories: dict[str, WriterFactory] = {}
        self._entry_points_loaded = False

    def register(self, name: str, factory: WriterFactory, *, replace: bool = False) -> None:
        if not name.isidentifier():
            raise ValueError(f"writer name {name!r} must be an identifier")
        if name in self._factories and not replace:
            raise ValueError(f"a writer named {name!r} is already registered")
        self._factories[name] = factory

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name not in self._factories:
                self._factories[ep.name] = _lazy(ep)

    def names(self) -> list[str]:
        self._load_entry_points()
        return list(self._factories)

    def create(self, spec: str, **options: object) -> KVWriter:
        """Build a writer from a registered name or a ``module:function`` spec."""
        if ":" in spec:
            factory = resolve_spec(spec)
        else:
            self._load_entry_points()
            if spec not in self._factories:
                raise UsageError(
                    f"unknown variant {spec!r}; known: {', '.join(self.names())} "
                    "(or give module:function)"
                )
            factory = self._factories[spec]
        writer = factory(**typed_options(factory, options, spec))
        if not isinstance(writer, KVWriter):
            raise UsageError(f"writer {spec!r} returned {type(writer).__name__}, not a KVWriter")
        if not writer.name:
            writer.name = spec.replace(":", ".")
        return writer


def resolve_spec(spec: str) -> WriterFactory:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import writer module {module_name!r}: {exc}") from None
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise UsageError(f"module {module_name!r} has no writer factory {attr!r}") from None
    if not callable(factory):
        raise UsageError(f"writer {spec!r} is not callable")
    return factory


def _lazy(ep: metadata.EntryPoint) -> WriterFactory:
    def factory(**options: object) -> KVWriter:
        try:
            target = ep.load()
        except Exception as exc:  # a broken third-party plugin must not take kvprof down
            raise UsageError(f"cannot load writer entry point {ep.name!r} ({ep.value}): {exc}") from None
        return target(**options)

    return factory


# The registry kvprof itself uses; built-ins are added in kvprof/writers/__init__.py.
REGISTRY = WriterRegistry()
register = REGISTRY.register
create_writer = REGISTRY.create
writer_names = REGISTRY.names
