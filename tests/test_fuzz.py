"""Fuzzing: malformed Kineto JSON and nsys SQLite through analyze, compare, scrub and the dashboard's loader.

Every generated input must end in a documented exit code with at most one line on stderr,
never a traceback, within a time bound, writing nothing outside its output folder; valid
input must still give the answers the synthetic builder expects. Inputs are a valid trace
or export with random damage: values of the wrong type or range in any field, missing
keys, tables and columns, truncation. The catch-all in ``kvprof.trace.load`` (``malformed
trace (<Exception>: ...)``) must never be what answers: each case is handled where it arises.

The CI run is bounded (``CI_EXAMPLES`` per property, derandomized, well under a minute);
``KVPROF_FUZZ_EXAMPLES=2000 pytest -m fuzz_long tests/test_fuzz.py`` runs the long one.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from kvprof.cli import main
from kvprof.core.errors import KvprofError
from kvprof.trace.synthetic import (
    KernelSpec,
    PhaseSpec,
    TraceSpec,
    WriteSpec,
    build,
    dumps,
)

pytest.importorskip("streamlit")  # the dashboard's loader is one of the consumers fuzzed
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
CI_EXAMPLES = 12
LONG_EXAMPLES = int(os.environ.get("KVPROF_FUZZ_EXAMPLES", "0"))
TIME_BOUND_S = 20.0  # per command on a 2-core CI machine; the inputs are a few kB
ANALYZE_CODES = {0, 2, 3}  # ok, usage (e.g. compare's baseline absent), unreadable trace
SCRUB_CODES = {0, 1, 2, 3}  # ok, something remains, usage, unreadable


def _settings(n: int) -> settings:
    return settings(max_examples=n, deadline=None, database=None, derandomize=LONG_EXAMPLES == 0,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


# ---------------------------------------------------------------- strategies

json_scalar = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.sampled_from([2**63, -(2**63) - 1, 2**64]),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e300, -1e300, 1e-300, 0.5]),
    st.text(max_size=12), st.sampled_from(["kernel", "ac2g", "X", "f", "set_kv_buffer", "cuda_runtime"]),
)
json_value = st.recursive(json_scalar, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                               st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                          max_leaves=6)
EVENT_KEYS = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args"]
ARG_KEYS = ["correlation", "device", "stream", "graph node id", "grid", "block", "bytes"]
TOP_KEYS = ["traceEvents", "deviceProperties", "kvprof", "distributedInfo", "baseTimeNanoseconds"]
META_KEYS = ["variant", "layers", "kernels_per_write", "template", "paths", "device", "bytes_per_token", "fused"]


@st.composite
def kineto_damage(draw: Any) -> tuple[bytes, str]:
    """A valid synthetic trace with random damage, serialized (plain or gzipped, maybe truncated)."""
    spec = TraceSpec(phases=[PhaseSpec("decode", 8, 1, graph=True), PhaseSpec("prefill", 16, 1)], layers=[0, 1])
    doc, _ = build(spec)
    events = doc["traceEvents"]
    for _ in range(draw(st.integers(1, 6))):
        what = draw(st.sampled_from(["event", "arg", "top", "meta", "drop_event_key", "drop_top"]))
        if what == "event":
            e = events[draw(st.integers(0, len(events) - 1))]
            e[draw(st.sampled_from(EVENT_KEYS))] = draw(json_value)
        elif what == "arg":
            e = events[draw(st.integers(0, len(events) - 1))]
            if isinstance(e.get("args"), dict):
                e["args"][draw(st.sampled_from(ARG_KEYS))] = draw(json_value)
        elif what == "top":
            doc[draw(st.sampled_from(TOP_KEYS))] = draw(json_value)
        elif what == "meta" and isinstance(doc.get("kvprof"), dict):
            doc["kvprof"][draw(st.sampled_from(META_KEYS))] = draw(json_value)
        elif what == "drop_event_key":
            events[draw(st.integers(0, len(events) - 1))].pop(draw(st.sampled_from(EVENT_KEYS)), None)
        elif what == "drop_top":
            doc.pop(draw(st.sampled_from(TOP_KEYS)), None)
    data = json.dumps(doc).encode()  # stdlib: integers beyond 64 bits too
    if draw(st.booleans()):
        data = gzip.compress(data, compresslevel=1)
    if draw(st.integers(0, 9)) == 0:
        data = data[: draw(st.integers(1, max(1, len(data) - 1)))]
    return data, "t.pt.trace.json.gz" if data[:2] == b"\x1f\x8b" else "t.json"


NSYS_TABLES: dict[str, list[str]] = {
    "StringIds": ["id", "value"],
    "CUPTI_ACTIVITY_KIND_KERNEL": ["start", "end", "deviceId", "streamId", "correlationId", "globalPid", "shortName",
                                   "demangledName", "graphNodeId", "gridX", "gridY", "gridZ", "blockX", "blockY",
                                   "blockZ"],
    "CUPTI_ACTIVITY_KIND_RUNTIME": ["start", "end", "globalTid", "correlationId", "nameId"],
    "CUPTI_ACTIVITY_KIND_MEMCPY": ["start", "end", "deviceId", "streamId", "correlationId", "bytes", "copyKind"],
    "NVTX_EVENTS": ["start", "end", "eventType", "text", "textId", "globalTid", "domainId", "category", "int64Value"],
    "TARGET_INFO_GPU": ["id", "name", "smCount", "totalMemory", "memoryBandwidth"],
    "TARGET_INFO_SESSION_START_TIME": ["utcEpochNs"],
    "CUDA_GRAPH_NODE_EVENTS": ["start", "globalTid", "graphNodeId", "originalGraphNodeId"],
    "ENUM_CUDA_MEMCPY_OPER": ["id", "label"],
}
sql_value = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False),
                      st.text(max_size=8), st.binary(max_size=8), st.sampled_from([0, 1, 59, 75, -1, 10**18]))


def _good_rows(table: str, i: int) -> dict[str, Any]:
    t = 1_000_000 + 10_000 * i
    tid = (7 << 24) | 7
    return {
        "StringIds": {"id": i + 1, "value": ["store_kv", "cudaLaunchKernel", "kvprof"][i % 3]},
        "CUPTI_ACTIVITY_KIND_KERNEL": {"start": t + 1000, "end": t + 2000, "deviceId": 0, "streamId": 7,
                                       "correlationId": 100 + i, "globalPid": 7 << 24, "shortName": 1,
                                       "demangledName": 1, "graphNodeId": None, "gridX": 1, "gridY": 1, "gridZ": 1,
                                       "blockX": 128, "blockY": 1, "blockZ": 1},
        "CUPTI_ACTIVITY_KIND_RUNTIME": {"start": t + 100, "end": t + 300, "globalTid": tid, "correlationId": 100 + i,
                                        "nameId": 2},
        "CUPTI_ACTIVITY_KIND_MEMCPY": {"start": t + 2500, "end": t + 2600, "deviceId": 0, "streamId": 7,
                                       "correlationId": 200 + i, "bytes": 64, "copyKind": 1},
        "NVTX_EVENTS": {"start": t, "end": t + 500, "eventType": 59, "text": f"set_kv_buffer[v] L{i}", "textId": None,
                        "globalTid": tid, "domainId": 0, "category": None, "int64Value": 8},
        "TARGET_INFO_GPU": {"id": 0, "name": "GPU", "smCount": 132, "totalMemory": 1 << 30, "memoryBandwidth": 4e12},
        "TARGET_INFO_SESSION_START_TIME": {"utcEpochNs": 1_700_000_000_000_000_000},
        "CUDA_GRAPH_NODE_EVENTS": {"start": t, "globalTid": tid, "graphNodeId": i, "originalGraphNodeId": None},
        "ENUM_CUDA_MEMCPY_OPER": {"id": i, "label": "DtoD"},
    }[table]


@st.composite
def nsys_damage(draw: Any) -> bytes:
    """An nsys-shaped export with tables and columns dropped and values of any SQLite type."""
    required = {"StringIds", "CUPTI_ACTIVITY_KIND_KERNEL"}
    tables = {t: cols for t, cols in NSYS_TABLES.items()
              if t in required and draw(st.integers(0, 9)) > 0 or t not in required and draw(st.booleans())}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "e.sqlite"
        con = sqlite3.connect(path)
        for table, cols in tables.items():
            keep = [c for c in cols if draw(st.integers(0, 7)) > 0] or cols[:1]
            con.execute(f"CREATE TABLE [{table}] ({', '.join(f'[{c}]' for c in keep)})")
            for i in range(3):
                row = _good_rows(table, i)
                values = [draw(sql_value) if draw(st.integers(0, 5)) == 0 else row[c] for c in keep]
                con.execute(f"INSERT INTO [{table}] VALUES ({','.join('?' * len(keep))})", values)
        con.commit()
        con.close()
        return path.read_bytes()


# ---------------------------------------------------------------- the properties


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _call(args: list[str]) -> tuple[int, str, float]:
    err = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(args)
        except SystemExit as exc:  # argparse
            rc = int(exc.code or 0)
    return rc, err.getvalue(), time.monotonic() - t0


def _one_line_error(rc: int, err: str, command: str) -> None:
    assert "Traceback" not in err
    assert "malformed trace (" not in err, f"the catch-all answered, not a precise check: {err}"
    if rc:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert lines and all(ln.startswith((f"kvprof {command}", "/", "kvprof scrub")) for ln in lines), err
        if command != "scrub":
            assert len(lines) == 1, err


def exercise(data: bytes, name: str) -> None:
    """analyze, compare, scrub and the dashboard loader on one input: the contract of the module doc."""
    from kvprof.dashboard import data as dash

    cwd_before = set(os.listdir("."))
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "in").mkdir()
        src = root / "in" / name
        src.write_bytes(data)
        for cmd, args, codes in (
            ("analyze", ["analyze", str(src), "--out", str(root / "out")], ANALYZE_CODES),
            ("compare", ["compare", str(src), "--out", str(root / "out")], ANALYZE_CODES),
        ):
            rc, err, dt = _call(args)
            assert rc in codes, (cmd, rc, err)
            _one_line_error(rc, err, cmd)
            assert dt < TIME_BOUND_S, (cmd, dt)
        try:
            dash.analyse_to(src, root / "cache")
        except KvprofError as exc:
            assert exc.__cause__ is None or isinstance(exc.__cause__, KvprofError), repr(exc.__cause__)
            assert "\n" not in str(exc)
        rc, err, dt = _call(["scrub", str(src)])
        assert rc in SCRUB_CODES and dt < TIME_BOUND_S, (rc, err)
        _one_line_error(rc, err, "scrub")
        rc, err, dt = _call(["scrub", "--check", str(src)])
        assert rc in SCRUB_CODES and dt < TIME_BOUND_S, (rc, err)
        assert "Traceback" not in err
        outside = {f for f in _files(root) if not f.startswith(("in", "out", "cache"))}
        assert not outside, outside
    assert set(os.listdir(".")) == cwd_before


@pytest.fixture(autouse=True)
def _own_cwd_and_dashboard_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVPROF_DASHBOARD_CACHE", str(tmp_path_factory.mktemp("dash-cache")))
    # a working directory of its own: exercise's "nothing new in the cwd" must not see what a
    # test in another worker writes into the checkout (the browser test's test-artifacts/)
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@pytest.mark.slow
@_settings(CI_EXAMPLES)
@given(kineto_damage())
def test_malformed_kineto(case: tuple[bytes, str]) -> None:
    exercise(*case)


@_settings(CI_EXAMPLES)
@given(nsys_damage())
def test_malformed_nsys_export(data: bytes) -> None:
    exercise(data, "e.sqlite")


@_settings(8)
@given(st.integers(1, 4), st.integers(1, 3), st.integers(200, 20_000), st.integers(0, 3_000), st.booleans())
def test_valid_traces_give_the_builders_answers(layers: int, steps: int, k_ns: int, gap: int, graph: bool) -> None:
    """The hardening changes no answer on valid input: per-write GPU time and counts as built."""
    from kvprof.analysis.summary import analyze
    from kvprof.trace.load import load

    spec = TraceSpec(layers=list(range(layers)), phases=[PhaseSpec("decode", 8, steps, graph=graph)],
                     write=WriteSpec([KernelSpec(7, 0, k_ns), KernelSpec(21, gap, k_ns)]))
    doc, expected = build(spec)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.json"
        p.write_bytes(dumps(doc))
        loaded = load(p)
        result = analyze(loaded)
    w = result.writes[~result.writes["during_capture"].astype(bool)].sort_values(["step", "layer"])
    exp = sorted(expected["writes"], key=lambda e: (e["step"], e["layer"]))
    assert len(w) == len(exp) == layers * steps
    assert list(w["gpu_busy_ns"]) == [e["gpu_busy_ns"] for e in exp]
    assert list(w["gpu_span_ns"]) == [e["gpu_span_ns"] for e in exp]
    assert not [x for x in result.summary.to_json()["warnings"] if "skipped" in x or "negative" in x]


# ---------------------------------------------------------------- command-line values

# (command, option, what an accepted value must be): each numeric option of the commands that
# take sizes, counts, seeds, limits or paths. Checked at the argument, before torch is imported.
INT64_MAX = 2**63 - 1
NUMERIC_OPTIONS = [
    *[("capture", o, (1, INT64_MAX)) for o in ("--tp", "--steps", "--serving-steps", "--chunk", "--page-size",
                                               "--pool-size", "--context-len", "--layers", "--reference-steps",
                                               "--ranks")],
    ("capture", "--warmup", (0, INT64_MAX)), ("capture", "--seed", (0, INT64_MAX)),
    ("capture", "--threads", (1, 4 * len(os.sched_getaffinity(0)))),
    ("capture", "--max-memory-gb", (0, 2**20)), ("capture", "--k-scale", (2.0**-126, 2.0**127)),
    ("capture", "--v-scale", (2.0**-126, 2.0**127)),
    ("bench", "--seed", (0, INT64_MAX)), ("bench", "--threads", (1, 4 * len(os.sched_getaffinity(0)))),
    ("bench", "--replays", (1, 100_000)), ("bench", "--eager-repeats", (1, 100_000)),
    ("bench", "--pool-mb", (1, 2**30)), ("bench", "--max-memory-gb", (0, 2**20)),
    ("bench", "--target-rate-fraction", (0, 1)), ("bench", "--target-fixed-us", (0, float("inf"))),
    *[(c, o, (1, INT64_MAX)) for c in ("analyze", "compare") for o in ("--layers", "--max-events")],
    *[(c, o, (0, float("inf"))) for c in ("analyze", "compare") for o in ("--itl-before", "--itl-after")],
    ("compare", "--fail-if-slower", (0, float("inf"))),
    ("dashboard", "--port", (1, 65535)), ("dashboard", "--max-upload-mb", (1, 2**30)),
    # comma-separated sizes: each one bounded
    ("capture", "--batch-sizes", (1, INT64_MAX)), ("capture", "--prefill-tokens", (1, INT64_MAX)),
    ("bench", "--tokens", (1, INT64_MAX)),
]
DEST = {"--batch-sizes": "decode_sizes", "--prefill-tokens": "prefill_sizes"}
_PARSER: list[Any] = []


def _parse(argv: list[str]) -> tuple[Any, int | None, str]:
    """The command line parsed (no command run): (namespace or None, exit code or None, stderr)."""
    from kvprof.cli import build_parser

    if not _PARSER:
        _PARSER.append(build_parser())
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return _PARSER[0].parse_args(argv), None, err.getvalue()
        except SystemExit as exc:
            return None, int(exc.code or 0), err.getvalue()


POSITIONAL = {"analyze": ["t.json"], "compare": ["t.json"]}
NUMBER_TEXT = st.one_of(
    st.integers(-(2**80), 2**80).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", ",", "1e308", "-0", "0x10", "1_000", "nan", "-inf", "1e-320", "٣", "9" * 5000,
                     "1,2,3", "4,-1", f"1,{2**70}"]),
    st.text(max_size=12),
)


def _option(command: str, flag: str) -> tuple[str, str, tuple]:
    return next(o for o in NUMERIC_OPTIONS if o[:2] == (command, flag))


@_settings(300)
@given(st.sampled_from(NUMERIC_OPTIONS), NUMBER_TEXT)
@example(_option("capture", "--seed"), "-1")
@example(_option("capture", "--threads"), "100000")
@example(_option("capture", "--max-memory-gb"), "1e308")
@example(_option("bench", "--target-rate-fraction"), "9" * 5000)
@example(_option("capture", "--batch-sizes"), f"1,{2**70}")
def test_numeric_options_take_a_bounded_value_or_refuse_in_one_line(option: tuple[str, str, tuple], text: str) -> None:
    """Any text for any numeric option: parsed within the option's bounds, or exit 2 with one
    line naming the option, never a traceback (the value reaching torch, numpy or orjson did)."""
    command, flag, (low, high) = option
    args, code, err = _parse([command, *POSITIONAL.get(command, []), f"{flag}={text}"])
    assert "Traceback" not in err
    if args is None:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and flag in lines[0], err
        assert len(lines[0]) < 400, lines[0]  # a 5000-digit value is not repeated whole
        return
    value = getattr(args, DEST.get(flag, flag.lstrip("-").replace("-", "_")))
    for v in value if isinstance(value, list) else [value]:
        assert not isinstance(v, bool) and isinstance(v, (int, float)), value
        assert low <= v <= high and v == v, (flag, text, value)


@pytest.mark.fuzz_long
@pytest.mark.skipif(not LONG_EXAMPLES, reason="set KVPROF_FUZZ_EXAMPLES=N for the long fuzz run")
@_settings(max(LONG_EXAMPLES, 1))
@given(st.one_of(kineto_damage(), nsys_damage().map(lambda b: (b, "e.sqlite"))))
def test_malformed_inputs_long(case: tuple[bytes, str]) -> None:
    exercise(*case)
