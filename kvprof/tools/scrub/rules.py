"""Scrub rules: remove the environment and home paths from outputs before they are shared.

An nsys SQLite export keeps the profiled process's environment (META_DATA_CAPTURE rows
``PROCESS_<n>:ENVIRONMENT_VARIABLE``, TARGET_INFO_SYSTEM_ENV's ``DeviceEnvironment``, and
NUL-separated environ blocks in StringIds, other processes' too); a Chrome trace names the
user's home in paths and may carry metadata added by anyone.

Rules (``Rules``), applied to every text value of an SQLite file and every string (keys
included) of a JSON file, and line by line to .log/.txt files:

- environment as nsys stores it: a name/value row whose name mentions ENVIRONMENT (SQLite)
  and a NUL-separated block of ``NAME=value`` entries anywhere are cut down to the entries
  ``envsafe.allowed`` passes to a profiled child (``Rules.filter_environment``: values without
  home paths or host names, an entry holding a secret dropped, ``MARKER`` when none is left).
- any other environment: a string is replaced whole by ``MARKER`` when it
  (a) contains ``NAME=`` where NAME is an environment-like name (``_ASSIGNMENT``: all
  upper case like PATH, upper-case led with an ``_`` like PMIX_MCA_gds, ``_``-led, a
  lower-case proxy variable) or any name set in the scrubbing environment, not glued
  to a preceding word or path character; or
  (b) contains the value of a variable of the scrubbing environment (default: this
  process's) that ``envsafe.looks_secret`` flags (secret-sounding name or token-shaped
  value), 6 characters or longer, unless the value could be an ordinary word (``ordinary``:
  ``stream``, ``index_put``; such a value goes only with its ``NAME=``, under its key or in
  an environment row); or
  (c) holds such a value or a token shape in any view a reader would still recognise
  (``Rules.hidden_form``, ``normalize.views``: escapes of JSON, Python, HTML and URLs
  decoded, invisible characters and ANSI sequences dropped, NFKC and look-alike letters
  folded, base64 in either alphabet at any alignment and hex in either case decoded, through
  gzip/zlib and UTF-8/16/32, 4 layers deep).
  Whole strings go because a partial cut of a ``KEY=VALUE`` block is easy to get wrong.
  Lower-case ``key=value`` text (kvprof's own NVTX messages) is kept, and so is kvprof's
  own advice naming one of its settings with a plain value (``_OWN_SETTING``: "set
  TRITON_INTERPRET=1 before ...", ``KVPROF_SGLANG=1``): a manifest or summary keeps
  kvprof's reasons readable; a string with any other assignment still goes whole.
- home paths: ``/home/<user>``, ``/Users/<user>``, ``/root`` and this user's ``~``
  become ``~`` inside the string; the rest of the string is kept.
- JSON values under a key that names a secret (``HF_TOKEN``) become ``MARKER``; adjacent
  strings of one array or object that together hold a secret (``Rules.split_secrets``: any
  number of them, one pass over them joined) too.
- token-shaped strings (``sk-...``, ``hf_...``, ``ghp_...``, AWS key ids, JWTs, URLs
  with a password: ``envsafe``'s known formats) become ``TOKEN_MARKER`` wherever they are,
  whether or not the variable that held them is set where scrub runs.
- host names: this machine's name (3 characters or more, as a word; only where it stands as a
  host, ``user@h200``, ``://h200``, ``host=h200``, when it could be an ordinary word) and the values of
  host-name fields (JSON keys ``host_name``/``hostname``/``hostName``; SQLite ``name``/``value``
  rows whose name mentions HOSTNAME) become ``HOST_MARKER``.
- JSON escapes are decoded before any rule is applied (``"sk\\u002d..."``, ``"\\/home\\/..."``).

Parquet files (analyze's outputs) get the same rules on every string column.
``check_path`` (``scrub --check``) verifies without writing: it decodes every string
(JSON escapes, gzip, SQLite text, Parquet, log lines) and reports any that the rules would
still change, plus any environment secret found in the raw bytes (``needles``: every form).
What one file may hold once decompressed is bounded (``DEFAULT_MAX_BYTES``).

SQLite values are replaced in place (same row, same id: StringIds also holds kernel names
and NVTX messages referenced by id), never deleted, then the copy is VACUUMed (with
secure_delete) so no free page keeps old bytes; the raw bytes are checked for every
secret value before the copy replaces the original, and stale -wal/-shm/-journal files
are removed. Every file is rewritten atomically, and only when something changed.

A ``.nsys-rep`` cannot be rewritten: it is reported, and scanned in plain bytes
(``raw_findings``; a miss proves nothing: parts are compressed). What keeps it clean is how
kvprof runs nsys (``kvprof capture``, ``kvprof nsys -- CMD``): the allowlisted environment
(``kvprof.tools.envsafe``) in a private PID namespace (``kvprof.tools.nsys.isolation_prefix``),
since nsys also stores the environment of every other process it can see.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import orjson

from kvprof.core.errors import ResourceError, Setting
from kvprof.core.readers import KINETO_SUFFIXES
from kvprof.core.rundir import RunDir
from kvprof.tools import envsafe
from kvprof.tools.scrub.normalize import strip_nuls, views

MARKER = "[kvprof: environment removed]"
TOKEN_MARKER = "[kvprof: token removed]"
HOST_MARKER = "[kvprof: host]"
HOME = "~"
HOST_KEYS = ("host_name", "hostname", "hostName", "host")

# Trace formats as the trace readers and the run directory name them, plus what else scrub rewrites.
SQLITE_SUFFIXES = (RunDir.NSYS_SQLITE_SUFFIX, ".sqlite3", ".db")
JSON_SUFFIXES = KINETO_SUFFIXES
TEXT_SUFFIXES = (".log", ".txt", ".csv", ".log.gz", ".txt.gz", ".csv.gz")  # logs kept gzipped too
PARQUET_SUFFIXES = (".parquet",)
ZIP_SUFFIXES = (".zip", ".npz")
ZIP_MAGIC = b"PK\x03\x04"
REPORT_SUFFIXES = (*RunDir.NSYS_REP_SUFFIXES, RunDir.NSYS_STREAM_SUFFIX)
SIDECARS = ("-wal", "-shm", "-journal")

# What scrub reads into memory from one file at most (a JSON trace after gunzip, a log): a
# 4 MB .json.gz can expand to gigabytes. ``--max-bytes`` changes it.
DEFAULT_MAX_BYTES = 2 << 30

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
    r"(?<![\w.\-/:=$])(?:(?:TRITON_INTERPRET|KVPROF_[A-Z0-9_]+|SGLANG_PLUGINS)=(?:0|1|true|false|kvprof)"
    r"|KVPROF_SGLANG_WRITER=[a-z][a-z0-9_]*)(?![\w.\-/=])"  # a writer is a variant name (triton_fused)
)
_HOME_DIRS = re.compile(r"(?<![\w.\-])(?:(?:/home|/Users)/[^/\s\"'\x00:]+|/root(?=[/\s\"'\x00:]|\Z))")
SECRET_KEY = re.compile(r"[A-Z][A-Z0-9_]+\Z")
# Token-shaped strings (envsafe's known formats), as words: "task-..." or "__hf_x" are not.
_TOKEN_PREFIXES = (r"hf_|ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|sk-|sk_live_|rk_live_|xox[abprs]-"
                   r"|AKIA|ASIA|AIza|ya29\.|eyJ")
_TOKEN = re.compile(r"(?<![A-Za-z0-9_\-])(?:" + _TOKEN_PREFIXES + r")[A-Za-z0-9_\-.=+/]{8,}"
                    r"|(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@\"']+:[^/\s@\"']+@")
# A token that starts where a JSON string starts (glued to the string before it when joined).
# (A failed try costs at most the prefix and 8 characters; URLs are placed by ``_SCHEME_RUN``.)
_TOKEN_AT = re.compile(r"(?:" + _TOKEN_PREFIXES + r")[A-Za-z0-9_\-.=+/]{8,}")
_URL_AT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@\"']+:[^/\s@\"']+@")
_SCHEME_RUN = re.compile(r"(?<![A-Za-z0-9+.\-])[A-Za-z0-9+.\-]+(?=://)")
TOKEN_BYTES = re.compile(rb"(?:" + _TOKEN_PREFIXES.encode() + rb")|://")
# In decoded bytes a token may follow any byte (b"0hf_..." is a token after a stray byte), so
# no word boundary is asked for there.
_TOKEN_IN_BYTES = re.compile(rb"(?:" + _TOKEN_PREFIXES.encode() + rb")[A-Za-z0-9_\-.=+/]{8,}"
                             rb"|(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://[^/\s:@\"']+:[^/\s@\"']+@")

# Encoded forms a secret or token is looked for in (``Rules.encoded_form``): runs of the
# base64 alphabets (standard and URL-safe, decoded at each of the 4 character offsets, so the
# secret's 3 byte alignments inside a larger payload are all seen), runs of hex digits (either
# case, both nibble offsets) and %XX escapes. A secret of 6 characters is 8 base64 or 12 hex
# characters: shorter runs cannot hold one.
_B64_RUN = re.compile(r"[A-Za-z0-9+/_\-]{8,}={0,2}")
B64_RUN_BYTES = re.compile(_B64_RUN.pattern.encode())
_HEX_RUN = re.compile(r"(?<![0-9A-Fa-f])[0-9A-Fa-f]{12,}")
HEX_RUN_BYTES = re.compile(_HEX_RUN.pattern.encode())
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
PERCENT_BYTES = re.compile(_PERCENT.pattern.encode())
ENCODED_FORMS = ("base64 (standard and URL-safe, 3 alignments)", "hex (either case)",
                 "percent, JSON, Python and HTML escapes", "UTF-8, UTF-16, UTF-32 (BOM or not)",
                 "gzip and zlib streams", "invisible and format characters, ANSI sequences",
                 "NFKC, full-width and look-alike letters")
# An environment entry, as nsys stores one: NAME=value or NAME="value".
_ENV_ENTRY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
_ENCODED_CACHE_SIZE = 1 << 16
# What nsys itself puts in the environment of the process it starts (its injection library,
# stored as a placeholder): no value of the user's.
NSYS_PLACEHOLDERS = frozenset({("LD_PRELOAD", "{}")})
# An entry of a NUL-separated environment block in raw bytes (an .nsys-rep's plain parts):
# NUL before and after, so a fragment of a compressed copy is not taken for a name.
_RAW_ENV_ENTRY = re.compile(rb"(?<=\x00)([A-Za-z_][A-Za-z0-9_]*=[\x20-\x7e]*)(?=\x00)")


def format_bytes(n: int) -> str:
    """2147483648 -> "2 GiB", 16777216 -> "16 MiB" (whole binary units where they fit)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n:,} bytes"


def too_big(path: Path, max_bytes: int, what: str = "holds") -> ResourceError:
    return ResourceError(f"{path}: {what} more than {format_bytes(max_bytes)}, scrub's limit for one file (",
                         Setting("max_bytes"), " raises it)")


_CLASSES = (str.islower, str.isupper, str.isdigit)
_WORDY = re.compile(r"[A-Za-z]+(?:[ _\-.:/][A-Za-z]+)*\Z")


_MAY_HIDE = re.compile(r"[^\t\n\r\x20-\x7e]|[\\%&]")  # what folding or an escape can change
_TEXT_VIEWS = frozenset({"plain", "folded", "escapes"})  # not a decoded payload
_WORD = re.compile(r"[^\s/]+")


def ordinary(value: str) -> bool:
    """Whether a secret value or a host name could be an ordinary word of a trace (``stream``,
    ``index_put``, ``h200``, ``cpu``): not token-shaped, and either shorter than 8 characters,
    or of fewer than 3 character classes (lower, upper, digit, other) and either shorter than
    16 characters or words of letters only. Such a value is removed only where it stands as a
    value (``NAME=value``, a secret-named key, an environment row; a host field, ``user@host``,
    ``scheme://host``, ``host=``), never as a free substring: "NVIDIA H200" keeps its H200."""
    if envsafe.looks_like_token(value):
        return False
    classes = sum(any(f(c) for c in value) for f in _CLASSES) + any(not c.isalnum() for c in value)
    if len(value) >= 8 and classes >= 3:
        return False
    return not (len(value) >= 16 and not _WORDY.match(value))


def this_hostnames() -> list[str]:
    """This machine's host name and its first label (no DNS lookup: that can take seconds)."""
    import socket

    name = socket.gethostname() or ""
    return sorted({n for n in (name, name.split(".")[0]) if len(n) >= 3 and n != "localhost"}, key=len, reverse=True)


@dataclass
class ScrubReport:
    """What scrub did to one file."""

    path: Path
    kind: str  # "sqlite" | "json" | "text" | "parquet" | "nsys-rep" | "other" | "symlink"
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
        if self.kind in ("nsys-rep", "other", "symlink", "zip"):
            return f"{name}: {self.note}"
        parts = []
        if self.kind == "sqlite":
            parts.append(f"{self.env_rows} environment rows")
        parts.append(f"{self.strings} {'lines' if self.kind == 'text' else 'strings'} removed")
        if self.note:
            parts.append(self.note)
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
                 hostnames: Iterable[str] | None = None, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        env = os.environ if env is None else env
        self.max_bytes = max_bytes  # the most one file may hold once decompressed (DEFAULT_MAX_BYTES)
        hosts = sorted({h for h in (this_hostnames() if hostnames is None else hostnames) if len(h) >= 3},
                       key=len, reverse=True)
        self.hostnames = hosts
        strong_hosts = [h for h in hosts if not ordinary(h)]
        self._hosts = (re.compile(r"(?<![A-Za-z0-9_\-])(?:" + "|".join(map(re.escape, strong_hosts))
                                  + r")(?![A-Za-z0-9_\-])", re.IGNORECASE) if strong_hosts else None)
        # an ordinary word as a host name: only where it stands as a host (``ordinary``)
        weak = "|".join(map(re.escape, sorted(set(hosts) - set(strong_hosts), key=len, reverse=True)))
        self._host_context = (re.compile(
            r"(?:(?<=@)|(?<=://)|(?<=\bhost=)|(?<=\bhost: )|(?<=\bhostname=)|(?<=\bhostname: )|(?<=\bhost_name=)"
            r"|(?<=\bnode=))(?:" + weak + r")(?![A-Za-z0-9_\-])", re.IGNORECASE) if weak else None)
        # every secret-looking value of the environment; the ones that could be ordinary words
        # (``ordinary``) only in their key=value context, the others in every form anywhere
        self.all_secrets = envsafe.sensitive_values(env)
        self.secrets = {n: v for n, v in self.all_secrets.items() if not ordinary(v)}
        self.weak_secrets = {n: v for n, v in self.all_secrets.items() if ordinary(v)}
        values = sorted(set(self.secrets.values()), key=len, reverse=True)
        self._values = re.compile("|".join(map(re.escape, values))) if values else None
        self._values_bytes = (re.compile(b"|".join(re.escape(v.encode()) for v in values)) if values else None)
        self._weak_names = frozenset(self.weak_secrets)
        self._encoded: dict[tuple[str, str], bool] = {}  # (decoder, run) -> holds a secret (runs repeat)
        self._hidden: dict[str, str | None] = {}  # string -> hidden_form (strings repeat)
        # the secrets' base64 forms as such: found even where the characters around one differ
        forms = sorted({f.decode() for v in values for f in base64_forms(v.encode())}, key=len, reverse=True)
        self._b64_forms = re.compile("|".join(map(re.escape, forms))) if forms else None
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
        """A strong secret value, or an environment assignment, in ``s`` as stored."""
        if self._values is not None and self._values.search(s):
            return True
        return self.is_assignment(s)

    def is_assignment(self, s: str) -> bool:
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

    # ------------------------------------------------------------ what a reader would recognise

    def _holds_secret(self, data: bytes) -> bool:
        """Decoded bytes hold a secret value or a token (as UTF-8, or as UTF-16/32: NULs dropped)."""
        for b in (data, strip_nuls(data)) if b"\x00" in data else (data,):
            if _TOKEN_IN_BYTES.search(b) or (self._values_bytes is not None and self._values_bytes.search(b)):
                return True
        return False

    def _run_holds_secret(self, run: str, decode: Callable[[str], Iterable[bytes]]) -> bool:
        key = (decode.__name__, run)
        hit = self._encoded.get(key)
        if hit is None:
            hit = any(self._holds_secret(view) for view in decode(run))
            if len(self._encoded) >= _ENCODED_CACHE_SIZE:
                self._encoded.clear()
            self._encoded[key] = hit
        return hit

    def _matches(self, text: str, plain: bool, assignments: bool = True) -> Iterator[tuple[int, int]]:
        """Spans of ``text`` a secret rule matches: a strong secret value, a token shape, an
        environment assignment (``plain``: the view is the string as stored, where tokens are cut
        out in place instead and assignments are judged by ``is_assignment``; not
        ``assignments``: a decoded payload, whose bytes may spell ``_=`` by chance)."""
        if self._values is not None:
            for m in self._values.finditer(text):
                yield m.start(), m.end()
        if not plain:
            for m in _TOKEN.finditer(text):
                yield m.start(), m.end()
            if assignments and "=" in text:
                t = _OWN_SETTING.sub(lambda m: " " * len(m.group()), text)
                for rx in (_ASSIGNMENT, self._names):
                    for m in rx.finditer(t) if rx is not None else ():
                        yield m.start(), m.end()

    def hidden_form(self, s: str) -> str | None:
        """How a secret is hidden in ``s`` when a reader would still recognise it, or None:
        the name of the first view (``normalize.views``: escapes, folding, base64/hex and what
        they hold) where a secret rule matches, or an encoded run whose bytes hold a secret at
        any alignment. The plain string as stored is ``is_environment``'s and the token cut's."""
        if len(s) < 6:
            return None
        if s in self._hidden:
            return self._hidden[s]
        form = self._hidden_form(s)
        if len(self._hidden) >= _ENCODED_CACHE_SIZE:
            self._hidden.clear()
        if len(s) <= 4096:  # strings repeat by the thousand in a trace; long ones rarely
            self._hidden[s] = form
        return form

    def _hidden_form(self, s: str) -> str | None:
        for v in views(s):
            if v.how == "plain":
                continue
            for _ in self._matches(v.text, plain=False, assignments=v.how in _TEXT_VIEWS):
                return v.how
        for m in _B64_RUN.finditer(s):
            if self._run_holds_secret(m.group(), base64_views):
                return "base64"
        if self._b64_forms is not None and self._b64_forms.search(s):
            return "base64"
        for m in _HEX_RUN.finditer(s):
            if self._run_holds_secret(m.group(), hex_views):
                return "hex"
        return None

    def encoded_form(self, s: str) -> str | None:
        """``hidden_form`` (kept under its earlier name)."""
        return self.hidden_form(s)

    def encoded_run(self, run: bytes) -> bool:
        """Whether a base64 or hex run found in raw bytes decodes to a secret, at any alignment or
        through the layers inside it (JSON candidates, raw bytes)."""
        text = run.decode("ascii")
        if self._b64_forms is not None and self._b64_forms.search(text):
            return True
        return self._run_holds_secret(text, base64_views) or (
            bool(_HEX_RUN.fullmatch(text)) and self._run_holds_secret(text, hex_views)) or (
            self.hidden_form(text) is not None)  # a layer inside: gzip, UTF-16/32, escapes

    def split_secrets(self, parts: list[str]) -> list[tuple[int, int]]:
        """(first, last) index of adjacent ``parts`` that together hold a secret value, a token
        or an environment assignment that no single one of them holds (a secret cut across
        JSON strings, any number of them), in any view of the parts joined (``normalize``):
        one pass over the joined text, linear in its length."""
        if len(parts) < 2 or sum(map(len, parts)) < 6:
            return []
        joined = "".join(parts)
        starts = [0, *itertools.accumulate(map(len, parts))]
        found: set[tuple[int, int]] = set()
        for v in views(joined):
            spans = list(self._matches(v.text, plain=False, assignments=v.how in _TEXT_VIEWS))
            if v.how == "plain":  # a token that starts a string, glued to the one before
                covered = 0
                for start in starts[1:-1]:
                    if start >= covered and (m := _TOKEN_AT.match(joined, start)):
                        spans.append(m.span())
                        covered = m.end()  # later starts inside it: its suffixes (linear)
                for run in _SCHEME_RUN.finditer(joined):  # a URL from the last string its scheme starts in
                    k = bisect.bisect_right(starts, run.end() - 1) - 1
                    start = max(starts[k], run.start())
                    if (m := _URL_AT.match(joined, start)) is not None:
                        spans.append(m.span())
            for a, b in spans:
                scheme = v.text.find("://", a, b)
                if scheme > a:  # a URL's scheme glued to the words before it: from its own string
                    a = max(a, starts[bisect.bisect_right(starts, v.span(scheme - 1, scheme)[0]) - 1]
                            if v.lo is None else a)
                lo, hi = v.span(a, b)
                first = bisect.bisect_right(starts, lo) - 1
                last = max(first, bisect.bisect_left(starts, hi) - 1)
                if last > first:
                    found.add((first, last))
        return sorted(found)

    # ------------------------------------------------------------ environment blocks

    def keep_entry(self, entry: str) -> str | None:
        """One ``NAME=value`` / ``NAME="value"`` entry as it may stay (home paths and host names
        taken out of the value), or None: a name outside kvprof's allow-list
        (``envsafe.allowed``), or a value holding a secret or a token in any form."""
        m = _ENV_ENTRY.match(entry)
        if m is None:
            return None
        raw = entry[m.end():]
        value = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] == '"' else raw
        if (m.group(1), value) in NSYS_PLACEHOLDERS:
            return entry
        if not envsafe.allowed(m.group(1), value):
            return None
        listed = self._values is not None and self._values.search(value)
        if listed or _TOKEN.search(value) or self.encoded_form(value):
            return None
        if self._hosts is not None:
            raw = self._hosts.sub(HOST_MARKER, raw)
        return entry[: m.end()] + self.strip_home(raw)

    def filter_environment(self, block: str) -> str:
        """An environment as nsys stores it (one entry, ``;``-separated as in DeviceEnvironment,
        or NUL-separated as a process's environ) cut down to the entries ``keep_entry`` keeps;
        ``MARKER`` when none is. Unchanged when every entry stays as it is (idempotent)."""
        if not block.strip() or block == MARKER:
            return block
        sep = "\x00" if "\x00" in block else ";"
        entries: list[str] = []
        for piece in block.split(sep):
            if entries and piece and not _ENV_ENTRY.match(piece):
                entries[-1] += sep + piece  # a separator inside a value: "A=x;y" is one entry
            else:
                entries.append(piece)
        entries = [e for e in entries if e]
        kept = [k for k in map(self.keep_entry, entries) if k is not None]
        if kept == entries:
            return block
        if not kept:
            return MARKER
        return sep.join(kept) + ("\x00" if sep == "\x00" else "")  # NUL-terminated: still a block

    def scrub(self, s: str) -> tuple[str, str | None]:
        """(new value, "env" | "home" | "host" | None); "env" covers token-shaped strings and
        secrets a reader would recognise in any view of the string (``hidden_form``). A
        NUL-separated environment block is cut down to kvprof's allow-list."""
        if "\x00" in s and "=" in s and is_environment_block(s):
            new = self.filter_environment(s)
            return (new, "env") if new != s else (s, None)
        if self.is_environment(s) or self.hidden_form(s):
            return MARKER, "env"
        reason = None
        new = s
        if _TOKEN.search(new):
            new, reason = _TOKEN.sub(TOKEN_MARKER, new), "env"
        if self._hosts is not None and self._hosts.search(new):
            new, reason = self._hosts.sub(HOST_MARKER, new), reason or "host"
        if self._host_context is not None and self._host_context.search(new):
            new, reason = self._host_context.sub(HOST_MARKER, new), reason or "host"
        if reason is None and (self._hosts is not None or self._host_context is not None) and _MAY_HIDE.search(s):
            for v in views(s):  # a host name hidden by escapes or look-alike letters
                if v.how in ("folded", "escapes") and any(rx is not None and rx.search(v.text)
                                            for rx in (self._hosts, self._host_context)):
                    return HOST_MARKER, "host"
        home = self.strip_home(new)
        if home != new:
            new, reason = home, reason or "home"
        return new, reason

    def holds_secret(self, s: str) -> bool:
        """A strong secret value or a token in ``s``, in any view of it (not assignments: for
        text such as an SQL statement, where ``NAME=`` is no environment)."""
        return bool((self._values is not None and self._values.search(s)) or _TOKEN.search(s)
                    or self.hidden_form(s))

    def redact(self, s: str) -> str:
        """``s`` (a line for the terminal, a path) with each of its words (between spaces and
        slashes) that holds a secret in any form a rule finds replaced: what scrub prints never
        shows one; control characters are shown escaped."""
        def word(m: re.Match[str]) -> str:
            w = m.group()
            return TOKEN_MARKER if self.scrub(w)[1] == "env" else w

        s = _WORD.sub(word, s)
        return "".join(c if c.isprintable() or c == "\t" else ascii(c)[1:-1] for c in s)

    def literals(self) -> list[bytes]:
        """Raw byte strings whose presence makes a JSON literal worth decoding."""
        out = [b for forms in self.needles().values() for b in forms]
        out += [h.encode() for h in self.hostnames]
        home = self.home_bytes()
        return out + ([home] if home else [])

    def needles(self) -> dict[str, list[bytes]]:
        """name -> byte forms of its secret value, for raw-byte checks: UTF-8, UTF-16, UTF-32, JSON
        escaped, base64 and URL-safe base64 at its 3 alignments, hex in either case, percent-encoded."""
        out: dict[str, list[bytes]] = {}
        for name, value in self.secrets.items():
            raw = value.encode()
            forms = {raw, value.encode("utf-16-le"), value.encode("utf-16-be"), value.encode("utf-32-le"),
                     value.encode("utf-32-be"), orjson.dumps(value)[1:-1],
                     raw.hex().encode(), raw.hex().upper().encode()}
            for quoted in (quote(value, safe=""), re.sub(r"%[0-9A-F]{2}", lambda m: m.group().lower(),
                                                         quote(value, safe=""))):
                forms.add(quoted.encode())
            forms.update(base64_forms(raw))
            out[name] = sorted(f for f in forms if f)
        return out


# ---------------------------------------------------------------- encodings


def base64_forms(raw: bytes) -> set[bytes]:
    """The base64 characters that encode ``raw`` whatever precedes it: at each of its 3
    byte alignments, standard and URL-safe alphabets, without the characters the neighbouring
    bytes also decide (so each form is found inside any larger base64 payload)."""
    out: set[bytes] = set()
    for align in range(3):
        enc = base64.b64encode(b"\x00" * align + raw).rstrip(b"=")
        start = {0: 0, 1: 2, 2: 3}[align]  # characters that mix the padding bytes in
        end = len(enc) - (1 if (align + len(raw)) % 3 else 0)  # the last one mixes the next byte in
        form = enc[start:end]
        if len(form) >= 6:
            out.add(form)
            out.add(form.translate(bytes.maketrans(b"+/", b"-_")))
    return out


def base64_views(run: str) -> Iterator[bytes]:
    """A base64 run decoded from each of its first 4 characters (a run may start with a
    character that is not part of the payload), in its alphabet (URL-safe if it has - or _)."""
    body = run.rstrip("=").replace("-", "+").replace("_", "/")
    for start in range(4):
        chunk = body[start:]
        if len(chunk) % 4 == 1:
            chunk = chunk[:-1]
        if len(chunk) < 8:
            return
        yield binascii.a2b_base64(chunk + "=" * (-len(chunk) % 4))


def hex_views(run: str) -> Iterator[bytes]:
    """A hex run decoded at both nibble offsets."""
    for start in (0, 1):
        chunk = run[start:]
        yield bytes.fromhex(chunk[: len(chunk) - len(chunk) % 2])


def is_environment_block(s: str) -> bool:
    """A NUL-separated list of ``NAME=value`` entries (a process's environ, as nsys stores it)."""
    parts = [p for p in s.split("\x00") if p]
    return bool(parts) and all(_ENV_ENTRY.match(p) for p in parts)


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


def raw_findings_bytes(window: bytes, rules: Rules) -> list[tuple[str, str]]:
    """What bytes scrub cannot decode as a format show (``raw_findings``), in one window: token
    shapes and secret values (also with NULs dropped: UTF-16/32 text), base64/hex runs holding a
    secret, environment entries outside kvprof's allow-list in NUL-separated blocks."""
    found: dict[tuple[str, str], None] = {}
    for b in (window, strip_nuls(window)) if b"\x00" in window else (window,):
        for m in _TOKEN_IN_BYTES.finditer(b):
            found[("token-shaped strings", m.group()[:6].decode("ascii", "replace") + "...")] = None
        if rules._values_bytes is not None:
            for m in rules._values_bytes.finditer(b):
                found[("secret values", ascii(m.group()[:4].decode("utf-8", "replace"))[1:-1] + "...")] = None
    for rx in (B64_RUN_BYTES, HEX_RUN_BYTES):
        for m in rx.finditer(window):
            if rules.encoded_run(m.group()):
                found[("encoded secrets", m.group()[:6].decode("ascii") + "...")] = None
    for m in _RAW_ENV_ENTRY.finditer(window):
        entry = m.group(1).decode("ascii")
        if rules.keep_entry(entry) is None:  # a home path there is the child's HOME: kept
            found[(ALLOW_LIST_FINDING, entry.split("=", 1)[0])] = None
    return list(found)


def raw_findings(paths: Iterable[Path], rules: Rules) -> list[tuple[str, str]]:
    """What the raw bytes of a file scrub cannot decode (an .nsys-rep, an unknown format) show
    (``raw_findings_bytes``); (what, short sample) each. Read in overlapping chunks."""
    found: dict[tuple[str, str], None] = {}
    overlap = 1 << 12
    for p in paths:
        with open(p, "rb") as fh:
            tail = b""
            while chunk := fh.read(1 << 22):
                window = tail + chunk
                found.update(dict.fromkeys(raw_findings_bytes(window, rules)))
                tail = window[-overlap:]
    return list(found)


ALLOW_LIST_FINDING = "environment variables outside kvprof's allow-list"


def find_in(data: bytes, needles: Mapping[str, list[bytes]]) -> list[str]:
    return sorted(n for n, forms in needles.items() if any(b in data for b in forms))


def total_size(paths: Iterable[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def sidecars_of(path: Path) -> list[Path]:
    return [path.with_name(path.name + s) for s in SIDECARS]
