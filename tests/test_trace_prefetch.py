"""`kvprof analyze FILE` reads a Kineto trace in a background thread while it imports pandas
(kvprof.trace.kineto_io.prefetch): the bytes, the errors and the limits are those of a plain read."""

from __future__ import annotations

import gzip
import os
import sqlite3
from pathlib import Path

import orjson
import pytest

from dashboard_support import synth_spec
from kvprof.core.errors import TraceError
from kvprof.trace import kineto_io
from kvprof.trace.synthetic import build, dumps


@pytest.fixture()
def trace(tmp_path: Path) -> Path:
    p = tmp_path / "t.pt.trace.json.gz"
    p.write_bytes(gzip.compress(dumps(build(synth_spec(900, 700)))))
    return p


def test_a_prefetched_read_is_the_plain_read(trace: Path) -> None:
    assert kineto_io.prefetch(trace)
    assert len(kineto_io._PREFETCHED) == 1
    got = kineto_io.read_bytes(trace)
    assert not kineto_io._PREFETCHED  # taken, not read twice
    assert bytes(got) == gzip.decompress(trace.read_bytes())


def test_the_prefetch_error_is_raised_by_the_read(tmp_path: Path, trace: Path) -> None:
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(trace.read_bytes()[:-40])
    assert kineto_io.prefetch(cut)
    with pytest.raises(TraceError, match="truncated or corrupt gzip"):
        kineto_io.read_bytes(cut)
    assert not kineto_io._PREFETCHED


def test_other_limits_or_a_changed_file_read_anew(trace: Path) -> None:
    assert kineto_io.prefetch(trace, max_events=10)  # too few events: that read fails ...
    data = kineto_io.read_bytes(trace)  # ... but a read with the default limit is not that read
    assert bytes(data) == gzip.decompress(trace.read_bytes())
    with pytest.raises(TraceError, match="more than 10 events"):
        kineto_io.read_bytes(trace, max_events=10)
    assert kineto_io.prefetch(trace)
    doc = {"traceEvents": [{"ph": "X", "name": "other", "ts": 1, "dur": 2, "pid": 1, "tid": 1}]}
    trace.write_bytes(gzip.compress(orjson.dumps(doc)))
    os.utime(trace, ns=(1, 1))  # another size and mtime: the read ahead is not this file
    assert orjson.loads(bytes(kineto_io.read_bytes(trace)))["traceEvents"] == doc["traceEvents"]
    kineto_io._PREFETCHED.clear()


def test_only_kineto_files_are_read_ahead(tmp_path: Path) -> None:
    db = tmp_path / "x.sqlite"
    sqlite3.connect(db).close()
    with sqlite3.connect(db) as c:
        c.execute("create table t (a)")
    assert not kineto_io.prefetch(db)
    assert not kineto_io.prefetch(tmp_path)  # a folder
    assert not kineto_io.prefetch(tmp_path / "missing.json")
    assert not kineto_io._PREFETCHED
