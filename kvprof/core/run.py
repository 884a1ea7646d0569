"""The run directory's contract: manifest.json, each variant's entry, a trace's kvprof metadata.

Capture writes these, the trace readers and the analysis read them, the dashboard shows
them; all of them go through these classes, never through string keys of a raw dict.
JSON is anyone's to edit, so ``from_json`` type-checks every known key, keeps a key only
with the type kvprof writes and names every key it dropped in ``warnings`` (never a
silent change). Defaults for older runs live only in ``from_json``. Keys a class does not
know are kept in ``extra`` so that a newer run read by an older kvprof loses nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kvprof.core.ranks import RankEntry
from kvprof.core.vocab import FALLBACK_PREFIX, FUSED


def _is_int(v: Any) -> bool:
    return v.__class__ is int and -(1 << 63) < v < (1 << 63)


def _is_number(v: Any) -> bool:
    return _is_int(v) or (v.__class__ is float and math.isfinite(v))


def _str_map(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, dict) and all(isinstance(k, str) and check(x) for k, x in v.items())


def _opt_str(v: Any) -> bool:
    return v is None or isinstance(v, str)


def _checked(doc: dict[str, Any], types: dict[str, Callable[[Any], bool]], where: str,
             warnings: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(known keys of the right type, unknown keys); a warning names the ill-typed ones."""
    known: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in doc.items():
        check = types.get(key)
        if check is None:
            extra[key] = value
        elif check(value):
            known[key] = value
        else:
            dropped.append(key)
    if dropped:
        warnings.append(f"{where}: ignored {', '.join(dropped)} (not of the type kvprof writes)")
    return known, extra


def _iso_time(v: Any) -> bool:
    """An ISO 8601 time with its UTC offset (what capture writes), e.g. 2026-12-04T17:16:31+00:00."""
    if not isinstance(v, str):
        return False
    try:
        return datetime.fromisoformat(v).tzinfo is not None
    except ValueError:
        return False


def plain_name(name: str) -> bool:
    """A file name directly inside the run folder (no separator, no '..', not hidden)."""
    return bool(name) and "/" not in name and "\\" not in name and "\x00" not in name and not name.startswith(".")


@dataclass
class PathReport:
    """What ran, from the paths the writer itself reported: fused, fell back, or mixed."""

    claim: bool | None
    state: str  # "fused" | "fell back" | "partly fell back" | "not fused" | "no writes"
    fused_writes: int
    writes: int
    fallbacks: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of_paths(cls, claim: bool | None, paths: dict[str, int]) -> PathReport:
        total = sum(paths.values())
        fused = paths.get(FUSED, 0)
        fallbacks = {k: v for k, v in paths.items() if k.startswith(FALLBACK_PREFIX)}
        if total == 0:
            state = "no writes"
        elif fused == total:
            state = "fused"
        elif fused == 0 and fallbacks:
            state = "fell back"
        elif fused:
            state = "partly fell back"
        else:
            state = "not fused"
        return cls(claim, state, fused, total, fallbacks)

    def to_json(self) -> dict[str, Any]:
        return {"claim": self.claim, "state": self.state, "fused_writes": self.fused_writes,
                "writes": self.writes, "fallbacks": dict(self.fallbacks)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PathReport:
        fb = d.get("fallbacks")
        return cls(claim=d.get("claim") if isinstance(d.get("claim"), bool) else None,
                   state=str(d.get("state") or "no writes"),
                   fused_writes=int(d["fused_writes"]) if _is_int(d.get("fused_writes")) else 0,
                   writes=int(d["writes"]) if _is_int(d.get("writes")) else 0,
                   fallbacks={str(k): int(v) for k, v in fb.items() if _is_int(v)} if isinstance(fb, dict) else {})


_ENTRY_TYPES: dict[str, Callable[[Any], bool]] = {
    "available": lambda v: isinstance(v, bool),
    "reason": _opt_str,
    "description": _opt_str,
    "fused_claim": lambda v: v is None or isinstance(v, bool),
    "files": _str_map(lambda x: isinstance(x, str)),
    "paths": _str_map(lambda x: _is_int(x) and x >= 0),
    "bytes_per_token": _is_number,
    "kernels_per_write": _str_map(lambda x: x is None or (_is_int(x) and x >= 0)),
    "fused": lambda v: isinstance(v, dict),
    "reference_error": _opt_str,
    "nsys_paths": _str_map(lambda x: _is_int(x) and x >= 0),
    "nsys_error": _opt_str,
    "pdl_launch": lambda v: v is None or isinstance(v, bool),
}


@dataclass
class VariantEntry:
    """One variant of a run: whether it ran (and why not), its files, what its writer reported."""

    available: bool = True
    reason: str | None = None
    description: str | None = None
    fused_claim: bool | None = None
    files: dict[str, str] = field(default_factory=dict)  # torch_trace, nsys_rep, nsys_sqlite -> plain names
    paths: dict[str, int] = field(default_factory=dict)  # path the writer reported -> writes
    kernels_per_write: dict[str, int | None] = field(default_factory=dict)  # "<phase> <size>" -> count
    bytes_per_token: float | None = None
    fused: PathReport | None = None
    reference_error: str | None = None  # the unprofiled pass failed: why
    nsys_paths: dict[str, int] | None = None  # paths the writer reported in the nsys pass
    nsys_error: str | None = None  # the nsys pass failed: why (the torch results are kept)
    # the writer launches its kernels with programmatic dependent launch on the capture's device
    # (a kernel may begin before the one before it on its stream ends); None: the writer does not
    # say (a library's kernel that decides for itself), or a run from before kvprof recorded it
    pdl_launch: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def interpreted(self) -> bool:
        """Its Triton kernel ran under Triton's interpreter (numpy on the host, not a GPU's time)."""
        return self.available and self.extra.get("interpreted") is True

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"available": self.available, "reason": self.reason, "description": self.description,
                             "fused_claim": self.fused_claim, "files": dict(self.files)}
        if self.paths:
            d["paths"] = dict(self.paths)
        if self.kernels_per_write:
            d["kernels_per_write"] = dict(self.kernels_per_write)
        if self.bytes_per_token is not None:
            d["bytes_per_token"] = self.bytes_per_token
        if self.fused is not None:
            d["fused"] = self.fused.to_json()
        for key in ("reference_error", "nsys_paths", "nsys_error", "pdl_launch"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        return {**self.extra, **d}

    @classmethod
    def from_json(cls, name: str, doc: Any, warnings: list[str] | None = None) -> VariantEntry:
        """A manifest entry, type-checked; file names outside the run folder are dropped."""
        warnings = [] if warnings is None else warnings
        if not isinstance(doc, dict):
            warnings.append(f"manifest: variant {name!r} is not an object; ignored")
            return cls(available=False, reason="manifest entry is not an object")
        d, extra = _checked(doc, _ENTRY_TYPES, f"manifest: variant {name!r}", warnings)
        files = dict(d.get("files") or {})
        outside = [k for k, f in files.items() if not plain_name(f)]
        if outside:
            files = {k: f for k, f in files.items() if k not in outside}
            warnings.append(f"manifest: variant {name!r} names files outside the run folder ({', '.join(outside)}); "
                            "not read")
        return cls(available=d.get("available", True), reason=d.get("reason"), description=d.get("description"),
                   fused_claim=d.get("fused_claim"), files=files, paths=dict(d.get("paths") or {}),
                   kernels_per_write=dict(d.get("kernels_per_write") or {}),
                   bytes_per_token=float(d["bytes_per_token"]) if "bytes_per_token" in d else None,
                   fused=PathReport.from_json(d["fused"]) if "fused" in d else None,
                   reference_error=d.get("reference_error"), nsys_paths=d.get("nsys_paths"),
                   nsys_error=d.get("nsys_error"), pdl_launch=d.get("pdl_launch"), extra=extra)


MANIFEST_SCHEMA = "kvprof.manifest/1"  # docs/formats.md; bumped when a key changes meaning

_MANIFEST_TYPES: dict[str, Callable[[Any], bool]] = {
    "schema": lambda v: isinstance(v, str),
    "kvprof": _opt_str,
    "run_id": _opt_str,
    "versions": lambda v: isinstance(v, dict),
    "device": lambda v: isinstance(v, dict),
    "config": lambda v: isinstance(v, dict),
    "phases": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    "cuda_graphs_used": lambda v: isinstance(v, bool),
    "files": _str_map(lambda x: isinstance(x, str)),
    "problems": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "scrubbed": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "nsys": lambda v: isinstance(v, dict),
    "world_size": lambda v: _is_int(v) and 1 <= v < (1 << 31),
    "backend": lambda v: isinstance(v, str),
    "captured_at": lambda v: v is None or _iso_time(v),
}


@dataclass
class Manifest:
    """manifest.json: what a capture ran, on what, with which files per variant."""

    run_id: str | None = None
    kvprof: str | None = None  # the version that wrote it
    captured_at: str | None = None  # when the capture started, ISO 8601 UTC; None (unknown) in older runs
    versions: dict[str, Any] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # kvprof.capture.config.CaptureConfig.as_dict
    phases: list[dict[str, Any]] = field(default_factory=list)
    cuda_graphs_used: bool = False
    variants: dict[str, VariantEntry] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # run-level files: step_timings
    problems: list[str] = field(default_factory=list)
    scrubbed: list[str] | None = None
    nsys: dict[str, Any] | None = None  # path, version, the child environment's description
    # capture --ranks N: one process per rank (kvprof.core.ranks); None for a one-process run
    world_size: int | None = None
    backend: str | None = None  # torch.distributed backend: gloo or nccl
    ranks: list[RankEntry] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # what from_json dropped; not written

    @property
    def context(self) -> str:
        return str(self.config.get("context") or "none")

    @property
    def layout(self) -> str:
        """The cache layout the run wrote (runs from before layouts existed wrote the MHA pool)."""
        resolved = self.config.get("resolved")
        layout = resolved.get("layout") if isinstance(resolved, dict) else None
        return layout if isinstance(layout, str) and layout else "mha"

    @property
    def captured(self) -> datetime | None:
        """When the capture started (None: not recorded, a run from before kvprof wrote it)."""
        return datetime.fromisoformat(self.captured_at) if self.captured_at else None

    def file(self, key: str, default: str) -> str:
        """A run-level file's name, always a plain name inside the run folder."""
        name = self.files.get(key)
        return name if isinstance(name, str) and plain_name(name) else default

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema": MANIFEST_SCHEMA, "kvprof": self.kvprof, "run_id": self.run_id, "captured_at": self.captured_at,
            "versions": self.versions, "device": self.device,
            "config": self.config, "phases": self.phases, "cuda_graphs_used": self.cuda_graphs_used,
            "variants": {n: e.to_json() for n, e in self.variants.items()}, "files": dict(self.files),
            "problems": list(self.problems),
        }
        if self.scrubbed is not None:
            d["scrubbed"] = list(self.scrubbed)
        if self.nsys is not None:
            d["nsys"] = self.nsys
        if self.world_size is not None:
            d["world_size"] = self.world_size
            d["backend"] = self.backend
            d["ranks"] = [r.to_json() for r in self.ranks]
        return {**self.extra, **d}

    def dumps(self) -> bytes:
        import orjson

        return orjson.dumps(self.to_json(), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, doc: Any) -> Manifest:
        """Raises ValueError for a document that is not a manifest (no ``variants`` object)."""
        if not isinstance(doc, dict) or not isinstance(doc.get("variants"), dict):
            raise ValueError("not a kvprof manifest (no variants)")
        warnings: list[str] = []
        d, extra = _checked({k: v for k, v in doc.items() if k not in ("variants", "ranks")}, _MANIFEST_TYPES,
                            "manifest", warnings)
        variants = {str(n): VariantEntry.from_json(str(n), e, warnings) for n, e in doc["variants"].items()}
        ranks = _ranks_of(doc.get("ranks"), warnings)
        return cls(run_id=d.get("run_id"), kvprof=d.get("kvprof"), captured_at=d.get("captured_at"),
                   versions=d.get("versions", {}),
                   device=d.get("device", {}), config=d.get("config", {}), phases=d.get("phases", []),
                   cuda_graphs_used=d.get("cuda_graphs_used", False), variants=variants,
                   files=d.get("files", {}), problems=d.get("problems", []), scrubbed=d.get("scrubbed"),
                   nsys=d.get("nsys"), world_size=d.get("world_size"), backend=d.get("backend"), ranks=ranks,
                   extra=extra, warnings=warnings)


def captured_text(manifest: Manifest | None) -> str:
    """When a run was captured, as compare and the dashboard show it: "captured 2026-12-04 17:16:31
    UTC", or why that is unknown."""
    if manifest is None:
        return "capture time unknown: no manifest, a trace and not a run directory"
    when = manifest.captured
    if when is None:
        return "capture time unknown: captured before kvprof recorded it"
    return f"captured {when.astimezone(timezone.utc).strftime('%Y-%m-%d %H:%M:%S')} UTC"


def _ranks_of(doc: Any, warnings: list[str]) -> list[RankEntry]:
    """The ``ranks`` list, each entry checked; file names outside the run folder are dropped."""
    if doc is None:
        return []
    if not isinstance(doc, list):
        warnings.append("manifest: ignored ranks (not a list)")
        return []
    out = []
    for item in doc:
        entry = RankEntry.from_json(item, warnings)
        if entry is None:
            continue
        outside = [v for v, f in entry.files.items() if not plain_name(f)]
        if outside or (entry.timings is not None and not plain_name(entry.timings)):
            warnings.append(f"manifest: rank {entry.rank} names files outside the run folder; not read")
            entry.files = {v: f for v, f in entry.files.items() if v not in outside}
            entry.timings = entry.timings if entry.timings is None or plain_name(entry.timings) else None
        out.append(entry)
    return out


_META_TYPES: dict[str, Callable[[Any], bool]] = {
    "variant": lambda v: isinstance(v, str) and bool(v),
    "fused": lambda v: isinstance(v, bool) or v is None,
    "run_id": lambda v: isinstance(v, str),
    "cache_dtype": lambda v: isinstance(v, str),
    "input_dtype": lambda v: isinstance(v, str),
    "device": lambda v: isinstance(v, dict),
    "model": lambda v: isinstance(v, dict),
    "layers": lambda v: isinstance(v, list) and bool(v) and all(_is_int(x) and 0 <= x < (1 << 31) for x in v),
    "context": lambda v: isinstance(v, str),
    "layout": lambda v: isinstance(v, str) and bool(v),
    "bytes_per_token": _is_number,
    "phases": lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v),
    "kernels_per_write": _str_map(lambda x: x is None or (_is_int(x) and x >= 0)),
    "template": _str_map(lambda x: isinstance(x, dict)),
    "paths": _str_map(lambda x: _is_int(x) and x >= 0),
}


def hta_metadata_json(rank: int = 0, world_size: int = 1) -> str:
    """The ``distributedInfo`` a captured trace carries (``prof.add_metadata_json("distributedInfo",
    ...)``, inside the profile block), where HolisticTraceAnalysis reads its rank: HTA finds it
    with the regex ``"rank":\\s+(\\d+)`` over the raw text, so it is written with a space after
    the colon (``json.dumps`` does; ``orjson.dumps`` does not, and then HTA falls back to rank 0
    with a warning)."""
    return json.dumps({"backend": "none", "rank": int(rank), "world_size": int(world_size)})


@dataclass
class TraceMeta:
    """The ``kvprof`` key of a trace kvprof captured: enough to analyse it without its run folder.

    ``template`` and ``kernels_per_write`` are keyed "<phase> <size>" (e.g. "decode 10"):
    how one eager step's GPU activities split into writes, used to cut graph replays.
    """

    variant: str | None = None
    fused: bool | None = None  # the writer's claim
    run_id: str | None = None
    cache_dtype: str | None = None
    input_dtype: str | None = None
    device: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    layers: list[int] = field(default_factory=list)
    context: str = "none"
    layout: str | None = None  # the cache layout (mha, mla, paged); None in traces from before layouts
    bytes_per_token: float | None = None
    phases: list[dict[str, Any]] = field(default_factory=list)
    kernels_per_write: dict[str, int | None] = field(default_factory=dict)
    template: dict[str, dict[str, Any]] = field(default_factory=dict)
    paths: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = {"variant": self.variant, "fused": self.fused, "run_id": self.run_id, "cache_dtype": self.cache_dtype,
             "input_dtype": self.input_dtype, "device": self.device, "model": self.model, "layers": self.layers,
             "context": self.context, "layout": self.layout, "bytes_per_token": self.bytes_per_token,
             "phases": self.phases,
             "kernels_per_write": self.kernels_per_write, "template": self.template, "paths": self.paths}
        return {**self.extra, **{k: v for k, v in d.items() if v is not None}}

    @classmethod
    def from_json(cls, doc: dict[str, Any], warnings: list[str] | None = None) -> TraceMeta:
        warnings = [] if warnings is None else warnings
        d, extra = _checked(doc, _META_TYPES, "the trace's kvprof metadata", warnings)
        return cls(variant=d.get("variant"), fused=d.get("fused"), run_id=d.get("run_id"),
                   cache_dtype=d.get("cache_dtype"), input_dtype=d.get("input_dtype"), device=d.get("device", {}),
                   model=d.get("model", {}), layers=[int(x) for x in d.get("layers", [])],
                   context=d.get("context") or "none", layout=d.get("layout"),
                   bytes_per_token=float(d["bytes_per_token"]) if "bytes_per_token" in d else None,
                   phases=d.get("phases", []), kernels_per_write=d.get("kernels_per_write", {}),
                   template=d.get("template", {}), paths=d.get("paths", {}), extra=extra)

    @classmethod
    def of_run(cls, name: str, manifest: Manifest) -> TraceMeta:
        """What the manifest knows of a variant's capture: for an nsys export with no metadata of its own."""
        return cls(variant=name, run_id=manifest.run_id, context=manifest.context, layout=manifest.layout)


__all__ = ["Manifest", "PathReport", "TraceMeta", "VariantEntry", "captured_text", "hta_metadata_json", "plain_name"]
