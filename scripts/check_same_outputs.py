#!/usr/bin/env python3
"""Show that two commits of kvprof write the same outputs: a change that only moves code
(a re-layering) must leave every file and every printed line as it was.

Each ref is checked out into a temporary git worktree and runs the same commands with its own
kvprof (PYTHONPATH and working directory set to that tree):

- fresh CPU captures at a fixed seed (three layouts), then analyze in every format, the
  Perfetto trace and the HTML report on each side's own capture: these hold this run's
  measurements, so they are compared under the "measured" masks (timings by key, numbers in
  printed text);
- analyze (table, json, csv, Perfetto) and report (each --source) on every committed sample
  run, trace folder and trace file, and on the base side's fresh captures, read by both sides
  from one copy taken from the base ref: same input, so compared under the "strict" masks
  (only temporary paths, dates, plotly's random ids, the host name and versions);
- a small CPU bench (three variants, one shape, 1 token) in its three output formats
  (measured).

Then every output file, stdout, stderr and exit code is compared after masking; the masks
are printed with the result. Exit 0 when all are the same, 1 when anything differs, 2 for
bad usage.

    python scripts/check_same_outputs.py --base REF [--head REF]   # head: this working tree

--only REGEX runs the commands whose label matches (to look into one difference); --keep DIR
keeps both sides' outputs.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gzip
import io
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MASKED = "<masked>"

# ---------------------------------------------------------------------------------------------
# Masks: what may legitimately differ between two runs of the same code. Kept as data so that
# they are printed with every result.


@dataclass(frozen=True)
class Masks:
    """What a profile ignores: text regexes (applied to every text, string value and cell),
    JSON keys whose value is replaced, lists ordered by a measured time (sorted before
    comparing), parquet/CSV columns replaced, files whose records compare as a set. Each entry
    carries why."""

    name: str
    text: tuple[tuple[str, str, str], ...] = ()  # (why, regex, replacement)
    keys: tuple[tuple[str, str], ...] = ()  # (why, regex on a JSON key)
    ranked: tuple[tuple[str, str], ...] = ()  # (why, regex on the key holding a list ranked by time)
    columns: tuple[tuple[str, str], ...] = ()  # (why, regex on a parquet or CSV column name)
    unordered: tuple[tuple[str, str], ...] = ()  # (why, regex on a file name): its records compared as a set

    def extended(self, name: str, other: Masks) -> Masks:
        return Masks(name, self.text + other.text, self.keys + other.keys, self.ranked + other.ranked,
                     self.columns + other.columns, self.unordered + other.unordered)


ISO_DATE = r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([+-]\d{2}:?\d{2}|Z)?"
TIME_KEY = r"(_ns|_us|_ms|_s|_sec|_seconds|_gbs)$"

STRICT = Masks(
    "strict",
    text=(
        ("dates and times", ISO_DATE, "<date>"),
        ("plotly's random figure ids", r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>"),
    ),
    keys=(
        ("the versions of kvprof, python and libraries", r"^versions$"),
        ("dates", r"^(date|captured_at|analyzed_at|created_at)$"),
    ),
)

MEASURED = STRICT.extended("measured", Masks(
    "",
    text=(
        ("a temporary file's pid and random part", r"\.tmp-\d+-[0-9a-f]+|tmp[a-z0-9_]{8}", "<tmpname>"),
        ("a Perfetto track's lane number (overlapping slices take lanes by their times)", r' \(\d+\)"', '"'),
        ("a figure axis's scale, range and ticks: log or linear as the measured values spread",
         r',"(?:type":"(?:log|linear)"|exponentformat":"none"|range":\[[^\]]*\]|tickvals":\[[^\]]*\]'
         r'|ticktext":\[[^\]]*\])| \(log\)(?=")', ""),
        ("the observer-effect flag column (a profiled timing more than 10 % off)", r"(?m)│ (?:ok|off) +│$",
         "│ <flag> │"),
        ("every number in printed text (tables of timings; the same run's JSON/CSV/parquet keep "
         "the non-timing numbers compared by key)", r"\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?", "#"),
        ("plotly's packed number arrays", r'"bdata":"[^"]*"', '"bdata":"#"'),
        ("line breaks, padding and rules, which follow the width of the masked numbers (a table's title "
         "wraps at the table's width)", r"[\s\u2500-\u257f]+", " "),
    ),
    keys=(
        ("timings and durations by unit suffix", TIME_KEY),
        ("ratios, slowdowns, rates and verdicts derived from timings",
         r"^(ratio.*|.*_ratio|pass_slowdown|reading_over_pass|flagged|median_.*|range_.*|gbs|pct_.*"
         r"|meets_target|median|iqr|mean)$"),
        ("Kineto trace times, pids, thread ids and random trace ids",
         r"^(ts|dur|pid|tid|trace_id|baseTimeNanoseconds|sort_index|traceName)$"),
    ),
    ranked=(("lists ranked by time (top names by total time)", r"(_by_name|^memcpy_memset)$"),),
    columns=(
        ("timing columns", TIME_KEY),
        ("process and thread ids, and rates and ratios derived from timings",
         r"^(pid|tid|bandwidth_gbs|pct_of_peak|overlap_frac|gbs|pct_copy_rate|meets_target|ratio.*)$"),
    ),
    unordered=(("a Perfetto trace's packets, compared as a set: their order and lanes follow the times",
                r"\.pftrace$"),),
))


def describe_masks(literals: dict[str, str]) -> str:
    """The masks as printed before the table: a reader sees what was ignored."""
    lines = ["masks (everything else must be the same, byte for byte once decompressed):",
             "  both profiles: each side's own paths and names replaced first:"]
    lines += [f"    {what} -> {placeholder}" for what, placeholder in literals.items()]
    for masks, shown in ((STRICT, STRICT), (MEASURED, _added(MEASURED, STRICT))):
        lines.append(f"  {masks.name}" + (" (adds to strict)" if masks is MEASURED else "") + ":")
        lines += [f"    text   /{rx}/ -> {rep}  ({why})" for why, rx, rep in shown.text]
        lines += [f"    key    /{rx}/ -> {MASKED}  ({why})" for why, rx in shown.keys]
        lines += [f"    list   /{rx}/ sorted  ({why})" for why, rx in shown.ranked]
        lines += [f"    column /{rx}/ -> {MASKED}  ({why})" for why, rx in shown.columns]
        lines += [f"    file   /{rx}/ records as a set  ({why})" for why, rx in shown.unordered]
    return "\n".join(lines)


def _added(masks: Masks, base: Masks) -> Masks:
    return Masks(masks.name, tuple(t for t in masks.text if t not in base.text),
                 tuple(k for k in masks.keys if k not in base.keys), masks.ranked, masks.columns, masks.unordered)


# ---------------------------------------------------------------------------------------------
# Pure masking and comparison (tests/test_check_same_outputs.py)


def mask_text(text: str, masks: Masks, literals: dict[str, str] | None = None) -> str:
    """Text with the side's own paths replaced (longest first), then every regex mask."""
    for literal in sorted(literals or {}, key=len, reverse=True):
        text = text.replace(literal, (literals or {})[literal])
    for _, rx, rep in masks.text:
        text = re.sub(rx, rep, text)
    return text


def _matches(name: str, entries: tuple[tuple[str, str], ...]) -> bool:
    return any(re.search(rx, name) for _, rx in entries)


def mask_json(obj: Any, masks: Masks, literals: dict[str, str] | None = None) -> Any:
    """A JSON document with masked keys' values replaced, ranked lists sorted and
    every string masked as text. Key order is kept (it is part of the output)."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if _matches(str(k), masks.keys):
                out[k] = MASKED
            elif isinstance(v, list) and _matches(str(k), masks.ranked):
                items = [mask_json(x, masks, literals) for x in v]
                out[k] = sorted(items, key=lambda x: json.dumps(x, sort_keys=True, default=str))
            else:
                out[k] = mask_json(v, masks, literals)
        return out
    if isinstance(obj, list):
        return [mask_json(x, masks, literals) for x in obj]
    if isinstance(obj, str):
        return mask_text(obj, masks, literals)
    return obj


def _same_scalar(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _short(value: Any, width: int = 70) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def json_difference(a: Any, b: Any, path: str = "") -> str | None:
    """The first place two (masked) JSON values differ, as `key path: before -> after`."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            gone = [k for k in a if k not in b]
            new = [k for k in b if k not in a]
            if gone or new:
                return f"{path or '/'}: keys only in base {gone[:3]}, only in head {new[:3]}"
            return f"{path or '/'}: key order {list(a)[:6]} -> {list(b)[:6]}"
        for k in a:
            found = json_difference(a[k], b[k], f"{path}/{k}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = json_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            return f"{path}: {len(a)} items -> {len(b)}"
        return None
    if _same_scalar(a, b):
        return None
    return f"{path or '/'}: {_short(a)} -> {_short(b)}"


def text_difference(a: str, b: str) -> str | None:
    """The first differing line of two (masked) texts, with its number and both versions."""
    al, bl = a.splitlines(), b.splitlines()
    for i, (x, y) in enumerate(zip(al, bl), 1):
        if x != y:
            at = next((j for j in range(min(len(x), len(y))) if x[j] != y[j]), min(len(x), len(y)))
            lo = max(0, at - 30)
            return f"line {i}: {_short(x[lo:])!r} -> {_short(y[lo:])!r}"
    if len(al) != len(bl):
        i = min(len(al), len(bl)) + 1
        extra = al[i - 1] if len(al) > len(bl) else bl[i - 1]
        return f"line {i}: {len(al)} lines -> {len(bl)} ({_short(extra)!r} on one side only)"
    if a != b:
        return "line endings or the final newline differ"
    return None


def csv_difference(a: str, b: str, masks: Masks, literals: tuple[dict[str, str], dict[str, str]]) -> str | None:
    """Two CSV documents compared cell by cell, masked columns (by header) replaced."""
    def cells(text: str, lit: dict[str, str]) -> list[list[str]]:
        rows = list(csv.reader(io.StringIO(text)))
        if not rows:
            return rows
        drop = {i for i, h in enumerate(rows[0]) if _matches(h, masks.columns)}
        strict = Masks(masks.name, tuple(t for t in masks.text if t[2] != "#"), masks.keys)
        return [rows[0]] + [[MASKED if i in drop else mask_text(c, strict, lit) for i, c in enumerate(r)]
                            for r in rows[1:]]
    ca, cb = cells(a, literals[0]), cells(b, literals[1])
    for n, (ra, rb) in enumerate(zip(ca, cb), 1):
        if ra != rb:
            head = ca[0] if ca else []
            for i, (x, y) in enumerate(zip(ra, rb)):
                if x != y:
                    col = head[i] if n > 1 and i < len(head) else f"column {i + 1}"
                    return f"row {n}, {col}: {_short(x)!r} -> {_short(y)!r}"
            return f"row {n}: {len(ra)} cells -> {len(rb)}"
    if len(ca) != len(cb):
        return f"{len(ca)} rows -> {len(cb)}"
    return None


def _decoded(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _parquet_difference(pa_: Path, pb: Path, masks: Masks, literals: tuple[dict[str, str], dict[str, str]]
                        ) -> str | None:
    import pyarrow.parquet as pq

    ta, tb = pq.read_table(pa_), pq.read_table(pb)
    meta = [{k.decode(): mask_text(v.decode(), masks, lit) for k, v in (t.schema.metadata or {}).items()}
            for t, lit in ((ta, literals[0]), (tb, literals[1]))]
    fields = [[(f.name, str(f.type)) for f in t.schema] for t in (ta, tb)]
    if fields[0] != fields[1]:
        return f"schema: {json_difference(fields[0], fields[1])}"
    if meta[0] != meta[1]:
        return f"schema metadata: {json_difference(meta[0], meta[1])}"
    if ta.num_rows != tb.num_rows:
        return f"{ta.num_rows} rows -> {tb.num_rows}"
    for name in ta.column_names:
        if _matches(name, masks.columns):
            continue
        va, vb = ta.column(name).to_pylist(), tb.column(name).to_pylist()
        va = [mask_text(v, masks, literals[0]) if isinstance(v, str) else v for v in va]
        vb = [mask_text(v, masks, literals[1]) if isinstance(v, str) else v for v in vb]
        for i, (x, y) in enumerate(zip(va, vb)):
            if not _same_scalar(x, y):
                return f"column {name}, row {i}: {_short(x)} -> {_short(y)}"
    return None


def _pftrace_text(path: Path) -> str:
    """A Perfetto trace as protobuf text (the same classes kvprof writes it with)."""
    from google.protobuf import text_format
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2

    trace = perfetto_trace_pb2.Trace()
    trace.ParseFromString(path.read_bytes())
    return text_format.MessageToString(trace)


def _packets(text: str) -> list[str]:
    """The top-level records of protobuf text (Perfetto's `packet { ... }`)."""
    return re.findall(r"(?ms)^\S.*?^\}$", text)


def record_set_difference(ra: Sequence[str], rb: Sequence[str], masks: Masks,
                          literals: tuple[dict[str, str], dict[str, str]]) -> str | None:
    """Two lists of records compared as sets of distinct masked records."""
    sa = {mask_text(r, masks, literals[0]) for r in ra}
    sb = {mask_text(r, masks, literals[1]) for r in rb}
    if sa == sb:
        return None
    gone, new = sorted(sa - sb), sorted(sb - sa)
    return (f"{len(gone)} distinct records only in base, {len(new)} only in head; first: "
            f"{_short(gone[0] if gone else new[0], 120)!r}")


def file_format(name: str) -> str:
    """How a file is compared, by its name; a command's stdout by the format it printed
    (the label ends in -json or -csv)."""
    for fmt in ("parquet", "pftrace", "json", "csv"):
        if re.search(rf"\.{fmt}(\.gz)?$|-{fmt}\.stdout$", name):
            return fmt
    return "text"


def file_difference(pa_: Path, pb: Path, masks: Masks, literals: tuple[dict[str, str], dict[str, str]]
                    ) -> str | None:
    """None when two output files are the same after masking, else where they first differ.
    JSON by key, parquet as tables, CSV by cell, Perfetto as protobuf text, gzip decompressed,
    other text by line, anything else by byte."""
    fmt = file_format(pa_.name if pa_.parent.name != "_std" else f"_std/{pa_.name}")
    if fmt == "parquet":
        return _parquet_difference(pa_, pb, masks, literals)
    if fmt == "pftrace":
        ta, tb = _pftrace_text(pa_), _pftrace_text(pb)
        if _matches(pa_.name, masks.unordered):
            return record_set_difference(_packets(ta), _packets(tb), masks, literals)
        return text_difference(mask_text(ta, masks, literals[0]), mask_text(tb, masks, literals[1]))
    da, db = _decoded(pa_), _decoded(pb)
    try:
        sa, sb = da.decode(), db.decode()
    except UnicodeDecodeError:
        return None if da == db else f"binary content differs ({len(da)} -> {len(db)} bytes)"
    if fmt == "json":
        try:
            ja, jb = json.loads(sa), json.loads(sb)
        except ValueError:
            pass  # not JSON (an error message instead): compared as text
        else:
            found = json_difference(mask_json(ja, masks, literals[0]), mask_json(jb, masks, literals[1]))
            if found or masks is not STRICT:
                return found  # measured: by key only (its numbers' digits differ by nature)
    if fmt == "csv" and masks.columns:
        return csv_difference(sa, sb, masks, literals)
    return text_difference(mask_text(sa, masks, literals[0]), mask_text(sb, masks, literals[1]))


@dataclass
class Row:
    name: str
    result: str  # same, differs, missing in base, missing in head
    detail: str = ""


def compare_trees(dirs: tuple[Path, Path], profile_of: Callable[[str], Masks],
                  literals: tuple[dict[str, str], dict[str, str]]) -> list[Row]:
    """One row per file found under either output folder, compared under its command's masks."""
    names = sorted({str(p.relative_to(d)) for d in dirs for p in d.rglob("*") if p.is_file()})
    rows = []
    for name in names:
        a, b = dirs[0] / name, dirs[1] / name
        if not a.is_file() or not b.is_file():
            rows.append(Row(name, "missing in " + ("base" if not a.is_file() else "head")))
            continue
        try:
            found = file_difference(a, b, profile_of(name), literals)
        except Exception as e:  # an unreadable output is a difference, not a crash of the check
            found = f"could not be compared: {type(e).__name__}: {e}"
        rows.append(Row(name, "differs" if found else "same", found or ""))
    return rows


# ---------------------------------------------------------------------------------------------
# The commands


@dataclass
class Task:
    """One kvprof command line run on both sides; {out} is the side's output folder, {in}
    the shared inputs. `measured`: its outputs hold this run's own timings."""

    label: str
    argv: list[str]
    measured: bool
    after_captures: bool = True


# --reference-steps given: on a CPU its default goes on within a time budget, so the step count (and
# every figure counted over the steps) would follow the machine's speed, not the code
SMALL_CAPTURE = ["--tp", "1", "--phase", "decode,prefill", "--batch-sizes", "1", "--prefill-tokens", "8",
                 "--steps", "2", "--reference-steps", "2", "--warmup", "1", "--device", "cpu", "--seed", "0",
                 "--run-id", "fresh", "--no-progress"]
CAPTURES = {  # small model, fixed seed: one per cache layout
    "mha": ["--model", "2x1x64", "--variants", "index_put,two_stream,triton_fused"],
    "paged": ["--model", "2x1x64", "--engine", "vllm", "--variants", "paged_unfused,paged_triton"],
    "mla": ["--model", "deepseek-v2-lite", "--layers", "1", "--variants", "mla_cat_copy,sglang_mla,mla_triton"],
}
BENCH = ["bench", "--device", "cpu", "--variants", "index_put,two_stream,triton_fused", "--shapes", "8x128",
         "--dtypes", "bf16", "--tokens", "1", "--seed", "0", "--no-progress"]
REPORT_SOURCES = ("reference", "nsys", "kineto")
TRACE_FILE = re.compile(r"(\.json\.gz|\.json|\.sqlite|\.nsys-rep)$")
NOT_A_TRACE = re.compile(r"(^|/)(manifest|summary|step_timings|bench)\.json$|(^|/)kvprof-[^/]*\.json$|/logs/")


def analyze_tasks(label: str, target: str, out: str, measured: bool, every_form: bool) -> list[Task]:
    """analyze's table and its four files; with every_form also the json and csv documents
    on stdout and the Perfetto trace."""
    tasks = [Task(f"{label}.analyze", ["analyze", target, "--out", f"{out}/{label}.analyze"], measured)]
    if every_form:
        tasks += [
            Task(f"{label}.analyze-json", ["analyze", target, "--no-files", "--format", "json"], measured),
            Task(f"{label}.analyze-csv", ["analyze", target, "--no-files", "--format", "csv"], measured),
            Task(f"{label}.analyze-perfetto", ["analyze", target, "--no-files", "--quiet", "--perfetto",
                                               f"{out}/{label}.analyze-perfetto/run.pftrace"], measured),
        ]
    return tasks


def report_tasks(label: str, folder: str, out: str, measured: bool, sources: Sequence[str]) -> list[Task]:
    tasks = [Task(f"{label}.report", ["report", folder, "--html", f"{out}/{label}.report/report.html"], measured)]
    for src in sources:
        tasks.append(Task(f"{label}.report-{src}", ["report", folder, "--source", src, "--html",
                                                      f"{out}/{label}.report-{src}/report.html"], measured))
    return tasks


def slug(rel: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", rel).strip("_")


def discover_inputs(root: Path) -> tuple[list[str], list[str], list[str]]:
    """The committed samples under traces/ and kvprof/samples/ (relative paths): run or trace
    folders (analyze), trace files (analyze), analysed folders (report)."""
    folders, files, analysed = [], [], []
    for top in ("traces", "kvprof/samples"):
        base = root / top
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            rel = str(p.relative_to(root))
            if p.is_dir() and (p / "summary.json").is_file():
                analysed.append(rel)
            if p.is_dir() and ((p / "manifest.json").is_file() or any(
                    TRACE_FILE.search(c.name) and not NOT_A_TRACE.search(f"/{c.name}") for c in p.iterdir())):
                folders.append(rel)
            elif p.is_file() and TRACE_FILE.search(p.name) and not NOT_A_TRACE.search("/" + rel):
                files.append(rel)
    return folders, files, analysed


def plan(inputs: Path) -> list[Task]:
    """Every command, in order: captures first; the base side's captures are then copied
    into the inputs, which both sides read alike."""
    tasks: list[Task] = []
    for name, args in CAPTURES.items():
        tasks.append(Task(f"capture-{name}", ["capture", *SMALL_CAPTURE, *args, "--out", f"{{out}}/capture-{name}"],
                          True, after_captures=False))
    for name in CAPTURES:
        run = f"{{out}}/capture-{name}/fresh"
        tasks += analyze_tasks(f"own-capture-{name}", run, "{out}", True, every_form=True)
        tasks += report_tasks(f"own-capture-{name}", run, "{out}", True, ())
    folders, files, analysed = discover_inputs(inputs)
    folders += [f"fresh/capture-{name}/fresh" for name in CAPTURES]
    analysed += [f"fresh/capture-{name}/fresh" for name in CAPTURES]
    for rel in folders:
        tasks += analyze_tasks(f"in-{slug(rel)}", f"{{in}}/{rel}", "{out}", False, every_form=True)
        tasks += report_tasks(f"in-{slug(rel)}.analyze", f"{{out}}/in-{slug(rel)}.analyze", "{out}", False, ())
    for rel in files:
        tasks += analyze_tasks(f"in-{slug(rel)}", f"{{in}}/{rel}", "{out}", False, every_form=False)
    for rel in analysed:
        tasks += report_tasks(f"in-{slug(rel)}.given", f"{{in}}/{rel}", "{out}", False, REPORT_SOURCES)
    tasks.append(Task("bench", [*BENCH, "--out", "{out}/bench"], True))
    tasks.append(Task("bench-json", [*BENCH, "--format", "json", "--out", "{out}/bench-json"], True))
    tasks.append(Task("bench-csv", [*BENCH, "--format", "csv", "--out", "{out}/bench-csv"], True))
    return tasks


# ---------------------------------------------------------------------------------------------
# Running both sides


class Usage(Exception):
    """Bad usage: one line, exit 2."""


class Stopped(Exception):
    """Ctrl-C or SIGTERM: end every child, remove the worktrees."""


@dataclass
class Side:
    name: str
    ref: str  # what the user named ("" = the working tree)
    src: Path
    out: Path
    helps: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # per command label


class Runner:
    """Runs kvprof commands as child processes in their own process groups, so that an
    interrupt ends each of them and its children."""

    def __init__(self, inputs: Path, timeout: float):
        self.inputs, self.timeout = inputs, timeout
        self.children: set[subprocess.Popen[bytes]] = set()
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def env(self, side: Side) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVPROF_")}
        env.update(PYTHONPATH=str(side.src), TRITON_INTERPRET="1", COLUMNS="1000", LINES="50", TZ="UTC",
                   PYTHONHASHSEED="0", XDG_CACHE_HOME=str(side.out.parent / f"cache-{side.name}"))
        return env

    def run(self, side: Side, argv: Sequence[str]) -> tuple[int, bytes, bytes]:
        if self.stopping.is_set():
            raise Stopped
        proc = subprocess.Popen([sys.executable, "-m", "kvprof", *argv], cwd=side.src, env=self.env(side),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        with self.lock:
            self.children.add(proc)
            if self.stopping.is_set():
                self.kill(proc)
        try:
            out, err = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.kill(proc)
            out, err = proc.communicate()
            err += f"\n[check_same_outputs: killed after {self.timeout:.0f} s]\n".encode()
        finally:
            with self.lock:
                self.children.discard(proc)
        if self.stopping.is_set():
            raise Stopped
        return proc.returncode, out, err

    @staticmethod
    def kill(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def stop(self) -> None:
        self.stopping.set()
        with self.lock:
            for proc in list(self.children):
                self.kill(proc)


def help_texts(runner: Runner, side: Side) -> dict[str, str]:
    """`kvprof --help` and each subcommand's, to tell a command or flag that a side lacks."""
    rc, out, err = runner.run(side, ["--help"])
    helps = {"": out.decode(errors="replace")}
    for cmd in ("capture", "analyze", "report", "bench"):
        rc, out, _ = runner.run(side, [cmd, "--help"])
        helps[cmd] = out.decode(errors="replace") if rc == 0 else ""
    return helps


def missing_parts(helps: dict[str, str], argv: Sequence[str]) -> str | None:
    """What of a command line a side's kvprof does not offer (subcommand or flag), or None."""
    cmd = argv[0]
    if not re.search(rf"^\s+{cmd}\s", helps.get("", ""), re.M) or not helps.get(cmd):
        return f"kvprof has no `{cmd}` command"
    flags = [a for a in argv[1:] if a.startswith("--")]
    absent = [f for f in flags if not re.search(rf"{re.escape(f)}\b", helps[cmd])]
    return f"`kvprof {cmd}` has no {', '.join(absent)}" if absent else None


def expand(argv: Sequence[str], side: Side, inputs: Path) -> list[str]:
    return [a.replace("{out}", str(side.out)).replace("{in}", str(inputs)) for a in argv]


def run_side(runner: Runner, side: Side, tasks: Sequence[Task], absent: dict[str, str],
             log: Callable[[str], None]) -> None:
    """Run a side's commands in order, saving stdout, stderr and the exit code per command."""
    std = side.out / "_std"
    std.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        if task.label in absent:
            continue
        argv = expand(task.argv, side, runner.inputs)
        for arg in argv:  # the folder of a file argument such as --perfetto's must exist
            if arg.endswith((".pftrace", ".html")):
                Path(arg).parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        rc, out, err = runner.run(side, argv)
        side.seconds[task.label] = time.monotonic() - start
        (std / f"{task.label}.stdout").write_bytes(out)
        (std / f"{task.label}.stderr").write_bytes(err)
        (std / f"{task.label}.exit").write_text(f"{rc}\n")
        if rc != 0 and task.label.startswith("capture-"):
            log(f"  {side.name}: {task.label} exited {rc}")


def run_both(runner: Runner, sides: Sequence[Side], tasks: Sequence[Task], absent: dict[str, str],
             log: Callable[[str], None]) -> None:
    """The two sides side by side (a thread each, one command at a time each)."""
    errors: list[BaseException] = []

    def work(side: Side) -> None:
        try:
            run_side(runner, side, tasks, absent, log)
        except BaseException as e:  # handed to the main thread
            errors.append(e)
            runner.stop()

    threads = [threading.Thread(target=work, args=(s,), daemon=True) for s in sides]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except BaseException:  # Ctrl-C or SIGTERM in this thread: end the children, then the threads
        runner.stop()
        for t in threads:
            t.join(30)
        raise
    if errors:
        raise errors[0]


def git(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        raise Usage(f"git {' '.join(args)}: {last}")
    return proc.stdout.strip()


def resolve(ref: str) -> str:
    proc = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise Usage(f"{ref!r} is not a commit of this repository")
    return proc.stdout.strip()


@contextlib.contextmanager
def worktrees(tmp: Path, refs: dict[str, str]) -> Iterator[dict[str, Path]]:
    """Detached worktrees of the given commits, removed whatever happens."""
    made: list[Path] = []
    try:
        paths = {}
        for name, commit in refs.items():
            path = tmp / f"src-{name}"
            git("worktree", "add", "--detach", "--quiet", str(path), commit)
            made.append(path)
            paths[name] = path
        yield paths
    finally:
        for path in made:
            git("worktree", "remove", "--force", str(path), check=False)
        git("worktree", "prune", check=False)


def copy_inputs(src: Path, dest: Path) -> None:
    """The committed samples of the base side (links kept: kvprof/samples links into traces/)."""
    for top in ("traces", "kvprof/samples"):
        if (src / top).is_dir():
            shutil.copytree(src / top, dest / top, symlinks=True)


def profile_for(tasks: Sequence[Task]) -> Callable[[str], Masks]:
    measured = {t.label for t in tasks if t.measured}

    def profile_of(name: str) -> Masks:
        first = name.split("/", 1)
        label = first[1].rsplit(".", 1)[0] if first[0] == "_std" else first[0]
        return MEASURED if label in measured else STRICT
    return profile_of


def render(rows: Sequence[Row], absent: dict[str, str]) -> str:
    width = max([len(r.name) for r in rows] + [4])
    lines = [f"{'file':<{width}}  result           first difference", "-" * (width + 40)]
    for r in rows:
        lines.append(f"{r.name:<{width}}  {r.result:<15}  {r.detail}".rstrip())
    for label, why in absent.items():
        lines.append(f"{label:<{width}}  {'not run':<15}  {why}")
    return "\n".join(lines)


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a regular expression ({e})") from None
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> Any:  # one line, exit 2
            raise Usage(message)

    p = Parser(description="Run the same kvprof commands at two refs and compare every output after masking "
                           "timings, dates, paths and versions.")
    p.add_argument("--base", required=True, help="the ref before the change")
    p.add_argument("--head", help="the ref after it (default: this repository's working tree)")
    p.add_argument("--keep", metavar="DIR", help="keep both sides' outputs in DIR (must not exist) to look at them")
    p.add_argument("--timeout", type=_seconds, default=600, help="seconds per command (default 600)")
    p.add_argument("--only", metavar="REGEX", type=_regex,
                   help="run only the commands whose label matches (to look into one)")
    p.add_argument("--differences-only", action="store_true", help="list only the files that are not the same")
    return p.parse_args(argv)


def check(args: argparse.Namespace, tmp: Path, log: Callable[[str], None]) -> int:
    refs = {"base": resolve(args.base)}
    if args.head:
        refs["head"] = resolve(args.head)
    if args.keep and Path(args.keep).exists():
        raise Usage(f"--keep {args.keep}: already exists")
    inputs = tmp / "inputs"
    runner = Runner(inputs, args.timeout)
    started = time.monotonic()
    with worktrees(tmp, refs) as trees:
        sides = [Side("base", args.base, trees["base"], tmp / "out-base"),
                 Side("head", args.head or "", trees.get("head", REPO), tmp / "out-head")]
        for s in sides:
            s.out.mkdir()
            s.helps = help_texts(runner, s)
        copy_inputs(trees["base"], inputs)
        tasks = plan(inputs)
        if args.only:
            tasks = [t for t in tasks if re.search(args.only, t.label)]
        absent = {}
        for t in tasks:
            for s in sides:
                why = missing_parts(s.helps, t.argv)
                if why:
                    absent[t.label] = f"{why} at {s.name} ({s.ref or 'working tree'})"
        log(f"{len(tasks)} commands per side ({len(absent)} not run); base {args.base} = {refs['base'][:10]}, "
            f"head {args.head or 'working tree'}" + (f" = {refs['head'][:10]}" if args.head else ""))
        run_both(runner, sides, [t for t in tasks if not t.after_captures], absent, log)
        base_fresh = sides[0].out
        for name in CAPTURES:
            run = base_fresh / f"capture-{name}" / "fresh"
            if run.is_dir():
                shutil.copytree(run, inputs / "fresh" / f"capture-{name}" / "fresh", symlinks=True)
        run_both(runner, sides, [t for t in tasks if t.after_captures], absent, log)
        host = socket.gethostname()
        literals = tuple({str(s.out): "<OUT>", str(s.src): "<SRC>", str(inputs): "<IN>", str(tmp): "<TMP>",
                          **({host: "<host>"} if host else {})} for s in sides)
        rows = compare_trees((sides[0].out, sides[1].out), profile_for(tasks), literals)  # type: ignore[arg-type]
        if args.keep:
            shutil.copytree(tmp, args.keep, symlinks=True, ignore=shutil.ignore_patterns("src-*"))
    elapsed = time.monotonic() - started
    shown = [r for r in rows if r.result != "same"] if args.differences_only else rows
    print(describe_masks({"the side's output folder": "<OUT>", "the side's source tree": "<SRC>",
                          "the shared inputs": "<IN>", "the temporary folder": "<TMP>", "the host name": "<host>"}))
    print()
    print(render(shown, absent))
    counts = {k: sum(r.result.startswith(k) for r in rows) for k in ("same", "differs", "missing")}
    ok = counts["differs"] == 0 and counts["missing"] == 0 and not absent
    print()
    print(f"{'SAME' if ok else 'DIFFERENT'}: {len(rows)} files compared, {counts['same']} same, "
          f"{counts['differs']} differ, {counts['missing']} missing on one side, {len(absent)} commands not run; "
          f"base {args.base} vs head {args.head or 'working tree'}; {elapsed:.0f} s "
          f"(commands: base {sum(sides[0].seconds.values()):.0f} s, head {sum(sides[1].seconds.values()):.0f} s)")
    slowest = sorted(sides[0].seconds.items(), key=lambda kv: -kv[1])[:8]
    log("slowest commands (base side): " + ", ".join(f"{k} {v:.1f} s" for k, v in slowest))
    if args.keep:
        print(f"outputs kept in {args.keep}")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def on_term(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        args = parse_args(argv)
        git("rev-parse", "--show-toplevel")
        with tempfile.TemporaryDirectory(prefix="kvprof-same-") as tmp:
            return check(args, Path(tmp), log)
    except Usage as e:
        print(f"check_same_outputs.py: error: {e}", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, Stopped):
        print("check_same_outputs.py: interrupted; children ended, worktrees removed", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
