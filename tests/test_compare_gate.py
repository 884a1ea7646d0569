"""The regression gate (compare BASE NEW --fail-if-slower PCT), compare's output formats and
its output location: nothing is written into an input folder."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from kvprof.analysis.gate import GateRun, regression_gate
from kvprof.analysis.metrics import GROUP_COLUMNS
from kvprof.analysis.reference import reference_groups
from kvprof.cli import main
from kvprof.core.run import Manifest, VariantEntry
from kvprof.core.summary import Summary
from kvprof.core.timings import StepSamples, StepTimings
from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build, dumps


def groups(*rows: dict) -> pd.DataFrame:
    full = []
    for r in rows:
        row = {c: math.nan for c in GROUP_COLUMNS}
        row.update(layer="all", writes=40, steps=10)
        row.update(r)
        full.append(row)
    return pd.DataFrame(full)[list(GROUP_COLUMNS)]


def point(variant="triton_fused", source="reference", phase="decode", size=8, cost=1000.0, iqr=400.0):
    # 4 writes a step: the per-write spread is iqr / 4
    return {"variant": variant, "source": source, "phase": phase, "size": size, "cost_per_write_ns": cost,
            "step_iqr_ns": iqr}


def test_slower_beyond_threshold_and_spread_regresses():
    # no per-step samples (a trace's groups): the step IQRs are the noise
    gate = regression_gate(groups(point(cost=1000, iqr=400)), groups(point(cost=1300, iqr=400)), 5)
    (row,) = gate.rows
    assert row.regressed and not gate.passed and row.noise == "iqr"
    assert row.slower_pct == pytest.approx(30.0)
    assert row.base_iqr_ns == pytest.approx(100.0) and row.spread_ns == pytest.approx(200.0)


def test_slower_than_threshold_but_inside_the_spread_passes():
    # 30 % slower, but the runs scatter by 2 x 400 ns per write: not a regression
    gate = regression_gate(groups(point(cost=1000, iqr=1600)), groups(point(cost=1300, iqr=1600)), 5)
    assert gate.passed and gate.rows[0].spread_ns == pytest.approx(800.0)


def test_beyond_spread_but_under_threshold_passes():
    gate = regression_gate(groups(point(cost=1000, iqr=0)), groups(point(cost=1040, iqr=0)), 5)
    assert gate.passed and gate.rows[0].slower_pct == pytest.approx(4.0)


def test_faster_and_identical_pass():
    assert regression_gate(groups(point()), groups(point()), 0).passed
    assert regression_gate(groups(point(cost=1000)), groups(point(cost=500)), 5).passed


def test_unknown_noise_is_not_judged():
    # fewer than 4 steps and no per-step samples: 10 % slower may be the runs' scatter; not judged, and a
    # gate that judged nothing has not passed
    gate = regression_gate(groups(point(iqr=math.nan)), groups(point(cost=1100, iqr=math.nan)), 5)
    assert gate.rows == [] and not gate.passed
    assert gate.unjudged == ["triton_fused decode 8: noise unknown at reference (no per-step samples and fewer "
                             "than 4 steps in a run)"]


def test_the_most_trusted_common_source_is_judged():
    base = groups(point(source="reference", cost=1000), point(source="kineto", cost=5000))
    new = groups(point(source="reference", cost=1000), point(source="kineto", cost=9000))
    gate = regression_gate(base, new, 5, source_order=["reference", "kineto"])
    assert [(r.source, r.regressed) for r in gate.rows] == [("reference", False)]
    # the reference missing from NEW: the profiler both measured decides
    gate = regression_gate(base, groups(point(source="kineto", cost=9000)), 5, source_order=["reference", "kineto"])
    assert [(r.source, r.regressed) for r in gate.rows] == [("kineto", True)]


def test_points_in_one_run_only_are_named():
    gate = regression_gate(groups(point(), point(variant="index_put")), groups(point(), point(size=64)), 5)
    assert len(gate.rows) == 1
    assert sorted(gate.unjudged) == ["index_put decode 8: only in BASE", "triton_fused decode 64: only in NEW"]


def test_a_negative_threshold_is_refused():
    with pytest.raises(ValueError):
        regression_gate(groups(point()), groups(point()), -1)


# --- per-step samples: a control series, a bootstrap interval, a second pass -------------------------

WPS = 2  # writes per step


def series(variant, mode, samples, pass_="reference", clock="wall"):
    return StepSamples(variant=variant, pass_=pass_, phase="decode", size=1, mode=mode, graph=False,
                       writes_per_step=WPS, clock=clock, samples_ns=tuple(float(x) for x in samples))


def jitter(centre, n=10, seed=0, rel=0.03):
    rng = np.random.default_rng(seed)
    return centre * (1 + rng.uniform(-rel, rel, n))


def side(writes, control=None, kineto=None, variant="index_put", manifest=None, clock="wall"):
    """A run: its reference steps (and control), optionally a profiled pass, and the groups row analyze makes."""
    recs = [series(variant, "writes", writes, clock=clock)]
    if control is not None:
        recs.append(series(variant, "control", control, clock=clock))
    if kineto is not None:
        recs.append(series(variant, "writes", kineto, pass_="kineto", clock=clock))
    timings = StepTimings(records=recs)
    g = reference_groups(timings)
    summary = Summary(input="x", input_kind="run", reference={"clock": [clock]})
    return GateRun(groups=g, summary=summary, timings=timings, manifest=manifest)


def test_a_machine_slower_as_a_whole_is_not_a_regression():
    # measured on a shared 2-core machine: a whole process 1.7-2x slower, its control too
    base = side(jitter(20_000, seed=1), control=jitter(4_000, seed=2))
    new = side(jitter(38_000, seed=3), control=jitter(7_600, seed=4))
    gate = regression_gate(base, new, 5)
    (row,) = gate.rows
    assert row.noise == "control" and row.slower_pct == pytest.approx(90, abs=8)
    assert row.drift_pct == pytest.approx(90, abs=8) and abs(row.judged_pct) < 10
    assert not row.regressed and gate.passed


def test_slower_code_on_the_same_machine_regresses():
    base = side(jitter(20_000, seed=1), control=jitter(4_000, seed=2))
    new = side(jitter(40_000, seed=3), control=jitter(4_000, seed=4))
    gate = regression_gate(base, new, 5)
    (row,) = gate.rows
    assert row.regressed and row.noise == "control"
    assert row.judged_pct == pytest.approx(100, abs=10) and row.low_pct > 5 and abs(row.drift_pct) < 5


def test_a_change_inside_the_steps_scatter_passes():
    # +20 %, but each run's steps scatter by +-60 %: the interval of the difference reaches below 5 %
    base = side(jitter(20_000, seed=1, rel=0.6), control=jitter(4_000, seed=2))
    new = side(jitter(24_000, seed=3, rel=0.6), control=jitter(4_000, seed=4))
    (row,) = regression_gate(base, new, 5).rows
    assert row.noise == "control" and row.low_pct < 5 and not row.regressed


def test_without_a_control_a_slowdown_must_show_in_both_passes():
    # a GPU run (CUDA events, no control): the reference pass alone 50 % slower, the profiled pass not
    base = side(jitter(20_000, seed=1), kineto=jitter(60_000, seed=2), clock="cuda_events")
    burst = side(jitter(30_000, seed=3), kineto=jitter(60_000, seed=4), clock="cuda_events")
    (row,) = regression_gate(base, burst, 5).rows
    assert row.noise == "bootstrap" and row.low_pct > 5 and row.confirmed_in == "kineto"
    assert row.confirm_low_pct < 5 and not row.regressed
    slower = side(jitter(30_000, seed=3), kineto=jitter(80_000, seed=4), clock="cuda_events")
    (row,) = regression_gate(base, slower, 5).rows
    assert row.regressed and row.confirm_low_pct > 5


def manifest(interpreted=False, **config):
    entry = VariantEntry()
    if interpreted:
        entry.extra["interpreted"] = True
    cfg = {"threads": 1, "layers": 2, "cache_dtype": "bf16", **config}
    return Manifest(device={"type": "cpu", "name": "x86_64"}, config=cfg, variants={"triton_fused": entry})


def test_interpreted_rows_are_left_out_unless_asked():
    m = manifest(interpreted=True)
    base = side(jitter(10e6, seed=1), control=jitter(4_000, seed=2), variant="triton_fused", manifest=m)
    new = side(jitter(30e6, seed=3), control=jitter(4_000, seed=4), variant="triton_fused", manifest=m)
    gate = regression_gate(base, new, 5)
    assert gate.rows == [] and not gate.passed
    assert gate.left_out == ["triton_fused decode 1: ran under Triton's interpreter (its time is numpy's on the "
                             "host, not the kernel's); --include-interpreted judges it"]
    (row,) = regression_gate(base, new, 5, include_interpreted=True).rows
    assert row.regressed


@pytest.mark.parametrize("change, line", [
    ({"threads": 2}, "torch threads: 1 in BASE, 2 in NEW"),
    ({"layers": 4}, "layers: each step wrote 2 layer(s) in BASE, 4 in NEW"),
    ({"cache_dtype": "fp8_e4m3"}, "settings: cache_dtype is bf16 in BASE, fp8_e4m3 in NEW"),
    ({"interpreted": False}, "interpreter: triton_fused ran under Triton's interpreter in BASE, compiled in NEW"),
    ({"device": {"type": "cuda", "name": "NVIDIA H200"}}, "device: BASE ran on cpu x86_64, NEW on cuda NVIDIA H200"),
    ({"clock": "cuda_events"}, "source: BASE's reference pass was timed with wall clock, NEW's with CUDA events"),
])
def test_runs_that_measure_different_things_are_not_compared(change, line):
    base_m = manifest(interpreted=True)
    change = dict(change)
    new_m = manifest(interpreted=change.pop("interpreted", True), **{k: v for k, v in change.items()
                                                                       if k not in ("device", "clock")})
    if "device" in change:
        new_m.device = change["device"]
    base = side(jitter(20_000), control=jitter(4_000), manifest=base_m)
    new = side(jitter(20_000), control=jitter(4_000), manifest=new_m, clock=change.get("clock", "wall"))
    gate = regression_gate(base, new, 5)
    assert gate.not_comparable == [line] and gate.rows == [] and not gate.passed
    assert gate.to_json()["comparable"] is False


def test_a_trace_without_manifest_is_compared_with_a_note():
    gate = regression_gate(side(jitter(20_000), control=jitter(4_000)), side(jitter(20_000), control=jitter(4_000)), 5)
    assert gate.passed and gate.notes == ["settings not checked: BASE and NEW have no manifest (a trace, not a run "
                                          "directory)"]


# --- the command, on synthetic traces with known kernel durations ---------------------------------

def _run(folder: Path, k_ns: int) -> Path:
    folder.mkdir(parents=True)
    for variant in ("two_stream", "triton_fused"):
        spec = TraceSpec(variant=variant, layers=[0, 1, 2, 3], phases=[PhaseSpec("decode", 8, 6, graph=True)],
                         write=WriteSpec([KernelSpec(7, 0, k_ns if variant == "triton_fused" else 2500)]))
        doc, _ = build(spec)
        (folder / f"{variant}.pt.trace.json.gz").write_bytes(gzip.compress(dumps(doc), compresslevel=1))
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    return _run(root / "base", 2500), _run(root / "slow", 3500)  # triton_fused's kernel 40 % longer


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_planted_slowdown_fails_the_gate(runs, tmp_path, capsys):
    base, slow = runs
    before = _listing(base), _listing(slow)
    junit = tmp_path / "gate.xml"
    assert main(["compare", str(base), str(slow), "--fail-if-slower", "5", "--junit", str(junit), "--json"]) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)  # stdout holds one document
    assert doc["gate"]["passed"] is False
    bad = [r for r in doc["gate"]["rows"] if r["regressed"]]
    assert {r["variant"] for r in bad} == {"triton_fused"}
    assert all(r["slower_pct"] > 5 for r in bad)
    assert "regressed" in err and "triton_fused" in err
    suite = ET.parse(junit).getroot()
    cases = suite.findall("testcase")
    assert len(cases) == len(doc["gate"]["rows"]) and int(suite.get("failures")) == len(bad)
    failed = [c.get("name") for c in cases if c.find("failure") is not None]
    assert failed and all(n.startswith("triton_fused ") for n in failed)
    assert (_listing(base), _listing(slow)) == before  # nothing written into the inputs


def test_identical_runs_pass_the_gate(runs, capsys):
    base, _ = runs
    assert main(["compare", str(base), str(base), "--fail-if-slower", "5"]) == 0
    out = capsys.readouterr().out
    assert "gate: passed" in out


def test_compare_writes_only_into_out(runs, tmp_path, capsys):
    base, slow = runs
    assert main(["compare", str(base), str(slow), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split(",")
    assert header[:4] == ["variant", "source", "phase", "size"]
    assert "compare.json" not in _listing(base) + _listing(slow)
    assert main(["compare", str(base), "--out", str(tmp_path / "o"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert json.loads((tmp_path / "o" / "compare.json").read_text()) == doc


@pytest.mark.parametrize("args", [["--fail-if-slower", "5"], ["SECOND", "--junit", "x.xml"],
                                  ["SECOND", "--fail-if-slower", "-3"], ["SECOND", "--fail-if-slower", "nan"]])
def test_gate_usage_errors_are_one_line(runs, capsys, args):
    base, slow = runs
    argv = ["compare", str(base), *[str(slow) if a == "SECOND" else a for a in args]]
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own refusals exit from inside parse_args
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_trace_and_a_run_of_the_same_device_are_not_told_apart_by_how_they_name_it():
    # a trace knows its device's name only (analyze's summary); a run's manifest has the type too
    trace = side(jitter(20_000), control=jitter(4_000))
    trace.summary.device = {"name": "NVIDIA H200"}  # type: ignore[union-attr]
    run = side(jitter(20_000), control=jitter(4_000), manifest=manifest())
    run.manifest.device = {"type": "cuda", "name": "NVIDIA H200"}  # type: ignore[union-attr]
    assert not [w for w in regression_gate(trace, run, 5).not_comparable if w.startswith("device")]
    run.manifest.device = {"type": "cuda", "name": "NVIDIA H100"}  # type: ignore[union-attr]
    assert regression_gate(trace, run, 5).not_comparable == ["device: BASE ran on NVIDIA H200, NEW on cuda "
                                                              "NVIDIA H100"]
