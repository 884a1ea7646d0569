"""Ranks of a multi-rank capture side by side: per-rank write cost, skew, collective wait, paths.

Pure functions over the write and step tables (each row carries its trace, hence its
rank) and the event table's collective rows. Figures:

- per rank (variant, phase, size): writes, median write time (GPU span of the write's
  work; host range duration where the trace has no GPU rows), median step time, median
  collective time per step and the collective wait.
- skew per step: slowest rank's step time / the median rank's step time; reported as the
  median and the maximum over the steps of each (variant, phase, size).
- collective time per step: the union of the collective rows (NCCL kernels on GPU;
  ``c10d``/Gloo all-reduce calls on the host otherwise) inside the step. A rank that
  arrives early waits inside its all-reduce for the late one, so its wait is its
  collective time minus the least any rank spent in that step's collectives.
- same path: whether every rank's writer reported the same write paths for a variant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvprof.analysis.jsonsafe import clean
from kvprof.core.schema import GPU_WORK_KINDS

# Collective rows: NCCL kernels (ncclDevKernel_AllReduce_..., ncclKernel_...) and the host calls
# of torch.distributed (c10d::allreduce_, gloo:all_reduce, nccl:all_reduce record functions).
COLLECTIVE = re.compile(r"^(nccl(Dev)?Kernel_|c10d::|gloo:|nccl:)", re.IGNORECASE)
KEY = ["variant", "phase", "size", "step"]

PER_RANK_COLUMNS = ("variant", "phase", "size", "rank", "writes", "write_ns", "step_ns", "collective_ns",
                    "wait_ns", "collective_share", "paths")
SKEW_COLUMNS = ("variant", "phase", "size", "ranks", "steps", "skew_median", "skew_max", "slowest_rank")


@dataclass
class RankAnalysis:
    """The cross-rank figures of one run (empty frames for a one-rank run)."""

    world_size: int
    per_rank: pd.DataFrame
    skew: pd.DataFrame
    same_path: dict[str, bool] = field(default_factory=dict)  # variant -> every rank reported the same paths
    step_source: str = "host"  # "gpu": step and write times are GPU spans; "host": host ranges

    def to_json(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = clean({"world_size": self.world_size, "step_source": self.step_source,
                      "same_path": dict(self.same_path),
                      "per_rank": self.per_rank.to_dict(orient="records"),
                      "skew": self.skew.to_dict(orient="records")})
        return cleaned


def _union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """Time covered by at least one interval (nested host calls counted once)."""
    order = np.argsort(starts, kind="stable")
    total, cur_s, cur_e = 0, None, None
    for s, e in zip(starts[order], ends[order]):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return int(total)


def collective_per_step(events: pd.DataFrame, rank: int) -> pd.DataFrame:
    """One trace's collective time per step (KEY + rank, collective_ns). GPU kernels where the
    trace has NCCL kernels, else the host calls."""
    named = events[(events["step"] >= 0) & events["name"].astype(str).str.match(COLLECTIVE)]
    gpu = named[named["kind"].isin(GPU_WORK_KINDS)]
    rows = gpu if len(gpu) else named[named["device"] < 0]
    if rows.empty:
        return pd.DataFrame(columns=[*KEY, "rank", "collective_ns"])
    rows = rows.assign(end_ns=rows["start_ns"] + rows["dur_ns"], variant=rows["variant"].astype(str),
                       phase=rows["phase"].astype(str))
    out = [(*k, rank, _union_ns(g["start_ns"].to_numpy(), g["end_ns"].to_numpy()))
           for k, g in rows.groupby(KEY, observed=True, sort=True)]
    return pd.DataFrame(out, columns=[*KEY, "rank", "collective_ns"])


def _step_times(steps: pd.DataFrame, trace_rank: dict[str, int]) -> tuple[pd.DataFrame, str]:
    s = steps.assign(rank=steps["trace"].map(trace_rank), variant=steps["variant"].astype(str),
                     phase=steps["phase"].astype(str))
    s = s[s["rank"].notna()]
    gpu = "gpu_span_ns" in s and s["gpu_span_ns"].notna().any() and (s["gpu_span_ns"] > 0).any()
    s = s.assign(step_ns=s["gpu_span_ns"] if gpu else s["dur_ns"], rank=s["rank"].astype(int))
    return s[[*KEY, "rank", "step_ns"]], "gpu" if gpu else "host"


def rank_paths(manifest_ranks: list[Any]) -> tuple[dict[tuple[str, int], str], dict[str, bool]]:
    """(variant, rank) -> "path=n, ..." and variant -> every rank reported the same set of paths."""
    text: dict[tuple[str, int], str] = {}
    per_variant: dict[str, set[tuple[str, ...]]] = {}
    for entry in manifest_ranks:
        for variant, paths in entry.paths.items():
            text[(variant, entry.rank)] = ", ".join(f"{p}={n}" for p, n in sorted(paths.items()))
            per_variant.setdefault(variant, set()).add(tuple(sorted(p for p, n in paths.items() if n)))
    return text, {v: len(kinds) == 1 for v, kinds in per_variant.items()}


def analyze_ranks(writes: pd.DataFrame, steps: pd.DataFrame, traces: list[tuple[str, int, pd.DataFrame]],
                  manifest_ranks: list[Any], world_size: int) -> RankAnalysis:
    """``traces``: (path, rank, collective_per_step of its events) of every trace;
    ``manifest_ranks``: the manifest's RankEntry list."""
    trace_rank = {path: rank for path, rank, _c in traces}
    step_t, source = _step_times(steps, trace_rank)
    parts = [c for _p, _r, c in traces if len(c)]
    coll = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    per_step = step_t.merge(coll, on=[*KEY, "rank"], how="left") if len(coll) else step_t.assign(collective_ns=np.nan)
    group = ["variant", "phase", "size", "step"]
    per_step["wait_ns"] = per_step["collective_ns"] - per_step.groupby(group)["collective_ns"].transform("min")

    w = writes[~writes["during_capture"].astype(bool)] if len(writes) else writes
    w = w.assign(variant=w["variant"].astype(str), phase=w["phase"].astype(str))
    use_gpu = source == "gpu" and w["gpu_span_ns"].notna().any()
    w = w.assign(write_ns=w["gpu_span_ns"] if use_gpu else w["host_dur_ns"])
    wstats = w.groupby(["variant", "phase", "size", "rank"]).agg(writes=("write_ns", "size"),
                                                                 write_ns=("write_ns", "median"))
    sstats = per_step.groupby(["variant", "phase", "size", "rank"]).agg(
        step_ns=("step_ns", "median"), collective_ns=("collective_ns", "median"), wait_ns=("wait_ns", "median"))
    per_rank = wstats.join(sstats, how="outer").reset_index()
    per_rank["writes"] = per_rank["writes"].fillna(0).astype(np.int64)
    per_rank["collective_share"] = per_rank["collective_ns"] / per_rank["step_ns"]
    path_text, same = rank_paths(manifest_ranks)
    per_rank["paths"] = [path_text.get((v, int(r)), "") for v, r in zip(per_rank["variant"], per_rank["rank"])]
    per_rank = per_rank.sort_values(["variant", "phase", "size", "rank"], kind="stable").reset_index(drop=True)
    return RankAnalysis(world_size, per_rank[list(PER_RANK_COLUMNS)], skew_table(step_t), same, source)


def skew_table(step_t: pd.DataFrame) -> pd.DataFrame:
    """Per (variant, phase, size): slowest / median rank step time, over the steps every rank has."""
    rows = []
    for (variant, phase, size), g in step_t.groupby(["variant", "phase", "size"], sort=True):
        wide = g.pivot_table(index="step", columns="rank", values="step_ns", aggfunc="first").dropna()
        if wide.empty:
            continue
        ratio = wide.max(axis=1) / wide.median(axis=1)
        slowest = wide.idxmax(axis=1).mode()
        rows.append((variant, phase, int(size), wide.shape[1], len(wide), float(ratio.median()), float(ratio.max()),
                     int(slowest.iloc[0]) if len(slowest) else -1))
    return pd.DataFrame(rows, columns=list(SKEW_COLUMNS))


__all__ = ["COLLECTIVE", "PER_RANK_COLUMNS", "SKEW_COLUMNS", "RankAnalysis", "analyze_ranks", "collective_per_step",
           "skew_table"]
