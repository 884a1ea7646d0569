"""An engine's CUDA-graph replays tied to writes through the SGLang plugin's graph record.

A replayed kernel has no write range around it (ranges run when the graph is captured,
not when it is replayed). The plugin records, per graph it saw captured, the writes
captured into it in order, each with its kernel's name (``kvprof.core.sidecar.CapturedGraph``),
and wraps each replay of such a graph in a host range ``kvprof.graph_replay[<graph>]``.
Here a replay (the kernels one ``cudaGraphLaunch`` ran) is matched to its graph -- by that
range where the trace has it, else by the write kernels themselves -- and its kernels whose
names are the recorded ones (``kvprof.core.sidecar.kernel_matches``: a whole identifier, never a
part of one), sorted by start, are cut into the recorded writes in order.

Linear in records and replays: the graphs are indexed once by the set of kernel names they record
and the sequence of those names their writes launch; a replay is reduced to the same key from its
kernels (each distinct kernel name matched once) and looked up, not tried against every graph.

Never a guess: where the replay's write kernels do not follow the record (another count,
another order), or several recorded graphs fit with different writes, the replay stays
unattributed and one warning says why; its kernels are still counted by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import pandas as pd

from kvprof.core.sidecar import CapturedGraph, GraphWrite, Sidecar, kernel_matches
from kvprof.core.vocab import GRAPH_REPLAY_RANGE_PATTERN
from kvprof.trace.intervals import enclosing

Fit = list[tuple[np.ndarray, GraphWrite]]
Names = frozenset[str]
MAX_SUBSET_NAMES = 12  # a replay's distinct write-kernel names up to which its name sets are enumerated


@dataclass
class _Entry:
    """The graphs of one group that record one sequence of kernel names, and what tells them apart."""

    graphs: list[CapturedGraph] = field(default_factory=list)
    orders: set[tuple[tuple[int, str, str], ...]] = field(default_factory=set)
    tokens: set[tuple[int, ...]] = field(default_factory=set)


class _Group:
    """Graphs a replay may be (all of a sidecar's, or those of one graph id), indexed by their
    set of kernel names, then by the sequence of names their writes launch."""

    def __init__(self, graphs: list[CapturedGraph]) -> None:
        self.order = {id(g): i for i, g in enumerate(graphs)}
        self.unnamed: list[CapturedGraph] = []
        self.by_set: dict[Names, dict[tuple[str, ...], _Entry]] = {}
        self.first_with: dict[str, CapturedGraph] = {}
        for g in graphs:
            if any(not w.kernel for w in g.writes):
                self.unnamed.append(g)
                continue
            names = frozenset(w.kernel for w in g.writes if w.kernel)
            seq = tuple(w.kernel for w in g.writes for _ in range(w.kernels) if w.kernel)
            e = self.by_set.setdefault(names, {}).setdefault(seq, _Entry())
            e.graphs.append(g)
            e.orders.add(tuple((w.layer, w.variant, w.path) for w in g.writes))
            e.tokens.add(tuple(w.tokens for w in g.writes))
            for n in names:
                self.first_with.setdefault(n, g)
        self.all_unnamed = bool(graphs) and len(self.unnamed) == len(graphs)

    def sets_within(self, present: Names) -> list[Names]:
        """The recorded name sets all of whose names the replay holds."""
        if len(present) <= MAX_SUBSET_NAMES:
            subsets = (frozenset(c) for k in range(1, len(present) + 1) for c in combinations(sorted(present), k))
            return [s for s in subsets if s in self.by_set]
        return [s for s in self.by_set if s <= present]


class PluginGraphs:
    """The sidecars' graph records over one trace's events (``df``: the attributor's frame)."""

    def __init__(self, df: pd.DataFrame, sidecars: list[Sidecar]) -> None:
        self.df = df
        self.with_graphs = [sc for sc in sidecars if sc.graphs]
        self.by_pid = {sc.pid: sc for sc in self.with_graphs if sc.pid is not None}
        self.a_name = df["name"].astype(str).to_numpy()
        self.a_kind = df["kind"].astype(str).to_numpy()
        ann = df[df["kind"] == "cpu_annotation"]
        ids = ann["name"].astype(str).str.extract(GRAPH_REPLAY_RANGE_PATTERN)["graph"]
        # a graph number past int64 names no graph the plugin could record (``CapturedGraph.graph``)
        keep = ids.notna().to_numpy() & (ids.str.len().fillna(99).to_numpy() <= 18)
        self.ranges = pd.DataFrame({
            "pid": ann["pid"].to_numpy()[keep], "tid": ann["tid"].to_numpy()[keep],
            "start_ns": ann["start_ns"].to_numpy()[keep], "end_ns": ann["end_ns"].to_numpy()[keep],
            "graph": ids[keep].astype(np.int64).to_numpy() if keep.any() else np.zeros(0, np.int64),
        })
        self.recorded = {w.kernel for sc in self.with_graphs for g in sc.graphs or [] for w in g.writes if w.kernel}
        self._matches: dict[str, Names] = {}
        self._groups: dict[tuple[int, int | None], _Group] = {}
        self._by_id: dict[int, dict[int, list[CapturedGraph]]] = {}
        self._gids: dict[int, int] = {}
        self.warnings: list[str] = []

    def locate(self, lrows: list[int]) -> None:
        """Look up, in one pass, the plugin's replay range around each of these launches."""
        lrows = [r for r in lrows if r not in self._gids]
        if not lrows or not len(self.ranges):
            return
        rows = self.df.iloc[lrows]
        probe = pd.DataFrame({"pid": rows["pid"].to_numpy(), "tid": rows["tid"].to_numpy(),
                              "start_ns": rows["start_ns"].to_numpy(), "end_ns": rows["start_ns"].to_numpy()})
        pos = enclosing(probe, self.ranges)
        graph = self.ranges["graph"].to_numpy()
        for r, p in zip(lrows, pos):
            self._gids[r] = int(graph[p]) if p >= 0 else -1

    def sidecar_for(self, lrow: int | None) -> Sidecar | None:
        """The sidecar of the process that launched the replay (by pid), or the only one."""
        if lrow is not None:
            sc = self.by_pid.get(int(self.df["pid"].iat[lrow]))
            if sc is not None:
                return sc
        return self.with_graphs[0] if len(self.with_graphs) == 1 else None

    def graph_id(self, lrow: int | None) -> int | None:
        """The graph the plugin's replay range around the launch names, or None (no such range)."""
        if lrow is None or not len(self.ranges):
            return None
        self.locate([lrow])
        gid = self._gids[lrow]
        return gid if gid >= 0 else None

    def matches(self, name: str) -> Names:
        """The recorded kernel names a trace's kernel name is a kernel of (each distinct name once)."""
        got = self._matches.get(name)
        if got is None:
            got = self._matches[name] = frozenset(kernel_matches(name, self.recorded))
        return got

    def _group(self, sc: Sidecar, gid: int | None) -> _Group:
        key = (id(sc), gid)
        grp = self._groups.get(key)
        if grp is None:
            graphs = sc.graphs or []
            if gid is not None:
                by_id = self._by_id.get(id(sc))
                if by_id is None:
                    by_id = self._by_id[id(sc)] = {}
                    for g in graphs:
                        by_id.setdefault(g.graph, []).append(g)
                graphs = by_id.get(gid, [])
            grp = self._groups[key] = _Group(graphs)
        return grp

    def writes_of(self, grp: np.ndarray, lrow: int | None, corr: int, start: np.ndarray,
                  end: np.ndarray) -> Fit | None:
        """The replay's write kernels cut into the recorded writes, or None (a warning says why
        where the replay holds write kernels that do not follow any record)."""
        sc = self.sidecar_for(lrow)
        if sc is None:
            self.warnings.append(f"graph replay (launch correlation {corr}): no SGLang plugin sidecar of its "
                                 "process; its kernels are counted by name only")
            return None
        gid = self.graph_id(lrow)
        group = self._group(sc, gid)
        if gid is not None and not group.order:
            return None  # a graph the plugin saw captured without writes
        kernels = grp[self.a_kind[grp] == "kernel"]
        kernels = kernels[np.lexsort((end[kernels], start[kernels]))]
        matched = [self.matches(n) for n in self.a_name[kernels]]
        present: Names = frozenset().union(*matched) if matched else frozenset()
        fits: list[tuple[CapturedGraph, Fit, _Entry]] = []
        for names in group.sets_within(present):
            hit = [i for i, m in enumerate(matched) if m & names]
            sig = [m & names for m in (matched[i] for i in hit)]
            entries = group.by_set[names]
            if all(len(m) == 1 for m in sig):
                e = entries.get(tuple(next(iter(m)) for m in sig))
                candidates = [e] if e is not None else []
            else:  # a kernel of two recorded names (one a prefix of the other): each sequence of the set tried
                candidates = [e for seq, e in entries.items()
                              if len(seq) == len(sig) and all(n in m for n, m in zip(seq, sig))]
            for e in candidates:
                fits.append((e.graphs[0], self._cut(e.graphs[0], kernels[hit]), e))
        where = f"graph replay (launch correlation {corr})"
        if not fits:
            why = self._why_not(group, gid, present, matched)
            if why:
                self.warnings.append(f"{where}: {why}; its kernels are counted by name only")
            return None
        n_fit = sum(len(e.graphs) for _, _, e in fits)
        if n_fit == 1:
            return fits[0][1]
        orders = set().union(*(e.orders for _, _, e in fits))
        if len(orders) > 1:
            self.warnings.append(
                f"{where}: {n_fit} captured graphs of the SGLang plugin's record fit its write kernels with "
                "different writes, and no kvprof.graph_replay range names which: left unattributed")
            return None
        fits.sort(key=lambda f: group.order[id(f[0])])
        fit = fits[0][1]
        if len(set().union(*(e.tokens for _, _, e in fits))) > 1:
            fitting = sorted((g for _, _, e in fits for g in e.graphs), key=lambda g: group.order[id(g)])
            shown = ", ".join(str(g.graph) for g in fitting[:8]) + (", ..." if len(fitting) > 8 else "")
            self.warnings.append(
                f"{where}: {n_fit} captured graphs (graphs {shown}) fit its write kernels with the same layers but "
                "other token counts, and no kvprof.graph_replay range names which: its writes' tokens are unknown")
            fit = [(rows, GraphWrite(layer=w.layer, variant=w.variant, path=w.path, tokens=-1, kernel=w.kernel,
                                     kernels=w.kernels)) for rows, w in fit]
        return fit

    @staticmethod
    def _cut(g: CapturedGraph, rows: np.ndarray) -> Fit:
        out: Fit = []
        i = 0
        for w in g.writes:
            out.append((rows[i:i + w.kernels], w))
            i += w.kernels
        return out

    @staticmethod
    def _why_not(group: _Group, gid: int | None, present: Names, matched: list[Names]) -> str | None:
        """Why no recorded graph fits a replay, from the first graph (in record order) it could have
        been: one that records a kernel name the replay holds, or one recorded without names."""
        cands = [group.first_with[n] for n in present if n in group.first_with]
        if group.unnamed and (gid is not None or group.all_unnamed or present):
            cands.append(group.unnamed[0])
        if not cands:
            return None  # no write kernel at all: a replay of another graph
        g = min(cands, key=lambda c: group.order[id(c)])
        unnamed = sorted({w.variant for w in g.writes if not w.kernel})
        if unnamed:
            return f"the SGLang plugin recorded graph {g.graph}'s writes of {', '.join(unnamed)} without a kernel name"
        subs = sorted({w.kernel for w in g.writes if w.kernel})
        names = frozenset(subs)
        hit = [m & names for m in matched if m & names]
        expected = sum(w.kernels for w in g.writes)
        if len(hit) != expected:
            return (f"{len(hit)} kernels named {' or '.join(subs)}, where graph {g.graph} recorded "
                    f"{len(g.writes)} writes of {expected} kernels")
        return f"its write kernels do not run in graph {g.graph}'s recorded order"
