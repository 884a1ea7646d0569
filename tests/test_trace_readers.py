"""Readers: real H200 traces (Kineto + nsys), synthetic traces, and every kind of bad input."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import numpy as np
import orjson
import pytest

from kvprof.core.errors import TraceError, UsageError
from kvprof.core.schema import SCHEMA
from kvprof.trace.kineto import clock_of, read_kineto
from kvprof.trace.load import load, sniff
from kvprof.trace.nsys_sqlite import read_nsys_sqlite, split_global_id
from kvprof.trace.synthetic import TraceSpec, build, dumps
from kvprof.trace.table import to_frame

REAL = Path(__file__).parent / "fixtures" / "real"


def test_real_kineto_two_stream_reads_every_gpu_event():
    t = read_kineto(REAL / "two_stream.pt.trace.json.gz")
    assert t.events.schema.equals(SCHEMA)
    df = to_frame(t.events)
    kernels = df[df["kind"] == "kernel"]
    assert len(kernels) == 50
    assert {7, 21, 143} <= set(kernels["stream"])  # eager alt stream 21; replay branches on 143
    assert (kernels["device"] == 0).all() and (kernels["pid"] == 450).all() and (kernels["tid"] == -1).all()
    assert (kernels["correlation"] >= 0).all()
    assert "64,1,1" in set(kernels["grid"].astype(str)) and "128,1,1" in set(kernels["block"].astype(str))
    assert (df["kind"] == "sync").sum() == 39
    assert t.kvprof.variant == "two_stream" and t.kvprof.layers == [0, 1, 2, 3]
    assert t.devices[0]["name"] == "NVIDIA H200" and t.devices[0]["sms"] == 132


def test_real_kineto_clock_is_relative_to_base_time():
    t = read_kineto(REAL / "triton_fused.pt.trace.json.gz")
    assert t.clock["form"] == "relative_to_base"
    start = to_frame(t.events)["start_ns"].min() + t.clock["epoch_offset_ns"]
    assert 1.79e18 < start < 1.80e18  # 2026-12-02, the day it was captured


def test_clock_forms():
    assert clock_of(1.7e15, None)["form"] == "unix"  # older traces: ts in unix microseconds
    assert clock_of(5.3e12, 1_790_857_026_000_000_000)["form"] == "relative_to_base"
    assert clock_of(1000.0, None)["form"] == "unknown"


def test_driver_launches_are_driver_kind():
    df = to_frame(read_kineto(REAL / "triton_fused.pt.trace.json.gz").events)
    drv = df[df["kind"] == "driver"]
    assert set(drv["name"].astype(str)) == {"cuLaunchKernelEx"}


def test_real_nsys_export():
    t = read_nsys_sqlite(REAL / "nsys_run.sqlite")
    df = to_frame(t.events)
    assert (df["kind"] == "kernel").sum() == 320
    rng = df[(df["kind"] == "cpu_annotation") & (df["domain"] == "kvprof")]
    assert set(rng["category"].astype(str)) == {"index_put", "two_stream", "triton_fused"}
    writes = rng[rng["name"].astype(str).str.startswith("set_kv_buffer")]
    assert set(writes["payload"]) == {256, 8}
    # runtime names lose their _v<N> suffix
    assert "cudaGraphLaunch" in set(df["name"].astype(str))
    assert t.devices[0]["peak_bandwidth_gbs"] == pytest.approx(4814.304)
    assert t.graph_nodes is not None and (t.graph_nodes["original"] >= 0).any()
    assert t.clock["epoch_offset_ns"] == 1796212344706519784


def test_split_global_id():
    pid, tid = split_global_id(np.array([281483767972364]))
    assert (int(pid[0]), int(tid[0])) == (524, 524)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_plain_and_gzip_give_the_same_table(tmp_path):
    doc, _ = build(TraceSpec())
    a = read_kineto(_write(tmp_path, "a.json", dumps(doc)))
    b = read_kineto(_write(tmp_path, "b.json.gz", gzip.compress(dumps(doc))))
    assert a.events.drop_columns(["trace"]).to_pylist() == b.events.drop_columns(["trace"]).to_pylist()


@pytest.mark.parametrize("name,data,match", [
    ("trunc.json.gz", (lambda z: z[: len(z) // 2])(gzip.compress(json.dumps(build(TraceSpec())[0]).encode())),
     "truncated or corrupt gzip"),
    ("corrupt.json.gz",
     (lambda z: z[:40] + bytes(64) + z[104:])(gzip.compress(json.dumps(build(TraceSpec())[0]).encode())),
     "truncated or corrupt gzip"),
    ("bad.json", b'{"traceEvents": [{"ph": "X",', "not valid JSON"),
    ("notatrace.json", b'{"hello": 1}', "not a Chrome/Kineto trace"),
    ("empty.json", b'{"traceEvents": []}', "empty trace"),
    ("zero.json", b"", "empty file"),
    ("meta_only.json", json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1}]}).encode(),
     "no complete events"),
    ("text.txt", b"hello world", "not a trace kvprof can read"),
])
def test_bad_inputs_are_one_line_trace_errors(tmp_path, name, data, match):
    p = _write(tmp_path, name, data)
    with pytest.raises(TraceError, match=match) as exc:
        load(p)
    assert "\n" not in str(exc.value)
    assert exc.value.exit_code == 3


def test_missing_path_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        load(tmp_path / "nope.json")


def test_sqlite_that_is_not_nsys(tmp_path):
    p = tmp_path / "x.sqlite"
    with sqlite3.connect(p) as db:
        db.execute("CREATE TABLE t (a INTEGER)")
    with pytest.raises(TraceError, match="not an Nsight Systems export"):
        load(p)


def test_nsys_export_without_kernel_table(tmp_path):
    p = tmp_path / "cpu.sqlite"
    with sqlite3.connect(p) as db:
        db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        db.execute("CREATE TABLE NVTX_EVENTS (start INTEGER, end INTEGER, eventType INTEGER, text TEXT)")
    with pytest.raises(TraceError, match="without CUPTI_ACTIVITY_KIND_KERNEL"):
        load(p)


def test_too_many_events_is_refused_before_parsing(tmp_path):
    # 10 million events: gzip members of 100k events each, concatenated (cheap to make)
    one = b",".join([b'{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 1.0}'] * 100_000)
    member = gzip.compress(b'{"traceEvents": [' + one, compresslevel=1)
    body = gzip.compress(b"," + one, compresslevel=1)
    p = tmp_path / "huge.json.gz"
    with open(p, "wb") as f:
        f.write(member)
        for _ in range(99):
            f.write(body)
        f.write(gzip.compress(b"]}"))
    with pytest.raises(TraceError, match="more than 4,000,000 events"):
        load(p)
    with pytest.raises(TraceError, match="more than 1,000 events"):
        load(p, max_events=1000)


def test_sniff_ignores_the_suffix(tmp_path):
    doc, _ = build(TraceSpec())
    assert sniff(_write(tmp_path, "renamed.sqlite", gzip.compress(dumps(doc)))) == "kineto"
    assert sniff(REAL / "nsys_run.sqlite") == "nsys_sqlite"


def test_nsys_rep_without_nsys_is_a_tool_error(tmp_path, monkeypatch):
    from kvprof.core.errors import ToolError

    p = _write(tmp_path, "run.nsys-rep", b"\x00\x01binary")
    import kvprof.tools.nsys as nsysmod

    monkeypatch.setattr(nsysmod, "find_nsys", lambda *a, **k: None)
    with pytest.raises(ToolError, match="nsys not found"):
        load(p)


def test_a_truncated_sqlite_beside_a_report_is_never_reused(tmp_path, monkeypatch):
    """The export beside a .nsys-rep is used only when whole; a cut-short copy goes to nsys again."""
    import shutil

    import kvprof.tools.nsys as nsysmod
    from kvprof.core.errors import ToolError

    rep = _write(tmp_path, "run.nsys-rep", b"\x00\x01binary")
    whole = tmp_path / "run.sqlite"
    shutil.copy(REAL / "nsys_run.sqlite", whole)
    assert nsysmod.complete_sqlite(whole)
    with nsysmod.exported(rep) as db:
        assert db == whole
    whole.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    assert not nsysmod.complete_sqlite(whole)
    monkeypatch.setattr(nsysmod, "find_nsys", lambda *a, **k: None)
    with pytest.raises(ToolError), nsysmod.exported(rep):
        pass


def test_an_export_into_a_temporary_folder_is_removed_after_the_read(tmp_path, monkeypatch):
    import shutil

    import kvprof.tools.nsys as nsysmod

    rep = _write(tmp_path, "run.nsys-rep", b"\x00\x01binary")
    made: list[Path] = []

    def fake_export(nsys, rep_path, out_path, timeout=600):
        shutil.copy(REAL / "nsys_run.sqlite", out_path)
        made.append(Path(out_path))
        return Path(out_path)

    monkeypatch.setattr(nsysmod, "find_nsys", lambda *a, **k: Path("/usr/bin/true"))
    monkeypatch.setattr(nsysmod, "export_sqlite", fake_export)
    t = load(rep)
    assert t.traces[0].path == str(rep) and t.traces[0].events.num_rows > 0
    assert made and not made[0].exists() and not made[0].parent.exists()


def test_nsys_export_without_nvtx_says_so(tmp_path):
    import shutil
    import sqlite3

    db = tmp_path / "no_nvtx.sqlite"
    shutil.copy(REAL / "nsys_run.sqlite", db)
    con = sqlite3.connect(db)
    con.execute("DROP TABLE NVTX_EVENTS")
    con.commit()
    con.close()
    trace = read_nsys_sqlite(db)
    assert any("no NVTX_EVENTS table" in w for w in trace.warnings)
    assert trace.stats["kernels"] > 0


def test_batched_parse_gives_the_same_table(monkeypatch):
    """Kineto's layout parsed in batches (low peak memory) equals the one-shot parse (both
    through orjson: the typed decoder, tested in test_kineto_decode.py, is set aside)."""
    import kvprof.trace.kineto as kineto

    sample = (Path(__file__).resolve().parent.parent / "traces" / "samples" / "h200-llama70b-tp8"
              / "two_stream.pt.trace.json.gz")
    monkeypatch.setattr(kineto, "decode_events", lambda *a: None)
    whole = kineto.read_kineto(sample)
    monkeypatch.setattr(kineto, "SPLIT_MIN_BYTES", 0)
    import kvprof.trace.kineto_io as kineto_io

    monkeypatch.setattr(kineto_io, "_BATCH", 997)  # many batches, boundaries anywhere
    calls = []
    real = kineto.event_batches
    monkeypatch.setattr(kineto, "event_batches", lambda *a: calls.append(1) or real(*a))
    batched = kineto.read_kineto(sample)
    assert calls, "the batched path was not taken"
    assert batched.events.equals(whole.events)
    assert batched.kvprof == whole.kvprof and batched.clock == whole.clock and batched.devices == whole.devices


def test_batched_parse_falls_back_on_other_layouts(monkeypatch, tmp_path):
    import kvprof.trace.kineto as kineto

    monkeypatch.setattr(kineto, "decode_events", lambda *a: None)
    monkeypatch.setattr(kineto, "SPLIT_MIN_BYTES", 0)
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0}]}
    f = tmp_path / "compact.json"
    f.write_bytes(orjson.dumps(doc))  # no Kineto indentation: one-shot parse
    assert kineto.read_kineto(f).events.num_rows == 1


def test_batched_parse_handles_kinetos_blank_first_line(monkeypatch, tmp_path):
    """CPU-only Kineto traces open the array with an empty indented line."""
    import kvprof.trace.kineto as kineto

    monkeypatch.setattr(kineto, "SPLIT_MIN_BYTES", 0)
    ev = '  {\n    "ph": "X", "cat": "cpu_op", "name": "aten::x", "pid": 1, "tid": 1, "ts": %d.5, "dur": 1.0\n  }'
    text = ('{\n  "schemaVersion": 1,\n  "traceEvents": [\n    \n' + ",\n".join(ev % i for i in range(5))
            + '\n  ],"traceName": "t" }')
    f = tmp_path / "cpu.json"
    f.write_text(text)
    assert kineto.decode_events(f.read_bytes(), 10) is not None  # the typed decoder, in chunks
    assert kineto.read_kineto(f).events.num_rows == 5
    monkeypatch.setattr(kineto, "decode_events", lambda *a: None)  # orjson, in batches
    assert kineto.split_events(f.read_bytes(), "cpu.json") is not None
    assert kineto.read_kineto(f).events.num_rows == 5


# ---------------------------------------------------------------- memory bounds


def _gzip_members(path: Path, head: bytes, unit: bytes, member_mb: int, members: int, tail: bytes) -> Path:
    """A small .json.gz that inflates to ``member_mb`` x ``members`` MiB (one member compressed once)."""
    body = gzip.compress(unit * ((member_mb << 20) // len(unit)), compresslevel=9)
    with open(path, "wb") as f:
        f.write(gzip.compress(head))
        for _ in range(members):
            f.write(body)
        f.write(gzip.compress(tail))
    return path


def test_a_gzip_bomb_stops_at_the_decompressed_size_limit(tmp_path, monkeypatch):
    """A 250 kB .json.gz inflating to 256 MiB is refused once past the limit, holding no more than
    the limit and one chunk (it used to be inflated whole, then copied: 4 MB files reached GBs)."""
    import tracemalloc

    p = _gzip_members(tmp_path / "bomb.json.gz", b'{"traceEvents": [', b" ", 16, 16, b"]}")
    assert p.stat().st_size < 400_000
    monkeypatch.setenv("KVPROF_MAX_TRACE_MB", "8")
    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match=r"bomb.json.gz: more than 8 MiB once decompressed.*KVPROF_MAX_TRACE_MB"):
            load(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20, peak


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf"])
def test_a_bad_size_limit_is_a_usage_error(tmp_path, monkeypatch, value):
    p = _write(tmp_path, "t.json", dumps(build(TraceSpec())[0]))
    monkeypatch.setenv("KVPROF_MAX_TRACE_MB", value)
    with pytest.raises(UsageError, match="KVPROF_MAX_TRACE_MB"):
        load(p)


def test_the_size_limit_can_be_raised(tmp_path, monkeypatch):
    p = _write(tmp_path, "t.json", dumps(build(TraceSpec())[0]))
    monkeypatch.setenv("KVPROF_MAX_TRACE_MB", "0.001")
    with pytest.raises(TraceError, match="once decompressed"):
        load(p)
    monkeypatch.setenv("KVPROF_MAX_TRACE_MB", "64")
    assert load(p).traces[0].events.num_rows > 0


@pytest.mark.parametrize("unit", [b"{}", b"[]", b'"a"', b"0.5", b'{"a": 1}'])
def test_values_without_events_are_bounded_before_parsing(tmp_path, unit):
    """Objects with no "ph" were not counted as events, and parsed whole: 16x-30x their bytes."""
    p = _write(tmp_path, "t.json", b'{"traceEvents": [' + b",".join([unit] * 5000) + b"]}")
    with pytest.raises(TraceError, match=r"t.json: up to [\d,]+ JSON values to parse at once, more than 4,000 "):
        load(p, max_events=1000)


def test_event_lines_beyond_max_events_are_refused_in_the_batched_parse(tmp_path, monkeypatch):
    import kvprof.trace.kineto as kineto

    monkeypatch.setattr(kineto, "SPLIT_MIN_BYTES", 0)
    p = _write(tmp_path, "t.json", b'{"traceEvents": [\n  ' + b",\n  ".join([b"{}"] * 2000) + b"\n]}")
    with pytest.raises(TraceError, match="more than 1,000 events"):
        load(p, max_events=1000)


def test_a_batch_too_large_to_parse_at_once_is_refused(tmp_path, monkeypatch):
    import kvprof.trace.kineto as kineto

    monkeypatch.setattr(kineto, "SPLIT_MIN_BYTES", 0)
    doc, _ = build(TraceSpec())
    doc["traceEvents"][0]["args"] = {"pad": [0] * 100_000}  # one event line holding 100k values
    p = _write(tmp_path, "t.json", dumps(doc))
    with pytest.raises(TraceError, match="JSON values to parse at once"):
        load(p, max_events=1000)


@pytest.mark.parametrize("where", ["document", "name", "grid", "args", "kvprof"])
def test_deep_nesting_is_one_line(tmp_path, where):
    """orjson stops at 1024 levels (one line); under it, kvprof never recurses through a value."""
    from kvprof.analysis.summary import analyze

    deep = "<deep>"  # replaced by 1000 nested lists once serialized (orjson writes 255 levels at most)
    doc, _ = build(TraceSpec())
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    if where == "document":
        p = _write(tmp_path, "t.json", b'{"traceEvents": [' + b"[" * 5000 + b"]" * 5000 + b"]}")
        with pytest.raises(TraceError, match="not valid JSON") as exc:
            load(p)
        assert "\n" not in str(exc.value)
        return
    if where == "name":
        kernel["name"] = deep
    elif where == "grid":
        kernel["args"]["grid"] = [deep, 1, 1]
    elif where == "args":
        kernel["args"] = {"correlation": deep, "device": deep, "stream": deep}
    else:
        doc["kvprof"]["device"] = {"name": deep}
        doc["kvprof"]["layers"] = deep
    p = _write(tmp_path, "t.json", orjson.dumps(doc).replace(b'"<deep>"', b"[" * 1000 + b"]" * 1000))
    assert analyze(load(p)).summary.traces[0]["events"] > 0


def test_nsys_rows_beyond_max_events_are_refused_before_reading(tmp_path):
    p = tmp_path / "e.sqlite"
    with sqlite3.connect(p) as db:
        db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, shortName INTEGER)")
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 1)", [(i, i + 1) for i in range(1500)])
    with pytest.raises(TraceError, match="e.sqlite: 1,500 rows to read, more than 1,000 events"):
        load(p, max_events=1000)
    assert load(p, max_events=2000).traces[0].events.num_rows == 1500
