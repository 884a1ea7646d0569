"""KV-write kernels found by name, for traces that carry no kvprof write ranges.

An engine profiled its own way (SGLang's ``/start_profile``, ``bench_one_batch --profile``,
nsys) has no ``set_kv_buffer[...]`` ranges to tie kernels to writes, but its KV-write
kernels have recognisable names. Each GPU kernel is matched against the patterns below
(first match wins; ``--write-kernels REGEX`` adds the user's own, tried first) and, per
trace (= per rank), the matched kernels are counted and timed, writes are estimated from
the kernels one write launches, and the write's share of GPU time is given per step.

Steps are the trace's ``ProfilerStep#N`` ranges (torch.profiler with a schedule) or
kvprof's step ranges, on the GPU side; a trace with neither is one window. Name matching
is a heuristic and says so: ``index_put`` kernels are KV writes only in an engine whose
other code does not use ``index_put`` (SGLang's two-copy path does; so may a model).

Matching is bounded in time: a user's pattern can backtrack catastrophically
(``^(a+)+$``-like nesting took minutes on 41-character names with ``re``), so patterns are
compiled with the ``regex`` package (re's syntax) and every search gets what is left of
MATCH_BUDGET_S (``KVPROF_REGEX_TIMEOUT_S``); past it, a one-line UsageError.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import regex

from kvprof.analysis.engine_steps import GPU_STEPS, find_steps, step_layer_table
from kvprof.analysis.gpu_groups import short_kernel_name
from kvprof.core import variants
from kvprof.core.errors import Setting, UsageError, Words
from kvprof.trace.attribution_parts import untied_replays_warning
from kvprof.trace.intervals import busy_and_overlap

MAX_STEPS_LISTED = 64


@dataclass(frozen=True)
class WritePattern:
    """One family of KV-write kernels: a name regex and kernels per layer write."""

    name: str
    regex: str
    kernels_per_write: int
    source: str

    def compiled(self) -> Any:
        """A ``regex`` pattern: its searches take a timeout."""
        return regex.compile(self.regex)


BUILTIN_PATTERNS: tuple[WritePattern, ...] = (
    # SGLang's JIT kernel behind memory_pool._set_kv_buffer_impl (kernels/jit/csrc/elementwise/kvcache.cuh):
    # store_kvcache_kernel<...> today, store_kvcache<...> in the releases before the rename
    WritePattern("sglang_store_cache", r"\bstore_kvcache(?:_kernel)?\b", 1, "SGLang store_cache (JIT)"),
    # SGLang's MLA write (set_mla_kv_buffer.cuh) and its DCP-masked MHA write (Triton)
    WritePattern("sglang_set_mla_kv_buffer", r"\bset_mla_kv_buffer_kernel\b", 1, "SGLang MLA write"),
    WritePattern("sglang_masked_set_kv_buffer", r"\bmasked_set_kv_buffer_kernel\b", 1, "SGLang DCP-masked write"),
    # SGLang's rope + store (elementwise/rope.cuh): q and k rotated and K/V stored in one launch,
    # for models that fuse the write into the rotary embedding (its rope-only kernel is not a write)
    WritePattern("sglang_fused_rope_store", r"\bfused_rope_store_kernel\b", 1, "SGLang fused rope + store (JIT)"),
    # sgl-kernel's store_kv_cache op (store_kv_cache_256x1 / 128x2 instantiations)
    WritePattern("sgl_kernel_store_kv_cache", r"\bstore_kv_cache(?:_\w+)?\b", 1, "sgl-kernel store_kv_cache"),
    # PyTorch's index_put (tensor[loc] = rows): the two-copy path writes K, then V
    WritePattern("index_put", r"index_put_kernel_impl|index_put_with_sort", 2, "two index_put copies"),
    # vLLM's cache kernels (also SGLang's HND layout path)
    WritePattern("vllm_reshape_and_cache", r"\breshape_and_cache\w*", 1, "vLLM reshape_and_cache"),
    # kvprof's own fused writers: triton_fused's Triton kernel, cuda_fused's and store_kv_fused's
    # CUDA kernel (kvprof::store_kv_kernel<op>), as the variant table names them
    WritePattern("kvprof_fused", "|".join(variants.kvprof_write_kernels()), 1,
                 "kvprof fused write"),
)

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$|^kvprof\.step\[")

# Seconds all the name matching of one trace may take; the built-in patterns need milliseconds
# for thousands of distinct kernel names.
MATCH_BUDGET_S = 5.0
MATCH_BUDGET_ENV = "KVPROF_REGEX_TIMEOUT_S"


def match_budget_s() -> float:
    """MATCH_BUDGET_S, or ``KVPROF_REGEX_TIMEOUT_S`` when set (a UsageError unless positive)."""
    text = os.environ.get(MATCH_BUDGET_ENV, "").strip()
    if not text:
        return MATCH_BUDGET_S
    try:
        budget = float(text)
    except ValueError:
        budget = float("nan")
    if not 0 < budget < float("inf"):
        raise UsageError(f"{MATCH_BUDGET_ENV}={text!r}: expected a positive number of seconds")
    return budget


# the setting the user's pattern is (``kvprof.api.analyze``'s ``write_kernel_regex``)
USER_PATTERN = Setting("write_kernel_regex")


def patterns_with(user_regex: str | None, names: Callable[[str], str] = str) -> list[WritePattern]:
    """The user's pattern (first, one kernel per write; its source is its setting, spelled by
    ``names``) and the built-ins; a bad regex is a UsageError."""
    out = list(BUILTIN_PATTERNS)
    if user_regex:
        try:
            regex.compile(user_regex)
        except (regex.error, OverflowError, RecursionError) as exc:
            raise UsageError(USER_PATTERN, f": not a regular expression ({exc})") from None
        out.insert(0, WritePattern("user", user_regex, 1, Words(USER_PATTERN).render(names)))
    return out


def classify(names: pd.Series, patterns: list[WritePattern], budget_s: float | None = None) -> pd.Series:
    """Pattern name per kernel name (None: not a write kernel), computed once per distinct name,
    within ``budget_s`` seconds in all (default: match_budget_s)."""
    budget = match_budget_s() if budget_s is None else budget_s
    compiled = [(p, p.compiled()) for p in patterns]
    if isinstance(names.dtype, pd.CategoricalDtype) and not (names.cat.codes < 0).any():
        # the event table's names: each distinct one present is made text once, not every row
        used, row_used = np.unique(names.cat.codes.to_numpy(), return_inverse=True)
        distinct = [str(names.cat.categories[c]) for c in used]
        strs = None
    else:
        strs = names.astype(str)
        distinct = list(pd.unique(strs))
    deadline = time.monotonic() + budget
    table: dict[str, str | None] = {}
    for n in distinct:
        table[n] = None
        for p, rx in compiled:
            try:
                hit = rx.search(n, timeout=max(deadline - time.monotonic(), 1e-3))
            except TimeoutError:
                which = (USER_PATTERN, f" {p.regex!r}") if p.name == "user" else (f"the pattern {p.name!r}",)
                raise UsageError(
                    *which, f": matching {len(table):,} kernel names took more than {budget:g} s (nested "
                    f"repeats such as (a+)+ backtrack without end); simplify it, or raise {MATCH_BUDGET_ENV}"
                ) from None
            if hit:
                table[n] = p.name
                break
    if strs is None:
        return pd.Series(np.asarray([table[n] for n in distinct], dtype=object)[row_used], index=names.index,
                         dtype=object)
    return pd.Series([table[n] for n in strs], index=names.index, dtype=object)


def _steps(ev: pd.DataFrame) -> list[tuple[str, int, int]]:
    """GPU-side step windows (label, start, end): ProfilerStep#N or kvprof steps; [] if none."""
    ann = ev[ev["kind"] == "gpu_annotation"]
    if ann.empty:
        return []
    names = ann["name"].astype(str)
    ann = ann[names.str.match(_STEP_RE)]
    if ann.empty:
        return []
    # one window per label: the union of its GPU annotation rows (one per stream)
    g = ann.assign(end=ann["start_ns"] + ann["dur_ns"]).groupby(ann["name"].astype(str))
    rows = [(str(n), int(r["start_ns"].min()), int(r["end"].max())) for n, r in g]
    return sorted(rows, key=lambda r: r[1])


class StepWindows:
    """GPU busy time and the write kernels' part of it (their union: K and V on two streams overlap)
    in [start, end), by kernel start, for many windows: the GPU work sorted by start once, each
    window a slice of it."""

    def __init__(self, work: pd.DataFrame, matched: pd.Series) -> None:
        order = np.argsort(work["start_ns"].to_numpy(), kind="stable")
        self.start = work["start_ns"].to_numpy()[order]
        self.end = self.start + work["dur_ns"].to_numpy()[order]
        self.dur = work["dur_ns"].to_numpy()[order]
        self.stream = work["stream"].to_numpy()[order]
        self.write = matched.notna().to_numpy()[order]

    @staticmethod
    def busy(s: np.ndarray, e: np.ndarray, ln: np.ndarray) -> int:
        """Union of the intervals (starts sorted); one stream's without busy_and_overlap's per-lane work."""
        if not len(s):
            return 0
        if (ln == ln[0]).all():
            reach = np.maximum.accumulate(e)
            new = np.concatenate([[True], s[1:] > reach[:-1]])  # a start past everything before: a new run
            run_end = np.maximum.reduceat(e, np.flatnonzero(new))
            return int((run_end - s[new]).sum())
        return int(busy_and_overlap(s, e, ln)[0])

    def __call__(self, start: int, end: int) -> dict[str, Any]:
        lo, hi = np.searchsorted(self.start, [start, end], side="left")
        s, e, ln, w = self.start[lo:hi], self.end[lo:hi], self.stream[lo:hi], self.write[lo:hi]
        busy = self.busy(s, e, ln)
        write_busy = self.busy(s[w], e[w], ln[w])
        return {"gpu_busy_ns": busy, "write_ns": write_busy, "write_kernel_ns": int(self.dur[lo:hi][w].sum()),
                "write_kernels": int(w.sum()), "share": write_busy / busy if busy else None}


def _pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (a, b) pairs sorted by a then b, and how many rows each has (a lexsort: numpy's
    unique over rows sorts them as bytes, ten times slower)."""
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    new = np.ones(len(a), dtype=bool)
    new[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    first = np.flatnonzero(new)
    return a[first], b[first], np.diff(np.append(first, len(a)))


def _per_step(step: np.ndarray, value: np.ndarray) -> dict[int, np.ndarray]:
    """step -> the distinct values of its rows, sorted."""
    if not len(step):
        return {}
    st, val, _ = _pairs(step, value)
    cut = np.flatnonzero(np.diff(st)) + 1
    return {int(s[0]): v for s, v in zip(np.split(st, cut), np.split(val, cut))}


def _step_rows(found: Any, hit: pd.DataFrame, per: dict[str, WritePattern],
               window: StepWindows) -> list[dict[str, Any]]:
    """One row per step that holds a write (every GPU step range): its writes, layers, replay, window figures."""
    step = found.step_of.to_numpy() if found.step_of is not None else np.full(len(hit), -1)
    layer = found.layer_of.to_numpy() if found.layer_of is not None else np.full(len(hit), -1)
    replay = found.replay_of.to_numpy() if found.replay_of is not None else np.full(len(hit), -1)
    fam_code, fam_names = pd.factorize(hit["family"].astype(str).to_numpy())
    kpw = np.asarray([per[f].kernels_per_write for f in fam_names], dtype=np.int64)
    inside = step >= 0
    step, layer, replay, fam_code = (np.asarray(a)[inside].astype(np.int64) for a in (step, layer, replay, fam_code))
    # writes per step: each family's kernels in the step // its kernels per write, summed over families
    writes: dict[int, int] = {}
    for st, f, k in zip(*(x.tolist() for x in _pairs(step, fam_code))):
        writes[st] = writes.get(st, 0) + k // int(kpw[f])
    known = layer >= 0
    layers = {st: len(v) for st, v in _per_step(step[known], layer[known]).items()}
    replays = _per_step(step, replay)
    rows = []
    for i, st in enumerate(found.steps):
        if found.method != GPU_STEPS and i not in writes:
            continue  # an engine range that launched no write (a scheduling step, a graph without the writes)
        rs = [int(r) for r in replays.get(i, ()) if r >= 0]
        graph = st["graph_launch"] if st["graph_launch"] is not None else (
            None if not rs else rs[0] if len(rs) == 1 else f"{len(rs)} replays")
        row = {"step": st["label"], "start_ns": st["start_ns"], "end_ns": st["end_ns"], "graph_launch": graph,
               "writes": int(writes.get(i, 0)), "layers": int(layers.get(i, 0))}
        if st["start_ns"] is not None and st["end_ns"] is not None:
            row.update(window(int(st["start_ns"]), int(st["end_ns"]) + 1))
        rows.append(row)
    return rows


def _replays_outside_steps(work: pd.DataFrame, hit: pd.DataFrame, found: Any) -> dict[str, int] | None:
    """The graph replays attribution left untied (outside every kvprof step range, no GPU activity
    tied to a kvprof write: kvprof.trace.attribution's count_outside_steps, the same rows), by what
    the KV-write-kernel steps make of them: ``tied`` (every write kernel it replayed has a step and
    a layer), ``untied`` (some have not: ``untied_write_kernels`` of them), ``without_writes`` (it
    replayed no KV-write kernel: the model's work, nothing to tie). None when there are none."""
    if not {"graph_launch", "step", "write_id"} <= set(work.columns):
        return None
    gl = work["graph_launch"].to_numpy()
    outside = (gl >= 0) & (work["step"].to_numpy() < 0)
    if not outside.any():
        return None
    left = np.setdiff1d(np.unique(gl[outside]), gl[outside & (work["write_id"].to_numpy() >= 0)])
    if not len(left):
        return None
    replay = work["graph_launch"].loc[hit.index].to_numpy()
    step = found.step_of.to_numpy() if found.step_of is not None else np.full(len(hit), -1)
    layer = found.layer_of.to_numpy() if found.layer_of is not None else np.full(len(hit), -1)
    mine = np.isin(replay, left)
    untied_kernels = mine & ~((step >= 0) & (layer >= 0))
    with_writes = len(np.unique(replay[mine]))
    untied = len(np.unique(replay[untied_kernels]))
    return {"replays": int(len(left)), "tied": with_writes - untied, "untied": untied,
            "untied_write_kernels": int(untied_kernels.sum()), "without_writes": int(len(left)) - with_writes}


def agree_replay_warnings(warnings: list[str], summary: dict[str, Any]) -> list[str]:
    """``warnings`` with attribution's "N graph replays lie outside kvprof step ranges: ... not tied to
    writes" of each engine trace replaced by what the KV-write-kernel steps (``summary``:
    write_kernel_summary's) leave untied: nothing when they tie every write kernel of those replays
    (the steps table shows them), else one line with the counts."""
    lines: dict[str, str | None] = {}
    for t in summary.get("traces") or []:
        o = (t.get("graph") or {}).get("outside_kvprof_steps")
        if not o:
            continue
        path = t.get("path")
        lines[f"{path}: {untied_replays_warning(o['replays'])}"] = None if not o["untied"] else (
            f"{path}: {o['replays']:,} graph replays lie outside kvprof step ranges and no kvprof write range "
            f"ties them: {o['untied']:,} of them replayed {o['untied_write_kernels']:,} KV-write kernels that "
            f"no forward step and layer holds (the reasons are listed with the write kernels); the steps tie "
            f"every write kernel of {o['tied']:,}, and {o['without_writes']:,} replayed no KV-write kernel")
    out: list[str] = []
    for w in warnings:
        if w not in lines:
            out.append(w)
        elif (line := lines[w]) is not None:
            out.append(line)
    return out


def trace_write_kernels(ev: pd.DataFrame, patterns: list[WritePattern]) -> dict[str, Any]:
    """One trace's KV-write kernels by family, and their share of GPU time per step."""
    work = ev[ev["kind"].isin(["kernel", "memcpy", "memset"])]  # a categorical: compared without a text copy
    kernels = work[work["kind"] == "kernel"]
    ranks = sorted({int(r) for r in ev["rank"].unique()}) if len(ev) else [0]
    out: dict[str, Any] = {"rank": ranks[0] if len(ranks) == 1 else ranks, "gpu": bool(len(work))}
    if kernels.empty:
        out.update(families=[], kernels=[], steps=[], write_kernels=0)
        return out
    fam = classify(kernels["name"], patterns)
    matched = pd.Series(None, index=work.index, dtype=object)
    matched.loc[kernels.index] = fam
    per = {p.name: p for p in patterns}
    hit = kernels[fam.notna()].assign(family=fam[fam.notna()])
    families = []
    for name, g in hit.groupby("family", sort=False):
        p = per[name]
        families.append({
            "family": name, "source": p.source, "regex": p.regex, "kernels": len(g),
            "kernels_per_write": p.kernels_per_write, "writes": len(g) // p.kernels_per_write,
            "total_ns": int(g["dur_ns"].sum()), "mean_ns": float(g["dur_ns"].mean()),
            "median_ns": float(g["dur_ns"].median()),
            "per_write_ns": float(g["dur_ns"].sum()) / max(len(g) // p.kernels_per_write, 1),
        })
    families.sort(key=lambda f: -f["total_ns"])
    by_name = []
    if len(hit):
        names = hit["name"].astype(str)
        short = names.map({n: short_kernel_name(n) for n in pd.unique(names)})  # each distinct name once
        for (fname, kname), g in hit.assign(short=short).groupby(["family", "short"], sort=False):
            by_name.append({"family": fname, "name": kname, "count": len(g), "total_ns": int(g["dur_ns"].sum()),
                            "mean_ns": float(g["dur_ns"].mean())})
        by_name.sort(key=lambda r: -r["total_ns"])
    window = StepWindows(work, matched)  # the whole trace's window and each step's, from one sort
    whole = window(int(work["start_ns"].min()), int((work["start_ns"] + work["dur_ns"]).max()) + 1)
    gpu_steps = _steps(ev)
    found = find_steps(ev, work, hit, {p.name: p.kernels_per_write for p in patterns}, gpu_steps)
    steps = _step_rows(found, hit, per, window)
    shares = [s["share"] for s in steps if s.get("share") is not None]
    graph = dict(found.graph)
    outside = _replays_outside_steps(work, hit, found)
    if outside is not None:
        graph["outside_kvprof_steps"] = outside
    tied = (int(((found.step_of >= 0) & (found.layer_of >= 0)).sum())
            if found.step_of is not None and found.layer_of is not None else 0)
    out.update(
        families=families, kernels=by_name, write_kernels=len(hit),
        writes=sum(f["writes"] for f in families),
        write_ns=whole["write_ns"], write_kernel_ns=whole["write_kernel_ns"], gpu_busy_ns=whole["gpu_busy_ns"],
        share=whole["share"],
        step_source=(("ProfilerStep" if gpu_steps[0][0].startswith("ProfilerStep") else "kvprof.step")
                     if found.method == GPU_STEPS else found.method),
        step_method=found.method, no_steps_reason=found.reason,
        steps_count=len(steps),
        step_share_median=float(np.median(shares)) if shares else None,
        step_share_max=float(np.max(shares)) if shares else None,
        steps=steps[:MAX_STEPS_LISTED],
        tied_step_and_layer=tied, unassigned=[{"reason": r, "kernels": n} for r, n in found.unassigned.items()],
        graph=graph, step_layer=step_layer_table(hit, found),
    )
    return out


def _median(s: pd.Series) -> float | None:
    s = pd.to_numeric(s, errors="coerce").dropna()
    return float(s.median()) if len(s) else None


def stepless_writes(writes: pd.DataFrame | None, ranks: dict[str, Any]) -> list[dict[str, Any]]:
    """Per trace (rank) and variant, the kvprof-ranged writes that no kvprof step encloses.

    SGLang's processes write through kvprof's ranges (its plugin) but have no kvprof step
    ranges, so these writes are in no (phase, size) group; their numbers are here."""
    if writes is None or not len(writes):
        return []
    w = writes[writes["phase"].isna()] if "phase" in writes else writes
    out = []
    for (trace, variant), g in w.groupby(["trace", "variant"], sort=True, observed=True):
        out.append({
            "trace": str(trace), "rank": ranks.get(str(trace)), "variant": str(variant), "writes": len(g),
            "layers": int(g["layer"].nunique()), "graph_writes": int(g["graph"].sum()),
            "kernels_per_write": _median(g["gpu_ops"]), "gpu_span_ns": _median(g["gpu_span_ns"]),
            "gpu_busy_ns": _median(g["gpu_busy_ns"]), "host_ns": _median(g["host_dur_ns"]),
            "launch_delay_ns": _median(g["launch_delay_ns"]),
        })
    return out


def write_kernel_summary(loaded: Any, user_regex: str | None = None,
                         writes: pd.DataFrame | None = None, names: Callable[[str], str] = str) -> dict[str, Any]:
    """``summary["write_kernels"]``: per trace (rank), the name-classified KV-write kernels, and
    the kvprof-ranged writes outside any kvprof step (``writes``: analyze's per-write table;
    ``names``: how the user's pattern's source spells its setting)."""
    from kvprof.trace.table import to_frame

    patterns = patterns_with(user_regex, names)
    traces = []
    for t in loaded.traces:
        ev = to_frame(t.events)
        doc = trace_write_kernels(ev, patterns)
        doc["path"] = t.path
        doc["kvprof_writes"] = int((t.attribution or {}).get("writes", 0) or 0)
        doc["is_kvprof_capture"] = t.is_kvprof
        traces.append(doc)
    sidecars = [sc.to_json() for sc in getattr(loaded, "sidecars", None) or []]
    ranks = {t["path"]: t["rank"] for t in traces}
    # a kvprof capture's writes outside its steps are warm-ups and graph-capture templates
    foreign = {t.path for t in loaded.traces if not t.is_kvprof}
    if writes is not None and len(writes):
        writes = writes[writes["trace"].astype(str).isin(foreign)]
    return {
        "stepless_writes": stepless_writes(writes, ranks),
        "patterns": [{"family": p.name, "regex": p.regex, "kernels_per_write": p.kernels_per_write,
                      "source": p.source} for p in patterns],
        "user_regex": user_regex,
        "traces": traces,
        "sidecars": sidecars,
        "note": "kernels matched by name; index_put counts only as KV writes where nothing else uses it",
    }
