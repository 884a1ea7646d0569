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

MARKER = "[kvprof: environment removed]"
HOME = "~"

SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")
JSON_SUFFIXES = (".json", ".json.gz")
TEXT_SUFFIXES = (".log", ".txt")
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


@dataclass
class ScrubReport:
    """What scrub did to one file."""

    path: Path
    kind: str  # "sqlite" | "json" | "text" | "nsys-rep" | "other"
    env_rows: int = 0  # META_DATA_CAPTURE environment rows emptied (SQLite)
    strings: int = 0  # other values / strings / lines replaced by MARKER
    paths: int = 0  # values with a home path rewritten to ~
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
        if self.rewritten:
            size = f"{self.bytes_before:,} -> {self.bytes_after:,} bytes"
        else:
            size = f"unchanged, {self.bytes_before:,} bytes"
        return f"{name}: {', '.join(parts)}; {size}"


class Rules:
    """The string rules of the module docstring, built for one environment."""

    def __init__(self, env: Mapping[str, str] | None = None, home: str | None = None) -> None:
        env = os.environ if env is None else env
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
        """(new value, "env" | "home" | None)."""
        if self.is_environment(s):
            return MARKER, "env"
        new = self.strip_home(s)
        return new, ("home" if new != s else None)

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
        else:
            report.strings += cur.rowcount


def scrub_sqlite(path: Path, rules: Rules) -> ScrubReport:
    """Scrub an nsys SQLite export (rules: module docstring)."""
    with open(path, "rb") as fh:
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


def _candidates(data: bytes, literals: Iterable[bytes]) -> Iterable[int]:
    for m in re.finditer(rb"=", data):
        if m.start() and data[m.start() - 1] in _NAME_BYTE:
            yield m.start()
    for m in _JSON_HOME.finditer(data):
        yield m.start()
    for lit in literals:
        for m in re.finditer(re.escape(lit), data):
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
    literals = [b for forms in rules.needles().values() for b in forms]
    home = rules.home_bytes()
    spans: set[tuple[int, int]] = set()
    for i in _candidates(data, [*literals, *([home] if home else [])]):
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
    kinds = list(reasons.values())
    return edits, kinds.count("env"), kinds.count("home")


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
    with open(path, "rb") as fh:
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
    edits, report.strings, report.paths = _json_edits(data, rules)
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
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    lines = text.splitlines(keepends=True)
    out = []
    for line in lines:
        body = line.rstrip("\r\n")
        new, reason = rules.scrub(body)
        report.strings += reason == "env"
        report.paths += reason == "home"
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
    with open(path, "rb") as fh:
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
    report = _scrub_file(p.resolve(), Rules(env))  # resolved: a symlink's target is scrubbed
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
    return _unrewritable(p, kind or "other", rules)


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
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath, name)
            if p.is_symlink() or (name.startswith(".") and ".tmp-" in name):
                continue
            if name.endswith(SIDECARS):
                continue  # handled with its database
            try:
                report = _scrub_file(p.resolve(), rules)
                if report.kind != "other" or report.leaks:  # clean unknown files: not listed
                    reports.append(report)
            except KvprofError as exc:
                if on_error is None:
                    raise
                on_error(exc)
    return reports
