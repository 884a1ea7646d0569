"""The decoder-layer views of the dashboard and the HTML report: the rotary-fusion comparison and
what programmatic dependent launch hides (kvprof.dashboard.layer_view), on a real CPU capture of
the layer context with the rotary variants and on typed GPU-clock rows built here."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

pytest.importorskip("plotly")

from dashboard_support import layer_rope_run  # noqa: E402
from kvprof.dashboard import frames  # noqa: E402


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return layer_rope_run(tmp_path_factory.mktemp("layer") / "cpu-layer-rope")


@pytest.fixture(scope="module")
def cpu_summary(cpu_run: Path) -> dict:
    return orjson.loads((cpu_run / "summary.json").read_bytes())


def test_groups_keep_their_context_and_layout(cpu_summary: dict) -> None:
    """The comparison tells a step measured in the layer from a projection by the groups' context:
    the frame the dashboard and the report compare from must keep it as text."""
    g = frames.groups_frame(cpu_summary)
    assert set(g["context"]) == {"layer"}
    assert set(g["layout"]) == {"mha"}
