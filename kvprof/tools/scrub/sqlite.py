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
from kvprof.tools.scrub.rules import (
    HOST_MARKER,
    MARKER,
    SQLITE_MAGIC,
    Rules,
    ScrubReport,
    find_in,
    find_values,
    sidecars_of,
    too_big,
    total_size,
)


def _schema_secrets(schema: list[tuple[str, str]], rules: Rules) -> list[str]:
    """Names in the schema (tables, columns in their CREATE statements, indexes) that hold a secret."""
    return [name for name, sql in schema if rules.scrub(name)[1] == "env" or rules.holds_secret(sql)]

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
    reason: str  # "env" | "home" | "host" | "hostrow" | "envrow"
    name: tuple[str, str] | None = None  # envrow: (name column, the row's name)


def env_rows_condition(columns: dict[str, str]) -> str:
    """SQL condition selecting the environment rows of a name/value table (META_DATA_CAPTURE's
    ``PROCESS_<n>:ENVIRONMENT_VARIABLE``, TARGET_INFO_SYSTEM_ENV's ``DeviceEnvironment``);
    "" for a table without name and value columns. ``columns``: lower-case name -> name."""
    if "name" in columns and "value" in columns:
        return f"upper({quote_ident(columns['name'])}) LIKE '%ENVIRONMENT%'"
    return ""


def _plan_sqlite(conn: sqlite3.Connection, tables: Iterable[str], rules: Rules) -> list[_Change]:
    needles = rules.needles()
    changes: list[_Change] = []
    for table in tables:
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info({quote_ident(table)})")]
        lower = {c.lower(): c for c in columns}
        env_rows = env_rows_condition(lower)
        if env_rows:  # TARGET_INFO_SYSTEM_ENV: ("Hostname", "gpu-node-7"), ("DeviceEnvironment", "A=1;B=2")
            n, v = quote_ident(lower["name"]), quote_ident(lower["value"])
            if conn.execute(f"SELECT count(*) FROM {quote_ident(table)} WHERE upper({n}) LIKE '%HOSTNAME%' "
                            f"AND {v} IS NOT ?", (HOST_MARKER,)).fetchone()[0]:
                changes.append(_Change(table, lower["value"], lower["name"], HOST_MARKER, "hostrow"))
            for name, value in conn.execute(f"SELECT DISTINCT {n}, {v} FROM {quote_ident(table)} "
                                            f"WHERE {env_rows} AND typeof({v}) = 'text'"):
                new = rules.filter_environment(value)  # down to kvprof's allow-list
                if new != value:
                    changes.append(_Change(table, lower["value"], value, new, "envrow", (lower["name"], name)))
        for col in columns:
            skip = f" AND NOT coalesce({env_rows}, 0)" if env_rows and col == lower["value"] else ""
            sql = (f"SELECT DISTINCT {quote_ident(col)} FROM {quote_ident(table)} "
                   f"WHERE typeof({quote_ident(col)}) IN ('text','blob'){skip}")
            for (value,) in conn.execute(sql):
                if isinstance(value, str):
                    new, reason = rules.scrub(value)
                    if reason:
                        changes.append(_Change(table, col, value, new, reason))
                elif find_in(bytes(value), needles):
                    changes.append(_Change(table, col, value, MARKER.encode(), "env"))
    return changes


# UNIQUE or PRIMARY KEY: two values replaced by the same marker collide; a number makes each
# distinct. Any other refusal (CHECK, NOT NULL, a trigger's RAISE) no marker can satisfy.
_UNIQUE_ERRORS = frozenset({"SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_PRIMARYKEY"})
MAX_MARKER_TRIES = 100


def _first_free_serial(conn: sqlite3.Connection, table: str, column: str) -> int:
    """One past the markers already numbered in this column (a file scrubbed before)."""
    sql = f"SELECT count(*) FROM {quote_ident(table)} WHERE {quote_ident(column)} LIKE ?"
    return int(conn.execute(sql, (MARKER[:-1] + "%",)).fetchone()[0])


def _update_value(conn: sqlite3.Connection, ch: _Change, state: dict[tuple[str, str], int], path: Path) -> int:
    """UPDATE one value everywhere it occurs; rows changed. A UNIQUE collision gets a numbered
    marker (at most MAX_MARKER_TRIES tries); any other constraint is a one-line TraceError."""
    t, c = quote_ident(ch.table), quote_ident(ch.column)
    where, params = f"{c} = ?", [ch.old]
    if ch.name is not None:  # one environment row's value: only where the name matches too
        where, params = where + f" AND {quote_ident(ch.name[0])} = ?", params + [ch.name[1]]
    new = ch.new
    for _ in range(MAX_MARKER_TRIES):
        try:
            return conn.execute(f"UPDATE {t} SET {c} = ? WHERE {where}", (new, *params)).rowcount
        except sqlite3.IntegrityError as exc:
            if getattr(exc, "sqlite_errorname", "") not in _UNIQUE_ERRORS:
                raise TraceError(f"{path}: cannot replace a value in {ch.table}.{ch.column}: the file refuses it "
                                 f"({' '.join(str(exc).split())[:120]}); original kept") from None
            key = (ch.table, ch.column)
            state[key] = state.get(key) or _first_free_serial(conn, ch.table, ch.column)
            state[key] += 1
            new = f"{MARKER} #{state[key]}" if isinstance(ch.new, str) else f"{MARKER} #{state[key]}".encode()
    raise TraceError(f"{path}: cannot replace a value in {ch.table}.{ch.column}: {MAX_MARKER_TRIES} markers "
                     "collided with values already there; original kept")


def _apply(conn: sqlite3.Connection, changes: list[_Change], report: ScrubReport, path: Path) -> None:
    serials: dict[tuple[str, str], int] = {}
    for ch in changes:
        t, c = quote_ident(ch.table), quote_ident(ch.column)
        if ch.reason == "envrow":
            report.env_rows += _update_value(conn, ch, serials, path)
            continue
        if ch.reason == "hostrow":  # ``old`` holds the name column here
            cur = conn.execute(f"UPDATE {t} SET {c} = ? WHERE upper({quote_ident(ch.old)}) LIKE '%HOSTNAME%' "
                               f"AND {c} IS NOT ?", (HOST_MARKER, HOST_MARKER))
            report.hosts += cur.rowcount
            continue
        rows = _update_value(conn, ch, serials, path)
        if ch.reason == "home":
            report.paths += rows
        elif ch.reason == "host":
            report.hosts += rows
        else:
            report.strings += rows


def scrub_sqlite(path: Path, rules: Rules) -> ScrubReport:
    """Scrub an nsys SQLite export (rules: module docstring)."""
    with open_regular(path) as fh:
        if fh.read(16) != SQLITE_MAGIC:
            raise TraceError(f"{path}: not an SQLite database")
    files = [path, *sidecars_of(path)]
    if total_size(files) > rules.max_bytes:
        raise too_big(path, rules.max_bytes)
    report = ScrubReport(path, "sqlite", bytes_before=total_size(files))
    needles = rules.needles()
    src = _connect(path)
    try:
        counts = _check(src, path)
        src_schema = [r for r in src.execute("SELECT name, coalesce(sql, '') FROM sqlite_master")]
        if _schema_secrets(src_schema, rules):
            report.note = "a table, column or index name holds a secret; names cannot be renamed"
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
                    _apply(dst, changes, report, path)
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
            schema = _schema_secrets(src_schema, rules)
            if still and schema:  # a name cannot be replaced: the file is kept scrubbed, the rest reported
                report.leaks = tuple(still)
                report.note = (f"{len(schema)} table, column or index names hold a secret; they cannot be "
                               "renamed: do not share this file")
            elif still:
                raise TraceError(
                    f"{path}: the value of {', '.join(still)} is still in the file after scrubbing; original kept"
                )
    except sqlite3.Error as exc:
        raise TraceError(f"{path}: cannot scrub the SQLite file: {' '.join(str(exc).split())[:200]}; "
                         "original kept") from None
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
