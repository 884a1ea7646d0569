"""Remove the environment and home paths from outputs before they are shared.

An nsys SQLite export keeps the profiled process's environment (META_DATA_CAPTURE rows
``PROCESS_<n>:ENVIRONMENT_VARIABLE`` and whole ``KEY=VALUE`` blocks in StringIds); a
Chrome trace names the user's home in paths and may carry metadata added by anyone.

Rules (``Rules``), applied to every text value of an SQLite file and every string (keys
included) of a JSON file, and line by line to .log/.txt files:

- environment: a string is replaced whole by ``MARKER`` when it
  (a) contains ``NAME=`` where NAME is an environment-like name (``_ASSIGNMENT``: all
  upper case like PATH, upper-case led with an ``_`` like PMIX_MCA_gds, ``_``-led, a
  lower-case proxy variable) or any name set in the scrubbing environment, not glued
  to a preceding word or path character; or
  (b) contains the value of a variable of the scrubbing environment (default: this
  process's) that ``envsafe.looks_secret`` flags (secret-sounding name or token-shaped
  value), 6 characters or longer; or
  (c) (SQLite) is the value of a META_DATA_CAPTURE row whose name mentions ENVIRONMENT.
  Whole strings go because a partial cut of a ``KEY=VALUE`` block is easy to get wrong.
  Lower-case ``key=value`` text (kvprof's own NVTX messages) is kept.
- home paths: ``/home/<user>``, ``/Users/<user>``, ``/root`` and this user's ``~``
  become ``~`` inside the string; the rest of the string is kept.
- JSON values under a key that names a secret (``HF_TOKEN``) become ``MARKER``.
- token-shaped strings (``sk-...``, ``hf_...``, ``ghp_...``, AWS key ids, JWTs, URLs
  with a password: ``envsafe``'s known formats) become ``TOKEN_MARKER`` wherever they are,
  whether or not the variable that held them is set where scrub runs.
- host names: this machine's name (3 characters or more, as a word) and the values of
  host-name fields (JSON keys ``host_name``/``hostname``/``hostName``; SQLite ``name``/``value``
  rows whose name mentions HOSTNAME) become ``HOST_MARKER``.
- JSON escapes are decoded before any rule is applied (``"sk\\u002d..."``, ``"\\/home\\/..."``).

Parquet files (analyze's outputs) get the same rules on every string column.
``check_path`` (``scrub --check``) verifies without writing: it decodes every string
(JSON escapes, gzip, SQLite text, Parquet, log lines) and reports any that the rules would
still change, plus any environment secret found in the raw bytes.

SQLite values are replaced in place (same row, same id: StringIds also holds kernel names
and NVTX messages referenced by id), never deleted, then the copy is VACUUMed (with
secure_delete) so no free page keeps old bytes; the raw bytes are checked for every
secret value before the copy replaces the original, and stale -wal/-shm/-journal files
are removed. Every file is rewritten atomically, and only when something changed.

A ``.nsys-rep`` cannot be rewritten: it is reported, and scanned for secret values in
plain bytes (a miss proves nothing: parts are compressed). What keeps it clean is how
capture runs nsys: the allowlisted environment (``kvprof.capture.envsafe``) in a private
PID namespace (``kvprof.capture.nsys.isolation_prefix``), since nsys also stores the
environment of every other process it can see.
"""

from __future__ import annotations

import errno
import gzip
import os
import re
import sqlite3
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kvprof.atomic import atomic_path
from kvprof.capture import envsafe
from kvprof.errors import KvprofError, OutputError, TraceError, UsageError
from kvprof.guards import open_regular, require_regular

MARKER = "[kvprof: environment removed]"
TOKEN_MARKER = "[kvprof: token removed]"
HOST_MARKER = "[kvprof: host]"
HOME = "~"
HOST_KEYS = ("host_name", "hostname", "hostName", "host")

SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
JSON_SUFFIXES = (".json", ".json.gz")
TEXT_SUFFIXES = (".log", ".txt", ".csv")
PARQUET_SUFFIXES = (".parquet",)
REPORT_SUFFIXES = (".nsys-rep", ".qdrep", ".qdstrm")
SIDECARS = ("-wal", "-shm", "-journal")

_SQLITE_MAGIC = b"SQLite format 3\x00"
_GZIP_MAGIC = b"\x1f\x8b"
# NAME= where NAME is env-like: all upper case (PATH, CC), or upper-case led with an _
# (PMIX_MCA_gds), or _-led (_ itself), or a lower-case proxy variable; not glued to a
# preceding word or path (so "bs=8", "tokens=256", "a==b", "x.y=1" are not).
_ASSIGNMENT = re.compile(
    r"(?<![\w.\-/:=$])(?:[A-Z][A-Z0-9]+|[A-Z][A-Z0-9]*_[A-Za-z0-9_]*|_[A-Za-z0-9_]*"
    r"|(?:http|https|ftp|all|no)_proxy)="
)
_HOME_DIRS = re.compile(r"(?<![\w.\-])(?:(?:/home|/Users)/[^/\s\"'\x00:]+|/root(?=[/\s\"'\x00:]|\Z))")
_SECRET_KEY = re.compile(r"[A-Z][A-Z0-9_]+\Z")
# Token-shaped strings (envsafe's known formats), as words: "task-..." or "__hf_x" are not.
_TOKEN_PREFIXES = (r"hf_|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|sk-|sk_live_|rk_live_|xox[abprs]-"
                   r"|AKIA|ASIA|AIza|ya29\.|eyJ")
_TOKEN = re.compile(r"(?<![A-Za-z0-9_\-])(?:" + _TOKEN_PREFIXES + r")[A-Za-z0-9_\-.=+/]{8,}"
                    r"|[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@\"']+:[^/\s@\"']+@")
_TOKEN_BYTES = re.compile(rb"(?:" + _TOKEN_PREFIXES.encode() + rb")|://")


def this_hostnames() -> list[str]:
    """This machine's host name and its first label (no DNS lookup: that can take seconds)."""
    import socket

    name = socket.gethostname() or ""
    return sorted({n for n in (name, name.split(".")[0]) if len(n) >= 3 and n != "localhost"}, key=len, reverse=True)


@dataclass
class ScrubReport:
    """What scrub did to one file."""

    path: Path
    kind: str  # "sqlite" | "json" | "text" | "parquet" | "nsys-rep" | "other"
    env_rows: int = 0  # META_DATA_CAPTURE environment rows emptied (SQLite)
    strings: int = 0  # other values / strings / lines replaced by MARKER (tokens cut out included)
    paths: int = 0  # values with a home path rewritten to ~
    hosts: int = 0  # values with a host name replaced by HOST_MARKER
    bytes_before: int = 0
    bytes_after: int = 0
    rewritten: bool = False
    note: str | None = None
    leaks: tuple[str, ...] = field(default=())  # variables whose value remains (cannot rewrite)

    @property
    def changed(self) -> bool:
        return self.rewritten

    def __str__(self) -> str:  # file name only: a run folder is renamed after scrubbing
        return self.line(full_path=False)

    def line(self, full_path: bool = True) -> str:
        """One line for the user: what changed and the size before/after."""
        name = str(self.path) if full_path else self.path.name
        if self.kind in ("nsys-rep", "other"):
            return f"{name}: {self.note}"
        parts = []
        if self.kind == "sqlite":
            parts.append(f"{self.env_rows} environment rows")
        parts.append(f"{self.strings} {'lines' if self.kind == 'text' else 'strings'} removed")
        parts.append(f"{self.paths} home paths rewritten")
        if self.hosts:
            parts.append(f"{self.hosts} host names removed")
        if self.rewritten:
            size = f"{self.bytes_before:,} -> {self.bytes_after:,} bytes"
        else:
            size = f"unchanged, {self.bytes_before:,} bytes"
        return f"{name}: {', '.join(parts)}; {size}"


class Rules:
    """The string rules of the module docstring, built for one environment."""

    def __init__(self, env: Mapping[str, str] | None = None, home: str | None = None,
                 hostnames: Iterable[str] | None = None) -> None:
        env = os.environ if env is None else env
        hosts = sorted({h for h in (this_hostnames() if hostnames is None else hostnames) if len(h) >= 3},
                       key=len, reverse=True)
        self.hostnames = hosts
        self._hosts = (re.compile(r"(?<![A-Za-z0-9_\-])(?:" + "|".join(map(re.escape, hosts)) + r")(?![A-Za-z0-9_\-])",
                                  re.IGNORECASE) if hosts else None)
        self.secrets = envsafe.sensitive_values(env)
        values = sorted(set(self.secrets.values()), key=len, reverse=True)
        self._values = re.compile("|".join(map(re.escape, values))) if values else None
        other_names = sorted(n for n in env if len(n) >= 3 and not _ASSIGNMENT.fullmatch(n + "="))
        self._names = (
            re.compile(r"(?<![\w.\-/:=$])(?:" + "|".join(map(re.escape, other_names)) + ")=")
            if other_names
            else None
        )
        home = os.path.expanduser("~") if home is None else home
        self._home_text = home.rstrip("/")
        self._home = (
            re.compile(r"(?<![\w.\-])" + re.escape(home.rstrip("/")) + r"(?=/|\Z|[\s\"':])")
            if len(home.rstrip("/")) > 1
            else None
        )

    def is_environment(self, s: str) -> bool:
        if self._values is not None and self._values.search(s):
            return True
        if "=" in s and (_ASSIGNMENT.search(s) or (self._names is not None and self._names.search(s))):
            return True
        return False

    def home_bytes(self) -> bytes | None:
        return self._home_text.encode() if self._home is not None else None

    def strip_home(self, s: str) -> str:
        if "/" not in s:
            return s
        s = _HOME_DIRS.sub(HOME, s)
        return self._home.sub(HOME, s) if self._home is not None else s

    def scrub(self, s: str) -> tuple[str, str | None]:
        """(new value, "env" | "home" | "host" | None); "env" covers token-shaped strings."""
        if self.is_environment(s):
            return MARKER, "env"
        reason = None
        new = s
        if _TOKEN.search(new):
            new, reason = _TOKEN.sub(TOKEN_MARKER, new), "env"
        if self._hosts is not None and self._hosts.search(new):
            new, reason = self._hosts.sub(HOST_MARKER, new), reason or "host"
        home = self.strip_home(new)
        if home != new:
            new, reason = home, reason or "home"
        return new, reason

    def literals(self) -> list[bytes]:
        """Raw byte strings whose presence makes a JSON literal worth decoding."""
        out = [b for forms in self.needles().values() for b in forms]
        out += [h.encode() for h in self.hostnames]
        home = self.home_bytes()
        return out + ([home] if home else [])

    def needles(self) -> dict[str, list[bytes]]:
        """name -> byte forms of its secret value, for raw-byte checks."""
        out: dict[str, list[bytes]] = {}
        for name, value in self.secrets.items():
            forms = {value.encode(), value.encode("utf-16-le"), value.encode("utf-16-be")}
            forms.add(orjson.dumps(value)[1:-1])
            out[name] = sorted(forms)
        return out


# ---------------------------------------------------------------- raw bytes


def find_values(paths: Iterable[Path], needles: Mapping[str, list[bytes]]) -> list[str]:
    """Names whose value occurs in the raw bytes of any of ``paths`` (read in chunks)."""
    if not needles:
        return []
    longest = max(len(b) for forms in needles.values() for b in forms)
    found: set[str] = set()
    for p in paths:
        if not p.is_file():
            continue
        with open(p, "rb") as fh:
            tail = b""
            while chunk := fh.read(1 << 22):
                window = tail + chunk
                for name, forms in needles.items():
                    if name not in found and any(b in window for b in forms):
                        found.add(name)
                tail = window[-longest:]
    return sorted(found)


def _find_in(data: bytes, needles: Mapping[str, list[bytes]]) -> list[str]:
    return sorted(n for n, forms in needles.items() if any(b in data for b in forms))


def _size(paths: Iterable[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def _sidecars(path: Path) -> list[Path]:
    return [path.with_name(path.name + s) for s in SIDECARS]


# ---------------------------------------------------------------- SQLite


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _connect(path: Path) -> sqlite3.Connection:
    try:
        return sqlite3.connect(path.resolve().as_uri() + "?mode=rw", uri=True)
    except sqlite3.Error as exc:
        raise TraceError(f"{path}: cannot open the SQLite file: {exc}") from None


def _check(conn: sqlite3.Connection, path: Path) -> dict[str, int]:
    """quick_check, then the row count of every table (TraceError if unreadable)."""
    try:
        rows = [r[0] for r in conn.execute("PRAGMA quick_check")]
        if rows != ["ok"]:
            raise TraceError(f"{path}: corrupt SQLite file ({rows[0] if rows else 'no answer'})")
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' "
                "AND coalesce(sql, '') NOT LIKE 'CREATE VIRTUAL%'"
            )
        ]
        return {t: conn.execute(f"SELECT count(*) FROM {_q(t)}").fetchone()[0] for t in tables}
    except sqlite3.DatabaseError as exc:
        raise TraceError(f"{path}: corrupt SQLite file ({exc})") from None


@dataclass
class _Change:
    table: str
    column: str
    old: Any
    new: Any
    reason: str  # "env" | "home" | "meta"


def _is_meta(table: str, columns: list[str]) -> bool:
    return table.upper() == "META_DATA_CAPTURE" and {"name", "value"} <= {c.lower() for c in columns}


def _plan_sqlite(conn: sqlite3.Connection, tables: Iterable[str], rules: Rules) -> list[_Change]:
    needles = rules.needles()
    changes: list[_Change] = []
    for table in tables:
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info({_q(table)})")]
        lower = {c.lower(): c for c in columns}
        if "name" in lower and "value" in lower:  # TARGET_INFO_SYSTEM_ENV: ("Hostname", "gpu-node-7")
            n, v = _q(lower["name"]), _q(lower["value"])
            if conn.execute(f"SELECT count(*) FROM {_q(table)} WHERE upper({n}) LIKE '%HOSTNAME%' "
                            f"AND {v} IS NOT ?", (HOST_MARKER,)).fetchone()[0]:
                changes.append(_Change(table, lower["value"], lower["name"], HOST_MARKER, "hostrow"))
        if _is_meta(table, columns):
            value = next(c for c in columns if c.lower() == "value")
            pending = conn.execute(
                f"SELECT count(*) FROM {_q(table)} WHERE name LIKE '%ENVIRONMENT%' AND {_q(value)} IS NOT ?",
                (MARKER,),
            ).fetchone()[0]
            if pending:
                changes.append(_Change(table, value, None, MARKER, "meta"))
        for col in columns:
            sql = f"SELECT DISTINCT {_q(col)} FROM {_q(table)} WHERE typeof({_q(col)}) IN ('text','blob')"
            for (value,) in conn.execute(sql):
                if isinstance(value, str):
                    new, reason = rules.scrub(value)
                    if reason:
                        changes.append(_Change(table, col, value, new, reason))
                elif _find_in(bytes(value), needles):
                    changes.append(_Change(table, col, value, MARKER.encode(), "env"))
    return changes


def _apply(conn: sqlite3.Connection, changes: list[_Change], report: ScrubReport) -> None:
    serial = 0
    for ch in changes:
        t, c = _q(ch.table), _q(ch.column)
        if ch.reason == "meta":
            cur = conn.execute(
                f"UPDATE {t} SET {c} = ? WHERE name LIKE '%ENVIRONMENT%' AND {c} IS NOT ?",
                (MARKER, MARKER),
            )
            report.env_rows += cur.rowcount
            continue
        if ch.reason == "hostrow":  # ``old`` holds the name column here
            cur = conn.execute(f"UPDATE {t} SET {c} = ? WHERE upper({_q(ch.old)}) LIKE '%HOSTNAME%' AND {c} IS NOT ?",
                               (HOST_MARKER, HOST_MARKER))
            report.hosts += cur.rowcount
            continue
        new = ch.new
        while True:
            try:
                cur = conn.execute(f"UPDATE {t} SET {c} = ? WHERE {c} = ?", (new, ch.old))
                break
            except sqlite3.IntegrityError:  # a UNIQUE column: make each marker distinct
                serial += 1
                new = f"{MARKER} #{serial}"
        if ch.reason == "home":
            report.paths += cur.rowcount
        elif ch.reason == "host":
            report.hosts += cur.rowcount
        else:
            report.strings += cur.rowcount


def scrub_sqlite(path: Path, rules: Rules) -> ScrubReport:
    """Scrub an nsys SQLite export (rules: module docstring)."""
    with open_regular(path) as fh:
        if fh.read(16) != _SQLITE_MAGIC:
            raise TraceError(f"{path}: not an SQLite database")
    files = [path, *_sidecars(path)]
    report = ScrubReport(path, "sqlite", bytes_before=_size(files))
    needles = rules.needles()
    src = _connect(path)
    try:
        counts = _check(src, path)
        changes = _plan_sqlite(src, counts, rules)
        free = src.execute("PRAGMA freelist_count").fetchone()[0]
        dirty = bool(changes or free or any(p.exists() for p in files[1:]))
        if not dirty and not find_values(files, needles):
            report.bytes_after = report.bytes_before
            return report
        with atomic_path(path) as tmp:
            dst = sqlite3.connect(tmp)
            try:
                src.backup(dst)
                src.close()
                dst.execute("PRAGMA journal_mode=DELETE")
                dst.execute("PRAGMA secure_delete=ON")
                with dst:
                    _apply(dst, changes, report)
                dst.execute("VACUUM")
                after = _check(dst, tmp)
                left = dst.execute("PRAGMA freelist_count").fetchone()[0]
            finally:
                dst.close()
            if after != counts:
                raise TraceError(f"{path}: row counts changed while scrubbing; original kept")
            if left or any(p.exists() for p in _sidecars(tmp)):
                raise TraceError(f"{path}: free pages or a journal remained after VACUUM; original kept")
            still = find_values([tmp], needles)
            if still:
                raise TraceError(
                    f"{path}: the value of {', '.join(still)} is still in the file after scrubbing; original kept"
                )
    except sqlite3.Error as exc:
        raise TraceError(f"{path}: cannot scrub the SQLite file: {exc}") from None
    finally:
        src.close()
    for side in files[1:]:
        try:
            side.unlink(missing_ok=True)
        except OSError as exc:
            raise OutputError(f"cannot remove {side} (it holds the old contents): {exc.strerror}") from None
    report.rewritten = True
    report.bytes_after = _size([path])
    return report


# ---------------------------------------------------------------- JSON / Chrome traces


# Where a JSON file can need a change: cheap literal scans (each a fast search), every hit
# then checked exactly on the decoded string literal around it (JSON escapes such as
# \u0000 hide word boundaries, so no boundary is judged on raw bytes).
_JSON_HOME = re.compile(rb"/(?:home/|Users/|root)")
_JSON_SECRET_KEY = re.compile(rb'"([A-Z][A-Z0-9_]+)"\s*:\s*"')
_NAME_BYTE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


_JSON_HOST_KEY = re.compile(rb'"(' + b"|".join(k.encode() for k in HOST_KEYS) + rb')"\s*:\s*"')


def _candidates(data: bytes, literals: Iterable[bytes]) -> Iterable[int]:
    for m in re.finditer(rb"=", data):
        if m.start() and data[m.start() - 1] in _NAME_BYTE:
            yield m.start()
    for m in _JSON_HOME.finditer(data):
        yield m.start()
    for m in _TOKEN_BYTES.finditer(data):
        yield m.start()
    for m in re.finditer(rb"\\", data):  # an escape can hide any of the above: decode and judge
        yield m.start()
    for lit in literals:
        if lit:
            for m in re.finditer(re.escape(lit), data, re.IGNORECASE):
                yield m.start()


def _escaped(data: bytes, quote: int) -> bool:
    n = 0
    while quote - n - 1 >= 0 and data[quote - n - 1] == 0x5C:  # backslash
        n += 1
    return n % 2 == 1


def _literal_at(data: bytes, i: int) -> tuple[int, int] | None:
    """Span of the JSON string literal that contains byte ``i`` (quotes included)."""
    start = data.rfind(b'"', 0, i)
    while start > 0 and _escaped(data, start):
        start = data.rfind(b'"', 0, start)
    end = data.find(b'"', i)
    while end != -1 and _escaped(data, end):
        end = data.find(b'"', end + 1)
    if start < 0 or end < 0:
        return None
    return start, end + 1


def _json_edits(data: bytes, rules: Rules) -> tuple[dict[tuple[int, int], bytes], int, int]:
    """Replacements (span -> new literal) for every string literal the rules change."""
    spans: set[tuple[int, int]] = set()
    for i in _candidates(data, rules.literals()):
        span = _literal_at(data, i)
        if span is not None:
            spans.add(span)
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
            span = _literal_at(data, m.end())
            if span is not None and span[0] == m.end() - 1 and data[span[0] : span[1]] != b'""':
                edits[span], reasons[span] = orjson.dumps(MARKER), "env"
    host_marker = orjson.dumps(HOST_MARKER)
    for m in _JSON_HOST_KEY.finditer(data):  # "host_name": "gpu-node-7" -> the value goes
        span = _literal_at(data, m.end())
        if span is not None and span[0] == m.end() - 1 and data[span[0] : span[1]] not in (b'""', host_marker):
            edits[span], reasons[span] = host_marker, "host"
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


def _read_json_bytes(path: Path) -> tuple[bytes, bool]:
    with open_regular(path) as fh:
        raw = fh.read()
    if not raw.startswith(_GZIP_MAGIC):
        if path.name.endswith(".gz"):
            raise TraceError(f"{path}: not a gzip file")
        return raw, False
    try:
        return gzip.decompress(raw), True
    except EOFError:
        raise TraceError(f"{path}: truncated gzip file (it ends before the end of its data)") from None
    except (gzip.BadGzipFile, zlib.error, OSError) as exc:
        raise TraceError(f"{path}: corrupt gzip file ({exc})") from None


def _parse_json(data: bytes, path: Path) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON ({exc})") from None


def scrub_json(path: Path, rules: Rules) -> ScrubReport:
    """Scrub a Chrome trace (or any JSON file), plain or gzipped: only the string literals
    that change are rewritten, every other byte (events, numbers, layout) is kept. The
    result is parsed before it replaces the original (a file left unchanged is not
    parsed: scrub is not a validator, and a full parse of a big trace takes seconds)."""
    report = ScrubReport(path, "json", bytes_before=_size([path]))
    data, gzipped = _read_json_bytes(path)
    if data.lstrip()[:1] not in (b"{", b"["):
        raise TraceError(f"{path}: not JSON (it does not start with {{ or [)")
    edits, report.strings, report.paths, report.hosts = _json_edits(data, rules)
    needles = rules.needles()
    if not edits and not _find_in(data, needles):
        report.bytes_after = report.bytes_before
        return report
    out = _apply_edits(data, edits)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            if gzipped:
                with gzip.GzipFile(filename="", mode="wb", fileobj=fh, mtime=0, compresslevel=6) as gz:
                    gz.write(out)
            else:
                fh.write(out)
        written, _ = _read_json_bytes(tmp)
        _parse_json(written, path)  # also rejects a truncated input: only literals were edited
        if written != out or _find_in(written, needles) or find_values([tmp], needles):
            raise TraceError(f"{path}: verification of the scrubbed copy failed; original kept")
    report.rewritten = True
    report.bytes_after = _size([path])
    return report


# ---------------------------------------------------------------- text logs


def scrub_text(path: Path, rules: Rules) -> ScrubReport:
    """Scrub a log line by line: environment lines go whole, home paths become ~."""
    report = ScrubReport(path, "text", bytes_before=_size([path]))
    with open_regular(path) as fh:
        text = fh.read().decode("utf-8", errors="surrogateescape")
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
    with atomic_path(path) as tmp:
        tmp.write_bytes(new_text.encode("utf-8", errors="surrogateescape"))
    report.rewritten = True
    report.bytes_after = _size([path])
    return report


# ---------------------------------------------------------------- dispatch


def file_kind(path: Path) -> str | None:
    """"sqlite" | "json" | "text" | "nsys-rep" by name, else by first bytes, else None."""
    name = path.name.lower()
    if name.endswith(REPORT_SUFFIXES):
        return "nsys-rep"
    if name.endswith(SQLITE_SUFFIXES):
        return "sqlite"
    if name.endswith(JSON_SUFFIXES):
        return "json"
    if name.endswith(TEXT_SUFFIXES):
        return "text"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    with open_regular(path) as fh:
        head = fh.read(16)
    if head == _SQLITE_MAGIC:
        return "sqlite"
    if head.startswith(_GZIP_MAGIC) or head.lstrip()[:1] in (b"{", b"["):
        return "json"
    return None


def _unrewritable(path: Path, kind: str, rules: Rules) -> ScrubReport:
    leaks = tuple(find_values([path], rules.needles()))
    size = _size([path])
    if kind == "nsys-rep":
        note = (
            "an .nsys-rep cannot be rewritten; share the scrubbed .sqlite export instead "
            "(capture runs nsys isolated, with the allowlisted environment)"
        )
    else:
        note = "unknown file type, not rewritten (scrub rewrites .sqlite, .json, .json.gz, .log, .txt)"
    if leaks:
        note = f"holds the value of {', '.join(leaks)} in plain bytes; do not share it ({note})"
    return ScrubReport(path, kind, bytes_before=size, bytes_after=size, note=note, leaks=leaks)


def scrub_path(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None) -> ScrubReport:
    """Scrub one file in place (atomically). ``env``: whose secret values to hunt (default:
    this process's environment). A file of no known type (and an .nsys-rep) is not
    rewritten, only checked for secret values (``leaks``). UsageError for a missing path,
    TraceError for an unreadable file, OutputError for an unwritable one."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: no such file")
    if p.is_dir():
        raise UsageError(f"{p}: is a folder (scrub_tree scrubs folders)")
    report = _scrub_one(p.resolve(), Rules(env))  # resolved: a symlink's target is scrubbed
    report.path = p
    return report


def _scrub_file(p: Path, rules: Rules) -> ScrubReport:
    kind = file_kind(p)
    if kind == "sqlite":
        return scrub_sqlite(p, rules)
    if kind == "json":
        return scrub_json(p, rules)
    if kind == "text":
        return scrub_text(p, rules)
    if kind == "parquet":
        return scrub_parquet(p, rules)
    return _unrewritable(p, kind or "other", rules)


def _os_error(path: Path, exc: OSError) -> KvprofError:
    """A failed read or write as the one-line error of its kind (a full disk is exit 6)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM):
        return OutputError(f"cannot rewrite {path}: {exc.strerror or exc}; the original is kept")
    return TraceError(f"cannot read {path}: {exc.strerror or exc}")


def _scrub_one(p: Path, rules: Rules) -> ScrubReport:
    require_regular(p, "a file to scrub")  # a FIFO would block the read forever
    try:
        return _scrub_file(p, rules)
    except OSError as exc:
        raise _os_error(p, exc) from None


def scrub_tree(
    root: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    on_error: Callable[[KvprofError], None] | None = None,
) -> list[ScrubReport]:
    """Scrub every known file under ``root``; other files are only checked for secret
    values (reported when found). Symbolic links and kvprof temporaries are skipped.
    A file that fails raises, or, with ``on_error``, is passed to it and the walk goes on."""
    base = Path(root)
    if not base.is_dir():
        return [scrub_path(base, env=env)]
    rules = Rules(env)
    reports: list[ScrubReport] = []

    def unreadable(exc: OSError) -> None:  # os.walk skips what it cannot list unless told
        err = TraceError(f"cannot read the folder {exc.filename}: {exc.strerror or exc}; not scrubbed")
        if on_error is None:
            raise err
        on_error(err)

    for dirpath, dirnames, filenames in os.walk(base, onerror=unreadable):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath, name)
            if p.is_symlink() or (name.startswith(".") and ".tmp-" in name):
                continue
            if name.endswith(SIDECARS):
                continue  # handled with its database
            try:
                report = _scrub_one(p.resolve(), rules)
                if report.kind != "other" or report.leaks:  # clean unknown files: not listed
                    reports.append(report)
            except KvprofError as exc:
                if on_error is None:
                    raise
                on_error(exc)
    return reports


# ---------------------------------------------------------------- documents and tables in memory


def scrub_document(obj: Any, rules: Rules) -> Any:
    """A JSON-like value with the rules applied to every string, keys included (for outputs
    scrubbed before they are written: manifest, summary)."""
    if isinstance(obj, str):
        return rules.scrub(obj)[0]
    if isinstance(obj, dict):
        return {scrub_document(k, rules) if isinstance(k, str) else k: scrub_document(v, rules) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub_document(v, rules) for v in obj]
    return obj


def _scrub_array(arr: Any, rules: Rules) -> tuple[Any, int]:
    """(array, values changed) for a string or dictionary-of-strings Arrow array."""
    import pyarrow as pa

    if pa.types.is_dictionary(arr.type) and pa.types.is_string(arr.type.value_type):
        values = arr.dictionary.to_pylist()
        new = [v if v is None else rules.scrub(v)[0] for v in values]
        changed = sum(a != b for a, b in zip(values, new))
        if not changed:
            return arr, 0
        return pa.DictionaryArray.from_arrays(arr.indices, pa.array(new, type=arr.type.value_type)), changed
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        values = arr.to_pylist()
        new = [v if v is None else rules.scrub(v)[0] for v in values]
        changed = sum(a != b for a, b in zip(values, new))
        return (pa.array(new, type=arr.type), changed) if changed else (arr, 0)
    return arr, 0


def scrub_table(table: Any, rules: Rules) -> tuple[Any, int]:
    """(Arrow table, values changed) with the rules applied to every string column."""
    import pyarrow as pa

    columns, changed = [], 0
    for col in table.columns:
        chunks = []
        for chunk in col.chunks:
            new, n = _scrub_array(chunk, rules)
            chunks.append(new)
            changed += n
        columns.append(pa.chunked_array(chunks, type=col.type))
    return (pa.Table.from_arrays(columns, schema=table.schema), changed) if changed else (table, 0)


def scrub_frame(df: Any, rules: Rules) -> Any:
    """A pandas frame with the rules applied to its text (object, string, category) columns."""
    import pandas as pd

    out = df.copy()
    for c in out.columns:
        s = out[c]
        if isinstance(s.dtype, pd.CategoricalDtype):
            cats = [rules.scrub(x)[0] if isinstance(x, str) else x for x in s.cat.categories]
            if len(set(cats)) == len(cats):
                out[c] = s.cat.rename_categories(cats)
            else:
                out[c] = s.astype(object).map(lambda v: rules.scrub(v)[0] if isinstance(v, str) else v)
        elif s.dtype == object or pd.api.types.is_string_dtype(s.dtype):
            out[c] = s.map(lambda v: rules.scrub(v)[0] if isinstance(v, str) else v)
    return out


def scrub_parquet(path: Path, rules: Rules) -> ScrubReport:
    """Rewrite a Parquet file (analyze's events/writes) with the rules on every string column."""
    import pyarrow.parquet as pq

    report = ScrubReport(path, "parquet", bytes_before=_size([path]))
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise TraceError(f"{path}: not readable Parquet ({' '.join(str(exc).split())[:200]})") from None
    new, changed = scrub_table(table, rules)
    if not changed:
        report.bytes_after = report.bytes_before
        return report
    report.strings = changed
    with atomic_path(path) as tmp:
        pq.write_table(new, tmp, compression="zstd")
    report.rewritten = True
    report.bytes_after = _size([path])
    return report


# ---------------------------------------------------------------- --check: verify, write nothing


@dataclass
class CheckReport:
    """What ``check_path`` found in one file: each finding is (what, a short sample)."""

    path: Path
    kind: str
    findings: list[tuple[str, str]] = field(default_factory=list)
    note: str | None = None

    @property
    def clean(self) -> bool:
        return not self.findings

    def line(self) -> str:
        if self.clean:
            return f"{self.path}: clean ({self.kind}{'; ' + self.note if self.note else ''})"
        counts: dict[str, int] = {}
        for what, _ in self.findings:
            counts[what] = counts.get(what, 0) + 1
        what = ", ".join(f"{n} {w}" for w, n in sorted(counts.items()))
        sample = self.findings[0][1]
        return f"{self.path}: NOT CLEAN: {what} remain (first: {sample!r})"


_FINDING = {"env": "environment or token strings", "home": "home paths", "host": "host names"}
_SAMPLE = 48


def _judge(s: str, rules: Rules, out: list[tuple[str, str]], key: str | None = None) -> None:
    reason = rules.scrub(s)[1]
    if reason:
        out.append((_FINDING[reason], _redact(s)))
    elif key in HOST_KEYS and s and s != HOST_MARKER:
        out.append((_FINDING["host"], f"{key}: {_redact(s)}"))
    elif key is not None and _SECRET_KEY.match(key) and envsafe.is_secret_name(key) and s and s != MARKER:
        out.append((_FINDING["env"], f"{key}: ..."))


def _redact(s: str) -> str:
    """A sample for the report that does not print the secret it found in full."""
    s = " ".join(s.split())
    return s[:12] + "..." if len(s) > 12 else s[:_SAMPLE]


def _walk_json(obj: Any, rules: Rules, out: list[tuple[str, str]], key: str | None = None) -> None:
    stack: list[tuple[Any, str | None]] = [(obj, key)]
    while stack:
        cur, k = stack.pop()
        if isinstance(cur, str):
            _judge(cur, rules, out, k)
        elif isinstance(cur, dict):
            for kk, v in cur.items():
                _judge(kk, rules, out)
                stack.append((v, kk))
        elif isinstance(cur, list):
            stack.extend((v, k) for v in cur)


def _check_sqlite(path: Path, rules: Rules, out: list[tuple[str, str]]) -> None:
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise TraceError(f"{path}: cannot open the SQLite file: {exc}") from None
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND coalesce(sql, '') NOT LIKE 'CREATE VIRTUAL%'")]
        needles = rules.needles()
        for table in tables:
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({_q(table)})")]
            lower = {c.lower(): c for c in columns}
            if "name" in lower and "value" in lower:
                for (v,) in conn.execute(f"SELECT {_q(lower['value'])} FROM {_q(table)} WHERE "
                                         f"upper({_q(lower['name'])}) LIKE '%HOSTNAME%'"):
                    if v not in (None, "", HOST_MARKER):
                        out.append((_FINDING["host"], f"{table} hostname row"))
            if _is_meta(table, columns):
                for (v,) in conn.execute(f"SELECT {_q(lower['value'])} FROM {_q(table)} WHERE name LIKE '%ENVIRONMENT%'"):
                    if v not in (None, "", MARKER):
                        out.append((_FINDING["env"], f"{table} environment row"))
            for col in columns:
                sql = f"SELECT DISTINCT {_q(col)} FROM {_q(table)} WHERE typeof({_q(col)}) IN ('text','blob')"
                for (value,) in conn.execute(sql):
                    if isinstance(value, str):
                        _judge(value, rules, out)
                    elif _find_in(bytes(value), needles):
                        out.append((_FINDING["env"], f"{table}.{col} blob"))
    except sqlite3.DatabaseError as exc:
        raise TraceError(f"{path}: corrupt SQLite file ({exc})") from None
    finally:
        conn.close()


def check_file(path: Path, rules: Rules) -> CheckReport:
    """Verify one regular file without changing it (module docstring: what counts)."""
    kind = file_kind(path) or "other"
    report = CheckReport(path, kind)
    out = report.findings
    if kind == "json":
        data, _ = _read_json_bytes(path)
        _walk_json(_parse_json(data, path), rules, out)
        for name in _find_in(data, rules.needles()):
            out.append((_FINDING["env"], f"value of {name}"))
    elif kind == "sqlite":
        _check_sqlite(path, rules, out)
    elif kind == "text":
        with open_regular(path) as fh:
            for line in fh.read().decode("utf-8", errors="replace").splitlines():
                _judge(line, rules, out)
    elif kind == "parquet":
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (OSError, ValueError) as exc:
            raise TraceError(f"{path}: not readable Parquet ({' '.join(str(exc).split())[:200]})") from None
        for col in table.columns:
            values = col.combine_chunks()
            if hasattr(values, "dictionary"):
                values = values.dictionary
            if values.type in ("string", "large_string") or str(values.type) in ("string", "large_string"):
                for v in set(values.to_pylist()):
                    if isinstance(v, str):
                        _judge(v, rules, out)
    else:
        report.note = ("compressed report: only raw bytes were checked" if kind == "nsys-rep"
                       else "unknown format: only raw bytes were checked")
    for name in find_values([path, *(_sidecars(path) if kind == "sqlite" else [])], rules.needles()):
        out.append((_FINDING["env"], f"value of {name} in the raw bytes"))
    return report


def check_path(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None,
               on_error: Callable[[KvprofError], None] | None = None) -> list[CheckReport]:
    """``scrub --check``: one CheckReport per file under ``path`` (a file or a folder); nothing
    is written. Unreadable files and folders raise, or go to ``on_error``."""
    base = Path(path)
    rules = Rules(env)

    def fail(err: KvprofError) -> None:
        if on_error is None:
            raise err
        on_error(err)

    def one(p: Path) -> CheckReport | None:
        try:
            require_regular(p, "a file to check")
            return check_file(p, rules)
        except KvprofError as exc:
            fail(exc)
        except OSError as exc:
            fail(TraceError(f"cannot read {p}: {exc.strerror or exc}"))
        return None

    if not base.exists():
        raise UsageError(f"{base}: no such file or folder")
    if not base.is_dir():
        r = one(base)
        return [r] if r else []
    reports: list[CheckReport] = []

    def unreadable(exc: OSError) -> None:
        fail(TraceError(f"cannot read the folder {exc.filename}: {exc.strerror or exc}; not checked"))

    for dirpath, dirnames, filenames in os.walk(base, onerror=unreadable):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath, name)
            if p.is_symlink() or name.endswith(SIDECARS):
                continue
            r = one(p)
            if r is not None:
                reports.append(r)
    return reports
