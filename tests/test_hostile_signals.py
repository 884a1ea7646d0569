"""A signal that lands after a command has put an output in place: the last line says what was
kept and what did not run, never "nothing half-written was kept" over a run folder left without
its analysis, or a bench.csv without the mark bench.json carries. One rule for every output of an
interrupted command: each is either marked incomplete or not written."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

import kvprof.api as api
from kvprof.cli import main
from kvprof.core.bench_result import BenchResult, BenchRow
from kvprof.core.interrupts import Interrupted, Terminated
from kvprof.core.rundir import RunDir

REAL = Path(__file__).resolve().parent / "fixtures" / "real"


@pytest.mark.parametrize("signum", [None, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("when", ["analysis", "scrub check", "hta folders"])
def test_a_signal_after_the_run_is_renamed_says_the_run_is_kept(when: str, signum: int | None, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from kvprof.capture import run as capture_run
    from kvprof.capture.plan import CapturedRun

    run = tmp_path / "out" / "r1"
    shutil.copytree(REAL, run)
    manifest = RunDir(run).read_manifest()
    monkeypatch.setattr(capture_run, "capture", lambda config, **_: CapturedRun(run, manifest, []))
    exc = Interrupted() if signum is None else Terminated(signum)

    def interrupt(*_: Any, **__: Any) -> Any:
        raise exc

    target = {"analysis": "analyze", "scrub check": "_scrub_check", "hta folders": "hta_folders"}[when]
    monkeypatch.setattr(api, target, interrupt)
    rc = main(["capture", "--out", str(tmp_path / "out"), "--run-id", "r1", "--device", "cpu", "--variants",
               "index_put"])
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.strip().splitlines() if "kept" in ln]
    assert rc == (130 if signum is None else 128 + signum)
    assert "nothing half-written" not in line and f"the run {run} was captured whole and is kept" in line
    if when == "analysis":
        assert f"kvprof analyze {run}" in line
    if when != "hta folders":
        assert f"kvprof scrub --check {run}" in line  # scrubbing is on by default
    assert (run / "manifest.json").is_file()


def test_an_interrupted_bench_keeps_bench_json_marked_and_no_bench_csv(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import kvprof.bench.run as bench_run

    out = tmp_path / "b"
    out.mkdir()
    (out / "bench.csv").write_text("variant\nfrom an older complete run\n")

    def partial_then_interrupted(points: Any, variants: Any, device: Any, *, on_partial: Any, **_: Any) -> Any:
        row = BenchRow(heads=8, dim=128, cache_dtype="bf16", input_dtype="bf16", tokens=8, variant="index_put",
                       mode="eager", status="ok", median_us=1.0)
        on_partial(BenchResult(records=[row], complete=False))
        raise Interrupted()

    monkeypatch.setattr(bench_run, "run_bench", partial_then_interrupted)
    rc = main(["bench", "--out", str(out), "--variants", "index_put", "--tokens", "8", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 130
    assert json.loads((out / "bench.json").read_text())["complete"] is False
    assert not (out / "bench.csv").exists()  # the older run's CSV beside a newer partial JSON: removed
    assert "keeps the 1 results measured, marked complete: false" in err[-1]
    assert "nothing half-written" not in err[-1]
