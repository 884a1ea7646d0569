"""``scrub --check``: decode every string of a file and report what the rules would still change."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvprof.core.errors import KvprofError, TraceError, UsageError
from kvprof.core.files import open_regular, require_regular
from kvprof.tools import envsafe
from kvprof.tools.scrub.files import file_kind
from kvprof.tools.scrub.rules import HOST_KEYS, HOST_MARKER, MARKER, Rules, SECRET_KEY, SIDECARS, find_in, find_values, sidecars_of
from kvprof.tools.scrub.sqlite import is_meta_table, quote_ident
from kvprof.tools.scrub.text import parse_json, read_json_bytes

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
    elif key is not None and SECRET_KEY.match(key) and envsafe.is_secret_name(key) and s and s != MARKER:
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
            columns = [r[1] for r in conn.execute(f"PRAGMA table_info({quote_ident(table)})")]
            lower = {c.lower(): c for c in columns}
            if "name" in lower and "value" in lower:
                for (v,) in conn.execute(f"SELECT {quote_ident(lower['value'])} FROM {quote_ident(table)} WHERE "
                                         f"upper({quote_ident(lower['name'])}) LIKE '%HOSTNAME%'"):
                    if v not in (None, "", HOST_MARKER):
                        out.append((_FINDING["host"], f"{table} hostname row"))
            if is_meta_table(table, columns):
                for (v,) in conn.execute(f"SELECT {quote_ident(lower['value'])} FROM {quote_ident(table)} WHERE name LIKE '%ENVIRONMENT%'"):
                    if v not in (None, "", MARKER):
                        out.append((_FINDING["env"], f"{table} environment row"))
            for col in columns:
                sql = f"SELECT DISTINCT {quote_ident(col)} FROM {quote_ident(table)} WHERE typeof({quote_ident(col)}) IN ('text','blob')"
                for (value,) in conn.execute(sql):
                    if isinstance(value, str):
                        _judge(value, rules, out)
                    elif find_in(bytes(value), needles):
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
        data, _ = read_json_bytes(path)
        _walk_json(parse_json(data, path), rules, out)
        for name in find_in(data, rules.needles()):
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
    for name in find_values([path, *(sidecars_of(path) if kind == "sqlite" else [])], rules.needles()):
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
