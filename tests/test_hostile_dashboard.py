"""The dashboard's loader given a run whose inputs point outside the traces root: every entry of
the run folder and every file its manifest names is resolved and confined before anything is read
(a rank's trace linked to a file outside the root was read and shown)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("streamlit")  # the dashboard extra (a GPU machine may lack it)

from kvprof.dashboard import data  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "layer-rope-cpu"


def _run_with_ranks(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(root, run, outside): a copy of a CPU capture under a root, and a folder beside the root."""
    root = tmp_path / "root"
    run = root / "run"
    shutil.copytree(FIXTURE, run)
    outside = tmp_path / "outside"
    outside.mkdir()
    return root, run, outside


def _manifest(run: Path, **extra: object) -> None:
    doc = json.loads((run / "manifest.json").read_text())
    doc.update(extra)
    (run / "manifest.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("how", ["rank trace", "rank timings", "run-level file", "unlisted trace", "sidecar",
                                 "step timings", "absolute name"])
def test_an_input_outside_the_root_is_refused_before_it_is_read(how: str, tmp_path: Path) -> None:
    root, run, outside = _run_with_ranks(tmp_path)
    private = outside / "private.pt.trace.json.gz"
    shutil.copy(run / "triton_fused.pt.trace.json.gz", private)  # a readable trace: it would be shown
    if how == "rank trace":
        (run / "triton_fused.rank1.pt.trace.json.gz").symlink_to(private)
        _manifest(run, ranks=[{"rank": 1, "files": {"triton_fused": "triton_fused.rank1.pt.trace.json.gz"}}])
    elif how == "rank timings":
        (run / "step_timings.rank1.json").symlink_to(private)
        _manifest(run, ranks=[{"rank": 1, "files": {}, "timings": "step_timings.rank1.json"}])
    elif how == "run-level file":
        (run / "step_timings.json").unlink()
        (run / "step_timings.json").symlink_to(private)
    elif how == "unlisted trace":
        (run / "extra.pt.trace.json.gz").symlink_to(private)
    elif how == "sidecar":
        (run / "kvprof-sglang.TP-0.pid-1.json").symlink_to(private)
    elif how == "step timings":
        _manifest(run, files={"step_timings": "../../outside/private.pt.trace.json.gz"})
    else:
        _manifest(run, ranks=[{"rank": 1, "files": {"triton_fused": str(private)}}])
    with pytest.raises(data.PathError, match="outside the traces root"):
        data.ensure_outputs(run, root)


def test_a_run_whose_inputs_stay_inside_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROF_DASHBOARD_CACHE", str(tmp_path / "cache"))
    root, run, _ = _run_with_ranks(tmp_path)
    (run / "alias.json").symlink_to(run / "step_timings.json")  # a link that stays inside
    data.check_inputs(run, root)


def test_a_manifest_nested_deep_is_no_recursion(tmp_path: Path) -> None:
    deep: object = {"files": {"x": "../../outside"}}
    for _ in range(50_000):
        deep = {"a": [deep]}
    assert "../../outside" in data._manifest_files(deep)


def test_the_dashboards_log_shows_control_characters_as_escapes(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    import kvprof.dashboard  # noqa: F401  (places the filter)

    evil = "run\x1b]0;pwn\x07\x1b[2J\u202e"
    log = logging.getLogger("kvprof.dashboard")
    with caplog.at_level(logging.ERROR, logger="kvprof.dashboard"):
        try:
            raise ValueError(f"sidecar variant {evil}")
        except ValueError:
            log.exception("opening %s failed", evil)
    (record,) = caplog.records
    text = caplog.text
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "run\\x1b]0;pwn\\x07" in record.getMessage() and "ValueError: sidecar variant run\\x1b" in text
