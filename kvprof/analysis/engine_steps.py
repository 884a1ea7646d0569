"""Forward steps and layers of an engine's own trace, found from what the trace holds.

A trace that vLLM's or SGLang's profiler wrote (or an nsys export of such a run) has no kvprof
step or write ranges. Its KV-write kernels are found by name (kvprof.analysis.write_kernels);
this module ties each of them to a forward step and a layer, and says by which method:

1. ``ProfilerStep#N`` or kvprof step ranges on the GPU side (torch.profiler with a schedule);
2. the engine's own step annotations on the host: SGLang's ``step[DECODE bs=8]`` /
   ``step[EXTEND bs=1 toks=128]`` spans (``profile_range`` around each forward), vLLM's
   ``gpu_model_runner: forward`` or its per-batch ``execute_context_<n>(...)_generation_<m>(...)``;
   a kernel belongs to the step whose host range holds the call that launched it (joined by
   correlation id, so a graph-replayed kernel goes with its ``cudaGraphLaunch``/``hipGraphLaunch``);
3. CUDA graph replays: kernels replayed from a graph share the ``cudaGraphLaunch``'s correlation
   id; each replay that holds write kernels is one step; write kernels launched eagerly beside
   them (a piecewise prefill's attention writes) form steps by method 4;
4. the periodic structure of the writes themselves: one write per layer, close together,
   then the longer gap between two forwards (sampling, scheduling). Gaps longer than
   PERIOD_GAP_FACTOR x the median gap cut the writes into groups; where those groups are of
   unlike sizes (a prefill's per-layer gaps are as long as the gaps between decodes), the cut at
   the largest gaps that leaves groups of one size with the clearest break is taken instead;
   accepted when most groups hold the same number of writes.

Within a step the write kernels of a family, sorted by start, are its layers in order
(``kernels_per_write`` kernels each). A step with another number of writes than most steps has
no layer order kvprof can trust: its kernels are listed with that reason. Where no method finds
steps, one line says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvprof.core.schema import GRAPH_LAUNCH_NAMES, LAUNCH_KINDS

# Host step annotations of the engines: (method named in the output, name pattern)
ENGINE_STEP_RANGES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("SGLang step ranges (step[<mode> bs=<n>])", re.compile(r"^step\[[A-Z_]+ bs=\d+")),
    ("vLLM forward ranges (gpu_model_runner: forward)", re.compile(r"^gpu_model_runner: forward$")),
    # the per-batch range of newer vLLM (and of runners patched to name each batch the same way):
    # execute_context_<requests>(<tokens>_<tokens^2>)_generation_<requests>(<tokens>), or with the
    # batch size first, execute_<n>_context_<requests>(...)_generation_<requests>(...)
    ("vLLM execute ranges (execute_context_<n>(...)_generation_<m>(...))",
     re.compile(r"^execute_(?:\d+_)?context_\d+\(.*\)_generation_\d+\(")),
)
GPU_STEPS = "ProfilerStep / kvprof step ranges"
GRAPH_STEPS = "CUDA graph replays (kernels sharing a cudaGraphLaunch's correlation id)"
PERIODIC_STEPS = "periodic write gaps (no step annotation or graph replay holds the writes)"
PERIOD_GAP_FACTOR = 5.0
MIN_PERIODIC_WRITES = 4
MAX_STEP_LAYER_ROWS = 64


@dataclass
class Found:
    """Steps of one trace and, per write kernel (``hit``'s index), its step and layer."""

    method: str | None = None
    reason: str | None = None  # why no steps were found
    steps: list[dict[str, Any]] = field(default_factory=list)  # label, start_ns, end_ns, graph_launch
    step_of: pd.Series | None = None  # step number per write kernel, -1: none
    layer_of: pd.Series | None = None  # layer per write kernel, -1: none
    replay_of: pd.Series | None = None  # correlation of the cudaGraphLaunch that replayed each write kernel, -1
    unassigned: dict[str, int] = field(default_factory=dict)  # reason -> write kernels
    graph: dict[str, Any] = field(default_factory=dict)


def _launches(ev: pd.DataFrame) -> pd.DataFrame:
    """Launch calls by (pid, correlation): host start and whether they replay a graph."""
    kind = ev["kind"]
    lk = ev[kind.isin(LAUNCH_KINDS) & (ev["correlation"] >= 0)]
    out = pd.DataFrame({"pid": lk["pid"].to_numpy(), "correlation": lk["correlation"].to_numpy(),
                        "host_ns": lk["start_ns"].to_numpy(),
                        "graph": lk["name"].isin(GRAPH_LAUNCH_NAMES).to_numpy()})  # categorical: no text copy
    return out.drop_duplicates(["pid", "correlation"])


def _host_of(rows: pd.DataFrame, launches: pd.DataFrame) -> pd.DataFrame:
    """Per GPU row (``rows``' index): the host start of its launch call and whether it is a graph replay."""
    left = pd.DataFrame({"pid": rows["pid"].to_numpy(), "correlation": rows["correlation"].to_numpy(),
                         "row": rows.index.to_numpy()})
    j = left.merge(launches, on=["pid", "correlation"], how="left")
    if len(launches) and launches["pid"].nunique() == 1:  # one host process: the GPU rows' pid may be unset
        miss = j["host_ns"].isna().to_numpy()
        if miss.any():
            by_corr = launches.set_index("correlation")
            hit = j.loc[miss, "correlation"].map(by_corr["host_ns"])
            j.loc[miss, "host_ns"] = hit
            j.loc[miss, "graph"] = j.loc[miss, "correlation"].map(by_corr["graph"])
    j.index = rows.index
    j["graph"] = j["graph"].astype("boolean").fillna(False).astype(bool)
    return j


def _windows(ev: pd.DataFrame, rows: pd.DataFrame, key: np.ndarray) -> dict[int, tuple[int, int]]:
    """GPU window (first start, last end) of each step number in ``key`` (per row of ``rows``)."""
    ok = key >= 0
    if not ok.any():
        return {}
    s = rows["start_ns"].to_numpy()[ok]
    e = s + rows["dur_ns"].to_numpy()[ok]
    k = key[ok]
    frame = pd.DataFrame({"k": k, "s": s, "e": e}).groupby("k").agg(s=("s", "min"), e=("e", "max"))
    return dict(zip(frame.index.tolist(), zip(frame["s"].tolist(), frame["e"].tolist())))


def _in_ranges(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Index of the range (sorted by start, not overlapping) holding each time; -1 for none."""
    pos = np.searchsorted(starts, t, side="right") - 1
    ok = (pos >= 0) & ~np.isnan(t)
    posc = np.where(ok, pos, 0)
    ok &= t < ends[posc] if len(ends) else False
    return np.where(ok, pos, -1)


def _by_gpu_steps(ev: pd.DataFrame, work: pd.DataFrame, gpu_steps: list[tuple[str, int, int]]
                  ) -> tuple[list[dict[str, Any]], np.ndarray]:
    starts = np.asarray([s for _, s, _ in gpu_steps], dtype=np.float64)
    ends = np.asarray([e for _, _, e in gpu_steps], dtype=np.float64)
    key = _in_ranges(work["start_ns"].to_numpy().astype(np.float64), starts, ends)
    steps = [{"label": label, "start_ns": s, "end_ns": e, "graph_launch": None} for label, s, e in gpu_steps]
    return steps, key


def _by_host_ranges(ev: pd.DataFrame, work: pd.DataFrame, host: pd.DataFrame
                    ) -> tuple[str, list[dict[str, Any]], np.ndarray] | None:
    ann = ev[ev["kind"] == "cpu_annotation"]
    if ann.empty:
        return None
    names = ann["name"].astype(str)
    distinct = pd.unique(names)
    for method, rx in ENGINE_STEP_RANGES:
        m = names.isin([n for n in distinct if rx.match(n)]).to_numpy(dtype=bool)  # each distinct name once
        if not m.any():
            continue
        r = ann[m].sort_values("start_ns", kind="stable")
        labels = names[m].loc[r.index].tolist()
        key = np.full(len(work), -1, np.int64)
        t = host["host_ns"].to_numpy(dtype=np.float64)
        wpid = work["pid"].to_numpy()
        rpid = r["pid"].to_numpy()
        for pid in np.unique(rpid):
            sel = np.flatnonzero(rpid == pid)
            starts = r["start_ns"].to_numpy()[sel].astype(np.float64)
            ends = starts + r["dur_ns"].to_numpy()[sel]
            mine = (wpid == pid) | (len(np.unique(rpid)) == 1)
            idx = _in_ranges(t, starts, ends)
            key = np.where(mine & (idx >= 0), np.where(idx >= 0, sel[np.maximum(idx, 0)], -1), key)
        rs, rd = r["start_ns"].tolist(), r["dur_ns"].tolist()
        steps = [{"label": label, "start_ns": s0, "end_ns": s0 + d, "graph_launch": None, "from_work": True}
                 for label, s0, d in zip(labels, rs, rd)]
        return method, steps, key
    return None


def _by_replays(work: pd.DataFrame, host: pd.DataFrame, is_write: np.ndarray
                ) -> tuple[list[dict[str, Any]], np.ndarray] | None:
    graph = host["graph"].to_numpy()
    corr = work["correlation"].to_numpy()
    pid = work["pid"].to_numpy()
    with_writes = graph & is_write
    if not with_writes.any():
        return None
    replays = pd.DataFrame({"pid": pid[with_writes], "corr": corr[with_writes],
                            "t": host["host_ns"].to_numpy()[with_writes]}).groupby(["pid", "corr"])["t"].min()
    replays = replays.sort_values(kind="stable")
    number = pd.Series(np.arange(len(replays)), index=replays.index)
    at = pd.MultiIndex.from_arrays([pid, corr])
    key = np.where(graph, number.reindex(at).fillna(-1).to_numpy(dtype=np.int64), -1)
    steps = [{"label": f"replay {i} (cudaGraphLaunch correlation {int(c)})", "start_ns": None, "end_ns": None,
              "graph_launch": int(c), "from_work": True} for i, (_, c) in enumerate(replays.index)]
    return steps, key


def _by_period(work: pd.DataFrame, is_write: np.ndarray) -> tuple[list[dict[str, Any]], np.ndarray] | str:
    w = work[is_write].sort_values("start_ns", kind="stable")
    n = len(w)
    if n < MIN_PERIODIC_WRITES:
        return f"{n} write kernels: too few to find a period in"
    s = w["start_ns"].to_numpy()
    e = s + w["dur_ns"].to_numpy()
    gaps = s[1:] - np.maximum.accumulate(e)[:-1]
    med = float(np.median(np.maximum(gaps, 0)))
    cut = gaps > max(PERIOD_GAP_FACTOR * med, 1.0)
    group = np.concatenate([[0], np.cumsum(cut)])
    sizes = np.bincount(group)
    even = _equal_groups(gaps) if (sizes != sizes[0]).any() else None
    if even is not None:  # a prefill's long per-layer gaps cut it apart; the largest gaps part the forwards
        group = even
        sizes = np.bincount(group)
    if len(sizes) < 2:
        return (f"the {n:,} write kernels run without a gap longer than {PERIOD_GAP_FACTOR:g}x their median gap "
                f"({med / 1000:.1f} µs): one forward, or no periodic structure")
    mode = int(np.bincount(sizes).argmax())
    if (sizes == mode).sum() * 2 < len(sizes) or mode < 2:
        return (f"the gaps between the {n:,} write kernels cut them into {len(sizes)} groups of unlike sizes "
                f"(most common {mode}, in {(sizes == mode).sum()} groups), and no cut at their largest gaps "
                "makes groups of one size: no periodic structure")
    key_w = pd.Series(group, index=w.index)
    key = key_w.reindex(work.index).fillna(-1).to_numpy(dtype=np.int64)
    firsts = [int(s[group == g][0]) for g in range(len(sizes))]
    steps = []
    for g in range(len(sizes)):
        end = firsts[g + 1] if g + 1 < len(sizes) else int(e[group == g].max())
        steps.append({"label": f"forward {g} (periodic)", "start_ns": firsts[g], "end_ns": end, "graph_launch": None})
    return steps, key


def _equal_groups(gaps: np.ndarray) -> np.ndarray | None:
    """Group number per write where cutting at the g-1 largest gaps parts the writes into g groups of
    one size (>= 2 writes); of those cuts, the one with the clearest break (its shortest cut gap over
    the longest gap left inside a group, which must be > 1). Forwards of unlike kind (a prefill's
    writes spread over milliseconds, a decode's close together) have unlike gaps inside them, but
    one number of layers; cutting fewer gaps than there are forwards would merge some, and leave a
    gap as long as the cut ones inside a group."""
    n = len(gaps) + 1
    order = np.argsort(-gaps, kind="stable")
    best: tuple[float, np.ndarray] | None = None
    for g in range(2, n // 2 + 1):
        if n % g:
            continue
        shortest_cut, longest_kept = float(gaps[order[g - 2]]), float(gaps[order[g - 1]])
        clear = shortest_cut / longest_kept if longest_kept > 0 else float("inf")
        if clear <= 1.0 or (best is not None and clear <= best[0]):
            continue
        size = n // g
        if np.array_equal(np.sort(order[: g - 1]), np.arange(size - 1, n - 1, size)):  # gap i follows write i
            best = (clear, np.arange(n) // size)
    return None if best is None else best[1]


def find_steps(ev: pd.DataFrame, work: pd.DataFrame, hit: pd.DataFrame, kernels_per_write: dict[str, int],
               gpu_steps: list[tuple[str, int, int]]) -> Found:
    """Steps of the trace and each write kernel's step and layer (``hit``: the write kernels, a
    ``family`` column, rows of ``work``)."""
    found = Found()
    launches = _launches(ev)
    host = _host_of(work, launches)
    is_write = work.index.isin(hit.index)
    gl = ev[ev["kind"].isin(LAUNCH_KINDS) & ev["name"].isin(GRAPH_LAUNCH_NAMES)]
    graph = host["graph"].to_numpy()
    found.graph = {
        "launches": int(len(gl)),
        "replayed_kernels": int((graph & (work["kind"] == "kernel").to_numpy()).sum()),
        "replayed_write_kernels": int((graph & is_write).sum()),
        "replays_with_writes": int(len(pd.unique(work["correlation"].to_numpy()[graph & is_write]))),
    }
    found.replay_of = pd.Series(np.where(graph, work["correlation"].to_numpy(), -1), index=work.index).loc[hit.index]
    key: np.ndarray | None = None
    if gpu_steps:
        found.method = GPU_STEPS
        found.steps, key = _by_gpu_steps(ev, work, gpu_steps)
    if key is None:
        by_host = _by_host_ranges(ev, work, host)
        if by_host is not None:
            found.method, found.steps, key = by_host
    if key is None:
        by_replay = _by_replays(work, host, is_write)
        if by_replay is not None:
            found.method = GRAPH_STEPS
            found.steps, key = by_replay
            # writes launched eagerly beside the replays (a prefill outside the graphs): their own forwards
            eager = is_write & (key < 0)
            by_period = _by_period(work, eager) if eager.sum() >= MIN_PERIODIC_WRITES else None
            if by_period is not None and not isinstance(by_period, str):
                more, pkey = by_period
                key = np.where(pkey >= 0, pkey + len(found.steps), key)
                found.steps += more
                found.method = f"{GRAPH_STEPS}; the eager writes by {PERIODIC_STEPS.split(' (')[0]}"
    if key is None:
        by_period = _by_period(work, is_write)
        if isinstance(by_period, str):
            found.reason = f"no forward steps found: no step annotation, no graph replay holds a write, and {by_period}"
            found.step_of = pd.Series(-1, index=hit.index)
            found.layer_of = pd.Series(-1, index=hit.index)
            found.unassigned = {found.reason: len(hit)} if len(hit) else {}
            return found
        found.method = PERIODIC_STEPS
        found.steps, key = by_period
    assert key is not None
    win = _windows(ev, work, key)
    for i, st in enumerate(found.steps):
        if st.pop("from_work", False) and i in win:  # the GPU work the step holds (a host range: its launches')
            st["start_ns"], st["end_ns"] = win[i]
    step_of = pd.Series(key, index=work.index).loc[hit.index]
    found.step_of = step_of
    found.layer_of, found.unassigned = _layers(hit, step_of, kernels_per_write, found.method or "")
    return found


def _layers(hit: pd.DataFrame, step_of: pd.Series, kpw: dict[str, int], method: str
            ) -> tuple[pd.Series, dict[str, int]]:
    """Layer of each write kernel by its order within its step and family; reasons for the rest."""
    layer = pd.Series(-1, index=hit.index, dtype=np.int64)
    reasons: dict[str, int] = {}
    outside = int((step_of < 0).sum())
    if outside:
        why = ("launched outside every step range" if not method.startswith(GRAPH_STEPS)
               else "launched eagerly, not from a CUDA graph replay, and no step annotation holds it")
        reasons[why] = outside
    inside = hit[(step_of >= 0).to_numpy()].assign(step=step_of[step_of >= 0])
    for fam, g in inside.groupby("family", sort=False):
        per = max(int(kpw.get(str(fam), 1)), 1)
        g = g.sort_values(["step", "start_ns"], kind="stable")
        order = g.groupby("step").cumcount().to_numpy()
        counts = g.groupby("step")["step"].transform("size").to_numpy()
        mode = int(pd.Series(counts).mode().iloc[0]) if len(counts) else 0
        ok = counts == mode
        layer.loc[g.index[ok]] = order[ok] // per
        bad = int((~ok).sum())
        if bad:
            reasons[f"{fam}: its step holds another number of write kernels than most steps ({mode}): "
                    "layer order not known"] = bad
    return layer, reasons


def step_layer_table(hit: pd.DataFrame, found: Found) -> dict[str, Any]:
    """Write time per step (first MAX_STEP_LAYER_ROWS) and layer, ns; per layer its kernels and mean."""
    if found.step_of is None or found.layer_of is None or not len(hit):
        return {"layers": [], "rows": [], "per_layer": []}
    t = pd.DataFrame({"step": found.step_of.to_numpy(), "layer": found.layer_of.to_numpy(),
                      "dur": hit["dur_ns"].to_numpy()})
    t = t[(t["step"] >= 0) & (t["layer"] >= 0)]
    if t.empty:
        return {"layers": [], "rows": [], "per_layer": []}
    per_layer = t.groupby("layer")["dur"].agg(["size", "mean", "sum"])
    pivot = t.groupby(["step", "layer"])["dur"].sum().unstack("layer")
    layers = [int(x) for x in pivot.columns]
    rows = []
    for step, r in pivot.head(MAX_STEP_LAYER_ROWS).iterrows():
        rows.append({"step": found.steps[int(step)]["label"],
                     "ns": [None if pd.isna(v) else int(v) for v in r.to_numpy()]})
    return {"layers": layers, "rows": rows,
            "per_layer": [{"layer": int(i), "kernels": int(r["size"]), "mean_ns": float(r["mean"]),
                           "total_ns": int(r["sum"])} for i, r in per_layer.iterrows()]}
