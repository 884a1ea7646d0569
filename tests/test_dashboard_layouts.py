"""The dashboard on the MLA and paged layouts, unchanged: a CPU capture of each layout opens
on every page with no exception, and the H200 layout bench opens on Sweeps."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from kvprof.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
APP = str(REPO / "kvprof" / "dashboard" / "app.py")
PAGES = ("Overview", "Timeline", "Distributions", "Sweeps", "Overlap", "Compare runs")
SMALL = ["--phase", "decode", "--batch-sizes", "3", "--steps", "2", "--warmup", "1", "--device", "cpu", "--no-progress"]


@pytest.fixture(scope="module")
def layout_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layouts")
    for run_id, argv in (("mla", ["--model", "deepseek-v2-lite", "--variants", "mla_cat_copy"]),
                         ("paged", ["--model", "llama-3.1-8b", "--engine", "vllm", "--variants", "paged_unfused"])):
        assert main(["capture", *argv, *SMALL, "--out", str(root), "--run-id", run_id]) == 0
    bench = root / "h200-layouts"
    bench.mkdir()
    shutil.copy(REPO / "traces" / "samples" / "h200-layouts" / "bench.json", bench / "bench.json")
    return root


@pytest.mark.parametrize("run", ["mla", "paged"])
def test_every_page_opens_a_layout_capture(layout_root: Path, run: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROF_DASHBOARD_ROOTS", str(layout_root))
    monkeypatch.setenv("KVPROF_DASHBOARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(layout_root / run))
    at = AppTest.from_file(APP, default_timeout=90).run()
    assert not at.exception, [e.value for e in at.exception]
    for page in PAGES:
        at = at.sidebar.radio(key="nav_page").set_value(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])
    shown = " ".join(str(m.value) for m in at.markdown) + " ".join(str(t.value) for t in at.dataframe)
    assert "Traceback" not in shown


def test_sweeps_opens_the_layout_bench(layout_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROF_DASHBOARD_ROOTS", str(layout_root))
    monkeypatch.setenv("KVPROF_DASHBOARD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVPROF_DASHBOARD_RUN", str(layout_root / "h200-layouts" / "bench.json"))
    at = AppTest.from_file(APP, default_timeout=90)
    at.query_params["page"] = "Sweeps"
    at = at.run()
    assert not at.exception, [e.value for e in at.exception]
    def traces(app: AppTest) -> str:
        figs = app.get("plotly_chart")
        assert figs, "no chart for the layout bench"
        return " ".join(f.proto.spec for f in figs)

    shape = next(s for s in at.selectbox if "shape" in s.label)
    assert set(shape.options) == {"512+64", "1x128/b16"}  # the MLA row and the paged cache's
    assert "paged_triton" in traces(at.selectbox(key=shape.key).set_value("1x128/b16").run())
    at = at.selectbox(key=shape.key).set_value("512+64").run()
    assert not at.exception, [e.value for e in at.exception]
    assert "mla_triton" in traces(at) and "sglang_mla" in traces(at)
