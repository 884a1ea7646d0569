"""Atomic outputs: complete or absent, never half-written, temporaries always cleaned."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvprof.core.atomic import atomic_directory, atomic_file, atomic_path, atomic_write_bytes, atomic_write_text
from kvprof.core.errors import OutputError


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def test_write_bytes_and_text_replace(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    atomic_write_bytes(target, b"one")
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two"
    text = tmp_path / "sub" / "out.txt"  # missing parent is created
    atomic_write_text(text, "héllo")
    assert text.read_text(encoding="utf-8") == "héllo"
    assert _leftovers(tmp_path) == [] and _leftovers(tmp_path / "sub") == []


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_atomic_file_failure_keeps_old_content(tmp_path: Path, exc: BaseException) -> None:
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(type(exc)):
        with atomic_file(target, "w") as fh:
            fh.write("new, half")
            raise exc
    assert target.read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_atomic_file_exclusive_mode(tmp_path: Path) -> None:
    target = tmp_path / "once"
    with atomic_file(target, "xb") as fh:
        fh.write(b"1")
    with pytest.raises(OutputError, match="already exists"):
        with atomic_file(target, "xb") as fh:
            fh.write(b"2")
    assert target.read_bytes() == b"1"
    with pytest.raises(ValueError):
        with atomic_file(target, "a"):
            pass


def test_atomic_path_for_foreign_writers(tmp_path: Path) -> None:
    target = tmp_path / "export.sqlite"
    with atomic_path(target, keep_suffix=True) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".export.sqlite.tmp-")
        assert tmp.suffix == ".sqlite" and not target.exists()
        tmp.write_bytes(b"data")
    assert target.read_bytes() == b"data"
    with pytest.raises(OutputError, match="nothing was written"):
        with atomic_path(tmp_path / "never"):
            pass
    assert not (tmp_path / "never").exists() and _leftovers(tmp_path) == []


def test_atomic_directory_success(tmp_path: Path) -> None:
    final = tmp_path / "runs" / "run-1"
    with atomic_directory(final) as tmp:
        assert tmp.name.startswith(".run-1.tmp-") and tmp.parent == final.parent
        assert not final.exists()
        (tmp / "a.txt").write_text("a")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text("b")
    assert (final / "sub" / "b.txt").read_text() == "b"
    assert _leftovers(final.parent) == []


@pytest.mark.parametrize("exc", [ValueError("x"), KeyboardInterrupt(), SystemExit(3)])
def test_atomic_directory_removed_on_any_exception(tmp_path: Path, exc: BaseException) -> None:
    final = tmp_path / "run"
    with pytest.raises(type(exc)):
        with atomic_directory(final) as tmp:
            (tmp / "partial.json").write_text("{")
            raise exc
    assert not final.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_directory_refuses_existing(tmp_path: Path) -> None:
    final = tmp_path / "run"
    final.mkdir()
    (final / "keep").write_text("k")
    with pytest.raises(OutputError, match="already exists"):
        with atomic_directory(final):
            pass
    assert (final / "keep").read_text() == "k"


def test_atomic_directory_final_appears_meanwhile(tmp_path: Path) -> None:
    final = tmp_path / "run"
    with pytest.raises(OutputError, match="appeared"):
        with atomic_directory(final) as tmp:
            (tmp / "x").write_text("x")
            final.mkdir()
    assert list(final.iterdir()) == [] and _leftovers(tmp_path) == []


def test_parent_is_a_file_is_one_line_output_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for make in (lambda: atomic_directory(blocker / "run"), lambda: atomic_file(blocker / "x.json", "w")):
        with pytest.raises(OutputError) as info:
            with make():
                pass
        assert "\n" not in str(info.value) and str(blocker) in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_parent_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(OutputError, match="not writable"):
            with atomic_directory(locked / "run"):
                pass
        with pytest.raises(OutputError, match="not writable"):
            atomic_write_text(locked / "x.txt", "x")
    finally:
        locked.chmod(0o700)


def test_parent_not_writable_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same check as above where the tests run as root (os.access says yes to root)."""
    import kvprof.core.atomic as atomic

    monkeypatch.setattr(atomic.os, "access", lambda *a, **k: False)
    with pytest.raises(OutputError, match="not writable") as info:
        with atomic_directory(tmp_path / "run"):
            pass
    assert "\n" not in str(info.value)
    with pytest.raises(OutputError, match="not writable"):
        atomic_write_bytes(tmp_path / "x.bin", b"x")
    assert list(tmp_path.iterdir()) == []
