"""Scrub rules: remove the environment and home paths from outputs before they are shared.

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
  Lower-case ``key=value`` text (kvprof's own NVTX messages) is kept, and so is kvprof's
  own advice naming one of its settings with a plain value (``_OWN_SETTING``: "set
  TRITON_INTERPRET=1 before ...", ``KVPROF_SGLANG=1``): a manifest or summary keeps
  kvprof's reasons readable; a string with any other assignment still goes whole.
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
capture runs nsys: the allowlisted environment (``kvprof.tools.envsafe``) in a private
PID namespace (``kvprof.tools.nsys.isolation_prefix``), since nsys also stores the
environment of every other process it can see.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from kvprof.core.readers import builtin_suffixes
from kvprof.tools import envsafe

MARKER = "[kvprof: environment removed]"
TOKEN_MARKER = "[kvprof: token removed]"
HOST_MARKER = "[kvprof: host]"
HOME = "~"
HOST_KEYS = ("host_name", "hostname", "hostName", "host")

# Trace formats as the trace-reader registry names them, plus what else scrub rewrites.
SQLITE_SUFFIXES = (*builtin_suffixes("nsys_sqlite"), ".sqlite3", ".db")
JSON_SUFFIXES = builtin_suffixes("kineto")
TEXT_SUFFIXES = (".log", ".txt", ".csv")
PARQUET_SUFFIXES = (".parquet",)
REPORT_SUFFIXES = (*builtin_suffixes("nsys_rep"), ".qdstrm")
SIDECARS = ("-wal", "-shm", "-journal")

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
# NAME= where NAME is env-like: all upper case (PATH, CC), or upper-case led with an _
# (PMIX_MCA_gds), or _-led (_ itself), or a lower-case proxy variable; not glued to a
# preceding word or path (so "bs=8", "tokens=256", "a==b", "x.y=1" are not).
_ASSIGNMENT = re.compile(
    r"(?<![\w.\-/:=$])(?:[A-Z][A-Z0-9]+|[A-Z][A-Z0-9]*_[A-Za-z0-9_]*|_[A-Za-z0-9_]*"
    r"|(?:http|https|ftp|all|no)_proxy)="
)
# kvprof's own hints: one of the settings it documents, set to a flag value, not glued to a
# path or word (TRITON_INTERPRET=1, KVPROF_SGLANG=1, SGLANG_PLUGINS=kvprof)
_OWN_SETTING = re.compile(
    r"(?<![\w.\-/:=$])(?:TRITON_INTERPRET|KVPROF_[A-Z0-9_]+|SGLANG_PLUGINS)=(?:0|1|true|false|kvprof)(?![\w.\-/=])"
)
_HOME_DIRS = re.compile(r"(?<![\w.\-])(?:(?:/home|/Users)/[^/\s\"'\x00:]+|/root(?=[/\s\"'\x00:]|\Z))")
SECRET_KEY = re.compile(r"[A-Z][A-Z0-9_]+\Z")
# Token-shaped strings (envsafe's known formats), as words: "task-..." or "__hf_x" are not.
_TOKEN_PREFIXES = (r"hf_|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|sk-|sk_live_|rk_live_|xox[abprs]-"
                   r"|AKIA|ASIA|AIza|ya29\.|eyJ")
_TOKEN = re.compile(r"(?<![A-Za-z0-9_\-])(?:" + _TOKEN_PREFIXES + r")[A-Za-z0-9_\-.=+/]{8,}"
                    r"|[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@\"']+:[^/\s@\"']+@")
TOKEN_BYTES = re.compile(rb"(?:" + _TOKEN_PREFIXES.encode() + rb")|://")


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
        if "=" in s:
            t = _OWN_SETTING.sub("", s)  # kvprof's advice is not an environment dump
            if _ASSIGNMENT.search(t) or (self._names is not None and self._names.search(t)):
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


def find_in(data: bytes, needles: Mapping[str, list[bytes]]) -> list[str]:
    return sorted(n for n, forms in needles.items() if any(b in data for b in forms))


def total_size(paths: Iterable[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def sidecars_of(path: Path) -> list[Path]:
    return [path.with_name(path.name + s) for s in SIDECARS]
