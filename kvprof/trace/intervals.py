"""Interval helpers shared by attribution and metrics (pure numpy/pandas, no state).

Why separate: "which range contains this call" and "how long were >= 2 streams busy"
are the two questions every number in kvprof rests on, so they live in one small
module with exact, property-tested semantics. Intervals are half-open [start, end).
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def enclosing(inner: pd.DataFrame, outer: pd.DataFrame, key: tuple[str, ...] = ("pid", "tid")) -> np.ndarray:
    """For each inner row, the positional index of the outer row on the same key that contains it.

    Both frames have ``start_ns`` and ``end_ns``. Containment: outer.start <= inner.start
    and inner.end <= outer.end. Outer intervals of one key are expected not to overlap
    (ranges on one thread are sequential); where several contain, the latest-starting
    one wins, which is the innermost for properly nested ranges. -1 where none contains.
    """
    res = np.full(len(inner), -1, dtype=np.int64)
    if not len(inner) or not len(outer):
        return res
    ikeys = list(zip(*(inner[k].to_numpy() for k in key)))
    okeys = list(zip(*(outer[k].to_numpy() for k in key)))
    inner_groups: dict[tuple[object, ...], list[int]] = {}
    for i, k in enumerate(ikeys):
        inner_groups.setdefault(k, []).append(i)
    outer_groups: dict[tuple[object, ...], list[int]] = {}
    for i, k in enumerate(okeys):
        outer_groups.setdefault(k, []).append(i)
    o_start = outer["start_ns"].to_numpy()
    o_end = outer["end_ns"].to_numpy()
    i_start = inner["start_ns"].to_numpy()
    i_end = inner["end_ns"].to_numpy()
    for k, oidx in outer_groups.items():
        iidx = inner_groups.get(k)
        if not iidx:
            continue
        oidx_a = np.asarray(oidx)
        order = np.lexsort((-o_end[oidx_a], o_start[oidx_a]))  # by start, longest first on ties
        oidx_a = oidx_a[order]
        os_, oe_ = o_start[oidx_a], o_end[oidx_a]
        iidx_a = np.asarray(iidx)
        pos = np.searchsorted(os_, i_start[iidx_a], side="right") - 1
        ok = pos >= 0
        posc = np.where(ok, pos, 0)
        ok &= oe_[posc] >= i_end[iidx_a]
        res[iidx_a[ok]] = oidx_a[posc[ok]]
    return res


def union_length(start: np.ndarray, end: np.ndarray) -> int:
    """Total length covered by the union of intervals."""
    if not len(start):
        return 0
    order = np.argsort(start, kind="stable")
    s, e = np.asarray(start)[order], np.asarray(end)[order]
    run_end = np.maximum.accumulate(e)
    # a new block starts where start > max end of everything before
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    block = np.cumsum(new) - 1
    b_start = s[new]
    b_end = np.zeros(block[-1] + 1, dtype=np.int64)
    np.maximum.at(b_end, block, e)
    return int((b_end - b_start).sum())


def merge(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of intervals as disjoint, sorted blocks (touching blocks merge)."""
    if not len(start):
        return np.asarray(start, dtype=np.int64), np.asarray(end, dtype=np.int64)
    order = np.argsort(start, kind="stable")
    s, e = np.asarray(start, dtype=np.int64)[order], np.asarray(end, dtype=np.int64)[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    block = np.cumsum(new) - 1
    b_end = np.zeros(block[-1] + 1, dtype=np.int64)
    np.maximum.at(b_end, block, e)
    return s[new], b_end


def busy_and_overlap(start: np.ndarray, end: np.ndarray, lane: np.ndarray) -> tuple[int, int]:
    """(time with >= 1 lane busy, time with >= 2 lanes busy).

    Each lane (stream) is merged first, so two activities on one stream never count as
    overlap (they serialize; timestamps can still touch or round into each other).
    """
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    lane = np.asarray(lane)
    if not len(start):
        return 0, 0
    bs, be = [], []
    for ln in np.unique(lane):
        m = lane == ln
        s, e = merge(start[m], end[m])
        bs.append(s)
        be.append(e)
    s = np.concatenate(bs)
    e = np.concatenate(be)
    times = np.concatenate([s, e])
    deltas = np.concatenate([np.ones(len(s), np.int64), -np.ones(len(e), np.int64)])
    order = np.lexsort((deltas, times))  # ends (-1) before starts at the same instant
    times, deltas = times[order], deltas[order]
    level = np.cumsum(deltas)
    span = np.diff(times)
    lvl = level[:-1]
    return int(span[lvl >= 1].sum()), int(span[lvl >= 2].sum())


def gaps(start: np.ndarray, end: np.ndarray) -> tuple[int, int]:
    """(number of idle gaps, idle time) between the first start and the last end."""
    s, e = merge(np.asarray(start), np.asarray(end))
    if len(s) < 2:
        return 0, 0
    g = s[1:] - e[:-1]
    return int((g > 0).sum()), int(g[g > 0].sum())


def _merge_segments(seg: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``merge`` for many segments at once: (segment, block start, block end), sorted."""
    order = np.lexsort((start, seg))
    seg, s, e = seg[order], start[order], end[order]
    run_end = pd.Series(e).groupby(seg, sort=False).cummax().to_numpy()
    new = np.ones(len(s), dtype=bool)
    new[1:] = (seg[1:] != seg[:-1]) | (s[1:] > run_end[:-1])
    block = np.cumsum(new) - 1
    b_end = np.zeros(int(block[-1]) + 1, dtype=np.int64)
    np.maximum.at(b_end, block, e)
    return seg[new], s[new], b_end


def grouped_interval_stats(group: np.ndarray, start: np.ndarray, end: np.ndarray, lane: np.ndarray,
                           groups: int) -> dict[str, np.ndarray]:
    """``busy_and_overlap`` and ``gaps`` for every group in one vectorised pass.

    ``group`` holds codes 0..groups-1. Same semantics as the per-group functions (each
    lane merged first, ends before starts at one instant, touching blocks merge), so a
    trace of 100k writes costs a few sorts instead of 100k Python iterations.
    """
    group = np.asarray(group, dtype=np.int64)
    start = np.asarray(start, dtype=np.int64)
    end = np.asarray(end, dtype=np.int64)
    out = {k: np.zeros(groups, dtype=np.int64) for k in ("union", "overlap", "gaps", "idle")}
    if not len(start):
        return out
    _, lane_code = np.unique(np.asarray(lane), return_inverse=True)
    lanes = int(lane_code.max()) + 1
    seg_g, bs, be = _merge_segments(group * lanes + lane_code, start, end)
    g = seg_g // lanes
    times = np.concatenate([bs, be])
    deltas = np.concatenate([np.ones(len(bs), np.int64), -np.ones(len(be), np.int64)])
    gg = np.concatenate([g, g])
    order = np.lexsort((deltas, times, gg))
    times, deltas, gg = times[order], deltas[order], gg[order]
    level = np.cumsum(deltas)  # each group's deltas sum to zero, so levels never leak across groups
    span = np.diff(times)
    same = gg[1:] == gg[:-1]
    lvl = level[:-1]
    out["union"] = np.bincount(gg[:-1][same & (lvl >= 1)], weights=span[same & (lvl >= 1)],
                               minlength=groups).astype(np.int64)
    out["overlap"] = np.bincount(gg[:-1][same & (lvl >= 2)], weights=span[same & (lvl >= 2)],
                                 minlength=groups).astype(np.int64)
    seg_all, as_, ae = _merge_segments(group, start, end)
    between = seg_all[1:] == seg_all[:-1]
    holes = as_[1:] - ae[:-1]
    has = between & (holes > 0)
    out["gaps"] = np.bincount(seg_all[:-1][has], minlength=groups).astype(np.int64)
    out["idle"] = np.bincount(seg_all[:-1][has], weights=holes[has], minlength=groups).astype(np.int64)
    return out
