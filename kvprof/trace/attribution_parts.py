"""Helpers of attribution: graph-capture windows, the template a replay is cut by, summaries."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from kvprof.core.run import TraceMeta
from kvprof.core.schema import LAUNCH_KINDS
from kvprof.trace.intervals import enclosing

CAPTURE_BEGIN, CAPTURE_END = "cudaStreamBeginCapture", "cudaStreamEndCapture"


def untied_replays_warning(replays: int) -> str:
    """The warning for graph replays outside every kvprof step range whose GPU activities no kvprof
    write range (nor the plugin's graph record) ties to a write. For an engine's trace, analyze's
    KV-write-kernel steps may tie their write kernels after all: kvprof.analysis.write_kernels
    finds this line by its text and says instead what those steps leave untied."""
    return (f"{replays:,} graph replays lie outside kvprof step ranges: their GPU activities are not tied to "
            "writes (the generic numbers still count them)")



def during_capture(df: pd.DataFrame, writes: pd.DataFrame) -> np.ndarray:
    """Write ranges entered while a CUDA graph was being captured on their thread.

    Their launches are recorded into the graph, not run: they are templates for the
    replays, not measurements, and the metrics leave them out.
    """
    names = df["name"].astype(str)
    marks = df[df["kind"].isin(LAUNCH_KINDS) & names.isin([CAPTURE_BEGIN, CAPTURE_END])]
    out = np.zeros(len(writes), dtype=bool)
    if not len(marks) or not len(writes):
        return out
    windows = []
    for (pid, tid), g in marks.sort_values("start_ns").groupby(["pid", "tid"], sort=False):
        begin = None
        for name, start, end in zip(g["name"].astype(str), g["start_ns"], g["end_ns"]):
            if name == CAPTURE_BEGIN:
                begin = start
            elif begin is not None:
                windows.append((pid, tid, begin, end))
                begin = None
        if begin is not None:
            windows.append((pid, tid, begin, int(df["end_ns"].max())))
    if not windows:
        return out
    win = pd.DataFrame(windows, columns=["pid", "tid", "start_ns", "end_ns"])
    return enclosing(writes, win) >= 0


def dominant_method(methods: dict[str, int], n_writes: int) -> str:
    used = [m for m, c in methods.items() if c]
    if not n_writes or not used:
        return "none"
    return "+".join(used)


def dedupe(items: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    for w in items:
        key = re.sub(r"launch correlation \d+", "launch correlation N", w)
        seen[key] = seen.get(key, 0) + 1
    return [k if c == 1 else f"{k} ({c} times)" for k, c in seen.items()]


def per_write_template(meta: TraceMeta, phase: Any, size: int) -> dict[str, Any]:
    """How to cut a replay of (phase, size) into writes, from the capture metadata.

    ``template`` (from the capture's eager template step) is preferred: ``all`` activities
    per write (kernels + memcpy + memset), and with a decoder context ``layer`` activities
    per layer of which those at ``positions`` are the write's. ``kernels_per_write``
    counts kernels only.
    """
    key = f"{phase} {size}"
    tmpl = meta.template.get(key)
    if isinstance(tmpl, dict) and all(isinstance(tmpl.get(k), int) for k in ("kernels", "memcpy", "memset")):
        out: dict[str, Any] = {"all": tmpl["kernels"] + tmpl["memcpy"] + tmpl["memset"]}
        per, pos = tmpl.get("ops_per_layer"), tmpl.get("write_positions")
        if (isinstance(per, int) and isinstance(pos, list) and pos and per > len(pos)
                and all(isinstance(i, int) and 0 <= i < per for i in pos)):
            out.update(layer=per, positions=[int(i) for i in pos])
        return out
    kpw = meta.kernels_per_write.get(key)
    if isinstance(kpw, int) and kpw > 0:
        return {"kernels": kpw}
    return {}
