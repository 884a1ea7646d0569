"""lab/fp8_ablation.py's summary, on CPU: the per-step cost is a least-squares slope over the
dependent-op rows, and the fp8 write's extra time is expressed in those steps."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def ablation(monkeypatch):
    # the script pins TRITON_INTERPRET=0 for its own process; monkeypatch puts it back
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    spec = importlib.util.spec_from_file_location("fp8_ablation", ROOT / "lab" / "fp8_ablation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(prefix: str, copy: float, per_step: float, fp8: float, cast: float | None) -> dict:
    rows = {f"{prefix}  bf16 copy [1/4/1]": copy, f"{prefix}  bf16 copy, fp8's shape [1/8/1]": copy + 0.5,
            f"{prefix}  fp8, packed fix-up [1/8/1]": fp8}
    if cast is not None:
        rows[f"{prefix}  fp8, cast only [1/8/1]"] = cast
    for n in (1, 2, 3, 4, 6):
        rows[f"{prefix}  bf16 copy + {n} ops [1/4/1]"] = copy + n * per_step
    rows[f"{prefix}  bf16 copy + 2 ops, fp8's shape [1/8/1]"] = 9.0  # not part of the fit
    return {k: {"median": [v, v + 0.001, v - 0.001], "iqr": [0.005] * 3} for k, v in rows.items()}


def test_chain_summary_fits_the_step_cost_and_counts_the_gap_in_steps(ablation):
    out = {**_rows("8x128  1 tok", 0.687, 0.002, 0.696, 0.692), **_rows("1x128 64 tok", 0.700, 0.004, 0.702, None)}
    summary = ablation.chain_summary(out)
    a, b = summary["points"]["8x128  1 tok"], summary["points"]["1x128 64 tok"]
    assert a["ns_per_step"] == pytest.approx(2.0) and a["fp8_minus_copy_ns"] == pytest.approx(9.0)
    assert a["cast_only_minus_copy_ns"] == pytest.approx(5.0)
    assert b["ns_per_step"] == pytest.approx(4.0) and b["cast_only_minus_copy_ns"] is None
    assert sorted(a["steps"]) == [0, 1, 2, 3, 4, 6]
    assert any("4.5 steps" in line for line in summary["lines"])
    assert any("0.5 steps" in line for line in summary["lines"])


def test_chain_summary_skips_points_without_the_yardstick(ablation):
    out = {"8x128  1 tok  bf16 copy [1/4/1]": {"median": [0.687], "iqr": [0.005]},
           "8x128  1 tok  fp8, packed fix-up [1/8/1]": {"median": [0.696], "iqr": [0.005]}}
    assert ablation.chain_summary(out) == {"points": {}, "lines": []}


def test_committed_h200_run_backs_the_docs(ablation):
    """lab/README.md's ablation table and claims come from lab/results/fp8-ablation-4.json: its summary
    is what the script computes from its own points, and the claims hold on them."""
    import json
    import statistics

    run = json.loads((ROOT / "lab" / "results" / "fp8-ablation-4.json").read_text())
    assert run["captures"] == 5 and run["e4m3_saturates"] is False and "H200" in run["device"]
    recomputed = ablation.chain_summary(run["points"])["points"]
    assert recomputed.keys() == run["chain"].keys() and len(recomputed) == 8
    for name, rec in recomputed.items():
        assert rec["ns_per_step"] == run["chain"][name]["ns_per_step"]
        assert rec["fp8_minus_copy_ns"] == run["chain"][name]["fp8_minus_copy_ns"]

    def ns(point: str, label: str) -> float:
        (key,) = [k for k in run["points"] if k.startswith(f"{point}  {label} [")]
        return statistics.median(run["points"][key]["median"]) * 1e3

    for point, rec in recomputed.items():
        copy = ns(point, "bf16 copy")
        iqr = statistics.median(next(v["iqr"] for k, v in run["points"].items()
                                     if k.startswith(f"{point}  bf16 copy ["))) * 1e3
        assert 5 <= rec["fp8_minus_copy_ns"] <= 14, point  # the writer's fp8 kernel: slower everywhere
        if point.startswith("1x128"):
            assert ns(point, "fp8, cast only") > copy, point  # even the bare cast costs at 512-byte rows
        else:
            assert abs(ns(point, "fp8, no fix-up") - copy) <= iqr, point  # the fix-up is the cost
            assert 8 <= ns(point, "fp8, packed fix-up") - ns(point, "fp8, no fix-up") <= 11.5, point
