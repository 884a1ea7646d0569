"""Read an Nsight Systems SQLite export (``nsys export --type sqlite``) into the event table.

The export's columns change between Nsight versions and its tables are created lazily
(a capture without memcpys has no memcpy table), so every table is read through its
``PRAGMA table_info``: optional columns are used when present and defaulted when not;
only the kernel table and StringIds are required. A ``.nsys-rep`` is exported first
with the nsys that kvprof.tools.nsys finds.

What is kept beside the events: ``Trace.graph_nodes`` (CUDA_GRAPH_NODE_EVENTS: which
thread created each graph node when, and which captured node an instantiated node was
cloned from), which lets attribution tie replayed kernels to the NVTX range that was
open when their node was captured.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvprof.core.devices import NSYS_DEVICE_INFO
from kvprof.core.errors import TraceError
from kvprof.core.files import open_regular
from kvprof.core.schema import DEFAULT_MAX_EVENTS, KINDS, MAX_EVENTS
from kvprof.trace.model import Trace
from kvprof.trace.table import build_table

NVTX_PUSH_POP, NVTX_START_END, NVTX_DOMAIN_CREATE, NVTX_CATEGORY_NAME = 59, 60, 75, 33
KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
_VERSION_SUFFIX = re.compile(r"_v\d+$")
_SQLITE_MAGIC = b"SQLite format 3\x00"


def split_global_id(gid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """nsys serialized globalTid/globalPid -> (pid, tid): bits 24..47 and 0..23."""
    gid = np.asarray(gid, dtype=np.int64)
    return (gid >> 24) & 0xFFFFFF, gid & 0xFFFFFF


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in db.execute(f"PRAGMA table_info([{table}])")}


# every other column kvprof reads holds numbers
TEXT_COLUMNS = frozenset({"text", "name", "name_", "deviceName", "chipName"})
_I64_LIMIT = 9.0e18


def _numeric(s: pd.Series) -> pd.Series:
    """Numbers as float or int; text, blobs and values beyond int64 become missing (NaN).

    SQLite columns are not typed: an export edited by hand (or by a hostile tool) can hold
    text where nsys writes integers, and ``int("abc")`` would end in a traceback.
    """
    if s.dtype.kind in "iu":
        return s
    num = pd.to_numeric(s.map(lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool) else None),
                        errors="coerce")
    return num.where(num.abs() < _I64_LIMIT)


def _select(db: sqlite3.Connection, table: str, wanted: dict[str, str], where: str = "") -> pd.DataFrame:
    """SELECT the wanted columns that exist; missing ones come back as the given SQL default."""
    have = _columns(db, table)
    parts = [f"[{c}]" if c in have else f"{default} AS [{c}]" for c, default in wanted.items()]
    sql = f"SELECT {', '.join(parts)} FROM [{table}] {where}"
    rows = db.execute(sql).fetchall()
    df = pd.DataFrame.from_records(rows, columns=list(wanted))
    for c in wanted:
        if c not in TEXT_COLUMNS:
            df[c] = _numeric(df[c])
    return df


def _i64(s: pd.Series, default: int = -1) -> np.ndarray:
    values: np.ndarray = pd.to_numeric(s, errors="coerce").fillna(default).to_numpy(dtype=np.int64)
    return values


def _unrecorded(n: int) -> np.ndarray:
    """``n`` int64 -1s: "not recorded" in a column that only the other source (GPU or host) fills."""
    return np.full(n, -1, np.int64)


def open_export(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """Open read-only after checking it is SQLite and an nsys export with a kernel table."""
    p = Path(path)
    try:
        with open_regular(p) as f:
            magic = f.read(16)
    except OSError as exc:
        raise TraceError(f"cannot read {p}: {exc.strerror or exc}") from None
    if magic != _SQLITE_MAGIC:
        raise TraceError(f"{p.name}: not an SQLite file")
    try:
        db = sqlite3.connect(f"{p.resolve().as_uri()}?mode=ro", uri=True)
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as exc:
        raise TraceError(f"{p.name}: unreadable SQLite file ({exc})") from None
    if "StringIds" not in tables or not any(t.startswith(("CUPTI_", "NVTX_", "TARGET_INFO")) for t in tables):
        db.close()
        raise TraceError(f"{p.name}: SQLite but not an Nsight Systems export (no StringIds/CUPTI tables)")
    if KERNEL_TABLE not in tables:
        db.close()
        raise TraceError(
            f"{p.name}: nsys export without {KERNEL_TABLE}: no GPU kernels were traced "
            "(capture with `nsys profile -t cuda,nvtx`)"
        )
    return db


class _Names:
    """Interning table shared by every string column (StringIds values included)."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}

    def code(self, value: str | None) -> int:
        if value is None or value.__class__ is not str:
            return -1  # None / NaN from pandas
        return self.codes.setdefault(value, len(self.codes))

    def codes_of(self, values: pd.Series) -> np.ndarray:
        return np.fromiter((self.code(v) for v in values), dtype=np.int32, count=len(values))

    @property
    def values(self) -> list[str]:
        return list(self.codes)


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    return "" if v is None else str(v)


def _strings(db: sqlite3.Connection) -> dict[int, str]:
    """StringIds as id -> text (a number or blob stored as a value becomes its text)."""
    return {i: _text(v) for i, v in db.execute("SELECT id, value FROM StringIds") if isinstance(i, int)}


def _tables(db: sqlite3.Connection) -> set[str]:
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def _gpu_frame(db: sqlite3.Connection, table: str, kind: str, strings: dict[int, str],
               enum: dict[int, str]) -> pd.DataFrame:
    wanted = {
        "start": "NULL", "end": "NULL", "deviceId": "-1", "streamId": "-1", "correlationId": "-1",
        "globalPid": "NULL", "graphNodeId": "NULL",
    }
    if kind == "kernel":
        wanted.update(demangledName="NULL", shortName="NULL", gridX="NULL", gridY="NULL", gridZ="NULL",
                      blockX="NULL", blockY="NULL", blockZ="NULL")
    elif kind == "memcpy":
        wanted.update(bytes="-1", copyKind="NULL")
    elif kind == "memset":
        wanted.update(bytes="-1")
    elif kind == "sync":
        wanted.update(syncType="NULL")
    df = _select(db, table, wanted)  # rows without a start are counted and dropped by _timed
    if kind == "kernel":
        name_id = df["demangledName"].where(df["demangledName"].notna(), df["shortName"])
        df["name"] = [strings.get(int(i), f"kernel#{int(i)}") if pd.notna(i) else "kernel" for i in name_id]
        grid = df[["gridX", "gridY", "gridZ"]].round().astype("Int64").astype(str)
        block = df[["blockX", "blockY", "blockZ"]].round().astype("Int64").astype(str)
        df["grid"] = (grid["gridX"] + "," + grid["gridY"] + "," + grid["gridZ"]).where(df["gridX"].notna(), None)
        df["block"] = (block["blockX"] + "," + block["blockY"] + ","
                       + block["blockZ"]).where(df["blockX"].notna(), None)
    elif kind == "memcpy":
        df["name"] = ["Memcpy " + enum.get(int(k), "?") if pd.notna(k) else "Memcpy" for k in df["copyKind"]]
    elif kind == "memset":
        df["name"] = "Memset"
    elif kind == "sync":
        df["name"] = [enum.get(int(k), "Synchronization") if pd.notna(k) else "Synchronization" for k in df["syncType"]]
    df["kind"] = kind
    return df


def _enum(db: sqlite3.Connection, tables: set[str], name: str) -> dict[int, str]:
    if name not in tables:
        return {}
    cols = _columns(db, name)
    label = "label" if "label" in cols else "name"
    return {i: _text(v) for i, v in db.execute(f"SELECT id, [{label}] FROM [{name}]") if isinstance(i, int)}


def _nvtx_frame(db: sqlite3.Connection, strings: dict[int, str]) -> tuple[pd.DataFrame, dict[int, str]]:
    wanted = {
        "start": "NULL", "end": "NULL", "eventType": "NULL", "text": "NULL", "textId": "NULL",
        "globalTid": "NULL", "domainId": "0", "category": "NULL", "int64Value": "NULL",
        "uint64Value": "NULL", "int32Value": "NULL", "uint32Value": "NULL",
    }
    df = _select(db, "NVTX_EVENTS", wanted)
    et = pd.to_numeric(df["eventType"], errors="coerce")
    domains = {int(r.domainId): r.text for r in df[et == NVTX_DOMAIN_CREATE].itertuples() if pd.notna(r.domainId)}
    categories = {
        (int(r.domainId), int(r.category)): r.text
        for r in df[et == NVTX_CATEGORY_NAME].itertuples()
        if pd.notna(r.category) and pd.notna(r.domainId)
    }
    rng = df[et.isin([NVTX_PUSH_POP, NVTX_START_END]) & df["end"].notna()].copy()
    text = rng["text"].where(rng["text"].notna(), [strings.get(int(i)) if pd.notna(i) else None for i in rng["textId"]])
    rng["name"] = text.fillna("")
    dom = pd.to_numeric(rng["domainId"], errors="coerce").fillna(0).astype(np.int64)
    rng["domain"] = [domains.get(int(d)) for d in dom]
    rng["category_name"] = [
        categories.get((int(d), int(c))) if pd.notna(c) else None for d, c in zip(dom, rng["category"])
    ]
    payload = rng["int64Value"]
    for alt in ("uint64Value", "int32Value", "uint32Value"):
        payload = payload.where(payload.notna(), rng[alt])
    rng["payload"] = payload
    rng["kind"] = "cpu_annotation"
    return rng, domains


def graph_nodes_of(db: sqlite3.Connection, tables: set[str]) -> pd.DataFrame | None:
    """CUDA_GRAPH_NODE_EVENTS as (node, original, start_ns, pid, tid); None when absent."""
    if "CUDA_GRAPH_NODE_EVENTS" not in tables:
        return None
    df = _select(db, "CUDA_GRAPH_NODE_EVENTS",
                 {"start": "NULL", "globalTid": "NULL", "graphNodeId": "NULL", "originalGraphNodeId": "NULL"},
                 "WHERE graphNodeId IS NOT NULL")
    pid, tid = split_global_id(_i64(df["globalTid"], 0))
    return pd.DataFrame({
        "node": _i64(df["graphNodeId"]),
        "original": _i64(df["originalGraphNodeId"]),
        "start_ns": _i64(df["start"]),
        "pid": np.where(df["globalTid"].notna(), pid, -1),
        "tid": np.where(df["globalTid"].notna(), tid, -1),
    })


# Tables an export describes its GPUs in, across nsys versions, with the columns each may name the id
# and the name by; every column is looked up in the export's own schema before it is read.
DEVICE_TABLES = ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU")
_ID_COLUMNS = ("id", "deviceId", "cuDevice", "cudaId")
_NAME_COLUMNS = ("name", "deviceName", "chipName")


def _devices(db: sqlite3.Connection, tables: set[str]) -> list[dict[str, Any]]:
    """One entry per GPU the export describes (id as the activity tables' deviceId): its name, SMs,
    memory and bandwidth from whichever of DEVICE_TABLES has them, read by the export's own columns."""
    found: dict[int, dict[str, Any]] = {}
    for table in (t for t in DEVICE_TABLES if t in tables):
        cols = _columns(db, table)
        id_col = next((c for c in _ID_COLUMNS if c in cols), None)
        name_col = next((c for c in _NAME_COLUMNS if c in cols), None)
        if id_col is None:
            continue
        df = _select(db, table, {id_col: "0", "name_": "NULL", "smCount": "NULL", "totalMemory": "NULL",
                                 "memoryBandwidth": "NULL"} if name_col is None else
                     {id_col: "0", name_col: "NULL", "smCount": "NULL", "totalMemory": "NULL",
                      "memoryBandwidth": "NULL"})
        for r in df.itertuples(index=False):
            rid = getattr(r, id_col)
            name = getattr(r, name_col) if name_col is not None else None
            if pd.isna(rid):
                continue
            d = found.setdefault(int(rid), {"id": int(rid), "name": None, "sms": None, "memory_bytes": None,
                                            "peak_bandwidth_gbs": None, "peak_bandwidth_source": None,
                                            "copy_rate_gbs": None})
            if d["name"] is None and isinstance(name, str) and name.strip():
                d["name"] = name.strip()
            if d["sms"] is None and pd.notna(r.smCount):
                d["sms"] = int(r.smCount)
            if d["memory_bytes"] is None and pd.notna(r.totalMemory):
                d["memory_bytes"] = int(r.totalMemory)
            bw = float(r.memoryBandwidth) / 1e9 if pd.notna(r.memoryBandwidth) and r.memoryBandwidth else None
            if d["peak_bandwidth_gbs"] is None and bw:
                d.update(peak_bandwidth_gbs=bw, peak_bandwidth_source=NSYS_DEVICE_INFO)
    return [found[k] for k in sorted(found)]


def _clock(db: sqlite3.Connection, tables: set[str]) -> dict[str, Any]:
    clock: dict[str, Any] = {"unit": "ns", "source_unit": "ns", "form": "session", "epoch_offset_ns": None}
    if "TARGET_INFO_SESSION_START_TIME" in tables and "utcEpochNs" in _columns(db, "TARGET_INFO_SESSION_START_TIME"):
        row = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
        if row and isinstance(row[0], int):
            clock["epoch_offset_ns"] = int(row[0])
    return clock


# the tables read into memory row by row
ROW_TABLES = (KERNEL_TABLE, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
              "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS",
              "CUDA_GRAPH_NODE_EVENTS", "StringIds")


def _check_rows(db: sqlite3.Connection, p: Path, max_events: int) -> None:
    """Refuse an export with more rows to read than ``max_events`` before reading any."""
    tables = _tables(db)
    rows = sum(db.execute(f"SELECT COUNT(*) FROM [{t}]").fetchone()[0] for t in ROW_TABLES if t in tables)
    if rows > max_events:
        raise TraceError(f"{p.name}: {rows:,} rows to read, more than {max_events:,} events; too large to load "
                         "here: capture a shorter window, or raise ", MAX_EVENTS, " on a machine with more memory")


def read_nsys_sqlite(path: str | os.PathLike[str], max_events: int = DEFAULT_MAX_EVENTS) -> Trace:
    """Load one nsys SQLite export; write columns are left unset (see attribution)."""
    p = Path(path)
    db = open_export(p)
    try:
        _check_rows(db, p, max_events)
        return _read(db, p)
    except sqlite3.DatabaseError as exc:
        raise TraceError(f"{p.name}: unreadable nsys export ({exc})") from None
    finally:
        db.close()


def _read(db: sqlite3.Connection, p: Path) -> Trace:
    tables = _tables(db)
    strings = _strings(db)
    frames: list[pd.DataFrame] = []
    for table, gpu_kind, enum in (
        (KERNEL_TABLE, "kernel", None),
        ("CUPTI_ACTIVITY_KIND_MEMCPY", "memcpy", "ENUM_CUDA_MEMCPY_OPER"),
        ("CUPTI_ACTIVITY_KIND_MEMSET", "memset", None),
        ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "sync", "ENUM_CUPTI_SYNC_TYPE"),
    ):
        if table in tables:
            frames.append(_gpu_frame(db, table, gpu_kind, strings, _enum(db, tables, enum) if enum else {}))
    gpu = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    host_frames: list[pd.DataFrame] = []
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        rt = _select(db, "CUPTI_ACTIVITY_KIND_RUNTIME", {"start": "NULL", "end": "NULL", "globalTid": "NULL",
                                                         "correlationId": "-1", "nameId": "NULL"})
        raw = [strings.get(int(i), "?") if pd.notna(i) else "?" for i in rt["nameId"]]
        rt_names = [_VERSION_SUFFIX.sub("", s) for s in raw]
        rt["name"] = rt_names
        rt["kind"] = ["runtime" if s.startswith("cuda") or not s.startswith("cu") else "driver" for s in rt_names]
        host_frames.append(rt)
    if "NVTX_EVENTS" in tables:
        nv, _ = _nvtx_frame(db, strings)
        host_frames.append(nv)
    host = pd.concat(host_frames, ignore_index=True) if host_frames else pd.DataFrame()
    # a start or end that is missing, text, a blob or beyond int64 is no time: the row is
    # dropped and counted, never read as 0 or -1 ns
    gpu, untimed_gpu = _timed(gpu)
    host, untimed_host = _timed(host)
    untimed = untimed_gpu + untimed_host
    n_gpu, n_host = len(gpu), len(host)
    if n_gpu + n_host == 0:
        raise TraceError(f"{p.name}: nsys export with no kernels, runtime calls or NVTX ranges")
    names = _Names()
    kinds = list(KINDS)

    def col(df: pd.DataFrame, c: str) -> pd.Series:
        return df[c] if c in df.columns else pd.Series([None] * len(df), dtype=object)

    g_pid, _ = split_global_id(_i64(col(gpu, "globalPid"), 0)) if n_gpu else (np.empty(0, np.int64),) * 2
    h_pid, h_tid = split_global_id(_i64(col(host, "globalTid"), 0)) if n_host else (np.empty(0, np.int64),) * 2
    start = np.concatenate([_i64(col(gpu, "start")), _i64(col(host, "start"))])
    end = np.concatenate([_i64(col(gpu, "end")), _i64(col(host, "end"))])
    kind = np.concatenate([
        np.asarray([kinds.index(k) for k in col(gpu, "kind")], dtype=np.int32),
        np.asarray([kinds.index(k) for k in col(host, "kind")], dtype=np.int32),
    ])
    negative = int((end < start).sum())
    n = n_gpu + n_host
    name_codes = np.concatenate([names.codes_of(col(gpu, "name")), names.codes_of(col(host, "name"))])
    grid = np.concatenate([names.codes_of(col(gpu, "grid")), np.full(n_host, -1, np.int32)])
    block = np.concatenate([names.codes_of(col(gpu, "block")), np.full(n_host, -1, np.int32)])
    domain = np.concatenate([np.full(n_gpu, -1, np.int32), names.codes_of(col(host, "domain"))])
    category = np.concatenate([np.full(n_gpu, -1, np.int32), names.codes_of(col(host, "category_name"))])
    table = build_table(
        {
            "trace": str(p),
            "source": "nsys",
            "rank": 0,
            "pid": np.concatenate([np.where(col(gpu, "globalPid").notna().to_numpy(), g_pid, -1) if n_gpu
                                   else _unrecorded(0), h_pid]),
            "tid": np.concatenate([_unrecorded(n_gpu), h_tid]),
            "device": np.concatenate([_i64(col(gpu, "deviceId")), _unrecorded(n_host)]),
            "stream": np.concatenate([_i64(col(gpu, "streamId")), _unrecorded(n_host)]),
            "kind": (kind, kinds),
            "name": (name_codes, names.values),
            "start_ns": start,
            "dur_ns": np.maximum(end - start, 0),
            "correlation": np.concatenate([_i64(col(gpu, "correlationId")), _i64(col(host, "correlationId"))]),
            "graph_node": np.concatenate([_i64(col(gpu, "graphNodeId")), _unrecorded(n_host)]),
            "grid": (grid, names.values),
            "block": (block, names.values),
            "bytes": np.concatenate([_i64(col(gpu, "bytes")), _unrecorded(n_host)]),
            "payload": np.concatenate([_unrecorded(n_gpu), _i64(col(host, "payload"))]),
            "domain": (domain, names.values),
            "category": (category, names.values),
        },
        n,
    )
    return Trace(
        events=table,
        source="nsys",
        path=str(p),
        kvprof=None,
        devices=_devices(db, tables),
        clock=_clock(db, tables),
        stats={"events_in_file": n, "kernels": int((col(gpu, "kind") == "kernel").sum()) if n_gpu else 0},
        graph_nodes=graph_nodes_of(db, tables),
        warnings=_missing_table_warnings(tables) + (
            [f"{untimed:,} rows skipped: start or end missing or not a number (corrupt export)"]
            if untimed else []) + (
            [f"{negative:,} rows end before they start (corrupt export); their duration counts as 0 ns"]
            if negative else []),
    )


def _timed(df: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """The rows whose start and end are numbers (``_select`` made every other value NaN),
    and how many were not."""
    if df.empty or "start" not in df.columns or "end" not in df.columns:
        return df, 0
    ok = df["start"].notna() & df["end"].notna()
    bad = int((~ok).sum())
    return (df[ok].reset_index(drop=True) if bad else df), bad


def _missing_table_warnings(tables: set[str] | list[str]) -> list[str]:
    """Say what an export cannot give when the profile did not trace it (never a silent hole)."""
    out = []
    if "NVTX_EVENTS" not in tables:
        out.append("no NVTX_EVENTS table (profiled without -t nvtx?): no kvprof write ranges, "
                   "so no per-write numbers, only the generic ones")
    if KERNEL_TABLE not in tables:
        out.append(f"no {KERNEL_TABLE} table: no GPU kernels in this export")
    if "CUPTI_ACTIVITY_KIND_RUNTIME" not in tables:
        out.append("no CUPTI_ACTIVITY_KIND_RUNTIME table (profiled without -t cuda?): kernels cannot be tied to "
                   "the calls and write ranges that launched them, so writes have no GPU time")
    return out
