"""scrub's limits: SQLite constraints it cannot satisfy, and the bound on what it decompresses.

Regression cases: a CHECK constraint or a trigger that refuses the marker made scrub retry the
UPDATE forever (every IntegrityError was taken for a UNIQUE collision); a small .json.gz that
expands to gigabytes was read whole into memory by ``scrub`` and ``scrub --check``.
"""

from __future__ import annotations

import gzip
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kvprof.cli import main

SECRET = "sk-planted0123456789abcdefXYZ"
REPO = Path(__file__).resolve().parents[1]


def _scrub_in_a_process(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``kvprof scrub`` in its own process, killed if it does not end (a loop must fail the test)."""
    return subprocess.run([sys.executable, "-m", "kvprof", "scrub", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO),
                                                          "KVPROF_PLANTED_KEY": SECRET})


@pytest.mark.parametrize("guard", [
    "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT CHECK (value NOT LIKE '[kvprof%'))",
    "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);"
    "CREATE TRIGGER no_marker BEFORE UPDATE ON StringIds BEGIN SELECT RAISE(ABORT, 'read-only table'); END",
])
def test_a_constraint_that_refuses_the_marker_fails_in_one_line_and_keeps_the_file(tmp_path: Path, guard: str) -> None:
    db = tmp_path / "e.sqlite"
    con = sqlite3.connect(db)
    con.executescript(guard)
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, f"HF_TOKEN={SECRET}"), (2, "kernel")])
    con.commit()
    con.close()
    before = db.read_bytes()
    done = _scrub_in_a_process(str(db), timeout=20)
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "StringIds.value" in done.stderr and "original kept" in done.stderr
    assert "Traceback" not in done.stderr
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["e.sqlite"]


def test_unique_collisions_are_bounded_and_still_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Markers already numbered #1..#300 (a file scrubbed before): the next ones go past them."""
    from kvprof.tools.scrub import MARKER, scrub_path

    monkeypatch.setenv("KVPROF_PLANTED_KEY", SECRET)
    db = tmp_path / "u.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT UNIQUE)")
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, f"{MARKER} #{i}") for i in range(1, 301)])
    con.execute("INSERT INTO StringIds VALUES (301, ?)", (MARKER,))
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(302, f"A_B={SECRET}"), (303, f"C_D={SECRET}")])
    con.commit()
    con.close()
    report = scrub_path(db)
    assert report.strings == 2
    con = sqlite3.connect(db)
    assert con.execute("SELECT count(DISTINCT value) FROM StringIds").fetchone() == (303,)
    con.close()
    assert SECRET.encode() not in db.read_bytes()


def _bomb(path: Path, size: int) -> Path:
    """A valid gzipped JSON trace whose content is ``size`` bytes, mostly spaces."""
    with gzip.open(path, "wb", compresslevel=9) as gz:
        gz.write(b'{"traceEvents": [')
        chunk = b" " * (1 << 20)
        for _ in range(size >> 20):
            gz.write(chunk)
        gz.write(b"]}")
    return path


@pytest.mark.parametrize("check", [True, False])
def test_decompressed_size_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str], check: bool) -> None:
    p = _bomb(tmp_path / "t.pt.trace.json.gz", 24 << 20)
    assert p.stat().st_size < 200_000
    before = p.read_bytes()
    rc = main(["scrub", *(["--check"] if check else []), "--max-bytes", "8M", str(p)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "more than 8 MiB" in err and "--max-bytes" in err, err
    assert p.read_bytes() == before
    assert main(["scrub", "--check", "--max-bytes", "32M", str(p)]) == 0, capsys.readouterr().err


def test_plain_files_over_the_bound_are_refused_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "big.log"
    log.write_bytes(b"ok\n" * 400_000)
    assert main(["scrub", "--check", "--max-bytes", "1M", str(log)]) == 2
    assert "more than 1 MiB" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "-1", "lots", "1.5.G", "nan"])
def test_max_bytes_option_refuses_nonsense(capsys: pytest.CaptureFixture[str], bad: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["scrub", "--check", "--max-bytes", bad, "x.json"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--max-bytes" in err and "expected a size" in err
