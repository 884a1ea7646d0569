"""The one rule (kvprof.analysis.figures) on every dashboard page beyond the landing view: the
Overview's table, metric and speed-up charts, Sweeps, Distributions, Compare runs and the Layer
page. A negative, noise or n/a figure is never drawn; an interpreted one is drawn hatched or
marked ``*`` with the note, and nothing (rate, ratio, saving) is derived from it."""

from __future__ import annotations

import pandas as pd
import pytest

go = pytest.importorskip("plotly.graph_objects")  # the dashboard extra (a GPU machine may lack it)

from kvprof.dashboard import charts, frames, tables  # noqa: E402

INTERP_NOTE = "ran in Triton's interpreter"
NEG_NOTE = "not drawn, n/a (negative: noise): index_put"
DERIVED_NOTE = "not drawn, n/a (interpreted: nothing is derived from the interpreter's time): triton_fused"


def _summary(source: str = "kineto") -> dict:
    """two_stream measured, index_put negative (a difference of medians below zero), triton_fused
    interpreted, at two decode sizes."""
    rows = []
    for size, scale in ((1, 1.0), (64, 2.0)):
        row = {"layer": "all", "source": source, "phase": "decode", "size": size, "tokens": size, "writes": 12,
               "steps": 6, "bandwidth_gbs": 5.0 * scale, "pct_of_peak": 1.0, "gpu_span_ns": 900.0,
               "host_launch_ns": 5_000.0}
        rows += [{**row, "variant": "two_stream", "cost_per_write_ns": 9_000.0 * scale},
                 {**row, "variant": "index_put", "cost_per_write_ns": -3_810_580.0},
                 {**row, "variant": "triton_fused", "cost_per_write_ns": 16_120_000.0 * scale}]
    return {"schema": "kvprof.summary/1", "input": "r", "input_kind": "run", "device": {"name": "x86_64"},
            "variants": {"two_stream": {"available": True}, "index_put": {"available": True},
                         "triton_fused": {"available": True, "interpreted": True}},
            "groups": rows}


def _bars(fig: go.Figure) -> dict[str, go.Bar]:
    return {t.name: t for t in fig.data if t.type == "bar"}


def _notes(fig: go.Figure) -> list[str]:
    return list((fig.layout.meta or {}).get("figure_notes") or [])


def test_overview_table_labels_each_untrusted_cost_and_derives_nothing_from_it():
    s = _summary()
    g = frames.groups_frame(s)
    df = frames.overview_frame(g, frames.comparison(g, "two_stream", 80, 12.05, 12.05), s, "two_stream")
    assert dict(zip(df["variant"], df["figure"])) == {"two_stream": "measured", "index_put": "negative",
                                                      "triton_fused": "interpreted"}
    text = tables.overview_table(df).set_index("variant")
    tf, ip, ts = (text.loc[v].iloc[0] for v in ("triton_fused *", "index_put", "two_stream"))
    assert tf["GPU µs/write"] == "16,120.000 *" and tf["GPU span µs"] == "0.900 *"
    for col in ("GB/s", "% of peak", "speed-up vs baseline", "saving ms/decode step", "predicted ITL ms"):
        assert tf[col] == "n/a (interpreted)"
        assert ip[col] == "n/a (negative: noise)"
    assert ip["GPU µs/write"] == "n/a (negative: noise)" and ip["GPU span µs"] == "0.9"  # its other times as measured
    assert ts["speed-up vs baseline"] == "1" and ts["GB/s"] == "5"
    assert "-3,810" not in text.to_string() and "-3810" not in text.to_string()


def test_speedup_chart_draws_no_ratio_of_an_untrusted_time_and_says_so():
    s = _summary()
    s["groups"] += [{**s["groups"][0], "variant": "cuda_fused", "cost_per_write_ns": 4_500.0}]
    s["variants"]["cuda_fused"] = {"available": True}
    g = frames.groups_frame(s)
    df = frames.overview_frame(g, frames.comparison(g, "two_stream", 80, 12.05, 12.05), s, "two_stream")
    fig = charts.speedup_bars(df, "two_stream")
    assert set(_bars(fig)) == {"cuda_fused"} and list(_bars(fig)["cuda_fused"].y) == pytest.approx([2.0])
    assert DERIVED_NOTE in _notes(fig) and NEG_NOTE in _notes(fig)
    assert NEG_NOTE in fig.layout.title.text  # on the chart itself, under the title


@pytest.mark.parametrize("metric", ["cost per write (µs)", "host launch µs per write", "bandwidth GB/s"])
def test_overview_metric_bars_hatch_interpreted_times_and_draw_no_negative_bar(metric):
    s = _summary()
    g = frames.groups_frame(s)
    mf = frames.group_metric_frame(g, metric, frames.interpreted_variants(s))
    rate = frames.GROUP_METRICS[metric][0] in frames.DERIVED_METRICS
    fig = charts.metric_bars(mf, metric, derived=rate)
    bars = _bars(fig)
    assert all(y > 0 for b in bars.values() for y in b.y)
    if rate:  # a rate from the interpreter's time is n/a, not a hatched bar
        assert set(bars) == {"two_stream"} and DERIVED_NOTE in _notes(fig)
    else:
        assert "triton_fused *" in bars and bars["triton_fused *"].marker.pattern.shape == "/"
        assert any(INTERP_NOTE in n and n.endswith("triton_fused") for n in _notes(fig))
    if metric == "cost per write (µs)":
        assert "index_put" not in bars and NEG_NOTE in _notes(fig)


def test_sweep_marks_interpreted_lines_and_draws_no_negative_point():
    s = _summary()
    pts = frames.sweep_from_groups(frames.groups_frame(s), None, "kineto", frames.interpreted_variants(s))
    fig = charts.sweep(pts.rename(columns={"us_per_write": "us"}), pd.DataFrame(columns=["line", "tokens", "us"]),
                       "sweep")
    names = {t.name for t in fig.data}
    assert names == {"two_stream", "triton_fused *"} and NEG_NOTE in _notes(fig)
    assert all(y > 0 for t in fig.data for y in t.y)
    text = tables.labelled(pts, {"us_per_write": "figure"}, {"bandwidth_gbs": "figure"}).to_string()
    assert "n/a (negative: noise)" in text and "16,120.000 *" in text and "triton_fused *" in text


def test_bench_sweep_marks_the_medians_bench_ran_interpreted():
    point = {"shape": "8x128", "dtype": "bf16", "mode": "eager", "status": "ok", "bytes": 4096}
    doc = {"settings": {"interpreted": ["triton_fused"]},
           "records": [{**point, "tokens": t, "variant": v, "median_us": us * t, "gbs": 1.0}
                       for t in (1, 8) for v, us in (("two_stream", 8.0), ("triton_fused", 4400.0))]}
    recs = frames.bench_frame({"bench.json": doc})
    assert set(recs[recs["variant"] == "triton_fused"]["figure"]) == {"interpreted"}
    fig = charts.sweep(recs.rename(columns={"median_us": "us"}), pd.DataFrame(columns=["line", "tokens", "us"]), "b")
    assert {t.name for t in fig.data} == {"two_stream", "triton_fused *"}
    text = tables.labelled(recs, {"median_us": "figure"}, {"gbs": "figure"}).to_string()
    assert "n/a (interpreted)" in text and "35,200.000 *" in text


def _compare() -> pd.DataFrame:
    b, a = _summary(), _summary()
    a["groups"] = [{**r, "cost_per_write_ns": r["cost_per_write_ns"] / 2} for r in a["groups"]]
    bg, ag = frames.groups_frame(b), frames.groups_frame(a)
    pairs = [(v, v) for v in ("two_stream", "index_put", "triton_fused")]
    df, _ = frames.compare_runs(bg, ag, pairs, 80, 12.05, 12.05,
                                (frames.interpreted_variants(b), frames.interpreted_variants(a)))
    return df


def test_compare_table_labels_both_runs_and_derives_no_ratio_from_an_untrusted_time():
    df = _compare()
    text = tables.compare_table(df).set_index("variant")
    tf, ip, ts = (text.loc[v].iloc[0] for v in ("triton_fused *", "index_put", "two_stream"))
    assert tf["before µs/write"] == "16,120.000 *" and tf["after µs/write"] == "8,060.000 *"
    assert ip["before µs/write"] == ip["after µs/write"] == "n/a (negative: noise)"
    for col in ("ratio after/before", "speed-up", "saving ms/decode step"):
        assert tf[col] == "n/a (interpreted)" and ip[col] == "n/a (negative: noise)"
    assert ts["ratio after/before"] == "0.5" and ts["speed-up"] == "2"


def test_compare_charts_cross_hatch_interpreted_bars_and_drop_negative_ones():
    df = _compare()
    fig = charts.before_after(df)
    bars = _bars(fig)
    assert not any(n.startswith("index_put") for n in bars)
    assert {"triton_fused * · before", "triton_fused * · after", "two_stream · before", "two_stream · after"} \
        == set(bars)
    assert bars["triton_fused * · after"].marker.pattern.shape == "x"
    assert bars["two_stream · before"].marker.pattern.shape == "/"  # before: hatched as ever
    assert any(n.startswith("before: not drawn, n/a (negative: noise)") for n in _notes(fig))
    assert all(y > 0 for b in bars.values() for y in b.y if y == y)
    ratios = charts.ratio_bars(df)
    assert set(_bars(ratios)) == {"two_stream"} and DERIVED_NOTE in _notes(ratios)


def test_distributions_mark_interpreted_variants():
    w = pd.DataFrame({"variant": ["two_stream", "triton_fused"] * 4, "phase": "decode", "size": 8, "layer": 0,
                      "step": range(8), "write_id": range(8), "value": [9.0, 16120.0] * 4,
                      "phase_size": "decode bs=8"})
    for fig in (charts.distribution(w, "host launch per write (µs)"), charts.per_layer(w, "host launch")):
        fig = charts.mark_interpreted(fig, {"triton_fused"})
        assert {t.name for t in fig.data} == {"two_stream", "triton_fused *"}
        assert any(INTERP_NOTE in n for n in _notes(fig))


def _rope_rows() -> pd.DataFrame:
    from kvprof.dashboard import layer_view

    row = {"against": "rope_then_triton_fused", "source": "reference", "phase": "decode", "phase_size": "decode bs=8",
           "variant_us": 5.0, "against_us": 8.0, "how": "measured in the layer", "why": "",
           "variant_kind": "measured", "against_kind": "measured"}
    rows = [  # a saving beyond its spread, one within it, one with no spread, one against an interpreted time
        {**row, "variant": "rope_triton_fused", "size": 8, "saving_ms": 0.30, "saving_spread_ms": 0.10},
        {**row, "variant": "rope_triton_fused", "size": 64, "saving_ms": 0.05, "saving_spread_ms": 0.20},
        {**row, "variant": "sglang_rope_store", "size": 8, "saving_ms": 0.40, "saving_spread_ms": float("nan")},
        {**row, "variant": "sglang_rope_store", "size": 64, "saving_ms": -9.0, "saving_spread_ms": 0.1,
         "against_kind": "interpreted", "against_us": 16120.0}]
    from kvprof.analysis.figures import classify

    for r in rows:
        pk = frames.pair_kind(r["variant_kind"], r["against_kind"])
        r["saving_kind"] = classify(r["saving_ms"], spread=r["saving_spread_ms"], needs_spread=True).kind \
            if pk == "measured" else pk
    return pd.DataFrame(rows, columns=list(layer_view.ROPE_COLUMNS))


def test_layer_rope_chart_draws_no_noise_saving_and_the_table_labels_it():
    from kvprof.dashboard import layer_view

    df = _rope_rows()
    assert list(df["saving_kind"]) == ["measured", "noise", "noise", "interpreted"]
    fig = charts.rope_saving(df, "rope")
    drawn = {(t.name, x) for t in fig.data for x in t.x}
    assert drawn == {("rope_triton_fused", "bs=8")}
    notes = " ".join(_notes(fig))
    assert "not drawn, noise" in notes and "rope_triton_fused, sglang_rope_store" in notes
    assert "n/a (interpreted" in notes
    text = layer_view.rope_table(df, None)
    saving = list(text["saves ms/step"])
    assert saving[0] == "0.3" and saving[1] == "+0.050 (noise: within its spread)"
    assert saving[2] == "+0.400 (noise: no spread to judge it)" and saving[3] == "n/a (interpreted)"
    assert text["vs rotary, then the write"].iloc[3] == "rope_then_triton_fused *"
    assert "16,120.000 *" in text.iloc[3].to_string()


def test_the_rope_frame_gives_each_saving_its_kind():
    """rope_frame itself: a decode saving beyond its spread is measured, one within it noise, and a
    row with no saving n/a; the chart draws exactly the measured ones."""
    from dashboard_support import LAYERS, gpu_layer_summary
    from kvprof.dashboard import layer_view

    summary, _ = gpu_layer_summary()
    df = layer_view.rope_frame(summary, layers=LAYERS)
    for r in df.itertuples():
        if r.saving_ms != r.saving_ms:
            assert r.saving_kind in ("n/a", "interpreted", "negative")
        else:
            assert r.saving_kind == ("measured" if abs(r.saving_ms) > r.saving_spread_ms else "noise")
    df.loc[df.index[df["phase"] == "decode"][0], "saving_spread_ms"] = 1e9  # now within its spread
    first = df.index[df["phase"] == "decode"][0]
    kept = df.drop(index=first)
    fig = charts.rope_saving(df.assign(saving_kind=[k if i != first else "noise" for i, k in
                                                    zip(df.index, df["saving_kind"])]), "rope")
    assert sum(len(t.x) for t in fig.data) == int(((kept["phase"] == "decode") & kept["saving_ms"].notna()).sum())


def test_landing_saving_draws_no_noise_and_no_saving_from_an_untrusted_cost():
    row = {"role": "fused", "verdict": "fused", "source": "kineto", "phase": "decode", "size": 8,
           "phase_size": "decode bs=8", "cost_us": 5.0, "cost_lo_us": 4.0, "cost_hi_us": 6.0,
           "spread_from": "step IQR / writes per step", "share_pct": 3.0, "cost_kind": "measured"}
    df = pd.DataFrame([
        {**row, "variant": "two_stream", "role": "baseline", "saving_ms": 0.0, "saving_spread_ms": float("nan"),
         "saving_kind": "measured"},
        {**row, "variant": "cuda_fused", "saving_ms": 0.3, "saving_spread_ms": 0.1, "saving_kind": "measured"},
        {**row, "variant": "triton_fused", "saving_ms": 0.05, "saving_spread_ms": 0.2, "saving_kind": "noise"},
        {**row, "variant": "index_put", "saving_ms": 2.0, "saving_spread_ms": 0.1, "saving_kind": "negative",
         "cost_kind": "negative", "cost_us": -3.0, "share_pct": -2.0}], columns=list(tables.LANDING_COLUMNS))
    fig = charts.landing_saving(df, "saving")
    assert set(_bars(fig)) == {"two_stream", "cuda_fused"}
    notes = " ".join(_notes(fig))
    assert "not drawn, noise" in notes and "triton_fused" in notes and NEG_NOTE in notes
    text = tables.landing_table(df).set_index("variant")
    assert text.loc["triton_fused", "saves ms/step"] == "+0.050 (noise: within its spread)"
    assert text.loc["index_put", "saves ms/step"] == "n/a (negative: noise)"
    assert text.loc["index_put", "writes' share of ITL %"] == "n/a (negative: noise)"
    assert text.loc["cuda_fused", "saves ms/step"] == "0.3"


def test_landing_frame_judges_each_saving_by_its_spread():
    """landing_frame's saving_kind on a GPU layer run: measured beyond the spread, noise within."""
    from dashboard_support import LAYERS, gpu_layer_summary
    from kvprof.dashboard import landing

    summary, _ = gpu_layer_summary()
    land = landing.build("r", summary, source="reference", baseline="two_stream", layers=LAYERS)
    df = land.frame
    dec = df[(df["phase"] == "decode") & df["saving_ms"].notna() & (df["variant"] != "two_stream")]
    assert len(dec)
    for r in dec.itertuples():
        if r.cost_kind == "measured" and r.saving_spread_ms == r.saving_spread_ms:
            assert r.saving_kind == ("measured" if abs(r.saving_ms) > r.saving_spread_ms else "noise")


def test_observer_table_labels_a_negative_reference_and_its_ratio():
    s = _summary()
    s["observer"] = {"rows": [
        {"variant": "two_stream", "source": "kineto", "phase": "decode", "size": 8, "cost_per_write_ns": 9000.0,
         "reference_cost_per_write_ns": -3_810_580.0, "ratio_per_write": -0.002, "flagged": True},
        {"variant": "triton_fused", "source": "kineto", "phase": "decode", "size": 8,
         "cost_per_write_ns": 16_120_000.0, "reference_cost_per_write_ns": 15_000_000.0, "ratio_per_write": 1.07},
        {"variant": "index_put", "source": "kineto", "phase": "decode", "size": 8, "cost_per_write_ns": 9900.0,
         "reference_cost_per_write_ns": 9000.0, "ratio_per_write": 1.1}]}
    text = tables.observer_table(frames.observer_frame(s)).set_index("variant")
    assert text.loc["two_stream", "reference µs/write"] == "n/a (negative: noise)"
    assert text.loc["two_stream", "reading / reference (write)"] == "n/a (negative: noise)"
    assert text.loc["triton_fused *", "reading µs/write"] == "16,120.000 *"
    assert text.loc["triton_fused *", "reading / reference (write)"] == "n/a (interpreted)"
    assert text.loc["index_put", "reading / reference (write)"] == "1.1"
    assert "-3,810" not in text.to_string()


@pytest.mark.parametrize("name, shown", [("us", "µs"), ("gpu_span_us", "gpu span µs"), ("median_us", "median µs"),
                                         ("bandwidth_gbs", "bandwidth GB/s"), ("gbs", "GB/s"),
                                         ("gpu_busy_ns", "gpu busy ns"), ("variant", "variant"),
                                         ("GPU µs/write", "GPU µs/write")])
def test_a_table_header_spells_its_unit_as_everywhere_else(name: str, shown: str) -> None:
    assert tables.header(name) == shown
