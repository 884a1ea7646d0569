"""``scrub --check``: decode every string of a file and report what the rules would still change."""

from __future__ import annotations

import os
import sqlite3
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvprof.core.errors import KvprofError, TraceError, UsageError
from kvprof.core.files import require_regular
from kvprof.tools import envsafe
from kvprof.tools.scrub.files import file_kind
from kvprof.tools.scrub.normalize import guess_encoding
from kvprof.tools.scrub.rules import (
    ALLOW_LIST_FINDING,
    DEFAULT_MAX_BYTES,
    ENCODED_FORMS,
    HOST_KEYS,
    HOST_MARKER,
    MARKER,
    SECRET_KEY,
    SIDECARS,
    Rules,
    find_in,
    find_values,
    raw_findings,
    raw_findings_bytes,
    sidecars_of,
    too_big,
    total_size,
)
from kvprof.tools.scrub.sqlite import env_rows_condition, quote_ident
from kvprof.tools.scrub.text import parse_json, read_bounded, read_json_bytes, split_secret_strings

# ---------------------------------------------------------------- --check: verify, write nothing


@dataclass
class CheckReport:
    """What ``check_path`` found in one file: each finding is (what, a short sample).
    ``partial`` says what could not be read (an .nsys-rep's compressed parts, a format scrub
    does not decode): such a file is never called clean, only "nothing found"."""

    path: Path
    kind: str
    findings: list[tuple[str, str]] = field(default_factory=list)
    note: str | None = None
    partial: str | None = None

    @property
    def clean(self) -> bool:
        return not self.findings

    def line(self) -> str:
        where = f"{self.kind}{'; ' + self.note if self.note else ''}"
        if self.clean:
            if self.partial:
                return f"{self.path}: nothing found, NOT FULLY READ ({where}; {self.partial})"
            return f"{self.path}: clean ({where})"
        counts: dict[str, int] = {}
        for what, _ in self.findings:
            counts[what] = counts.get(what, 0) + 1
        what = ", ".join(f"{n} {w}" for w, n in sorted(counts.items()))
        sample = self.findings[0][1]
        return f"{self.path}: NOT CLEAN: {what} remain (first: {sample!r}){' (' + self.note + ')' if self.note else ''}"


_FINDING = {"env": "environment or token strings", "home": "home paths", "host": "host names"}
_SAMPLE = 48
COVERED = ("plain text, " + ", ".join(ENCODED_FORMS)
           + ", secrets cut across adjacent JSON strings (any number), zip members, file and folder names")
RAW_ONLY = "raw bytes only: secret values in every form, token shapes, environment entries"


def _judge(s: str, rules: Rules, out: list[tuple[str, str]], key: str | None = None) -> None:
    reason = rules.scrub(s)[1]
    if reason:
        form = rules.encoded_form(s) if reason == "env" and not rules.is_environment(s) else None
        out.append((f"{form} secrets" if form else _FINDING[reason], _redact(s)))
    elif key in HOST_KEYS and s and s != HOST_MARKER:
        out.append((_FINDING["host"], f"{key}: {_redact(s)}"))
    elif key is not None and SECRET_KEY.match(key) and envsafe.is_secret_name(key) and s and s != MARKER:
        out.append((_FINDING["env"], f"{key}: ..."))


def _redact(s: str) -> str:
    """A sample for the report that does not print the secret it found in full: at most its
    first 6 characters, as ASCII escapes (no control sequence reaches the terminal)."""
    s = " ".join(s.split())
    return ascii(s[:6])[1:-1] + "..." if len(s) > 6 else ascii(s)[1:-1]


def _walk_json(obj: Any, rules: Rules, out: list[tuple[str, str]], key: str | None = None) -> None:
    """Judge every string of a JSON document once (names and kinds repeat by the thousand);
    values under a host-name or secret-named key with their key."""
    plain: set[str] = set()
    keyed: set[tuple[str, str]] = set()
    stack: list[tuple[Any, str | None]] = [(obj, key)]
    while stack:
        cur, k = stack.pop()
        if isinstance(cur, str):
            if k is not None and (k in HOST_KEYS or SECRET_KEY.match(k)):
                keyed.add((k, cur))
            else:
                plain.add(cur)
        elif isinstance(cur, dict):
            plain.update(cur)
            stack.extend((v, kk) for kk, v in cur.items())
        elif isinstance(cur, list):
            stack.extend((v, k) for v in cur)
    for s in plain:
        _judge(s, rules, out)
    for k, s in keyed:
        _judge(s, rules, out, k)
    for container, where in split_secret_strings(obj, rules):
        out.append(("secrets cut across adjacent JSON strings", _redact(container[where])))


def _check_sqlite(path: Path, rules: Rules, out: list[tuple[str, str]]) -> None:
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise TraceError(f"{path}: cannot open the SQLite file: {exc}") from None
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND coalesce(sql, '') NOT LIKE 'CREATE VIRTUAL%'")]
        needles = rules.needles()
        for (kind, name, sql) in conn.execute("SELECT type, name, coalesce(sql, '') FROM sqlite_master"):
            if rules.scrub(str(name))[1] == "env" or rules.holds_secret(str(sql)):
                out.append((SCHEMA_FINDING, f"{kind} {_redact(str(name))}"))
        for table in tables:
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({quote_ident(table)})")]
            lower = {c.lower(): c for c in columns}
            env_rows = env_rows_condition(lower)
            if env_rows:
                for (v,) in conn.execute(f"SELECT {quote_ident(lower['value'])} FROM {quote_ident(table)} WHERE "
                                         f"upper({quote_ident(lower['name'])}) LIKE '%HOSTNAME%'"):
                    if v not in (None, "", HOST_MARKER):
                        out.append((_FINDING["host"], f"{table} hostname row"))
                for (v,) in conn.execute(f"SELECT DISTINCT {quote_ident(lower['value'])} FROM {quote_ident(table)} "
                                         f"WHERE {env_rows} AND typeof({quote_ident(lower['value'])}) = 'text'"):
                    if rules.filter_environment(v) != v:
                        out.append((ALLOW_LIST_FINDING, f"{table} environment row"))
            for col in columns:
                skip = f" AND NOT coalesce({env_rows}, 0)" if env_rows and col == lower["value"] else ""
                sql = (f"SELECT DISTINCT {quote_ident(col)} FROM {quote_ident(table)} "
                       f"WHERE typeof({quote_ident(col)}) IN ('text','blob'){skip}")
                for (value,) in conn.execute(sql):
                    if isinstance(value, str):
                        _judge(value, rules, out)
                    elif find_in(bytes(value), needles):
                        out.append((_FINDING["env"], f"{table}.{col} blob"))
    except sqlite3.DatabaseError as exc:
        raise TraceError(f"{path}: corrupt SQLite file ({exc})") from None
    finally:
        conn.close()


SCHEMA_FINDING = "secrets in SQLite table, column or index names"
NAME_FINDING = "secrets in file or folder names"


def _check_text(data: bytes, rules: Rules, out: list[tuple[str, str]]) -> None:
    """A log: read in its encoding (UTF-8/16/32, BOM or not), every line judged."""
    codec, skip = guess_encoding(data)
    for line in data[skip:].decode(codec, errors="replace").splitlines():
        _judge(line, rules, out)


def _check_zip(path: Path, rules: Rules, out: list[tuple[str, str]]) -> None:
    """Every member of a zip (an .npz, an archive of logs), stored or deflated: its name judged,
    its content inflated as a stream (at most ``max_bytes`` in all) and judged as text and as
    raw bytes."""
    import zipfile

    total = 0
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                _judge(info.filename, rules, out)
                chunks: list[bytes] = []
                with zf.open(info) as fh:
                    while chunk := fh.read(1 << 20):
                        total += len(chunk)
                        if total > rules.max_bytes:
                            raise too_big(path, rules.max_bytes, "decompresses to")
                        chunks.append(chunk)
                data = b"".join(chunks)
                before = len(out)
                _check_text(data, rules, out)
                if len(out) == before:
                    out += [(w, f"{_redact(info.filename)}: {s}") for w, s in raw_findings_bytes(data, rules)]
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, EOFError, zlib.error) as exc:
        raise TraceError(f"{path}: not a readable zip file ({' '.join(str(exc).split())[:120]})") from None


def _check_parquet(path: Path, rules: Rules, out: list[tuple[str, str]]) -> None:
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        if size > rules.max_bytes:
            raise too_big(path, rules.max_bytes, "decompresses to")
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


def check_file(path: Path, rules: Rules) -> CheckReport:
    """Verify one regular file without changing it (module docstring: what counts)."""
    kind = file_kind(path) or "other"
    report = CheckReport(path, kind)
    out = report.findings
    files = [path, *(sidecars_of(path) if kind == "sqlite" else [])]
    if kind in ("sqlite", "nsys-rep", "other", "zip") and total_size(files) > rules.max_bytes:
        raise too_big(path, rules.max_bytes)
    if kind == "json":
        data, _ = read_json_bytes(path, rules.max_bytes)
        _walk_json(parse_json(data, path), rules, out)
        for name in find_in(data, rules.needles()):
            out.append((_FINDING["env"], f"value of {name}"))
    elif kind == "sqlite":
        _check_sqlite(path, rules, out)
    elif kind == "text":
        _check_text(read_bounded(path, rules.max_bytes, gunzip=True)[0], rules, out)
    elif kind == "parquet":
        _check_parquet(path, rules, out)
    elif kind == "zip":
        _check_zip(path, rules, out)
    else:
        report.partial = ("its compressed parts cannot be read; " if kind == "nsys-rep"
                          else "a format scrub does not decode; ") + RAW_ONLY
        out += raw_findings([path], rules)
    for name in find_values(files, rules.needles()):
        out.append((_FINDING["env"], f"value of {name} in the raw bytes"))
    return report


def check_path(path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None,
               on_error: Callable[[KvprofError], None] | None = None,
               max_bytes: int = DEFAULT_MAX_BYTES, rules: Rules | None = None) -> list[CheckReport]:
    """``scrub --check``: one CheckReport per file under ``path`` (a file or a folder); nothing
    is written. A symbolic link is followed and its target checked, the line saying so (a link
    out of the folder too); a link to a folder, or a broken one, is reported as not read.
    ``rules`` (else built from ``env`` and ``max_bytes``): to check against a fixed
    environment, home and host names whatever the machine. Unreadable files and folders
    raise, or go to ``on_error``."""
    base = Path(path)
    rules = Rules(env, max_bytes=max_bytes) if rules is None else rules

    def fail(err: KvprofError) -> None:
        if on_error is None:
            raise err
        on_error(err)

    def one(p: Path) -> CheckReport | None:
        return _with_name(p, _one(p), rules)

    def _one(p: Path) -> CheckReport | None:
        try:
            if p.is_symlink():
                return _linked(p, base, rules)
            require_regular(p, "a file to check")
            return check_file(p, rules)
        except KvprofError as exc:
            fail(exc)
        except OSError as exc:
            fail(TraceError(f"cannot read {p}: {exc.strerror or exc}"))
        return None

    if not base.exists() and not base.is_symlink():
        raise UsageError(f"{base}: no such file or folder")
    if not base.is_dir():
        r = one(base)
        return [r] if r else []
    named = [(NAME_FINDING, _redact(part)) for part in base.parts if rules.scrub(part)[1] == "env"]
    reports = [CheckReport(display_path(base, rules), "folder", named)] if named else []

    def unreadable(exc: OSError) -> None:
        fail(TraceError(f"cannot read the folder {display_path(Path(exc.filename or base), rules)}: "
                        f"{exc.strerror or exc}; not checked"))

    for dirpath, dirnames, filenames in os.walk(base, onerror=unreadable):
        dirnames.sort()
        reports += [CheckReport(display_path(Path(dirpath, d), rules), "folder", [(NAME_FINDING, _redact(d))])
                    for d in dirnames if rules.scrub(d)[1] == "env" and not Path(dirpath, d).is_symlink()]
        for name in sorted(filenames) + [d for d in dirnames if Path(dirpath, d).is_symlink()]:
            if name.endswith(SIDECARS):
                continue
            r = one(Path(dirpath, name))
            if r is not None:
                reports.append(r)
    return reports


def _with_name(p: Path, report: CheckReport | None, rules: Rules) -> CheckReport | None:
    """A file's report with its name judged too (a secret there is a finding) and its path as
    printed (``display_path``)."""
    named = [(NAME_FINDING, _redact(p.name))] if rules.scrub(p.name)[1] == "env" else []
    if report is None and named:
        report = CheckReport(p, "name")
    if report is not None:
        report.findings[:0] = named
        report.path = display_path(report.path if report.path != p else p, rules)
    return report


def display_path(p: Path, rules: Rules) -> Path:
    """``p`` as scrub prints it: a part of it that holds a secret (in any form) shown redacted."""
    parts = [rules.redact(part) if rules.scrub(part)[1] == "env" else part for part in p.parts]
    return Path(*parts) if parts else p


def _linked(link: Path, base: Path, rules: Rules) -> CheckReport:
    """A symbolic link: its target checked (a regular file), else a report that it was not read."""
    target = Path(os.path.realpath(link))
    inside = target == base.resolve() or base.resolve() in target.parents
    where = f"symbolic link to {target}{'' if inside else ', outside ' + str(base)}"
    if target.is_file():
        require_regular(target, "a file to check")
        report = check_file(target, rules)
        report.path, report.note = link, where + ("; " + report.note if report.note else "")
        return report
    if target.is_dir():
        why = "a folder, not followed"
    else:
        why = "nothing there" if not target.exists() else "not a regular file"
    report = CheckReport(link, "symlink", note=f"{where}: {why}")
    report.findings.append(("files not read", f"{link.name} -> {target.name}"))
    return report
