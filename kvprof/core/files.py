"""Open input files safely: only regular files, never blocking on a FIFO or a device.

Every reader (traces, manifests, scrub) opens its input through here, so a FIFO or a
device named as a trace is refused with one line instead of hanging the command.
"""

from __future__ import annotations

import gzip
import io
import os
import stat
import zlib
from pathlib import Path
from typing import IO

from kvprof.core.errors import TraceError, UsageError
from kvprof.core.readers import GZIP_MAGIC


def file_type(mode: int) -> str:
    """A word for a non-regular file type, for messages."""
    for test, word in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return word
    return "not a regular file"


def require_regular(path: Path, what: str = "input") -> os.stat_result:
    """stat() of ``path`` (links followed), UsageError unless it is a regular file.

    Checked before any open: opening a FIFO for reading blocks until a writer appears.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"no such file or directory: {path}") from None
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{path}: {file_type(st.st_mode)}, not a regular file; kvprof reads only regular files as "
                         f"{what}")
    return st


def open_regular(path: Path) -> IO[bytes]:
    """Open ``path`` for reading without blocking and only if it is a regular file.

    O_NONBLOCK makes the open itself return at once even for a FIFO; the fstat then decides,
    so a file swapped for a FIFO between a check and the open is still refused.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UsageError(f"no such file or directory: {path}") from None
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UsageError(f"{path}: {file_type(mode)}, not a regular file; kvprof reads only regular files")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: Path, what: str) -> bytes:
    """The bytes of a regular file a run holds beside its traces (manifest.json, summary.json, the step
    timings), refused in one line (TraceError, exit 3) past the size a trace may have once decompressed
    (``KVPROF_MAX_TRACE_MB``, kvprof.core.schema.max_trace_bytes): such a file is kilobytes to megabytes,
    and a reader that takes any size can be made to hold gigabytes."""
    from kvprof.core.schema import MAX_TRACE_MB_ENV, max_trace_bytes

    limit = max_trace_bytes()
    with open_regular(path) as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise TraceError(f"{path}: {what} larger than {limit / 2**20:g} MiB, the most a trace may hold "
                         f"({MAX_TRACE_MB_ENV} raises it)")
    return data


def gunzipped(data: bytes) -> bytes:
    """``data`` decompressed if it is a gzip stream (results are kept gzipped), else as it is;
    ValueError naming a broken stream (zlib's own error is no OSError or ValueError) or one
    that inflates past the size a trace may have (``KVPROF_MAX_TRACE_MB``, as ``read_bounded``)."""
    if data[:2] != GZIP_MAGIC:
        return data
    from kvprof.core.schema import MAX_TRACE_MB_ENV, max_trace_bytes

    limit = max_trace_bytes()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as fh:
            out = fh.read(limit + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"a broken gzip stream ({exc})") from None
    if len(out) > limit:
        raise ValueError(f"a gzip stream larger than {limit / 2**20:g} MiB once inflated "
                         f"({MAX_TRACE_MB_ENV} raises it)")
    return out
