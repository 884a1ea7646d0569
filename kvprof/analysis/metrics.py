"""Per-variant and per-(phase, size[, layer]) numbers from the per-write and per-step tables.

Medians, because a handful of first-replay or allocator outliers in a short capture
should not move the headline; min/max of the kernel count, because one write with a
different count is itself a finding. ``cost_per_write_ns`` is what a write costs the
step, the figure the reference pass measures too: with writes back to back, the step's
GPU span divided by its writes (launch gaps included: what an inter-token latency pays);
inside a decoder layer, what each write adds to the GPU timeline (``gpu_new_ns``); where
a trace has no step ranges, ``gpu_new_ns`` for replays (a write launched with PDL starts
during the previous one and waits, and its span would count the wait) and the write's
GPU span for eager writes. Also the fused-or-fell-back verdict, from the writer's own
report (paths) and from the kernel count, which must agree.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvprof.core import variants
from kvprof.core.run import TraceMeta, VariantEntry
from kvprof.core.sidecar import PluginPaths
from kvprof.core.summary import VariantVerdict
from kvprof.core.vocab import COMPILED, FALLBACK_PREFIX, FUSED, ROPE_FUSED

GROUP_KEYS = ("variant", "source", "phase", "size")
GROUP_COLUMNS = (
    *GROUP_KEYS, "layer", "context", "layout", "writes", "steps", "graph", "attribution", "kernels_per_write",
    "kernels_per_write_min", "kernels_per_write_max", "gpu_busy_ns", "gpu_span_ns", "gpu_new_ns", "cost_per_write_ns",
    "host_launch_ns", "launch_delay_ns", "streams", "overlap_frac", "idle_ns", "gaps", "gap_before_ns",
    "same_stream_early", "same_stream_early_ns", "same_stream_early_max_ns", "pdl_launch", "bandwidth_gbs",
    "pct_of_peak", "step_ns", "step_gpu_ns", "step_iqr_ns", "write_share", "writes_only_step_ns", "tokens",
)


def _median(s: pd.Series) -> float:
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.median()) if len(s) else float("nan")


def measured(writes: pd.DataFrame) -> pd.DataFrame:
    """Writes that are measurements: inside a step, not graph-capture templates."""
    if writes.empty:
        return writes
    return writes[(~writes["during_capture"].astype(bool)) & (writes["step"] >= 0)]


def _iqr(s: pd.Series) -> float:
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.quantile(0.75) - s.quantile(0.25)) if len(s) >= 4 else float("nan")


MEDIAN_COLUMNS = ("gpu_ops", "gpu_busy_ns", "gpu_span_ns", "gpu_new_ns", "host_dur_ns", "launch_delay_ns",
                  "overlap_frac", "idle_ns", "gaps", "gap_before_ns", "bandwidth_gbs", "pct_of_peak", "tokens")
# per write, not a median: the group counts the writes where it is > 0 and takes the median and max over those
EARLY_COLUMN = "same_stream_early_ns"


def _numeric(writes: pd.DataFrame) -> dict[str, np.ndarray]:
    """The median columns as float arrays (NaN for missing or non-numeric; tokens < 0: NaN),
    converted once for all groups: per-group pandas calls cost more than the medians."""
    out = {}
    for c in (*MEDIAN_COLUMNS, EARLY_COLUMN):
        if c in writes:
            a = pd.to_numeric(writes[c], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        else:
            a = np.full(len(writes), np.nan)
        out[c] = a
    out["tokens"] = np.where(out["tokens"] >= 0, out["tokens"], np.nan)
    return out


def _nanmedian(a: np.ndarray) -> float:
    a = a[~np.isnan(a)]
    return float(np.median(a)) if len(a) else float("nan")


def _early_starts(early_ns: np.ndarray) -> dict[str, Any]:
    """The writes that began before the work before them on their own stream ended
    (``kvprof.analysis.early_start``: PDL overlap where the writer launches with PDL), and how
    early, median and max over those writes; ``gap_before_ns`` counts them as 0, never negative."""
    early = early_ns[early_ns > 0]  # NaN > 0 is False
    return {"same_stream_early": int(len(early)),
            "same_stream_early_ns": float(np.median(early)) if len(early) else float("nan"),
            "same_stream_early_max_ns": float(early.max()) if len(early) else float("nan")}


def _one_value(s: pd.Series) -> str | None:
    """The group's one value of a per-trace column (several joined by '+'; None when unknown)."""
    vals = sorted(str(v) for v in s.dropna().unique())
    return "+".join(vals) if vals else None


def _aggregate(w: pd.DataFrame, steps: pd.DataFrame | None,
               cols: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """One group's row; ``cols``: the group's slices of ``_numeric`` (computed here without)."""
    cols = cols if cols is not None else _numeric(w)
    graph = bool(w["graph"].any())
    layer = "context" in w and (w["context"].astype(str) == "layer").any()
    kpw = w["gpu_ops"]
    med = {c: _nanmedian(cols[c]) for c in MEDIAN_COLUMNS}
    row: dict[str, Any] = {
        "writes": int(len(w)),
        "steps": int(w[["trace", "step"]].drop_duplicates().shape[0]),
        "graph": graph,
        "attribution": "+".join(sorted(w["attribution"].dropna().astype(str).unique())),
        "kernels_per_write": med["gpu_ops"],
        "kernels_per_write_min": int(kpw.min()) if len(kpw) else None,
        "kernels_per_write_max": int(kpw.max()) if len(kpw) else None,
        "gpu_busy_ns": med["gpu_busy_ns"],
        "gpu_span_ns": med["gpu_span_ns"],
        "gpu_new_ns": med["gpu_new_ns"],
        "host_launch_ns": med["host_dur_ns"],
        "launch_delay_ns": med["launch_delay_ns"],
        "streams": int(w["streams"].max()) if len(w) else 0,
        "overlap_frac": med["overlap_frac"],
        "idle_ns": med["idle_ns"],
        "gaps": med["gaps"],
        "gap_before_ns": med["gap_before_ns"],
        **_early_starts(cols[EARLY_COLUMN]),
        "pdl_launch": None,  # the writer's record (kvprof.analysis.summary fills it in)
        "bandwidth_gbs": med["bandwidth_gbs"],
        "pct_of_peak": med["pct_of_peak"],
        "tokens": med["tokens"],
        "step_ns": float("nan"),
        "step_gpu_ns": float("nan"),
        "step_iqr_ns": float("nan"),
        "write_share": float("nan"),
        "writes_only_step_ns": float("nan"),
        "context": "layer" if layer else "none",
        "layout": _one_value(w["layout"]) if "layout" in w else None,
    }
    # replays without step ranges (nsys): the time each write adds to the GPU timeline, so that
    # writes launched with PDL (which start during the previous write and wait) are not charged
    # their wait
    new_or_span = graph or layer
    use_new = new_or_span and np.isfinite(row["gpu_new_ns"])
    row["cost_per_write_ns"] = row["gpu_new_ns"] if use_new else row["gpu_span_ns"]
    if steps is not None and len(steps):
        row["step_ns"] = _median(steps["dur_ns"])
        row["step_gpu_ns"] = _median(steps["gpu_span_ns"])
        row["step_iqr_ns"] = _iqr(steps["gpu_span_ns"])
        per = steps["gpu_span_ns"] / steps["writes"].where(steps["writes"] > 0)
        if not layer and np.isfinite(_median(per)):
            row["cost_per_write_ns"] = _median(per)
    return row


def group_metrics(writes: pd.DataFrame, steps: pd.DataFrame, by_layer: bool = False) -> pd.DataFrame:
    """One row per (variant, source, phase, size) -- and layer when ``by_layer``."""
    w = measured(writes)
    if w.empty:
        return pd.DataFrame(columns=list(GROUP_COLUMNS))
    keys = [*GROUP_KEYS, "layer"] if by_layer else list(GROUP_KEYS)
    rows = []
    w = w.reset_index(drop=True)  # group positions below are row numbers
    cols = _numeric(w)
    for key, grp in w.groupby(keys, sort=True, observed=True, dropna=True):
        k = dict(zip(keys, key if isinstance(key, tuple) else (key,)))
        pos = grp.index.to_numpy()
        st = None
        if steps is not None and len(steps) and not by_layer:
            st = steps[(steps["variant"] == k["variant"]) & (steps["source"] == k["source"])
                       & (steps["phase"] == k["phase"]) & (steps["size"] == k["size"])]
        row = {**k, **_aggregate(grp, st, {c: a[pos] for c, a in cols.items()})}
        row.setdefault("layer", "all")
        rows.append(row)
    out = pd.DataFrame(rows)
    for c in GROUP_COLUMNS:
        if c not in out.columns:
            out[c] = np.nan
    return out[list(GROUP_COLUMNS)]


def paths_verdict(paths: dict[str, int] | None) -> tuple[bool | None, list[str]]:
    """(fused?, fallback reasons) from the writer's reported paths; None when it reported nothing decisive."""
    if not paths:
        return None, []
    names = [p for p, c in paths.items() if c]
    fallbacks = [p[len(FALLBACK_PREFIX):].strip() for p in names if p.startswith(FALLBACK_PREFIX)]
    if fallbacks or any(p not in (FUSED, ROPE_FUSED, COMPILED) for p in names):
        return False, fallbacks
    if all(p in (FUSED, ROPE_FUSED) for p in names):  # a write fused into the rotary kernel is one launch too
        return True, []
    return None, []  # COMPILED alone: the kernel count decides


def kernels_verdict(writes: pd.DataFrame, rope_kernels: int = 0,
                    stepless: bool = False) -> tuple[bool | None, dict[str, Any]]:
    """(fused?, detail) from GPU activities per measured write: fused means exactly one each,
    besides ``rope_kernels`` launches of a rotary kernel before the store (a rope + store
    variant that runs them separately: its store is judged, the rotation is not a copy).
    ``stepless``: every write that is not a graph-capture template counts (an engine's
    writes, which no kvprof step encloses)."""
    if stepless and len(writes):
        w = writes[~writes["during_capture"].astype(bool)]
    else:
        w = measured(writes)
    w = w[w["gpu_ops"] > 0] if len(w) else w
    if w.empty:
        return None, {"writes_with_gpu_work": 0}
    counts = w["gpu_ops"].value_counts().sort_index()
    detail: dict[str, Any] = {"writes_with_gpu_work": int(len(w)),
                              "gpu_ops_per_write": {int(k): int(v) for k, v in counts.items()}}
    if rope_kernels:
        detail["rope_kernels_per_write"] = rope_kernels
    if (w["gpu_ops"] == 1 + rope_kernels).all():
        return True, detail
    return False, detail


def rope_kind(meta: TraceMeta | None, manifest_entry: VariantEntry | None) -> str | None:
    """"fused" (rope and the store in one launch), "separate" (a rotary kernel, then the
    store) or None (a store-only write), as the capture recorded the writer."""
    for extra in ((meta.extra if meta else {}), (manifest_entry.extra if manifest_entry else {})):
        if extra.get("rope") in ("fused", "separate"):
            return str(extra["rope"])
    return None


def pdl_launch(meta: TraceMeta | None, manifest_entry: VariantEntry | None) -> bool | None:
    """Whether the variant's writes launch with programmatic dependent launch, as the capture
    recorded the writer (``Writer.launches_pdl``): the run's manifest first, then the trace's
    own metadata; None where neither says (a library's kernel, a run from before the record)."""
    if manifest_entry is not None and manifest_entry.pdl_launch is not None:
        return manifest_entry.pdl_launch
    v = (meta.extra if meta else {}).get("pdl_launch")
    return v if isinstance(v, bool) else None


def fused_or_fell_back(variant: str, meta: TraceMeta | None, manifest_entry: VariantEntry | None,
                       writes: pd.DataFrame,
                       plugin: PluginPaths | None = None) -> tuple[VariantVerdict, list[str]]:
    """Did the variant run fused, or fall back? Both witnesses, whether they agree, and warnings.

    ``plugin``: the variant's paths as the SGLang plugin counted them (its sidecars), the
    paths witness of an engine's writes where no kvprof capture recorded any."""
    paths = (meta.paths if meta else {}) or (manifest_entry.paths if manifest_entry else {}) or {}
    claim = meta.fused if meta is not None and meta.fused is not None else (
        manifest_entry.fused_claim if manifest_entry else None)
    rope = rope_kind(meta, manifest_entry)
    source = None
    if not paths and plugin is not None and meta is None and manifest_entry is None:
        paths, source = dict(plugin.paths), plugin.source
        info = variants.info(variant)
        claim = True if info.claims_fused else None
        rope = info.rope or ("fused" if ROPE_FUSED in paths else None)
    by_paths, reasons = paths_verdict(paths)
    by_kernels, detail = kernels_verdict(writes, rope_kernels=1 if rope == "separate" else 0,
                                         stepless=source is not None)
    warnings: list[str] = []
    agree: bool | None = None
    if by_paths is not None and by_kernels is not None:
        agree = by_paths == by_kernels
        if not agree:
            per = ", ".join(f"{n} per write x{c}" for n, c in detail["gpu_ops_per_write"].items())
            warnings.append(
                f"{variant}: {source + ' counted' if source else 'the writer reported'} "
                f"{'fused' if by_paths else 'not fused'} paths {paths} but the trace shows {per} GPU activities")
    if claim and by_kernels is False and by_paths is None:
        warnings.append(f"{variant}: claims to be fused but its writes launch more than one GPU activity")
    fused = by_kernels if by_kernels is not None else by_paths
    return VariantVerdict(
        available=True, fused_claim=claim, paths=dict(paths), fused_by_paths=by_paths,
        fused_by_kernels=by_kernels, agree=agree, fused=fused,
        fell_back=bool(reasons) or (bool(claim) and fused is False), fallback_reasons=reasons,
        kernel_counts=detail, rope=rope, pdl_launch=pdl_launch(meta, manifest_entry),
        paths_source=source), warnings
