"""summary.json: what ``analyze`` concluded, typed at the top, tables as rows.

Top-level keys (``SUMMARY_SCHEMA``):
- schema, kvprof_version, input, input_kind
- device: name, peak_bandwidth_gbs and peak_bandwidth_source (kvprof.core.devices), copy_rate_gbs
  (capture metadata, else the source's, else the spec table by name)
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
- layer_steps: a --context layer run's measured step savings against two_stream and
  rope_then_triton_fused, where the writes sit on the traced GPU timeline, and the notes
  accounting for each gap between measurement and projection (kvprof.analysis.layer_step)
- warnings: every warning, one sentence each

The tables (groups, layers, traces, observer, comparison) stay rows of plain values:
they are read as frames, not field by field. Reading one back (``Summary.from_json``)
checks their figures: a duration, cost, count or rate that is not a number, or is
negative, cannot be a measurement (a summary.json edited or damaged by hand); it is
read as missing and named, with the reason, in ``invalid`` and the warnings, so every
view shows it as n/a instead of "-5,000,000 µs per write".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from kvprof.core.timings import SourceTiming, source_timing

SUMMARY_SCHEMA = "kvprof.summary/1"

# Row figures that are never negative: durations and costs (ns), counts, rates, fractions.
NON_NEGATIVE = frozenset({
    "size", "writes", "steps", "kernels_per_write", "kernels_per_write_min", "kernels_per_write_max",
    "gpu_busy_ns", "gpu_span_ns", "gpu_new_ns", "cost_per_write_ns", "host_launch_ns", "streams",
    "overlap_frac", "idle_ns", "gaps", "bandwidth_gbs", "pct_of_peak", "step_ns", "step_gpu_ns", "step_iqr_ns",
    "writes_only_step_ns", "tokens", "baseline_cost_per_write_ns", "reference_cost_per_write_ns",
})
# The reference pass's cost in a decoder layer is a difference of two medians (the layer with
# and without its writes): noise can make it, and the share, negative.
SIGNED_IN_REFERENCE = frozenset({"cost_per_write_ns", "write_share", "baseline_cost_per_write_ns",
                                 "reference_cost_per_write_ns"})
# Row figures that may have either sign (differences, ratios, savings); only a number.
SIGNED = frozenset({
    "launch_delay_ns", "write_share", "ratio_cost_per_write_ns", "saving_per_step_ms", "predicted_itl_ms",
    "measured_saving_per_step_ms", "measured_saving_spread_ms", "projected_saving_per_step_ms",
    "saving_share_of_itl", "ratio_per_write", "ratio_per_step", "pass_slowdown",
})


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
    # a rope + store variant: "fused" (one launch rotates q and k and writes K and V) or
    # "separate" (a rotary kernel, then the store, which ``fused`` is about); None: store only
    rope: str | None = None
    # launched with programmatic dependent launch, as the capture recorded the writer (True/False);
    # None: not recorded. A variant that is not and whose writes still begin before the work
    # before them on their stream ended is a trace anomaly, not PDL overlap
    pdl_launch: bool | None = None
    # where ``paths`` came from when not from kvprof's own capture: "the SGLang plugin" (its
    # sidecars' counts, kvprof.core.sidecar.plugin_paths); None: the capture's writer reported them
    paths_source: str | None = None
    # its Triton kernel ran in Triton's interpreter (a CPU run): its times are the interpreter's,
    # and every view marks them `*` (kvprof.analysis.figures); None: not recorded
    interpreted: bool | None = None

    def paths_word(self) -> str:
        """What the paths say: "fused", "fused into rope", "not fused", or "?" (nothing decisive)."""
        if self.fused_by_paths is None:
            return "?"
        if not self.fused_by_paths:
            return "not fused"
        return "fused into rope" if self.rope == "fused" else "fused"

    def paths_said(self) -> str:
        """``paths_word`` with the counts and where they came from, for paths that did not come
        from kvprof's capture: "fused (fused x80, from the SGLang plugin)"."""
        word = self.paths_word()
        if not self.paths_source:
            return word
        counts = ", ".join(f"{p} x{n}" for p, n in self.paths.items()) or "no path it judges"
        return f"{word} ({counts}, from {self.paths_source})"

    def verdict_word(self) -> str:
        """The variant's verdict: "fused into rope", "fused", "not fused" or "unknown"."""
        if self.fused is None:
            return "unknown"
        if not self.fused:
            return "not fused"
        return "fused into rope" if self.rope == "fused" else "fused"

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
    layer_steps: dict[str, Any] | None = None  # --context layer: kvprof.analysis.layer_step.LayerSteps.to_json
    kvprof_version: str = ""
    schema: str = SUMMARY_SCHEMA
    invalid: list[str] = field(default_factory=list)  # figures from_json read as missing, and why

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
        if self.layer_steps is not None:
            d["layer_steps"] = self.layer_steps
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
        invalid: list[str] = []
        device: dict[str, Any] = _object(d.get("device")) or {}
        device = {**device, **_checked({k: device.get(k) for k in ("peak_bandwidth_gbs", "copy_rate_gbs")
                                        if k in device}, "device", invalid, positive=True)}
        comparison = _object(d.get("comparison"))
        if comparison is not None:
            comparison = {**comparison, "rows": _checked_rows(comparison.get("rows"), "comparison.rows", invalid)}
        observer: dict[str, Any] = _object(d.get("observer")) or {}
        if observer:
            observer = {**observer, "rows": _checked_rows(observer.get("rows"), "observer.rows", invalid)}
        return cls(
            input=str(d.get("input", "")), input_kind=str(d.get("input_kind", "")),
            device=device, traces=list(d.get("traces") or []),
            variants={str(n): VariantVerdict.from_json(v) for n, v in variants.items() if isinstance(v, dict)},
            groups=_checked_rows(d["groups"], "groups", invalid),
            layers=_checked_rows(d.get("layers"), "layers", invalid), comparison=comparison,
            observer=observer, trusted_sources=list(d.get("trusted_sources") or []),
            reference=d.get("reference"), warnings=invalid + list(d.get("warnings") or []),
            write_kernels=d.get("write_kernels"),
            ranks=d.get("ranks") if isinstance(d.get("ranks"), dict) else None,
            layer_steps=d.get("layer_steps") if isinstance(d.get("layer_steps"), dict) else None,
            kvprof_version=str(d.get("kvprof_version", "")),
            schema=str(d["schema"]), invalid=invalid,
        )


def _object(v: Any) -> dict[str, Any] | None:
    return v if isinstance(v, dict) else None


def _why_invalid(key: str, v: Any, signed: bool, positive: bool = False) -> str | None:
    """Why ``v`` cannot be the figure ``key``, or None when it can (None itself: missing)."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "not a number"
    if not math.isfinite(v):
        return "not finite"
    if positive and v <= 0:
        return "not positive"
    if v < 0 and not signed:
        return "negative, which a duration, cost, count or rate cannot be"
    return None


def _checked(row: dict[str, Any], where: str, invalid: list[str], positive: bool = False) -> dict[str, Any]:
    """``row`` with each figure that cannot be replaced by None, and ``invalid`` told why."""
    reference = row.get("source") == "reference"
    out = dict(row)
    for key, v in row.items():
        if key not in NON_NEGATIVE and key not in SIGNED and not positive:
            continue
        # the reference pass's figures may be negative wherever they sit (its own rows, or the
        # reference column of the observer and comparison tables): noise, which views label
        signed = key in SIGNED or (key in SIGNED_IN_REFERENCE and (reference or key.startswith("reference_")))
        why = _why_invalid(key, v, signed, positive)
        if why is not None:
            out[key] = None
            label = " ".join(str(row.get(k)) for k in ("variant", "source", "phase", "size") if k in row)
            invalid.append(f"the summary's {where}{f' ({label})' if label else ''}: {key} = {repr(v)[:40]} is "
                           f"{why}; read as missing, n/a in every view")
    return out


def _checked_rows(rows: Any, where: str, invalid: list[str]) -> list[dict[str, Any]]:
    """A table's rows (objects only), each figure checked (``_checked``)."""
    if not isinstance(rows, list):
        return []
    return [_checked(r, f"{where.replace('.rows', '')} table, row {i + 1}", invalid)
            for i, r in enumerate(rows) if isinstance(r, dict)]


__all__ = ["NON_NEGATIVE", "SIGNED", "SUMMARY_SCHEMA", "Summary", "VariantVerdict"]
