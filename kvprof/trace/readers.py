"""kvprof's built-in trace readers, registered in kvprof.core.readers by name.

Each is a small object with ``read``: Kineto/Chrome JSON (gzipped or not), an nsys SQLite
export, and an ``.nsys-rep`` (exported with nsys by kvprof.tools.nsys, then read as SQLite).
"""

from __future__ import annotations

from pathlib import Path

from kvprof.trace.kineto import read_kineto
from kvprof.trace.model import Trace
from kvprof.trace.nsys_sqlite import read_nsys_sqlite


class KinetoReader:
    name = "kineto"

    def read(self, path: Path, max_events: int, export_dir: Path | None = None) -> Trace:
        return read_kineto(path, max_events)


class NsysSqliteReader:
    name = "nsys_sqlite"

    def read(self, path: Path, max_events: int, export_dir: Path | None = None) -> Trace:
        return read_nsys_sqlite(path, max_events)


class NsysReportReader:
    """An .nsys-rep: its complete SQLite export beside it, else one made now (``export_dir``
    keeps it; without one it lives in a temporary folder for the read only)."""

    name = "nsys_rep"

    def read(self, path: Path, max_events: int, export_dir: Path | None = None) -> Trace:
        from kvprof.tools.nsys import exported

        with exported(path, export_dir) as db:
            return read_nsys_sqlite(db, max_events).replace(path=str(path))


KINETO = KinetoReader()
NSYS_SQLITE = NsysSqliteReader()
NSYS_REP = NsysReportReader()
