"""An analysed run as a Perfetto trace: each trace's GPU work, with kvprof's write slices,
verdict, steps and the unprofiled reference timings as tracks beside it.

Why Perfetto's own protobuf format (TracePacket / TrackEvent) rather than Chrome JSON with
extra events: tracks are named and grouped (one group per trace of the run, kvprof's tracks
first, then one track per GPU stream), a kernel's long name is stored once (interned), the
file is a fraction of the JSON's size, and the ``perfetto`` package (PyPI, extra
``perfetto``) ships the protos and their Python classes: the file is written with them, and
a reader checks it with the same classes, offline; tests/test_perfetto_export.py also loads
it with Perfetto's trace processor (the WebAssembly build ui.perfetto.dev runs) through the
package's TraceProcessor and queries its slices.

The layout (docs/formats.md, "Perfetto export"): per trace, a track group named
``<variant> · <source> · <file>`` holding
- ``verdict``: one slice over the trace's span, named with the variant's verdict (fused or
  not, what the paths and the kernel count say, fell back and why);
- ``kvprof writes (GPU)``: one slice per attributed write, from its first GPU activity's
  start to its last one's end, named ``<variant> L<layer> <phase> batch <n>`` (prefill:
  ``<n> tokens``; ``*`` after a variant run in Triton's interpreter), with its numbers
  (kernels, GPU busy and union time, bytes, bandwidth, attribution) as arguments;
- ``kvprof write ranges (host)``: the same writes' ranges on the host;
- ``kvprof steps (host)``: each profiled step;
- ``reference step (unprofiled)``: for each profiled step, a slice as long as the median
  step of the reference pass (step_timings.json) of the same variant, phase and size,
  laid at that step's start, so that the unprofiled time sits under the profiled one;
- ``GPU <device> stream <stream>``: every kernel, memcpy and memset, named as in the
  trace, with the write it belongs to (if any), launch grid and block as arguments.
Slices that overlap on one track (two kernels of one stream, as a profiler can report)
go to numbered tracks beside it (``... (2)``), so every track's slices nest properly.
Timestamps are the event table's nanoseconds; a trace whose earliest one is negative is
shifted so that it starts at 0 (said in the group's description).
"""

from __future__ import annotations

import heapq
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from kvprof.analysis.figures import MARK, fmt_number
from kvprof.core.atomic import atomic_file
from kvprof.core.errors import Setting, ToolError
from kvprof.core.schema import GPU_WORK_KINDS
from kvprof.core.summary import VariantVerdict
from kvprof.core.text import printable
from kvprof.trace.table import to_frame

if TYPE_CHECKING:
    from kvprof.analysis.summary import Analysis
    from kvprof.core.timings import StepSamples, StepTimings
    from kvprof.trace.load import Loaded
    from kvprof.trace.model import Trace

SEQUENCE_ID = 1  # every packet of the file is on one sequence (interned names are per sequence)
_PACKETS_PER_WRITE = 20_000  # packets serialized at a time: the whole file is never one message
# a write slice's arguments (writes.parquet's columns of the same names)
WRITE_ARGS = ("variant", "phase", "size", "step", "layer", "attribution", "kernels", "gpu_busy_ns", "gpu_union_ns",
              "bytes", "bandwidth_gbs")


def require_perfetto() -> None:
    """ToolError (one line, with the install command) when the perfetto package is missing."""
    _protos()


def _protos() -> Any:
    try:
        from perfetto.protos.perfetto.trace import perfetto_trace_pb2
    except ImportError:
        raise ToolError(Setting("perfetto"), " needs the perfetto package: pip install 'kvcache-profiler[perfetto]' "
                        "(or pip install perfetto)") from None
    return perfetto_trace_pb2


@dataclass
class _Slice:
    start: int
    end: int
    name: str
    args: dict[str, Any] = field(default_factory=dict)


def lanes(slices: Sequence[_Slice]) -> list[list[_Slice]]:
    """The slices sorted by start and dealt onto as few lanes as keep each lane free of overlap
    (a slice that ends where the next begins shares its lane), each onto the lowest-numbered lane
    free at its start. O(n log n): the busy lanes in a heap by end, the free ones in a heap by number."""
    out: list[list[_Slice]] = []
    busy: list[tuple[int, int]] = []  # (end, lane)
    free: list[int] = []
    for s in sorted(slices, key=lambda s: (s.start, s.end)):
        while busy and busy[0][0] <= s.start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            lane = len(out)
            out.append([])
        out[lane].append(s)
        heapq.heappush(busy, (s.end, lane))
    return out


class PerfettoWriter:
    """Track descriptors and slices into TracePackets on one sequence, names interned."""

    def __init__(self) -> None:
        self.pb = _protos()
        self.packets: list[Any] = []
        # (timestamp, order, track, type, name iid or 0, arguments): sorted and made packets by write()
        self.events: list[tuple[int, int, int, int, int, dict[str, Any] | None]] = []
        self.uuids = itertools.count(1)
        self.names: dict[str, int] = {}
        self.order = itertools.count()

    def track(self, name: str, parent: int | None = None, description: str | None = None, rank: int = 0) -> int:
        uuid = next(self.uuids)
        p = self.pb.TracePacket()
        d = p.track_descriptor
        d.uuid = uuid
        d.name = printable(name)
        d.sibling_order_rank = rank
        if parent is not None:
            d.parent_uuid = parent
        else:
            d.child_ordering = self.pb.TrackDescriptor.EXPLICIT
        if description:
            d.description = printable(description)
        self.packets.append(p)
        return uuid

    def _name(self, name: str) -> int:
        iid = self.names.get(name)
        if iid is None:
            iid = self.names[name] = len(self.names) + 1
        return iid

    def _event(self, ts: int, track: int, kind: int, name: str | None = None,
               args: dict[str, Any] | None = None) -> None:
        self.events.append((ts, next(self.order), track, kind, self._name(name) if name is not None else 0, args))

    def slices(self, name: str, parent: int, slices: Sequence[_Slice], rank: int) -> None:
        """A track of these slices, and numbered tracks beside it for those that overlap."""
        begin, end = self.pb.TrackEvent.TYPE_SLICE_BEGIN, self.pb.TrackEvent.TYPE_SLICE_END
        for i, lane in enumerate(lanes(slices)):
            track = self.track(name if i == 0 else f"{name} ({i + 1})", parent, rank=rank)
            for s in lane:
                self._event(s.start, track, begin, s.name, s.args)
                self._event(s.end, track, end)

    def write(self, path: Path) -> None:
        """Descriptors, the interned names, then every event by timestamp (a track's own
        order kept on ties: its slice ends before the next one begins), serialized
        _PACKETS_PER_WRITE packets at a time (concatenated Trace messages read as one)."""
        self.events.sort(key=lambda e: (e[0], e[1]))
        needs_state = self.pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
        with atomic_file(path, "wb") as fh:
            trace = self.pb.Trace()
            trace.packet.extend(self.packets)
            first = trace.packet.add()
            first.trusted_packet_sequence_id = SEQUENCE_ID
            first.sequence_flags = self.pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
            for name, iid in self.names.items():
                entry = first.interned_data.event_names.add()
                entry.iid = iid
                entry.name = printable(name)
            fh.write(trace.SerializeToString())
            for lo in range(0, len(self.events), _PACKETS_PER_WRITE):
                trace = self.pb.Trace()
                for ts, _, track, kind, name_iid, args in self.events[lo:lo + _PACKETS_PER_WRITE]:
                    p = trace.packet.add()
                    p.timestamp = ts
                    p.trusted_packet_sequence_id = SEQUENCE_ID
                    p.sequence_flags = needs_state
                    ev = p.track_event
                    ev.type = kind
                    ev.track_uuid = track
                    if name_iid:
                        ev.name_iid = name_iid
                    for key, value in (args or {}).items():
                        _annotate(ev.debug_annotations.add(), key, value)
                fh.write(trace.SerializeToString())


def _annotate(a: Any, key: str, value: Any) -> None:
    a.name = key
    if isinstance(value, (bool, np.bool_)):
        a.bool_value = bool(value)
    elif isinstance(value, (int, np.integer)):
        a.int_value = int(value)
    elif isinstance(value, (float, np.floating)):
        a.double_value = float(value)
    else:
        a.string_value = printable(value)


def _present(value: Any) -> bool:
    if value is None:
        return False
    try:
        return not bool(pd.isna(value))
    except (TypeError, ValueError):
        return True


def size_label(phase: Any, size: Any) -> str:
    """A step's size in words: a decode step's batch, a prefill's tokens (never ``bs4096``)."""
    return f"{size} tokens" if str(phase) == "prefill" else f"batch {size}"


def verdict_text(name: str, v: VariantVerdict | None) -> str:
    """One variant's verdict as a slice name (plain text)."""
    if v is None:
        return f"{name}: no verdict (not a kvprof write variant)"
    if not v.available:
        return f"{name}: not run ({v.reason})"
    word = "fused" if v.fused else ("not fused" if v.fused is False else "unknown")
    parts = [f"{name}: {word}"]
    if v.rope:
        parts.append(f"rope {v.rope}")
    paths = v.paths_said()
    kernels = "fused" if v.fused_by_kernels else "not fused" if v.fused_by_kernels is False else "?"
    parts.append(f"paths say {paths}, kernel count says {kernels}")
    if v.fell_back:
        parts.append("fell back" + (f" ({'; '.join(v.fallback_reasons)})" if v.fallback_reasons else ""))
    return " · ".join(parts)


def _reference(timings: StepTimings | None, variant: str, phase: str, size: int, graph: bool) -> StepSamples | None:
    """The reference pass's series for this step's variant, phase and size (the same graph mode first)."""
    if timings is None:
        return None
    found = [r for r in timings.select(pass_="reference") if (r.variant, r.phase, r.size) == (variant, phase, size)
             and r.mode != "layer_no_write" and r.samples_ns]
    found.sort(key=lambda r: r.graph != graph)
    return found[0] if found else None


def _trace_slices(w: PerfettoWriter, trace: Trace, writes: pd.DataFrame, verdicts: dict[str, VariantVerdict],
                  timings: StepTimings | None) -> None:
    ev = to_frame(trace.events)
    if ev.empty:
        return
    start, end = ev["start_ns"].to_numpy(), (ev["start_ns"] + ev["dur_ns"]).to_numpy()
    shift = max(0, -int(start.min()))
    variants = trace.variants
    label = ", ".join(variants) if variants else "foreign trace"
    name = f"{label} · {trace.source} · {Path(trace.path).name}"
    group = w.track(name, description=(f"shifted by {shift} ns so that the trace starts at 0" if shift else None))
    t0, t1 = int(start.min()) + shift, int(end.max()) + shift

    for rank, v in enumerate(variants or [None]):
        text = verdict_text(v, verdicts.get(v)) if v else "no kvprof write variant in this trace"
        verdict = verdicts.get(v) if v else None
        vargs = {k: val for k, val in (verdict.to_json() if verdict else {}).items()
                 if isinstance(val, (bool, int, float, str))}
        w.slices("verdict" if rank == 0 else f"verdict {v}", group, [_Slice(t0, t1, text, vargs)], rank=0)

    mine = writes[writes["trace"].astype(str) == trace.path] if len(writes) else writes
    wanted = dict.fromkeys(("write_id", "variant", "gpu_start_ns", "gpu_end_ns", "host_start_ns", "host_dur_ns",
                            *WRITE_ARGS))  # variant is one of WRITE_ARGS too: each column once
    records = mine[[c for c in wanted if c in mine.columns]].to_dict("records") if len(mine) else []
    interpreted = {n for n, vd in verdicts.items() if vd is not None and vd.interpreted}

    def who(r: dict[str, Any]) -> str:  # the write's variant, `*` where it ran in Triton's interpreter
        v = str(r.get("variant") or (variants[0] if len(variants) == 1 else "?"))
        return f"{v} {MARK}" if v in interpreted else v

    w.slices("kvprof writes (GPU)", group, [
        _Slice(int(r["gpu_start_ns"]) + shift, int(r["gpu_end_ns"]) + shift,
               f"{who(r)} L{r['layer']} {r['phase']} {size_label(r['phase'], r['size'])}",
               {"write_id": int(r["write_id"]), **{k: r[k] for k in WRITE_ARGS if k in r and _present(r[k])}})
        for r in records if _present(r.get("gpu_start_ns")) and _present(r.get("gpu_end_ns"))], rank=1)
    w.slices("kvprof write ranges (host)", group, [
        _Slice(int(r["host_start_ns"]) + shift, int(r["host_start_ns"]) + int(r["host_dur_ns"]) + shift,
               f"{who(r)} set_kv_buffer L{r['layer']}", {"write_id": int(r["write_id"])})
        for r in records if _present(r.get("host_start_ns")) and _present(r.get("host_dur_ns"))], rank=2)

    steps = trace.steps if trace.steps is not None else pd.DataFrame()
    step_slices, reference = [], []
    for _, s in steps.iterrows():
        s0 = int(s["start_ns"]) + shift
        phase, size = str(s["phase"]), int(s["size"])
        graph = bool(s.get("graph_launches", 0))
        step_slices.append(_Slice(s0, s0 + int(s["dur_ns"]),
                                  f"{who(s)} {phase} {size_label(phase, size)} step {s['step']}",
                                  {"graph_launches": int(s.get("graph_launches", 0) or 0)}))
        ref = _reference(timings, str(s["variant"]), phase, size, graph)
        if ref is not None:
            med = ref.median_ns
            per_write = med / ref.writes_per_step if ref.writes_per_step else None
            ref_args: dict[str, Any] = {"median_ns": med, "samples": len(ref.samples_ns), "clock": ref.clock,
                                        "mode": ref.mode, "graph": ref.graph, "writes_per_step": ref.writes_per_step}
            if np.isfinite(ref.iqr_ns):
                ref_args["iqr_ns"] = ref.iqr_ns
            if per_write is not None:
                ref_args["per_write_ns"] = per_write
            reference.append(_Slice(s0, s0 + max(int(round(med)), 0),
                                    f"reference {phase} {size_label(phase, size)}: {fmt_number(med / 1000)} µs/step "
                                    "(unprofiled median)",
                                    ref_args))
    w.slices("kvprof steps (host)", group, step_slices, rank=3)
    w.slices("reference step (unprofiled)", group, reference, rank=4)

    work = ev[ev["kind"].isin(GPU_WORK_KINDS)]
    for (device, stream), g in work.groupby(["device", "stream"], sort=True, observed=True):
        cols = {c: g[c].to_numpy() for c in ("start_ns", "dur_ns", "name", "kind", "write_id", "layer", "correlation",
                                             "grid", "block", "bytes")}
        rows = []
        for i in range(len(g)):
            args: dict[str, Any] = {"kind": cols["kind"][i]}
            for key in ("write_id", "layer", "correlation", "bytes"):
                if cols[key][i] >= 0:
                    args[key] = int(cols[key][i])
            for key in ("grid", "block"):
                if isinstance(cols[key][i], str):
                    args[key] = cols[key][i]
            s0 = int(cols["start_ns"][i]) + shift
            rows.append(_Slice(s0, s0 + int(cols["dur_ns"][i]), str(cols["name"][i]), args))
        w.slices(f"GPU {device} stream {stream}", group, rows, rank=5)


def write_perfetto(loaded: Loaded, result: Analysis, path: str | os.PathLike[str]) -> Path:
    """The run as one Perfetto trace at ``path`` (written atomically); the path."""
    w = PerfettoWriter()
    for trace in loaded.traces:
        _trace_slices(w, trace, result.writes, result.summary.variants, loaded.timings)
    out = Path(path)
    w.write(out)
    return out


def read_perfetto(data: bytes) -> Any:
    """The file's Trace message, parsed by the perfetto package's own classes."""
    return _protos().Trace.FromString(data)


__all__ = ["SEQUENCE_ID", "PerfettoWriter", "lanes", "read_perfetto", "require_perfetto", "verdict_text",
           "write_perfetto"]
