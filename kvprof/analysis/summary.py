"""From loaded traces to the tables and the summary document (kvprof.core.summary.Summary)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvprof import __version__
from kvprof.analysis.compare import Benchmark, compare_groups
from kvprof.analysis.early_start import early_start_notes
from kvprof.analysis.generic import NO_GPU, generic_summary
from kvprof.analysis.jsonsafe import clean
from kvprof.analysis.layer_step import WriteBoundary, layer_steps, write_boundaries
from kvprof.analysis.metrics import fused_or_fell_back, group_metrics, measured
from kvprof.analysis.ranks import analyze_ranks, collective_per_step
from kvprof.analysis.reference import observer_effect, observer_notes, reference_groups, trusted_sources
from kvprof.analysis.writes import (
    WRITE_COLUMNS,
    gpu_work_rows,
    peak_bandwidth_gbs,
    per_step_table,
    per_write_table,
    trace_rank,
)
from kvprof.core.devices import CAPTURE_METADATA, SPEC_TABLE, spec_peak_gbs
from kvprof.core.numbers import finite_or_none
from kvprof.core.sidecar import canary_lines, plugin_paths, shadow_lines
from kvprof.core.summary import SUMMARY_SCHEMA, Summary, VariantVerdict
from kvprof.core.timings import CONTROLS
from kvprof.core.variants import BASELINE as DEFAULT_BASELINE
from kvprof.trace.load import Loaded
from kvprof.trace.table import to_frame


@dataclass
class Analysis:
    writes: pd.DataFrame
    steps: pd.DataFrame
    groups: pd.DataFrame
    layers: pd.DataFrame
    summary: Summary
    warnings: list[str] = field(default_factory=list)


def _device(loaded: Loaded) -> dict[str, Any]:
    """The device's name and rates, from the first source that has each (capture metadata, the
    traces' device info, the manifest, the SGLang plugin's sidecars): a name is text, a rate a
    positive finite number (a trace's metadata can hold anything). The peak comes with where it
    came from (``peak_bandwidth_source``); without one, the spec table by the device's name."""
    dev: dict[str, Any] = {"name": None, "peak_bandwidth_gbs": None, "peak_bandwidth_source": None,
                           "copy_rate_gbs": None}
    mdev = loaded.manifest.device if loaded.manifest else {}
    sources = [d for t in loaded.traces for d in [t.kvprof.device if t.kvprof else {}, *t.devices]] + [mdev]
    sources += [sc.device.to_dict() for sc in loaded.sidecars if sc.device is not None]
    for d in sources:
        if not isinstance(d, dict):
            continue
        for k in ("name", "peak_bandwidth_gbs", "copy_rate_gbs"):
            v = d.get(k)
            ok = isinstance(v, str) if k == "name" else (finite_or_none(v) or 0) > 0 and not isinstance(v, bool)
            if dev[k] is None and ok:
                dev[k] = v
                if k == "peak_bandwidth_gbs":
                    src = d.get("peak_bandwidth_source")
                    dev["peak_bandwidth_source"] = src if isinstance(src, str) and src else CAPTURE_METADATA
    if dev["peak_bandwidth_gbs"] is None:
        spec = spec_peak_gbs(dev["name"])
        if spec is not None:
            dev.update(peak_bandwidth_gbs=spec, peak_bandwidth_source=SPEC_TABLE)
    return dev


def _reference_doc(loaded: Loaded) -> dict[str, Any] | None:
    t = loaded.timings
    if t is None:
        return None
    recs = [r for r in t.select(pass_="reference") if r.mode not in CONTROLS]
    return {"context": t.context, "context_len": t.context_len,
            "clock": sorted({r.clock for r in recs}), "series": len(recs),
            "steps_per_series": sorted({len(r.samples_ns) for r in recs})}


def _bytes_per_token(loaded: Loaded) -> dict[str, float]:
    """Each variant's KV bytes per token: the run's record, overridden by a trace's own."""
    bpt: dict[str, float] = {}
    for name, entry in loaded.variants.items():
        if entry.bytes_per_token is not None:
            bpt[name] = entry.bytes_per_token
    for t in loaded.traces:
        if t.kvprof and t.kvprof.variant and t.kvprof.bytes_per_token is not None:
            bpt[t.kvprof.variant] = t.kvprof.bytes_per_token
    return bpt


@dataclass
class _TraceTables:
    """What one pass over the traces gathers, in trace order."""

    writes: list[pd.DataFrame] = field(default_factory=list)
    steps: list[pd.DataFrame] = field(default_factory=list)
    docs: list[dict[str, Any]] = field(default_factory=list)
    rank_inputs: list[tuple[str, int, pd.DataFrame]] = field(default_factory=list)  # (trace, rank, collectives)
    boundaries: list[WriteBoundary] = field(default_factory=list)  # --context layer: writes on the GPU timeline
    warnings: list[str] = field(default_factory=list)


def _read_traces(loaded: Loaded, bpt: dict[str, float], multi_rank: bool) -> _TraceTables:
    """Per-write and per-step tables, the document entry and the notes of every trace."""
    out = _TraceTables()
    for t in loaded.traces:
        ev = to_frame(t.events)
        w = per_write_table(t, ev, bpt)
        out.writes.append(w)
        out.steps.append(per_step_table(t, w, ev))
        if t.kvprof is not None and t.kvprof.context == "layer":
            out.boundaries += write_boundaries(gpu_work_rows(ev), w)
        if multi_rank:
            rank = trace_rank(ev)
            out.rank_inputs.append((t.path, rank, collective_per_step(ev, rank)))
        gen = generic_summary(ev, t.stats, {int(d["id"]): d["name"] for d in t.devices
                                            if isinstance(d.get("id"), int) and isinstance(d.get("name"), str)})
        if not gen["gpu"]:
            out.warnings.append(f"{t.path}: " + ("no GPU events (CPU-only trace): only CPU-side numbers are reported"
                                                 if gen["note"] == NO_GPU else gen["note"]))
        out.warnings.extend(f"{t.path}: {m}" for m in t.warnings)
        out.docs.append({
            "path": t.path, "source": t.source, "variants": t.variants, "is_kvprof": t.is_kvprof,
            "events": int(len(ev)), "gpu_events": int((ev["device"] >= 0).sum()), "clock": t.clock,
            "attribution": t.attribution, "stats": t.stats, "devices": t.devices,
            "peak_bandwidth_gbs": peak_bandwidth_gbs(t), "generic": gen,
        })
    return out


def _stacked(frames: list[pd.DataFrame], empty: pd.DataFrame) -> pd.DataFrame:
    """The non-empty frames one under the other, or ``empty`` when there are none."""
    rows = [f for f in frames if len(f)]
    return pd.concat(rows, ignore_index=True) if rows else empty


def _verdicts(loaded: Loaded, writes: pd.DataFrame, warnings: list[str]) -> dict[str, VariantVerdict]:
    """Fused or fell back, per variant: the recorded ones first, then any only the traces (or
    the SGLang plugin's sidecars) name; an engine's variants are judged by the plugin's counts."""
    variants: dict[str, VariantVerdict] = {}
    plugin = plugin_paths(loaded.sidecars)
    named = set(writes["variant"].dropna().astype(str)) | {n for n, p in plugin.items() if p.paths}
    names = list(loaded.variants) + sorted(named - set(loaded.variants))
    for name in names:
        recorded = loaded.variants.get(name)
        if recorded is not None and not recorded.available:
            variants[name] = VariantVerdict(available=False, reason=recorded.reason)
            continue
        meta = next((t.kvprof for t in loaded.traces if t.kvprof and t.kvprof.variant == name), None)
        vw = writes[writes["variant"] == name]
        verdict, verdict_warnings = fused_or_fell_back(name, meta, recorded, vw, plugin.get(name))
        warnings.extend(verdict_warnings)
        verdict.sources = [str(x) for x in sorted(vw["source"].dropna().astype(str).unique())]
        if recorded is not None:
            verdict.interpreted = recorded.interpreted
        variants[name] = verdict
    return variants


def _comparison(groups: pd.DataFrame, variants: dict[str, VariantVerdict], baseline: str | None,
                bench: Benchmark | None, layers: int | None, sources: list[str],
                warnings: list[str]) -> dict[str, Any] | None:
    """Every variant against the baseline (the given one, else the default when measured)."""
    present = set(groups["variant"].astype(str)) if len(groups) else set()
    base = baseline or (DEFAULT_BASELINE if DEFAULT_BASELINE in present else None)
    if base and len(present) > 1:
        fused = [n for n, v in variants.items() if v.fused]
        comparison = compare_groups(groups, base, bench, layers, prefer=fused, source_order=sources)
        warnings.extend(comparison.pop("warnings"))
        return comparison
    if baseline and baseline not in present:
        warnings.append(f"baseline {baseline!r} has no measured writes; no comparison")
    return None


def analyze(loaded: Loaded, baseline: str | None = None, bench: Benchmark | None = None,
            layers: int | None = None) -> Analysis:
    warnings = list(loaded.warnings)
    world_size = loaded.manifest.world_size if loaded.manifest is not None else None
    tables = _read_traces(loaded, _bytes_per_token(loaded), multi_rank=world_size is not None)
    warnings.extend(tables.warnings)
    writes = _stacked(tables.writes, pd.DataFrame(columns=list(WRITE_COLUMNS)))
    steps = _stacked(tables.steps, pd.DataFrame())
    groups = group_metrics(writes, steps)
    ref_groups = reference_groups(loaded.timings, loaded.manifest.layout if loaded.manifest is not None else None)
    if len(ref_groups):
        groups = pd.concat([groups, ref_groups], ignore_index=True) if len(groups) else ref_groups
    observer = observer_effect(groups, loaded.timings)
    warnings.extend(observer_notes(observer))
    for name, entry in loaded.variants.items():
        if entry.reference_error:
            warnings.append(f"{name}: no reference figures (the unprofiled pass failed: {entry.reference_error})")
    sources = trusted_sources(sorted(set(groups["source"].dropna().astype(str))) if len(groups) else [], observer)
    layer_groups = group_metrics(writes, steps, by_layer=True)
    variants = _verdicts(loaded, writes, warnings)
    for sc in loaded.sidecars:  # a shadow check that found a wrong row is a warning of its own
        wrong, lines = shadow_lines(sc)
        if wrong:
            warnings.append(lines[0])
        warnings.extend(canary_lines(sc)[:1])  # and SGLang's own canary that reported a violation
    pdl = {name: v.pdl_launch for name, v in variants.items()}
    for table in (groups, layer_groups):
        if len(table):
            table["pdl_launch"] = [pdl.get(str(v)) for v in table["variant"]]
    warnings.extend(early_start_notes(measured(writes), pdl))
    comparison = _comparison(groups, variants, baseline, bench, layers, sources, warnings)
    summary = Summary(
        schema=SUMMARY_SCHEMA, kvprof_version=__version__, input=str(loaded.input), input_kind=loaded.kind,
        device=clean(_device(loaded)), traces=clean(tables.docs),
        variants={n: VariantVerdict.from_json(clean(v.to_json())) for n, v in variants.items()},
        groups=clean(groups.to_dict(orient="records")), layers=clean(layer_groups.to_dict(orient="records")),
        comparison=clean(comparison), observer=clean(observer), trusted_sources=clean(sources),
        reference=clean(_reference_doc(loaded)), warnings=list(dict.fromkeys(warnings)),
    )
    steps_doc = layer_steps(loaded.timings, tables.boundaries, sources)
    if steps_doc is not None:
        summary.layer_steps = clean(steps_doc.to_json())
    if world_size is not None and loaded.manifest is not None:
        ranks = analyze_ranks(writes, steps, tables.rank_inputs, loaded.manifest.ranks, world_size)
        summary.ranks = ranks.to_json()
        summary.warnings += [f"{v}: the ranks took different write paths" for v, same in ranks.same_path.items()
                             if not same]
    return Analysis(writes=writes, steps=steps, groups=groups, layers=layer_groups, summary=summary,
                    warnings=summary.warnings)
