"""An engine's CUDA-graph replays tied to writes through the SGLang plugin's graph record.

A replayed kernel has no write range around it (ranges run when the graph is captured,
not when it is replayed). The plugin records, per graph it saw captured, the writes
captured into it in order, each with its kernel's name (``kvprof.core.sidecar.CapturedGraph``),
and wraps each replay of such a graph in a host range ``kvprof.graph_replay[<graph>]``.
Here a replay (the kernels one ``cudaGraphLaunch`` ran) is matched to its graph -- by that
range where the trace has it, else by the write kernels themselves -- and its kernels whose
names are the recorded ones, sorted by start, are cut into the recorded writes in order.

Never a guess: where the replay's write kernels do not follow the record (another count,
another order), or several recorded graphs fit with different writes, the replay stays
unattributed and one warning says why; its kernels are still counted by name.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from kvprof.core.sidecar import CapturedGraph, GraphWrite, Sidecar
from kvprof.core.vocab import GRAPH_REPLAY_RANGE_PATTERN
from kvprof.trace.intervals import enclosing

Fit = list[tuple[np.ndarray, GraphWrite]]


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
        keep = ids.notna().to_numpy()
        self.ranges = pd.DataFrame({
            "pid": ann["pid"].to_numpy()[keep], "tid": ann["tid"].to_numpy()[keep],
            "start_ns": ann["start_ns"].to_numpy()[keep], "end_ns": ann["end_ns"].to_numpy()[keep],
            "graph": ids[keep].astype(np.int64).to_numpy() if keep.any() else np.zeros(0, np.int64),
        })
        self.warnings: list[str] = []

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
        row = self.df.iloc[[lrow]]
        probe = pd.DataFrame({"pid": row["pid"].to_numpy(), "tid": row["tid"].to_numpy(),
                              "start_ns": row["start_ns"].to_numpy(), "end_ns": row["start_ns"].to_numpy()})
        pos = int(enclosing(probe, self.ranges)[0])
        return int(self.ranges["graph"].iat[pos]) if pos >= 0 else None

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
        graphs = sc.graphs or []
        if gid is not None:
            graphs = [g for g in graphs if g.graph == gid]
            if not graphs:
                return None  # a graph the plugin saw captured without writes
        kernels = grp[self.a_kind[grp] == "kernel"]
        kernels = kernels[np.lexsort((end[kernels], start[kernels]))]
        fits: list[tuple[CapturedGraph, Fit]] = []
        why: list[str] = []
        for g in graphs:
            fit, reason = self._fit(g, kernels)
            if fit is not None:
                fits.append((g, fit))
            elif reason:
                why.append(reason)
        where = f"graph replay (launch correlation {corr})"
        if not fits:
            if why and (gid is not None or len(why) == len(graphs)):
                self.warnings.append(f"{where}: {why[0]}; its kernels are counted by name only")
            return None
        if len(fits) == 1:
            return fits[0][1]
        orders = {tuple((w.layer, w.variant, w.path) for _, w in fit) for _, fit in fits}
        if len(orders) > 1:
            self.warnings.append(
                f"{where}: {len(fits)} captured graphs of the SGLang plugin's record fit its write kernels with "
                "different writes, and no kvprof.graph_replay range names which: left unattributed")
            return None
        tokens = {tuple(w.tokens for _, w in fit) for _, fit in fits}
        fit = fits[0][1]
        if len(tokens) > 1:
            self.warnings.append(
                f"{where}: {len(fits)} captured graphs (graphs {', '.join(str(g.graph) for g, _ in fits)}) fit its "
                "write kernels with the same layers but other token counts, and no kvprof.graph_replay range names "
                "which: its writes' tokens are unknown")
            fit = [(rows, GraphWrite(layer=w.layer, variant=w.variant, path=w.path, tokens=-1, kernel=w.kernel,
                                     kernels=w.kernels)) for rows, w in fit]
        return fit

    def _fit(self, g: CapturedGraph, kernels: np.ndarray) -> tuple[Fit | None, str | None]:
        """The replay's kernels cut as graph ``g`` recorded its writes, or (None, why not)."""
        unnamed = sorted({w.variant for w in g.writes if not w.kernel})
        if unnamed:
            return None, (f"the SGLang plugin recorded graph {g.graph}'s writes of {', '.join(unnamed)} without a "
                          "kernel name")
        subs = sorted({w.kernel for w in g.writes if w.kernel})
        names = self.a_name[kernels]
        hit = np.fromiter((any(s in n for s in subs) for n in names), bool, len(names))
        rows = kernels[hit]
        expected = sum(w.kernels for w in g.writes)
        if not len(rows):
            return None, None  # no write kernel at all: a replay of another graph
        if len(rows) != expected:
            return None, (f"{len(rows)} kernels named {' or '.join(subs)}, where graph {g.graph} recorded "
                          f"{len(g.writes)} writes of {expected} kernels")
        out: Fit = []
        i = 0
        for w in g.writes:
            part = rows[i:i + w.kernels]
            i += w.kernels
            if not all(w.kernel and w.kernel in n for n in self.a_name[part]):
                return None, f"its write kernels do not run in graph {g.graph}'s recorded order"
            out.append((part, w))
        return out, None
