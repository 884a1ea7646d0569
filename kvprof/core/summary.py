"""summary.json: what ``analyze`` concluded, typed at the top, tables as rows.

Top-level keys (``SUMMARY_SCHEMA``):
- schema, kvprof_version, input, input_kind
- device: name, peak_bandwidth_gbs, copy_rate_gbs (capture metadata, else the source's)
- traces: per file -- path, source, variants, is_kvprof, events, gpu_events, clock,
  attribution (method counts, see kvprof.trace.attribution), stats, generic (see
  kvprof.analysis.generic: kernels by name, streams, overlap, gaps, launches)
- variants: per variant, a ``VariantVerdict``
- groups: rows of kvprof.analysis.metrics.GROUP_COLUMNS per (variant, source, phase, size)
- layers: the same per layer
- comparison: kvprof.analysis.compare.compare_groups against the baseline (when present)
- observer: kvprof.analysis.reference.observer_effect, each profiler against the reference
- trusted_sources: the order headline figures are drawn from (reference first)
- reference: what the reference pass timed (context, clock, steps per series)
- write_kernels: kvprof.analysis.write_kernels (analyze only)
- ranks: a multi-rank run's per-rank rows, skew and same-path check (kvprof.analysis.ranks)
- warnings: every warning, one sentence each

The tables (groups, layers, traces, observer, comparison) stay rows of plain values:
they are read as frames, not field by field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from kvprof.core.timings import SourceTiming, source_timing

SUMMARY_SCHEMA = "kvprof.summary/1"


@dataclass
class VariantVerdict:
    """Did the variant run, and did it run fused or fall back (two witnesses and whether they agree)."""

    available: bool = True
    reason: str | None = None
    sources: list[str] = field(default_factory=list)
    fused_claim: bool | None = None
    paths: dict[str, int] = field(default_factory=dict)
    fused_by_paths: bool | None = None
    fused_by_kernels: bool | None = None
    agree: bool | None = None
    fused: bool | None = None
    fell_back: bool = False
    fallback_reasons: list[str] = field(default_factory=list)
    kernel_counts: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        if not self.available:
            return {"available": False, "reason": self.reason, "sources": list(self.sources)}
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> VariantVerdict:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass
class Summary:
    input: str
    input_kind: str
    device: dict[str, Any] = field(default_factory=dict)
    traces: list[dict[str, Any]] = field(default_factory=list)
    variants: dict[str, VariantVerdict] = field(default_factory=dict)
    groups: list[dict[str, Any]] = field(default_factory=list)
    layers: list[dict[str, Any]] = field(default_factory=list)
    comparison: dict[str, Any] | None = None
    observer: dict[str, Any] = field(default_factory=dict)
    trusted_sources: list[str] = field(default_factory=list)
    reference: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    write_kernels: dict[str, Any] | None = None
    ranks: dict[str, Any] | None = None  # a multi-rank run: kvprof.analysis.ranks.RankAnalysis.to_json
    kvprof_version: str = ""
    schema: str = SUMMARY_SCHEMA

    @property
    def fused_variants(self) -> list[str]:
        return [n for n, v in self.variants.items() if v.fused]

    def timing(self, source: str | None) -> SourceTiming:
        """How ``source``'s figures were timed (CUDA events, wall clock, ...): every view's label."""
        return source_timing(source, self.reference, self.traces)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema": self.schema, "kvprof_version": self.kvprof_version, "input": self.input,
            "input_kind": self.input_kind, "device": self.device, "traces": self.traces,
            "variants": {n: v.to_json() for n, v in self.variants.items()}, "groups": self.groups,
            "layers": self.layers, "comparison": self.comparison, "observer": self.observer,
            "trusted_sources": self.trusted_sources, "reference": self.reference, "warnings": self.warnings,
        }
        if self.write_kernels is not None:
            d["write_kernels"] = self.write_kernels
        if self.ranks is not None:
            d["ranks"] = self.ranks
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Summary:
        """Raises ValueError for a document that is not a kvprof summary."""
        if not isinstance(d, dict) or not str(d.get("schema", "")).startswith("kvprof.summary/"):
            raise ValueError("not a kvprof summary (no kvprof.summary schema)")
        if not isinstance(d.get("groups"), list):
            raise ValueError("not a kvprof summary (no groups)")
        raw_variants = d.get("variants")
        variants = raw_variants if isinstance(raw_variants, dict) else {}
        return cls(
            input=str(d.get("input", "")), input_kind=str(d.get("input_kind", "")),
            device=d.get("device") or {}, traces=list(d.get("traces") or []),
            variants={str(n): VariantVerdict.from_json(v) for n, v in variants.items() if isinstance(v, dict)},
            groups=d["groups"], layers=list(d.get("layers") or []), comparison=d.get("comparison"),
            observer=d.get("observer") or {}, trusted_sources=list(d.get("trusted_sources") or []),
            reference=d.get("reference"), warnings=list(d.get("warnings") or []),
            write_kernels=d.get("write_kernels"),
            ranks=d.get("ranks") if isinstance(d.get("ranks"), dict) else None, kvprof_version=str(d.get("kvprof_version", "")),
            schema=str(d["schema"]),
        )


__all__ = ["SUMMARY_SCHEMA", "Summary", "VariantVerdict"]
