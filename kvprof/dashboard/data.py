"""Where the dashboard's numbers come from: ``analyze``'s files, read once and cached.

A run is a folder under a traces root holding a manifest.json, traces, or analyze's
outputs. When its outputs (summary.json, writes.parquet, events.parquet) are there they
are read as they are; when not, kvprof's own pipeline (``load`` -> ``analyze`` ->
``write_analysis``) writes them into a cache folder outside the root, so the dashboard
never computes a metric of its own and never writes into the traces root.

Every path is resolved and checked against the root before it is read (symlinks and
manifest entries included), so nothing outside the root is ever opened. Uploads are
written to a temporary file outside the root, analysed, and only their outputs kept.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pandas as pd
import pyarrow.parquet as pq
import streamlit as st

from kvprof import api
from kvprof.core.bench_result import bench_cache_root
from kvprof.core.errors import KvprofError
from kvprof.core.rundir import RunDir, parse_summary
from kvprof.core.schema import GPU_WORK_KINDS

REPO = Path(__file__).resolve().parents[2]
CHECKOUT = (REPO / "pyproject.toml").is_file() and (REPO / "traces" / "samples").is_dir()


def bundled_samples() -> Path:
    """The samples shipped in the package (kvprof/samples): what an installed kvprof opens."""
    from importlib.resources import files

    return Path(str(files("kvprof").joinpath("samples")))


# In a checkout the samples' own folder (the package's samples link there); installed, the package's copy.
# Never the current directory.
DEFAULT_ROOT = REPO / "traces" / "samples" if CHECKOUT else bundled_samples()

ENV_ROOTS = "KVPROF_DASHBOARD_ROOTS"  # os.pathsep-separated traces roots; the first is the default
ENV_RUN = "KVPROF_DASHBOARD_RUN"  # a run folder to open first
ENV_MAX_UPLOAD_MB = "KVPROF_DASHBOARD_MAX_UPLOAD_MB"
ENV_CACHE = "KVPROF_DASHBOARD_CACHE"  # where outputs of runs without them, and of uploads, go

DEFAULT_MAX_UPLOAD_MB = 200
MAX_BENCH_BYTES = 64 << 20
MAX_SUMMARY_BYTES = 256 << 20
OUTPUTS = (RunDir.SUMMARY, RunDir.WRITES, RunDir.EVENTS)  # what the pages read (not summary.csv)


def upload_suffixes() -> tuple[str, ...]:
    """What an upload may be named: every registered trace reader's suffixes (kvprof.core.readers),
    plus a bare .gz (a gzipped Chrome trace under another name: the content decides)."""
    return (*api.trace_readers().suffixes(), ".gz")

# Columns of events.parquet the timeline and the overlap detail need (GPU work rows only).
EVENT_COLUMNS = ("trace", "source", "kind", "name", "device", "stream", "start_ns", "dur_ns", "grid", "block",
                 "write_id", "variant", "layer", "phase", "size", "step", "correlation", "graph_launch")


class DashboardError(KvprofError):
    """Something the page reports in one sentence (bad path, unreadable file, failed analysis)."""


class PathError(DashboardError):
    """A path that resolves outside the traces root."""


# ---------------------------------------------------------------------------- configuration


def configured_roots(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> list[Path]:
    """The traces roots the sidebar offers; nothing outside them is read. Default: the samples, then
    traces/ where ``kvprof capture`` writes: the checkout's, and ./traces of the working folder when
    there is one (a wheel's users capture there). Never the working folder itself."""
    env = os.environ if env is None else env
    raw = env.get(ENV_ROOTS, "")
    defaults = [DEFAULT_ROOT, REPO / "traces"] if CHECKOUT else [DEFAULT_ROOT]
    here = (cwd or Path.cwd()) / "traces"
    if here.is_dir():
        defaults.append(here)
    roots = [Path(p).expanduser() for p in raw.split(os.pathsep) if p.strip()] or defaults
    out: list[Path] = []
    for r in roots:
        r = r.resolve()
        if r not in out:
            out.append(r)
    return out


def root_label(root: str | Path, cwd: Path | None = None, home: Path | None = None) -> str:
    """A root as the sidebar shows it: relative to the working folder when under it, else with ``~``
    for the home folder, else the full path (the selectbox's value stays the full path)."""
    p = Path(root)
    for base, prefix in ((cwd or Path.cwd(), "."), (home or Path.home(), "~")):
        base = base.resolve()
        if base == Path(base.anchor):  # "/" as the base would only drop the leading slash
            continue
        try:
            rel = p.relative_to(base)
        except ValueError:
            continue
        return prefix if not rel.parts else (rel.as_posix() if prefix == "." else f"~/{rel.as_posix()}")
    return str(p)


def initial_run(env: Mapping[str, str] | None = None) -> Path | None:
    env = os.environ if env is None else env
    raw = env.get(ENV_RUN, "").strip()
    return Path(raw).expanduser().resolve() if raw else None


def max_upload_bytes(env: Mapping[str, str] | None = None) -> int:
    """The explicit upload limit (the server's maxUploadSize is set to the same by ``kvprof dashboard``)."""
    env = os.environ if env is None else env
    try:
        mb = float(env.get(ENV_MAX_UPLOAD_MB, DEFAULT_MAX_UPLOAD_MB))
    except ValueError:
        mb = DEFAULT_MAX_UPLOAD_MB
    return int(max(mb, 0) * (1 << 20))


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    if env.get(ENV_CACHE):
        return Path(env[ENV_CACHE]).expanduser().resolve()
    base = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return (base / "kvprof" / "dashboard").resolve()


# ---------------------------------------------------------------------------- path checks


def contained(root: Path, path: Path) -> Path:
    """``path`` resolved (symlinks followed), refused unless it lies inside ``root``."""
    root_r = root.resolve()
    p = (root_r / path).resolve() if not path.is_absolute() else path.resolve()
    if p != root_r and not p.is_relative_to(root_r):
        raise PathError(f"{path} is outside the traces root {root_r}; refused")
    return p


def _is_trace_name(name: str) -> bool:
    return (api.trace_readers().is_trace_name(name) and name not in RunDir.NOT_TRACES
            and not name.endswith(f".{RunDir.BENCH}"))


def check_inputs(run_dir: Path, root: Path) -> None:
    """Refuse a run any of whose inputs resolve outside the root (``load`` would follow them):
    every entry of the run folder (a rank's trace, a sidecar, the step timings, any file a loader
    may pick up by its name), and every file name anywhere in its manifest (variants', ranks',
    run-level)."""
    contained(root, run_dir)
    try:
        entries = list(run_dir.iterdir())
    except OSError as exc:
        raise DashboardError(f"cannot read the folder {run_dir.name}: {exc.strerror or exc}") from None
    for p in entries:
        contained(root, p)
    man = RunDir(run_dir).manifest
    if not man.is_file():
        return
    try:
        doc = orjson.loads(man.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise DashboardError(f"{run_dir.name}/{man.name} is not readable JSON ({exc})") from None
    for f in _manifest_files(doc):
        contained(root, run_dir / f)


def _manifest_files(doc: Any) -> list[str]:
    """Every string under a ``files`` or ``timings`` key of the manifest (a rank's step timings), at
    any depth (iteratively: no recursion on a document's nesting)."""
    out: list[str] = []
    stack: list[tuple[Any, bool]] = [(doc, False)]
    while stack:
        node, under_files = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, under_files or k in ("files", "timings")) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, under_files) for v in node)
        elif under_files and isinstance(node, str):
            out.append(node)
    return out


# ---------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class RunEntry:
    """A run folder under a root: ``rel`` is what the sidebar shows and the URL carries."""

    rel: str
    path: Path
    analysed: bool
    has_summary: bool = False

    @property
    def label(self) -> str:
        if self.analysed:
            return self.rel
        return f"{self.rel}  (incomplete analyze outputs)" if self.has_summary else f"{self.rel}  (not analysed yet)"


def outputs_complete(d: Path) -> bool:
    return RunDir(d).has_outputs(OUTPUTS)


def is_run_dir(d: Path) -> bool:
    run = RunDir(d)
    if run.is_run() or run.summary.is_file():
        return True
    try:
        return any(_is_trace_name(p.name) and p.is_file() for p in d.iterdir())
    except OSError:
        return False


def discover_runs(root: Path, max_depth: int = 2) -> list[RunEntry]:
    """Run folders under ``root`` (the root itself if it is one), at most ``max_depth`` levels down."""
    root_r = root.resolve()
    if not root_r.is_dir():
        return []
    out: list[RunEntry] = []

    def visit(d: Path, depth: int) -> None:
        if is_run_dir(d):
            rel = "." if d == root_r else d.relative_to(root_r).as_posix()
            out.append(RunEntry(rel, d, outputs_complete(d), RunDir(d).summary.is_file()))
            return
        if depth >= max_depth:
            return
        try:
            children = sorted(c for c in d.iterdir() if c.is_dir() and not c.name.startswith((".", "__")))
        except OSError:
            return
        for c in children:
            try:
                c = contained(root_r, c)
            except PathError:
                continue  # a symlink out of the root: not offered
            visit(c, depth + 1)

    visit(root_r, 0)
    return sorted(out, key=lambda e: e.rel)


def bench_roots(root: Path | None, env: Mapping[str, str] | None = None) -> list[Path]:
    """Where the Sweeps page looks for bench results: the traces root, then the folder
    ``kvprof bench`` writes into without --out (kvprof.core.bench_result.bench_cache_root)
    when it exists and is not under the root already."""
    out = [root.resolve()] if root is not None else []
    cache = bench_cache_root(env).expanduser()
    if cache.is_dir():
        cache = cache.resolve()
        if not any(cache == r or cache.is_relative_to(r) for r in out):
            out.append(cache)
    return out


def discover_bench(root: Path, max_depth: int = 4) -> list[Path]:
    """kvprof bench outputs (bench.json, *.bench.json) under ``root``."""
    root_r = root.resolve()
    if not root_r.is_dir():
        return []
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root_r, followlinks=False):
        depth = len(Path(dirpath).relative_to(root_r).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")) and depth < max_depth)
        for f in sorted(filenames):
            if f == RunDir.BENCH or f.endswith(f".{RunDir.BENCH}"):
                try:
                    found.append(contained(root_r, Path(dirpath) / f))
                except PathError:
                    continue
    return found


STALE_AFTER_S = 120.0  # a checkout or copy writes files seconds apart; a re-capture is minutes later


def stale_traces(run_dir: Path) -> list[str]:
    """Traces clearly newer than the run's summary.json: its numbers may not be theirs any more."""
    s = RunDir(run_dir).summary
    if not s.is_file():
        return []
    t = s.stat().st_mtime + STALE_AFTER_S
    return sorted(p.name for p in run_dir.iterdir() if _is_trace_name(p.name) and p.is_file() and p.stat().st_mtime > t)


# ---------------------------------------------------------------------------- the analyze pipeline


def analyse_to(source: Path, out: Path) -> Path:
    """kvprof's pipeline (kvprof.api): open -> analyze -> write the outputs into ``out``."""
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        loaded = api.open_run(source)
        api.write_outputs(loaded, api.analyze(loaded), out)
    except BaseException as exc:
        if made and not any(out.iterdir()):
            out.rmdir()  # leave no empty cache folder behind a failure
        if isinstance(exc, KvprofError) or not isinstance(exc, Exception):
            raise
        # a malformed file the readers did not classify: still one sentence
        raise DashboardError(f"cannot analyse {source.name}: {type(exc).__name__}: {exc}") from exc
    return out


def _fingerprint(paths: Iterable[Path], salt: str) -> str:
    h = hashlib.sha256(salt.encode())
    for p in sorted(paths):
        st_ = p.stat()
        h.update(f"{p.name}\0{st_.st_size}\0{st_.st_mtime_ns}\n".encode())
    return h.hexdigest()[:32]


def ensure_outputs(run: Path, root: Path) -> tuple[Path, str | None]:
    """Folder with the run's analyze outputs, and a note when they are incomplete.

    The run itself when its outputs are all there; else a cache folder filled by kvprof's
    pipeline; when that fails but the run has a summary.json, the run's partial outputs
    (pages that need a missing table say so).
    """
    d = contained(root, run)
    if not d.is_dir():
        raise DashboardError(f"{run} is not a folder")
    for n in OUTPUTS:
        if (d / n).exists():
            contained(root, d / n)
    if outputs_complete(d):
        return d, None
    check_inputs(d, root)
    inputs = [p for p in d.iterdir() if p.is_file() and (_is_trace_name(p.name) or p.name == RunDir.MANIFEST)]
    out = cache_dir() / "runs" / _fingerprint(inputs, str(d))
    if outputs_complete(out):
        return out, None
    try:
        return analyse_to(d, out), None
    except KvprofError as exc:
        if not RunDir(d).summary.is_file():
            raise
        missing = ", ".join(n for n in OUTPUTS if not (d / n).is_file())
        return d, f"{missing} missing and re-analysing failed ({exc}); showing what {RunDir.SUMMARY} has"


def upload_suffix(name: str) -> str:
    """A suffix kvprof's loader understands (it sniffs content; .nsys-rep needs its name)."""
    low = name.lower()
    return next((s for s in upload_suffixes() if low.endswith(s)), ".bin")


def analyse_upload(name: str, data: bytes, limit: int | None = None) -> Path:
    """Outputs of an uploaded trace, analysed from a temp file outside the root (cached by content)."""
    limit = max_upload_bytes() if limit is None else limit
    if len(data) > limit:
        raise DashboardError(f"{name} is {len(data) / 2**20:.1f} MB; the limit is {limit / 2**20:.0f} MB")
    if not data:
        raise DashboardError(f"{name} is empty")
    digest = hashlib.sha256(data).hexdigest()[:32]
    out = cache_dir() / "uploads" / digest
    if outputs_complete(out):
        return out
    with tempfile.TemporaryDirectory(prefix="kvprof-upload-") as tmp:
        f = Path(tmp) / f"upload{upload_suffix(name)}"  # never the user's name: no path in it is used
        f.write_bytes(data)
        try:
            return analyse_to(f, out)
        except KvprofError as exc:
            raise DashboardError(str(exc).replace(f.name, name).replace(str(f), name)) from None


# ---------------------------------------------------------------------------- cached reads


def stamp(p: Path) -> int:
    """Cache key part that changes when the file does."""
    s = p.stat()
    return s.st_mtime_ns ^ (s.st_size << 1)


def _summary_doc(path: str) -> dict[str, Any]:
    """summary.json read as every reader reads it (kvprof.core.rundir: a typed Summary), as the
    document the pages' frames take."""
    p = Path(path)
    if p.stat().st_size > MAX_SUMMARY_BYTES:
        raise DashboardError(f"{p.name} is larger than {MAX_SUMMARY_BYTES >> 20} MB; not read")
    try:
        summary = parse_summary(p.read_bytes())
    except ValueError as exc:
        raise DashboardError(f"{p.parent.name}/{p.name} is {exc}; re-run kvprof analyze") from None
    return summary.to_json()


# summary.json's per-layer table: two thirds of the samples' 3.5 MB and read by one page only
LAYERS_KEY = "layers"


@st.cache_data(show_spinner=False, max_entries=64)
def read_summary(path: str, stamp: int) -> dict[str, Any]:
    """summary.json without its per-layer table (``read_layers``): every rerun of every page gets a copy
    of this from the cache, and the copy is 1 ms instead of 16 for the samples."""
    doc = _summary_doc(path)
    doc.pop(LAYERS_KEY, None)
    return doc


@st.cache_data(show_spinner=False, max_entries=16)
def read_layers(path: str, stamp: int) -> pd.DataFrame:
    """summary.json's per-layer medians as a frame (frames.groups_frame of its "layers")."""
    from kvprof.dashboard import frames

    return frames.groups_frame(_summary_doc(path), LAYERS_KEY)


@st.cache_data(show_spinner=False, max_entries=64)
def read_groups(path: str, stamp: int) -> pd.DataFrame:
    """summary.json's group medians as a frame (frames.groups_frame), shaped once per file."""
    from kvprof.dashboard import frames

    return frames.groups_frame(read_summary(path, stamp))


def _read_parquet(path: str, columns: list[str] | None = None, filters: Any = None) -> pd.DataFrame:
    p = Path(path)
    try:
        if columns is not None:
            have = set(pq.read_schema(p).names)
            columns = [c for c in columns if c in have]
        return pq.read_table(p, columns=columns, filters=filters).to_pandas()
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise DashboardError(f"{p.parent.name}/{p.name} is not readable Parquet ({exc}); re-run kvprof "
                             "analyze") from None


@st.cache_data(show_spinner=False, max_entries=32)
def read_writes(path: str, stamp: int) -> pd.DataFrame:
    return _read_parquet(path)


@st.cache_data(show_spinner=False, max_entries=16)
def read_gpu_events(path: str, stamp: int) -> pd.DataFrame:
    """GPU work rows (kernel, memcpy, memset) of events.parquet: the timeline's bars."""
    return _read_parquet(path, list(EVENT_COLUMNS), [("kind", "in", list(GPU_WORK_KINDS))])


@st.cache_data(show_spinner=False, max_entries=32)
def read_bench(path: str, stamp: int) -> dict[str, Any]:
    p = Path(path)
    if p.stat().st_size > MAX_BENCH_BYTES:
        raise DashboardError(f"{p.name} is larger than {MAX_BENCH_BYTES >> 20} MB; not read")
    try:
        doc = orjson.loads(p.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise DashboardError(f"{p.name} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
        raise DashboardError(f"{p.name} is not kvprof bench output (no records)")
    return doc


@dataclass(frozen=True)
class RunOutputs:
    """One run's analyze outputs; tables are read on first use and cached by file stamp."""

    label: str
    dir: Path
    run_dir: Path | None = None  # the folder under the root (None for an upload)
    note: str | None = None  # why some tables are missing

    def file(self, name: str) -> Path:
        """One output file, or a DashboardError that says which is missing."""
        p = self.dir / name
        if not p.is_file():
            raise DashboardError(f"{self.label}: {name} is missing; this page needs it (re-run kvprof analyze "
                                 "on the run)")
        return p

    def summary(self) -> dict[str, Any]:
        """summary.json without its "layers" table (see ``layers``)."""
        p = self.file(RunDir.SUMMARY)
        return read_summary(str(p), stamp(p))

    def groups(self) -> pd.DataFrame:
        p = self.file(RunDir.SUMMARY)
        return read_groups(str(p), stamp(p))

    def layers(self) -> pd.DataFrame:
        p = self.file(RunDir.SUMMARY)
        return read_layers(str(p), stamp(p))

    def writes(self) -> pd.DataFrame:
        p = self.file(RunDir.WRITES)
        return read_writes(str(p), stamp(p))

    def gpu_events(self) -> pd.DataFrame:
        p = self.file(RunDir.EVENTS)
        return read_gpu_events(str(p), stamp(p))


@st.cache_data(show_spinner=False, max_entries=8)
def timeline_rows(events_path: str, events_stamp: int, writes_path: str, writes_stamp: int,
                  trace: str) -> tuple[pd.DataFrame, float, float]:
    """Every bar of one trace (frames.lane_rows), its 0 µs origin and its end: shaped once per trace."""
    from kvprof.dashboard import frames

    ev = read_gpu_events(events_path, events_stamp)
    ev = ev[ev["trace"].astype(str) == trace]
    w = read_writes(writes_path, writes_stamp)
    w = w[w["trace"].astype(str) == trace]
    origin = frames.trace_origin_ns(ev, w)
    return frames.lane_rows(ev, w, origin), origin, frames.trace_end_us(ev, w, origin)
