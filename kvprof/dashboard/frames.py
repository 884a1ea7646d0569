"""Pure DataFrame shaping for the pages: select, join, rename and convert units.

No I/O and no Streamlit, so every function is testable on its own. Nothing here is a
metric: numbers come from analyze's summary.json / writes.parquet / events.parquet, and
ratios and projections from kvprof.analysis.compare.compare_groups. What is done here is
unit conversion (ns -> µs), filtering, and laying rows out for a chart (binning kernels
on the timeline so the browser never gets more bars than it can draw).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvprof.analysis.compare import Benchmark, compare_groups
from kvprof.analysis.figures import MEASURED, NOT_APPLICABLE, classify
from kvprof.analysis.metrics import GROUP_COLUMNS, measured
from kvprof.core.sources import TRUST_ORDER, source_names
from kvprof.core.summary import VariantVerdict
from kvprof.core.timings import SourceTiming, source_timing

NS_PER_US = 1e3
WRITES_LANE = "kvprof writes (GPU)"
HOST_LANE = "kvprof writes (host)"
NOT_IN_WRITE = "not in a write"

# Per-write metrics of writes.parquet a distribution can show: label -> (column, scale to the unit shown)
DIST_METRICS: dict[str, tuple[str, float]] = {
    "GPU span per write (µs)": ("gpu_span_ns", 1 / NS_PER_US),
    "GPU busy per write (µs)": ("gpu_busy_ns", 1 / NS_PER_US),
    "launch delay, launch call to GPU start (µs)": ("launch_delay_ns", 1 / NS_PER_US),
    "idle gaps inside a write (µs)": ("idle_ns", 1 / NS_PER_US),
    "host launch per write (µs)": ("host_dur_ns", 1 / NS_PER_US),
    "stream overlap (% of GPU busy union)": ("overlap_frac", 100.0),
    "bandwidth (GB/s)": ("bandwidth_gbs", 1.0),
    "kernels per write": ("gpu_ops", 1.0),
}

# Group metrics the Overview chart can plot: label -> (column, scale)
GROUP_METRICS: dict[str, tuple[str, float]] = {
    "cost per write (µs)": ("cost_per_write_ns", 1 / NS_PER_US),
    "GPU span µs per write": ("gpu_span_ns", 1 / NS_PER_US),
    "host launch µs per write": ("host_launch_ns", 1 / NS_PER_US),
    "launch delay µs": ("launch_delay_ns", 1 / NS_PER_US),
    "kernels per write": ("kernels_per_write", 1.0),
    "bandwidth GB/s": ("bandwidth_gbs", 1.0),
    "% of peak bandwidth": ("pct_of_peak", 1.0),
}


def phase_size(phase: Any, size: Any) -> str:
    """``decode bs=8`` / ``prefill tokens=256``: the capture's own naming of a (phase, size)."""
    key = "bs" if str(phase) == "decode" else "tokens"
    try:
        size = int(size)
    except (TypeError, ValueError):
        pass
    return f"{phase} {key}={size}"


def _num(df: pd.DataFrame, col: str) -> pd.Series:
    return pd.to_numeric(df[col], errors="coerce") if col in df.columns else pd.Series(np.nan, index=df.index)


def interpreted_variants(summary: dict[str, Any] | None) -> set[str]:
    """Variants whose Triton kernel ran in Triton's interpreter (summary.json's ``interpreted``)."""
    return {str(n) for n, v in ((summary or {}).get("variants") or {}).items()
            if isinstance(v, dict) and v.get("interpreted")}


def cost_kinds(variants: Any, costs: Any, interpreted: set[str] | frozenset[str]) -> list[str]:
    """The one rule (kvprof.analysis.figures.classify) for each variant's cost, duration or rate:
    measured, interpreted (its variant ran in Triton's interpreter), negative or n/a."""
    return [classify(c, interpreted=str(v) in interpreted, cost=True).kind for v, c in zip(variants, costs)]


def pair_kind(a: str, b: str) -> str:
    """The kind of a figure derived from two (a ratio, a saving): measured only where both are;
    else the first that is not (kvprof.analysis.figures.derived reads it n/a with that why)."""
    return next((k for k in (a, b) if k != MEASURED), MEASURED)


# ---------------------------------------------------------------------------- summary.json


# Group columns that are words, not figures: ``context`` "layer" is what tells the comparison a step
# measured inside a decoder layer from a projection of the writes alone
TEXT_GROUP_COLUMNS = ("variant", "source", "phase", "layer", "context", "layout", "attribution", "graph")


def groups_frame(summary: dict[str, Any], key: str = "groups") -> pd.DataFrame:
    """summary["groups"] (or "layers") as a frame with every GROUP_COLUMNS column."""
    rows = summary.get(key) or []
    df = pd.DataFrame(rows)
    for c in GROUP_COLUMNS:
        if c not in df.columns:
            df[c] = np.nan
    df = df[list(GROUP_COLUMNS)]
    for c in GROUP_COLUMNS:
        if c not in TEXT_GROUP_COLUMNS:
            df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


def variants_in(summary: dict[str, Any], groups: pd.DataFrame | None = None) -> list[str]:
    """Variants with measured writes, in the run's own order."""
    groups = groups_frame(summary) if groups is None else groups
    present = set(groups["variant"].dropna().astype(str))
    order = [v for v in (summary.get("variants") or {}) if v in present]
    return order + sorted(present - set(order))


def sources_in(groups: pd.DataFrame, summary: dict[str, Any] | None = None) -> list[str]:
    """Sources most trusted first (the analysis' order: the unprofiled reference, then the
    least perturbed profiler), so the page opens on the figure a step really pays."""
    src = sorted(groups["source"].dropna().astype(str).unique())
    order = list((summary or {}).get("trusted_sources") or []) + list(source_names(TRUST_ORDER))
    return sorted(src, key=lambda s: (order.index(s) if s in order else len(order), s))


def timing_of(summary: dict[str, Any] | None, source: str | None) -> SourceTiming:
    """How ``source`` of the run timed its figures (its clock from summary.json's reference and traces)."""
    s = summary or {}
    traces = s.get("traces")
    return source_timing(source, s.get("reference") if isinstance(s.get("reference"), dict) else None,
                         traces if isinstance(traces, list) else None)


OBSERVER_COLUMNS = ("variant", "source", "phase", "size", "reading µs/write", "reference µs/write",
                    "reading / reference (write)", "reading / reference (step)", "profiled run / reference", "flag",
                    "reading figure", "reference figure", "ratio figure")


def observer_frame(summary: dict[str, Any]) -> pd.DataFrame:
    """Each profiler's reading against the unprofiled reference (summary.json 'observer')."""
    rows = [{
        "variant": r["variant"], "source": r["source"], "phase": r["phase"], "size": r["size"],
        "reading µs/write": _us_or_nan(r.get("cost_per_write_ns")),
        "reference µs/write": _us_or_nan(r.get("reference_cost_per_write_ns")),
        "reading / reference (write)": r.get("ratio_per_write"), "reading / reference (step)": r.get("ratio_per_step"),
        "profiled run / reference": r.get("pass_slowdown"), "flag": "off" if r.get("flagged") else "ok",
    } for r in ((summary.get("observer") or {}).get("rows") or [])]
    # the one rule: each cost's kind (a reference cost is a difference of two medians, which noise
    # can make negative), and the ratio of the two: measured only where both are
    interp = interpreted_variants(summary)
    for r in rows:
        r["reading figure"], r["reference figure"] = cost_kinds([r["variant"]] * 2, [r["reading µs/write"],
                                                                                     r["reference µs/write"]], interp)
        r["ratio figure"] = pair_kind(r["reading figure"], r["reference figure"])
    return pd.DataFrame(rows, columns=list(OBSERVER_COLUMNS))


def _us_or_nan(ns: Any) -> float:
    return float(ns) / NS_PER_US if isinstance(ns, (int, float)) else np.nan


def verdict_text(v: dict[str, Any]) -> str:
    """The console's verdict words (kvprof.report.console.verdict_line) without markup."""
    if not v.get("available", True):
        return f"not run ({v.get('reason')})"
    if v.get("fell_back"):
        reasons = "; ".join(v.get("fallback_reasons") or [])
        return "fell back" + (f" ({reasons})" if reasons else "")
    fused = v.get("fused")
    if fused and v.get("rope") == "fused":
        return "fused into rope"
    return "fused" if fused else ("not fused" if fused is False else "unknown (no GPU work)")


def _paths_said(v: dict[str, Any]) -> str:
    """The console's "paths say" words (VariantVerdict.paths_said), "-" where they say nothing."""
    said = VariantVerdict.from_json(v).paths_said()
    return "-" if said == "?" else said


def verdicts_frame(summary: dict[str, Any]) -> pd.DataFrame:
    """One row per variant of the run: fused or fell back, and both witnesses."""
    rows = []
    for name, v in (summary.get("variants") or {}).items():
        counts = (v.get("kernel_counts") or {}).get("gpu_ops_per_write") or {}
        rows.append({
            "variant": name,
            "verdict": verdict_text(v),
            "available": bool(v.get("available", True)),
            "fused": v.get("fused"),
            "fell_back": v.get("fell_back"),
            "claims fused": v.get("fused_claim"),
            "paths say": _paths_said(v),
            "kernels say": {True: "fused", False: "not fused"}.get(v.get("fused_by_kernels"), "-"),
            "witnesses agree": v.get("agree"),
            "GPU ops per write": ", ".join(f"{k} x{n}" for k, n in counts.items()) or "-",
            "writer paths": ", ".join(f"{k} x{n}" for k, n in (v.get("paths") or {}).items()) or "-",
        })
    return pd.DataFrame(rows, columns=["variant", "verdict", "available", "fused", "fell_back", "claims fused",
                                       "paths say", "kernels say", "witnesses agree", "GPU ops per write",
                                       "writer paths"])


def fused_variants(summary: dict[str, Any]) -> list[str]:
    return [n for n, v in (summary.get("variants") or {}).items() if v.get("fused")]


def comparison(groups: pd.DataFrame, baseline: str, layers: int, itl_before_ms: float, itl_after_ms: float,
               prefer: list[str] | None = None, source_order: list[str] | None = None) -> dict[str, Any]:
    """kvprof's compare_groups against a baseline chosen in the page (analyze fixed one at run time)."""
    bench = Benchmark(itl_before_ms=itl_before_ms, itl_after_ms=itl_after_ms, layers=layers)
    return compare_groups(groups, baseline, bench, layers, prefer=prefer, source_order=source_order)


OVERVIEW_COLUMNS = (
    "variant", "source", "phase", "size", "verdict", "writes", "kernels/write", "GPU µs/write", "GPU span µs",
    "host launch µs", "launch→GPU µs", "streams", "overlap %", "GB/s", "% of peak", "speed-up vs baseline",
    "saving µs/write", "saving ms/decode step", "predicted ITL ms", "figure", "ratio figure",
)
# the columns derived from a variant's own cost, and from the cost and the baseline's: n/a where
# that cost is not a measurement (kvprof.analysis.figures.derived)
OVERVIEW_OWN = ("GB/s", "% of peak")
OVERVIEW_TIMES = ("GPU span µs", "host launch µs", "launch→GPU µs")
OVERVIEW_PAIR = ("speed-up vs baseline", "saving µs/write", "saving ms/decode step", "predicted ITL ms")


def overview_frame(groups: pd.DataFrame, comp: dict[str, Any] | None, summary: dict[str, Any],
                   baseline: str | None = None) -> pd.DataFrame:
    """The Overview table: analyze's group medians in µs, the verdict, and the comparison's numbers."""
    g = groups[groups["layer"].astype(str) == "all"] if len(groups) else groups
    verdicts = {n: verdict_text(v) for n, v in (summary.get("variants") or {}).items()}
    comp_rows = {(r["variant"], r["source"], r["phase"], int(r["size"])): r for r in (comp or {}).get("rows", [])}
    interp = interpreted_variants(summary)
    kinds = dict(zip(zip(g["variant"].astype(str), g["source"].astype(str), g["phase"].astype(str),
                         _num(g, "size")), cost_kinds(g["variant"], g["cost_per_write_ns"], interp)))
    rows = []
    for r in g.itertuples(index=False):
        c = comp_rows.get((r.variant, r.source, r.phase, int(r.size)), {})
        ratio = c.get("ratio_cost_per_write_ns")
        speed = (1.0 / ratio) if ratio else (1.0 if baseline and r.variant == baseline else np.nan)
        kind = kinds.get((str(r.variant), str(r.source), str(r.phase), float(r.size)), NOT_APPLICABLE)
        base_kind = kinds.get((str(baseline), str(r.source), str(r.phase), float(r.size)), NOT_APPLICABLE) \
            if baseline else NOT_APPLICABLE
        rows.append({
            "variant": r.variant, "source": r.source, "phase": r.phase, "size": int(r.size),
            "verdict": verdicts.get(r.variant, "-"),
            "writes": r.writes, "kernels/write": r.kernels_per_write,
            "GPU µs/write": r.cost_per_write_ns / NS_PER_US, "GPU span µs": r.gpu_span_ns / NS_PER_US,
            "host launch µs": r.host_launch_ns / NS_PER_US, "launch→GPU µs": r.launch_delay_ns / NS_PER_US,
            "streams": r.streams, "overlap %": r.overlap_frac * 100.0, "GB/s": r.bandwidth_gbs,
            "% of peak": r.pct_of_peak, "speed-up vs baseline": speed,
            "saving µs/write": (c.get("saving_per_write_ns") or np.nan) / NS_PER_US if c else np.nan,
            "saving ms/decode step": c.get("saving_per_step_ms", np.nan) if c else np.nan,
            "predicted ITL ms": c.get("predicted_itl_ms", np.nan) if c else np.nan,
            "figure": kind, "ratio figure": pair_kind(kind, base_kind),
        })
    df = pd.DataFrame(rows, columns=list(OVERVIEW_COLUMNS))
    for c in OVERVIEW_COLUMNS[5:-2]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df


# group metrics derived from a write's time (not a time themselves): n/a where that time is not a
# measurement (an interpreted or negative cost)
DERIVED_METRICS = ("bandwidth_gbs", "pct_of_peak")


def group_metric_frame(groups: pd.DataFrame, metric: str, interpreted: set[str] | frozenset[str] = frozenset()
                       ) -> pd.DataFrame:
    """variant, phase·size, value of one GROUP_METRICS entry (layer "all" rows), and ``figure``: what
    the value can be taken for (kvprof.analysis.figures): a time of an ``interpreted`` variant is
    the interpreter's, a negative time noise; a rate derived from either is n/a."""
    col, scale = GROUP_METRICS[metric]
    g = groups[groups["layer"].astype(str) == "all"] if len(groups) else groups
    out = pd.DataFrame({
        "variant": g["variant"].astype(str), "source": g["source"].astype(str), "phase": g["phase"].astype(str),
        "phase_size": [phase_size(p, s) for p, s in zip(g["phase"], g["size"])],
        "size": _num(g, "size"), "value": _num(g, col) * scale,
    })
    if col == "kernels_per_write":  # a count, not a time
        out["figure"] = [MEASURED] * len(out)
    elif col in DERIVED_METRICS:
        base = cost_kinds(g["variant"], _num(g, "cost_per_write_ns"), interpreted)
        out["figure"] = [b if b != MEASURED else classify(v, cost=True).kind for b, v in zip(base, out["value"])]
    else:
        out["figure"] = cost_kinds(out["variant"], out["value"], interpreted)
    return out.dropna(subset=["value"]).sort_values(["size", "variant"]).reset_index(drop=True)


# ---------------------------------------------------------------------------- writes.parquet


def measured_writes(writes: pd.DataFrame, variants: list[str] | None = None, source: str | None = None) -> pd.DataFrame:
    """analyze's own notion of a measurement (kvprof.analysis.metrics.measured), then filtered."""
    w = measured(writes) if len(writes) else writes
    if variants is not None and len(w):
        w = w[w["variant"].astype(str).isin(variants)]
    if source and len(w):
        w = w[w["source"].astype(str) == source]
    return w


def dist_frame(writes: pd.DataFrame, metric: str, variants: list[str] | None = None,
               source: str | None = None) -> pd.DataFrame:
    """One row per measured write: variant, phase·size, layer, and the metric in the unit shown."""
    col, scale = DIST_METRICS[metric]
    w = measured_writes(writes, variants, source)
    out = pd.DataFrame({
        "variant": w["variant"].astype(str), "phase": w["phase"].astype(str),
        "phase_size": [phase_size(p, s) for p, s in zip(w["phase"], w["size"])], "size": _num(w, "size"),
        "layer": _num(w, "layer"), "step": _num(w, "step"),
        "trace": w["trace"].astype(str), "write_id": _num(w, "write_id"), "value": _num(w, col) * scale,
    })
    return out.dropna(subset=["value"]).sort_values(["size", "variant", "layer"]).reset_index(drop=True)


def multi_stream_variants(writes: pd.DataFrame) -> list[str]:
    """Variants whose measured writes use two streams or more (the two-stream K/V copy)."""
    w = measured_writes(writes)
    if w.empty:
        return []
    s = w.groupby(w["variant"].astype(str))["streams"].max()
    return sorted(s[s >= 2].index)


OVERLAP_COLUMNS = ("trace", "source", "write_id", "order", "phase_size", "step", "layer", "streams", "kernels",
                   "overlap_us", "union_us", "busy_us", "span_us", "overlap_pct", "kernel_names")


def overlap_frame(writes: pd.DataFrame, variant: str, source: str | None = None) -> pd.DataFrame:
    """Write by write: analyze's overlap_ns / overlap_frac of one variant, in µs and %."""
    w = measured_writes(writes, [variant], source)
    w = w[_num(w, "gpu_ops") > 0].sort_values(["trace", "gpu_start_ns"])
    out = pd.DataFrame({
        "trace": w["trace"].astype(str), "source": w["source"].astype(str), "write_id": _num(w, "write_id"),
        "order": w.groupby(w["trace"].astype(str)).cumcount().to_numpy() if len(w) else [],
        "phase_size": [phase_size(p, s) for p, s in zip(w["phase"], w["size"])],
        "step": _num(w, "step"), "layer": _num(w, "layer"), "streams": _num(w, "streams"),
        "kernels": _num(w, "gpu_ops"), "overlap_us": _num(w, "overlap_ns") / NS_PER_US,
        "union_us": _num(w, "gpu_union_ns") / NS_PER_US, "busy_us": _num(w, "gpu_busy_ns") / NS_PER_US,
        "span_us": _num(w, "gpu_span_ns") / NS_PER_US, "overlap_pct": _num(w, "overlap_frac") * 100.0,
        "kernel_names": w["kernel_names"].astype(str) if "kernel_names" in w else "",
    })
    return out.reset_index(drop=True)[list(OVERLAP_COLUMNS)]


# ---------------------------------------------------------------------------- timeline


TIMELINE_COLUMNS = ("lane", "start_us", "dur_us", "name", "variant", "kind", "grid", "block", "count", "busy_us",
                    "detail")


def trace_origin_ns(kernels: pd.DataFrame, writes: pd.DataFrame) -> float:
    """0 µs on the axis: the earliest GPU activity or write range of the trace."""
    cands = [_num(kernels, "start_ns").min() if len(kernels) else np.nan]
    if len(writes):
        cands += [_num(writes, "gpu_start_ns").min(), _num(writes, "host_start_ns").min()]
    vals = [c for c in cands if c is not None and np.isfinite(c)]
    return float(min(vals)) if vals else 0.0


def trace_end_us(kernels: pd.DataFrame, writes: pd.DataFrame, origin_ns: float) -> float:
    ends = [(_num(kernels, "start_ns") + _num(kernels, "dur_ns")).max() if len(kernels) else np.nan]
    if len(writes):
        ends += [_num(writes, "gpu_end_ns").max(), (_num(writes, "host_start_ns") + _num(writes, "host_dur_ns")).max()]
    vals = [e for e in ends if e is not None and np.isfinite(e)]
    return max(0.0, (max(vals) - origin_ns) / NS_PER_US) if vals else 0.0


def lane_rows(kernels: pd.DataFrame, writes: pd.DataFrame, origin_ns: float) -> pd.DataFrame:
    """Every bar the timeline could draw, in µs from the origin: kernels by stream, writes on their lanes."""
    parts = []
    if len(kernels):
        k = kernels
        in_write = k["write_id"] >= 0
        variant = k["variant"].astype(object).where(in_write, NOT_IN_WRITE) if "variant" in k else NOT_IN_WRITE
        parts.append(pd.DataFrame({
            "lane": "GPU" + k["device"].astype(str) + " · stream " + k["stream"].astype(str),
            "start_us": (k["start_ns"].to_numpy(dtype=float) - origin_ns) / NS_PER_US,
            "dur_us": k["dur_ns"].to_numpy(dtype=float) / NS_PER_US,
            "name": k["name"].astype(str),
            "variant": pd.Series(variant, index=k.index).fillna(NOT_IN_WRITE).astype(str),
            "kind": k["kind"].astype(str),
            "grid": k["grid"].astype(str) if "grid" in k else "",
            "block": k["block"].astype(str) if "block" in k else "",
            "count": 1, "busy_us": k["dur_ns"].to_numpy(dtype=float) / NS_PER_US,
            "detail": ("write " + k["write_id"].astype(str) + " L" + k["layer"].astype(str)).where(in_write, ""),
        }))
    if len(writes):
        w = writes
        label = ("write " + w["write_id"].astype(str) + " · " + w["variant"].astype(str) + " L" + w["layer"].astype(str)
                 + " · " + [phase_size(p, s) for p, s in zip(w["phase"], w["size"])] + " #" + w["step"].astype(str))
        g = w[_num(w, "gpu_start_ns").notna()]
        if len(g):
            parts.append(pd.DataFrame({
                "lane": WRITES_LANE, "start_us": (_num(g, "gpu_start_ns") - origin_ns) / NS_PER_US,
                "dur_us": _num(g, "gpu_span_ns") / NS_PER_US, "name": label[g.index],
                "variant": g["variant"].astype(str),
                "kind": "write", "grid": "", "block": "", "count": 1, "busy_us": _num(g, "gpu_busy_ns") / NS_PER_US,
                "detail": g["kernel_names"].astype(str) if "kernel_names" in g else "",
            }))
        h = w[_num(w, "host_start_ns").notna() & _num(w, "host_dur_ns").notna()]
        if len(h):
            parts.append(pd.DataFrame({
                "lane": HOST_LANE, "start_us": (_num(h, "host_start_ns") - origin_ns) / NS_PER_US,
                "dur_us": _num(h, "host_dur_ns") / NS_PER_US, "name": label[h.index],
                "variant": h["variant"].astype(str),
                "kind": "write (host)", "grid": "", "block": "", "count": 1,
                "busy_us": _num(h, "host_dur_ns") / NS_PER_US,
                "detail": "",
            }))
    if not parts:
        return pd.DataFrame(columns=list(TIMELINE_COLUMNS))
    return pd.concat(parts, ignore_index=True)[list(TIMELINE_COLUMNS)]


def window(rows: pd.DataFrame, start_us: float, end_us: float, max_bars: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Bars inside [start, end], binned per lane when there are more than ``max_bars``.

    A bin merges the activities of one lane that start in the same slice of time into one
    bar from the first start to the last end, with their count and busy time: what a
    screen could show anyway, at a bounded cost past 100k kernels.
    """
    ends = rows["start_us"] + rows["dur_us"]
    inside = rows[(ends >= start_us) & (rows["start_us"] <= end_us)]
    info: dict[str, Any] = {"total": int(len(rows)), "in_window": int(len(inside)), "binned": False, "bin_us": None}
    if len(inside) <= max_bars:
        info["bars"] = int(len(inside))
        return inside.reset_index(drop=True), info
    lanes = max(1, inside["lane"].nunique())
    per_lane = max(1, max_bars // lanes)
    width = max((end_us - start_us) / per_lane, 1e-6)
    b = inside.assign(_bin=np.floor((inside["start_us"] - start_us) / width).astype(np.int64),
                      _end=inside["start_us"] + inside["dur_us"])
    agg = b.groupby(["lane", "_bin"], sort=True).agg(
        start_us=("start_us", "min"), _end=("_end", "max"), count=("count", "sum"), busy_us=("busy_us", "sum"),
        name=("name", "first"), variant=("variant", "first"), kind=("kind", "first"), n_names=("name", "nunique"),
        grid=("grid", "first"), block=("block", "first"), detail=("detail", "first"))
    agg = agg.reset_index()
    many = agg["count"] > 1
    agg["dur_us"] = agg["_end"] - agg["start_us"]
    agg["detail"] = np.where(many, agg["count"].astype(str) + " activities merged (" + agg["n_names"].astype(str)
                             + " names), first: " + agg["name"].astype(str), agg["detail"].astype(str))
    agg["name"] = np.where(many, agg["count"].astype(str) + " activities", agg["name"])
    agg["kind"] = np.where(many, "binned", agg["kind"])
    info.update(binned=True, bin_us=width, bars=int(len(agg)))
    return agg[list(TIMELINE_COLUMNS)], info


# ---------------------------------------------------------------------------- sweeps


def sweep_from_groups(groups: pd.DataFrame, variants: list[str] | None = None,
                      source: str | None = None, interpreted: set[str] | frozenset[str] = frozenset()
                      ) -> pd.DataFrame:
    """analyze's per-(phase, size) medians against tokens per write, for the log-log sweep; ``figure``
    what each can be taken for (an ``interpreted`` variant's is the interpreter's time)."""
    g = groups[groups["layer"].astype(str) == "all"] if len(groups) else groups
    if variants is not None:
        g = g[g["variant"].astype(str).isin(variants)]
    if source:
        g = g[g["source"].astype(str) == source]
    out = pd.DataFrame({
        "variant": g["variant"].astype(str), "phase": g["phase"].astype(str), "size": _num(g, "size"),
        "tokens": _num(g, "tokens"), "us_per_write": _num(g, "cost_per_write_ns") / NS_PER_US,
        "gpu_span_us": _num(g, "gpu_span_ns") / NS_PER_US, "bandwidth_gbs": _num(g, "bandwidth_gbs"),
        "writes": _num(g, "writes"),
    })
    out["tokens"] = out["tokens"].fillna(out["size"])
    out["figure"] = cost_kinds(out["variant"], out["us_per_write"], interpreted)
    return out.dropna(subset=["us_per_write"]).sort_values(["variant", "phase", "tokens"]).reset_index(drop=True)


def floor_lines(pairs: pd.DataFrame, rates: dict[str, float | None]) -> pd.DataFrame:
    """Reference lines: the time the write's bytes take at a given rate (bytes / rate), per tokens.

    ``pairs``: tokens and bytes per write (analyze's ``bytes`` of writes.parquet, or a
    bench record's); ``rates``: line label -> GB/s (device peak, measured copy rate).
    """
    rows = []
    p = pairs.dropna(subset=["tokens", "bytes"]).drop_duplicates(["tokens", "bytes"]).sort_values("tokens")
    for label, rate in rates.items():
        if not rate or not np.isfinite(rate) or rate <= 0:
            continue
        for t, b in zip(p["tokens"], p["bytes"]):
            rows.append({"line": label, "tokens": float(t), "us": float(b) / (rate * NS_PER_US)})
    df = pd.DataFrame(rows, columns=["line", "tokens", "us"])
    return df.groupby(["line", "tokens"], as_index=False)["us"].min() if len(df) else df


def write_bytes(writes: pd.DataFrame) -> pd.DataFrame:
    """tokens and bytes per measured write (bytes = bytes_per_token x tokens, from analyze)."""
    w = measured_writes(writes)
    return pd.DataFrame({"tokens": _num(w, "tokens").where(_num(w, "tokens") > 0), "bytes": _num(w, "bytes")})


BENCH_COLUMNS = ("file", "shape", "dtype", "tokens", "variant", "mode", "status", "median_us", "iqr_us", "bytes",
                 "gbs", "pct_copy_rate", "target_us", "meets_target", "floor_us", "reason")


def bench_frame(docs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Records of kvprof bench outputs, one row per (point, variant, mode), labelled with their file."""
    rows = []
    for label, doc in docs.items():
        for r in doc.get("records") or []:
            if isinstance(r, dict):
                rows.append({c: r.get(c) for c in BENCH_COLUMNS} | {"file": label})
    df = pd.DataFrame(rows, columns=list(BENCH_COLUMNS))
    for c in ("tokens", "median_us", "iqr_us", "bytes", "gbs", "pct_copy_rate", "target_us", "floor_us"):
        df[c] = pd.to_numeric(df[c], errors="coerce")
    # what each median can be taken for: a variant bench ran in Triton's interpreter (its
    # settings' ``interpreted``) timed the interpreter
    interp = {lab: {str(v) for v in ((doc.get("settings") or {}).get("interpreted") or [])}
              for lab, doc in docs.items()}
    df["figure"] = [classify(m, interpreted=str(v) in interp.get(str(f), set()), cost=True).kind
                    for f, v, m in zip(df["file"], df["variant"], df["median_us"])]
    return df


def bench_limits(docs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    rows = [{"file": label, "device": (doc.get("device") or {}).get("name"), **(doc.get("limits") or {})}
            for label, doc in docs.items()]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------- compare runs


COMPARE_COLUMNS = ("variant", "source", "phase", "size", "only in", "before µs/write", "after µs/write",
                   "ratio after/before", "speed-up", "saving µs/write", "saving ms/decode step", "ratio GPU span",
                   "ratio GPU busy", "ratio host launch", "ratio kernels/write", "ratio step GPU", "before figure",
                   "after figure", "ratio figure")
# the compare table's columns derived from both runs' costs: n/a where either is not a measurement
COMPARE_PAIR = ("ratio after/before", "speed-up", "saving µs/write", "saving ms/decode step", "ratio GPU span",
                "ratio GPU busy", "ratio host launch", "ratio step GPU")


def compare_runs(before: pd.DataFrame, after: pd.DataFrame, pairs: list[tuple[str, str]], layers: int,
                 itl_before_ms: float, itl_after_ms: float, interpreted: tuple[set[str], set[str]] = (set(), set())
                 ) -> tuple[pd.DataFrame, list[str]]:
    """kvprof.analysis.runs.compare_runs as the page's table (COMPARE_COLUMNS; "only in": the run a row
    was measured in, when only one was), and why a pair is empty. ``interpreted``: the variants each
    run ran in Triton's interpreter; ``before figure``/``after figure`` say what each cost can be
    taken for, ``ratio figure`` what the ratios and savings from both can (kvprof.analysis.figures)."""
    from kvprof.analysis.runs import compare_runs as compare_two_runs

    bench = Benchmark(itl_before_ms=itl_before_ms, itl_after_ms=itl_after_ms, layers=layers)
    result = compare_two_runs(before, after, pairs, bench, layers)
    rows = []
    for r in result.rows:
        ratio = r.get("ratio_cost_per_write_ns")
        saving = r.get("saving_per_write_ns")
        rows.append({
            "variant": r["variant"], "source": r["source"], "phase": r["phase"], "size": r["size"],
            "only in": r.get("only_in") or "both",
            "before µs/write": (r.get("before_cost_per_write_ns") or np.nan) / NS_PER_US,
            "after µs/write": (r.get("after_cost_per_write_ns") or np.nan) / NS_PER_US,
            "ratio after/before": ratio, "speed-up": (1.0 / ratio) if ratio else np.nan,
            "saving µs/write": (saving if saving is not None else np.nan) / NS_PER_US,
            "saving ms/decode step": r.get("saving_per_step_ms", np.nan),
            "ratio GPU span": r.get("ratio_gpu_span_ns"), "ratio GPU busy": r.get("ratio_gpu_busy_ns"),
            "ratio host launch": r.get("ratio_host_launch_ns"),
            "ratio kernels/write": r.get("ratio_kernels_per_write"), "ratio step GPU": r.get("ratio_step_gpu_ns"),
        })
        b_kind, a_kind = (classify(rows[-1][f"{side} µs/write"], interpreted=str(r.get(side, r["variant"])) in names,
                                   cost=True).kind for side, names in zip(("before", "after"), interpreted))
        rows[-1].update({"before figure": b_kind, "after figure": a_kind, "ratio figure": pair_kind(b_kind, a_kind)})
    df = pd.DataFrame(rows, columns=list(COMPARE_COLUMNS))
    for c in COMPARE_COLUMNS[5:-3]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    return df, result.empty
