"""A write that began before its predecessor ended: one definition, for writes back to back
and for writes inside a decoder layer.

On one CUDA stream a kernel starts after the one before it ends, except with programmatic
dependent launch (PDL, sm_90+): the kernel may start while its predecessor on the stream
still runs, and waits (``griddepcontrol.wait``) until that one lets it go on. A trace then
shows the write's first GPU activity starting before the end of the work before it on the
same stream. That early start is PDL overlap: not two streams running at once, and not a
negative gap. Work before it on another stream is another question (streams running
concurrently) and is kept apart: ``start_after_ns`` measures against any stream,
``same_stream_early_ns`` against the write's own.

Pure numpy/pandas; no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from kvprof.analysis.gpu_groups import stream_lanes


def latest_end_before(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each ``at``: the latest end among activities starting strictly before it and that
    activity's index (NaN and -1 where none). ``starts`` sorted ascending."""
    latest, which = np.full(len(at), np.nan), np.full(len(at), -1)
    if len(ends):
        cm = np.maximum.accumulate(ends)
        arg = np.maximum.accumulate(np.where(ends == cm, np.arange(len(ends)), 0))
        i = np.searchsorted(starts, at, side="left") - 1
        ok = i >= 0
        latest[ok], which[ok] = cm[i[ok]], arg[i[ok]]
    return latest, which


@dataclass(frozen=True)
class Predecessors:
    """Per write, in the order asked: where its first GPU activity starts against the work
    before it (ns; NaN for a write without GPU work or with no work before it)."""

    first_lane: np.ndarray  # the stream (device, stream lane) of the write's first activity; -1: none
    start_after_ns: np.ndarray  # first start - latest end of any work that started before it; < 0: began before
    same_stream_early_ns: np.ndarray  # latest end of the work before it on its own stream - first start, where > 0
    # (PDL overlap); 0 where the write began after that work ended

    @property
    def began_early(self) -> np.ndarray:
        """The writes that began before the work before them on their own stream ended."""
        early: np.ndarray = np.nan_to_num(self.same_stream_early_ns, nan=0.0) > 0
        return early

    @property
    def gap_before_ns(self) -> np.ndarray:
        """GPU idle before the write: ``start_after_ns`` clipped at 0. A write that began
        before its predecessor ended (PDL overlap on its stream, or work still running on
        another stream) has no gap before it, never a negative one."""
        gap: np.ndarray = np.where(np.isnan(self.start_after_ns), np.nan, np.maximum(self.start_after_ns, 0.0))
        return gap


def predecessors(work: pd.DataFrame, write_ids: np.ndarray, first_start: np.ndarray) -> Predecessors:
    """``work``: one trace's GPU activity rows (start_ns, dur_ns, stream[, device], write_id);
    ``write_ids`` and ``first_start`` (NaN: no GPU work): the writes asked about. One trace is
    one process, so the activities before a write are its predecessors whatever wrote them."""
    n = len(write_ids)
    first = np.asarray(first_start, dtype=float)
    out_lane = np.full(n, -1, dtype=np.int64)
    start_after, early = np.full(n, np.nan), np.full(n, np.nan)
    if work.empty or not n:
        return Predecessors(out_lane, start_after, early)
    lanes = np.asarray(stream_lanes(work), dtype=np.int64)
    s_all = work["start_ns"].to_numpy(dtype=np.int64)
    e_all = s_all + work["dur_ns"].to_numpy(dtype=np.int64)
    wid = work["write_id"].to_numpy(dtype=np.int64)
    order = np.argsort(s_all, kind="stable")
    s_sorted, e_sorted, lane_sorted = s_all[order], e_all[order], lanes[order]
    has = np.isfinite(first)
    at = np.where(has, first, 0).astype(np.int64)
    latest, _ = latest_end_before(s_sorted, e_sorted, at)
    start_after[has] = first[has] - latest[has]
    # the write's own first activity: its stream
    mine = pd.DataFrame({"write_id": wid, "start": s_all, "lane": lanes})[wid >= 0]
    firsts = mine.sort_values("start", kind="stable").groupby("write_id")["lane"].first()
    found = firsts.reindex(np.asarray(write_ids, dtype=np.int64)).to_numpy(dtype=float)
    ok = has & np.isfinite(found)
    out_lane[ok] = found[ok].astype(np.int64)
    for lane in np.unique(out_lane[ok]):
        on = lane_sorted == lane
        sel = ok & (out_lane == lane)
        prev, _ = latest_end_before(s_sorted[on], e_sorted[on], at[sel])
        early[sel] = np.maximum(prev - first[sel], 0.0)  # NaN stays NaN: nothing before it on its stream
    return Predecessors(out_lane, start_after, early)


def early_start_notes(writes: pd.DataFrame, pdl: Mapping[str, bool | None]) -> list[str]:
    """One warning per (variant, source) whose writes began before the work before them on
    their stream ended although the variant does not launch with PDL (``pdl[variant]`` is
    False): that is not PDL overlap, and no kernel on one stream starts before its
    predecessor ends otherwise, so the trace's timestamps are off (clock skew between its
    records, or a trace problem). ``writes``: measured rows of ``per_write_table``."""
    if writes.empty or "same_stream_early_ns" not in writes:
        return []
    early_ns = pd.to_numeric(writes["same_stream_early_ns"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    frame = pd.DataFrame({"variant": writes["variant"].astype(str).to_numpy(),
                          "source": writes["source"].astype(str).to_numpy(), "early": early_ns,
                          "gpu": writes["gpu_start_ns"].notna().to_numpy()})
    notes = []
    for (variant, source), g in frame[frame["gpu"]].groupby(["variant", "source"], sort=True):
        early = g["early"].to_numpy()
        early = early[early > 0]
        if not len(early) or pdl.get(str(variant)) is not False:
            continue
        notes.append(
            f"{variant} ({source}): {len(early)} of {len(g)} writes began before the work before them on their "
            f"stream ended (median {np.median(early) / 1e3:.2f} µs, max {early.max() / 1e3:.2f} µs early), yet "
            f"{variant} does not launch with programmatic dependent launch: not PDL overlap but a trace anomaly "
            "(clock skew between the trace's records, or a problem in the trace)")
    return notes


__all__ = ["Predecessors", "early_start_notes", "latest_end_before", "predecessors"]
