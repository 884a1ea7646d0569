"""The HTML report and the dashboard show an engine's own trace like a kvprof run: its write kernels
per step and layer, the graph-replay attribution and the source of each figure."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("plotly")  # the dashboard extra (a GPU machine may lack it)

from kvprof.analysis.write_kernels import write_kernel_summary  # noqa: E402
from kvprof.dashboard.engine_view import engine_views  # noqa: E402
from kvprof.dashboard.html_report import engine_sections  # noqa: E402
from kvprof.trace.load import load  # noqa: E402
from kvprof.trace.synthetic import EngineReplaySpec, build_engine, dumps  # noqa: E402


def _summary(tmp: Path, spec: EngineReplaySpec) -> dict:
    doc, _ = build_engine(spec)
    p = tmp / "engine-TP-0.trace.json"
    p.write_bytes(dumps(doc))
    return {"write_kernels": write_kernel_summary(load(p))}


def test_engine_view_has_the_step_layer_table_and_sources(tmp_path: Path) -> None:
    (v,) = engine_views(_summary(tmp_path, EngineReplaySpec(layers=[0, 1, 2], replays=[0, 1], replay_ranges=False)))
    assert v.method and v.method.startswith("CUDA graph replays") and v.reason is None
    assert list(v.steps["writes"]) == [3, 3] and list(v.steps["graph launch"]) == [5001, 5002]
    assert list(v.step_layer.columns) == ["step", "L0", "L1", "L2"]
    assert v.step_layer[["L0", "L1", "L2"]].to_numpy().tolist() == [[0.9, 0.9, 0.9]] * 2
    assert any("6 of 6 write kernels tied" in n for n in v.notes)
    assert any("kernels carry a graph launch's correlation id, 6 of them write kernels, in 2 replays" in n
               for n in v.notes)
    assert v.figure() is not None
    html = "\n".join(engine_sections([v], lambda fig: "<div>chart</div>"))
    assert "Engine trace engine-TP-0.trace.json" in html and "<div>chart</div>" in html
    assert "Write µs per step and layer" in html and "replay 1 (cudaGraphLaunch correlation 5002)" in html


def test_engine_view_says_why_there_are_no_steps(tmp_path: Path) -> None:
    (v,) = engine_views(_summary(tmp_path, EngineReplaySpec(layers=[0, 1], replays=[0], replay_ranges=False,
                                                             eager=True)))
    assert v.reason and v.reason.startswith("no forward steps found")
    assert v.steps.empty and v.figure() is None
    assert v.reason in "\n".join(engine_sections([v], lambda fig: ""))


@pytest.mark.slow
def test_dashboard_overview_shows_an_engine_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Streamlit overview of a folder holding an engine's trace: its steps and step x layer tables and
    heat map, the sources of its figures, and no exception although the run has no kvprof variant."""
    from streamlit.testing.v1 import AppTest

    from kvprof.cli import main

    run = tmp_path / "root" / "engine"
    run.mkdir(parents=True)
    doc, _ = build_engine(EngineReplaySpec(layers=[0, 1, 2], replays=[0, 1], replay_ranges=False,
                                           step_ranges="sglang"))
    (run / "engine-TP-0.trace.json").write_bytes(dumps(doc))
    assert main(["analyze", str(run), "--quiet"]) in (0, None)
    monkeypatch.setenv("KVPROF_DASHBOARD_ROOTS", str(run.parent))
    monkeypatch.setenv("KVPROF_DASHBOARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(run))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    at = AppTest.from_file(str(Path(__file__).resolve().parents[1] / "kvprof" / "dashboard" / "app.py"),
                           default_timeout=90).run()
    assert not at.exception, [e.value for e in at.exception]
    text = (" ".join(m.value for m in at.markdown) + " ".join(c.value for c in at.caption)).replace("\\", "")
    assert "Engine trace engine-TP-0.trace.json" in text and "SGLang step ranges" in text
    assert len(at.get("plotly_chart")) >= 1
