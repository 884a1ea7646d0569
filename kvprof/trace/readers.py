"""kvprof's built-in trace readers, registered into kvprof.core.readers when kvprof.trace is imported.

Each is a small object with the reader Protocol's four members: Kineto/Chrome JSON (gzipped
or not), an nsys SQLite export, and an ``.nsys-rep`` (exported with nsys by kvprof.tools.nsys,
then read as SQLite). Registration goes from this layer down into core's registry, so core
names no reader module; the loader, the dashboard and scrub find them there. Sniffing needs
only the first bytes and the name; a reader's module (numpy, pandas) is imported by ``read``,
when a file of its format is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvprof.core.readers import GZIP_MAGIC, KINETO_SUFFIXES, REGISTRY, SQLITE_MAGIC
from kvprof.core.rundir import RunDir

if TYPE_CHECKING:  # pandas: imported by a read, not by the registration
    from kvprof.trace.model import Trace


class NsysSqliteReader:
    name = "nsys_sqlite"
    suffixes = (RunDir.NSYS_SQLITE_SUFFIX,)

    def sniff(self, head: bytes, path: Path) -> bool:
        return head.startswith(SQLITE_MAGIC)

    def read(self, path: Path, max_events: int, export_dir: Path | None = None) -> Trace:
        from kvprof.trace.nsys_sqlite import read_nsys_sqlite

        return read_nsys_sqlite(path, max_events)


class KinetoReader:
    name = "kineto"
    suffixes = KINETO_SUFFIXES

    def sniff(self, head: bytes, path: Path) -> bool:
        """Gzip (a Chrome trace is the only gzip kvprof reads), or JSON text not named as an nsys report."""
        if head[:2] == GZIP_MAGIC:
            return True
        return head.lstrip()[:1] in (b"{", b"[") and not path.name.endswith(RunDir.NSYS_REP_SUFFIXES)

    def read(self, path: Path, max_events: int, export_dir: Path | None = None) -> Trace:
        from kvprof.trace.kineto import read_kineto

        return read_kineto(path, max_events)


class NsysReportReader:
    """An .nsys-rep: its complete SQLite export beside it, else one made now (``export_dir``
    keeps it; without one it lives in a temporary folder for the read only)."""

    name = "nsys_rep"
    suffixes = RunDir.NSYS_REP_SUFFIXES

    def sniff(self, head: bytes, path: Path) -> bool:
        return path.name.endswith(RunDir.NSYS_REP_SUFFIXES)

    def read(self, path: Path, max_events: int, export_dir: Path | None = None) -> Trace:
        from kvprof.tools.nsys import exported
        from kvprof.trace.nsys_sqlite import read_nsys_sqlite

        with exported(path, export_dir) as db:
            return read_nsys_sqlite(db, max_events).replace(path=str(path))


KINETO = KinetoReader()
NSYS_SQLITE = NsysSqliteReader()
NSYS_REP = NsysReportReader()

# Tried in this order, before any plugin: content first (SQLite magic, gzip/JSON), the binary
# .nsys-rep by name.
BUILTIN = (NSYS_SQLITE, KINETO, NSYS_REP)
for _reader in BUILTIN:
    if all(r.name != _reader.name for r in REGISTRY.builtin()):  # once, even if this module is reloaded
        REGISTRY.register_builtin(_reader)

__all__ = ["BUILTIN", "KINETO", "NSYS_REP", "NSYS_SQLITE"]
