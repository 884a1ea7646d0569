"""The typed decoder (kvprof.trace.kineto_decode) reads every trace as the loop over orjson's dicts does.

Each test holds decode_events against kineto.events_from_document on the same bytes: the
columns (values and dtypes), the interned names and launch dimensions, the flows and the
counts must be equal, or the decoder must decline (None) so that the loop reads the trace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kvprof.trace.kineto as kineto
import kvprof.trace.kineto_decode as kineto_decode
from kvprof.trace.kineto_decode import decode_events
from kvprof.trace.kineto_io import parse_document, read_bytes

ROOT = Path(__file__).resolve().parent.parent
REAL = sorted((ROOT / "tests" / "fixtures" / "real").glob("*.pt.trace.json.gz")) + sorted(
    (ROOT / "traces" / "samples" / "h200-llama70b-tp8").glob("*.pt.trace.json.gz"))


def kineto_text(doc: dict[str, Any]) -> bytes:
    """torch.profiler's layout: each event on a line of its own, at one indentation."""
    events = ",\n".join("  " + json.dumps(e) for e in doc["traceEvents"])
    rest = "".join(f',\n  {json.dumps(k)}: {json.dumps(v)}' for k, v in doc.items() if k != "traceEvents")
    return ('{\n  "schemaVersion": 1,\n  "traceEvents": [\n' + events + "\n  ]" + rest + "\n}").encode()


def by_loop(data: bytes) -> tuple[dict[str, Any], dict[str, Any], int, dict[str, int], int]:
    doc = parse_document(data, "t.json")
    total = len(doc["traceEvents"])
    cols, n, stats = kineto.events_from_document(doc)
    return doc, cols, n, stats, total


def assert_same(decoded: tuple[Any, ...], loop: tuple[Any, ...]) -> None:
    ddoc, dcols, dn, dstats, dtotal = decoded
    ldoc, lcols, ln, lstats, ltotal = loop
    assert (dn, dtotal, dstats) == (ln, ltotal, lstats)
    for key in ("deviceProperties", "distributedInfo", "kvprof", "baseTimeNanoseconds"):
        assert ddoc.get(key) == ldoc.get(key), key
    assert dcols.keys() == lcols.keys()
    for key, want in lcols.items():
        got = dcols[key]
        if isinstance(want, np.ndarray):
            assert got.dtype == want.dtype, key
            np.testing.assert_array_equal(got, want, err_msg=key)
        else:
            assert got == want, key


@pytest.mark.parametrize("path", REAL, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_traces_decode_as_the_loop_reads_them(path: Path) -> None:
    data = read_bytes(path)
    decoded = decode_events(data, 10**6)
    assert decoded is not None, "a torch.profiler trace must take the typed decoder"
    assert_same(decoded, by_loop(data))


def test_chunks_cut_between_events_give_the_same_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    data = read_bytes(REAL[-1])
    whole = decode_events(data, 10**6)
    monkeypatch.setattr(kineto_decode, "_CHUNK", 997)  # a cut after nearly every event
    chunks = []
    real = kineto_decode._EVENTS.decode
    monkeypatch.setattr(kineto_decode, "_EVENTS", type("D", (), {"decode": lambda self, b: chunks.append(1)
                                                                 or real(b)})())
    assert whole is not None
    cut = decode_events(data, 10**6)
    assert cut is not None and len(chunks) > 10
    assert_same(cut, whole)


def test_read_kineto_takes_the_decoder_and_gives_the_loops_table(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = kineto.read_kineto(REAL[0])
    monkeypatch.setattr(kineto, "decode_events", lambda *a: None)
    slow = kineto.read_kineto(REAL[0])
    assert fast.events.equals(slow.events)
    assert (fast.stats, fast.warnings, fast.clock, fast.devices, fast.kvprof) == (
        slow.stats, slow.warnings, slow.clock, slow.devices, slow.kvprof)


GPU = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10.5, "dur": 2.0,
       "args": {"device": 0, "stream": 7, "correlation": 5, "grid": [1, 2, 3], "block": [4, 1, 1]}}
LAUNCH = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 11, "tid": 12, "ts": 9.0, "dur": 1.0,
          "args": {"correlation": 5}}


def _with_args(**args: Any) -> dict[str, Any]:
    return {**GPU, "args": {**GPU["args"], **args}}


@pytest.mark.parametrize("events,declines", [
    ([GPU, LAUNCH], False),
    ([{**GPU, "args": {"correlation": 5}}, LAUNCH], False),  # device and stream from pid and tid
    ([_with_args(device=None, stream=None), LAUNCH], False),  # null is not missing: -1, not pid/tid
    ([_with_args(**{"graph node id": None, "graphNodeId": 4})], False),
    ([_with_args(**{"graphNodeId": 4})], False),
    ([{**GPU, "pid": "Spans", "tid": " 7"}], False),  # text ids, read by int()
    ([{**GPU, "name": None, "cat": None}, {**GPU, "cat": "Trace"}, {**GPU, "dur": None}, {**GPU, "ts": 4e15}], False),
    ([{"ph": "f", "cat": "ac2g", "id": 5, "pid": 0, "tid": 7, "ts": 10.5}, {**GPU, "args": {}}], False),
    ([{"ph": "f", "cat": "ac2g", "id": "x", "pid": 0, "tid": 7}], False),  # a flow without a time
    ([{**GPU, "pid": 2**63 + 1}, {**GPU, "pid": -(2**63)}], False),  # past int64: the whole column by id
    ([_with_args(grid=[1.0, 2, 3])], True),  # floats in a launch dimension: "1.0"
    ([_with_args(grid=[2**64, 1, 1])], True),  # orjson reads it as a float
    ([_with_args(device=2**40)], True),  # the loop's int32 device column refuses it
    ([{**GPU, "ts": "10"}], True),
    ([{**GPU, "dur": True}], True),
    ([{**GPU, "name": 7}], True),  # a number keeps its digits in the loop
    ([{**GPU, "cat": ["kernel"]}], True),
    ([{**GPU, "args": [1]}], True),
    ([GPU, 5], True),  # an event that is not an object
])
def test_decoder_reads_or_declines(events: list[Any], declines: bool) -> None:
    for data in (kineto_text({"traceEvents": events}), json.dumps({"traceEvents": events}).encode()):
        decoded = decode_events(data, 10**6)
        assert (decoded is None) == declines
        if decoded is not None:
            assert_same(decoded, by_loop(data))


def test_text_that_is_not_utf8_is_left_to_orjson() -> None:
    data = kineto_text({"traceEvents": [GPU]}).replace(b'"k"', b'"k\xff"')
    assert decode_events(data, 10**6) is None
    with pytest.raises(Exception, match="not valid JSON"):
        by_loop(data)


def test_nesting_orjson_refuses_is_never_read() -> None:
    nested = b'"x": ' + b"[" * 1100 + b"]" * 1100 + b', "correlation": 5'
    data = kineto_text({"traceEvents": [GPU]}).replace(b'"correlation": 5', nested)
    assert decode_events(data, 10**6) is None
    with pytest.raises(Exception, match="not valid JSON"):
        by_loop(data)


def test_a_document_of_many_small_objects_is_not_decoded_whole() -> None:
    data = json.dumps({"traceEvents": [{}] * 50}).encode()  # compact: decoded whole only within the bound
    assert decode_events(data, 10) is None
    assert decode_events(data, 10**6) is not None


_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-(2**65), 2**65), st.integers(-3, 3),
                   st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3),
                   st.lists(st.integers(-3, 2**64 + 2), max_size=3), st.just([1.5]), st.just({}))
_ARGS = st.fixed_dictionaries({}, optional={k: _VALUE for k in (
    "correlation", "device", "stream", "graph node id", "graphNodeId", "grid", "block", "bytes", "External id")})
_EVENT = st.fixed_dictionaries({}, optional={
    "ph": st.sampled_from(["X", "X", "X", "f", "M", "i", None, 1]),
    "cat": st.sampled_from(["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cpu_op", "ac2g", "Trace",
                            "python_function", "gpu_user_annotation", "cuda_sync", "other", None]) | _VALUE,
    "name": st.sampled_from(["a", "b", "void k<1>(int)"]) | _VALUE,
    "pid": st.integers(0, 3) | _VALUE, "tid": st.integers(0, 3) | _VALUE,
    "ts": st.floats(0, 1e6, allow_nan=False) | st.integers(0, 10**6) | _VALUE,
    "dur": st.floats(0, 1e3, allow_nan=False) | _VALUE,
    "id": st.integers(0, 5) | _VALUE,
    "args": _ARGS | _VALUE,
})


# values of the types the decoder takes (nulls, missing keys, text ids and ids past int64
# included) and nothing it declines: it must read every such trace
_ID = st.none() | st.integers(-3, 3) | st.integers(-(2**64), 2**64 + 5) | st.text(max_size=3)
_SMALL_ID = st.none() | st.integers(-3, 3) | st.integers(-(2**31), 2**31 - 1)  # a pid may become a device id
_TIME = st.none() | st.integers(-(10**16), 10**16) | st.floats(-1e16, 1e16, allow_nan=False)
_TYPED_ARGS = st.fixed_dictionaries({}, optional={
    **{k: st.none() | st.integers(-(2**63) - 5, 2**63 + 5) for k in ("correlation", "stream", "graph node id",
                                                                      "graphNodeId", "bytes")},
    "device": _SMALL_ID, "grid": st.none() | st.lists(st.integers(-5, 2**40), max_size=3),
    "block": st.none() | st.lists(st.integers(-5, 5), max_size=3), "External id": _VALUE})
_TYPED_EVENT = st.fixed_dictionaries({}, optional={
    "ph": st.sampled_from(["X", "X", "X", "f", "M", "i", None]),
    "cat": st.sampled_from(["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "ac2g",
                            "Trace", "python_function", "gpu_user_annotation", "cuda_sync", "other", None, ""]),
    "name": st.none() | st.text(max_size=4), "pid": _SMALL_ID | st.text(max_size=3), "tid": _ID,
    "ts": _TIME, "dur": _TIME, "id": _ID, "args": st.none() | _TYPED_ARGS, "Input Dims": _VALUE,
})


def _trace_bytes(events: list[Any], layout: bool) -> bytes:
    return kineto_text({"traceEvents": events}) if layout else json.dumps({"traceEvents": events}).encode()


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_TYPED_EVENT, min_size=1, max_size=12), st.booleans())
def test_generated_typed_events_are_decoded_as_the_loop_reads_them(events: list[dict[str, Any]], layout: bool) -> None:
    data = _trace_bytes(events, layout)
    decoded = decode_events(data, 10**6)
    assert decoded is not None
    assert_same(decoded, by_loop(data))


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_EVENT, min_size=1, max_size=12), st.booleans())
def test_generated_events_of_any_type_decode_as_the_loop_reads_them_or_not_at_all(
        events: list[dict[str, Any]], layout: bool) -> None:
    data = _trace_bytes(events, layout)
    try:
        loop = by_loop(data)
    except orjson.JSONDecodeError:  # an integer orjson does not take
        assert decode_events(data, 10**6) is None
        return
    decoded = decode_events(data, 10**6)
    if decoded is not None:
        assert_same(decoded, loop)
