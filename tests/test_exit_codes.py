"""The exit-code table of docs/reliability.md against the code: each documented code is the
``exit_code`` of the error class the table names, every error class is in the table, and each
code is what a real command gives for a case of its row (in-process, ``kvprof.cli.main``)."""

from __future__ import annotations

import gzip
import re
import shutil
from pathlib import Path

import pytest

import kvprof.core.errors as errors
from kvprof.cli import main
from kvprof.core.interrupts import Interrupted, Terminated

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "fixtures" / "real"


def documented() -> dict[int, list[str]]:
    """code -> the classes its row's last column names, from the table under "## Exit codes"."""
    text = (ROOT / "docs" / "reliability.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*(\d+)\s*\|(.*)\|(.*)\|\s*$", line)
        if m:
            rows[int(m.group(1))] = re.findall(r"`(\w+)`", m.group(3))
    return rows


def test_the_table_names_each_class_with_its_exit_code() -> None:
    rows = documented()
    assert set(rows) == {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 130, 143}
    named = {cls: code for code, classes in rows.items() for cls in classes}
    for cls, code in named.items():
        assert hasattr(errors, cls) or cls in ("Interrupted", "Terminated"), cls
        value = getattr(errors, cls, None)
        if isinstance(value, int):  # a code a command returns itself (the gate's verdicts)
            assert value == code, (cls, code)
        elif value is not None:
            assert value.exit_code == code, (cls, code)
    classes = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, errors.KvprofError)}
    assert classes <= set(named), f"error classes missing from the table: {classes - set(named)}"
    assert Interrupted().__class__.__name__ in named and named["Interrupted"] == errors.INTERRUPTED_EXIT_CODE
    assert named["Terminated"] == errors.TERMINATED_EXIT_CODE == Terminated().exit_code


def _rc(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


def test_each_code_is_what_a_command_gives_for_its_row(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import kvprof.api as api

    seen: dict[int, str] = {}
    rc, _ = _rc(["analyze", str(REAL / "triton_fused.pt.trace.json.gz"), "--no-files", "--quiet"], capsys)
    seen[rc] = "done"
    leak = tmp_path / "leak.log"
    leak.write_text("token ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8" + "\n")
    rc, _ = _rc(["scrub", "--check", str(leak)], capsys)
    seen[rc] = "scrub: something remains"
    rc, _ = _rc(["analyze", str(REAL), "--max-events", "0"], capsys)
    seen[rc] = "usage"
    bad = tmp_path / "bad.pt.trace.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [')[:-4])
    rc, _ = _rc(["analyze", str(bad), "--no-files"], capsys)
    seen[rc] = "unreadable trace"
    import torch

    if not torch.cuda.is_available():
        rc, _ = _rc(["capture", "--device", "cuda", "--out", str(tmp_path / "c")], capsys)
        seen[rc] = "device"
    monkeypatch.setenv("KVPROF_NSYS", str(tmp_path / "no-nsys"))
    monkeypatch.setenv("PATH", str(tmp_path))
    rc, _ = _rc(["nsys", "--out", str(tmp_path / "n"), "--", "true"], capsys)
    seen[rc] = "tool"
    monkeypatch.undo()
    (tmp_path / "afile").write_text("x")
    rc, _ = _rc(["analyze", str(REAL / "triton_fused.pt.trace.json.gz"), "--out", str(tmp_path / "afile" / "sub"),
                 "--quiet"], capsys)
    seen[rc] = "output"
    for exc in (Interrupted(), Terminated()):
        def stop(*_: object, **__: object) -> None:
            raise exc  # noqa: B023

        monkeypatch.setattr(api, "open_run", stop)
        rc, _ = _rc(["analyze", str(REAL), "--no-files", "--quiet"], capsys)
        seen[rc] = type(exc).__name__
    monkeypatch.undo()
    expected = {0: "done", 1: "scrub: something remains", 2: "usage", 3: "unreadable trace", 5: "tool", 6: "output",
                130: "Interrupted", 143: "Terminated"}
    if not torch.cuda.is_available():
        expected[4] = "device"
    assert seen == expected
    assert set(expected) <= set(documented())


def test_a_path_the_system_refuses_and_a_full_disk_differ(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """2 for a path the system refuses as given, 6 for an output it cannot take (here ENOSPC)."""
    import errno

    import kvprof.core.atomic as atomic

    run = tmp_path / "run"
    shutil.copytree(REAL, run)

    def full(*_: object, **__: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic, "_fsync_file", full)
    rc, err = _rc(["analyze", str(run / "triton_fused.pt.trace.json.gz"), "--out", str(tmp_path / "o"), "--quiet"],
                  capsys)
    assert rc == 6 and "No space left" in err
    monkeypatch.undo()
    rc, err = _rc(["analyze", str(run / "triton_fused.pt.trace.json.gz"), "--no-files", "--perfetto",
                   str(tmp_path / ("p" * 300))], capsys)
    assert rc == 2
