"""Trace readers behind one Protocol and one registry: which formats kvprof reads, by name.

A reader says its ``name``, the file ``suffixes`` it is found by in a folder, whether the
first bytes of a file are its format (``sniff``), and ``read``s a file into a
``kvprof.trace.model.Trace`` (the event table of kvprof.core.schema). The loader and the
dashboard's upload filter ask this registry instead of keeping suffix lists.

kvprof's own readers (Kineto JSON, nsys SQLite, .nsys-rep) are kvprof.trace.readers', which
registers them here when kvprof.trace is imported (``register_builtin``): this module names
no layer above it, and asking the registry before that import is an error, never a silent
empty answer. Third parties add a reader from their own package with an entry point in the
group ``kvprof.trace_readers`` (``name = "pkg.module:reader"``, an object with the four
members); it is tried after the built-ins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kvprof.core.errors import TraceError, UsageError

# What ``read`` returns: a kvprof.trace.model.Trace. Named, not imported: the contract layer
# sits below the readers.
Trace = Any

ENTRY_POINT_GROUP = "kvprof.trace_readers"
SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
SNIFF_BYTES = 64


@runtime_checkable
class TraceReader(Protocol):
    # read-only: a frozen dataclass or a plain attribute both satisfy them
    @property
    def name(self) -> str: ...

    @property
    def suffixes(self) -> tuple[str, ...]: ...

    def sniff(self, head: bytes, path: Path) -> bool:
        """True when ``head`` (the file's first SNIFF_BYTES bytes) is this reader's format."""
        ...

    def read(self, path: Path, max_events: int, export_dir: Path | None = None) -> Trace:
        """The file as a Trace (write columns unset: attribution fills them)."""
        ...


class NotThisFormat(TraceError):
    """Raised by ``read`` when the content is not its format after all (a JSON that is no trace):
    a folder scan skips the file with a warning instead of failing."""


# The built-in formats' suffixes, which scrub (below the readers) also recognises files by;
# kvprof.trace.readers defines the readers themselves.
KINETO_SUFFIXES = (".json", ".json.gz")


class ReaderRegistry:
    """The readers of this process: the built-ins (registered by kvprof.trace), then the plugins."""

    def __init__(self) -> None:
        self._builtin: list[TraceReader] = []
        self._plugins: list[TraceReader] = []
        self._entry_points_loaded = False

    @property
    def _readers(self) -> list[TraceReader]:
        if not self._builtin:
            raise RuntimeError("no built-in trace reader is registered: import kvprof.trace first "
                               "(kvprof.api.trace_readers() does)")
        return [*self._builtin, *self._plugins]

    def _check(self, reader: object) -> TraceReader:
        if not isinstance(reader, TraceReader):
            raise UsageError(f"{reader!r} is not a trace reader (needs name, suffixes, sniff, read)")
        if any(r.name == reader.name for r in (*self._builtin, *self._plugins)):
            raise UsageError(f"a trace reader named {reader.name!r} is already registered")
        return reader

    def register(self, reader: TraceReader) -> None:
        """A plugin's reader: tried after the built-ins and the readers registered before it."""
        self._plugins.append(self._check(reader))

    def builtin(self) -> list[TraceReader]:
        """kvprof's own readers registered so far (kvprof.trace.readers), in their order."""
        return list(self._builtin)

    def register_builtin(self, reader: TraceReader) -> None:
        """One of kvprof's own readers (kvprof.trace.readers, when imported): tried before any plugin."""
        self._builtin.append(self._check(reader))

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        from importlib import metadata  # here: a trace of a built-in format never needs it

        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                self.register(ep.load())
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop kvprof reading its own formats
                raise UsageError(f"trace reader entry point {ep.name!r} ({ep.value}) cannot be loaded: {exc}") from None

    def readers(self) -> list[TraceReader]:
        self._load_entry_points()
        return list(self._readers)

    def get(self, name: str) -> TraceReader:
        for r in self.readers():
            if r.name == name:
                return r
        raise UsageError(f"no trace reader named {name!r}")

    def suffixes(self) -> tuple[str, ...]:
        """Every suffix a registered reader is found by, longest first (".json.gz" before ".gz")."""
        found = {s for r in self.readers() for s in r.suffixes}
        return tuple(sorted(found, key=lambda s: (-len(s), s)))

    def suffixes_of(self, name: str) -> tuple[str, ...]:
        return tuple(self.get(name).suffixes)

    def is_trace_name(self, name: str) -> bool:
        return name.lower().endswith(self.suffixes())

    def for_head(self, head: bytes, path: Path) -> TraceReader | None:
        """The first reader, in registration order, whose format ``head`` is. The built-in ones
        come first, so plugins are looked up (importlib.metadata, 40 ms) only when none is it."""
        found = next((r for r in self._readers if r.sniff(head, path)), None)
        if found is not None or self._entry_points_loaded:
            return found
        return next((r for r in self.readers() if r.sniff(head, path)), None)

    def describe(self) -> str:
        return ", ".join(f"{r.name} ({' '.join(r.suffixes)})" for r in self.readers())


REGISTRY = ReaderRegistry()


def register(reader: Any) -> None:
    """Add a reader for this process (a package's entry point does it for every process)."""
    REGISTRY.register(reader)


__all__ = ["ENTRY_POINT_GROUP", "GZIP_MAGIC", "KINETO_SUFFIXES", "REGISTRY", "SNIFF_BYTES", "SQLITE_MAGIC",
           "NotThisFormat", "ReaderRegistry", "TraceReader", "register"]
