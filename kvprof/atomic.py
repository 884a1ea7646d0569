"""Write outputs so that a reader never sees half of one.

Every output goes to a temporary name next to its final path (same directory, so the
same filesystem), is flushed to disk, and is renamed into place only when complete.
On any exception, Ctrl-C included, the temporary is removed and the final path is
untouched. Temporaries are dot-files named ``.<final>.tmp-<pid>-<random>`` so a crashed
run leaves something obviously disposable.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from kvprof.errors import OutputError

_WRITE_MODES = {"w", "wb", "x", "xb", "wt", "xt"}


def temp_name(final: Path, suffix: str = "") -> Path:
    """A fresh hidden name next to ``final`` (not created)."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}{suffix}")


def _prepare_parent(final: Path) -> Path:
    """Create the parent if missing; OutputError (one line) if it cannot be written."""
    parent = final.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create output folder {parent}: {exc.strerror or exc}") from None
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
        raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from None
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
    except BaseException:
        _remove(tmp)
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
            raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from None
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
def atomic_directory(final_path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary folder that becomes ``final_path`` only if the block succeeds.

    Refuses an existing ``final_path`` (a run folder is never merged into another one).
    On any exception, KeyboardInterrupt included, the temporary folder is removed.
    """
    final = Path(final_path)
    if final.exists() or final.is_symlink():
        raise OutputError(f"cannot write {final}: it already exists")
    _prepare_parent(final)
    tmp = temp_name(final)
    try:
        tmp.mkdir()
    except OSError as exc:
        raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from None
    try:
        yield tmp
        _fsync_tree(tmp)
        if final.exists() or final.is_symlink():
            raise OutputError(f"cannot write {final}: it appeared while this run was writing")
        try:
            os.rename(tmp, final)
        except OSError as exc:
            raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from None
        _fsync_dir(final.parent)
    except BaseException:
        _remove(tmp)
        raise
