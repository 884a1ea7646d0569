"""``streamlit run dashboards/app.py`` from a checkout opens the app that ``kvprof dashboard`` serves."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("streamlit")
pytest.importorskip("plotly")

from streamlit.testing.v1 import AppTest  # noqa: E402

from dashboard_support import empty_root_env  # noqa: E402
from kvprof.commands.dashboard import app_path  # noqa: E402

ENTRY = Path(__file__).resolve().parents[1] / "dashboards" / "app.py"


def test_checkout_entry_runs_the_packaged_app_on_every_rerun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty_root_env(tmp_path, monkeypatch)
    entry = AppTest.from_file(str(ENTRY), default_timeout=90).run()
    packaged = AppTest.from_file(str(app_path()), default_timeout=90).run()
    for at in (entry, packaged):
        assert not at.exception, [e.value for e in at.exception]
    pages = entry.sidebar.radio(key="nav_page")
    assert pages.options == packaged.sidebar.radio(key="nav_page").options
    assert pages.value == "Overview" and "Sweeps" in pages.options
    assert [w.value for w in entry.warning] == [w.value for w in packaged.warning]
    assert "No runs under" in entry.warning[0].value
    # a widget change reruns the entry script, which runs the app again: the new page renders
    pages.set_value("Sweeps").run()
    assert not entry.exception
    assert any("No bench.json" in i.value for i in entry.info)
