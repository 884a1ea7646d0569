"""Kineto events decoded straight into the fields kvprof reads, then into columns a field at a time.

Why: orjson makes a Python object of every key and value of a trace (the ``Input Dims``
and ``Concrete Inputs`` of every op included), and a loop then copied the few fields
kvprof keeps out of each event's dict: on a 35 MB trace of others' that was 0.4 s of
CPU before any analysis. msgspec decodes each event into a small typed object holding
only ``_Event``'s fields and skips the rest in C, about three times faster than the
parse alone; the columns are then built one field at a time over a batch (a list
comprehension of attribute reads, converted by numpy/pyarrow), not event by event.

Exactness: where it answers, the result is the one kvprof.trace.kineto's loop over
orjson's dicts gives (the same rules, kvprof.trace.kineto_fields). It answers None, and
the loop reads the trace, when a value is not of the type ``_Event`` declares (a text
or true where a number belongs, an event that is not an object, a ``cat`` list, a name
that is a number), when the text is not UTF-8 (msgspec does not check what it skips;
orjson refuses it), for a bare event list, nesting deeper than msgspec's recursion
limit (below orjson's 1024), a launch dimension past 64 bits or a device id past int32.
msgspec refuses what orjson refuses (NaN, trailing text, lone surrogates).

Memory: torch.profiler's layout (one event per line at one indentation) is decoded
``_CHUNK`` bytes of events at a time and each chunk reduced to its rows before the
next; any other layout is decoded whole only within the JSON values the orjson path
allows one parse (kvprof.trace.kineto_io.check_values). More events than ``max_events``
(objects without "ph", which read_bytes does not count) is left to the orjson path,
which refuses it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import orjson
import pyarrow as pa

from kvprof.core.schema import JSON_VALUES_PER_EVENT
from kvprof.trace.kineto_fields import (
    ARG_CODES,
    CODE_OF_CAT,
    FLOW_CATS,
    GPU_CODES,
    MAX_US,
    MEMCPY,
    MEMSET,
    OTHER,
    SKIPPED_CATS,
    id_or_unknown,
    stream_of_tid,
)
from kvprof.trace.kineto_io import json_values

_INDENT = re.compile(rb"\[[ \t\r\n]*?(\n[ \t]*)\{")  # the first event's line: Kineto may leave a blank line
_ARRAY_END = re.compile(rb"[ \t\r\n]*\]")
_OUTSIDE_MAX = 1 << 20  # bytes around the event array (metadata, a few KB), parsed with orjson
_CHUNK = 4 << 20  # bytes of events decoded at a time
_UNSET = msgspec.UNSET
_OptionalId = int | None | msgspec.UnsetType  # UNSET: the key is missing (null is not)


class _Args(msgspec.Struct, gc=False):
    correlation: int | None = None
    device: _OptionalId = _UNSET  # missing: the event's pid (Kineto's GPU rows carry the device there)
    stream: _OptionalId = _UNSET  # missing: the event's tid
    graph_node_id: _OptionalId = msgspec.field(default=_UNSET, name="graph node id")
    graphNodeId: int | None = None
    grid: tuple[int, ...] | None = None  # tuples: hashable, each distinct one made text once (_dims)
    block: tuple[int, ...] | None = None
    bytes: int | None = None


class _Event(msgspec.Struct, gc=False):
    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None  # an int is read as a float, as the loop's float64 column does
    dur: float | None = None
    id: int | str | None = None
    args: _Args | None = None


class _Document(msgspec.Struct, gc=False):
    """A whole trace: the events, and the keys kvprof.trace.kineto reads, left raw for orjson."""

    traceEvents: list[_Event]
    deviceProperties: msgspec.Raw | msgspec.UnsetType = _UNSET
    distributedInfo: msgspec.Raw | msgspec.UnsetType = _UNSET
    kvprof: msgspec.Raw | msgspec.UnsetType = _UNSET
    baseTimeNanoseconds: msgspec.Raw | msgspec.UnsetType = _UNSET
    schemaVersion: msgspec.Raw | msgspec.UnsetType = _UNSET


_EVENTS = msgspec.json.Decoder(list[_Event])
_DOCUMENT = msgspec.json.Decoder(_Document)
_SKIP = -1  # a category whose complete events are not rows
_CAT_CODE: dict[str | None, int] = {**CODE_OF_CAT, **{c: _SKIP for c in SKIPPED_CATS}}
_I64_MIN = np.iinfo(np.int64).min
_I32 = np.iinfo(np.int32)
_U64_END = 1 << 64  # orjson reads a larger integer as a float


@dataclass
class _Part:
    """One chunk's rows: numbers as arrays, names and launch dimensions as text (interned at the end)."""

    kind: np.ndarray
    name: list[str]
    pid: np.ndarray
    tid: np.ndarray
    ts_us: np.ndarray
    dur_us: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    correlation: np.ndarray
    graph_node: np.ndarray
    grid: np.ndarray  # objects: text or None
    block: np.ndarray
    bytes: np.ndarray


@dataclass
class _Counts:
    stats: dict[str, int] = field(default_factory=lambda: {
        "skipped": 0, "non_complete": 0, "malformed": 0, "not_a_number": 0, "out_of_range": 0})
    flows: dict[tuple[int, int, float], int] = field(default_factory=dict)
    other_cats: dict[str, int] = field(default_factory=dict)  # complete events of categories kvprof does not know
    wide: set[str] = field(default_factory=set)  # "pid"/"tid" when one was past int64


class _NotTyped(Exception):
    """A value this decoder does not read as the loop does: the loop reads the trace."""


def _ids(values: list[Any]) -> np.ndarray:
    """id_or_unknown over a list, converted in C when every value is an int64 or None."""
    try:
        out = pa.array(values, type=pa.int64()).fill_null(-1).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # text, or past int64
        return np.fromiter((id_or_unknown(v) for v in values), dtype=np.int64, count=len(values))
    return np.where(out == _I64_MIN, -1, out)


def _process_ids(values: list[Any]) -> tuple[np.ndarray, bool]:
    """pid/tid as the loop keeps them (kineto._i64_array): an int as it is, anything else
    through id_or_unknown; and whether a value was past int64 (then the loop reads the whole
    column through id_or_unknown, see _columns)."""
    try:
        return pa.array(values, type=pa.int64()).fill_null(-1).to_numpy(), False
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # text, or past int64
        ints = [v if v.__class__ is int else id_or_unknown(v) for v in values]
        if all(_I64_MIN <= v < -_I64_MIN for v in ints):
            return np.asarray(ints, dtype=np.int64), False
        return np.fromiter((id_or_unknown(v) for v in ints), dtype=np.int64, count=len(ints)), True


def _times(values: list[float | None]) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values, which are present): None becomes NaN, which JSON itself cannot hold."""
    out = np.asarray(values, dtype=np.float64)
    return out, ~np.isnan(out)


def _dims(values: list[tuple[int, ...] | None]) -> list[str | None]:
    """Launch grids or blocks as "x,y,z" (kineto._dims over lists of ints); each distinct one checked once."""
    known: dict[tuple[int, ...] | None, str | None] = {None: None}
    for key in set(values):
        if key is not None:
            if any(not (_I64_MIN <= x < _U64_END) for x in key):
                raise _NotTyped("a launch dimension past 64 bits")
            known[key] = ",".join(map(str, key))
    return [known[v] for v in values]


def _part(events: list[_Event], counts: _Counts) -> _Part:
    """One chunk's rows and counts, by kineto.events_from_document's rules."""
    xs = [e for e in events if e.ph == "X"]
    flows = [e for e in events if e.ph == "f" and e.cat in FLOW_CATS]
    code = np.fromiter((_CAT_CODE.get(e.cat, OTHER) for e in xs), dtype=np.int64, count=len(xs))
    for i in np.flatnonzero(code == OTHER).tolist():
        cat = str(xs[i].cat)
        counts.other_cats[cat] = counts.other_cats.get(cat, 0) + 1
    ts, ts_ok = _times([e.ts for e in xs])
    dur, dur_ok = _times([e.dur for e in xs])
    skip = code == _SKIP
    timed = ts_ok & dur_ok
    with np.errstate(invalid="ignore"):
        in_range = (-MAX_US < ts) & (ts < MAX_US) & (-MAX_US < dur) & (dur < MAX_US)
    keep = ~skip & timed & in_range
    rows = list(itertools.compress(xs, keep.tolist()))
    code = code[keep]
    n = len(rows)
    pid, wide_pid = _process_ids([e.pid for e in rows])
    tid, wide_tid = _process_ids([e.tid for e in rows])
    counts.wide |= {name for name, wide in (("pid", wide_pid), ("tid", wide_tid)) if wide}
    part = _Part(kind=code.astype(np.int32), name=[e.name if e.name is not None else "" for e in rows],
                 pid=pid, tid=tid, ts_us=ts[keep], dur_us=dur[keep], device=np.full(n, -1, np.int64),
                 stream=np.full(n, -1, np.int64), correlation=np.full(n, -1, np.int64),
                 graph_node=np.full(n, -1, np.int64), grid=np.full(n, None, dtype=object),
                 block=np.full(n, None, dtype=object),
                 bytes=np.full(n, -1, np.int64))
    with_args = np.flatnonzero(np.isin(code, list(ARG_CODES)))
    if len(with_args):
        empty = _Args()
        arg_rows = [rows[i] for i in with_args.tolist()]
        args = [e.args if e.args is not None else empty for e in arg_rows]
        part.correlation[with_args] = _ids([a.correlation for a in args])
        on_gpu = np.isin(code[with_args], list(GPU_CODES))
        gpu = with_args[on_gpu]
        gpu_rows = list(itertools.compress(arg_rows, on_gpu.tolist()))
        gargs = list(itertools.compress(args, on_gpu.tolist()))
        part.device[gpu] = _ids([e.pid if a.device is _UNSET else a.device for a, e in zip(gargs, gpu_rows)])
        part.stream[gpu] = _ids([stream_of_tid(e.tid) if a.stream is _UNSET else a.stream
                                 for a, e in zip(gargs, gpu_rows)])
        part.graph_node[gpu] = _ids([a.graphNodeId if a.graph_node_id is _UNSET else a.graph_node_id
                                     for a in gargs])
        part.grid[gpu] = _dims([a.grid for a in gargs])
        part.block[gpu] = _dims([a.block for a in gargs])
        copies = np.isin(code[gpu], [MEMCPY, MEMSET])
        if copies.any():
            part.bytes[gpu[copies]] = _ids([a.bytes for a in itertools.compress(gargs, copies.tolist())])
    fts, fts_ok = _times([e.ts for e in flows])
    good = list(itertools.compress(flows, fts_ok.tolist()))
    keys = zip(_ids([e.pid for e in good]).tolist(), _ids([e.tid for e in good]).tolist(), fts[fts_ok].tolist())
    counts.flows.update(zip(keys, _ids([e.id for e in good]).tolist()))
    st = counts.stats
    st["malformed"] += len(flows) - len(good)
    st["non_complete"] += len(events) - len(xs) - len(flows)
    st["skipped"] += int(skip.sum())
    st["not_a_number"] += int((~skip & ~timed).sum())
    st["out_of_range"] += int((~skip & timed & ~in_range).sum())
    return part


def _interned(values: list[str | None] | np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Codes (-1 for None) and the distinct strings, numbered in order of first appearance."""
    enc = pa.array(values, type=pa.string()).dictionary_encode()
    return enc.indices.fill_null(-1).to_numpy().astype(np.int32), enc.dictionary.to_pylist()


def _columns(parts: list[_Part], counts: _Counts) -> tuple[dict[str, Any], int]:
    """The chunks' rows as kineto.events_from_document's columns."""
    def joined(name: str, dtype: Any) -> np.ndarray:
        arrays = [getattr(p, name) for p in parts]
        return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype=dtype)

    cols: dict[str, Any] = {name: joined(name, np.int64) for name in (
        "pid", "tid", "stream", "correlation", "graph_node", "bytes")}
    for name in counts.wide:  # kineto._i64_array: the whole column through id_or_unknown
        cols[name] = np.where(cols[name] == _I64_MIN, -1, cols[name])
    device = joined("device", np.int64)
    if ((device < _I32.min) | (device > _I32.max)).any():
        raise _NotTyped("a device id past int32")
    cols["device"] = device.astype(np.int32)
    cols["kind"] = joined("kind", np.int32)
    cols["ts_us"] = joined("ts_us", np.float64)
    cols["dur_us"] = joined("dur_us", np.float64)
    cols["name"], cols["_names"] = _interned([s for p in parts for s in p.name])
    # grid and block share one table, numbered as met: row by row, the grid before the block
    dims = np.empty(2 * len(cols["kind"]), dtype=object)
    if len(dims):
        dims[0::2] = np.concatenate([p.grid for p in parts])
        dims[1::2] = np.concatenate([p.block for p in parts])
    codes, cols["_dims"] = _interned(dims)
    cols["grid"], cols["block"] = codes[0::2].copy(), codes[1::2].copy()
    cols["_flows"] = counts.flows
    cols["_other_cats"] = counts.other_cats
    return cols, len(cols["kind"])


def _event_array(data: bytes | bytearray) -> tuple[dict[str, Any], int, int, bytes] | None:
    """torch.profiler's layout: (the document without its events, "[" offset, "]" offset, the
    newline + indentation of an event), or None.

    The array's "]" follows the last event's "}" at the events' indentation: searched for
    from the end (only the document after the array is read), as the last such "}" after
    which the rest parses without the events.
    """
    key = data.find(b'"traceEvents"')
    lb = data.find(b"[", key) if key >= 0 else -1
    m = _INDENT.match(data, lb) if lb >= 0 else None
    if m is None:
        return None
    close = m.group(1) + b"}"
    end = len(data)
    for _ in range(20):
        at = data.rfind(close, lb, end)
        if at < 0:
            return None
        end = at
        bracket = _ARRAY_END.match(data, at + len(close))
        if bracket is None:
            continue
        rb = bracket.end() - 1
        if lb + len(data) - rb > _OUTSIDE_MAX:
            return None
        try:
            doc = orjson.loads(data[:lb] + b"[]" + data[rb + 1:])
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict) and doc.get("traceEvents") == []:
            return doc, lb, rb, m.group(1)
    return None


def _chunks(data: bytes | bytearray, lb: int, rb: int, indent: bytes) -> Iterator[list[_Event]]:
    """The events, about _CHUNK bytes at a time, cut between two events.

    A cut is a "}," + newline + the events' indentation + "{": inside a string there is no
    newline, and anywhere but between two events the cut leaves invalid JSON (refused).
    """
    sep = b"}," + indent + b"{"
    view = memoryview(data)
    pos = lb + 1
    while True:
        cut = data.find(sep, pos + _CHUNK, rb) if pos + _CHUNK < rb else -1
        end = rb if cut < 0 else cut + 1
        yield _EVENTS.decode(b"".join((b"[", view[pos:end], b"]")))  # one copy of the chunk
        if cut < 0:
            return
        pos = cut + 2


def _whole(data: bytes | bytearray, max_events: int) -> tuple[dict[str, Any], list[list[_Event]]] | None:
    """Any other layout, decoded at once within the bound the orjson path has (kineto_io.check_values)."""
    if json_values(data) > max_events * JSON_VALUES_PER_EVENT:
        return None  # the orjson path refuses it, with the count
    top = _DOCUMENT.decode(data)
    doc: dict[str, Any] = {name: orjson.loads(bytes(raw)) for name in top.__struct_fields__ if name != "traceEvents"
                           and (raw := getattr(top, name)) is not _UNSET}
    return doc, [top.traceEvents]


def decode_events(data: bytes | bytearray, max_events: int
                  ) -> tuple[dict[str, Any], dict[str, Any], int, dict[str, int], int] | None:
    """(the document's other keys, columns, rows, counts, events in the file) as
    kineto.events_from_document gives them, or None where the loop must read the trace."""
    if not data.isascii():
        try:
            str(data, "utf-8")
        except UnicodeDecodeError:
            return None  # orjson refuses it, with the position
    try:
        where = _event_array(data)
        if where is not None:
            doc, lb, rb, indent = where
            batches: Iterable[list[_Event]] = _chunks(data, lb, rb, indent)
        else:
            whole = _whole(data, max_events)
            if whole is None:
                return None
            doc, batches = whole
        counts = _Counts()
        parts = []
        total = 0
        for events in batches:
            total += len(events)
            parts.append(_part(events, counts))
        if total > max_events:
            return None  # objects without "ph" that read_bytes did not count: the orjson path refuses them
        cols, n = _columns(parts, counts)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError, orjson.JSONDecodeError, _NotTyped):
        return None
    return doc, cols, n, counts.stats, total
