"""Write outputs so that a reader never sees half of one.

Every output goes to a temporary name next to its final path (same directory, so the
same filesystem), is flushed to disk, and is renamed into place only when complete.
On any exception, Ctrl-C included, the temporary is removed and the final path is
untouched. Temporaries are dot-files named ``.<final>.tmp-<pid>-<random>`` so a crashed
run leaves something obviously disposable, and the next kvprof run that writes into the
same folder removes those whose process is gone (``clean_stale``).

A set of files that belong together (analyze's outputs) is written by ``atomic_outputs``:
staged in one hidden folder, then swapped in with SIGINT/SIGTERM held back, old files moved
aside first (the completion marker, summary.json, first) and put back if any rename fails.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from kvprof.core.errors import KvprofError, OutputError, UsageError
from kvprof.core.interrupts import signals_deferred

_WRITE_MODES = {"w", "wb", "x", "xb", "wt", "xt"}
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})  # the disk cannot take it


# errors of the path itself, as given (too long, a loop of links, a name the filesystem refuses):
# a bad argument, exit 2, as for any other path kvprof refuses; any other OSError on an output is
# the output that cannot be written (exit 6): permissions, something in the way, a full disk
PATH_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ELOOP, errno.EINVAL})


def output_error(exc: OSError, message: str) -> KvprofError:
    """The one-line error for an OSError met writing an output: ``UsageError`` where the path
    itself is refused (``PATH_ERRNOS``), else ``OutputError``."""
    return UsageError(message) if exc.errno in PATH_ERRNOS else OutputError(message)


def temp_name(final: Path, suffix: str = "") -> Path:
    """A fresh hidden name next to ``final`` (not created)."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}{suffix}")


_TEMP = re.compile(r"\..+\.tmp-(?P<pid>\d+)-[0-9a-f]{8}(?:\.[^/]*)?\Z")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or not a pid we can ask about): leave it
    return True


def clean_stale(folder: Path) -> list[Path]:
    """Remove kvprof temporaries in ``folder`` whose writing process no longer exists.

    Only names of the form ``.<name>.tmp-<pid>-<8 hex>`` are touched: what a killed
    (SIGKILL, power loss) capture or analyze left behind.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for e in entries:
        m = _TEMP.match(e.name)
        if m and not _alive(int(m["pid"])):
            _remove(Path(e.path))
            removed.append(Path(e.path))
    return removed


def _prepare_parent(final: Path) -> Path:
    """Create the parent if missing; OutputError (one line) if it cannot be written."""
    parent = final.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(exc, f"cannot create output folder {parent}: {exc.strerror or exc}") from None
    if not parent.is_dir():
        raise OutputError(f"cannot write {final}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write {final}: folder {parent} is not writable")
    return parent


def _fsync_dir(path: Path) -> None:
    """Make a rename durable; some filesystems refuse to open folders, which is fine."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()


def _replace(tmp: Path, final: Path) -> None:
    try:
        os.replace(tmp, final)
    except OSError as exc:
        raise output_error(exc, f"cannot write {final}: {exc.strerror or exc}") from None
    _fsync_dir(final.parent)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], *, keep_suffix: bool = False) -> Iterator[Path]:
    """Yield a temporary path for a writer we do not control (sqlite, a subprocess).

    The caller creates the file at the yielded path; on success it is fsynced and renamed
    over ``path``. ``keep_suffix`` ends the temporary name with ``path``'s suffix, for
    tools that append their own extension otherwise (``nsys export``).
    """
    final = Path(path)
    _prepare_parent(final)
    tmp = temp_name(final, final.suffix if keep_suffix else "")
    try:
        yield tmp
        if not tmp.is_file():
            raise OutputError(f"cannot write {final}: nothing was written")
        _fsync_file(tmp)
        _replace(tmp, final)
    except BaseException as exc:
        _remove(tmp)
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            raise output_error(exc, f"cannot write {final}: {exc.strerror or exc}") from None
        raise


@contextlib.contextmanager
def atomic_file(
    path: str | os.PathLike[str], mode: str = "wb", *, encoding: str | None = None
) -> Iterator[IO[Any]]:
    """Open a temporary file for writing; it replaces ``path`` only if the block succeeds.

    ``mode`` is ``w``/``wb`` (replace) or ``x``/``xb`` (refuse an existing ``path``).
    """
    if mode not in _WRITE_MODES:
        raise ValueError(f"atomic_file writes whole files; mode {mode!r} is not one of {_WRITE_MODES}")
    final = Path(path)
    if "x" in mode and final.exists():
        raise OutputError(f"cannot write {final}: it already exists")
    binary = "b" in mode
    if binary and encoding is not None:
        raise ValueError("encoding is for text modes")
    with atomic_path(final) as tmp:
        try:
            fh = open(tmp, "xb" if binary else "x", encoding=None if binary else (encoding or "utf-8"))
        except OSError as exc:
            raise output_error(exc, f"cannot write {final}: {exc.strerror or exc}") from None
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        if "x" in mode and final.exists():
            raise OutputError(f"cannot write {final}: it already exists")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step."""
    with atomic_file(path, "wb") as fh:
        fh.write(data)


def atomic_write_text(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """Replace ``path`` with ``text`` in one step."""
    with atomic_file(path, "w", encoding=encoding) as fh:
        fh.write(text)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath, name)
            if p.is_file() and not p.is_symlink():
                with contextlib.suppress(OSError):
                    _fsync_file(p)
        _fsync_dir(Path(dirpath))


@contextlib.contextmanager
def atomic_directory(final_path: str | os.PathLike[str], replace: bool = False) -> Iterator[Path]:
    """Yield a temporary folder that becomes ``final_path`` only if the block succeeds.

    Refuses an existing ``final_path`` (a run folder is never merged into another one)
    unless ``replace``: then the old folder stays whole until the new one is complete, is
    moved aside, the new one renamed in, and the old one removed (signals held back
    between the two renames; the old one is put back if the second fails).
    On any exception, KeyboardInterrupt included, the temporary folder is removed.
    """
    final = Path(final_path)
    if (final.exists() or final.is_symlink()) and not (replace and final.is_dir() and not final.is_symlink()):
        raise OutputError(f"cannot write {final}: it already exists")
    _prepare_parent(final)
    clean_stale(final.parent)
    tmp = temp_name(final)
    try:
        tmp.mkdir()
    except OSError as exc:
        raise output_error(exc, f"cannot write {final}: {exc.strerror or exc}") from None
    try:
        yield tmp
        _fsync_tree(tmp)
        if replace and final.is_dir() and not final.is_symlink():
            _replace_directory(tmp, final)
            return
        if final.exists() or final.is_symlink():
            raise OutputError(f"cannot write {final}: it appeared while this run was writing")
        try:
            os.rename(tmp, final)
        except OSError as exc:
            raise output_error(exc, f"cannot write {final}: {exc.strerror or exc}") from None
        _fsync_dir(final.parent)
    except BaseException:
        _remove(tmp)
        raise


def _replace_directory(tmp: Path, final: Path) -> None:
    """``final`` (a folder) -> aside, ``tmp`` -> ``final``, then the old one removed."""
    aside = temp_name(final, ".old")
    with signals_deferred():
        try:
            os.rename(final, aside)
        except OSError as exc:
            raise output_error(exc, f"cannot replace {final}: {exc.strerror or exc}") from None
        try:
            os.rename(tmp, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.rename(aside, final)
            raise output_error(exc, f"cannot replace {final}: {exc.strerror or exc}; the old folder is kept") from None
    _fsync_dir(final.parent)
    _remove(aside)


@contextlib.contextmanager
def atomic_outputs(folder: str | os.PathLike[str], marker: str) -> Iterator[Path]:
    """Yield a staging folder; on success every file in it replaces its namesake in ``folder``
    as one set, ``marker`` (the file whose presence says the set is whole) placed last.

    Before any rename, every target is checked to be replaceable (a folder or a device in
    the way is an OutputError with nothing changed). The renames run with SIGINT/SIGTERM
    held back; an old file is moved aside first and put back if a later rename fails, so a
    reader sees the old set, then no marker, then the new set: never a new file beside an
    old summary. On any exception the staging folder goes and ``folder`` is as it was.
    """
    out = Path(folder)
    _prepare_parent(out / marker)
    clean_stale(out)
    stage = temp_name(out / "outputs")
    try:
        stage.mkdir()
    except OSError as exc:
        raise output_error(exc, f"cannot write into {out}: {exc.strerror or exc}") from None
    try:
        yield stage
        names = sorted(p.name for p in stage.iterdir())
        if marker not in names:
            raise OutputError(f"cannot write {out / marker}: it was not produced")
        for n in names:
            _fsync_file(stage / n)
            target = out / n
            if target.is_symlink() or (target.exists() and not stat.S_ISREG(target.stat().st_mode)):
                raise OutputError(f"cannot write {target}: something other than a file is in the way")
        _swap_in(stage, out, [marker, *(n for n in names if n != marker)])
        _fsync_dir(out)
    finally:
        _remove(stage)


def _swap_in(stage: Path, out: Path, names: list[str]) -> None:
    """Move old files aside (in ``names`` order: the marker first), then place the new ones
    (the marker last); undo everything if one rename fails."""
    aside = stage / ".old"
    aside.mkdir()
    moved: list[str] = []
    placed: list[str] = []
    with signals_deferred():
        try:
            for n in names:
                if (out / n).exists():
                    os.rename(out / n, aside / n)
                    moved.append(n)
            for n in [*names[1:], names[0]]:
                os.rename(stage / n, out / n)
                placed.append(n)
        except OSError as exc:
            for n in placed:
                with contextlib.suppress(OSError):
                    os.unlink(out / n)
            for n in moved:
                with contextlib.suppress(OSError):
                    os.rename(aside / n, out / n)
            raise OutputError(f"cannot write {exc.filename or out}: {exc.strerror or exc}; the previous "
                              "outputs are kept") from None
