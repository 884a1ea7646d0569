"""Inputs that are not what their names say: a FIFO, a socket or a folder where a run's trace,
export, sidecar or step timings should be (refused in one line, exit 2, never skipped in silence
nor opened: a FIFO blocks), and a summary.json that is not JSON (exit 3, as every unreadable input)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from kvprof.cli import main

ROOT = Path(__file__).resolve().parent
REAL = ROOT / "fixtures" / "real"
SAMPLE = ROOT.parent / "kvprof" / "samples" / "h200-llama70b-tp8"


def _make(path: Path, kind: str) -> socket.socket | None:
    if path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "link to a fifo":
        os.mkfifo(path.with_name("target.fifo"))
        path.symlink_to(path.with_name("target.fifo"))
    else:
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        return s
    return None


def _one_line(capsys: pytest.CaptureFixture[str], rc: int, code: int) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert rc == code, line
    return line


@pytest.mark.parametrize("kind", ["fifo", "socket", "folder", "link to a fifo"])
@pytest.mark.parametrize("name", ["index_put.pt.trace.json.gz", "nsys_run.sqlite", "step_timings.json"])
def test_a_run_folder_file_that_is_not_regular_is_refused(name: str, kind: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(REAL, run)
    if len(str(run / name)) > 100 and kind == "socket":
        pytest.skip("a socket path this long cannot be bound")
    sock = _make(run / name, kind)
    try:
        t0 = time.monotonic()
        rc = main(["analyze", str(run), "--no-files", "--quiet"])
        line = _one_line(capsys, rc, 2)
        assert name in line and "not a regular file" in line
        assert time.monotonic() - t0 < 30
    finally:
        if sock is not None:
            sock.close()


@pytest.mark.parametrize("kind", ["fifo", "folder", "link to a fifo"])
@pytest.mark.parametrize("name", ["x.pt.trace.json", "1-TP-0.trace.json.gz", "kvprof-sglang.TP-0.pid-1.json"])
def test_a_trace_named_entry_of_a_folder_that_is_not_regular_is_refused(name: str, kind: str, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(REAL / "triton_fused.pt.trace.json.gz", d)
    _make(d / name, kind)
    rc = main(["analyze", str(d), "--no-files", "--quiet"])
    line = _one_line(capsys, rc, 2)
    assert name in line


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "nan", "1e400x", "", "{", "[]"])
def test_a_summary_that_is_not_json_is_exit_3(bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    doc = (run / "summary.json").read_text()
    if bad in ("", "{", "[]"):
        text = bad
    else:
        key = next(k for k in ("median_ns", "p50_ns", "mean_ns") if f'"{k}": ' in doc)
        head, tail = doc.split(f'"{key}": ', 1)
        text = head + f'"{key}": {bad}' + tail[len(tail) - len(tail.lstrip("0123456789.e-+")):]
    (run / "summary.json").write_text(text)
    rc = main(["report", str(run), "--html", str(tmp_path / "r.html")])
    line = _one_line(capsys, rc, 3)
    assert "summary.json" in line
    assert not (tmp_path / "r.html").exists()
    json.dumps(line)


@pytest.mark.parametrize("which", ["manifest", "step timings", "summary"])
def test_a_runs_own_file_past_the_trace_size_bound_is_one_line(which: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """manifest.json, the step timings and summary.json were read whole, whatever their size."""
    run = tmp_path / "run"
    shutil.copytree(SAMPLE if which == "summary" else REAL, run)
    limit = 1000 if which == "manifest" else 1100  # bytes: 1,100 is above this manifest (1,068), below the rest
    if which == "step timings":
        (run / "step_timings.json").write_text("{" + " " * 5000 + "}")
    if which == "summary":
        (run / "summary.json").write_text((run / "summary.json").read_text() + " " * 5000)
        limit = (run / "summary.json").stat().st_size - 1
    monkeypatch.setenv("KVPROF_MAX_TRACE_MB", repr(limit / 2**20))
    if which == "summary":
        rc = main(["report", str(run), "--html", str(tmp_path / "r.html")])
    else:
        rc = main(["analyze", str(run), "--no-files", "--quiet"])
    line = _one_line(capsys, rc, 3)
    assert f"a {which}" in line or which in line
    assert "KVPROF_MAX_TRACE_MB raises it" in line
