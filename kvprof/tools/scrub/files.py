"""Scrub one file or a folder: pick the scrubber by content and suffix, rewrite atomically."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from kvprof.core.errors import KvprofError, OutputError, TraceError, UsageError
from kvprof.core.files import open_regular, require_regular
from kvprof.tools.scrub.rules import (
    DEFAULT_MAX_BYTES,
    GZIP_MAGIC,
    JSON_SUFFIXES,
    PARQUET_SUFFIXES,
    REPORT_SUFFIXES,
    SIDECARS,
    SQLITE_MAGIC,
    SQLITE_SUFFIXES,
    TEXT_SUFFIXES,
    ZIP_MAGIC,
    ZIP_SUFFIXES,
    Rules,
    ScrubReport,
    find_values,
    too_big,
    total_size,
)
from kvprof.tools.scrub.sqlite import scrub_sqlite
from kvprof.tools.scrub.tables import scrub_parquet
from kvprof.tools.scrub.text import scrub_json, scrub_text

# ---------------------------------------------------------------- dispatch


def file_kind(path: Path) -> str | None:
    """"sqlite" | "json" | "text" | "nsys-rep" by name, else by first bytes, else None."""
    name = path.name.lower()
    if name.endswith(REPORT_SUFFIXES):
        return "nsys-rep"
    if name.endswith(SQLITE_SUFFIXES):
        return "sqlite"
    if name.endswith(JSON_SUFFIXES):
        return "json"
    if name.endswith(TEXT_SUFFIXES):
        return "text"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    if name.endswith(ZIP_SUFFIXES):
        return "zip"
    with open_regular(path) as fh:
        head = fh.read(16)
    if head == SQLITE_MAGIC:
        return "sqlite"
    if head.startswith(ZIP_MAGIC):
        return "zip"
    if head.startswith(GZIP_MAGIC) or head.lstrip()[:1] in (b"{", b"["):
        return "json"
    return None


def _link_report(link: Path) -> ScrubReport:
    target = os.path.realpath(link)
    return ScrubReport(link, "symlink", note=f"symbolic link to {target}: not rewritten (scrub the target "
                                              "itself); the check below reads it")


def _unrewritable(path: Path, kind: str, rules: Rules) -> ScrubReport:
    size = total_size([path])
    if size > rules.max_bytes:  # read whole for its raw bytes: bounded like every other file
        raise too_big(path, rules.max_bytes)
    leaks = tuple(find_values([path], rules.needles()))
    if kind == "zip":
        note = "a zip is not rewritten (its members are checked below: stored or deflated, each inflated)"
    elif kind == "nsys-rep":
        note = (
            "an .nsys-rep cannot be rewritten; share the scrubbed .sqlite export instead "
            "(kvprof capture and kvprof nsys run nsys isolated, with the allowlisted environment)"
        )
    else:
        note = "unknown file type, not rewritten (scrub rewrites .sqlite, .json, .json.gz, .log, .txt, gzipped or not)"
    if leaks:
        note = f"holds the value of {', '.join(leaks)} in plain bytes; do not share it ({note})"
    return ScrubReport(path, kind, bytes_before=size, bytes_after=size, note=note, leaks=leaks)


def scrub_path(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None,
               max_bytes: int = DEFAULT_MAX_BYTES) -> ScrubReport:
    """Scrub one file in place (atomically). ``env``: whose secret values to hunt (default:
    this process's environment); ``max_bytes``: the most it reads into memory (decompressed).
    A file of no known type (and an .nsys-rep) is not rewritten, only checked for secret
    values (``leaks``). UsageError for a missing path (ResourceError, one of them, for a file
    over ``max_bytes``), TraceError for an unreadable file, OutputError for an unwritable one."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: no such file")
    if p.is_dir():
        raise UsageError(f"{p}: is a folder (scrub_tree scrubs folders)")
    report = _scrub_one(p.resolve(), Rules(env, max_bytes=max_bytes))  # resolved: a named link's target is scrubbed
    report.path = p
    return report


def _scrub_file(p: Path, rules: Rules) -> ScrubReport:
    kind = file_kind(p)
    if kind == "sqlite":
        return scrub_sqlite(p, rules)
    if kind == "json":
        return scrub_json(p, rules)
    if kind == "text":
        return scrub_text(p, rules)
    if kind == "parquet":
        return scrub_parquet(p, rules)
    return _unrewritable(p, kind or "other", rules)


def _os_error(path: Path, exc: OSError) -> KvprofError:
    """A failed read or write as the one-line error of its kind (a full disk is exit 6)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM):
        return OutputError(f"cannot rewrite {path}: {exc.strerror or exc}; the original is kept")
    return TraceError(f"cannot read {path}: {exc.strerror or exc}")


def _scrub_one(p: Path, rules: Rules) -> ScrubReport:
    require_regular(p, "a file to scrub")  # a FIFO would block the read forever
    try:
        return _scrub_file(p, rules)
    except OSError as exc:
        raise _os_error(p, exc) from None


def scrub_tree(
    root: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    on_error: Callable[[KvprofError], None] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> list[ScrubReport]:
    """Scrub every known file under ``root``; other files are only checked for secret
    values (reported when found). A symbolic link is not followed to rewrite what it points
    at (that may be anywhere): it gets a report saying so, and ``check_path`` checks its
    target. kvprof temporaries are skipped. A file that fails raises, or, with
    ``on_error``, is passed to it and the walk goes on."""
    base = Path(root)
    if not base.is_dir():
        return [scrub_path(base, env=env, max_bytes=max_bytes)]
    rules = Rules(env, max_bytes=max_bytes)
    reports: list[ScrubReport] = []

    def unreadable(exc: OSError) -> None:  # os.walk skips what it cannot list unless told
        err = TraceError(f"cannot read the folder {exc.filename}: {exc.strerror or exc}; not scrubbed")
        if on_error is None:
            raise err
        on_error(err)

    for dirpath, dirnames, filenames in os.walk(base, onerror=unreadable):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if Path(dirpath, d).is_symlink()]:
            p = Path(dirpath, name)
            if p.is_symlink():
                reports.append(_link_report(p))
                continue
            if name.startswith(".") and ".tmp-" in name:
                continue
            if name.endswith(SIDECARS):
                continue  # handled with its database
            try:
                report = _scrub_one(p.resolve(), rules)
                if report.kind != "other" or report.leaks:  # clean unknown files: not listed
                    reports.append(report)
            except KvprofError as exc:
                if on_error is None:
                    raise
                on_error(exc)
    return reports
