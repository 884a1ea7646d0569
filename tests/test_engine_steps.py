"""An engine's own trace: each KV-write kernel tied to a forward step and a layer, by the method the
trace allows (step annotations, CUDA graph replays, the writes' periodic gaps), named in the output;
where no step is found, one line says why."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from kvprof.analysis.engine_steps import ENGINE_STEP_RANGES, GRAPH_STEPS, PERIODIC_STEPS, find_steps
from kvprof.analysis.write_kernels import BUILTIN_PATTERNS, classify, trace_write_kernels, write_kernel_summary
from kvprof.trace.load import load
from kvprof.trace.synthetic import EngineReplaySpec, Vintage, build_engine, dumps, vintage
from kvprof.trace.table import to_frame

SGLANG, VLLM = ENGINE_STEP_RANGES[0][0], ENGINE_STEP_RANGES[1][0]
MODES = {  # (step annotations, eager launches) -> the method that must be named
    "graph": (None, False, GRAPH_STEPS),
    "sglang+graph": ("sglang", False, SGLANG),
    "vllm+eager": ("vllm", True, VLLM),
    "eager": (None, True, PERIODIC_STEPS),
}


def _load(tmp: Path, spec: EngineReplaySpec, v: Vintage | None = None) -> tuple[pd.DataFrame, dict, list]:
    doc, expected = build_engine(spec)
    p = tmp / "engine.json"
    p.write_bytes(dumps(vintage(doc, v) if v is not None else doc))
    ev = to_frame(load(p).traces[0].events)
    return ev, expected, list(BUILTIN_PATTERNS)


def _tied(ev: pd.DataFrame) -> tuple[pd.DataFrame, object]:
    work = ev[ev["kind"].isin(["kernel", "memcpy", "memset"])]
    kernels = work[work["kind"] == "kernel"]
    fam = classify(kernels["name"], list(BUILTIN_PATTERNS))
    hit = kernels[fam.notna()].assign(family=fam[fam.notna()])
    found = find_steps(ev, work, hit, {p.name: p.kernels_per_write for p in BUILTIN_PATTERNS}, [])
    return hit, found


@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_write_kernel_tied_to_its_step_and_layer(tmp_path: Path, mode: str) -> None:
    ranges, eager, method = MODES[mode]
    spec = EngineReplaySpec(layers=list(range(6)), replays=[0, 1, 0, 1], replay_ranges=False, step_ranges=ranges,
                            eager=eager)
    ev, expected, _ = _load(tmp_path, spec)
    hit, found = _tied(ev)
    assert found.method == method and found.reason is None
    assert len(hit) == len(expected["writes"]) == 24
    order = hit.sort_values("start_ns")
    got = [(int(found.step_of[i]), int(found.layer_of[i])) for i in order.index]
    assert got == [(w["replay"], w["layer"]) for w in expected["writes"]]
    assert found.unassigned == {}
    if not eager:  # the replayed kernels share their cudaGraphLaunch's correlation
        assert found.graph == {"launches": 4, "replayed_kernels": 72, "replayed_write_kernels": 24,
                               "replays_with_writes": 4}


def test_a_step_with_a_missing_write_is_listed_with_its_reason(tmp_path: Path) -> None:
    spec = EngineReplaySpec(layers=list(range(4)), replays=[0, 0, 0], replay_ranges=False, drop={1: [2]})
    ev, _, _ = _load(tmp_path, spec)
    hit, found = _tied(ev)
    assert int((found.layer_of >= 0).sum()) == 8  # replays 0 and 2
    (why, n), = found.unassigned.items()
    assert n == 3 and "another number of write kernels than most steps (4)" in why


def test_no_steps_says_why_in_one_line(tmp_path: Path) -> None:
    spec = EngineReplaySpec(layers=list(range(3)), replays=[0], replay_ranges=False, eager=True)
    ev, _, patterns = _load(tmp_path, spec)
    doc = trace_write_kernels(ev, patterns)
    assert doc["write_kernels"] == 3 and doc["steps_count"] == 0
    assert doc["no_steps_reason"].startswith("no forward steps found:") and "\n" not in doc["no_steps_reason"]
    assert doc["unassigned"] == [{"reason": doc["no_steps_reason"], "kernels": 3}]


def test_summary_carries_the_step_layer_table(tmp_path: Path) -> None:
    spec = EngineReplaySpec(layers=list(range(3)), replays=[0, 1], replay_ranges=False, step_ranges="sglang")
    doc, _ = build_engine(spec)
    p = tmp_path / "e.json"
    p.write_bytes(dumps(doc))
    t = write_kernel_summary(load(p))["traces"][0]
    assert t["step_method"] == SGLANG and t["tied_step_and_layer"] == 6 and t["steps_count"] == 2
    assert [s["step"] for s in t["steps"]] == ["step[DECODE bs=8]", "step[DECODE bs=16]"]
    assert all(s["writes"] == 3 and s["layers"] == 3 and s["share"] > 0 for s in t["steps"])
    assert t["step_layer"]["layers"] == [0, 1, 2]
    assert [r["ns"] for r in t["step_layer"]["rows"]] == [[900, 900, 900]] * 2


@settings(max_examples=10, deadline=None, database=None, derandomize=True)
@given(mode=st.sampled_from(sorted(MODES)), layers=st.integers(2, 5), replays=st.integers(2, 4),
       v=st.builds(Vintage, categories=st.booleans(), flow_cat=st.sampled_from(["ac2g", "async_gpu"]),
                   stream_tids=st.booleans()))
def test_any_vintage_ties_the_same(tmp_path_factory: pytest.TempPathFactory, mode: str, layers: int, replays: int,
                                   v: Vintage) -> None:
    ranges, eager, method = MODES[mode]
    spec = EngineReplaySpec(layers=list(range(layers)), replays=[0] * replays, replay_ranges=False,
                            step_ranges=ranges, eager=eager)
    ev, expected, _ = _load(tmp_path_factory.mktemp("v"), spec, v)
    hit, found = _tied(ev)
    assert found.method == method
    order = hit.sort_values("start_ns")
    assert [(int(found.step_of[i]), int(found.layer_of[i])) for i in order.index] == [
        (w["replay"], w["layer"]) for w in expected["writes"]]


@settings(max_examples=40, deadline=None, database=None, derandomize=True)
@given(iv=st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300), st.integers(0, 1)), min_size=0, max_size=30),
       one_stream=st.booleans())
def test_window_busy_is_the_union(iv: list[tuple[int, int, int]], one_stream: bool) -> None:
    """The per-step busy time's one-stream shortcut agrees with busy_and_overlap's union."""
    import numpy as np

    from kvprof.analysis.write_kernels import StepWindows
    from kvprof.trace.intervals import busy_and_overlap

    iv = sorted(iv)
    s = np.asarray([a for a, _, _ in iv], dtype=np.int64)
    e = s + np.asarray([d for _, d, _ in iv], dtype=np.int64)
    ln = np.zeros(len(iv), dtype=np.int64) if one_stream else np.asarray([k for _, _, k in iv], dtype=np.int64)
    assert StepWindows.busy(s, e, ln) == (busy_and_overlap(s, e, ln)[0] if len(iv) else 0)


SAMPLES = Path(__file__).resolve().parents[1] / "traces" / "samples" / "h200-sglang"


@pytest.mark.parametrize(("trace", "method", "tied", "kernels", "outside"), [
    # SGLang's own profiler (torch), H200: 5 profiled decode steps of 8 layers replayed from CUDA graphs;
    # the 40 eager writes before them (warm-up, graph capture) lie outside every ProfilerStep
    ("torch-sglang/1796307500-TP-0.trace.json.gz", "ProfilerStep", 40, 80, 40),
    # nsys export of an SGLang server, H200: 6 graph replays of 8 layers, the eager writes outside them
    ("nsys-sglang/sglang-pool-TP-0.sqlite", "CUDA graph replays", 48, 144, 96),
])
def test_real_sglang_traces(trace: str, method: str, tied: int, kernels: int, outside: int) -> None:
    t = write_kernel_summary(load(SAMPLES / trace))["traces"][0]
    assert t["step_method"].startswith(method)
    assert (t["tied_step_and_layer"], t["write_kernels"]) == (tied, kernels)
    assert sum(u["kernels"] for u in t["unassigned"]) == outside
    assert all(s["layers"] == 8 for s in t["steps"])


def test_graph_replays_and_eager_forwards_in_one_trace(tmp_path: Path) -> None:
    """Decode replayed from graphs, other forwards launched kernel by kernel (vLLM's piecewise prefill):
    the replays are steps by their correlation, the eager writes by their periodic gaps; all tied."""
    spec = EngineReplaySpec(layers=list(range(5)), replays=[0] * 6, replay_ranges=False, eager_replays=[1, 3, 4])
    ev, expected, patterns = _load(tmp_path, spec)
    hit, found = _tied(ev)
    assert found.method.startswith(GRAPH_STEPS) and "periodic" in found.method
    assert found.unassigned == {} and int((found.layer_of >= 0).sum()) == 30
    order = hit.sort_values("start_ns")
    layers = [int(found.layer_of[i]) for i in order.index]
    assert layers == [w["layer"] for w in expected["writes"]]
    # each forward one step, whichever way it was launched
    steps = [int(found.step_of[i]) for i in order.index]
    assert len(set(steps)) == 6 and all(len(set(steps[k:k + 5])) == 1 for k in range(0, 30, 5))
    doc = trace_write_kernels(ev, patterns)
    assert all(0 < s["share"] < 1 for s in doc["steps"])  # each step's window holds the GEMMs and attention too


def _analyzed(tmp: Path, spec: EngineReplaySpec, write_kernels: bool = True) -> tuple[list[str], dict]:
    from kvprof import api

    doc, _ = build_engine(spec)
    p = tmp / "engine.json"
    p.write_bytes(dumps(doc))
    result = api.analyze(api.open_run(p), write_kernels=write_kernels)
    return result.summary.warnings, (result.summary.write_kernels or {"traces": [{}]})["traces"][0]


def test_replays_the_steps_tie_are_not_called_untied(tmp_path: Path) -> None:
    """Attribution's "N graph replays ... not tied to writes" (no kvprof range ties them) beside a
    steps table that ties every write kernel of those replays: the warning goes, the counts stay."""
    spec = EngineReplaySpec(layers=list(range(4)), replays=[0, 1, 0], replay_ranges=False, step_ranges="sglang")
    bare, _ = _analyzed(tmp_path, spec, write_kernels=False)
    assert [w for w in bare if "3 graph replays lie outside kvprof step ranges" in w]  # the trace layer's words
    warnings, t = _analyzed(tmp_path, spec)
    assert t["tied_step_and_layer"] == 12
    assert t["graph"]["outside_kvprof_steps"] == {"replays": 3, "tied": 3, "untied": 0, "untied_write_kernels": 0,
                                                  "without_writes": 0}
    assert not [w for w in warnings if "graph replays" in w]


def test_replays_the_steps_leave_untied_are_named_with_counts(tmp_path: Path) -> None:
    """One replay short of a write (its layer order unknown), one that replayed no write kernel at
    all: the line says which are untied and how many kernels, and the tied ones as tied."""
    spec = EngineReplaySpec(layers=list(range(4)), replays=[0, 0, 0, 0, 0], replay_ranges=False,
                            drop={1: [2], 3: [0, 1, 2, 3]})
    warnings, t = _analyzed(tmp_path, spec)
    assert t["graph"]["outside_kvprof_steps"] == {"replays": 5, "tied": 3, "untied": 1, "untied_write_kernels": 3,
                                                  "without_writes": 1}
    (line,) = [w for w in warnings if "graph replays" in w]
    assert "5 graph replays lie outside kvprof step ranges and no kvprof write range ties them" in line
    assert "1 of them replayed 3 KV-write kernels that no forward step and layer holds" in line
    assert "every write kernel of 3, and 1 replayed no KV-write kernel" in line
    assert "not tied to writes" not in line


def _step_rows_by_groupby(found, hit: pd.DataFrame, per: dict) -> list[tuple]:
    """The steps' writes, layers and replay as three pandas groupbys computed them (the reference)."""
    t = pd.DataFrame({"step": found.step_of.to_numpy(), "family": hit["family"].astype(str).to_numpy(),
                      "kpw": [per[f].kernels_per_write for f in hit["family"]],
                      "layer": [x if x >= 0 else float("nan") for x in found.layer_of],
                      "replay": found.replay_of.to_numpy()})
    t = t[t["step"] >= 0]
    fam = t.groupby(["step", "family"]).agg(n=("kpw", "size"), kpw=("kpw", "first"))
    writes = (fam["n"] // fam["kpw"]).groupby(level="step").sum()
    layers = t.groupby("step")["layer"].nunique()
    replays = t.groupby("step")["replay"].agg(lambda r: sorted({int(x) for x in r}))
    out = []
    for i, _ in enumerate(found.steps):
        if i not in writes.index:
            continue
        rs = [r for r in replays.get(i, []) if r >= 0]
        out.append((int(writes.get(i, 0)), int(layers.get(i, 0)),
                    None if not rs else rs[0] if len(rs) == 1 else f"{len(rs)} replays"))
    return out


@settings(max_examples=25, deadline=None, database=None, derandomize=True)
@given(rows=st.lists(st.tuples(st.integers(-1, 4), st.sampled_from(["a", "b"]), st.integers(-1, 3),
                               st.sampled_from([-1, 7, 9, 2**40])), max_size=40))
def test_step_rows_count_as_the_groupbys_did(rows: list[tuple[int, str, int, int]]) -> None:
    """Writes per step (each family's kernels // its kernels per write), distinct layers, the replay:
    from sorted (step, value) pairs, as the pandas groupbys they replace gave them."""
    from kvprof.analysis.engine_steps import Found
    from kvprof.analysis.write_kernels import WritePattern, _step_rows

    per = {"a": WritePattern("a", "a", 1, "test"), "b": WritePattern("b", "b", 2, "test")}
    hit = pd.DataFrame({"family": [r[1] for r in rows]}, dtype=object)
    found = Found(method="test", steps=[{"label": f"s{i}", "start_ns": None, "end_ns": None, "graph_launch": None}
                                        for i in range(5)],
                  step_of=pd.Series([r[0] for r in rows], dtype="int64"),
                  layer_of=pd.Series([r[2] for r in rows], dtype="int64"),
                  replay_of=pd.Series([r[3] for r in rows], dtype="int64"))
    got = [(r["writes"], r["layers"], r["graph_launch"]) for r in _step_rows(found, hit, per, lambda s, e: {})]
    assert got == _step_rows_by_groupby(found, hit, per)
