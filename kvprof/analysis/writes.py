"""One row per write with its measured numbers: the table behind writes.parquet.

Pure function of an attributed Trace. Columns (WRITE_COLUMNS):

| column           | meaning                                                                  |
|------------------|--------------------------------------------------------------------------|
| trace            | file the write came from                                                 |
| source           | kineto / nsys                                                            |
| rank             | distributed rank of the trace (0 for a one-process capture)              |
| write_id         | id within that file                                                      |
| variant, phase, size, step, layer, tokens | what was written, in which step                 |
| attribution      | correlation / graph_node / graph_order                                   |
| graph            | replayed from a CUDA graph                                               |
| context          | none (writes back to back) or layer (each inside a decoder layer)        |
| during_capture   | range entered while a graph was captured (a template, not a measurement) |
| gpu_ops, kernels | GPU activities (kernel+memcpy+memset) and kernels of the write           |
| streams          | distinct streams they ran on                                             |
| gpu_start_ns, gpu_end_ns, gpu_span_ns | first start, last end, and their distance           |
| gpu_busy_ns      | sum of activity durations                                                |
| gpu_new_ns       | end - max(start, latest end of the trace's earlier writes): what the     |
|                  | write adds to the GPU timeline. With programmatic dependent launch a     |
|                  | kernel starts while the previous one runs and waits, so its span counts  |
|                  | that wait. In a layer context: end - latest end of any earlier GPU work  |
|                  | (the gap before the write included: its node's launch latency)           |
| gpu_union_ns     | time with at least one activity running                                  |
| overlap_ns, overlap_frac | time with >= 2 streams busy, and its share of gpu_union_ns       |
| idle_ns, gaps    | idle time and number of holes inside the span                            |
| gap_before_ns    | GPU idle before the write: first start - latest end of any earlier work, |
|                  | clipped at 0 (a write that began before that work ended has no gap,      |
|                  | never a negative one)                                                    |
| same_stream_early_ns | how long before the end of the work before it on its own stream the  |
|                  | write's first activity began (0: after it ended; NaN: nothing before it  |
|                  | on that stream). > 0 is programmatic dependent launch (PDL) overlap:     |
|                  | kvprof.analysis.early_start                                              |
| host_start_ns, host_dur_ns | the write range on the host (eager writes; NaN for replays)    |
| launch_delay_ns  | eager: first activity start - start of the call that launched it         |
| graph_launch     | correlation of the cudaGraphLaunch that replayed it (-1: eager)          |
| bytes            | bytes_per_token x tokens from the capture metadata (NaN if unknown)      |
| bandwidth_gbs    | bytes / gpu_span_ns                                                      |
| pct_of_peak      | bandwidth_gbs / the device's peak bandwidth x 100                        |
| kernel_names     | distinct short kernel names, " | " separated                              |
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvprof.analysis.early_start import predecessors
from kvprof.analysis.gpu_groups import GROUP_STAT_COLUMNS, group_gpu_stats, short_kernel_name
from kvprof.core.devices import spec_peak_gbs
from kvprof.core.schema import GPU_WORK_KINDS, LAUNCH_KINDS
from kvprof.trace.model import Trace
from kvprof.trace.table import to_frame

WRITE_COLUMNS = (
    "trace", "source", "rank", "write_id", "variant", "phase", "size", "step", "layer", "tokens", "attribution",
    "graph", "during_capture", "context", "layout", *GROUP_STAT_COLUMNS, "gpu_new_ns", "overlap_frac",
    "gap_before_ns", "same_stream_early_ns", "host_start_ns", "host_dur_ns",
    "launch_delay_ns", "graph_launch", "bytes", "bandwidth_gbs", "pct_of_peak", "kernel_names",
)


def peak_bandwidth_gbs(trace: Trace) -> float | None:
    """The device's peak: capture metadata first (measured/declared), then the source's device
    info, then the spec table by the device's name (kvprof.core.devices)."""
    dev = trace.kvprof.device if trace.kvprof else {}
    if dev.get("peak_bandwidth_gbs"):
        return float(dev["peak_bandwidth_gbs"])
    for d in trace.devices:
        if d.get("peak_bandwidth_gbs"):
            return float(d["peak_bandwidth_gbs"])
    for d in [dev, *trace.devices]:
        spec = spec_peak_gbs(d.get("name"))
        if spec is not None:
            return spec
    return None


def gpu_work_rows(events: pd.DataFrame) -> pd.DataFrame:
    return events[events["kind"].isin(GPU_WORK_KINDS)]


def _launch_delay(events: pd.DataFrame, work: pd.DataFrame) -> pd.Series:
    """Per write: first activity start minus start of the call that launched that activity."""
    launch = events[events["kind"].isin(LAUNCH_KINDS) & (events["correlation"] >= 0)]
    lk = launch[["pid", "correlation", "start_ns"]].drop_duplicates(["pid", "correlation"]).rename(
        columns={"start_ns": "launch_ns"})
    w = work[(work["write_id"] >= 0) & (work["graph_launch"] < 0)][["write_id", "pid", "correlation", "start_ns"]]
    j = w.merge(lk, on=["pid", "correlation"], how="inner")
    if j.empty:
        return pd.Series(dtype=float)
    j = j.sort_values("start_ns").groupby("write_id").first()
    return (j["start_ns"] - j["launch_ns"]).astype(float)


def per_write_table(trace: Trace, events: pd.DataFrame | None = None,
                    bytes_per_token: dict[str, float] | None = None) -> pd.DataFrame:
    """The writes of an attributed trace with their GPU and host numbers (WRITE_COLUMNS).

    ``bytes_per_token``: per variant, for traces that carry no kvprof metadata themselves
    (an nsys export: its variant's Kineto trace or the manifest knows).
    """
    idx = trace.writes
    if idx is None or idx.empty:
        return pd.DataFrame(columns=list(WRITE_COLUMNS))
    ev = to_frame(trace.events) if events is None else events
    work = gpu_work_rows(ev)
    mine = work[work["write_id"] >= 0]
    stats = group_gpu_stats(mine, "write_id")
    names = (mine.assign(short=mine["name"].astype(str).map(short_kernel_name))
             .groupby("write_id")["short"].agg(lambda s: " | ".join(dict.fromkeys(s))))
    out = idx.set_index("write_id").join(stats, how="left").join(names.rename("kernel_names"), how="left")
    for c in ("gpu_ops", "kernels", "streams", "gaps"):
        out[c] = out[c].fillna(0).astype(np.int64)
    out["overlap_frac"] = np.where(out["gpu_union_ns"] > 0, out["overlap_ns"] / out["gpu_union_ns"], np.nan)
    out["host_start_ns"] = out["host_start_ns"].where(out["host_start_ns"] >= 0)
    out["host_dur_ns"] = out["host_dur_ns"].where(out["graph_launch"] < 0)
    out["launch_delay_ns"] = _launch_delay(ev, work).reindex(out.index)
    out["graph"] = out["graph_launch"] >= 0
    bpt = trace.kvprof.bytes_per_token if trace.kvprof else None
    tokens = out["tokens"].where(out["tokens"] >= 0)
    if isinstance(bpt, (int, float)) and bpt > 0:
        out["bytes"] = tokens * float(bpt)
    else:
        per = out["variant"].astype(str).map(bytes_per_token or {}).astype(float)
        out["bytes"] = tokens * per
    span = out["gpu_span_ns"].where(out["gpu_span_ns"] > 0)
    out["bandwidth_gbs"] = out["bytes"] / span  # bytes per ns == GB/s
    peak = peak_bandwidth_gbs(trace)
    out["pct_of_peak"] = out["bandwidth_gbs"] / peak * 100.0 if peak else np.nan
    context = trace.kvprof.context if trace.kvprof else "none"
    out["context"] = context
    # kvprof's traces from before layouts existed wrote the MHA pool; others do not say
    out["layout"] = (trace.kvprof.layout or "mha") if trace.kvprof else None
    if context == "layer":
        out["gpu_new_ns"] = new_time_after_any_work(out["gpu_start_ns"], out["gpu_end_ns"], out["gpu_ops"], work)
    else:
        out["gpu_new_ns"] = new_gpu_time(out["gpu_start_ns"], out["gpu_end_ns"])
    pred = predecessors(work, out.index.to_numpy(), out["gpu_start_ns"].to_numpy(dtype=float))
    out["gap_before_ns"] = pred.gap_before_ns
    out["same_stream_early_ns"] = pred.same_stream_early_ns
    out["trace"] = trace.path
    out["source"] = trace.source
    out["rank"] = trace_rank(ev)
    out = out.reset_index()
    return out[list(WRITE_COLUMNS)]


def trace_rank(events: pd.DataFrame) -> int:
    """The trace's distributed rank (one trace is one process: one rank; 0 without one)."""
    ranks = events["rank"] if "rank" in events else pd.Series(dtype=int)
    return int(ranks.max()) if len(ranks) else 0


def new_gpu_time(start: pd.Series, end: pd.Series) -> pd.Series:
    """Per write: end - max(start, the latest end among writes that started before it),
    clipped at 0 (NaN without GPU work). One trace is one process on one device."""
    order = start.dropna().sort_values(kind="stable").index
    e = end.reindex(order)
    prev_end = e.cummax().shift(1)
    new = (e - np.maximum(start.reindex(order), prev_end.fillna(-np.inf))).clip(lower=0)
    return new.reindex(start.index)


def new_time_after_any_work(start: pd.Series, end: pd.Series, ops: pd.Series, work: pd.DataFrame) -> pd.Series:
    """Per write: end - the latest end of any GPU activity that started before the write's
    first one. Inside a decoder layer the write follows the rotary kernel, not the previous
    write; the gap before it (the graph node's own launch latency) is part of what it adds
    to the step, and so is the wait of a PDL-launched kernel that started early."""
    if work.empty:
        return pd.Series(np.nan, index=start.index)
    s = work["start_ns"].to_numpy(dtype=np.int64)
    e = s + work["dur_ns"].to_numpy(dtype=np.int64)
    order = np.argsort(s, kind="stable")
    s, e = s[order], np.maximum.accumulate(e[order])
    first = start.to_numpy(dtype=float)
    out = np.full(len(first), np.nan)
    ok = np.isfinite(first) & (ops.to_numpy() > 0)
    idx = np.searchsorted(s, first[ok].astype(np.int64), side="left") - 1  # last activity starting before
    prev = np.where(idx >= 0, e[np.clip(idx, 0, None)], first[ok])
    out[ok] = np.clip(end.to_numpy(dtype=float)[ok] - prev, 0, None)
    return pd.Series(out, index=start.index)


STEP_METRIC_COLUMNS = (
    "trace", "source", "variant", "phase", "size", "step", "start_ns", "dur_ns", "writes", "graph",
    *GROUP_STAT_COLUMNS,
)


def per_step_table(trace: Trace, writes: pd.DataFrame, events: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per kvprof step: host duration, GPU span/busy of its work, writes in it."""
    st = trace.steps
    if st is None or st.empty:
        return pd.DataFrame(columns=list(STEP_METRIC_COLUMNS))
    ev = to_frame(trace.events) if events is None else events
    work = gpu_work_rows(ev)
    work = work[work["step"] >= 0].assign(
        skey=lambda d: d["variant"].astype(str) + "|" + d["phase"].astype(str) + "|" + d["size"].astype(str)
        + "|" + d["step"].astype(str))
    stats = group_gpu_stats(work, "skey")
    w = writes[~writes["during_capture"]] if len(writes) else writes
    wkey = (w["variant"].astype(str) + "|" + w["phase"].astype(str) + "|" + w["size"].astype(str) + "|"
            + w["step"].astype(str)) if len(w) else pd.Series(dtype=str)
    n_writes = wkey.value_counts() if len(w) else pd.Series(dtype=int)
    graph = w.groupby(wkey)["graph"].any() if len(w) else pd.Series(dtype=bool)
    out = st.copy()
    out["skey"] = (out["variant"].astype(str) + "|" + out["phase"].astype(str) + "|" + out["size"].astype(str)
                   + "|" + out["step"].astype(str))
    out = out.join(stats, on="skey").assign(
        writes=lambda d: d["skey"].map(n_writes).fillna(0).astype(np.int64),
        # a step with no write maps to NaN: eq(True) makes it False without fillna's bool-into-float cast
        graph=lambda d: d["skey"].map(graph).eq(True),
        trace=trace.path, source=trace.source)
    return out[list(STEP_METRIC_COLUMNS)]
