"""A run directory: the one place that names a run's files, and reads and writes them.

Capture writes a run, analyze adds its outputs, the readers, the dashboard, ``report``
and ``compare`` read them; every one of them goes through ``RunDir`` for a path, and
through its readers for manifest.json and summary.json (so each is parsed one way, into
``kvprof.core.run.Manifest`` and ``kvprof.core.summary.Summary``). Writes are atomic
(kvprof.core.atomic): a reader never sees half a file, nor half of analyze's outputs.

    <run>/manifest.json                 what capture ran (Manifest)
    <run>/step_timings.json             the workload's own step times (kvprof.core.timings);
                                        step_timings.rank<r>.json per rank of ``--ranks``
    <run>/<variant>.pt.trace.json.gz    torch.profiler's trace; <variant>.rank<r>.pt.trace.json.gz per rank
    <run>/<variant>.nsys-rep, .sqlite   the Nsight Systems pass (nsys names the report itself)
    <run>/summary.json, summary.csv,    analyze's outputs, replaced as one set, summary.json
          events.parquet, writes.parquet  (the marker that the set is whole) last
    <run>/hta/<variant>/                each variant's traces alone, as HolisticTraceAnalysis reads them
    <dir>/kvprof-<engine>.TP-<r>.pid-<p>.json an engine plugin's sidecar (sglang, vllm), beside its traces
    <dir>/bench.json, bench.csv         ``kvprof bench``'s results (python -m kvprof.bench.layouts' too)
    <base>.nsys-rep, <base>.sqlite      ``kvprof nsys --out BASE``'s report and its scrubbed export

While a capture runs, its temporary folder also holds the rank launcher's and the nsys
child's hidden hand-over files (``.rank<r>.json`` ...); none is left in a finished run.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import orjson

from kvprof.core.atomic import atomic_directory, atomic_outputs, atomic_write_bytes
from kvprof.core.errors import KvprofError, TraceError
from kvprof.core.files import read_bounded, require_regular
from kvprof.core.run import Manifest
from kvprof.core.summary import Summary
from kvprof.core.timings import StepTimings


@dataclass(frozen=True)
class RunDir:
    """One run folder (or any folder kvprof writes analyze's outputs into): its paths and files."""

    path: Path

    MANIFEST: ClassVar[str] = "manifest.json"
    SUMMARY: ClassVar[str] = "summary.json"
    SUMMARY_CSV: ClassVar[str] = "summary.csv"
    EVENTS: ClassVar[str] = "events.parquet"
    WRITES: ClassVar[str] = "writes.parquet"
    # analyze's outputs, written as one set; SUMMARY first: the marker readers require
    OUTPUTS: ClassVar[tuple[str, ...]] = (SUMMARY, SUMMARY_CSV, EVENTS, WRITES)
    TIMINGS: ClassVar[str] = "step_timings.json"
    # the manifest's ``files`` key of the timings file, and the nsys child's result's key of its step times
    TIMINGS_KEY: ClassVar[str] = "step_timings"
    HTA: ClassVar[str] = "hta"
    COMPARE: ClassVar[str] = "compare.json"  # what ``kvprof compare --out`` writes
    BENCH: ClassVar[str] = "bench.json"  # what ``kvprof bench --out`` writes (and python -m kvprof.bench.layouts)
    BENCH_CSV: ClassVar[str] = "bench.csv"  # the same results as a table, beside it
    # files a folder of traces may hold that are not traces (a reader must not try them as one)
    NOT_TRACES: ClassVar[tuple[str, ...]] = (MANIFEST, SUMMARY, BENCH, COMPARE)
    TORCH_TRACE_SUFFIX: ClassVar[str] = ".pt.trace.json.gz"
    NSYS_SQLITE_SUFFIX: ClassVar[str] = ".sqlite"  # an nsys report's SQLite export
    NSYS_REP_SUFFIX: ClassVar[str] = ".nsys-rep"  # the report nsys writes (it adds the suffix itself)
    NSYS_REP_SUFFIXES: ClassVar[tuple[str, ...]] = (NSYS_REP_SUFFIX, ".qdrep")  # .qdrep: older nsys versions
    NSYS_STREAM_SUFFIX: ClassVar[str] = ".qdstrm"  # nsys's raw stream, left alone when its import fails
    SIDECAR_PREFIX: ClassVar[str] = "kvprof-sglang."  # the SGLang plugin's; any engine's: kvprof-<engine>.
    SIDECAR_RE: ClassVar[re.Pattern[str]] = re.compile(r"^kvprof-[a-z][a-z0-9_]*\.TP-[^/]+\.pid-\d+\.json$")
    # the rank launcher's hand-over files in the capture's temporary folder
    RANKS_CONFIG: ClassVar[str] = ".ranks-config.json"
    RANKS_STORE: ClassVar[str] = ".ranks-store"

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    # ------------------------------------------------------------------ names
    @classmethod
    def torch_trace_name(cls, variant: str, rank: int | None = None) -> str:
        """A variant's torch.profiler trace: one per run, or one per rank of ``--ranks``."""
        return f"{variant}{cls.TORCH_TRACE_SUFFIX}" if rank is None else f"{variant}.rank{rank}{cls.TORCH_TRACE_SUFFIX}"

    @classmethod
    def rank_timings_name(cls, rank: int) -> str:
        return f"{cls.TIMINGS_KEY}.rank{rank}.json"

    @classmethod
    def sidecar_name(cls, tp_rank: object, pid: object, engine: str = "sglang") -> str:
        """An engine plugin's sidecar of one process (``kvprof-<engine>.TP-<r>.pid-<p>.json``)."""
        return f"kvprof-{engine}.TP-{tp_rank}.pid-{pid}.json"

    @classmethod
    def is_sidecar(cls, name: str) -> bool:
        """Any engine plugin's sidecar (and any ``kvprof-sglang.*.json``, as read before engines)."""
        return (name.startswith(cls.SIDECAR_PREFIX) and name.endswith(".json")) or bool(cls.SIDECAR_RE.match(name))

    @classmethod
    def nsys_base_of(cls, path: Path) -> Path:
        """An ``nsys profile -o`` base: ``path`` without a trailing .nsys-rep (nsys adds it)."""
        name = path.name
        return path.with_name(name[: -len(cls.NSYS_REP_SUFFIX)]) if name.endswith(cls.NSYS_REP_SUFFIX) else path

    @classmethod
    def nsys_report_of(cls, base: Path) -> Path:
        """The report nsys writes for the output base ``base``."""
        return base.with_name(base.name + cls.NSYS_REP_SUFFIX)

    @classmethod
    def nsys_stream_of(cls, base: Path) -> Path:
        return base.with_name(base.name + cls.NSYS_STREAM_SUFFIX)

    @classmethod
    def nsys_sqlite_of(cls, base: Path) -> Path:
        """``base`` with the SQLite export's suffix added (``prof`` -> ``prof.sqlite``)."""
        return base.with_name(base.name + cls.NSYS_SQLITE_SUFFIX)

    @classmethod
    def nsys_export_beside(cls, report: Path) -> Path:
        """A report's SQLite export beside it: its last suffix replaced (``a.nsys-rep`` -> ``a.sqlite``)."""
        return report.with_suffix(cls.NSYS_SQLITE_SUFFIX)

    @staticmethod
    def is_launcher_file(name: str) -> bool:
        """One of the rank launcher's hand-over files (removed before the run is kept)."""
        return name.startswith(".rank") or name in (RunDir.RANKS_CONFIG, RunDir.RANKS_STORE)

    # ------------------------------------------------------------------ paths
    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def manifest(self) -> Path:
        return self.path / self.MANIFEST

    @property
    def summary(self) -> Path:
        return self.path / self.SUMMARY

    @property
    def summary_csv(self) -> Path:
        return self.path / self.SUMMARY_CSV

    @property
    def events(self) -> Path:
        return self.path / self.EVENTS

    @property
    def writes(self) -> Path:
        return self.path / self.WRITES

    @property
    def outputs(self) -> list[Path]:
        return [self.path / n for n in self.OUTPUTS]

    @property
    def compare(self) -> Path:
        return self.path / self.COMPARE

    @property
    def bench(self) -> Path:
        return self.path / self.BENCH

    @property
    def bench_csv(self) -> Path:
        return self.path / self.BENCH_CSV

    @property
    def hta(self) -> Path:
        return self.path / self.HTA

    def hta_folder(self, variant: str) -> Path:
        return self.hta / variant

    def timings(self, manifest: Manifest | None = None) -> Path:
        """The run's step timings: the name its manifest gives (a plain name inside the run), else the default."""
        name = manifest.file(self.TIMINGS_KEY, self.TIMINGS) if manifest is not None else self.TIMINGS
        return self.path / name

    def torch_trace(self, variant: str, rank: int | None = None) -> Path:
        return self.path / self.torch_trace_name(variant, rank)

    def nsys_base(self, variant: str) -> Path:
        """Where ``nsys profile -o`` writes a variant's report (nsys adds .nsys-rep)."""
        return self.path / variant

    def nsys_sqlite(self, variant: str) -> Path:
        return self.path / f"{variant}{self.NSYS_SQLITE_SUFFIX}"

    def nsys_child_spec(self, variant: str) -> Path:
        return self.path / f".{variant}.child-spec.json"

    def nsys_child_result(self, variant: str) -> Path:
        return self.path / f".{variant}.child-result.json"

    def rank_result(self, rank: int) -> Path:
        return self.path / f".rank{rank}.json"

    def rank_error(self, rank: int) -> Path:
        return self.path / f".rank{rank}.error"

    def rank_log(self, rank: int) -> Path:
        return self.path / f".rank{rank}.log"

    @property
    def ranks_config(self) -> Path:
        return self.path / self.RANKS_CONFIG

    @property
    def ranks_store(self) -> Path:
        return self.path / self.RANKS_STORE

    # ------------------------------------------------------------------ state
    def is_run(self) -> bool:
        """A capture's run directory: it holds a manifest."""
        return self.manifest.is_file()

    def has_outputs(self, names: tuple[str, ...] = OUTPUTS) -> bool:
        return all((self.path / n).is_file() for n in names)

    # ------------------------------------------------------------------ reads
    def read_manifest(self) -> Manifest:
        """manifest.json, type-checked (Manifest.from_json); TraceError when it is not one."""
        return read_manifest(self.manifest)

    def read_summary(self, error: type[KvprofError] = TraceError) -> Summary:
        """summary.json as analyze wrote it; ``error`` (one line naming the file) when it is not one."""
        return read_summary(self.summary, error)

    def read_timings(self, manifest: Manifest) -> tuple[StepTimings | None, str | None]:
        """(the step timings or None when the run has none, why they could not be read)."""
        path = self.timings(manifest)
        if not os.path.exists(path):
            return None, None
        require_regular(path, "step timings")  # a FIFO would block, a folder was skipped in silence
        try:
            return StepTimings.from_json(read_bounded(path, "step timings")), None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"{path.name}: unreadable, no reference figures ({exc})"

    # ------------------------------------------------------------------ writes
    def write_manifest(self, manifest: Manifest) -> None:
        atomic_write_bytes(self.manifest, manifest.dumps())

    def write_timings(self, timings: StepTimings, name: str = TIMINGS) -> str:
        """Write the step timings under ``name``; the name, for the manifest."""
        atomic_write_bytes(self.path / name, timings.to_json())
        return name

    @contextlib.contextmanager
    def staged_outputs(self) -> Iterator[RunDir]:
        """A staging folder for analyze's outputs; on success they replace this folder's as one set
        (kvprof.core.atomic.atomic_outputs), summary.json placed last."""
        with atomic_outputs(self.path, self.SUMMARY) as stage:
            yield RunDir(stage)

    @contextlib.contextmanager
    def staged_hta(self) -> Iterator[Path]:
        """A temporary folder that replaces ``hta/`` whole when the block succeeds."""
        with atomic_directory(self.hta, replace=True) as tmp:
            yield tmp


def read_manifest(path: Path) -> Manifest:
    """A manifest.json file, type-checked; TraceError when it is not one."""
    try:
        doc = orjson.loads(read_bounded(path, "a manifest"))
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"{path}: not valid JSON ({exc})") from None
    try:
        return Manifest.from_json(doc)
    except ValueError as exc:
        raise TraceError(f"{path}: {exc}") from None


def parse_summary(data: bytes) -> Summary:
    """summary.json's bytes as a Summary; ValueError saying why they are not one."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc})") from None
    return Summary.from_json(doc)


def read_summary(path: Path, error: type[KvprofError] = TraceError) -> Summary:
    """A summary.json file (any name); ``error`` naming the file when it is not a kvprof summary."""
    try:
        data = read_bounded(path, "a summary")
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return parse_summary(data)
    except ValueError as exc:
        raise error(f"{path}: {exc}") from None


__all__ = ["RunDir", "parse_summary", "read_manifest", "read_summary"]
