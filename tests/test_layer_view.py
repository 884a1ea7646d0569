"""The decoder-layer views of the dashboard and the HTML report: the rotary-fusion comparison and
what programmatic dependent launch hides (kvprof.dashboard.layer_view), on a real CPU capture of
the layer context with the rotary variants and on typed GPU-clock rows built here."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import orjson
import pytest

pytest.importorskip("plotly")

from dashboard_support import LAYERS, REPO, gpu_layer_summary, layer_rope_run, write_boundary  # noqa: E402
from kvprof.analysis.layer_step import LayerSteps, step_savings  # noqa: E402
from kvprof.core import variants as V  # noqa: E402
from kvprof.dashboard import frames, html_report, landing, layer_view  # noqa: E402


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


# ---------------------------------------------------------------------------- a GPU layer run, typed

def test_rope_saving_is_the_layer_steps_measurement() -> None:
    """The comparison's saving of the rotary-fused write is the analysis' measured layer-step saving
    against the rotary + fused store, its spread the two steps' IQRs in quadrature; none for prefill."""
    summary, timings = gpu_layer_summary()
    df = layer_view.rope_frame(summary, layers=LAYERS)
    measured = {(s.variant, s.phase, s.size): s for s in step_savings(timings) if s.against == "rope_then_triton_fused"}
    assert set(df["variant"]) == {"rope_triton_fused", "sglang_rope_store"}
    assert set(df["against"]) == {"rope_then_triton_fused"} and set(df["source"]) == {"reference"}
    for r in df.itertuples():
        s = measured[(r.variant, r.phase, r.size)]
        if r.phase == "decode":
            assert r.saving_ms == pytest.approx(s.saving_ns / 1e6)
            assert r.saving_spread_ms == pytest.approx(s.spread_ns / 1e6)
            assert r.how == "measured in the layer" and r.why == ""
        else:
            assert np.isnan(r.saving_ms) and r.why == "prefill"
        assert r.variant_us == pytest.approx(next(
            g["cost_per_write_ns"] for g in summary["groups"] if (g["variant"], g["phase"], g["size"])
            == (r.variant, r.phase, r.size)) / 1e3)


def test_rope_chart_draws_the_savings_with_their_spread() -> None:
    summary, _ = gpu_layer_summary()
    view = layer_view.build(summary, "reference", LAYERS)
    fig = view.figure("rope")
    assert fig is not None and fig.layout.meta["chart"] == "rope_saving"
    assert "the reference pass (no profiler attached, CUDA events)" in fig.layout.title.text
    df = view.rope[view.rope["phase"] == "decode"]
    lo, hi = fig.layout.yaxis.range
    for tr in fig.data:
        rows = df[df["variant"] == tr.name].sort_values("size")
        assert tr.legendgroup == tr.name and tr.marker.color == V.colour(tr.name)
        assert list(tr.x) == [f"bs={s}" for s in rows["size"]]
        assert list(tr.y) == pytest.approx(list(rows["saving_ms"]))
        assert list(tr.error_y.array) == pytest.approx(list(rows["saving_spread_ms"]))
        assert lo <= min(rows["saving_ms"] - rows["saving_spread_ms"]) and hi >= max(rows["saving_ms"]
                                                                                        + rows["saving_spread_ms"])
    assert {tr.name for tr in fig.data} == {"rope_triton_fused", "sglang_rope_store"}
    assert any("measured in the layer" in n for n in view.rope_notes)
    text = view.rope_text
    assert "GPU µs/write" in " ".join(text.columns) and "wall clock" not in " ".join(text.columns)
    assert set(text.loc[df.index, "saving is"]) == {"measured in the layer"}


def test_two_separate_rotary_variants_get_a_panel_each() -> None:
    summary, _ = gpu_layer_summary(("two_stream", "rope_then_two_stream", "rope_then_triton_fused",
                                    "rope_triton_fused"))
    view = layer_view.build(summary, "reference", LAYERS)
    fig = view.figure("rope")
    assert fig is not None
    assert [a.text for a in fig.layout.annotations if a.text.startswith("vs ")] == [
        "vs rope_then_two_stream", "vs rope_then_triton_fused"]
    assert {tr.xaxis for tr in fig.data} == {"x", "x2"}


def test_pdl_rows_are_the_write_boundaries_in_us() -> None:
    summary, _ = gpu_layer_summary()
    view = layer_view.build(summary, "reference", LAYERS)
    df = view.pdl.set_index(["variant", "size"])
    assert df.loc[("rope_then_triton_fused", 10), "overlap_us"] == pytest.approx(0.77)
    assert df.loc[("rope_triton_fused", 10), "early"] == 171
    assert df.loc[("rope_triton_fused", 10), "early_pct"] == pytest.approx(100 * 171 / 240)
    assert df.loc[("two_stream", 10), "wait_us"] == pytest.approx(0.54)
    text = view.pdl_text.set_index("variant")
    assert text.loc["two_stream", "median overlap µs"] == "n/a (none began early)"
    assert text.loc["rope_then_triton_fused", "next kernel waits µs"] == "n/a (one stream)"
    # the reference pass has no trace: the chart is the kineto trace's, and says so
    assert view.pdl_source == "kineto"
    assert any("has no trace of the layer" in n for n in view.pdl_notes)


def test_pdl_chart_draws_only_writes_that_began_early() -> None:
    summary, _ = gpu_layer_summary()
    fig = layer_view.build(summary, "kineto", LAYERS).figure("pdl")
    assert fig is not None and fig.layout.meta["chart"] == "pdl_overlap"
    bars = {tr.name: tr for tr in fig.data}
    assert set(bars) == {"rope_then_triton_fused", "rope_triton_fused"}  # two_stream: no write began early
    assert list(bars["rope_triton_fused"].x) == ["bs=1", "bs=10"]
    assert list(bars["rope_triton_fused"].y) == pytest.approx([0.15, 0.13])
    assert list(bars["rope_triton_fused"].text) == ["120/240", "171/240"]
    assert bars["rope_then_triton_fused"].marker.color == V.colour("rope_then_triton_fused")
    assert fig.layout.yaxis.range[1] >= 0.77


def test_no_write_began_early_is_said_not_drawn() -> None:
    summary, _ = gpu_layer_summary(boundaries=[write_boundary("two_stream", 0, None, second=240, wait_ns=540.0),
                                               write_boundary("rope_triton_fused", 0, None)])
    view = layer_view.build(summary, "reference", LAYERS)
    assert view.figure("pdl") is None and len(view.pdl) == 2
    assert any("no write began before its predecessor ended" in n for n in view.pdl_notes)


def test_the_landing_view_of_a_layer_run_is_measured() -> None:
    """The dashboard's comparison reads the groups' context: the headline is the measured step."""
    summary, _ = gpu_layer_summary()
    land = landing.build("gpu-layer", summary, source="reference", baseline="two_stream", layers=LAYERS)
    assert "measured: the baseline's decoder-layer step minus this one's" in land.headline


def test_html_report_has_both_layer_sections() -> None:
    summary, _ = gpu_layer_summary()
    text = html_report.render(landing.build("gpu-layer", summary, source="reference", layers=LAYERS))
    # the writes alone take 0.9 of what they add in the layer: every saving is off its projection
    assert "id='rope'" in text and "id='pdl'" in text and "id='gaps'" in text
    assert text.count("Plotly.newPlot") == 4  # cost, saving, rope, pdl
    assert text.count("<script type=\"text/javascript\">/**") <= 1  # plotly.js inlined once
    tables = re.findall(r"<table.*?</table>", text, flags=re.S)
    assert len(tables) == 4 and not any(re.search(r">\s*(None|nan|NaN)\s*<", t) for t in tables)
    assert "rope_then_triton_fused" in tables[2] and "171" in tables[3]


# ---------------------------------------------------------------------------- what there is not


def test_a_cpu_capture_has_no_saving_and_no_boundaries_and_says_why(cpu_summary: dict) -> None:
    view = layer_view.build(cpu_summary, "reference", LAYERS)
    assert view.has_rope and view.has_layer and not view.figures
    rope = view.rope
    assert set(zip(rope["variant"], rope["against"])) == {("rope_triton_fused", "rope_then_triton_fused")}
    assert rope["saving_ms"].isna().all() and rope["variant_us"].notna().all()
    assert dict(zip(rope["phase"], rope["why"])) == {"decode": "CPU", "prefill": "prefill"}
    text = view.rope_text
    assert "fused: µs/write (wall clock)" in text.columns and not any("GPU" in c for c in text.columns)
    assert set(text["saves ms/step"]) == {"n/a (CPU)", "n/a (prefill)"}
    assert set(text["source"]) == {"the reference pass (no profiler attached, wall clock)"}
    assert view.rope_notes == ["no chart of ms saved per decode step: a CPU's wall clock says nothing of a GPU's "
                               "decode step (capture and analyze show n/a (CPU) too)."]
    assert view.pdl.empty and "no GPU events" in view.pdl_notes[0]
    assert view.gap_notes == LayerSteps.from_json(cpu_summary["layer_steps"]).notes


def test_a_run_without_rotary_or_layer_has_neither_section() -> None:
    summary = orjson.loads((REPO / "kvprof" / "samples" / "h200-llama70b-tp8" / "summary.json").read_bytes())
    land = landing.build("h200", summary)
    assert land.layer is not None and land.layer.empty
    assert "no rotary variant in this run" in land.layer.rope_notes[0]
    assert "no decoder-layer context" in land.layer.pdl_notes[0]
    text = html_report.render(land)
    assert "id='rope'" not in text and "id='pdl'" not in text


def test_one_side_of_the_rotary_comparison_alone_says_what_is_missing() -> None:
    summary, _ = gpu_layer_summary(("two_stream", "rope_triton_fused"))
    view = layer_view.build(summary, "reference", LAYERS)
    assert view.rope.empty and view.figure("rope") is None
    assert view.rope_notes == ["only variants fused into the rotary ran (rope_triton_fused): the comparison needs one "
                               "with the rotary and the write as separate kernels (rope_then_*) too."]


def test_report_of_the_cpu_capture(cpu_run: Path, tmp_path: Path) -> None:
    """``kvprof report`` of the real CPU capture: both sections, the wall clock named, n/a with its reason."""
    from kvprof.cli import main

    out = tmp_path / "report.html"
    assert main(["report", str(cpu_run), "--html", str(out)]) == 0
    text = out.read_text()
    assert "id='rope'" in text and "id='pdl'" in text and "id='gaps'" in text
    assert "n/a (CPU)" in text and "n/a (prefill)" in text and "fused: µs/write (wall clock)" in text
    assert "no write boundaries: this run&#x27;s traces have no GPU events" in text
