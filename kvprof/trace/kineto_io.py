"""The byte side of the Kineto reader: read (gunzip) within bounds, parse, split.

Memory is bounded before anything is parsed, each bound with a one-line refusal:
- the decompressed size (``KVPROF_MAX_TRACE_MB``, kvprof.core.schema.max_trace_bytes):
  gzip is inflated a chunk at a time and reading stops past the limit, so a small
  .json.gz that inflates to gigabytes costs no more than the limit;
- the events (``max_events``), counted while the bytes are read;
- the JSON values one parse may create (``max_events`` x JSON_VALUES_PER_EVENT), counted
  from the bytes before orjson sees them: a parsed value costs 25-125 bytes, so the
  bytes alone do not bound the parse.
Large documents in torch.profiler's layout are parsed in batches of events so that the
whole parsed list never lives at once. orjson refuses nesting deeper than 1024 levels
(a JSONDecodeError, reported as one line).
"""

from __future__ import annotations

import os
import re
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from kvprof.core.errors import TraceError
from kvprof.core.files import open_regular
from kvprof.core.readers import REGISTRY, SNIFF_BYTES, NotThisFormat
from kvprof.core.schema import DEFAULT_MAX_EVENTS, JSON_VALUES_PER_EVENT, MAX_EVENTS, MAX_TRACE_MB_ENV, max_trace_bytes

_READ = 1 << 20  # compressed bytes read at a time
_CHUNK = 16 << 20  # most bytes decompressed (or read) at a time


def _gunzip_chunks(raw: Any) -> Any:
    """Decompressed chunks of at most _CHUNK bytes of a (possibly multi-member) gzip stream;
    truncation is an error.

    zlib directly rather than the gzip module: gzip.GzipFile.read(n) can return a short
    read and then b"" for a stream cut short, which would hand half a trace to the parser.
    ``max_length`` keeps each chunk small however much one compressed block inflates to.
    """
    d = zlib.decompressobj(31)
    fed = False
    while True:
        block = raw.read(_READ)
        if not block:
            break
        while block:
            fed = True
            out = d.decompress(block, _CHUNK)
            if out:
                yield out
            block = d.unconsumed_tail
            if d.eof:
                block = d.unused_data
                d = zlib.decompressobj(31)
                fed = False
    if fed and not d.eof:
        raise EOFError("the gzip stream ends before its end-of-stream marker")


class _Prefetched:
    """One file's bytes (or the error reading them) from a background thread."""

    def __init__(self, path: Path, max_events: int, max_bytes: int) -> None:
        self.data: bytearray | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(path, max_events, max_bytes),
                                       name="kvprof-trace-read", daemon=True)

    def _run(self, path: Path, max_events: int, max_bytes: int) -> None:
        try:
            self.data = _read_bytes(path, max_events, max_bytes)
        except Exception as exc:  # noqa: BLE001 - handed to the thread that asks for the bytes
            self.error = exc


_PREFETCHED: dict[tuple[str, int, int, int, int], _Prefetched] = {}


def _prefetch_key(p: Path, max_events: int, max_bytes: int) -> tuple[str, int, int, int, int] | None:
    try:
        st = p.stat()
    except OSError:
        return None
    return str(p.resolve()), st.st_size, st.st_mtime_ns, max_events, max_bytes


def prefetch(path: str | os.PathLike[str], max_events: int = DEFAULT_MAX_EVENTS) -> bool:
    """Start reading one Kineto trace's bytes (read, gunzip, count) in a background thread.

    ``kvprof analyze FILE`` calls this before it imports pandas: file reads and zlib's
    inflate release the GIL, so the read (0.16 s of a 35 MB trace on a 2-core machine)
    overlaps the imports (0.4 s) instead of following them. :func:`read_bytes` of the
    same file (unchanged: same size and mtime), with the same limits, takes the result and
    raises its error; nothing else is read ahead. True when a read was started.
    """
    p = Path(path)
    limit = max_trace_bytes()
    key = _prefetch_key(p, max_events, limit)
    if key is None or key in _PREFETCHED or not p.is_file():
        return False
    try:
        with open_regular(p) as f:
            head = f.read(SNIFF_BYTES)
    except OSError:
        return False  # the read itself names the problem
    reader = REGISTRY.for_head(head, p) if head else None
    if reader is None or reader.name != "kineto":
        return False
    job = _Prefetched(p, max_events, limit)
    _PREFETCHED[key] = job
    job.thread.start()
    return True


def read_bytes(path: str | os.PathLike[str], max_events: int = DEFAULT_MAX_EVENTS,
               max_bytes: int | None = None) -> bytearray:
    """The decompressed trace bytes, refusing early when they hold more than ``max_events``
    events or more than ``max_bytes`` bytes (default: kvprof.core.schema.max_trace_bytes).
    A :func:`prefetch` of the same file with the same limits is waited for and used."""
    p = Path(path)
    limit = max_trace_bytes() if max_bytes is None else max_bytes
    key = _prefetch_key(p, max_events, limit) if _PREFETCHED else None
    job = _PREFETCHED.pop(key, None) if key is not None else None
    if job is not None:
        job.thread.join()
        if job.error is not None:
            raise job.error
        if job.data is not None:
            return job.data
    return _read_bytes(p, max_events, limit)


def _read_bytes(p: Path, max_events: int, limit: int) -> bytearray:
    try:
        raw = open_regular(p)
    except OSError as exc:
        raise TraceError(f"cannot read {p}: {exc.strerror or exc}") from None
    data = bytearray()  # grown in place: no list of chunks joined into a second copy
    count, tail = 0, b""
    try:
        with raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            source = _gunzip_chunks(raw) if gz else iter(lambda: raw.read(_CHUNK), b"")
            for chunk in source:
                if len(data) + len(chunk) > limit:
                    raise TraceError(
                        f"{p.name}: more than {limit / (1 << 20):,.0f} MiB once decompressed; too large to load "
                        f"here: capture a shorter window, or raise {MAX_TRACE_MB_ENV} (MiB) on a machine with "
                        "more memory")
                count += (tail + chunk[:3]).count(b'"ph"') + chunk.count(b'"ph"')
                tail = chunk[-3:]
                data += chunk
                if count > max_events:
                    raise TraceError(
                        f"{p.name}: more than {max_events:,} events (counted {count:,} in the first "
                        f"{len(data) >> 20} MiB); too large to load here: capture a shorter window, or raise ",
                        MAX_EVENTS, " on a machine with more memory"
                    )
    except (EOFError, zlib.error) as exc:
        raise TraceError(f"{p.name}: truncated or corrupt gzip ({exc or type(exc).__name__})") from None
    except OSError as exc:
        raise TraceError(f"cannot read {p}: {exc.strerror or exc}") from None
    return data


def json_values(data: bytes | bytearray, lo: int = 0, hi: int | None = None) -> int:
    """At most this many JSON values (object keys aside) in ``data[lo:hi]``.

    Every value but the first follows a "[", a "," or (as the first member of an object)
    a "{"; the same characters inside strings only make the count larger. Counted with
    bytes.count, without copying.
    """
    hi = len(data) if hi is None else hi
    return 1 + sum(data.count(c, lo, hi) for c in (b",", b"[", b"{"))


def check_values(data: bytes | bytearray, name: str, max_events: int, lo: int = 0, hi: int | None = None) -> None:
    """TraceError when parsing ``data[lo:hi]`` at once would create more values than
    ``max_events`` allows (kvprof.core.schema.JSON_VALUES_PER_EVENT)."""
    cap = max_events * JSON_VALUES_PER_EVENT
    n = json_values(data, lo, hi)
    if n > cap:
        raise TraceError(
            f"{name}: up to {n:,} JSON values to parse at once, more than {cap:,} ({JSON_VALUES_PER_EVENT} per "
            "event of ", MAX_EVENTS, f" {max_events:,}); torch.profiler's layout (one event per line) is parsed in "
            "pieces: write the trace that way, or raise ", MAX_EVENTS, " on a machine with more memory")


def parse_document(data: bytes | bytearray, name: str, max_events: int = DEFAULT_MAX_EVENTS) -> dict[str, Any]:
    """orjson parse with one-line errors; a bare event list is accepted as a trace."""
    if not data or data.isspace():  # isspace, not strip: no copy of a large document
        raise TraceError(f"{name}: empty file")
    check_values(data, name, max_events)
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"{name}: not valid JSON ({exc})") from None
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise NotThisFormat(f"{name}: JSON but not a Chrome/Kineto trace (no traceEvents list)")
    return doc


_BATCH = 50_000
SPLIT_MIN_BYTES = 8 << 20  # below this the one-shot parse costs little memory anyway
_INDENT = re.compile(rb"\[[ \t\r\n]*?(\n[ \t]*)\{")  # Kineto may leave a blank line first


def split_events(data: bytes | bytearray, name: str,
                 max_events: int = DEFAULT_MAX_EVENTS) -> tuple[dict[str, Any], list[int], int, int] | None:
    """An indented trace parsed in batches: (document without its events, event start
    offsets, array start, array end), or None when the file is not laid out that way.

    Kineto (and any indenting writer) puts each event of ``"traceEvents": [`` on a line of
    its own at one indentation, deeper objects further in. Parsing the events a batch at
    a time keeps only one batch of Python objects alive instead of the whole document
    (the bytes stay, a fraction of the parsed size). Anything else, compact JSON
    included, takes the one-shot parse. More event lines than ``max_events`` is a
    TraceError, as is a document around the events too large to parse at once.
    """
    key = data.find(b'"traceEvents"')
    if key < 0:
        return None
    lb = data.find(b"[", key)
    m = _INDENT.match(data, lb) if lb >= 0 else None
    if m is None:
        return None
    event_start = re.compile(re.escape(m.group(1)) + rb"\{")
    # the array's "]": the last one after which the rest of the document still parses
    rb = len(data)
    for _ in range(20):
        rb = data.rfind(b"]", lb, rb)
        if rb < 0:
            return None
        if json_values(data, 0, lb) + json_values(data, rb + 1) > max_events * JSON_VALUES_PER_EVENT:
            return None  # the one-shot parse refuses it with the count
        try:
            doc = orjson.loads(data[:lb] + b"[]" + data[rb + 1:])
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict) and doc.get("traceEvents") == []:
            break
    else:
        return None
    starts: list[int] = []
    for s in event_start.finditer(data, lb, rb):
        starts.append(s.start() + 1)
        if len(starts) > max_events:
            raise TraceError(f"{name}: more than {max_events:,} events; too large to load here: capture a "
                             "shorter window, or raise ", MAX_EVENTS, " on a machine with more memory")
    return doc, starts, lb, rb


def event_batches(data: bytes | bytearray, starts: list[int], rb: int, name: str = "trace",
                  max_events: int = DEFAULT_MAX_EVENTS) -> Iterator[list[Any]]:
    """Parsed lists of up to _BATCH events, one at a time (each within the values bound)."""
    view = memoryview(data)
    for i in range(0, len(starts), _BATCH):
        lo = starts[i]
        hi = starts[i + _BATCH] if i + _BATCH < len(starts) else rb
        check_values(data, name, max_events, lo, hi)
        chunk = bytes(view[lo:hi]).rstrip().rstrip(b",")
        yield orjson.loads(b"[" + chunk + b"]")


I64_MAX = (1 << 63) - 1
