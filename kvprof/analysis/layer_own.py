"""A write's own added time in a decoder layer, told apart from its neighbours' variation.

What a write "adds" to a layer step is the step with the write minus the same step without it
(``layer`` minus ``layer_no_write``, CUDA events, per layer). That difference also holds
whatever the other kernels of the layer did differently in the graph with the write: a GEMM
that ran longer there counts as the write's. Given several captures of the same variants, their
order rotated, with a profiled trace of both graphs of each, this module splits the difference:

- ``neighbours_ns``: per layer, the change in the layer's other kernels -- every kernel name
  the two graphs launch equally often, its per-replay GPU time (median over replays) in the
  graph with the write minus in the graph without it;
- ``write_kernels_ns``: the kernels the write adds (names launched more often with the write;
  for a write that replaces a kernel, e.g. the rotary, the difference);
- ``own_ns``: ``added_ns - neighbours_ns``, the write's own added time: what the step gains
  by the write, less what its neighbours happened to take longer (or shorter) in that graph;
- ``gaps_ns``: the traced step difference not in either kernel sum: idle time and launch
  gaps the write adds (negative where programmatic dependent launch overlaps it).

``runs_spread``: the same other kernels in the graphs without the write, which run the same
code for every variant: how far their per-layer time moves from one capture to the next.

Pure functions over plain tables (pandas); no torch. ``lab/layer_own_time.py`` records the
tables on a GPU.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvprof.core.errors import UsageError

WITH, WITHOUT = "layer", "layer_no_write"
RUN_KEYS = ("dtype", "variant", "rotation", "size")
KERNEL_COLUMNS = (*RUN_KEYS, "mode", "replay", "name", "start_ns", "dur_ns")
STEP_COLUMNS = (*RUN_KEYS, "mode", "median_ns", "iqr_ns", "layers")


@dataclass(frozen=True)
class OwnTime:
    """One capture of one variant at one size: its write's added time split (ns per layer)."""

    dtype: str
    variant: str
    rotation: int
    position: int  # where the variant ran in that capture's order (0: first)
    size: int
    layers: int
    added_ns: float  # (layer - layer_no_write) / layers, CUDA events, no profiler
    added_spread_ns: float | None  # the two steps' IQRs in quadrature, per layer
    traced_added_ns: float | None  # the same difference of the traced replays' spans
    write_kernels_ns: float | None  # GPU time of the kernels the write adds
    neighbours_ns: float | None  # the other kernels' change beside the write
    own_ns: float | None  # added_ns - neighbours_ns
    gaps_ns: float | None  # traced_added_ns - write_kernels_ns - neighbours_ns
    top_neighbour: str = ""  # the other kernel that moved most
    top_neighbour_ns: float | None = None
    write_kernels: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class OwnSummary:
    """Over the captures (rotations) of one variant at one size: median, min and max."""

    dtype: str
    variant: str
    size: int
    captures: int
    added_ns: float
    added_range_ns: tuple[float, float]
    own_ns: float | None
    own_range_ns: tuple[float, float] | None
    write_kernels_ns: float | None
    neighbours_ns: float | None
    neighbours_range_ns: tuple[float, float] | None
    gaps_ns: float | None
    added_spread_ns: float | None  # median of the captures' spreads

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RunsSpread:
    """The layer's kernels in the graphs without a write (the same code for every variant),
    per capture: how far their per-layer GPU time moves between captures (ns)."""

    dtype: str
    size: int
    captures: int
    total_ns: dict[str, float]  # "variant#rotation" -> per-layer GPU time of every kernel
    spread_ns: float  # max - min of total_ns
    top_kernel: str  # the kernel whose per-layer time moved most between captures
    top_kernel_spread_ns: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _need(frame: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    missing = [c for c in columns if c not in frame]
    if missing:
        raise UsageError(f"{what} lacks column(s) {', '.join(missing)}")


def _per_name(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per (run, mode, name): the median over replays of that name's GPU time and launches in
    one replay (a replay without the name counts as 0)."""
    per_replay = (kernels.groupby([*RUN_KEYS, "mode", "replay", "name"], sort=False)["dur_ns"]
                  .agg(["sum", "count"]).reset_index())
    replays = kernels.groupby([*RUN_KEYS, "mode"], sort=False)["replay"].nunique().rename("replays").reset_index()
    per_replay = per_replay.merge(replays, on=[*RUN_KEYS, "mode"])
    g = per_replay.groupby([*RUN_KEYS, "mode", "name"], sort=False)
    out = g.agg(seen=("replay", "size"), replays=("replays", "first"),
                sums=("sum", list), counts=("count", list)).reset_index()

    def padded_median(xs: list[float], n: int) -> float:
        return float(np.median(np.asarray(list(xs) + [0.0] * (n - len(xs)), dtype=float)))

    out["time_ns"] = [padded_median(s, n) for s, n in zip(out["sums"], out["replays"])]
    out["launches"] = [padded_median(c, n) for c, n in zip(out["counts"], out["replays"])]
    return out.drop(columns=["sums", "counts", "seen"])


def _spans(kernels: pd.DataFrame) -> dict[tuple[Any, ...], float]:
    """Per (run, mode): the median over replays of last end - first start."""
    k = kernels.assign(end_ns=kernels["start_ns"] + kernels["dur_ns"])
    per = k.groupby([*RUN_KEYS, "mode", "replay"], sort=False).agg(s=("start_ns", "min"), e=("end_ns", "max"))
    span = (per["e"] - per["s"]).groupby(level=list(range(len(RUN_KEYS) + 1))).median()
    return {tuple(i): float(v) for i, v in span.items()}


def own_times(kernels: pd.DataFrame, steps: pd.DataFrame, positions: dict[tuple[str, int], list[str]] | None = None
              ) -> list[OwnTime]:
    """Every (dtype, variant, rotation, size) with both modes' steps timed: its added time split.
    ``kernels``: one row per traced kernel (``KERNEL_COLUMNS``); ``steps``: the unprofiled
    steps' medians and IQRs (``STEP_COLUMNS``); ``positions``: per (dtype, rotation), the order
    the variants ran in."""
    _need(kernels, KERNEL_COLUMNS, "the kernel table")
    _need(steps, STEP_COLUMNS, "the step table")
    names = _per_name(kernels) if len(kernels) else pd.DataFrame(columns=[*RUN_KEYS, "mode", "name", "time_ns",
                                                                          "launches"])
    spans = _spans(kernels) if len(kernels) else {}
    by_run = {tuple(k): g for k, g in names.groupby(list(RUN_KEYS), sort=False)}
    st = {(*(r[c] for c in RUN_KEYS), r["mode"]): r for r in steps.to_dict("records")}
    out = []
    for key in sorted({k[:-1] for k in st}, key=lambda k: tuple(str(x) for x in k)):
        with_, without = st.get((*key, WITH)), st.get((*key, WITHOUT))
        if with_ is None or without is None:
            continue
        dtype, variant, rotation, size = key
        layers = max(int(with_["layers"]), 1)
        added = (float(with_["median_ns"]) - float(without["median_ns"])) / layers
        iqrs = [_finite(with_["iqr_ns"]), _finite(without["iqr_ns"])]
        spread = math.hypot(*iqrs) / layers if None not in iqrs else None  # type: ignore[arg-type]
        order = (positions or {}).get((str(dtype), int(rotation)), [])
        position = order.index(variant) if variant in order else -1
        split = _split(by_run.get(tuple(key)), layers)
        traced = None
        if (*key, WITH) in spans and (*key, WITHOUT) in spans:
            traced = (spans[(*key, WITH)] - spans[(*key, WITHOUT)]) / layers
        if split is None:
            out.append(OwnTime(str(dtype), str(variant), int(rotation), position, int(size), layers, added, spread,
                               traced, None, None, None, None))
            continue
        write_ns, neighbours, top, top_ns, write_names = split
        gaps = traced - write_ns - neighbours if traced is not None else None
        out.append(OwnTime(str(dtype), str(variant), int(rotation), position, int(size), layers, added, spread,
                           traced, write_ns, neighbours, added - neighbours, gaps, top, top_ns, write_names))
    return out


def _finite(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _split(run: pd.DataFrame | None, layers: int) -> tuple[float, float, str, float | None, list[str]] | None:
    """(write kernels' time, neighbours' change, the neighbour that moved most and by how much,
    the write's kernel names), per layer; None without both modes traced."""
    if run is None:
        return None
    modes = {m: g.set_index("name") for m, g in run.groupby("mode")}
    if WITH not in modes or WITHOUT not in modes:
        return None
    a, b = modes[WITH], modes[WITHOUT]
    all_names = a.index.union(b.index)
    t_a = a["time_ns"].reindex(all_names, fill_value=0.0)
    t_b = b["time_ns"].reindex(all_names, fill_value=0.0)
    n_a = a["launches"].reindex(all_names, fill_value=0.0)
    n_b = b["launches"].reindex(all_names, fill_value=0.0)
    writes = n_a != n_b
    diff = (t_a - t_b) / layers
    write_ns = float(diff[writes].sum())
    others = diff[~writes]
    neighbours = float(others.sum())
    if len(others):
        top = str(others.abs().idxmax())
        top_ns: float | None = float(others[top])
    else:
        top, top_ns = "", None
    return write_ns, neighbours, top, top_ns, sorted(str(n) for n in all_names[writes.to_numpy()])


def _med(xs: list[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return float(np.median(v)) if v else None


def _range(xs: list[float | None]) -> tuple[float, float] | None:
    v = [x for x in xs if x is not None]
    return (float(min(v)), float(max(v))) if v else None


def summarize(rows: list[OwnTime]) -> list[OwnSummary]:
    """Per (dtype, variant, size): the median and range over its captures."""
    groups: dict[tuple[str, str, int], list[OwnTime]] = {}
    for r in rows:
        groups.setdefault((r.dtype, r.variant, r.size), []).append(r)
    out = []
    for (dtype, variant, size), g in sorted(groups.items()):
        added = [r.added_ns for r in g]
        out.append(OwnSummary(
            dtype=dtype, variant=variant, size=size, captures=len(g), added_ns=float(np.median(added)),
            added_range_ns=(float(min(added)), float(max(added))), own_ns=_med([r.own_ns for r in g]),
            own_range_ns=_range([r.own_ns for r in g]), write_kernels_ns=_med([r.write_kernels_ns for r in g]),
            neighbours_ns=_med([r.neighbours_ns for r in g]), neighbours_range_ns=_range([r.neighbours_ns for r in g]),
            gaps_ns=_med([r.gaps_ns for r in g]), added_spread_ns=_med([r.added_spread_ns for r in g]),
        ))
    return out


def runs_spread(kernels: pd.DataFrame, layers: int) -> list[RunsSpread]:
    """Per (dtype, size): the graphs without a write, capture by capture."""
    _need(kernels, KERNEL_COLUMNS, "the kernel table")
    if not len(kernels):
        return []
    names = _per_name(kernels[kernels["mode"] == WITHOUT])
    out = []
    for (dtype, size), g in names.groupby(["dtype", "size"], sort=True):
        g = g.assign(run=g["variant"].astype(str) + "#" + g["rotation"].astype(str))
        table = g.pivot_table(index="name", columns="run", values="time_ns", aggfunc="sum", fill_value=0.0) / layers
        totals = table.sum(axis=0)
        moves = table.max(axis=1) - table.min(axis=1)
        top = str(moves.idxmax()) if len(moves) else ""
        out.append(RunsSpread(str(dtype), int(size), table.shape[1], {str(k): float(v) for k, v in totals.items()},
                              float(totals.max() - totals.min()), top, float(moves.max()) if len(moves) else 0.0))
    return out


@dataclass(frozen=True)
class GenericSaving:
    """A fused quantising write against a generic conversion-then-store write, fp8 cache (ns
    per layer, medians over the captures; spreads: the captures' IQRs in quadrature)."""

    variant: str
    generic: str
    size: int
    saving_ns: float  # generic's added time minus the variant's, fp8 cache
    saving_spread_ns: float | None
    extra_ns: float  # what the generic write's conversion adds: its added time, fp8 minus plain cache
    extra_spread_ns: float | None
    share: float | None  # saving / extra
    saving_range_ns: tuple[float, float]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def generic_savings(rows: list[OwnTime], generic: str, quantised: str, plain: str) -> list[GenericSaving]:
    """Per fused variant and size: what it saves against ``generic`` with a ``quantised`` cache,
    and that against what ``generic``'s conversion launches cost: ``generic``'s added time with
    the ``quantised`` cache minus with the ``plain`` one (the same store with rows of the cache's
    dtype: no conversion). Savings pair the variant and ``generic`` capture by capture."""
    at: dict[tuple[str, str, int, int], OwnTime] = {(r.dtype, r.variant, r.size, r.rotation): r for r in rows}
    out = []
    for size in sorted({r.size for r in rows}):
        gq = [r for r in rows if r.dtype == quantised and r.variant == generic and r.size == size]
        gp = [r for r in rows if r.dtype == plain and r.variant == generic and r.size == size]
        if not gq or not gp:
            continue
        extra = float(np.median([r.added_ns for r in gq])) - float(np.median([r.added_ns for r in gp]))
        extra_spread = _quad(_med([r.added_spread_ns for r in gq]), _med([r.added_spread_ns for r in gp]))
        for variant in sorted({r.variant for r in rows if r.dtype == quantised and r.size == size} - {generic}):
            pairs = [(at[(quantised, generic, size, r.rotation)], r) for r in rows
                     if r.dtype == quantised and r.variant == variant and r.size == size
                     and (quantised, generic, size, r.rotation) in at]
            if not pairs:
                continue
            savings = [g.added_ns - v.added_ns for g, v in pairs]
            spread = _med([_quad(g.added_spread_ns, v.added_spread_ns) for g, v in pairs])
            saving = float(np.median(savings))
            out.append(GenericSaving(variant, generic, size, saving, spread, extra, extra_spread,
                                     saving / extra if extra > 0 else None,
                                     (float(min(savings)), float(max(savings)))))
    return out


def _quad(a: float | None, b: float | None) -> float | None:
    return math.hypot(a, b) if a is not None and b is not None else None


__all__ = ["KERNEL_COLUMNS", "STEP_COLUMNS", "WITH", "WITHOUT", "GenericSaving", "OwnSummary", "OwnTime",
           "RunsSpread", "generic_savings", "own_times", "runs_spread", "summarize"]
