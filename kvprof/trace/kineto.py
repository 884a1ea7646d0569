"""Read a torch.profiler (Kineto) Chrome trace, plain or gzipped, into the event table.

Why it looks the way it does:
- Speed and memory: the events are decoded with msgspec into typed objects that hold only
  the fields kvprof reads (kvprof.trace.kineto_decode); a trace with a value of another
  type is parsed with orjson and one pass copies those fields into plain lists. Names are
  interned (each distinct kernel name is stored once); no per-event object outlives the read.
- Size guard: the decompressed bytes are read in chunks while counting events, so a
  trace too large to parse on this machine is refused (its size, ``max_events``, the
  JSON values one parse would create: kvprof.trace.kineto_io) before it is parsed,
  with a one-line message rather than an out-of-memory kill.
- Clock: ``ts`` is microseconds. Current torch writes it relative to
  ``baseTimeNanoseconds`` (which is not the trace start: it can be weeks earlier, so
  ``ts`` *looks* absolute); older traces wrote unix microseconds and no base. Both are
  detected from the values, and ``Trace.clock`` says which one was found.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from kvprof.core.devices import CAPTURE_METADATA
from kvprof.core.errors import TraceError
from kvprof.core.run import TraceMeta
from kvprof.core.schema import DEFAULT_MAX_EVENTS, KINDS
from kvprof.trace.kineto_decode import decode_events
from kvprof.trace.kineto_fields import (  # what both readers of the events read, and how
    ARG_CODES as _ARG_CODES,
    CODE_OF_CAT as _CODE_OF_CAT,
    FLOW_CATS as _FLOW_CATS,
    GPU_CODES as _GPU_CODES,
    MAX_US as _MAX_US,
    MEMCPY as _MEMCPY,
    MEMSET as _MEMSET,
    OTHER as _OTHER,
    OTHER_CATS_LISTED,
    SKIPPED_CATS,
    id_or_unknown as _int,
    stream_of_tid as _stream_of_tid,
)
from kvprof.trace.kineto_io import (
    I64_MAX,
    SPLIT_MIN_BYTES,
    event_batches,
    parse_document,
    read_bytes,
    split_events,
)
from kvprof.trace.model import Trace
from kvprof.trace.sanitize import reader_warnings
from kvprof.trace.table import build_table

# Plausible wall-clock range for epoch nanoseconds (2015 .. 2100).
_EPOCH_MIN_NS, _EPOCH_MAX_NS = 1.42e18, 4.1e18


def _i64_array(values: list[Any]) -> np.ndarray:
    """int64 column; the rare value that does not fit becomes -1 (checked only on overflow)."""
    try:
        return np.asarray(values, dtype=np.int64)
    except (OverflowError, TypeError, ValueError):
        return np.asarray([_int(v) for v in values], dtype=np.int64)


def _dims(v: Any) -> str | None:
    """A launch grid or block as "x,y,z"; None unless it is a list of numbers."""
    if isinstance(v, (list, tuple)) and all(x.__class__ in (int, float) for x in v):
        return ",".join(str(x) for x in v)
    return None


def clock_of(min_ts_us: float, base_ns: Any) -> dict[str, Any]:
    """Which origin ``ts`` has: unix time, ``baseTimeNanoseconds``, or unknown (see module doc)."""
    clock: dict[str, Any] = {"unit": "ns", "source_unit": "us", "base_time_ns": base_ns}
    first_ns = min_ts_us * 1000.0
    if _EPOCH_MIN_NS < first_ns < _EPOCH_MAX_NS:
        clock.update(form="unix", epoch_offset_ns=0)
    elif isinstance(base_ns, (int, float)) and _EPOCH_MIN_NS < base_ns + first_ns < _EPOCH_MAX_NS:
        clock.update(form="relative_to_base", epoch_offset_ns=int(base_ns))
    else:
        clock.update(form="unknown", epoch_offset_ns=None)
    return clock


def _to_ns(ts_us: np.ndarray) -> tuple[np.ndarray, float]:
    """Microsecond floats -> int64 ns without losing the sub-µs digits of large values."""
    if not len(ts_us):
        return ts_us.astype(np.int64), 0.0
    origin = float(np.floor(np.nanmin(ts_us)))
    rel = np.rint((ts_us - origin) * 1000.0).astype(np.int64)
    return rel + np.int64(origin) * 1000, origin


def events_from_document(  # noqa: C901 (the per-event loop stays in one frame: a call per event slows multi-GB reads)
    doc: dict[str, Any], batches: Iterable[list[Any]] | None = None
) -> tuple[dict[str, Any], int, dict[str, int]]:
    """One pass over ``traceEvents`` (or over ``batches`` of it) into columns; consumes the lists."""
    events: list[Any] = doc["traceEvents"]
    names: dict[str, int] = {}
    dims: dict[str, int] = {}
    kind_l: list[int] = []
    name_l: list[int] = []
    pid_l: list[int] = []
    tid_l: list[int] = []
    ts_l: list[float] = []
    dur_l: list[float] = []
    dev_l: list[int] = []
    stream_l: list[int] = []
    corr_l: list[int] = []
    node_l: list[int] = []
    grid_l: list[int] = []
    block_l: list[int] = []
    bytes_l: list[int] = []
    flows: dict[tuple[int, int, float], int] = {}
    other_cats: dict[str, int] = {}
    stats = {"skipped": 0, "non_complete": 0, "malformed": 0, "not_a_number": 0, "out_of_range": 0}
    code_of_cat = _CODE_OF_CAT
    arg_codes = _ARG_CODES
    gpu_codes = _GPU_CODES
    names_setdefault = names.setdefault
    dims_setdefault = dims.setdefault
    # Event lists come one batch at a time (see split_events) or as the whole list; each
    # is walked from the end and popped, so an event's dict is freed as soon as it is read.
    for batch in (batches if batches is not None else [events]):
        batch.reverse()
        pop = batch.pop
        for _ in range(len(batch)):
            e = pop()
            if e.__class__ is not dict:
                stats["malformed"] += 1
                continue
            ph = e.get("ph")
            if ph != "X":
                if ph == "f" and (fcat := e.get("cat")).__class__ is str and fcat in _FLOW_CATS:
                    fts = e.get("ts")
                    if fts.__class__ in (int, float):
                        flows[(_int(e.get("pid")), _int(e.get("tid")), fts)] = _int(e.get("id"))
                    else:
                        stats["malformed"] += 1
                else:
                    stats["non_complete"] += 1
                continue
            cat = e.get("cat")
            if cat.__class__ is not str:
                cat = None if cat is None else ""  # a list or number: not a category kvprof knows
            code = code_of_cat.get(cat)
            if code is None:
                if cat in SKIPPED_CATS:
                    stats["skipped"] += 1
                    continue
                code = _OTHER
                other_cats[str(cat)] = other_cats.get(str(cat), 0) + 1
            ts = e.get("ts")
            dur = e.get("dur")
            # text, true/false, null or a missing value is no time: never read as 0 (bool is
            # not int by __class__)
            if ts.__class__ not in (int, float) or dur.__class__ not in (int, float):
                stats["not_a_number"] += 1
                continue
            if not (-_MAX_US < ts < _MAX_US and -_MAX_US < dur < _MAX_US):  # NaN fails too
                stats["out_of_range"] += 1
                continue
            name = e.get("name")
            if name.__class__ is not str:  # a number keeps its digits; a list or object is no name
                name = str(name) if name.__class__ in (int, float, bool) else ""
            kind_l.append(code)
            name_l.append(names_setdefault(name, len(names)))
            pid = e.get("pid")
            tid = e.get("tid")
            pid_l.append(pid if pid.__class__ is int else _int(pid))
            tid_l.append(tid if tid.__class__ is int else _int(tid))
            ts_l.append(ts)
            dur_l.append(dur)
            if code in arg_codes:
                args = e.get("args")
                if args.__class__ is not dict:
                    args = {}
                corr_l.append(_int(args.get("correlation", -1)))
                if code in gpu_codes:
                    dev_l.append(_int(args.get("device", pid)))
                    stream_l.append(_int(args["stream"] if "stream" in args else _stream_of_tid(tid)))
                    node_l.append(_int(args.get("graph node id", args.get("graphNodeId", -1))))
                    g = _dims(args.get("grid"))
                    b = _dims(args.get("block"))
                    grid_l.append(-1 if g is None else dims_setdefault(g, len(dims)))
                    block_l.append(-1 if b is None else dims_setdefault(b, len(dims)))
                    bytes_l.append(_int(args.get("bytes", -1)) if code in (_MEMCPY, _MEMSET) else -1)
                    continue
            else:
                corr_l.append(-1)
            dev_l.append(-1)
            stream_l.append(-1)
            node_l.append(-1)
            grid_l.append(-1)
            block_l.append(-1)
            bytes_l.append(-1)
    n = len(kind_l)
    cols = {
        "kind": np.asarray(kind_l, dtype=np.int32),
        "name": np.asarray(name_l, dtype=np.int32),
        "pid": _i64_array(pid_l),
        "tid": _i64_array(tid_l),
        "ts_us": np.asarray(ts_l, dtype=np.float64),
        "dur_us": np.asarray(dur_l, dtype=np.float64),
        "device": np.asarray(dev_l, dtype=np.int32),
        "stream": np.asarray(stream_l, dtype=np.int64),
        "correlation": np.asarray(corr_l, dtype=np.int64),
        "graph_node": np.asarray(node_l, dtype=np.int64),
        "grid": np.asarray(grid_l, dtype=np.int32),
        "block": np.asarray(block_l, dtype=np.int32),
        "bytes": np.asarray(bytes_l, dtype=np.int64),
        "_names": list(names),
        "_dims": list(dims),
        "_flows": flows,
        "_other_cats": other_cats,
    }
    return cols, n, stats


def _resolve_flow_correlations(cols: dict[str, Any]) -> int:
    """GPU rows without ``args.correlation`` (older traces): take the ac2g flow id bound to them."""
    flows = cols["_flows"]
    if not flows:
        return 0
    kind = cols["kind"]
    corr = cols["correlation"]
    missing = np.flatnonzero((corr < 0) & np.isin(kind, list(_GPU_CODES)))
    fixed = 0
    for i in missing:
        fid = flows.get((int(cols["pid"][i]), int(cols["tid"][i]), float(cols["ts_us"][i])))
        if fid is None:
            fid = flows.get((int(cols["pid"][i]), int(cols["tid"][i]), int(cols["ts_us"][i])))
        if fid is not None:
            corr[i] = fid
            fixed += 1
    return fixed


def devices_of(doc: dict[str, Any], meta: TraceMeta | None) -> list[dict[str, Any]]:
    """deviceProperties, with the capture's measured peak/copy rates where it gave them."""
    out = []
    kv_dev = meta.device if meta is not None else {}
    props = doc.get("deviceProperties")
    for d in props if isinstance(props, list) else []:
        if not isinstance(d, dict):
            continue
        out.append({
            "id": _int(d.get("id", 0)),
            "name": d.get("name") if isinstance(d.get("name"), str) else None,
            "sms": _count(d.get("numSms")),
            "memory_bytes": _count(d.get("totalGlobalMem")),
            "peak_bandwidth_gbs": kv_dev.get("peak_bandwidth_gbs"),
            "peak_bandwidth_source": _peak_source(kv_dev),
            "copy_rate_gbs": kv_dev.get("copy_rate_gbs"),
        })
    if not out and kv_dev:
        out.append({"id": 0, "name": kv_dev.get("name"), "sms": None, "memory_bytes": None,
                    "peak_bandwidth_gbs": kv_dev.get("peak_bandwidth_gbs"),
                    "peak_bandwidth_source": _peak_source(kv_dev), "copy_rate_gbs": kv_dev.get("copy_rate_gbs")})
    return out


def _peak_source(kv_dev: dict[str, Any]) -> str | None:
    """Where the capture's peak came from, as it recorded it (runs from before it did: capture metadata)."""
    if not kv_dev.get("peak_bandwidth_gbs"):
        return None
    src = kv_dev.get("peak_bandwidth_source")
    return src if isinstance(src, str) and src else CAPTURE_METADATA


def _count(v: Any) -> int | None:
    """A non-negative integer property, or None (a string or a list is not a count)."""
    return v if v.__class__ is int and 0 <= v <= I64_MAX else None


def _kvprof_meta(doc: dict[str, Any]) -> dict[str, Any] | None:
    meta = doc.get("kvprof")
    if isinstance(meta, str):  # written as a JSON string by some torch versions
        try:
            meta = orjson.loads(meta)
        except orjson.JSONDecodeError:
            return None
    return meta if isinstance(meta, dict) else None


def read_kineto(path: str | os.PathLike[str], max_events: int = DEFAULT_MAX_EVENTS) -> Trace:
    """Load one Kineto trace; write columns are left unset (see kvprof.trace.attribution).

    The cyclic garbage collector is paused while the events are parsed and copied: it
    would otherwise scan the hundreds of thousands of young dicts orjson makes, over and
    over, for cycles they cannot have (a quarter of the load time on a 126 MB trace).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _read_kineto(path, max_events)
    finally:
        if was_enabled:
            gc.enable()


def _read_kineto(path: str | os.PathLike[str], max_events: int) -> Trace:
    p = Path(path)
    data = read_bytes(p, max_events)
    decoded = decode_events(data, max_events)  # None: a value it does not type; read below
    split = split_events(data, p.name, max_events) if decoded is None and len(data) > SPLIT_MIN_BYTES else None
    cols = None
    if decoded is not None:
        doc, cols, n, stats, total = decoded
        if total == 0:
            raise TraceError(f"{p.name}: empty trace (traceEvents is empty)")
    elif split is not None:
        doc, starts, _, rb = split
        total = len(starts)
        if total == 0:
            raise TraceError(f"{p.name}: empty trace (traceEvents is empty)")
        try:
            cols, n, stats = events_from_document(doc, event_batches(data, starts, rb, p.name, max_events))
        except orjson.JSONDecodeError:
            cols = None  # not Kineto's layout after all: parse it whole below
    if cols is None:
        doc = parse_document(data, p.name, max_events)
        total = len(doc["traceEvents"])
        if total == 0:
            raise TraceError(f"{p.name}: empty trace (traceEvents is empty)")
        del data
        cols, n, stats = events_from_document(doc)
    else:
        del data
    if n == 0:
        raise TraceError(f"{p.name}: no complete events among {total:,} trace events: nothing was profiled")
    stats["events_in_file"] = total
    stats["flow_correlations"] = _resolve_flow_correlations(cols)
    schema: dict[str, Any] = {}  # what names a trace whose events kvprof cannot read (kvprof.analysis.generic)
    if cols["_other_cats"]:
        schema["other_categories"] = dict(sorted(cols["_other_cats"].items(), key=lambda kv: -kv[1])
                                          [:OTHER_CATS_LISTED])
    version = doc.get("schemaVersion")
    if version.__class__ in (int, str):
        schema["schema_version"] = version
    start_ns, _ = _to_ns(cols["ts_us"])
    dur_ns = np.rint(cols["dur_us"] * 1000.0).astype(np.int64)
    warnings = reader_warnings(stats, int((dur_ns < 0).sum()), start_ns, dur_ns)
    dur_ns = np.maximum(dur_ns, 0)
    raw_meta = _kvprof_meta(doc)
    meta = TraceMeta.from_json(raw_meta, warnings) if raw_meta is not None else None
    dist = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rank = _int(dist.get("rank", 0)) if dist else 0
    rank = rank if 0 <= rank < (1 << 31) else 0
    table = build_table(
        {
            "trace": str(p),
            "source": "kineto",
            "rank": max(rank, 0),
            "pid": cols["pid"],
            "tid": cols["tid"],
            "device": cols["device"],
            "stream": cols["stream"],
            "kind": (cols["kind"], list(KINDS)),
            "name": (cols["name"], cols["_names"]),
            "start_ns": start_ns,
            "dur_ns": dur_ns,
            "correlation": cols["correlation"],
            "graph_node": cols["graph_node"],
            "grid": (cols["grid"], cols["_dims"]),
            "block": (cols["block"], cols["_dims"]),
            "bytes": cols["bytes"],
        },
        n,
    )
    clock = clock_of(float(cols["ts_us"].min()), doc.get("baseTimeNanoseconds"))
    trace = Trace(
        events=table,
        source="kineto",
        path=str(p),
        kvprof=meta,
        devices=devices_of(doc, meta),
        clock=clock,
        stats={**stats, **schema},
        warnings=warnings,
    )
    _fill_gpu_pids(trace)
    return trace


def _fill_gpu_pids(trace: Trace) -> None:
    """Kineto GPU rows carry the device as pid; the schema wants the launching process.

    Taken from the runtime/driver call with the same correlation id; with a single host
    process, that process.
    """
    t = trace.events
    kind = np.asarray(t.column("kind").combine_chunks().indices)
    corr = t.column("correlation").to_numpy()
    pid = t.column("pid").to_numpy().copy()
    tid = t.column("tid").to_numpy().copy()
    gpu = np.isin(kind, list(_GPU_CODES))
    if not gpu.any():
        return
    launch = np.isin(kind, [KINDS.index("runtime"), KINDS.index("driver")]) & (corr >= 0)
    host_pids = np.unique(pid[~gpu & (pid >= 0)])
    fill = np.full(int(gpu.sum()), host_pids[0] if len(host_pids) == 1 else -1, dtype=np.int64)
    if launch.any():
        order = np.argsort(corr[launch], kind="stable")
        lc, lp = corr[launch][order], pid[launch][order]
        gc = corr[gpu]
        pos = np.searchsorted(lc, gc)
        pos_c = np.minimum(pos, len(lc) - 1)
        hit = (pos < len(lc)) & (lc[pos_c] == gc) & (gc >= 0)
        fill = np.where(hit, lp[pos_c], fill)
    pid[gpu] = fill
    tid[gpu] = -1
    idx_pid = t.schema.get_field_index("pid")
    idx_tid = t.schema.get_field_index("tid")
    import pyarrow as pa

    t = t.set_column(idx_pid, "pid", pa.array(pid, type=pa.int64()))
    t = t.set_column(idx_tid, "tid", pa.array(tid, type=pa.int64()))
    trace.events = t
