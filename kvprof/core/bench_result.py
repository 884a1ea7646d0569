"""``bench.json``: what ``kvprof bench`` measured, as typed records.

One :class:`BenchRow` per (point, variant, mode): the point (row shape, dtypes, tokens),
its status (``ok``, ``wrong``, ``unavailable``, ``not installed``, ``failed``), the timings
and the columns derived from the run's limits. :class:`BenchResult` holds the rows with the
run's device, versions, limits and settings, including the :class:`BenchTarget` the fused
writes are judged against. ``to_json`` writes the layout the dashboard and older readers
know (absent values are left out, not written as null); ``from_json`` reads files from
every kvprof version, filling fields an older file lacks with defaults.

Torch-free: the dashboard and the renderers read results without importing the workload.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from kvprof.core.files import gunzipped

BENCH_KIND = "kvprof-bench"
BENCH_SCHEMA = "kvprof.bench/1"  # bench.json's "schema" (docs/formats.md)
MODES = ("graph", "eager")


def bench_cache_root(env: Mapping[str, str] | None = None) -> Path:
    """Where ``kvprof bench`` writes without --out, one folder per run:
    ``$XDG_CACHE_HOME/kvprof/bench`` (``~/.cache/kvprof/bench`` without it). The dashboard's
    Sweeps page reads the bench results there too."""
    env = os.environ if env is None else env
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kvprof" / "bench"


@dataclass(frozen=True)
class BenchTarget:
    """The fused write's target: ``fixed_us`` + bytes / (``rate_fraction`` x measured copy rate).

    Defaults: 1.2 µs (about two empty kernel nodes of a graph replay, docs/benchmarks.md) and 0.9 of the
    device-to-device copy rate; ``kvprof bench --target-fixed-us/--target-rate-fraction``
    change them, and the run records the values it used."""

    fixed_us: float = 1.2
    rate_fraction: float = 0.9

    def __post_init__(self) -> None:
        if not self.fixed_us >= 0:
            raise ValueError(f"target fixed part must be >= 0 µs, got {self.fixed_us}")
        if not 0 < self.rate_fraction <= 1:
            raise ValueError(f"target rate fraction must be in (0, 1], got {self.rate_fraction}")

    def us(self, bytes_moved: int, copy_rate_gbs: float) -> float:
        """The target for a write that moves ``bytes_moved`` bytes, in µs."""
        return self.fixed_us + bytes_moved / (self.rate_fraction * copy_rate_gbs * 1e3)

    def describe(self) -> str:
        return f"{self.fixed_us} µs + bytes / ({self.rate_fraction} x copy rate)"


@dataclass
class BenchRow:
    """One variant at one point in one mode ("graph": CUDA-graph replays, "eager", "cold": one
    write after an L2 flush)."""

    heads: int
    dim: int
    cache_dtype: str
    input_dtype: str
    tokens: int
    variant: str
    mode: str
    status: str
    bytes: int = 0  # inputs read once plus rows written once, K and V (rope: q and k also written back)
    writes_per_sample: int = 0
    reason: str | None = None  # why a row is not "ok"
    median_us: float | None = None  # per write
    iqr_us: float | None = None
    samples: int | None = None
    paths: dict[str, int] | None = None  # the pool's write paths, counted
    allocation_us: list[float] | None = None  # graph medians over several allocations (floor-bound points)
    host_us: float | None = None  # eager: host time per write through the pool
    host_iqr_us: float | None = None
    writer_host_us: float | None = None  # eager: host time per write, the writer alone
    writer_host_iqr_us: float | None = None
    # derived from the run's limits (kvprof.bench.run.derive)
    gbs: float | None = None
    pct_copy_rate: float | None = None
    target_us: float | None = None
    meets_target: bool | None = None
    floor_us: float | None = None
    ratio_to: dict[str, float] | None = None  # peer's median / this one's (> 1: this is faster)
    # the rope family (``bench --family rope``): query heads rotated with each write, besides
    # the ``heads`` K/V heads; None: a store of K and V alone
    q_heads: int | None = None

    @property
    def shape(self) -> str:
        """"HEADSxDIM"; a rope point "QxHEADSxDIM" (query heads first)."""
        return f"{self.q_heads}x{self.heads}x{self.dim}" if self.q_heads else f"{self.heads}x{self.dim}"

    @property
    def dtype(self) -> str:
        return self.cache_dtype if self.cache_dtype == self.input_dtype else f"{self.cache_dtype}<-{self.input_dtype}"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def key(self) -> tuple[str, str, int, str]:
        """(shape, dtype, tokens, mode): the rows of one comparison."""
        return (self.shape, self.dtype, self.tokens, self.mode)

    def to_json(self) -> dict[str, Any]:
        head = {"heads": self.heads, "dim": self.dim, "cache_dtype": self.cache_dtype,
                "input_dtype": self.input_dtype, "tokens": self.tokens, "shape": self.shape, "dtype": self.dtype}
        rest = {k: v for k, v in asdict(self).items() if k not in head and v is not None}
        return {**head, **rest}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BenchRow:
        """A record of any kvprof version. Files with only ``shape``/``dtype`` (no heads, dim or
        dtypes) get them back from those labels."""
        heads, dim = d.get("heads"), d.get("dim")
        if (heads is None or dim is None) and isinstance(d.get("shape"), str) and "x" in d["shape"]:
            h, _, w = d["shape"].rpartition("x")
            heads, dim = int(h.rpartition("x")[2]), int(w)
        label = str(d.get("dtype") or "")
        cache, _, inp = label.partition("<-")
        known = {f.name for f in fields(cls)}
        extra = {k: v for k, v in d.items() if k in known and k not in
                 ("heads", "dim", "cache_dtype", "input_dtype", "tokens", "variant", "mode", "status")}
        return cls(heads=int(heads or 0), dim=int(dim or 0), cache_dtype=str(d.get("cache_dtype") or cache),
                   input_dtype=str(d.get("input_dtype") or inp or cache), tokens=int(d.get("tokens") or 0),
                   variant=str(d.get("variant") or ""), mode=str(d.get("mode") or "graph"),
                   status=str(d.get("status") or "ok"), **extra)


@dataclass
class BenchSettings:
    """How a run measured: replays and loops, pool size, targets, the variants and point count,
    and torch's intra-op threads while it timed (None in files from before it was recorded)."""

    replays: int = 100
    eager_repeats: int = 20
    pool_bytes: int = 256 << 20
    variants: list[str] = field(default_factory=list)
    points: int = 0
    target: BenchTarget = field(default_factory=BenchTarget)
    floor_allocations: dict[str, Any] = field(default_factory=dict)  # count, max_bytes_per_write, variants
    torch_threads: int | None = None
    modes: list[str] = field(default_factory=list)  # timings taken; empty in files from before it was recorded
    # variants whose Triton kernel ran under Triton's interpreter (numpy on the host): their
    # times are the interpreter's, not a kernel's; empty on a GPU and in files from before
    interpreted: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        doc = {"replays": self.replays, "eager_repeats": self.eager_repeats, "pool_bytes": self.pool_bytes,
               "floor_allocations": self.floor_allocations, "target": self.target.describe(),
               "target_fixed_us": self.target.fixed_us, "target_rate_fraction": self.target.rate_fraction,
               "variants": list(self.variants), "points": self.points}
        if self.torch_threads is not None:
            doc["torch_threads"] = self.torch_threads
        if self.modes:
            doc["modes"] = list(self.modes)
        if self.interpreted:
            doc["interpreted"] = list(self.interpreted)
        return doc

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> BenchSettings:
        """Runs before the target was a setting were judged against the default target."""
        default = BenchTarget()
        target = BenchTarget(float(d.get("target_fixed_us", default.fixed_us)),
                             float(d.get("target_rate_fraction", default.rate_fraction)))
        return cls(replays=int(d.get("replays", 100)), eager_repeats=int(d.get("eager_repeats", 20)),
                   pool_bytes=int(d.get("pool_bytes", 256 << 20)), variants=[str(v) for v in d.get("variants") or []],
                   points=int(d.get("points", 0)), target=target,
                   floor_allocations=dict(d.get("floor_allocations") or {}),
                   torch_threads=int(d["torch_threads"]) if d.get("torch_threads") is not None else None,
                   modes=[str(m) for m in d.get("modes") or []],
                   interpreted=[str(v) for v in d.get("interpreted") or []])


@dataclass
class BenchResult:
    """One ``kvprof bench`` run. ``complete`` is False in a file written after every point
    (a run cut short keeps what it measured)."""

    records: list[BenchRow] = field(default_factory=list)
    settings: BenchSettings = field(default_factory=BenchSettings)
    device: dict[str, Any] = field(default_factory=dict)  # kvprof.kvcache.devinfo.device_properties
    versions: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, float | None] = field(default_factory=dict)  # copy rate, empty-node costs
    sources: dict[str, Any] = field(default_factory=dict)  # where a peer's kernels came from
    # which card's launch tables kvprof's Triton writers took (kvprof.kvcache.writers.card_tables.tables_report)
    launch_tables: dict[str, Any] = field(default_factory=dict)
    # kvprof's Triton kernels' launches: compiled path, Triton's path by reason (triton_launch.launch_counts)
    launches: dict[str, Any] = field(default_factory=dict)
    date: str = ""
    complete: bool = True
    command: str | None = None

    @property
    def variants(self) -> list[str]:
        """The variants in the order they ran (the settings', else the records')."""
        return self.settings.variants or list(dict.fromkeys(r.variant for r in self.records))

    @property
    def device_name(self) -> str | None:
        name = self.device.get("name")
        return str(name) if name else None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"schema": BENCH_SCHEMA, "kind": BENCH_KIND, "complete": self.complete, "date": self.date,
                               "device": self.device, "versions": self.versions, "limits": self.limits,
                               "sources": self.sources, "settings": self.settings.to_json(),
                               "records": [r.to_json() for r in self.records]}
        if self.launch_tables:
            doc["launch_tables"] = self.launch_tables
        if self.launches:
            doc["launches"] = self.launches
        if self.command is not None:
            doc["command"] = self.command
        return doc

    def dumps(self) -> bytes:
        return orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_json(cls, doc: dict[str, Any] | bytes | str) -> BenchResult:
        """A ``bench.json`` document (parsed, or its bytes, gzipped as results are kept);
        ValueError if it is not one."""
        if isinstance(doc, bytes):
            try:
                doc = gunzipped(doc)
            except ValueError as exc:
                raise ValueError(f"not kvprof bench output ({exc})") from None
        if isinstance(doc, (bytes, str)):
            doc = orjson.loads(doc)
        if not isinstance(doc, dict) or not isinstance(doc.get("records"), list):
            raise ValueError("not kvprof bench output (no records)")
        if doc.get("kind", BENCH_KIND) != BENCH_KIND:
            raise ValueError(f"not kvprof bench output (kind {doc.get('kind')!r})")
        return cls(records=[BenchRow.from_json(r) for r in doc["records"] if isinstance(r, dict)],
                   settings=BenchSettings.from_json(doc.get("settings") or {}),
                   device=dict(doc.get("device") or {}), versions=dict(doc.get("versions") or {}),
                   limits=dict(doc.get("limits") or {}), sources=dict(doc.get("sources") or {}),
                   date=str(doc.get("date") or ""), complete=bool(doc.get("complete", True)),
                   command=doc.get("command"), launch_tables=dict(doc.get("launch_tables") or {}),
                   launches=dict(doc.get("launches") or {}))


__all__ = ["BENCH_KIND", "MODES", "BenchResult", "BenchRow", "BenchSettings", "BenchTarget"]
