"""GPU time of groups of activities (a write, a step, a stream): one function, used everywhere.

Pure: takes the GPU work rows and a group key, returns one row per group. Cheap
aggregates come from pandas groupby; the interval questions (union, >= 2 streams busy,
idle gaps) are answered for all groups in one vectorised pass
(``kvprof.trace.intervals.grouped_interval_stats``), so 100k writes cost a few sorts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvprof.trace.intervals import grouped_interval_stats

GROUP_STAT_COLUMNS = (
    "gpu_ops", "kernels", "streams", "gpu_start_ns", "gpu_end_ns", "gpu_span_ns", "gpu_busy_ns",
    "gpu_union_ns", "overlap_ns", "idle_ns", "gaps",
)


def group_gpu_stats(rows: pd.DataFrame, key: str | list[str]) -> pd.DataFrame:
    """Per group of GPU rows (columns start_ns, dur_ns, stream, kind): time statistics.

    gpu_busy_ns: sum of durations; gpu_span_ns: first start to last end; gpu_union_ns:
    time with anything running; overlap_ns: time with >= 2 streams running; idle_ns /
    gaps: time and count of holes between first start and last end.
    """
    keys = [key] if isinstance(key, str) else list(key)
    if rows.empty:
        return pd.DataFrame(columns=[*keys, *GROUP_STAT_COLUMNS]).set_index(keys)
    r = rows.assign(end_ns=rows["start_ns"] + rows["dur_ns"], is_kernel=(rows["kind"] == "kernel").to_numpy(bool),
                    _lane=stream_lanes(rows))
    g = r.groupby(keys, sort=True, observed=True)
    out = pd.DataFrame({
        "gpu_ops": g.size(),
        "kernels": g["is_kernel"].sum().astype(np.int64),
        "streams": g["_lane"].nunique(),
        "gpu_start_ns": g["start_ns"].min(),
        "gpu_end_ns": g["end_ns"].max(),
        "gpu_busy_ns": g["dur_ns"].sum(),
    })
    out["gpu_span_ns"] = out["gpu_end_ns"] - out["gpu_start_ns"]
    out["gpu_union_ns"] = out["gpu_busy_ns"]
    out["overlap_ns"] = 0
    out["idle_ns"] = 0
    out["gaps"] = 0
    if (out["gpu_ops"] > 1).any():
        codes = g.ngroup().to_numpy()  # positions in ``out`` (both sorted by the keys)
        keyed = codes >= 0  # -1: a row whose key is missing (NaN), in no group of ``out``
        st = grouped_interval_stats(codes[keyed], r["start_ns"].to_numpy()[keyed], r["end_ns"].to_numpy()[keyed],
                                    np.asarray(r["_lane"])[keyed], len(out))
        out["gpu_union_ns"] = st["union"]
        out["overlap_ns"] = st["overlap"]
        out["idle_ns"] = st["idle"]
        out["gaps"] = st["gaps"]
    return out[list(GROUP_STAT_COLUMNS)]


def stream_lanes(rows: pd.DataFrame) -> np.ndarray:
    """One lane per (device, stream): stream ids are per device, so stream 7 of GPU 0 and
    stream 7 of GPU 1 are two lanes, never one."""
    if "device" not in rows.columns:
        streams: np.ndarray = rows["stream"].to_numpy()
        return streams
    # each column factorized alone and the pair's codes combined: a MultiIndex of the two took
    # 90 ms per 100k rows to build its values
    dev, _ = pd.factorize(rows["device"].to_numpy())
    stream, streams = pd.factorize(rows["stream"].to_numpy())
    codes: np.ndarray
    codes, _ = pd.factorize(dev.astype(np.int64) * max(len(streams), 1) + stream)
    return codes


def short_kernel_name(name: str) -> str:
    """``void at::native::foo<128, ...>(...)`` -> ``at::native::foo``: readable in a table."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    depth, cut = 0, len(s)
    for i, ch in enumerate(s):
        if ch in "<(":
            if depth == 0:
                cut = i
                break
        depth += ch == "<"
    return s[:cut].strip() or name[:60]
