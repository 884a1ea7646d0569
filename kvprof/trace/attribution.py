"""Tie GPU activity to the kvprof write that caused it.

Three ways, tried in this order, each recorded per row (``attribution``) and counted in
``Trace.attribution`` so a report always says which one produced its numbers:

- eager writes (``correlation``): a kernel belongs to the innermost kvprof write range
  whose host interval contains the runtime/driver call that launched it (same process,
  same thread, joined by correlation id);
- graph replays with node ids (``graph_node``, nsys with --cuda-graph-trace=node): a
  replayed kernel's node is followed back (originalGraphNodeId) to the node created at
  capture time, and that creation is tied to the write range open on the capturing
  thread at that moment;
- graph replays without node ids (``graph_order``, Kineto): the capture metadata gives
  the layer order and how many GPU activities one write launches; writes are serialized
  inside a replay, so the replay's activities sorted by start are cut into groups of
  that size, one per layer in order. When the count does not divide that way the
  replay's activities stay unattributed and a warning says so: never a silent guess.
- an engine's graph replays (``graph_order`` too; SGLang with kvprof's plugin): the
  plugin's sidecar lists, per captured graph, the writes captured into it in order, each
  with its kernel's name; a replay's kernels of those names, sorted by start, are the
  writes in that order (``kvprof.trace.plugin_graphs``). The replay's other kernels (the
  model's) are not writes and stay unattributed.

Each replay of each layer is a write of its own (new write_id) with the step of the
cudaGraphLaunch call that replayed it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvprof.core.run import TraceMeta
from kvprof.core.schema import GPU_WORK_KINDS, GRAPH_LAUNCH_NAMES, LAUNCH_KINDS
from kvprof.core.sidecar import Sidecar
from kvprof.core.vocab import (
    NVTX_DOMAIN,
    STEP_RANGE_PATTERN,
    UNNAMED_VARIANT,
    WRITE_RANGE_LOOKALIKE,
    WRITE_RANGE_PATTERN,
)
from kvprof.trace.attribution_parts import (
    dedupe,
    dominant_method,
    during_capture,
    per_write_template,
    untied_replays_warning,
)
from kvprof.trace.intervals import enclosing
from kvprof.trace.model import Trace
from kvprof.trace.plugin_graphs import PluginGraphs
from kvprof.trace.table import from_frame, to_frame

WRITE_INDEX_COLUMNS = (
    "write_id", "variant", "layer", "tokens", "phase", "size", "step", "attribution",
    "pid", "tid", "host_start_ns", "host_dur_ns", "graph_launch", "launch_start_ns", "launch_dur_ns",
    "during_capture",
)
STEP_COLUMNS = ("variant", "phase", "size", "step", "pid", "tid", "start_ns", "dur_ns", "graph_launches")


def parse_names(names: pd.Series, pattern: str) -> pd.DataFrame:
    """Regex groups for each row's name, computed once per distinct name (names are categorical)."""
    cat = names.astype("category")
    cats = pd.Series(cat.cat.categories.astype(str))
    parsed = cats.str.extract(pattern)
    codes = cat.cat.codes.to_numpy()
    out = parsed.iloc[np.where(codes < 0, 0, codes)].reset_index(drop=True)
    out[codes < 0] = np.nan
    out.index = names.index
    return out


def _tokens_of(phase: Any, size: Any) -> int:
    """Tokens a write moves when the range carries no payload: decode bs=N and prefill tokens=N both mean N."""
    try:
        return int(size)
    except (TypeError, ValueError):
        return -1


def _kvprof_ranges(df: pd.DataFrame) -> pd.DataFrame:
    """Host annotations that may be kvprof ranges (Kineto: all; nsys: domain kvprof only)."""
    m = df["kind"] == "cpu_annotation"
    dom = df["domain"]
    m &= dom.isna() | (dom == NVTX_DOMAIN)
    return df[m]


def _graph_roots(nodes: pd.DataFrame) -> dict[int, tuple[int, int, int]]:
    """node id -> (pid, tid, creation time) of the capture-time node it descends from."""
    parent: dict[int, int] = {}
    created: dict[int, tuple[int, int, int]] = {}
    for node, orig, start, pid, tid in nodes[["node", "original", "start_ns", "pid", "tid"]].itertuples(index=False):
        if orig >= 0:
            parent[int(node)] = int(orig)
        elif int(node) not in created:
            created[int(node)] = (int(pid), int(tid), int(start))
    roots: dict[int, tuple[int, int, int]] = {}
    for node in set(parent) | set(created):
        cur, seen = node, set()
        while cur in parent and cur not in seen:
            seen.add(cur)
            cur = parent[cur]
        if cur in created:
            roots[node] = created[cur]
    return roots


def _overlap_across_streams(starts: np.ndarray, ends: np.ndarray, streams: np.ndarray, devices: np.ndarray) -> bool:
    """Whether a write (row) began before an activity of the write before it ended on
    another stream: then two streams ran at once and their starts may interleave, so cutting
    the replay by start order can mix layers. On one stream the starts keep launch order even
    where a kernel begins before its predecessor ends (programmatic dependent launch: the
    analysis reports that as PDL overlap, ``kvprof.analysis.early_start``), so that overlap
    cannot mix layers."""
    other = (streams[1:, :, None] != streams[:-1, None, :]) | (devices[1:, :, None] != devices[:-1, None, :])
    early = starts[1:, :, None] < ends[:-1, None, :]
    return bool((other & early).any())


class _Attributor:
    def __init__(self, trace: Trace, fallback_meta: TraceMeta | None,
                 sidecars: list[Sidecar] | None = None) -> None:
        self.trace = trace
        self.sidecars = [] if trace.is_kvprof else list(sidecars or [])
        self.meta = trace.kvprof or fallback_meta
        self.df = to_frame(trace.events)
        self.df["end_ns"] = self.df["start_ns"] + self.df["dur_ns"]
        # numpy views, taken once: per-replay work must not touch whole columns again
        self.a_start = self.df["start_ns"].to_numpy()
        self.a_end = self.df["end_ns"].to_numpy()
        self.a_dur = self.df["dur_ns"].to_numpy()
        self.a_pid = self.df["pid"].to_numpy()
        self.a_tid = self.df["tid"].to_numpy()
        self.a_node = self.df["graph_node"].to_numpy()
        self.a_kind = np.asarray(self.df["kind"], dtype=object)  # the kinds' text, no string column made
        self.a_stream = self.df["stream"].to_numpy()
        self.a_device = self.df["device"].to_numpy()
        self.warnings: list[str] = []
        self.counts: dict[str, int] = {}
        n = len(self.df)
        self.write_id = np.full(n, -1, np.int64)
        self.layer = np.full(n, -1, np.int32)
        self.tokens = np.full(n, -1, np.int32)
        self.size = np.full(n, -1, np.int32)
        self.step = np.full(n, -1, np.int32)
        self.graph_launch = np.full(n, -1, np.int64)
        self.variant = np.full(n, None, dtype=object)
        self.phase = np.full(n, None, dtype=object)
        self.how = np.full(n, None, dtype=object)
        self.write_rows: list[dict[str, Any]] = []
        self.launch_rows: dict[int, int] = {}

    # -- ranges --------------------------------------------------------------------------
    def ranges(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        rng = _kvprof_ranges(self.df)
        w = parse_names(rng["name"], WRITE_RANGE_PATTERN)
        s = parse_names(rng["name"], STEP_RANGE_PATTERN)
        wm = w["base"].notna().to_numpy()
        sm = s["phase"].notna().to_numpy()
        self.count_lookalikes(rng.index[wm])
        # the name family's optional parts (kvprof.core.vocab): variant, layer, tokens
        default = (self.meta.variant if self.meta else None) or UNNAMED_VARIANT
        cat = rng["category"].to_numpy(dtype=object)[wm]
        variant = [v if isinstance(v, str) else (c if isinstance(c, str) else default)
                   for v, c in zip(w["variant"].to_numpy(dtype=object)[wm], cat)]
        layer = w["layer"].fillna("-1").to_numpy()[wm]
        named_tokens = pd.to_numeric(w["tokens"], errors="coerce").fillna(-1).to_numpy(dtype=np.int64)[wm]
        payload = rng["payload"].to_numpy()[wm]
        # plain arrays: assigning Series to an empty frame would adopt their index (pandas 3)
        writes = rng[wm].assign(w_variant=np.asarray(variant, dtype=object), w_layer=layer,
                                payload=np.where(payload >= 0, payload, named_tokens))
        steps = rng[sm].assign(s_phase=s["phase"].to_numpy()[sm], s_size=s["size"].to_numpy()[sm],
                               s_step=s["step"].to_numpy()[sm])
        return (writes.sort_values(["start_ns", "pid", "tid"], kind="stable"),
                steps.sort_values("start_ns", kind="stable"))

    def count_lookalikes(self, accepted: pd.Index) -> None:
        """Host ranges that mention set_kv_buffer but are not in the accepted name family (or
        sit in another NVTX domain): counted and named, so a trace is never "writes 0" in silence."""
        df = self.df
        ann = df[df["kind"] == "cpu_annotation"]
        names = ann["name"].astype(str)
        looks = names.str.contains(WRITE_RANGE_LOOKALIKE, case=False, regex=False) & ~ann.index.isin(accepted)
        n = int(looks.sum())
        if not n:
            return
        examples = sorted(set(names[looks]))[:3]
        self.counts["write_ranges_unrecognised"] = n
        self.warnings.append(
            f"{n:,} ranges mention set_kv_buffer but are not kvprof write ranges (e.g. "
            f"{', '.join(repr(e[:60]) for e in examples)}); they are not counted as writes. Accepted: "
            "'set_kv_buffer[<variant>] L<layer>', with [<variant>], ' L<layer>' and ' tokens=<n>' optional, "
            f"in NVTX domain {NVTX_DOMAIN!r} or none")

    def count_outside_steps(self) -> None:
        """Writes and graph replays that no kvprof step range encloses: said, with counts."""
        outside = sum(1 for r in self.write_rows if not r.get("during_capture")  # capture templates: not measured
                      and (r.get("phase") is None or r.get("size", -1) < 0))
        if outside:
            self.counts["writes_outside_steps"] = outside
        # a kvprof capture's own writes outside its steps are warm-ups (the side-stream step
        # before each graph capture): counted, not warned about
        if outside and self.meta is None:
            self.warnings.append(
                f"{outside:,} writes lie outside kvprof step ranges (kvprof.step[...]): they have no phase or size, "
                "so the per-phase tables leave them out")
        work = (self.graph_launch >= 0) & self.df["kind"].isin(GPU_WORK_KINDS).to_numpy() & (self.step < 0)
        launches = np.unique(self.graph_launch[work])
        replays = int(len(launches))
        if replays:
            self.counts["replays_outside_steps"] = replays
            # an engine's replays whose writes the plugin's graph record tied to their kernels
            tied = np.unique(self.graph_launch[work & (self.write_id >= 0)])
            left = replays - int(len(tied))
            if left:
                self.warnings.append(untied_replays_warning(left))

    def step_variant(self, steps: pd.DataFrame, writes: pd.DataFrame) -> list[str | None]:
        default = self.meta.variant if self.meta else None
        if default is None and len(writes):  # no metadata (an nsys export alone): the writes' variant
            default = str(writes["w_variant"].astype(str).mode().iloc[0])
        # step and phase ranges carry the category "kvprof" (write ranges carry the variant)
        return [c if isinstance(c, str) and c != NVTX_DOMAIN else default for c in steps["category"]]

    # -- main ----------------------------------------------------------------------------
    def run(self) -> Trace:
        df = self.df
        writes, steps = self.ranges()
        step_var = self.step_variant(steps, writes)
        self.steps = steps
        # steps of every host row (and of the write ranges)
        host = df[df["device"] < 0]
        host_step = enclosing(host, steps)
        hi = host.index.to_numpy()
        has = host_step >= 0
        if len(steps):
            self.phase[hi[has]] = steps["s_phase"].to_numpy()[host_step[has]]
            self.size[hi[has]] = steps["s_size"].astype(int).to_numpy()[host_step[has]]
            self.step[hi[has]] = steps["s_step"].astype(int).to_numpy()[host_step[has]]
            self.variant[hi[has]] = np.asarray(step_var, dtype=object)[host_step[has]]
        self.eager(writes, host)
        self.gpu_by_correlation()
        self.replays(writes, steps)
        if any(sc.graphs for sc in self.sidecars):
            self.plugin_replays()
        self.count_outside_steps()
        self.counts["writes"] = len(self.write_rows)
        if self.trace.is_kvprof or len(writes) or len(steps):
            if not len(writes) and not (self.graph_launch >= 0).any():
                self.warnings.append("no kvprof write ranges found: per-write numbers are empty")
        return self.finish(steps, step_var)

    def eager(self, writes: pd.DataFrame, host: pd.DataFrame) -> None:
        df = self.df
        if not len(writes):
            return
        wid = np.arange(len(writes), dtype=np.int64)
        wi = writes.index.to_numpy()
        phase = self.phase[wi]
        size = self.size[wi]
        step = self.step[wi]
        payload = writes["payload"].to_numpy()
        tokens = np.where(payload >= 0, payload, [_tokens_of(p, s) if s >= 0 else -1 for p, s in zip(phase, size)])
        layer = writes["w_layer"].astype(int).to_numpy()
        variant = writes["w_variant"].astype(str).to_numpy()
        # host rows inside write ranges (the ranges themselves included)
        inside = enclosing(host, writes)
        hi = host.index.to_numpy()
        m = inside >= 0
        rows = hi[m]
        self.write_id[rows] = wid[inside[m]]
        self.layer[rows] = layer[inside[m]]
        self.tokens[rows] = tokens[inside[m]]
        self.variant[rows] = variant[inside[m]]
        self.how[rows] = "range"
        self.counts["range"] = int(m.sum())
        captured = during_capture(df, writes)
        rows = pd.DataFrame({
            "write_id": wid, "variant": variant, "layer": layer.astype(np.int64), "tokens": tokens.astype(np.int64),
            "phase": phase, "size": size.astype(np.int64), "step": step.astype(np.int64), "attribution": "correlation",
            "pid": writes["pid"].to_numpy(), "tid": writes["tid"].to_numpy(),
            "host_start_ns": writes["start_ns"].to_numpy(), "host_dur_ns": writes["dur_ns"].to_numpy(),
            "graph_launch": -1, "launch_start_ns": -1, "launch_dur_ns": -1, "during_capture": captured,
        })
        self.write_rows.extend(rows.to_dict(orient="records"))
        del df

    def gpu_by_correlation(self) -> None:
        df = self.df
        corr = df["correlation"].to_numpy()
        # rows by position (the frame's index is its row numbers): no copy of the frame's other columns
        launch = np.flatnonzero(df["kind"].isin(LAUNCH_KINDS).to_numpy() & (corr >= 0))
        gpu = np.flatnonzero((df["device"].to_numpy() >= 0) & (corr >= 0))
        if not len(launch) or not len(gpu):
            return
        lk = pd.DataFrame({"pid": self.a_pid[launch], "correlation": corr[launch],
                           "lrow": launch}).drop_duplicates(["pid", "correlation"], keep="first")
        gk = pd.DataFrame({"pid": self.a_pid[gpu], "correlation": corr[gpu], "grow": gpu})
        j = gk.merge(lk, on=["pid", "correlation"], how="inner")
        g, lrow = j["grow"].to_numpy(), j["lrow"].to_numpy()
        self.phase[g] = self.phase[lrow]
        self.size[g] = self.size[lrow]
        self.step[g] = self.step[lrow]
        self.variant[g] = self.variant[lrow]
        is_graph = df["name"].isin(GRAPH_LAUNCH_NAMES).to_numpy()[lrow]
        self.graph_launch[g[is_graph]] = df["correlation"].to_numpy()[lrow[is_graph]]
        eager = ~is_graph & (self.write_id[lrow] >= 0)
        ge, le = g[eager], lrow[eager]
        self.write_id[ge] = self.write_id[le]
        self.layer[ge] = self.layer[le]
        self.tokens[ge] = self.tokens[le]
        self.how[ge] = "correlation"
        self.counts["correlation"] = int(eager.sum())
        # correlation -> its launch row; a correlation met again (another process) keeps the last row
        key, row = corr[lrow[is_graph]][::-1], lrow[is_graph][::-1]
        key, last = np.unique(key, return_index=True)
        self.launch_rows = dict(zip(key.tolist(), row[last].tolist()))

    def replays(self, writes: pd.DataFrame, steps: pd.DataFrame) -> None:
        df = self.df
        work = (self.graph_launch >= 0) & df["kind"].isin(GPU_WORK_KINDS).to_numpy() & (self.step >= 0)
        if not work.any():
            return
        rows = np.flatnonzero(work)
        launches = pd.Series(rows).groupby(self.graph_launch[rows]).apply(list)
        nodes = self.trace.graph_nodes
        have_nodes = nodes is not None and len(nodes) and (df["graph_node"].to_numpy()[rows] >= 0).all()
        roots = _graph_roots(nodes) if have_nodes else {}
        next_id = len(self.write_rows)
        bad = 0
        for corr, grp in launches.items():
            grp = np.asarray(grp)
            lrow = self.launch_rows.get(corr)
            if have_nodes:
                made, next_id = self._by_node(grp, lrow, writes, roots, next_id)
            else:
                made, next_id = self._by_order(grp, lrow, next_id)
            bad += not made
        self.counts["replays"] = len(launches)
        if bad:
            self.counts["replays_unattributed"] = bad

    def plugin_replays(self) -> None:
        """An engine's graph replays outside kvprof steps, tied to writes by the plugin's record
        of each captured graph (``PluginGraphs``): one write per recorded write, in order."""
        work = (self.graph_launch >= 0) & self.df["kind"].isin(GPU_WORK_KINDS).to_numpy() & (self.step < 0) \
            & (self.write_id < 0)
        if not work.any():
            return
        rows = np.flatnonzero(work)
        launches = pd.Series(rows).groupby(self.graph_launch[rows]).apply(list)
        graphs = PluginGraphs(self.df, self.sidecars)
        graphs.locate([r for r in (self.launch_rows.get(c) for c in launches.index) if r is not None])
        next_id = len(self.write_rows)
        tied = 0
        for corr, grp in launches.items():
            grp = np.asarray(grp)
            lrow = self.launch_rows.get(corr)
            found = graphs.writes_of(grp, lrow, int(corr), self.a_start, self.a_end)
            if found is None:
                continue
            for rows_i, w in found:
                self._new_write(rows_i, lrow, w.variant, w.layer, w.tokens, "graph_order", next_id)
                next_id += 1
            tied += 1
        self.warnings.extend(graphs.warnings)
        if tied:
            self.counts["plugin_replays"] = tied

    def _new_write(self, rows: np.ndarray, lrow: int | None, variant: str, layer: int, tokens: int,
                   method: str, wid: int) -> None:
        self.write_id[rows] = wid
        self.layer[rows] = layer
        self.tokens[rows] = tokens
        self.variant[rows] = variant
        self.how[rows] = method
        first = rows[0]
        self.counts[method] = self.counts.get(method, 0) + len(rows)
        self.write_rows.append({
            "write_id": wid, "variant": variant, "layer": layer, "tokens": tokens,
            "phase": self.phase[first], "size": int(self.size[first]), "step": int(self.step[first]),
            "attribution": method, "pid": int(self.a_pid[lrow]) if lrow is not None else -1,
            "tid": int(self.a_tid[lrow]) if lrow is not None else -1, "host_start_ns": -1, "host_dur_ns": -1,
            "graph_launch": int(self.graph_launch[first]),
            "launch_start_ns": int(self.a_start[lrow]) if lrow is not None else -1,
            "launch_dur_ns": int(self.a_dur[lrow]) if lrow is not None else -1,
            "during_capture": False,
        })

    def _by_node(self, grp: np.ndarray, lrow: int | None, writes: pd.DataFrame,
                 roots: dict[int, tuple[int, int, int]], next_id: int) -> tuple[bool, int]:
        node = self.a_node[grp]
        created = [roots.get(int(n)) for n in node]
        ok = np.array([c is not None for c in created])
        if not ok.any():
            self.warnings.append(
                f"graph replay (launch correlation {int(self.graph_launch[grp[0]])}): none of its {len(grp)} "
                "kernels' graph nodes was created inside the profiled window; they stay unattributed "
                "(capture the graph inside the nsys capture range)")
            return False, next_id
        probe = pd.DataFrame({
            "pid": [c[0] if c else -1 for c in created], "tid": [c[1] if c else -1 for c in created],
            "start_ns": [c[2] if c else -1 for c in created], "end_ns": [c[2] if c else -1 for c in created],
        })
        wpos = enclosing(probe, writes)
        wpos[~ok] = -1
        if (wpos < 0).any() and (self.meta.context if self.meta else "none") == "layer":
            self.counts["graph_nodes_outside_writes"] = self.counts.get("graph_nodes_outside_writes", 0) + int(
                (wpos < 0).sum())  # the decoder layer's own kernels: expected, counted
        elif (wpos < 0).any():
            self.warnings.append(
                f"graph replay (launch correlation {int(self.graph_launch[grp[0]])}): {int((wpos < 0).sum())} of "
                f"{len(grp)} kernels were captured outside any kvprof write range; they stay unattributed")
        payload = writes["payload"].to_numpy()
        for p in np.unique(wpos[wpos >= 0]):
            rows = grp[wpos == p]
            rows = rows[np.argsort(self.a_start[rows], kind="stable")]
            w = writes.iloc[p]
            tok = int(payload[p]) if payload[p] >= 0 else _tokens_of(self.phase[rows[0]], self.size[rows[0]])
            self._new_write(rows, lrow, str(w["w_variant"]), int(w["w_layer"]), tok, "graph_node", next_id)
            next_id += 1
        return bool((wpos >= 0).any()), next_id

    def _by_order(self, grp: np.ndarray, lrow: int | None, next_id: int) -> tuple[bool, int]:
        corr = int(self.graph_launch[grp[0]])
        phase, size = self.phase[grp[0]], int(self.size[grp[0]])
        meta = self.meta
        if not meta or not meta.layers:
            self.warnings.append(
                f"graph replay (launch correlation {corr}) has no graph node ids and the trace has no kvprof "
                "metadata (layers, kernels per write): its kernels stay unattributed")
            return False, next_id
        layers = list(meta.layers)
        per = per_write_template(meta, phase, size)
        if per.get("layer"):
            return self._by_layer_template(grp, lrow, next_id, layers, per, phase, size, corr, meta)
        kinds = self.a_kind[grp]
        chunk_rows = grp if per.get("all") else grp[kinds == "kernel"]
        k = per.get("all") or per.get("kernels")
        if not k:
            self.warnings.append(
                f"graph replay of {phase} {size} (launch correlation {corr}): kvprof metadata has no kernel count "
                "per write for it; its kernels stay unattributed")
            return False, next_id
        if len(chunk_rows) != k * len(layers):
            self.warnings.append(
                f"graph replay of {phase} {size} (launch correlation {corr}): {len(chunk_rows)} GPU activities, "
                f"expected {len(layers)} layers x {k} per write = {k * len(layers)}; left unattributed")
            return False, next_id
        order = np.lexsort((self.a_end[chunk_rows], self.a_start[chunk_rows]))
        chunk_rows = chunk_rows[order]
        starts = self.a_start[chunk_rows].reshape(len(layers), k)
        ends = self.a_end[chunk_rows].reshape(len(layers), k)
        streams = self.a_stream[chunk_rows].reshape(len(layers), k)
        devices = self.a_device[chunk_rows].reshape(len(layers), k)
        if len(layers) > 1 and _overlap_across_streams(starts, ends, streams, devices):
            self.warnings.append(
                f"graph replay of {phase} {size} (launch correlation {corr}): consecutive writes overlap on the GPU "
                "on different streams, so grouping by order may mix layers")
        tok = _tokens_of(phase, size)
        variant = str(meta.variant or self.variant[grp[0]] or "")
        extra = np.setdiff1d(grp, chunk_rows)  # memcpy/memset when only kernels were counted
        cut = chunk_rows.reshape(len(layers), k)
        for i, layer in enumerate(layers):
            rows = cut[i]
            if len(extra):
                lo, hi = starts[i].min(), ends[i].max()
                es = self.a_start[extra]
                rows = np.concatenate([rows, extra[(es >= lo) & (es < hi)]])
            self._new_write(rows, lrow, variant, layer, tok, "graph_order", next_id)
            next_id += 1
        left = extra[self.write_id[extra] < 0] if len(extra) else extra
        if len(left):
            self.warnings.append(
                f"graph replay of {phase} {size} (launch correlation {corr}): {len(left)} memcpy/memset outside "
                "every write's kernels; left unattributed")
        return True, next_id

    def _by_layer_template(self, grp: np.ndarray, lrow: int | None, next_id: int, layers: list[int],
                           per: dict[str, Any], phase: Any, size: int, corr: int,
                           meta: TraceMeta) -> tuple[bool, int]:
        """A replay of whole decoder layers: cut it per layer, take the write's positions.

        Layers run one after another (each waits on the previous one's output), so the
        replay's activities in start order repeat the eager template's layer pattern.
        """
        k, positions = int(per["layer"]), list(per["positions"])
        if len(grp) != k * len(layers):
            self.warnings.append(
                f"graph replay of {phase} {size} (launch correlation {corr}): {len(grp)} GPU activities, "
                f"expected {len(layers)} layers x {k} per layer = {k * len(layers)}; left unattributed")
            return False, next_id
        rows = grp[np.lexsort((self.a_end[grp], self.a_start[grp]))].reshape(len(layers), k)
        tok = _tokens_of(phase, size)
        variant = str(meta.variant or self.variant[grp[0]] or "")
        for i, layer in enumerate(layers):
            self._new_write(rows[i][positions], lrow, variant, layer, tok, "graph_order", next_id)
            next_id += 1
        return True, next_id

    # -- output --------------------------------------------------------------------------
    def finish(self, steps: pd.DataFrame, step_var: list[str | None]) -> Trace:
        df = self.df
        df["write_id"] = self.write_id
        df["layer"] = self.layer
        df["tokens"] = self.tokens
        df["size"] = self.size
        df["step"] = self.step
        df["graph_launch"] = self.graph_launch
        df["variant"] = pd.Categorical(self.variant)
        df["phase"] = pd.Categorical(self.phase)
        how = df["attribution"] = pd.Categorical(self.how)
        writes = pd.DataFrame(self.write_rows, columns=list(WRITE_INDEX_COLUMNS))
        work = df["kind"].isin(GPU_WORK_KINDS).to_numpy()
        if len(writes):  # a write no GPU work was matched to (a CPU trace) was attributed by no method
            matched = np.unique(self.write_id[work & (self.write_id >= 0)])
            writes.loc[~writes["write_id"].isin(matched), "attribution"] = "none"
        st = pd.DataFrame({
            "variant": step_var,
            "phase": steps["s_phase"].to_numpy() if len(steps) else [],
            "size": steps["s_size"].astype(int).to_numpy() if len(steps) else [],
            "step": steps["s_step"].astype(int).to_numpy() if len(steps) else [],
            "pid": steps["pid"].to_numpy() if len(steps) else [],
            "tid": steps["tid"].to_numpy() if len(steps) else [],
            "start_ns": steps["start_ns"].to_numpy() if len(steps) else [],
            "dur_ns": steps["dur_ns"].to_numpy() if len(steps) else [],
        })
        gpu = df["device"].to_numpy() >= 0
        n_work = int(work.sum())
        in_write = int((work & (self.write_id >= 0)).sum())
        in_step = int((work & (self.step >= 0)).sum())
        # per method, its GPU work rows: counted on the categorical's codes, not by comparing text per row
        per_code = np.bincount(how.codes[work & (how.codes >= 0)], minlength=len(how.categories))
        by_how = dict(zip(how.categories, per_code.tolist()))
        methods = {m: int(by_how.get(m, 0)) for m in ("correlation", "graph_node", "graph_order")}
        summary = {
            "methods": {m: c for m, c in methods.items() if c},
            "method": dominant_method(methods, len(writes)),
            "gpu_activities": n_work,
            "gpu_activities_in_writes": in_write,
            "gpu_activities_in_steps": in_step,
            "gpu_activities_in_steps_unattributed": int((work & (self.step >= 0) & (self.write_id < 0)).sum()),
            "writes": int(len(writes)),
            "writes_by_method": writes["attribution"].value_counts().to_dict() if len(writes) else {},
            "graph_replays": int(self.counts.get("replays", 0)),
            "graph_replays_unattributed": int(self.counts.get("replays_unattributed", 0)),
            "graph_replays_outside_steps": int(self.counts.get("replays_outside_steps", 0)),
            "graph_replays_by_plugin_record": int(self.counts.get("plugin_replays", 0)),
            "writes_outside_steps": int(self.counts.get("writes_outside_steps", 0)),
            "write_ranges_unrecognised": int(self.counts.get("write_ranges_unrecognised", 0)),
            "gpu_rows": int(gpu.sum()),
        }
        df = df.drop(columns=["end_ns"])
        return self.trace.replace(
            events=from_frame(df), writes=writes, steps=st, attribution=summary,
            warnings=list(self.trace.warnings) + dedupe(self.warnings),
        )


def attribute(trace: Trace, fallback_meta: TraceMeta | None = None, sidecars: list[Sidecar] | None = None) -> Trace:
    """A copy of ``trace`` with write/step columns filled, ``writes``/``steps`` tables and a summary.

    ``fallback_meta``: kvprof metadata to use when the trace has none (an nsys export of
    a variant whose Kineto trace carries it). ``sidecars``: the SGLang plugin's, beside an
    engine's trace: their graph records tie replayed kernels to writes.
    """
    return _Attributor(trace, fallback_meta, sidecars).run()
