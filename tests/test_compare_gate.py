"""The regression gate (compare BASE NEW --fail-if-slower PCT), compare's output formats and
its output location: nothing is written into an input folder."""

from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path
from xml.etree import ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from kvprof.analysis.gate import CONTROL_ROW, GateRun, regression_gate
from kvprof.analysis.metrics import GROUP_COLUMNS
from kvprof.analysis.reference import reference_groups
from kvprof.cli import main
from kvprof.core.errors import TraceError
from kvprof.core.run import Manifest, VariantEntry
from kvprof.core.summary import Summary
from kvprof.core.timings import CONTROL, FREE_CONTROL, StepSamples, StepTimings
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
    gate = regression_gate(groups(point(cost=1000, iqr=80)), groups(point(cost=1300, iqr=80)), 5)
    (row,) = gate.rows
    assert row.regressed and not gate.passed and row.noise == "iqr" and gate.verdict == "regressed"
    assert row.slower_pct == pytest.approx(30.0)
    assert row.base_iqr_ns == pytest.approx(20.0) and row.spread_ns == pytest.approx(40.0)
    assert (row.low_pct, row.high_pct) == (pytest.approx(26.0), pytest.approx(34.0))


def test_a_slowdown_inside_a_spread_wider_than_the_threshold_is_inconclusive():
    # 30 % slower, but the runs scatter by 2 x 400 ns per write (+-80 %): too noisy to say either way
    gate = regression_gate(groups(point(cost=1000, iqr=1600)), groups(point(cost=1300, iqr=1600)), 5)
    (row,) = gate.rows
    assert row.status == "inconclusive" and not row.regressed and row.spread_ns == pytest.approx(800.0)
    assert gate.verdict == "inconclusive" and not gate.passed and gate.inconclusive == [row]
    # a spread of 20 % with a slowdown clear of it is still too noisy for a 5 % threshold, not for 25 %
    gate = regression_gate(groups(point(cost=1000, iqr=400)), groups(point(cost=1300, iqr=400)), 5)
    assert gate.verdict == "inconclusive"
    gate = regression_gate(groups(point(cost=1000, iqr=400)), groups(point(cost=1500, iqr=400)), 25)
    assert gate.verdict == "regressed"


def test_beyond_spread_but_under_threshold_passes():
    gate = regression_gate(groups(point(cost=1000, iqr=0)), groups(point(cost=1040, iqr=0)), 5)
    assert gate.passed and gate.rows[0].slower_pct == pytest.approx(4.0)


def test_faster_and_identical_pass():
    assert regression_gate(groups(point(iqr=0)), groups(point(iqr=0)), 0).passed
    assert regression_gate(groups(point(cost=1000, iqr=40)), groups(point(cost=500, iqr=40)), 5).passed


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


def side(writes, control=None, kineto=None, variant="index_put", manifest=None, clock="wall", free="same"):
    """A run: its reference steps (and control: torch's index_put, which the gate divides by; free: the
    numpy control that checks it, by default the control's own samples scaled, None for none), optionally
    a profiled pass, and the groups row analyze makes."""
    recs = [series(variant, "writes", writes, clock=clock)]
    if control is not None:
        recs.append(series(variant, CONTROL, control, clock=clock))
        if isinstance(free, str):
            free = np.asarray(control) * 0.4
    if free is not None and not isinstance(free, str):
        recs.append(series(variant, FREE_CONTROL, free, clock=clock))
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
    row = next(r for r in gate.rows if r.variant == "index_put")
    assert row.noise == "control" and row.slower_pct == pytest.approx(90, abs=8)
    assert row.drift_pct == pytest.approx(90, abs=8) and abs(row.judged_pct) < 10
    assert not row.regressed and gate.passed


def test_slower_code_on_the_same_machine_regresses():
    base = side(jitter(20_000, seed=1), control=jitter(4_000, seed=2))
    new = side(jitter(40_000, seed=3), control=jitter(4_000, seed=4))
    gate = regression_gate(base, new, 5)
    row = next(r for r in gate.rows if r.variant == "index_put")
    assert row.regressed and row.noise == "control"
    assert row.judged_pct == pytest.approx(100, abs=10) and row.low_pct > 5 and abs(row.drift_pct) < 5


def test_a_change_inside_the_steps_scatter_is_inconclusive():
    # +20 %, but each run's steps scatter by +-60 %: the interval of the difference reaches below 5 %, and its
    # half-width is above 5 %: too noisy to judge, which is not a pass
    base = side(jitter(20_000, seed=1, rel=0.6), control=jitter(4_000, seed=2))
    new = side(jitter(24_000, seed=3, rel=0.6), control=jitter(4_000, seed=4))
    gate = regression_gate(base, new, 5)
    row = next(r for r in gate.rows if r.variant == "index_put")
    assert row.noise == "control" and row.low_pct < 5 and not row.regressed
    assert row.status == "inconclusive" and row.noise_pct > 5 and gate.verdict == "inconclusive"


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
    gate = regression_gate(base, new, 10)
    assert gate.rows == [] and not gate.passed
    # the setting that would judge it, by its field (Python) or as compare's flag (the command line)
    assert gate.left_out == ["triton_fused decode 1: ran under Triton's interpreter (its time is numpy's on the "
                             "host, not the kernel's); include_interpreted judges it"]
    from kvprof.commands.compare import flags

    assert regression_gate(base, new, 10, names=flags()).left_out == [
        "triton_fused decode 1: ran under Triton's interpreter (its time is numpy's on the host, not the kernel's); "
        "--include-interpreted judges it"]
    gate = regression_gate(base, new, 10, include_interpreted=True)
    assert [r.variant for r in gate.regressed] == ["triton_fused"]


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


# --- the control shares no code with the variants; timings no clock gives; many rows at once -----------

def test_a_slower_torch_is_a_regression_though_its_own_control_slows_with_it():
    # NEW's torch index_put 1.5x slower: the index_put variant and torch's control series both slow down, the
    # numpy control does not. Divided by torch's control the slowdown cancels (what the gate did before, and
    # still does with check_control=False); the control's own row, torch over numpy, regresses
    base = side(jitter(20_000, seed=1), control=jitter(10_000, seed=2), free=jitter(4_000, seed=5))
    new = side(jitter(30_000, seed=3), control=jitter(15_000, seed=4), free=jitter(4_000, seed=6))
    cancelled = regression_gate(base, new, 10, check_control=False)
    assert cancelled.passed and [r.variant for r in cancelled.rows] == ["index_put"]
    assert abs(cancelled.rows[0].judged_pct) < 10
    gate = regression_gate(base, new, 10)
    assert gate.verdict == "regressed" and [r.variant for r in gate.regressed] == [CONTROL_ROW]
    (own,) = gate.regressed
    assert own.noise == "control check" and own.judged_pct == pytest.approx(50, abs=8) and abs(own.drift_pct) < 5
    assert own.low_pct > 10 and own.confidence == pytest.approx(1 - 0.05 / 2)  # two rows in the family
    # the machine slower as a whole moves both controls: no row regresses
    machine = side(jitter(38_000, seed=3), control=jitter(19_000, seed=4), free=jitter(7_600, seed=6))
    gate = regression_gate(base, machine, 10)
    assert gate.passed and {r.variant for r in gate.rows} == {"index_put", CONTROL_ROW}
    assert all(r.drift_pct > 60 for r in gate.rows)


def test_a_run_with_only_torchs_control_is_judged_without_a_control():
    # an older CPU capture: torch's control cannot be checked and is not divided by; raw step times are judged
    base = side(jitter(20_000, seed=1), control=jitter(10_000, seed=5), free=None)
    new = side(jitter(30_000, seed=3), control=jitter(15_000, seed=6), free=None)
    gate = regression_gate(base, new, 10)
    (row,) = gate.rows
    assert row.noise == "bootstrap" and row.regressed
    assert any("BASE and NEW timed no control_numpy series" in n for n in gate.notes)


@pytest.mark.parametrize("tamper, what", [
    (lambda x: [0.0] * len(x), "a step of 0.0 ns"),
    (lambda x: [-v for v in x], "a step of -"),
    (lambda x: [*x[:-1], math.nan], "a step of nan ns"),
    (lambda x: [*x[:-1], math.inf], "a step of inf ns"),
    (lambda x: x[:-1], "has series of 9, 10 steps"),
])
@pytest.mark.parametrize("mode", ["writes", FREE_CONTROL])
def test_step_timings_no_clock_gives_are_refused(tamper, what, mode):
    base = side(jitter(20_000, seed=1), control=jitter(4_000, seed=2))
    recs = [series("index_put", "writes", jitter(20_000, seed=3)), series("index_put", FREE_CONTROL, jitter(4_000))]
    recs = [r if r.mode != mode else series("index_put", r.mode, tamper(list(r.samples_ns))) for r in recs]
    timings = StepTimings(records=recs)
    new = GateRun(groups=base.groups, summary=base.summary, timings=timings)  # the groups as analyze made them
    with pytest.raises(TraceError, match="NEW's step timings: .*(" + re.escape(what) + ")"):
        regression_gate(base, new, 10)


def test_a_reference_pass_with_another_step_count_than_its_manifest_is_refused():
    m = manifest(resolved={"device_defaults": {"reference_steps": 12}})
    base = side(jitter(20_000, seed=1), control=jitter(4_000, seed=2), manifest=manifest())
    new = side(jitter(20_000, seed=3), control=jitter(4_000, seed=4), manifest=m)
    with pytest.raises(TraceError, match="NEW's step timings: index_put reference decode 1 has series of 10 steps "
                                         "where the manifest says 12"):
        regression_gate(base, new, 10)


def test_the_intervals_are_family_wise():
    # the same row judged alone and among 12: among 12 its interval is the 1 - 0.05/12 one, wider
    def run(seed, rows):
        recs = []
        for size in range(1, rows + 1):
            rng = np.random.default_rng(seed * 100 + size)
            for mode, centre in (("writes", 20_000), (FREE_CONTROL, 4_000)):
                s = centre * (1 + rng.uniform(-0.05, 0.05, 10))
                recs.append(StepSamples(variant="index_put", pass_="reference", phase="decode", size=size, mode=mode,
                                        graph=False, writes_per_step=WPS, clock="wall", samples_ns=tuple(s)))
        t = StepTimings(records=recs)
        return GateRun(groups=reference_groups(t), summary=Summary(input="x", input_kind="run",
                                                                   reference={"clock": ["wall"]}), timings=t)

    alone = regression_gate(run(1, 1), run(2, 1), 10).rows[0]
    among = next(r for r in regression_gate(run(1, 12), run(2, 12), 10).rows if r.size == 1)
    assert alone.confidence == pytest.approx(0.95) and among.confidence == pytest.approx(1 - 0.05 / 12)
    assert alone.judged_pct == pytest.approx(among.judged_pct)
    assert among.low_pct < alone.low_pct and among.high_pct > alone.high_pct


# --- the command's verdicts on a real CPU run: inconclusive, and timings no clock gives --------------

TINY = ["--device", "cpu", "--batch-sizes", "1", "--phase", "decode", "--steps", "6", "--warmup", "1",
        "--no-progress", "--no-summary", "--variants", "index_put"]


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu")
    assert main(["capture", *TINY, "--out", str(root), "--run-id", "r"]) == 0
    return root / "r"


@pytest.mark.slow
def test_a_gate_too_noisy_to_judge_exits_8(cpu_run, capsys, tmp_path):
    # a threshold of 0: every row's noise exceeds it, so nothing can be said either way
    junit = tmp_path / "g.xml"
    assert main(["compare", str(cpu_run), str(cpu_run), "--fail-if-slower", "0", "--junit", str(junit)]) == 8
    out = capsys.readouterr().out
    assert "gate: inconclusive, too noisy to judge" in out and "exit 8" in out
    assert "too noisy to judge: index_put" in out
    suite = ET.parse(junit).getroot()
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["verdict"] == "inconclusive" and int(suite.get("failures")) == 0
    assert all(c.find("skipped").get("message").startswith("inconclusive: ") for c in suite.findall("testcase"))


@pytest.mark.slow
@pytest.mark.parametrize("value", [0.0, -5000.0, "NaN", "Infinity", "short"])
def test_tampered_step_timings_are_refused_with_exit_3(cpu_run, capsys, tmp_path, value):
    import shutil

    new = tmp_path / "new"
    shutil.copytree(cpu_run, new)
    doc = json.loads((new / "step_timings.json").read_text())
    for r in doc["records"]:
        if r["pass"] == "reference" and r["mode"] == "writes":
            r["samples_ns"] = r["samples_ns"][:-1] if value == "short" else [value] * len(r["samples_ns"])
    text = json.dumps(doc).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
    (new / "step_timings.json").write_text(text)
    assert main(["compare", str(cpu_run), str(new), "--fail-if-slower", "10"]) == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    # NaN and Infinity are not JSON: the file is unreadable, which the manifest's reference steps give away
    unreadable = value in ("NaN", "Infinity")
    assert ("NEW's step timings are missing or unreadable" if unreadable
            else "NEW's step timings: index_put reference decode 1") in err, err


def timed(series, n=30, seed=0, rel=0.01):
    """A CPU run's reference pass at decode 1: per variant, its modes' step centres (ns); each variant's
    steps scatter by ``rel`` with its own seed, every mode of a variant alike."""
    recs = [StepSamples(variant=variant, pass_="reference", phase="decode", size=1, mode=mode, graph=False,
                        writes_per_step=WPS, clock="wall",
                        samples_ns=tuple(jitter(centre, n=n, seed=seed + i, rel=rel)))
            for i, (variant, modes) in enumerate(series.items()) for mode, centre in modes.items()]
    t = StepTimings(records=recs)
    return GateRun(groups=reference_groups(t), summary=Summary(input="x", input_kind="run",
                                                               reference={"clock": ["wall"]}), timings=t)


def test_a_shift_within_the_level_noise_of_a_series_is_not_a_regression():
    # two variants per run, each with its own controls: their torch controls sit 16 % apart over the numpy controls
    # beside them within one run (where their tensors landed), which no number of steps averages out: one series'
    # level noise is that ratio's spread over sqrt 2, about 8 %. A +20 % level shift of one row between runs, with
    # steps that scatter by 1 %, is within that noise: inconclusive, not regressed; with the controls of one run at
    # one level the same shift regresses
    def run(shift, spread, seed):
        low, high = 1 - spread, 1 + spread
        return timed({"index_put": {"writes": 20_000 * low * shift, CONTROL: 10_000 * low, FREE_CONTROL: 4_000},
                      "two_stream": {"writes": 20_000 * high, CONTROL: 10_000 * high, FREE_CONTROL: 4_000}},
                     seed=seed)

    gate = regression_gate(run(1.0, 0.08, 1), run(1.2, 0.08, 7), 10)
    row = next(r for r in gate.rows if r.variant == "index_put")
    assert row.judged_pct == pytest.approx(20, abs=3) and row.level_pct == pytest.approx(8, abs=1.5)
    assert row.status == "inconclusive" and gate.verdict == "inconclusive"
    gate = regression_gate(run(1.0, 0.0, 1), run(1.2, 0.0, 7), 10)
    row = next(r for r in gate.rows if r.variant == "index_put")
    assert row.regressed and gate.verdict == "regressed" and row.level_pct < 1


def test_load_that_differs_between_the_variants_timed_is_not_level_noise():
    # measured on a loaded 2-core machine: the variants of one run are timed one after another, and one of them in
    # a busier stretch runs every series 30 % slower, its controls too. That is the machine, which each step's
    # ratio cancels, not where the tensors landed: the level noise stays near 0 and a writer doing twice the work
    # regresses. Judged on the controls' medians alone (a run timed before control_numpy) it would read as 18 %
    # of level noise.
    def run(work, seed, numpy_=True):
        series = {}
        for variant, load, own in (("index_put", 1.0, 1), ("two_stream", 1.3, 1), ("gate_writer", 0.9, work)):
            series[variant] = {"writes": 20_000 * load * own, CONTROL: 10_000 * load,
                               **({FREE_CONTROL: 4_000 * load} if numpy_ else {})}
        return timed(series, n=10, seed=seed, rel=0.02)

    gate = regression_gate(run(1.0, 1), run(1.6, 7), 10)
    row = next(r for r in gate.rows if r.variant == "gate_writer")
    assert row.level_pct < 2 and row.low_pct > 10
    assert row.regressed and gate.verdict == "regressed"
    assert all(r.status == "passed" for r in gate.rows if r.variant != "gate_writer")
    old = regression_gate(run(1.0, 1, numpy_=False), run(1.6, 7, numpy_=False), 10, check_control=False)
    row = next(r for r in old.rows if r.variant == "gate_writer")
    assert row.level_pct == pytest.approx(18, abs=3) and row.status == "inconclusive"


# --- rows the noise allows a decision on are judged; only the rest are inconclusive --------------------

def test_a_2x_slowdown_on_scattered_steps_regresses_though_its_interval_is_wide():
    # 10 steps scattering by +-35 % each (a loaded 2-core machine): the interval of a 2x slowdown is wide (noise far
    # above 10 %) but all of it is above 10 %: a regression, not "too noisy to judge"
    base = side(jitter(20_000, seed=1, rel=0.35), control=jitter(4_000, seed=2))
    new = side(jitter(40_000, seed=3, rel=0.35), control=jitter(4_000, seed=4))
    gate = regression_gate(base, new, 10)
    row = next(r for r in gate.rows if r.variant == "index_put")
    assert row.noise_pct > 10 and row.low_pct > 10 and row.high_pct > 2 * row.low_pct
    assert row.status == "regressed" and row.regressed and gate.verdict == "regressed"


def test_a_wide_interval_wholly_under_the_threshold_passes():
    # twice as fast, on the same scattered steps: the interval is as wide, and all of it is under 10 %
    base = side(jitter(20_000, seed=1, rel=0.35), control=jitter(4_000, seed=2))
    new = side(jitter(10_000, seed=3, rel=0.35), control=jitter(4_000, seed=4))
    gate = regression_gate(base, new, 10)
    row = next(r for r in gate.rows if r.variant == "index_put")
    assert row.noise_pct > 10 and row.high_pct <= 10
    assert row.status == "passed" and gate.verdict == "passed" and row.steps_needed is None


def test_an_inconclusive_row_says_how_many_steps_would_settle_it(capsys):
    # identical scatter of +-30 % over 10 steps: inconclusive; the steps it names, timed, settle it
    def pair(n, seeds):
        return (side(jitter(20_000, n=n, seed=seeds[0], rel=0.3), control=jitter(4_000, n=n, seed=2)),
                side(jitter(20_000, n=n, seed=seeds[1], rel=0.3), control=jitter(4_000, n=n, seed=4)))

    gate = regression_gate(*pair(10, (1, 3)), 10)
    row = next(r for r in gate.rows if r.variant == "index_put")
    assert row.status == "inconclusive" and row.steps == 10 and row.steps_needed > 10
    assert gate.steps_needed == (row.steps_needed, []) and gate.to_json()["steps_needed"] == row.steps_needed
    for seeds in ((1, 3), (5, 7), (9, 11)):
        settled = regression_gate(*pair(row.steps_needed, seeds), 10)
        assert settled.verdict == "passed", [(r.variant, r.status, r.noise_pct) for r in settled.rows]
    from kvprof.report.gate import row_text
    from kvprof.report.renderers import Output, render
    from kvprof.report.terminal import table_console

    assert f"about {row.steps_needed} reference steps in both runs would settle it; 10 were timed" in row_text(row, 10)
    from kvprof.commands.compare import flags

    # compare names capture's setting as capture's flag
    render("table", gate, Output(console=table_console("table"), names=flags()), inconclusive_exit_code=8)
    out = capsys.readouterr().out
    assert f"capture both runs with --reference-steps {row.steps_needed} to settle 1 of them" in " ".join(out.split())
    render("table", gate, Output(console=table_console("table")), inconclusive_exit_code=8)
    out = capsys.readouterr().out
    assert f"capture both runs with reference_steps {row.steps_needed} to settle 1 of them" in " ".join(out.split())


def test_a_row_whose_level_noise_alone_exceeds_the_threshold_needs_no_step_count():
    # the controls of one run sit 16 % apart (where their tensors landed): no number of steps narrows that
    def run(seed):
        return timed({variant: {"writes": 20_000 * level, CONTROL: 10_000 * level, FREE_CONTROL: 4_000}
                      for variant, level in (("index_put", 0.92), ("two_stream", 1.08))}, seed=seed)

    gate = regression_gate(run(1), run(7), 10)
    noisy = [r for r in gate.rows if r.status == "inconclusive"]
    assert noisy and all(r.steps_needed is None and r.level_pct > 5 for r in noisy)
    assert gate.steps_needed == (None, noisy)
