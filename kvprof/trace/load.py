"""Open whatever the user points at: a run directory, a Chrome trace, an nsys .sqlite or .nsys-rep.

The format is sniffed from the first bytes, not trusted from the name (a renamed or
mis-suffixed file still loads, and a non-trace gets a clear one-line refusal). A run
directory is read through its manifest.json: unavailable variants are carried with
their reason, and a variant's Kineto metadata is given to its nsys export (which has no
place for it) so graph replays there can still be split by order if node ids are missing.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvprof.core.errors import Setting, TraceError, UsageError
from kvprof.core.files import open_regular, require_regular
from kvprof.core.readers import REGISTRY, SNIFF_BYTES, NotThisFormat, TraceReader
from kvprof.core.run import Manifest, TraceMeta, VariantEntry
from kvprof.core.rundir import RunDir
from kvprof.core.schema import DEFAULT_MAX_EVENTS
from kvprof.core.sidecar import Sidecar, check_one_per_process, read_sidecar
from kvprof.core.timings import StepTimings
from kvprof.trace.attribution import attribute
from kvprof.trace.model import Trace


@dataclass
class Loaded:
    """Everything analyze needs from the input, traces already attributed."""

    input: Path
    kind: str  # "run" | "dir" | "kineto" | "nsys"
    traces: list[Trace]
    manifest: Manifest | None = None
    variants: dict[str, VariantEntry] = field(default_factory=dict)  # manifest entries by name
    warnings: list[str] = field(default_factory=list)
    timings: StepTimings | None = None  # step_timings.json of a run: the reference pass and in-pass times
    sidecars: list[Sidecar] = field(default_factory=list)  # kvprof's SGLang plugin, one per process


# SGLang's profiler output: [prefix-]<profile id>-TP-<rank>[-DP-..][-PP-..][-EP-..][-<stage>].trace.json.gz,
# one file per rank, and optionally merged-<profile id>.trace.json.gz (all ranks in one file).
_SGLANG_RANK = re.compile(r"-TP-(\d+)(?:-|\.)")
_SGLANG_MERGED = re.compile(r"^merged-.*\.trace\.json(\.gz)?$")


def sglang_rank(name: str) -> int | None:
    """The TP rank in an SGLang trace file name, or None for any other name."""
    m = _SGLANG_RANK.search(name)
    return int(m.group(1)) if m else None


def _with_file_rank(trace: Trace, path: Path) -> Trace:
    """Rank from SGLang's file name where the trace itself says none (no distributedInfo)."""
    rank = sglang_rank(path.name)
    col = trace.events.column("rank")
    if rank is None or not trace.events.num_rows or rank == 0 or _any_nonzero(col):
        return trace
    import pyarrow as pa

    idx = trace.events.schema.get_field_index("rank")
    events = trace.events.set_column(idx, "rank", pa.array([rank] * trace.events.num_rows, pa.int32()))
    return trace.replace(events=events)


def _any_nonzero(col: Any) -> bool:
    import pyarrow.compute as pc

    return bool(pc.any(pc.not_equal(col, 0)).as_py())


def reader_for(path: Path) -> TraceReader:
    """The registered reader whose format the file's first bytes are (its name only for .nsys-rep)."""
    try:
        with open_regular(path) as f:
            head = f.read(SNIFF_BYTES)
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not head:
        raise TraceError(f"{path.name}: empty file")
    reader = REGISTRY.for_head(head, path)
    if reader is None:
        raise TraceError(f"{path.name}: not a trace kvprof can read (expected one of: {REGISTRY.describe()})")
    return reader


def sniff(path: Path) -> str:
    """The name of the reader for ``path`` ("kineto", "nsys_sqlite", "nsys_rep", or a plugin's)."""
    return reader_for(path).name


def load_file(path: Path, max_events: int = DEFAULT_MAX_EVENTS, fallback_meta: TraceMeta | None = None,
              export_dir: Path | None = None, sidecars: list[Sidecar] | None = None) -> Trace:
    """Read and attribute one file.

    A malformed value the readers did not foresee still ends as a one-line TraceError
    (exit 3) naming the file and the error, never as a traceback (kvprof.trace.sanitize
    and the readers handle the known cases with a precise message or a warning).
    """
    reader = reader_for(path)
    try:
        trace = reader.read(path, max_events, export_dir)
        return attribute(trace, fallback_meta, sidecars)
    except MALFORMED as exc:
        raise TraceError(f"{path.name}: malformed trace ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]})") from exc


# What a reader or attribution raises on values no check foresaw (not a KvprofError).
MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError, ZeroDivisionError,
             RecursionError, UnicodeError)


def _regular(p: Path) -> bool:
    """Whether ``p`` is there to read: False where nothing is (a broken link included), True for a
    regular file; anything else by that name (a FIFO, a socket, a device, a folder) is refused in
    one line (exit 2), never skipped in silence nor opened (a FIFO would block)."""
    if not os.path.exists(p):
        return False
    require_regular(p, "a trace or a run's file")
    return True


def load_run(run_dir: Path, max_events: int = DEFAULT_MAX_EVENTS) -> Loaded:
    run = RunDir(run_dir)
    manifest = run.read_manifest()
    loaded = Loaded(input=run_dir, kind="run", traces=[], manifest=manifest, warnings=list(manifest.warnings),
                    variants=dict(manifest.variants))
    loaded.timings, problem = run.read_timings(manifest)
    if problem:
        loaded.warnings.append(problem)
    seen: set[Path] = set()
    for name, entry in manifest.variants.items():
        if not entry.available:
            continue
        meta = None
        kt = entry.files.get("torch_trace")
        if kt:
            p = run_dir / kt
            if _regular(p):
                t = load_file(p, max_events)
                meta = t.kvprof
                loaded.traces.append(t)
                seen.add(p.resolve())
            else:
                loaded.warnings.append(f"{name}: manifest names {kt} but it is missing")
        for key in ("nsys_sqlite", "nsys_rep"):
            f = entry.files.get(key)
            if not f:
                continue
            p = run_dir / f
            if not _regular(p):
                loaded.warnings.append(f"{name}: manifest names {f} but it is missing")
                continue
            if p.resolve() in seen:
                break
            if meta is None:  # nsys alone: what the manifest knows of the capture
                meta = TraceMeta.of_run(name, manifest)
            t = load_file(p, max_events, fallback_meta=meta, export_dir=run_dir)
            # the export is the same capture as its variant's Kineto trace: the same metadata
            loaded.traces.append(t if t.kvprof is not None else t.replace(kvprof=meta))
            seen.add(p.resolve())
            break  # the sqlite is the export of the rep: one of the two
    _load_other_ranks(run_dir, manifest, loaded, seen, max_events)
    if not loaded.traces:
        raise TraceError(f"{run_dir}: the manifest lists no readable trace "
                         f"({sum(1 for e in loaded.variants.values() if not e.available)} variants unavailable)")
    return loaded


def _load_other_ranks(run_dir: Path, manifest: Manifest, loaded: Loaded, seen: set[Path], max_events: int) -> None:
    """A multi-rank run (``capture --ranks``): every rank's trace of each available variant
    (each carries its rank in ``distributedInfo``, so the event table's rank column tells them apart)."""
    for entry in manifest.ranks:
        for name, f in sorted(entry.files.items()):
            v = manifest.variants.get(name)
            p = run_dir / f
            if (v is not None and not v.available) or p.resolve() in seen:
                continue
            if not _regular(p):
                loaded.warnings.append(f"{name}: manifest names {f} (rank {entry.rank}) but it is missing")
                continue
            loaded.traces.append(load_file(p, max_events))
            seen.add(p.resolve())


def load_dir(d: Path, max_events: int = DEFAULT_MAX_EVENTS) -> Loaded:
    """A folder of traces without a manifest: every Chrome trace, nsys export and report in it."""
    try:
        entries = list(d.iterdir())
    except OSError as exc:
        raise TraceError(f"cannot read the folder {d}: {exc.strerror or exc}") from None
    files = sorted(p for p in entries if REGISTRY.is_trace_name(p.name) and p.name not in RunDir.NOT_TRACES
                   and _regular(p))
    sidecars = [p for p in files if RunDir.is_sidecar(p.name)]
    files = [p for p in files if p not in sidecars]
    merged = [p for p in files if _SGLANG_MERGED.match(p.name)]
    if merged and any(sglang_rank(p.name) is not None for p in files):
        files = [p for p in files if p not in merged]  # the per-rank files hold the same events
    exports = {p.name for p in files if p.name.endswith(RunDir.NSYS_SQLITE_SUFFIX)}
    files = [p for p in files if not (p.name.endswith(RunDir.NSYS_REP_SUFFIX)
                                      and RunDir.nsys_sqlite_of(RunDir.nsys_base_of(p)).name in exports)]
    loaded = Loaded(input=d, kind="dir", traces=[])
    for p in merged:
        if p not in files:
            loaded.warnings.append(f"skipped {p.name}: SGLang's merge of the per-rank traces read here")
    loaded.sidecars = [read_sidecar(p) for p in sidecars]  # a malformed one: a one-line TraceError
    check_one_per_process(loaded.sidecars)
    for p in files:
        try:
            loaded.traces.append(_with_file_rank(load_file(p, max_events, export_dir=d, sidecars=loaded.sidecars),
                                                 p))
        except NotThisFormat:
            loaded.warnings.append(f"skipped {p.name}: not a trace")
    if not loaded.traces:
        raise TraceError(f"{d}: no traces here (no {RunDir.MANIFEST}, no file named as one of: {REGISTRY.describe()})")
    return loaded


def load(path: str | os.PathLike[str], max_events: int = DEFAULT_MAX_EVENTS) -> Loaded:
    """Dispatch on what ``path`` is; every trace comes back attributed."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"no such file or directory: {p}")
    if max_events <= 0:
        raise UsageError(Setting("max_events"), f" must be positive, got {max_events}")
    if p.is_dir():
        return load_run(p, max_events) if RunDir(p).is_run() else load_dir(p, max_events)
    require_regular(p, "a trace")  # a FIFO or a device would block or never end
    t = _with_file_rank(load_file(p, max_events), p)
    return Loaded(input=p, kind=t.source, traces=[t])
