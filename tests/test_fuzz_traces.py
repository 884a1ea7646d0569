"""Fuzzing the hostile-input guarantees of the trace readers, the analysis and the renderers.

One property per kind of attack, each of which an earlier kvprof failed:
- times that are not numbers (text, booleans, null, missing) in a Kineto event or an nsys
  row are never read as 0 ns: a write's GPU time is the built one or missing;
- figures in a summary.json that cannot be (negative, text) are read as missing;
- text from a trace (variant, device, kernel names) reaches the terminal without control
  characters or rich markup, and a CSV without formulas;
- inflated, value-dense or deeply nested JSON is refused within the decompressed-size,
  event and value bounds, in one line, holding no more than those bounds allow;
- a --write-kernels pattern that backtracks ends within the time budget.

The CI run is derandomized and bounded (seconds); ``KVPROF_FUZZ_EXAMPLES=N pytest
tests/test_fuzz_traces.py`` runs each Hypothesis property N times, randomly.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import math
import os
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvprof.cli import main
from kvprof.core.errors import TraceError, UsageError
from kvprof.core.text import FORMULA_PREFIXES, csv_cell, markup, printable
from kvprof.trace.synthetic import KernelSpec, PhaseSpec, TraceSpec, WriteSpec, build, dumps

LONG_EXAMPLES = int(os.environ.get("KVPROF_FUZZ_EXAMPLES", "0"))
RAW = ["\x1b", "\x07", "\r", "\n", "\x9b", "\u202e", "\u2066", "\u2028", "\x00", "\x7f"]


def _settings(ci_examples: int) -> settings:
    return settings(max_examples=LONG_EXAMPLES or ci_examples, deadline=None, database=None,
                    derandomize=LONG_EXAMPLES == 0,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])


def _call(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(args)
        except SystemExit as exc:
            rc = int(exc.code or 0)
    return rc, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------- times that are not numbers

not_a_time = st.one_of(st.none(), st.booleans(), st.text(max_size=6), st.sampled_from(["NaN", "inf", "5", "-1"]),
                       st.lists(st.integers(0, 9), max_size=2), st.just(...))  # ...: the key removed
K_NS = 5000


@_settings(10)
@given(field=st.sampled_from(["ts", "dur"]), value=not_a_time, which=st.integers(0, 3))
def test_kineto_times_that_are_not_numbers_are_never_zero(field: str, value: Any, which: int) -> None:
    from kvprof.analysis.summary import analyze
    from kvprof.trace.load import load

    spec = TraceSpec(layers=[0, 1], phases=[PhaseSpec("decode", 8, 2)], write=WriteSpec([KernelSpec(7, 0, K_NS)]))
    doc, _ = build(spec)
    kernel = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"][which]
    if value is ...:
        del kernel[field]
    else:
        kernel[field] = value
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.json"
        p.write_bytes(dumps(doc))
        result = analyze(load(p))
    busy = [b for b in result.writes["gpu_busy_ns"] if b == b]
    assert busy == [K_NS] * 3  # the damaged write has no GPU time; no write costs 0
    assert any("1 events skipped: timestamp or duration missing or not a number" in w
               for w in result.summary.warnings)


sql_not_a_time = st.one_of(st.none(), st.text(max_size=6), st.binary(max_size=4), st.sampled_from(["1e999", "x"]))


@_settings(10)
@given(column=st.sampled_from(["start", "end"]), value=sql_not_a_time, which=st.integers(0, 2))
def test_nsys_times_that_are_not_numbers_are_never_zero(column: str, value: Any, which: int) -> None:
    from kvprof.analysis.summary import analyze
    from kvprof.trace.load import load

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "e.sqlite"
        _nsys(p)
        with sqlite3.connect(p) as con:
            con.execute(f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET [{column}] = ? WHERE correlationId = ?",
                        (value, 100 + which))
        result = analyze(load(p))
    busy = [b for b in result.writes["gpu_busy_ns"] if b == b]
    assert busy == [1000] * 2
    assert any("1 rows skipped: start or end missing or not a number" in w for w in result.summary.warnings)


def _nsys(path: Path) -> None:
    """Three kernels of 1000 ns, their launches, three kvprof write ranges."""
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, streamId, correlationId, globalPid, shortName);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start, end, globalTid, correlationId, nameId);
        CREATE TABLE NVTX_EVENTS (start, end, eventType, text, globalTid, domainId);
        INSERT INTO StringIds VALUES (1, 'store_kv'), (2, 'cudaLaunchKernel');
    """)
    tid = (7 << 24) | 7
    for i in range(3):
        t = 1_000_000 + 10_000 * i
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,0,7,?,?,1)",
                    (t + 1000, t + 2000, 100 + i, 7 << 24))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,2)", (t + 100, t + 300, tid, 100 + i))
        con.execute("INSERT INTO NVTX_EVENTS VALUES (?,?,59,?,?,0)", (t, t + 500, f"set_kv_buffer[v] L{i}", tid))
    con.commit()
    con.close()


# ---------------------------------------------------------------- a summary.json edited by hand

FIGURES = ["cost_per_write_ns", "gpu_span_ns", "gpu_busy_ns", "step_ns", "writes", "bandwidth_gbs", "overlap_frac",
           "launch_delay_ns", "saving_per_step_ms"]
any_json = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(allow_nan=False),
                     st.text(max_size=5), st.sampled_from(["NaN", "-inf", "1e999"]),
                     st.lists(st.integers(), max_size=2))


@_settings(60)
@given(edits=st.lists(st.tuples(st.sampled_from(FIGURES), any_json), min_size=1, max_size=6),
       source=st.sampled_from(["kineto", "nsys", "reference"]))
def test_summary_figures_that_cannot_be_are_missing(edits: list[tuple[str, Any]], source: str) -> None:
    import pandas as pd

    from kvprof.core.summary import NON_NEGATIVE, SIGNED_IN_REFERENCE, Summary

    row: dict[str, Any] = {"variant": "v", "source": source, "phase": "decode", "size": 8, "context": "layer"}
    row.update(edits)
    s = Summary.from_json({"schema": "kvprof.summary/1", "groups": [row], "comparison": {"rows": [dict(row)]}})
    for checked in (s.groups[0], s.comparison["rows"][0]):  # type: ignore[index]
        for key, _ in edits:
            v = checked[key]
            assert v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
            if key in NON_NEGATIVE and not (source == "reference" and key in SIGNED_IN_REFERENCE):
                assert v is None or v >= 0
    # what the dashboard and kvprof report read: numbers that can be, or missing
    from kvprof.dashboard import frames

    cost = frames.groups_frame(s.to_json())["cost_per_write_ns"]
    assert pd.api.types.is_numeric_dtype(cost) and (source == "reference" or not (cost < 0).any())
    assert len(s.invalid) == sum(1 for k, _ in dict(edits).items() if row[k] is not None and s.groups[0][k] is None) * 2


# ---------------------------------------------------------------- text on the terminal and in a spreadsheet

hostile_char = st.sampled_from(RAW + ["[", "]", "/", "=", "+", "-", "@", "\t", "link", "red", "\\", "a", " ", "é"])
hostile_text = st.lists(hostile_char, min_size=1, max_size=12).map("".join)


@_settings(300)
@given(text=hostile_text)
def test_printable_markup_and_csv_cell(text: str) -> None:
    from rich.console import Console

    shown = printable(text)
    assert not [c for c in RAW + ["\t"] if c in shown]
    for template in ("[yellow]warning:[/yellow] {}", "[dim]({})[/dim]"):  # as the renderers use it
        con = Console(file=io.StringIO(), width=200, force_terminal=False, color_system=None, emoji=False)
        con.print(template.format(markup(text)), soft_wrap=True, end="")
        plain = template.replace("[yellow]", "").replace("[/yellow]", "").replace("[dim]", "").replace("[/dim]", "")
        assert con.file.getvalue() == plain.format(shown)  # type: ignore[attr-defined]
    cell = csv_cell(text)
    assert not cell.startswith(FORMULA_PREFIXES) and "\r" not in cell
    kept = text.replace("\r", "\\x0d")  # the content stays, a CR as its escape
    assert cell in (kept, "'" + kept)


@_settings(3)
@given(variant=hostile_text.filter(lambda t: "]" not in t and t.strip()), device=hostile_text, kernel=hostile_text)
def test_trace_text_reaches_terminal_and_csv_inert(variant: str, device: str, kernel: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        run.mkdir()
        for name, v, k_ns in (("a.json", variant, 5000), ("b.json", "two_stream", 4000)):
            doc, _ = build(TraceSpec(variant=v, layers=[0], phases=[PhaseSpec("decode", 8, 2)],
                                     write=WriteSpec([KernelSpec(7, 0, k_ns, name="store_kv " + kernel)])))
            doc["deviceProperties"] = [{"id": 0, "name": device}]
            (run / name).write_bytes(dumps(doc))
        for args in (["analyze", str(run), "--no-files", "--write-kernels", "store"],
                     ["compare", str(run), "--baseline", "two_stream"], ["compare", str(run), str(run)]):
            rc, out, err = _call(args)
            assert rc == 0, err
            shown = out + err
            assert not [c for c in RAW if c in shown.replace("\n", "")], args
        for args in (["analyze", str(run), "--no-files", "--format", "csv"],
                     ["compare", str(run), "--baseline", "two_stream", "--format", "csv"]):
            rc, out, err = _call(args)
            assert rc == 0, err
            rows = list(csv.reader(io.StringIO(out, newline="")))
            assert len({len(r) for r in rows}) == 1, rows  # no cell split into a row of its own
            cells = [c for r in rows for c in r]
            assert not [c for c in cells if c.startswith(("=", "+", "@", "\t", "\r"))]
            assert not [c for c in cells if c.startswith("-") and not _number(c)]


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------- size, values and nesting bounds

UNITS = [b" ", b"{}", b"[]", b"0", b'"a"', b'{"a": 1}', b'{"ph": "X", "ts": 1, "dur": 1}']
LIMIT_MB = 2


@_settings(8)
@given(unit=st.sampled_from(UNITS), inflated_mb=st.sampled_from([1, 3, 12]), indented=st.booleans(),
       gz=st.booleans())
def test_inflated_and_dense_json_stays_within_its_bounds(unit: bytes, inflated_mb: int, indented: bool,
                                                         gz: bool) -> None:
    """Peak memory while reading stays under the size limit plus a chunk and the parse of the
    values bound, whatever the input inflates to (it used to be read whole, then parsed whole)."""
    import tracemalloc

    import kvprof.trace.kineto as kineto
    import kvprof.trace.kineto_io as kineto_io
    from kvprof.trace.load import load

    sep = b",\n  " if indented else b","
    block = sep.join([unit] * ((1 << 20) // (len(unit) + len(sep))))
    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVPROF_MAX_TRACE_MB", str(LIMIT_MB))
        mp.setattr(kineto_io, "_CHUNK", 256 << 10)
        mp.setattr(kineto, "SPLIT_MIN_BYTES", 0)
        p = Path(d) / ("t.json.gz" if gz else "t.json")
        with open(p, "wb") as f:
            parts = [b'{"traceEvents": [\n  ' + unit] + [sep + block] * inflated_mb + [b"\n]}"]
            for part in parts:
                f.write(gzip.compress(part, compresslevel=1) if gz else part)
        tracemalloc.start()
        try:
            load(p, max_events=1000)
        except TraceError as exc:
            assert "\n" not in str(exc) and "malformed trace (" not in str(exc), exc
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
    # the limit, a chunk, the parse of 4,000 values (<= 125 B each), slack for the reader itself
    assert peak < ((LIMIT_MB << 20) + (256 << 10)) * 1.2 + 4_000 * 125 + (2 << 20), peak


@pytest.mark.parametrize("depth", [1000, 1021, 1023])  # around orjson's limit of 1024 levels, over Python's stack
@pytest.mark.parametrize("where", ["document", "name", "args", "grid", "kvprof", "top"])
def test_deep_nesting_is_read_or_refused_in_one_line(where: str, depth: int) -> None:
    from kvprof.analysis.summary import analyze
    from kvprof.trace.load import load

    deep = b"[" * depth + b"]" * depth
    doc, _ = build(TraceSpec(layers=[0], phases=[PhaseSpec("decode", 8, 1)]))
    kernel = next(e for e in doc["traceEvents"] if e.get("cat") == "kernel")
    target = {"document": doc["traceEvents"], "name": kernel, "args": kernel["args"], "grid": kernel["args"],
              "kvprof": doc["kvprof"], "top": doc}[where]
    levels = depth + {"document": 2, "name": 3, "args": 4, "grid": 4, "kvprof": 2, "top": 1}[where]
    if isinstance(target, list):
        target.append("<deep>")
    else:
        target[{"name": "name", "args": "correlation", "grid": "grid", "kvprof": "device",
                "top": "x"}[where]] = "<deep>"
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.json"
        p.write_bytes(orjson.dumps(doc).replace(b'"<deep>"', deep))
        try:
            analyze(load(p))
            assert levels <= 1024  # orjson's limit: deeper is refused
        except TraceError as exc:  # never the catch-all "malformed trace (RecursionError ...)"
            assert levels > 1024 and "not valid JSON" in str(exc) and "\n" not in str(exc), exc


# ---------------------------------------------------------------- --write-kernels time

pathological = st.sampled_from(["^(a+)+$", "(a|aa)+$", "(a*)*b", "(.*a){12}$", "^(a|a?)+$", "(\\w+\\s?)+$",
                                "((a+)+)+c", "(a|a)+$"])


@_settings(12)
@given(pattern=pathological, n=st.integers(20, 60), tail=st.sampled_from(["!", "b", "", " "]))
def test_write_kernel_patterns_end_within_the_budget(pattern: str, n: int, tail: str) -> None:
    import pandas as pd

    from kvprof.analysis.write_kernels import classify, patterns_with

    budget = 0.2
    names = pd.Series(["a" * n + tail, "store_kvcache_kernel", "a" * (n // 2) + tail])
    t0 = time.monotonic()
    try:
        got = classify(names, patterns_with(pattern), budget)
        assert got[1] in ("user", "sglang_store_cache")
    except UsageError as exc:
        assert f"took more than {budget:g} s" in str(exc) and "\n" not in str(exc)
    assert time.monotonic() - t0 < budget + 3.0  # the regex package checks its timeout often; 2-core CI slack
