"""The write's own added time in a layer, split from its neighbours' variation, on synthetic traces
whose parts are known: a GEMM that runs longer in the graph with the write must not count as the
write's."""

from __future__ import annotations

import pandas as pd
import pytest

from kvprof.analysis.layer_own import generic_savings, own_times, runs_spread, summarize
from kvprof.core.errors import UsageError

LAYERS = 4
REPLAYS = 5
BASE = (("gemm_qkv", 3000.0), ("rotary", 500.0), ("attention", 4000.0), ("gemm_splitK", 30000.0))


def _replay(with_write: bool, write: list[tuple[str, float]], gemm_extra: float, gap: float) -> list[tuple[str, float]]:
    """One replay's kernels (name, duration) in launch order, and the idle gap after the write."""
    out: list[tuple[str, float]] = []
    for _ in range(LAYERS):
        for name, dur in BASE:
            out.append((name, dur + (gemm_extra if with_write and name == "gemm_splitK" else 0.0)))
            if name == "rotary" and with_write:
                out += write
                out.append(("idle", gap))
    return out


def _capture(dtype: str, variant: str, rotation: int, size: int, write: list[tuple[str, float]], gemm_extra: float,
             gap: float, jitter: float = 0.0) -> tuple[list[dict], list[dict]]:
    kernels, steps = [], []
    for mode in ("layer", "layer_no_write"):
        spans = []
        for replay in range(REPLAYS):
            t = 1_000_000.0 * (replay + 1)
            start = t
            for name, dur in _replay(mode == "layer", write, gemm_extra, gap):
                d = dur + (jitter * (replay % 2) if name == "attention" else 0.0)
                if name != "idle":
                    kernels.append({"dtype": dtype, "variant": variant, "rotation": rotation, "size": size,
                                    "mode": mode, "replay": replay, "name": name, "start_ns": t, "dur_ns": d})
                t += d
            spans.append(t - start)
        steps.append({"dtype": dtype, "variant": variant, "rotation": rotation, "size": size, "mode": mode,
                      "median_ns": sorted(spans)[len(spans) // 2], "iqr_ns": 100.0, "layers": LAYERS})
    return kernels, steps


def _frames(*captures: tuple[list[dict], list[dict]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    return (pd.DataFrame([k for c in captures for k in c[0]]), pd.DataFrame([s for c in captures for s in c[1]]))


def test_a_neighbour_that_ran_longer_is_not_the_writes() -> None:
    """fused's graph ran its split-K GEMM 2 µs longer per layer: its added time reads 3.1 µs, its
    own 1.1 (0.8 kernel + 0.3 idle); the other variant's GEMM did not move."""
    k, s = _frames(_capture("bf16", "fused", 0, 1, [("store", 800.0)], 2000.0, 300.0),
                   _capture("bf16", "other", 0, 1, [("store", 800.0)], 0.0, 300.0))
    rows = {r.variant: r for r in own_times(k, s, {("bf16", 0): ["fused", "other"]})}
    f = rows["fused"]
    assert f.added_ns == pytest.approx(3100.0)
    assert f.neighbours_ns == pytest.approx(2000.0)
    assert f.own_ns == pytest.approx(1100.0)
    assert f.write_kernels_ns == pytest.approx(800.0)
    assert f.gaps_ns == pytest.approx(300.0)
    assert f.top_neighbour == "gemm_splitK" and f.top_neighbour_ns == pytest.approx(2000.0)
    assert f.write_kernels == ["store"] and f.position == 0
    o = rows["other"]
    assert o.own_ns == pytest.approx(1100.0) and o.neighbours_ns == pytest.approx(0.0) and o.position == 1


def test_a_write_that_replaces_a_kernel_counts_the_difference() -> None:
    """A rope + store write replaces the rotary: launches of 'rotary' differ between the graphs,
    so the rotary's time is the write's (negative), not a neighbour's."""
    cap = _capture("bf16", "rope_fused", 0, 1, [("rope_store", 700.0)], 0.0, 0.0)
    kernels = [r for r in cap[0] if not (r["mode"] == "layer" and r["name"] == "rotary")]
    k, s = pd.DataFrame(kernels), pd.DataFrame(cap[1])
    (r,) = own_times(k, s)
    assert r.write_kernels == ["rope_store", "rotary"]
    assert r.write_kernels_ns == pytest.approx(700.0 - 500.0)
    assert r.neighbours_ns == pytest.approx(0.0)


def test_summary_and_runs_spread_over_rotations() -> None:
    caps = [_capture("bf16", "fused", rot, 1, [("store", 800.0)], extra, 300.0, jitter=j)
            for rot, extra, j in ((0, 2000.0, 0.0), (1, 0.0, 0.0), (2, 1000.0, 0.0))]
    k, s = _frames(*caps)
    (summary,) = summarize(own_times(k, s))
    assert summary.captures == 3
    assert summary.own_ns == pytest.approx(1100.0)
    assert summary.own_range_ns == pytest.approx((1100.0, 1100.0))
    assert summary.added_range_ns == pytest.approx((1100.0, 3100.0))
    assert summary.neighbours_range_ns == pytest.approx((0.0, 2000.0))
    # the graphs without the write: the same in every capture here
    (spread,) = runs_spread(k, LAYERS)
    assert spread.captures == 3 and spread.spread_ns == pytest.approx(0.0)
    moved = _capture("bf16", "fused", 3, 1, [("store", 800.0)], 0.0, 300.0)
    for row in moved[0]:
        if row["mode"] == "layer_no_write" and row["name"] == "attention":
            row["dur_ns"] += 400.0
    (spread,) = runs_spread(pd.concat([k, pd.DataFrame(moved[0])]), LAYERS)
    assert spread.spread_ns == pytest.approx(400.0) and spread.top_kernel == "attention"


def test_generic_saving_against_what_its_conversion_costs() -> None:
    """The generic fp8 write: four conversion kernels (4 x 600 ns) then the store; the fused
    quantising write one kernel of 900 ns. Extra = 2.4 µs + gaps; saving counts the same gaps."""
    conv = [("div_k", 600.0), ("div_v", 600.0), ("to_k", 600.0), ("to_v", 600.0)]
    caps = [_capture("fp8", "generic", 0, 1, [*conv, ("store", 800.0)], 0.0, 300.0),
            _capture("bf16", "generic", 0, 1, [("store", 800.0)], 0.0, 300.0),
            _capture("fp8", "fused", 0, 1, [("store_q", 900.0)], 0.0, 300.0)]
    k, s = _frames(*caps)
    (g,) = generic_savings(own_times(k, s), "generic", "fp8", "bf16")
    assert g.variant == "fused" and g.extra_ns == pytest.approx(2400.0)
    assert g.saving_ns == pytest.approx(2300.0) and g.share == pytest.approx(2300.0 / 2400.0)
    assert g.saving_spread_ns == pytest.approx((2 * (100.0 ** 2 + 100.0 ** 2)) ** 0.5 / LAYERS)


def test_missing_columns_are_one_line_errors() -> None:
    with pytest.raises(UsageError, match="the kernel table lacks column"):
        own_times(pd.DataFrame({"name": []}), pd.DataFrame())


def test_a_run_without_traces_keeps_its_event_figure() -> None:
    _, steps = _capture("bf16", "fused", 0, 1, [("store", 800.0)], 0.0, 0.0)
    empty = pd.DataFrame(columns=["dtype", "variant", "rotation", "size", "mode", "replay", "name", "start_ns",
                                  "dur_ns"])
    (r,) = own_times(empty, pd.DataFrame(steps))
    assert r.added_ns == pytest.approx(800.0) and r.own_ns is None and r.neighbours_ns is None
