"""Scrub an nsys SQLite export in place: values replaced (same row, same id), then VACUUMed."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvprof.core.atomic import atomic_path
from kvprof.core.errors import OutputError, TraceError
from kvprof.core.files import open_regular
from kvprof.tools.scrub.rules import HOST_MARKER, MARKER, Rules, SQLITE_MAGIC, ScrubReport, find_in, find_values, sidecars_of, total_size

# ---------------------------------------------------------------- SQLite


def quote_ident(name: str) -> str:
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
        return {t: conn.execute(f"SELECT count(*) FROM {quote_ident(t)}").fetchone()[0] for t in tables}
    except sqlite3.DatabaseError as exc:
        raise TraceError(f"{path}: corrupt SQLite file ({exc})") from None


@dataclass
class _Change:
    table: str
    column: str
    old: Any
    new: Any
    reason: str  # "env" | "home" | "meta"


def is_meta_table(table: str, columns: list[str]) -> bool:
    return table.upper() == "META_DATA_CAPTURE" and {"name", "value"} <= {c.lower() for c in columns}


def _plan_sqlite(conn: sqlite3.Connection, tables: Iterable[str], rules: Rules) -> list[_Change]:
    needles = rules.needles()
    changes: list[_Change] = []
    for table in tables:
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info({quote_ident(table)})")]
        lower = {c.lower(): c for c in columns}
        if "name" in lower and "value" in lower:  # TARGET_INFO_SYSTEM_ENV: ("Hostname", "gpu-node-7")
            n, v = quote_ident(lower["name"]), quote_ident(lower["value"])
            if conn.execute(f"SELECT count(*) FROM {quote_ident(table)} WHERE upper({n}) LIKE '%HOSTNAME%' "
                            f"AND {v} IS NOT ?", (HOST_MARKER,)).fetchone()[0]:
                changes.append(_Change(table, lower["value"], lower["name"], HOST_MARKER, "hostrow"))
        if is_meta_table(table, columns):
            value = next(c for c in columns if c.lower() == "value")
            pending = conn.execute(
                f"SELECT count(*) FROM {quote_ident(table)} WHERE name LIKE '%ENVIRONMENT%' AND {quote_ident(value)} IS NOT ?",
                (MARKER,),
            ).fetchone()[0]
            if pending:
                changes.append(_Change(table, value, None, MARKER, "meta"))
        for col in columns:
            sql = f"SELECT DISTINCT {quote_ident(col)} FROM {quote_ident(table)} WHERE typeof({quote_ident(col)}) IN ('text','blob')"
            for (value,) in conn.execute(sql):
                if isinstance(value, str):
                    new, reason = rules.scrub(value)
                    if reason:
                        changes.append(_Change(table, col, value, new, reason))
                elif find_in(bytes(value), needles):
                    changes.append(_Change(table, col, value, MARKER.encode(), "env"))
    return changes


def _apply(conn: sqlite3.Connection, changes: list[_Change], report: ScrubReport) -> None:
    serial = 0
    for ch in changes:
        t, c = quote_ident(ch.table), quote_ident(ch.column)
        if ch.reason == "meta":
            cur = conn.execute(
                f"UPDATE {t} SET {c} = ? WHERE name LIKE '%ENVIRONMENT%' AND {c} IS NOT ?",
                (MARKER, MARKER),
            )
            report.env_rows += cur.rowcount
            continue
        if ch.reason == "hostrow":  # ``old`` holds the name column here
            cur = conn.execute(f"UPDATE {t} SET {c} = ? WHERE upper({quote_ident(ch.old)}) LIKE '%HOSTNAME%' AND {c} IS NOT ?",
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
        if fh.read(16) != SQLITE_MAGIC:
            raise TraceError(f"{path}: not an SQLite database")
    files = [path, *sidecars_of(path)]
    report = ScrubReport(path, "sqlite", bytes_before=total_size(files))
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
            if left or any(p.exists() for p in sidecars_of(tmp)):
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
    report.bytes_after = total_size([path])
    return report
