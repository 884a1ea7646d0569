"""The byte side of the Kineto reader: read (gunzip) with an event-count guard, parse, split.

A trace too large to parse here is refused while its bytes are still being counted
(``max_events``); large documents are parsed in batches of events so that the whole
parsed list never lives at once.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from kvprof.core.errors import TraceError
from kvprof.core.files import open_regular
from kvprof.core.readers import NotThisFormat
from kvprof.core.schema import DEFAULT_MAX_EVENTS

_CHUNK = 16 << 20  # bytes decompressed at a time while counting events
def _gunzip_chunks(raw: Any) -> Any:
    """Decompressed chunks of a (possibly multi-member) gzip stream; truncation is an error.

    zlib directly rather than the gzip module: gzip.GzipFile.read(n) can return a short
    read and then b"" for a stream cut short, which would hand half a trace to the parser.
    """
    d = zlib.decompressobj(31)
    fed = False
    while True:
        block = raw.read(_CHUNK // 4)
        if not block:
            break
        while block:
            fed = True
            out = d.decompress(block)
            if out:
                yield out
            block = b""
            if d.eof:
                block = d.unused_data
                d = zlib.decompressobj(31)
                fed = False
    if fed and not d.eof:
        raise EOFError("the gzip stream ends before its end-of-stream marker")


def read_bytes(path: str | os.PathLike[str], max_events: int = DEFAULT_MAX_EVENTS) -> bytes:
    """The decompressed trace bytes, refusing early when they hold more than ``max_events``."""
    p = Path(path)
    try:
        raw = open_regular(p)
    except OSError as exc:
        raise TraceError(f"cannot read {p}: {exc.strerror or exc}") from None
    chunks: list[bytes] = []
    count, tail, size = 0, b"", 0
    try:
        with raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            source = _gunzip_chunks(raw) if gz else iter(lambda: raw.read(_CHUNK), b"")
            for chunk in source:
                count += (tail + chunk[:3]).count(b'"ph"') + chunk.count(b'"ph"')
                tail = chunk[-3:]
                chunks.append(chunk)
                size += len(chunk)
                if count > max_events:
                    raise TraceError(
                        f"{p.name}: more than {max_events:,} events (counted {count:,} in the first "
                        f"{size >> 20} MiB); too large to load here: capture a shorter "
                        "window, or raise --max-events on a machine with more memory"
                    )
    except (EOFError, zlib.error) as exc:
        raise TraceError(f"{p.name}: truncated or corrupt gzip ({exc or type(exc).__name__})") from None
    except OSError as exc:
        raise TraceError(f"cannot read {p}: {exc.strerror or exc}") from None
    data = b"".join(chunks)
    del chunks
    return data


def parse_document(data: bytes, name: str) -> dict[str, Any]:
    """orjson parse with one-line errors; a bare event list is accepted as a trace."""
    if not data.strip():
        raise TraceError(f"{name}: empty file")
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


def split_events(data: bytes, name: str) -> tuple[dict[str, Any], list[int], int, int] | None:
    """An indented trace parsed in batches: (document without its events, event start
    offsets, array start, array end), or None when the file is not laid out that way.

    Kineto (and any indenting writer) puts each event of ``"traceEvents": [`` on a line of
    its own at one indentation, deeper objects further in. Parsing the events a batch at
    a time keeps only one batch of Python objects alive instead of the whole document
    (the bytes stay, a fraction of the parsed size). Anything else, compact JSON
    included, takes the one-shot parse.
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
        try:
            doc = orjson.loads(data[:lb] + b"[]" + data[rb + 1:])
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict) and doc.get("traceEvents") == []:
            break
    else:
        return None
    starts = [s.start() + 1 for s in event_start.finditer(data, lb, rb)]
    return doc, starts, lb, rb


def event_batches(data: bytes, starts: list[int], rb: int) -> Iterator[list[Any]]:
    """Parsed lists of up to _BATCH events, one at a time."""
    view = memoryview(data)
    for i in range(0, len(starts), _BATCH):
        lo = starts[i]
        hi = starts[i + _BATCH] if i + _BATCH < len(starts) else rb
        chunk = bytes(view[lo:hi]).rstrip().rstrip(b",")
        yield orjson.loads(b"[" + chunk + b"]")


I64_MAX = (1 << 63) - 1
