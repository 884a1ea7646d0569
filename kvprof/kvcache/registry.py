"""One registry of write implementations, keyed by (layout, name).

The registry sits below the writers and loads none of them itself: kvprof's own writers of
every layout are registered into it from above, by ``kvprof.kvcache.writers`` when that package
is imported (from the variant table, ``kvprof.core.variants``: each entry's ``module:factory``,
imported only when the writer is first built), so callers use ``kvprof.kvcache.writers``'s
``create_writer``/``writer_names``/``REGISTRY``.
Third parties either declare an entry point (``name = "pkg.mod:factory"``) in the group of
the writer's layout -- ``kvprof.writers`` (or ``kvprof.writers.mha``) for the MHA pool,
``kvprof.writers.<layout>`` for another (``kvprof.writers.mla``, ``kvprof.writers.paged``)
-- or pass ``--writer pkg.mod:factory`` on the command line, which builds it for the
capture's layout. A factory is any callable returning a writer (a subclass itself works);
what it returns must implement one of the layout's writer contracts
(``Layout.writer_bases``: ``KVWriter`` for MHA, ``MLAWriter``, ``PagedWriter``), or it is
refused by name before it reaches a pool.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib import metadata

from kvprof.core.errors import KvprofError, UsageError
from kvprof.kvcache.contracts import LAYOUTS, WRITER_CONTRACTS, ContractTable, Writer, check_layout

WriterFactory = Callable[..., Writer]

ENTRY_POINT_GROUP = "kvprof.writers"  # the MHA writers' group (the pyproject.toml entry points' group)
MHA = "mha"


def entry_point_groups(layout: str) -> tuple[str, ...]:
    """The entry-point groups third-party writers of ``layout`` are declared in."""
    if check_layout(layout) == MHA:
        return ENTRY_POINT_GROUP, f"{ENTRY_POINT_GROUP}.{MHA}"
    return (f"{ENTRY_POINT_GROUP}.{layout}",)


class WriterRegistry:
    """(layout, name) -> factory. An instance, not module state, so tests can build their own
    (``contracts``: where a layout's writer contracts are looked up, kvprof's unless given).
    ``layout`` defaults to "mha" everywhere, the MHA writers' API before layouts existed."""

    def __init__(self, contracts: ContractTable = WRITER_CONTRACTS) -> None:
        self._factories: dict[tuple[str, str], WriterFactory] = {}
        self._loaded: set[str] = set()  # layouts whose entry points were read
        self._contracts = contracts

    def register(self, name: str, factory: WriterFactory, *, layout: str = MHA, replace: bool = False) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"unknown layout {layout!r} for writer {name!r}; choose from {', '.join(LAYOUTS)}")
        if not name.isidentifier():
            raise ValueError(f"writer name {name!r} must be an identifier")
        if (layout, name) in self._factories and not replace:
            raise ValueError(f"a writer named {name!r} is already registered for the {layout} layout")
        self._factories[(layout, name)] = factory

    def _load_entry_points(self, layout: str) -> None:
        if layout in self._loaded:
            return
        self._loaded.add(layout)
        for group in entry_point_groups(layout):
            for ep in metadata.entry_points(group=group):
                self._factories.setdefault((layout, ep.name), _lazy(ep))

    def names(self, layout: str = MHA) -> list[str]:
        """The writers of ``layout``, built-ins in table order, then third parties'."""
        self._load_entry_points(check_layout(layout))
        return [name for (owner, name) in self._factories if owner == layout]

    def create(self, spec: str, *, layout: str = MHA, **options: object) -> Writer:
        """Build a writer of ``layout`` from a registered name or a ``module:function`` spec."""
        if ":" in spec:
            factory = resolve_spec(spec)
        else:
            known = self.names(layout)
            if spec not in known:
                raise UsageError(f"unknown variant {spec!r}: not a writer of the {layout} layout; known: "
                                 f"{', '.join(known)} (or give module:function)")
            factory = self._factories[(layout, spec)]
        try:
            writer = factory(**typed_options(factory, options, spec))
        except KvprofError:
            raise
        except Exception as exc:  # a factory that raises: the one-line error of a writer that cannot be built
            text = str(exc).strip().splitlines()
            raise UsageError(f"writer {spec!r} could not be built: {type(exc).__name__}"
                             f"{': ' + text[0] if text else ''}") from None
        bases = self._contracts.bases(layout)
        if not isinstance(writer, bases):
            raise UsageError(f"writer {spec!r} returned {type(writer).__name__}, not a "
                             f"{' or '.join(b.__name__ for b in bases)} (a writer of the {layout} layout)")
        if not writer.name:
            writer.name = spec.replace(":", ".")
        return writer


# a boolean writer option given as text (``two_stream.always=no``)
BOOL_WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}


def _shown(text: object) -> str:
    """A value as an error repeats it: at most 60 characters of it."""
    shown = repr(text) if isinstance(text, str) else str(text)
    return shown if len(shown) <= 60 else f"{shown[:57]}..."


def _annotation_is_bool(annotation: object) -> bool:
    """``bool`` or ``bool | None`` (also as the string ``from __future__ import annotations`` leaves)."""
    if isinstance(annotation, str):
        text = annotation.replace("Optional[bool]", "bool | None")
        parts = {p.strip() for p in text.split("|")}
        return "bool" in parts and parts <= {"bool", "None"}
    if annotation is bool:
        return True
    args = tuple(getattr(annotation, "__args__", ()) or ())
    return bool in args and set(args) <= {bool, type(None)}


def typed_options(factory: Callable[..., object], options: dict[str, object], label: str) -> dict[str, object]:
    """``options`` for ``factory``, with each value for a boolean parameter made a real bool.

    The command line gives text: ``two_stream.always=no`` used to reach ``bool("no")``, which is
    True. A boolean parameter takes a bool, 1/0, true/false, yes/no or on/off (any case);
    anything else is a UsageError naming ``label.key``. Parameters of other types, and
    factories whose signature cannot be read, get the values unchanged.
    """
    import inspect

    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return dict(options)
    out = dict(options)
    for key, value in options.items():
        param = params.get(key)
        if param is None or not _annotation_is_bool(param.annotation) or isinstance(value, bool) or value is None:
            continue
        word = value if isinstance(value, str) else str(value) if isinstance(value, int) else None
        parsed = BOOL_WORDS.get(word.strip().lower()) if word is not None else None
        if parsed is None:
            raise UsageError(f"{label}.{key} takes true/false, yes/no, on/off or 1/0, got {_shown(value)}")
        out[key] = parsed
    return out


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
    return factory  # type: ignore[no-any-return]


def _lazy(ep: metadata.EntryPoint) -> WriterFactory:
    def factory(**options: object) -> Writer:
        try:
            target = ep.load()
        except Exception as exc:  # a broken third-party plugin must not take kvprof down
            raise UsageError(f"cannot load writer entry point {ep.name!r} ({ep.value}): {exc}") from None
        writer: Writer = target(**options)
        return writer

    return factory


# The registry kvprof itself uses; kvprof's own writers are registered into it from above, by
# kvprof.kvcache.writers (the package that holds them) when it is imported.
REGISTRY = WriterRegistry()
register = REGISTRY.register
create_writer = REGISTRY.create
writer_names = REGISTRY.names
