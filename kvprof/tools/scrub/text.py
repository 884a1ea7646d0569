"""Scrub Chrome/Kineto traces (JSON, gzipped or not) and text logs, escapes decoded first."""

from __future__ import annotations

import bisect
import gzip
import os
import re
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from kvprof.core.atomic import atomic_path
from kvprof.core.errors import TraceError
from kvprof.core.files import open_regular
from kvprof.tools import envsafe
from kvprof.tools.scrub.normalize import guess_encoding
from kvprof.tools.scrub.rules import (
    B64_RUN_BYTES,
    DEFAULT_MAX_BYTES,
    GZIP_MAGIC,
    HEX_RUN_BYTES,
    HOST_KEYS,
    HOST_MARKER,
    MARKER,
    PERCENT_BYTES,
    TOKEN_BYTES,
    Rules,
    ScrubReport,
    find_in,
    find_values,
    too_big,
    total_size,
)

# ---------------------------------------------------------------- JSON / Chrome traces


# Where a JSON file can need a change: cheap literal scans (each a fast search), every hit
# then checked exactly on the decoded string literal around it (JSON escapes such as
# \u0000 hide word boundaries, so no boundary is judged on raw bytes).
_JSON_HOME = re.compile(rb"/(?:home/|Users/|root)")
_JSON_SECRET_KEY = re.compile(rb'"([A-Z][A-Z0-9_]+)"\s*:\s*"')
_NAME_BYTE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


_JSON_HOST_KEY = re.compile(rb'"(' + b"|".join(k.encode() for k in HOST_KEYS) + rb')"\s*:\s*"')


# What folding or an escape can turn into a secret: any byte outside printable ASCII (UTF-8 of
# a look-alike, a zero-width character), an HTML entity.
_JSON_UNSEEN = re.compile(rb"[\x80-\xff]+|&[#A-Za-z]")


def _candidates(data: bytes, literals: Iterable[bytes], rules: Rules) -> Iterable[int]:
    for m in re.finditer(rb"=", data):
        if m.start() and data[m.start() - 1] in _NAME_BYTE:
            yield m.start()
    for m in _JSON_HOME.finditer(data):
        yield m.start()
    for m in TOKEN_BYTES.finditer(data):
        yield m.start()
    for m in re.finditer(rb"\\", data):  # an escape can hide any of the above: decode and judge
        yield m.start()
    for lit in literals:
        if lit:
            for m in re.finditer(re.escape(lit), data, re.IGNORECASE):
                yield m.start()
    for m in PERCENT_BYTES.finditer(data):
        yield m.start()
    for m in _JSON_UNSEEN.finditer(data):
        yield m.start()
    for rx in (B64_RUN_BYTES, HEX_RUN_BYTES):  # a token whose variable is not set, encoded
        for m in rx.finditer(data):
            if rules.encoded_run(m.group()):
                yield m.start()


def _escaped(data: bytes, quote: int) -> bool:
    n = 0
    while quote - n - 1 >= 0 and data[quote - n - 1] == 0x5C:  # backslash
        n += 1
    return n % 2 == 1


# A JSON string literal: scanned left to right from the start of a document, these are exactly
# its strings (nothing outside a string holds a quote).
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


def literal_spans(data: bytes) -> tuple[list[int], list[int]]:
    """(starts, ends) of every string literal of a JSON document, in one linear scan."""
    starts, ends = [], []
    for m in _JSON_STRING.finditer(data):
        starts.append(m.start())
        ends.append(m.end())
    return starts, ends


def _literal_at(data: bytes, i: int) -> tuple[int, int] | None:
    """Span of the JSON string literal that contains byte ``i`` (quotes included); a scan from
    ``i`` both ways (``literal_spans`` for many positions)."""
    start = data.rfind(b'"', 0, i)
    while start > 0 and _escaped(data, start):
        start = data.rfind(b'"', 0, start)
    end = data.find(b'"', i)
    while end != -1 and _escaped(data, end):
        end = data.find(b'"', end + 1)
    if start < 0 or end < 0:
        return None
    return start, end + 1


def _json_edits(data: bytes, rules: Rules) -> tuple[dict[tuple[int, int], bytes], int, int, int]:
    """Replacements (span -> new literal) for every string literal the rules change, and how
    many were secrets (env), home paths and host names."""
    spans: set[tuple[int, int]] = set()
    starts, ends = literal_spans(data)  # once: a candidate is placed by bisection (linear in all)
    for i in _candidates(data, rules.literals(), rules):
        k = bisect.bisect_right(starts, i) - 1
        if k >= 0 and i < ends[k]:
            spans.add((starts[k], ends[k]))
    reasons: dict[tuple[int, int], str] = {}
    edits: dict[tuple[int, int], bytes] = {}
    for span in spans:
        try:
            value = orjson.loads(data[span[0] : span[1]])
        except orjson.JSONDecodeError:
            continue  # not inside a string (a number that looks like a value): verification decides
        if not isinstance(value, str):
            continue
        new, reason = rules.scrub(value)
        if reason:
            edits[span], reasons[span] = orjson.dumps(new), reason
    for m in _JSON_SECRET_KEY.finditer(data):  # "HF_TOKEN": "..." -> the value goes
        if envsafe.is_secret_name(m.group(1).decode()):
            at = _literal_at(data, m.end())
            if at is not None and at[0] == m.end() - 1 and data[at[0] : at[1]] != b'""':
                edits[at], reasons[at] = orjson.dumps(MARKER), "env"
    host_marker = orjson.dumps(HOST_MARKER)
    for m in _JSON_HOST_KEY.finditer(data):  # "host_name": "gpu-node-7" -> the value goes
        at = _literal_at(data, m.end())
        if at is not None and at[0] == m.end() - 1 and data[at[0] : at[1]] not in (b'""', host_marker):
            edits[at], reasons[at] = host_marker, "host"
    kinds = list(reasons.values())
    return edits, kinds.count("env"), kinds.count("home"), kinds.count("host")


def _apply_edits(data: bytes, edits: Mapping[tuple[int, int], bytes]) -> bytes:
    out, pos = [], 0
    for (start, end), new in sorted(edits.items()):
        if start < pos:
            continue  # a span inside one already replaced (cannot happen for literals)
        out += [data[pos:start], new]
        pos = end
    out.append(data[pos:])
    return b"".join(out)


_CHUNK = 1 << 24


def read_bounded(path: Path, max_bytes: int, gunzip: bool = True) -> tuple[bytes, bool]:
    """(content, was gzipped): a gzip file is decompressed as a stream and refused past
    ``max_bytes`` (ResourceError), so a small bomb never fills the memory; so is a plain file.
    ``gunzip=False``: the bytes as they are (a log is rewritten as it was stored)."""
    with open_regular(path) as fh:
        gzipped = gunzip and fh.read(2) == GZIP_MAGIC
        fh.seek(0)
        if not gzipped:
            if os.fstat(fh.fileno()).st_size > max_bytes:
                raise too_big(path, max_bytes)
            return fh.read(), False
        chunks: list[bytes] = []
        total = 0
        try:
            with gzip.GzipFile(fileobj=fh, mode="rb") as gz:
                while chunk := gz.read(_CHUNK):  # read(huge) would allocate all of it at once
                    total += len(chunk)
                    if total > max_bytes:
                        raise too_big(path, max_bytes, "decompresses to")
                    chunks.append(chunk)
        except EOFError:
            raise TraceError(f"{path}: truncated gzip file (it ends before the end of its data)") from None
        except (gzip.BadGzipFile, zlib.error, OSError) as exc:
            raise TraceError(f"{path}: corrupt gzip file ({exc})") from None
    return b"".join(chunks), True


def read_json_bytes(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[bytes, bool]:
    data, gzipped = read_bounded(path, max_bytes)
    if not gzipped and path.name.endswith(".gz"):
        raise TraceError(f"{path}: not a gzip file")
    return data, gzipped


def split_secret_strings(doc: Any, rules: Rules) -> list[tuple[Any, Any]]:
    """(container, key or index) of every string that holds part of a secret cut across
    adjacent strings of one array, or adjacent values of one object (``Rules.split_secrets``)."""
    out: list[tuple[Any, Any]] = []
    memo: dict[tuple[str, ...], list[tuple[int, int]]] = {}  # events repeat their strings
    stack = [doc]
    while stack:
        cur = stack.pop()
        if isinstance(cur, dict):
            keys, values = list(cur), list(cur.values())
        elif isinstance(cur, list):
            keys, values = list(range(len(cur))), cur
        else:
            continue
        run: list[int] = []  # positions of the current run of adjacent strings
        for i, v in enumerate([*values, None]):
            if isinstance(v, str):
                run.append(i)
                continue
            if len(run) > 1:
                parts = tuple(values[j] for j in run)
                if parts not in memo:
                    memo[parts] = rules.split_secrets(list(parts))
                for first, last in memo[parts]:
                    out += [(cur, keys[j]) for j in run[first:last + 1]]
            run = []
            if isinstance(v, (dict, list)):
                stack.append(v)
    return out


def parse_json(data: bytes, path: Path) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON ({exc})") from None


def scrub_json(path: Path, rules: Rules) -> ScrubReport:
    """Scrub a Chrome trace (or any JSON file), plain or gzipped: only the string literals
    that change are rewritten, every other byte (events, numbers, layout) is kept. The
    result is parsed before it replaces the original (a file left unchanged is not
    parsed: scrub is not a validator, and a full parse of a big trace takes seconds)."""
    report = ScrubReport(path, "json", bytes_before=total_size([path]))
    data, gzipped = read_json_bytes(path, rules.max_bytes)
    if data.lstrip()[:1] not in (b"{", b"["):
        raise TraceError(f"{path}: not JSON (it does not start with {{ or [)")
    edits, report.strings, report.paths, report.hosts = _json_edits(data, rules)
    needles = rules.needles()
    out = _apply_edits(data, edits) if edits else data
    try:
        doc = orjson.loads(out)
    except orjson.JSONDecodeError:
        doc = None  # not parsed, so not rewritten for this; the check that follows says why
    split = split_secret_strings(doc, rules) if doc is not None else []
    if split:
        for container, key in split:
            container[key] = MARKER
        report.strings += len(split)
        out = orjson.dumps(doc)  # the byte layout is not kept for this one: a re-serialisation
    if out is data and not find_in(data, needles):
        report.bytes_after = report.bytes_before
        return report
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            if gzipped:
                with gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0, compresslevel=6) as gz:
                    gz.write(out)
            else:
                fh.write(out)
        written, _ = read_json_bytes(tmp, max(rules.max_bytes, len(out)))
        parse_json(written, path)  # also rejects a truncated input: only literals were edited
        if written != out or find_in(written, needles) or find_values([tmp], needles):
            raise TraceError(f"{path}: verification of the scrubbed copy failed; original kept")
    report.rewritten = True
    report.bytes_after = total_size([path])
    return report


# ---------------------------------------------------------------- text logs


def scrub_text(path: Path, rules: Rules) -> ScrubReport:
    """Scrub a log line by line (plain or gzipped): environment lines go whole, home paths become ~."""
    report = ScrubReport(path, "text", bytes_before=total_size([path]))
    data, gzipped = read_bounded(path, rules.max_bytes, gunzip=True)
    codec, skip = guess_encoding(data)  # a log in UTF-16/32 is rewritten in its encoding
    bom, data = data[:skip], data[skip:]
    text = data.decode(codec, errors="surrogateescape" if codec == "utf-8" else "surrogatepass")
    lines = text.splitlines(keepends=True)
    out = []
    for line in lines:
        body = line.rstrip("\r\n")
        new, reason = rules.scrub(body)
        report.strings += reason == "env"
        report.paths += reason == "home"
        report.hosts += reason == "host"
        out.append(new + line[len(body):])
    new_text = "".join(out)
    if new_text == text:
        report.bytes_after = report.bytes_before
        return report
    encoded = bom + new_text.encode(codec, errors="surrogateescape" if codec == "utf-8" else "surrogatepass")
    with atomic_path(path) as tmp:
        tmp.write_bytes(gzip.compress(encoded, mtime=0) if gzipped else encoded)
    report.rewritten = True
    report.bytes_after = total_size([path])
    return report
