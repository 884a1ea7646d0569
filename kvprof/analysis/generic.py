"""What any trace gets, kvprof-made or not: kernels by name, streams, overlap, gaps, launches.

No per-write numbers here, so it works on any torch.profiler trace or nsys export; a
CPU-only trace gets its host side (ops and calls by name) and an explicit note that
there was no GPU activity.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvprof.analysis.gpu_groups import group_gpu_stats, short_kernel_name, stream_lanes
from kvprof.core.schema import GPU_WORK_KINDS, LAUNCH_KINDS
from kvprof.trace.intervals import busy_and_overlap, gaps

TOP = 15


def _by_name(rows: pd.DataFrame, top: int = TOP, short: bool = True) -> list[dict[str, Any]]:
    if rows.empty:
        return []
    g = rows["dur_ns"].groupby(_name_key(rows["name"], short), observed=True)
    t = pd.DataFrame({"count": g.size(), "total_ns": g.sum(), "mean_ns": g.mean(), "median_ns": g.median()})
    t = t.sort_values("total_ns", ascending=False).head(top)
    return [{"name": n, **{k: (int(v) if k in ("count", "total_ns") else float(v)) for k, v in r.items()}}
            for n, r in t.iterrows()]


def _name_key(name: pd.Series, short: bool) -> Any:
    """The names (shortened with short_kernel_name) to group by, in sorted order. From a
    categorical, each distinct name present is converted once instead of every row (the
    event table's names are categorical; 75k rows cost 25 ms the other way)."""
    if not isinstance(name.dtype, pd.CategoricalDtype) or (name.cat.codes < 0).any():
        text = name.astype(str)
        return text.map(short_kernel_name) if short else text
    used, row_used = np.unique(name.cat.codes.to_numpy(), return_inverse=True)
    labels = [str(name.cat.categories[c]) for c in used]
    if short:
        labels = [short_kernel_name(n) for n in labels]
    uniq, used_label = np.unique(np.asarray(labels, dtype=object), return_inverse=True)
    return pd.Categorical.from_codes(used_label[row_used], categories=pd.Index(uniq, dtype=object))


NO_GPU = "no GPU activity in this trace: CPU-side numbers only"


def no_gpu_note(stats: dict[str, Any] | None) -> str:
    """Why a trace shows no GPU work: none was there, or its events are in categories kvprof does not
    read (another vendor's, a schema it does not know): then those are named, never "no GPU activity"."""
    other = (stats or {}).get("other_categories") or {}
    if not isinstance(other, dict) or not other:
        return NO_GPU
    version = (stats or {}).get("schema_version")
    named = ", ".join(f"{k!r} ({v:,})" for k, v in other.items())
    return (f"no GPU activity kvprof can read: {sum(other.values()):,} events are in categories it does not know "
            f"({named}; schemaVersion {version if version is not None else 'not given'}); CPU-side numbers only")


def per_device(work: pd.DataFrame, names: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Per GPU: busy time (any of its streams), overlap (two or more of ITS streams at once), its
    streams, kernels and copies, and its name where the trace's device tables give one."""
    names = names or {}
    only = next(iter(set(names.values()))) if len(set(names.values())) == 1 else None  # one model of GPU
    out = []
    for dev, g in work.groupby("device", sort=True):
        s = g["start_ns"].to_numpy()
        e = s + g["dur_ns"].to_numpy()
        busy, overlap = busy_and_overlap(s, e, g["stream"].to_numpy())
        out.append({"device": int(dev), "name": names.get(int(dev), only), "busy_ns": int(busy),
                    "overlap_ns": int(overlap), "overlap_frac": overlap / busy if busy else None,
                    "window_ns": int(e.max() - s.min()), "streams": int(g["stream"].nunique()),
                    "kernels": int((g["kind"] == "kernel").sum()), "activities": int(len(g))})
    return out


def generic_summary(events: pd.DataFrame, stats: dict[str, Any] | None = None,
                    device_names: dict[int, str] | None = None) -> dict[str, Any]:
    """Generic GPU and host statistics of one trace's event frame (``stats``: the reader's counters,
    which name the categories it did not read; ``device_names``: device id -> name, from the trace)."""
    kind = events["kind"]  # compared as it is: a categorical needs no text copy (0.2 s per 100k rows)
    work = events[kind.isin(GPU_WORK_KINDS)]
    out: dict[str, Any] = {
        "events": int(len(events)),
        "events_by_kind": {str(k): int(v) for k, v in kind.value_counts().items() if v},
        "gpu": bool(len(work)),
    }
    if work.empty:
        out["note"] = no_gpu_note(stats)
    else:
        end = work["start_ns"] + work["dur_ns"]
        s, e = work["start_ns"].to_numpy(), end.to_numpy()
        devices = per_device(work, device_names)
        # any GPU busy: one device's own figure, else the union over the devices' lanes
        busy = devices[0]["busy_ns"] if len(devices) == 1 else busy_and_overlap(s, e, stream_lanes(work))[0]
        # overlap is streams of ONE device running at once: two GPUs busy together are not overlap
        overlap = sum(d["overlap_ns"] for d in devices)
        device_busy = sum(d["busy_ns"] for d in devices)
        n_gaps, idle = gaps(s, e)
        window = int(e.max() - s.min())
        per_stream = group_gpu_stats(work, ["device", "stream"])
        out.update({
            "gpu_window_ns": window,
            "gpu_busy_ns": busy,
            "gpu_utilization": busy / window if window else None,
            "overlap_ns": overlap,
            "overlap_frac": overlap / device_busy if device_busy else None,
            "devices": devices,
            "idle_ns": idle,
            "gaps": n_gaps,
            "streams": [
                {"device": int(st[0]), "stream": int(st[1]), "activities": int(r["gpu_ops"]),
                 "busy_ns": int(r["gpu_union_ns"]), "span_ns": int(r["gpu_span_ns"]), "idle_ns": int(r["idle_ns"]),
                 "gaps": int(r["gaps"])}
                for st, r in per_stream.iterrows()
            ],
            "kernels_by_name": _by_name(work[work["kind"] == "kernel"]),
            "memcpy_memset": _by_name(work[work["kind"] != "kernel"], short=False),
        })
    out["launches"] = launch_stats(events)
    host = events[kind.isin(["cpu_op", "runtime", "driver"])]
    out["host_calls_by_name"] = _by_name(host, short=False)
    return out


def launch_stats(events: pd.DataFrame) -> dict[str, Any]:
    """Launch calls (count, host duration) and launch -> GPU start delay through correlation ids."""
    kind = events["kind"]  # compared as it is: a categorical needs no text copy
    launch = events[kind.isin(LAUNCH_KINDS)]
    if launch.empty:
        return {"calls": 0}
    work = events[kind.isin(GPU_WORK_KINDS) & (events["correlation"] >= 0)]
    lk = launch[launch["correlation"] >= 0][["pid", "correlation", "start_ns", "name"]].drop_duplicates(
        ["pid", "correlation"]).rename(columns={"start_ns": "launch_ns", "name": "call"})
    j = work[["pid", "correlation", "start_ns"]].merge(lk, on=["pid", "correlation"], how="inner")
    first = j.sort_values("start_ns").groupby(["pid", "correlation"]).first() if len(j) else j
    delay = (first["start_ns"] - first["launch_ns"]).to_numpy() if len(first) else np.empty(0)
    launching = launch[launch["correlation"].isin(work["correlation"])] if len(work) else launch.iloc[:0]
    return {
        "calls": int(len(launch)),
        "launching_calls": int(len(launching)),
        "launch_call_ns_median": float(launching["dur_ns"].median()) if len(launching) else None,
        "launch_to_start_ns_median": float(np.median(delay)) if len(delay) else None,
        "launch_to_start_ns_p90": float(np.percentile(delay, 90)) if len(delay) else None,
        "graph_launches": int(launch["name"].isin(["cudaGraphLaunch", "cuGraphLaunch"]).sum()),
    }
