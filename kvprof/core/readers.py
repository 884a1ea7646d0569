"""Trace readers behind one Protocol and one registry: which formats kvprof reads, by name.

A reader says its ``name``, the file ``suffixes`` it is found by in a folder, whether the
first bytes of a file are its format (``sniff``), and ``read``s a file into a
``kvprof.trace.model.Trace`` (the event table of kvprof.core.schema). The loader, the
dashboard's upload filter and scrub ask this registry instead of keeping suffix lists.

Third parties add a reader from their own package with an entry point in the group
``kvprof.trace_readers`` (``name = "pkg.module:reader"``, an object with the four
members); it is tried after the built-ins. The built-ins are named here by
``module:attribute`` so that this module stays torch- and pandas-free: a reader's module
is imported only when a file of its format is read.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Lazy:
    """A built-in reader: sniffing here, reading in ``target`` (imported on first read)."""

    name: str
    suffixes: tuple[str, ...]
    sniffer: Callable[[bytes, Path], bool]
    target: str  # "module:attribute", an object with read()

    def sniff(self, head: bytes, path: Path) -> bool:
        return self.sniffer(head, path)

    def read(self, path: Path, max_events: int, export_dir: Path | None = None) -> Trace:
        module, _, attr = self.target.partition(":")
        reader = getattr(importlib.import_module(module), attr)
        return reader.read(path, max_events, export_dir)


NSYS_REP_SUFFIXES = (".nsys-rep", ".qdrep")


def _is_json(head: bytes, path: Path) -> bool:
    """Gzip (a Chrome trace is the only gzip kvprof reads), or JSON text not named as an nsys report."""
    if head[:2] == GZIP_MAGIC:
        return True
    return head.lstrip()[:1] in (b"{", b"[") and not path.name.endswith(NSYS_REP_SUFFIXES)


# Tried in this order: content first (SQLite magic, gzip/JSON), the binary .nsys-rep by name.
BUILTIN: tuple[TraceReader, ...] = (
    _Lazy("nsys_sqlite", (".sqlite",), lambda head, path: head.startswith(SQLITE_MAGIC),
          "kvprof.trace.readers:NSYS_SQLITE"),
    _Lazy("kineto", (".json", ".json.gz"), _is_json, "kvprof.trace.readers:KINETO"),
    _Lazy("nsys_rep", NSYS_REP_SUFFIXES, lambda head, path: path.name.endswith(NSYS_REP_SUFFIXES),
          "kvprof.trace.readers:NSYS_REP"),
)


class ReaderRegistry:
    def __init__(self, readers: tuple[TraceReader, ...] = BUILTIN) -> None:
        self._readers: list[TraceReader] = list(readers)
        self._entry_points_loaded = False

    def register(self, reader: TraceReader) -> None:
        if not isinstance(reader, TraceReader):
            raise UsageError(f"{reader!r} is not a trace reader (needs name, suffixes, sniff, read)")
        if any(r.name == reader.name for r in self._readers):
            raise UsageError(f"a trace reader named {reader.name!r} is already registered")
        self._readers.append(reader)

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


def builtin_suffixes(name: str) -> tuple[str, ...]:
    """A built-in reader's suffixes, without loading any plugin (for module-level constants)."""
    return next(tuple(r.suffixes) for r in BUILTIN if r.name == name)


def register(reader: Any) -> None:
    """Add a reader for this process (a package's entry point does it for every process)."""
    REGISTRY.register(reader)


__all__ = ["BUILTIN", "builtin_suffixes", "ENTRY_POINT_GROUP", "REGISTRY", "NotThisFormat", "ReaderRegistry",
           "TraceReader", "register"]
