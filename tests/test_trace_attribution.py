"""Attribution on real H200 traces and synthetic ones with known answers (hypothesis)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvprof.analysis.writes import per_write_table
from kvprof.trace.attribution import attribute
from kvprof.trace.intervals import busy_and_overlap, enclosing, gaps, union_length
from kvprof.trace.kineto import read_kineto
from kvprof.trace.model import Trace
from kvprof.trace.nsys_sqlite import read_nsys_sqlite
from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build, dumps

REAL = Path(__file__).parent / "fixtures" / "real"


def _load_doc(tmp_path: Path, doc: dict) -> Trace:
    p = tmp_path / "t.json"
    p.write_bytes(dumps(doc))
    return attribute(read_kineto(p))


@pytest.mark.parametrize("variant,per_write", [("index_put", 2), ("two_stream", 2), ("triton_fused", 1)])
def test_real_kineto_eager_by_correlation_and_replays_by_order(variant, per_write):
    t = attribute(read_kineto(REAL / f"{variant}.pt.trace.json.gz"))
    w = t.writes[~t.writes["during_capture"]]
    assert (w["attribution"] == "correlation").sum() == 8  # 2 prefill steps x 4 layers
    assert (w["attribution"] == "graph_order").sum() == 12  # 3 replays x 4 layers
    assert t.warnings == []
    table = per_write_table(t)
    measured = table[~table["during_capture"]]
    assert (measured["gpu_ops"] == per_write).all()
    assert t.attribution["gpu_activities_in_steps_unattributed"] == 0


def test_real_nsys_replays_by_graph_node_match_kineto_order():
    t = attribute(read_nsys_sqlite(REAL / "nsys_run.sqlite"))
    w = per_write_table(t)
    g = w[w["attribution"] == "graph_node"]
    assert len(g) == 36 and set(g["layer"]) == {0, 1, 2, 3}
    assert (g.groupby("variant")["gpu_ops"].first().to_dict()
            == {"index_put": 2, "triton_fused": 1, "two_stream": 2})
    # the capture-time ranges are templates, not measurements
    assert w["during_capture"].sum() == 12 and (w.loc[w["during_capture"], "gpu_ops"] == 0).all()
    # two-stream replays: K and V overlap on two streams
    ts = g[g["variant"] == "two_stream"]
    assert (ts["streams"] == 2).all() and (ts.loc[ts["layer"] > 0, "overlap_ns"] > 0).all()
    # on the H200 the first write of each replay waits for the second stream: no overlap there
    assert (ts.loc[ts["layer"] == 0, "overlap_ns"] == 0).all()


def test_replay_count_mismatch_is_left_unattributed_with_a_warning(tmp_path):
    spec = TraceSpec(kernels_per_write=3)  # metadata says 3, the replay has 2 per write
    t = _load_doc(tmp_path, build(spec)[0])
    assert (t.writes["attribution"] == "graph_order").sum() == 0
    assert any("expected 4 layers x 3 per write = 12; left unattributed" in w for w in t.warnings)
    assert t.attribution["gpu_activities_in_steps_unattributed"] == 16


def test_replay_without_metadata_warns(tmp_path):
    doc, _ = build(TraceSpec())
    doc.pop("kvprof")
    t = _load_doc(tmp_path, doc)
    assert len(t.writes) == 0
    assert any("no kvprof metadata" in w for w in t.warnings)


def test_foreign_trace_has_no_writes_and_no_warning(tmp_path):
    doc, _ = build(TraceSpec(phases=[PhaseSpec("prefill", 16, 1)]))
    doc.pop("kvprof")
    for e in doc["traceEvents"]:
        if e.get("cat") in ("user_annotation", "gpu_user_annotation"):
            e["name"] = "my_range"
    t = _load_doc(tmp_path, doc)
    assert len(t.writes) == 0 and t.warnings == []


def test_enclosing_prefers_the_innermost():
    outer = pd.DataFrame({"pid": [1, 1], "tid": [1, 1], "start_ns": [0, 10], "end_ns": [100, 20]})
    inner = pd.DataFrame({"pid": [1, 1, 1, 2], "tid": [1, 1, 1, 1], "start_ns": [12, 30, 100, 12],
                          "end_ns": [13, 31, 101, 13]})
    assert enclosing(inner, outer).tolist() == [1, -1, -1, -1]  # 30: latest start (10) ends before; 100: half-open


intervals = st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 200), st.integers(0, 2)), min_size=1, max_size=12)


@given(intervals)
@settings(max_examples=200, deadline=None)
def test_busy_and_overlap_match_a_brute_force_timeline(items):
    s = np.array([a for a, _, _ in items])
    e = s + np.array([d for _, d, _ in items])
    lane = np.array([ln for _, _, ln in items])
    busy, overlap = busy_and_overlap(s, e, lane)
    grid = np.zeros((3, 1300), dtype=bool)
    for a, b, ln in zip(s, e, lane):
        grid[ln, a:b] = True
    lanes_busy = grid.sum(axis=0)
    assert busy == int((lanes_busy >= 1).sum())
    assert overlap == int((lanes_busy >= 2).sum())
    assert union_length(s, e) == busy
    n, idle = gaps(s, e)
    assert idle == (e.max() - s.min()) - busy


@st.composite
def write_specs(draw):
    n = draw(st.integers(1, 3))
    kernels = []
    for _ in range(n):
        kernels.append(KernelSpec(stream=draw(st.sampled_from([7, 21])), offset_ns=draw(st.integers(0, 5000)),
                                  dur_ns=draw(st.integers(500, 6000))))
    return WriteSpec(kernels)


def _serialized(ws: WriteSpec) -> bool:
    """Kernels on one stream must not overlap (a stream runs one at a time)."""
    for s in {k.stream for k in ws.kernels}:
        iv = sorted((k.offset_ns, k.offset_ns + k.dur_ns) for k in ws.kernels if k.stream == s)
        if any(b[0] < a[1] for a, b in zip(iv, iv[1:])):
            return False
    return True


@pytest.mark.parametrize("graph", [False, True])
def test_synthetic_trace_without_layers_or_kernels_is_refused(graph):
    # an eager step with no writes has no GPU start (it used to fail with a TypeError)
    with pytest.raises(ValueError, match="at least one layer"):
        build(TraceSpec(layers=[], phases=[PhaseSpec("decode", 8, 1, graph=graph)]))
    with pytest.raises(ValueError, match="one kernel per write"):
        build(TraceSpec(write=WriteSpec([]), phases=[PhaseSpec("decode", 8, 1, graph=graph)]))


@given(ws=write_specs(), layers=st.integers(1, 5), graph=st.booleans(), steps=st.integers(1, 3),
       gap=st.integers(200, 3000))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_traces_give_the_known_answers(tmp_path, ws, layers, graph, steps, gap):
    if not _serialized(ws):
        return
    spec = TraceSpec(layers=list(range(layers)), write=ws, write_gap_ns=gap,
                     phases=[PhaseSpec("decode" if graph else "prefill", 8, steps, graph=graph)])
    doc, expected = build(spec)
    t = _load_doc(tmp_path, doc)
    w = per_write_table(t).sort_values(["step", "layer"]).reset_index(drop=True)
    exp = pd.DataFrame(expected["writes"]).sort_values(["step", "layer"]).reset_index(drop=True)
    assert len(w) == len(exp) == layers * steps
    assert (w["attribution"] == exp["attribution"]).all()
    assert (w["gpu_ops"] == exp["gpu_ops"]).all()
    assert (w["streams"] == exp["streams"]).all()
    assert (w["gpu_span_ns"] == exp["gpu_span_ns"]).all()
    assert (w["gpu_busy_ns"] == exp["gpu_busy_ns"]).all()
    assert (w["tokens"] == exp["tokens"]).all()
    # overlap: brute force over the write's own kernels
    grid = np.zeros((2, 12000), dtype=bool)
    for k in ws.kernels:
        grid[0 if k.stream == 7 else 1, k.offset_ns:k.offset_ns + k.dur_ns] = True
    assert (w["overlap_ns"] == int((grid.sum(axis=0) >= 2).sum())).all()
    if not graph:
        assert (w["launch_delay_ns"] == exp["launch_delay_ns"]).all()
        assert (w["host_dur_ns"] == exp["host_dur_ns"]).all()


def test_writes_without_gpu_work_are_attributed_by_no_method_as_the_trace_says(tmp_path):
    """A CPU trace: analyze's header said 'attribution none' and its table 'correlation'."""
    doc, _ = build(TraceSpec(phases=[PhaseSpec("prefill", 16, 2)]))
    gpu_free = {**doc, "traceEvents": [e for e in doc["traceEvents"]
                                       if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset")]}
    t = _load_doc(tmp_path, gpu_free)
    assert len(t.writes) == 8 and t.attribution["method"] == "none"
    assert (t.writes["attribution"] == "none").all()
    t = _load_doc(tmp_path, doc)  # the same writes with their kernels
    assert t.attribution["method"] == "correlation" and (t.writes["attribution"] == "correlation").all()
