"""The unprofiled reference pass, each profiler's observer effect, and writes inside a layer."""

from __future__ import annotations

import json
import math

import orjson
import pandas as pd
import pytest

from cli_support import run_cli
from kvprof.analysis.compare import compare_groups
from kvprof.analysis.reference import (
    observer_effect,
    observer_notes,
    reference_groups,
    trusted_sources,
)
from kvprof.cli import main
from kvprof.core.timings import StepSamples, StepTimings
from kvprof.trace.attribution import attribute
from kvprof.trace.kineto import read_kineto
from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build

TINY = ["--model", "tiny=3x2x64", "--tp", "1", "--batch-sizes", "1,2", "--prefill-tokens", "16",
        "--steps", "2", "--warmup", "1", "--reference-steps", "6", "--no-progress"]


def _samples(variant: str, mode: str, values: list[float], *, pass_: str = "reference", size: int = 10,
             layers: int = 80, phase: str = "decode", clock: str = "cuda_events") -> StepSamples:
    return StepSamples(variant=variant, pass_=pass_, phase=phase, size=size, mode=mode, graph=phase == "decode",
                       writes_per_step=0 if mode == "layer_no_write" else layers, clock=clock,
                       samples_ns=tuple(values))


# -- the file format --------------------------------------------------------------------------
def test_step_timings_round_trip_and_refuse_other_documents():
    t = StepTimings(context="layer", context_len=4096, records=[
        _samples("a", "layer", [100.0, 110.0, 120.0, 130.0, 140.0]), _samples("a", "writes", [8.0] * 4, pass_="nsys")])
    back = StepTimings.from_json(t.to_json())
    assert back.context == "layer" and back.context_len == 4096
    assert [r.to_json() for r in back.records] == [r.to_json() for r in t.records]
    assert back.records[0].median_ns == 120.0 and back.records[0].iqr_ns == pytest.approx(20.0)
    with pytest.raises(ValueError, match="not a kvprof step_timings"):
        StepTimings.from_json(b'{"schema": "other/1", "records": []}')
    with pytest.raises(ValueError, match="records"):
        StepTimings.from_json(b'{"schema": "kvprof.step_timings/1", "records": 3}')


# -- pure analysis ----------------------------------------------------------------------------
def test_reference_rows_writes_alone_are_step_over_writes():
    t = StepTimings(records=[_samples("triton_fused", "writes", [80_000.0, 80_000.0, 96_000.0, 64_000.0, 80_000.0])])
    g = reference_groups(t)
    row = g.iloc[0]
    assert (row["source"], row["context"], row["steps"], row["writes"]) == ("reference", "none", 5, 400)
    assert row["step_ns"] == 80_000.0 and row["cost_per_write_ns"] == pytest.approx(1_000.0)
    assert math.isnan(row["write_share"])


def test_reference_rows_in_a_layer_charge_the_write_what_it_adds():
    t = StepTimings(context="layer", records=[
        _samples("v", "layer", [5_080_000.0] * 5), _samples("v", "layer_no_write", [5_000_000.0] * 5),
        _samples("v", "writes", [60_000.0] * 5)])
    row = reference_groups(t).iloc[0]
    assert row["context"] == "layer"
    assert row["cost_per_write_ns"] == pytest.approx(80_000.0 / 80)
    assert row["write_share"] == pytest.approx(80_000.0 / 5_080_000.0)
    assert row["writes_only_step_ns"] == 60_000.0


def _groups_with(profiler_cost: float, step_ns: float, source: str = "kineto") -> pd.DataFrame:
    t = StepTimings(records=[_samples("v", "writes", [80_000.0] * 5)])
    ref = reference_groups(t)
    prof = ref.copy()
    prof["source"] = source
    prof["cost_per_write_ns"] = profiler_cost
    prof["step_gpu_ns"] = step_ns
    prof["attribution"] = "graph_order"
    return pd.concat([ref, prof], ignore_index=True), t


@pytest.mark.parametrize("cost,flag", [(1_050.0, False), (1_150.0, True), (850.0, True), (2_500.0, True)])
def test_observer_flags_a_source_more_than_ten_percent_off(cost, flag):
    groups, t = _groups_with(cost, cost * 80)
    t.add(_samples("v", "writes", [160_000.0] * 3, pass_="kineto"))
    obs = observer_effect(groups, t)
    (row,) = obs["rows"]
    assert row["ratio_per_write"] == pytest.approx(cost / 1_000.0)
    assert row["ratio_per_step"] == pytest.approx(cost / 1_000.0)
    assert row["pass_slowdown"] == pytest.approx(2.0)  # the profiled run itself: 160 µs against 80
    assert row["flagged"] is flag
    assert obs["sources"]["kineto"]["flagged"] == int(flag)
    notes = observer_notes(obs)
    assert (len(notes) == 1) is flag
    if flag:
        assert "torch.profiler" in notes[0] and "headline figures use the reference" in notes[0]


def test_trusted_sources_put_the_reference_first_then_the_least_perturbed():
    obs = {"sources": {"kineto": {"median_ratio_per_write": 1.05}, "nsys": {"median_ratio_per_write": 3.0}}}
    assert trusted_sources(["kineto", "nsys", "reference"], obs) == ["reference", "kineto", "nsys"]
    assert trusted_sources(["kineto", "nsys"], None) == ["nsys", "kineto"]  # no reference: the prior


def test_compare_headline_comes_from_the_reference_and_a_layer_step_is_measured():
    rows = []
    for variant, step, alone in (("two_stream", 5_300_000.0, 240_000.0), ("triton_fused", 5_100_000.0, 56_000.0)):
        t = StepTimings(context="layer", records=[
            _samples(variant, "layer", [step] * 6), _samples(variant, "layer_no_write", [5_000_000.0] * 6),
            _samples(variant, "writes", [alone] * 6)])
        ref = reference_groups(t)
        prof = ref.copy()
        prof["source"], prof["cost_per_write_ns"] = "nsys", ref["cost_per_write_ns"] * 3
        rows += [ref, prof]
    groups = pd.concat(rows, ignore_index=True)
    cmp = compare_groups(groups, "two_stream", layers=80, prefer=["triton_fused"],
                         source_order=["reference", "nsys"])
    h = cmp["headline"]
    assert h["source"] == "reference" and h["measured"] and h["context"] == "layer"
    assert h["saving_per_step_ms"] == pytest.approx(0.2)  # 5.3 ms - 5.1 ms, measured
    assert h["projected_saving_per_step_ms"] == pytest.approx((240_000.0 - 56_000.0) / 1e6)
    assert h["predicted_itl_ms"] == pytest.approx(12.05 - 0.2)


def test_a_cpu_wall_clock_reference_predicts_no_itl():
    t = StepTimings(records=[_samples("two_stream", "writes", [400.0] * 4, clock="wall"),
                             _samples("triton_fused", "writes", [200.0] * 4, clock="wall")])
    cmp = compare_groups(reference_groups(t), "two_stream", layers=80)
    (row,) = cmp["rows"]
    assert row["ratio_cost_per_write_ns"] == pytest.approx(0.5)
    assert "predicted_itl_ms" not in row and "headline" not in cmp


# -- attribution inside a layer ---------------------------------------------------------------
def test_graph_replays_of_whole_layers_are_cut_by_the_template():
    """A replay of 4 layers x (GEMM, rotary, write, attention): only the write is the write's."""
    layer = [KernelSpec(7, 0, 3000, "gemm"), KernelSpec(7, 3200, 800, "rotary"),
             KernelSpec(7, 4200, 700, "_store_kv_fused"), KernelSpec(7, 5100, 4000, "attention")]
    spec = TraceSpec(variant="triton_fused", phases=[PhaseSpec("decode", 8, 3, graph=True)], write=WriteSpec(layer),
                     fused=True, with_sync=False)
    doc, _ = build(spec)
    doc["kvprof"]["context"] = "layer"
    doc["kvprof"]["template"] = {"decode 8": {"kernels": 1, "memcpy": 0, "memset": 0, "ops_per_layer": 4,
                                              "write_positions": [2]}}
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        path.write_text(json.dumps(doc))
        trace = attribute(read_kineto(path))
    w = trace.writes
    assert len(w) == 4 * 3 and set(w["attribution"]) == {"graph_order"}
    ev = trace.events.to_pandas()
    mine = ev[ev["write_id"] >= 0]
    assert set(mine["name"].astype(str)) == {"_store_kv_fused"} and len(mine) == 12
    assert sorted(w["layer"].tolist()) == sorted([0, 1, 2, 3] * 3)
    assert not trace.warnings


# -- the capture, end to end on CPU -----------------------------------------------------------
def test_every_capture_records_reference_figures_and_the_observer_effect(tmp_path, capsys):
    rc = main(["capture", *TINY, "--variants", "index_put,two_stream", "--out", str(tmp_path), "--run-id", "r"])
    assert rc == 0
    run = tmp_path / "r"
    timings = StepTimings.from_json((run / "step_timings.json").read_bytes())
    ref = timings.select(pass_="reference")
    assert {(r.variant, r.phase, r.size) for r in ref} == {
        (v, p, s) for v in ("index_put", "two_stream") for p, s in (("decode", 1), ("decode", 2), ("prefill", 16))}
    assert all(len(r.samples_ns) == 6 and r.clock == "wall" and min(r.samples_ns) > 0 for r in ref)
    assert {r.pass_ for r in timings.records} == {"reference", "kineto"}  # the torch pass timed its steps too
    summary = orjson.loads((run / "summary.json").read_bytes())
    ref_rows = [g for g in summary["groups"] if g["source"] == "reference"]
    assert len(ref_rows) == 6 and summary["trusted_sources"][0] == "reference"
    obs = summary["observer"]
    assert len(obs["rows"]) == 6 and obs["threshold"] == 0.1
    for row in obs["rows"]:  # CPU: the host step's wall time against the reference's
        assert row["ratio_per_step"] == pytest.approx(row["step_ns"] / row["reference_step_ns"])
        assert row["flagged"] == (abs(row["ratio_per_step"] - 1) > 0.1)
    # the capture prints the compact view; analyze has every table
    assert "python -m kvprof analyze" in capsys.readouterr().out
    assert main(["analyze", str(run), "--no-files"]) == 0
    out = capsys.readouterr().out
    assert "reference: no profiler, no ranges" in out and "observer effect" in out


def test_context_layer_runs_on_cpu_and_reports_the_write_share(tmp_path, capsys):
    rc = main(["capture", *TINY, "--variants", "two_stream", "--context", "layer", "--context-len", "8",
               "--layers", "3", "--out", str(tmp_path), "--run-id", "l"])  # all 3 (2 on a CPU by default)
    assert rc == 0
    run = tmp_path / "l"
    timings = StepTimings.from_json((run / "step_timings.json").read_bytes())
    assert timings.context == "layer" and timings.context_len == 8
    modes = {(r.phase, r.size, r.mode) for r in timings.select(pass_="reference")}
    # on a CPU the control steps (the machine's speed: torch's and numpy's) are timed beside each mode's steps
    assert modes == {(p, s, m) for p, s in (("decode", 1), ("decode", 2), ("prefill", 16))
                     for m in ("layer", "layer_no_write", "writes", "control", "control_numpy")}
    summary = orjson.loads((run / "summary.json").read_bytes())
    ref = [g for g in summary["groups"] if g["source"] == "reference"]
    assert ref and all(g["context"] == "layer" and g["write_share"] is not None for g in ref)
    trace = orjson.loads(__import__("gzip").decompress((run / "two_stream.pt.trace.json.gz").read_bytes()))
    assert trace["kvprof"]["context"] == "layer"
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "set_kv_buffer[two_stream] L2" in names  # the writes keep their ranges among the layer's ops
    assert "each write inside a decoder layer" in " ".join(capsys.readouterr().out.split())
    assert main(["analyze", str(run), "--no-files"]) == 0
    assert "write share %" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["--context", "nonsense"], "unknown context 'nonsense'"),
    (["--reference-steps", "0"], "argument --reference-steps: expected a positive integer"),
    (["--context", "layer", "--context-len", "0"], "argument --context-len: expected a positive integer"),
    (["--context", "layer", "--model", "llama-3.1-405b", "--tp", "1", "--max-memory-gb", "4"], "one layer needs"),
])
def test_bad_context_values_are_one_line_and_leave_nothing(tmp_path, capsys, args, message):
    base = TINY[4:] if "--model" in args else TINY  # the case names its own model and tp
    rc, _, stderr = run_cli(capsys, "capture", *base, *args, "--variants", "index_put", "--out", str(tmp_path),
                            "--run-id", "bad")
    err = stderr.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]
    assert not (tmp_path / "bad").exists() and not any(tmp_path.iterdir())


def test_a_failed_reference_pass_is_recorded_not_fatal(tmp_path, capsys, monkeypatch):
    import kvprof.capture.run as run_mod

    def broken(*_a, **_k):
        raise RuntimeError("planted failure\nsecond line")

    monkeypatch.setattr(run_mod, "run_reference_pass", broken)
    rc = main(["capture", *TINY, "--variants", "index_put", "--out", str(tmp_path), "--run-id", "f"])
    assert rc == 0
    manifest = orjson.loads((tmp_path / "f" / "manifest.json").read_bytes())
    assert manifest["variants"]["index_put"]["reference_error"] == "RuntimeError: planted failure"
    summary = orjson.loads((tmp_path / "f" / "summary.json").read_bytes())
    assert any("no reference figures" in w for w in summary["warnings"])
    assert not [g for g in summary["groups"] if g["source"] == "reference"]
    assert "reference pass for index_put failed" in capsys.readouterr().err


def test_a_cpu_reference_pass_draws_its_mode_order_afresh_each_step(monkeypatch):
    """A fixed order lets a scheduler's time slice land on one mode at every round (each step of
    one series preempted, none of another's); the order is drawn per step, the same for a seed."""
    import torch

    from kvprof.capture import reference
    from kvprof.capture.config import CaptureConfig
    from kvprof.capture.plan import resolve
    from kvprof.kvcache.layouts.registry import create_writer

    real = reference.StepTimer
    cpu = torch.device("cpu")

    def orders(seed: int) -> list[tuple[int, ...]]:
        made: list[object] = []  # timers in the order the pass makes them: writes, control, control_numpy
        started: list[int] = []

        def timer(device, steps):
            t = real(device, steps)
            start, me = t.start, len(made)
            made.append(t)
            t.start = lambda: (started.append(me), start())[1]  # type: ignore[method-assign]
            return t

        monkeypatch.setattr(reference, "StepTimer", timer)
        plan = resolve(CaptureConfig(model="tiny=2x1x64", tp=1, phases=["decode"], decode_sizes=[1], device="cpu",
                                     reference_steps=8, seed=seed), cpu)
        out = reference.run_reference_pass(plan, create_writer("mha", "index_put"), cpu)
        assert [(s.mode, len(s.samples_ns)) for s in out] == [("writes", 8), ("control", 8), ("control_numpy", 8)]
        return [tuple(started[i:i + 3]) for i in range(0, len(started), 3)]

    first = orders(0)
    assert len(first) == 8 and all(sorted(r) == [0, 1, 2] for r in first)
    assert len(set(first)) > 1  # not one fixed order
    assert orders(0) == first  # the same for a seed


def test_a_cpu_reference_pass_left_to_its_defaults_goes_on_within_its_budget(monkeypatch):
    # on a CPU with --reference-steps left out, a point's pass times its --steps count, then goes on while its
    # timed steps took under the budget, up to CPU_REFERENCE_STEPS_UP_TO: every mode the same count. Given
    # --reference-steps N, exactly N; on CUDA, exactly the default
    import torch

    from kvprof.capture import reference
    from kvprof.capture.config import DEFAULT_REFERENCE_STEPS, CaptureConfig
    from kvprof.capture.defaults import CPU_REFERENCE_STEPS_UP_TO
    from kvprof.capture.plan import resolve
    from kvprof.kvcache.layouts.registry import create_writer

    cpu = torch.device("cpu")
    config = CaptureConfig(model="tiny=2x1x64", tp=1, phases=["decode"], decode_sizes=[1], device="cpu", steps=6)
    plan = resolve(config, cpu)
    assert (plan.reference_steps, plan.reference_steps_up_to) == (6, CPU_REFERENCE_STEPS_UP_TO)
    assert plan.device_defaults["reference_steps_up_to"] == CPU_REFERENCE_STEPS_UP_TO
    exact = resolve(CaptureConfig(**{**config.__dict__, "reference_steps": 12}), cpu)
    assert (exact.reference_steps, exact.reference_steps_up_to) == (12, 12)
    assert "reference_steps_up_to" not in exact.device_defaults
    on_gpu = CaptureConfig(**{**config.__dict__, "device": "cuda"}).validate().resolved_for("cuda")
    assert (on_gpu.reference_steps, on_gpu.reference_steps_up_to) == (DEFAULT_REFERENCE_STEPS, None)

    def counts(budget_s: float, p=plan) -> set[int]:
        monkeypatch.setattr(reference, "CPU_REFERENCE_BUDGET_S", budget_s)
        out = reference.run_reference_pass(p, create_writer("mha", "index_put"), cpu)
        assert [s.mode for s in out] == ["writes", "control", "control_numpy"]
        return {len(s.samples_ns) for s in out}

    assert counts(0.0) == {6}  # no time left: the steps asked for
    assert counts(1e9) == {CPU_REFERENCE_STEPS_UP_TO}  # time to spare: all of them
    assert counts(1e9, exact) == {12}  # given: exactly that many


def test_the_gate_reads_a_series_within_the_manifests_range_and_refuses_one_outside():
    # a CPU capture's manifest records reference_steps 10 and reference_steps_up_to 100: series of 10 to 100
    # steps are what it ran, 9 or 101 were edited
    from kvprof.analysis.gate import GateRun, check_timings
    from kvprof.core.errors import TraceError
    from kvprof.core.run import Manifest

    manifest = Manifest(run_id="r", config={"resolved": {"device_defaults": {
        "reference_steps": 10, "reference_steps_up_to": 100}}})

    def run(n: int) -> GateRun:
        recs = [StepSamples(variant="index_put", pass_="reference", phase="decode", size=1, mode=mode, graph=False,
                            writes_per_step=2, clock="wall", samples_ns=tuple([1000.0] * n))
                for mode in ("writes", "control")]
        return GateRun(groups=pd.DataFrame(), timings=StepTimings(records=recs), manifest=manifest)

    for n in (10, 55, 100):
        check_timings(run(n), "NEW")
    for n in (9, 101):
        with pytest.raises(TraceError, match=f"has series of {n} steps where the manifest says 10 to 100"):
            check_timings(run(n), "NEW")
