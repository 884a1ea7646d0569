"""What a write saves in a decoder-layer step, measured, and what the trace says about the gap
between that and the writes-alone projection.

Pure functions; no torch.

- ``step_savings``: from the unprofiled reference pass (``step_timings.json``), per variant
  and (phase, size), the layer step's saving against each reference variant -- ``two_stream``
  (the store engines ran before fused writes) and ``rope_then_triton_fused`` (the rotary,
  then the fused store: what a write fused into the rotary is measured against) and
  ``sglang_set_kv_buffer`` (SGLang's own generic write: with an fp8 cache it divides and
  converts the rows in four kernels before its store, what a fused quantising write saves) -- as the
  reference's median step minus the variant's, with its spread (the two steps' IQRs in
  quadrature: the variants run one after another, so their steps do not pair), the
  projection from the same units timed alone (the writes-only steps' difference) and the
  gap between the two.
- ``write_boundaries``: from a profiled trace of the layer, where each write sits on the
  GPU timeline: what it adds to the critical path (``gpu_new_ns``), how far it starts after
  the end of the work before it (negative: it began before its predecessor ended, which on
  one stream is programmatic dependent launch: ``kvprof.analysis.early_start``), how far the next kernel starts after it
  (negative: that kernel began before the write ended), and for a write with work on a
  second stream, how long the next kernel's stream sat idle waiting for it.
- ``gap_notes``: one sentence per saving whose gap exceeds its spread, accounting for it
  with those trace figures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np
import pandas as pd

from kvprof.analysis.early_start import latest_end_before, predecessors
from kvprof.analysis.gpu_groups import stream_lanes
from kvprof.core.timings import StepSamples, StepTimings

AGAINST = ("two_stream", "rope_then_triton_fused", "sglang_set_kv_buffer")
_REFERENCE = "reference"


def _finite(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _typed(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    """A row read back from JSON as its class declares it: text, counts, figures or None."""
    out: dict[str, Any] = {}
    for f in fields(cls):
        v = d.get(f.name)
        x = _finite(v)
        if f.type.startswith("list"):
            out[f.name] = [str(x) for x in v] if isinstance(v, list) else []
        elif f.type.startswith("dict"):
            items = v.items() if isinstance(v, dict) else ()
            out[f.name] = {str(k): y for k, x in items if (y := _finite(x)) is not None}
        elif f.type == "str":
            out[f.name] = "" if v is None else str(v)
        elif f.type == "int":
            out[f.name] = int(x) if x is not None else 0
        elif f.type == "float":
            out[f.name] = x if x is not None else math.nan
        else:  # float | None
            out[f.name] = x
    return out


@dataclass(frozen=True)
class StepSaving:
    """One variant's measured layer-step saving against one reference variant (ns)."""

    variant: str
    against: str
    phase: str
    size: int
    layers: int  # layers (writes) per step
    clock: str  # cuda_events, or wall on a CPU (host time: says nothing of a GPU's step)
    step_ns: float  # the variant's median layer step
    step_iqr_ns: float | None
    against_step_ns: float
    against_iqr_ns: float | None
    saving_ns: float  # against_step_ns - step_ns: positive = the variant's step is shorter
    spread_ns: float | None  # the two IQRs in quadrature
    projected_ns: float | None  # the same difference of the writes-alone steps
    gap_ns: float | None  # saving_ns - projected_ns

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepSaving:
        return cls(**_typed(cls, d))


def step_savings(timings: StepTimings | None, against: tuple[str, ...] = AGAINST) -> list[StepSaving]:
    """Every measured variant against each of ``against`` present, per (phase, size), from the
    reference pass's ``layer`` and ``writes`` series (none without a decoder context). Two
    references are compared once, the later in ``against`` against the earlier."""
    if timings is None or timings.context != "layer":
        return []
    by: dict[tuple[str, str, int], dict[str, StepSamples]] = {}
    for r in timings.select(pass_=_REFERENCE):
        if r.samples_ns:
            by.setdefault((r.variant, r.phase, r.size), {})[r.mode] = r
    out: list[StepSaving] = []
    for (variant, phase, size), modes in sorted(by.items()):
        main = modes.get("layer")
        if main is None:
            continue
        for ref in against:
            base = by.get((ref, phase, size), {})
            if ref == variant or "layer" not in base or (variant in against
                                                         and against.index(variant) < against.index(ref)):
                continue  # each pair of references once: the later one against the earlier
            b = base["layer"]
            saving = b.median_ns - main.median_ns
            iqrs = (_finite(main.iqr_ns), _finite(b.iqr_ns))
            spread = math.hypot(*iqrs) if None not in iqrs else None  # type: ignore[arg-type]
            projected = None
            if "writes" in modes and "writes" in base:
                projected = base["writes"].median_ns - modes["writes"].median_ns
            out.append(StepSaving(
                variant=variant, against=ref, phase=phase, size=size, layers=main.writes_per_step, clock=main.clock,
                step_ns=main.median_ns, step_iqr_ns=iqrs[0], against_step_ns=b.median_ns, against_iqr_ns=iqrs[1],
                saving_ns=saving, spread_ns=spread, projected_ns=projected,
                gap_ns=saving - projected if projected is not None else None,
            ))
    return out


@dataclass(frozen=True)
class WriteBoundary:
    """Where one variant's writes sit on a profiled layer's GPU timeline (medians, ns)."""

    variant: str
    source: str
    phase: str
    size: int
    writes: int
    critical_ns: float | None  # what a write adds to the GPU timeline (gpu_new_ns)
    start_after_ns: float | None  # write start - end of the work before it (< 0: began before it ended)
    early_starts: int  # writes that began before their predecessor ended
    early_overlap_ns: float | None  # how long before, over those writes
    same_stream_early: int  # of those, begun before the work before them on their own stream ended: PDL overlap
    next_after_ns: float | None  # next kernel's start - write end (< 0: it began before the write ended)
    early_next: int  # writes whose next kernel began before they ended
    second_stream: int  # writes with work on a stream other than the next kernel's
    stream_wait_ns: float | None  # over those: the next kernel's stream idle before it (waiting for the write)
    # the layer's other kernels (no write's), GPU time per layer by kernel name: a write can make
    # the work around it slower or faster, which its own critical-path time does not show
    other_kernels: dict[str, float] = field(default_factory=dict)
    write_kernels: list[str] = field(default_factory=list)  # the names of the write's own kernels

    @property
    def other_ns(self) -> float | None:
        return sum(self.other_kernels.values()) if self.other_kernels else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WriteBoundary:
        return cls(**_typed(cls, d))


def _median(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if len(x) else None


def write_boundaries(work: pd.DataFrame, writes: pd.DataFrame) -> list[WriteBoundary]:
    """Per (variant, source, phase, size) of one trace's layer-context writes: ``work`` is the
    trace's GPU activity rows (kernel/memcpy/memset, with ``write_id``), ``writes`` its rows
    of ``kvprof.analysis.writes.per_write_table``."""
    if work.empty or writes.empty or "context" not in writes:
        return []
    w = writes[(writes["context"].astype(str) == "layer") & ~writes["during_capture"].astype(bool)
               & writes["gpu_start_ns"].notna()]
    if w.empty:
        return []
    lanes = stream_lanes(work)
    s_all = work["start_ns"].to_numpy(dtype=np.int64)
    e_all = s_all + work["dur_ns"].to_numpy(dtype=np.int64)
    wid = work["write_id"].to_numpy(dtype=np.int64)
    order = np.argsort(s_all, kind="stable")
    s_sorted, e_sorted, lane_sorted = s_all[order], e_all[order], lanes[order]
    first = w["gpu_start_ns"].to_numpy(dtype=float)
    last = w["gpu_end_ns"].to_numpy(dtype=float)
    ids = w["write_id"].to_numpy(dtype=np.int64)
    pred = predecessors(work, ids, first)
    # the write's streams
    mine = pd.DataFrame({"write_id": wid, "lane": lanes})[wid >= 0]
    lane_sets = mine.groupby("write_id")["lane"].agg(lambda x: frozenset(x.tolist()))
    # the next kernel: the first activity of no write that starts after the write's first one
    other = wid[order] < 0
    o_start, o_lane = s_sorted[other], lane_sorted[other]
    j = np.searchsorted(o_start, first.astype(np.int64), side="right")
    has_next = j < len(o_start)
    next_start, next_lane = np.full(len(w), np.nan), np.full(len(w), -1)
    next_start[has_next], next_lane[has_next] = o_start[j[has_next]], o_lane[j[has_next]]
    # the next kernel's stream: its latest end before the next kernel starts
    stream_idle = np.full(len(w), np.nan)
    for lane in np.unique(next_lane[has_next]):
        on = lane_sorted == lane
        sel = has_next & (next_lane == lane)
        latest, _ = latest_end_before(s_sorted[on], e_sorted[on], next_start[sel].astype(np.int64))
        stream_idle[sel] = next_start[sel] - latest
    second = np.array([bool(ls - {nl}) if isinstance(ls, frozenset) and hn else False
                       for ls, nl, hn in zip(lane_sets.reindex(ids).to_numpy(), next_lane, has_next)])
    others = _other_kernels(work, wid, s_all, e_all, first, w)
    own = _write_kernels(work, wid, w)
    frame = pd.DataFrame({
        "variant": w["variant"].astype(str).to_numpy(), "source": w["source"].astype(str).to_numpy(),
        "phase": w["phase"].astype(str).to_numpy(), "size": w["size"].astype(int).to_numpy(),
        "critical": w["gpu_new_ns"].to_numpy(dtype=float), "before": pred.start_after_ns,
        "same": pred.began_early, "after": next_start - last, "second": second,
        "idle": np.where(second, stream_idle, np.nan),
    })
    out = []
    for (variant, source, phase, size), g in frame.groupby(["variant", "source", "phase", "size"], sort=True):
        before, after = g["before"].to_numpy(), g["after"].to_numpy()
        early = before < 0
        out.append(WriteBoundary(
            variant=str(variant), source=str(source), phase=str(phase), size=int(size), writes=len(g),
            critical_ns=_median(g["critical"].to_numpy()), start_after_ns=_median(before),
            early_starts=int(early.sum()), early_overlap_ns=_median(-before[early]),
            same_stream_early=int(g["same"].sum()), next_after_ns=_median(after),
            early_next=int((after < 0).sum()), second_stream=int(g["second"].sum()),
            stream_wait_ns=_median(g["idle"].to_numpy()),
            other_kernels=others.get((str(variant), str(source), str(phase), int(size)), {}),
            write_kernels=own.get((str(variant), str(source), str(phase), int(size)), []),
        ))
    return out


def _other_kernels(work: pd.DataFrame, wid: np.ndarray, start: np.ndarray, end: np.ndarray, first: np.ndarray,
                   w: pd.DataFrame) -> dict[tuple[str, str, str, int], dict[str, float]]:
    """GPU time per layer of the kernels that belong to no write, by name, per (variant,
    source, phase, size): each kernel counts toward the group of the write nearest to it in
    time (a step's kernels before its first write and after its last stay in its group),
    divided by that group's writes (one per layer per step)."""
    if "name" not in work:
        return {}
    other = wid < 0
    if not other.any() or not len(first):
        return {}
    by_start = np.argsort(first, kind="stable")
    starts = first[by_start]
    at = start[other].astype(float)
    prev = np.clip(np.searchsorted(starts, at, side="right") - 1, 0, len(starts) - 1)
    nxt = np.clip(prev + 1, 0, len(starts) - 1)
    nearest = np.where(np.abs(starts[nxt] - at) < np.abs(at - starts[prev]), nxt, prev)
    keep = np.ones(len(at), dtype=bool)
    rows = by_start[nearest]
    keys = pd.DataFrame({"variant": w["variant"].astype(str).to_numpy()[rows],
                         "source": w["source"].astype(str).to_numpy()[rows],
                         "phase": w["phase"].astype(str).to_numpy()[rows],
                         "size": w["size"].astype(int).to_numpy()[rows],
                         "name": work["name"].astype(str).to_numpy()[other][keep],
                         "dur": (end - start)[other][keep].astype(float)})
    counts = w.groupby([w["variant"].astype(str), w["source"].astype(str), w["phase"].astype(str),
                        w["size"].astype(int)]).size()
    out: dict[tuple[str, str, str, int], dict[str, float]] = {}
    for (variant, source, phase, size, name), dur in keys.groupby(["variant", "source", "phase", "size", "name"],
                                                                   sort=True)["dur"].sum().items():
        group = (str(variant), str(source), str(phase), int(size))
        out.setdefault(group, {})[str(name)] = float(dur) / int(counts[group])
    return out


def _write_kernels(work: pd.DataFrame, wid: np.ndarray, w: pd.DataFrame) -> dict[tuple[str, str, str, int], list[str]]:
    """The kernel names of each group's writes (a rotary that is part of a rope_then_* write is
    one of them; beside another variant's write it is one of the layer's other kernels)."""
    if "name" not in work:
        return {}
    mine = pd.DataFrame({"write_id": wid, "name": work["name"].astype(str).to_numpy()})[wid >= 0]
    keys = w[["write_id", "variant", "source", "phase", "size"]].astype(
        {"variant": str, "source": str, "phase": str, "size": int})
    j = mine.merge(keys, on="write_id", how="inner")
    return {(str(v), str(src), str(ph), int(sz)): sorted(set(g["name"]))
            for (v, src, ph, sz), g in j.groupby(["variant", "source", "phase", "size"], sort=True)}


def _other_account(mine: WriteBoundary, theirs: WriteBoundary) -> str | None:
    """How much longer (or shorter) the layer's other kernels ran beside ``mine``'s write than
    beside ``theirs``, per layer, with the kernel that moved most; kernels that are part of
    either write (a rope_then_* write's rotary) are left out. None where it is within 0.1 µs
    or either trace has no such kernels."""
    if not mine.other_kernels or not theirs.other_kernels:
        return None
    names = (set(mine.other_kernels) | set(theirs.other_kernels)) - set(mine.write_kernels) - set(theirs.write_kernels)
    moved = {n: mine.other_kernels.get(n, 0.0) - theirs.other_kernels.get(n, 0.0) for n in names}
    diff = sum(moved.values())
    if not moved or abs(diff) < 100.0:
        return None
    top = max(moved, key=lambda n: abs(moved[n]))
    more = "longer" if diff > 0 else "shorter"
    return (f"the layer's other kernels ran {abs(diff) / 1e3:.2f} µs {more} per layer beside {mine.variant}'s write "
            f"than beside {theirs.variant}'s (most: {_short(top)} {moved[top] / 1e3:+.2f} µs): a cost or saving of "
            "the step that is not in either write's own time")


def _short(name: str, width: int = 60) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _us(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e3:.2f} µs"


def _ms(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:.3f} ms"


def _where(b: WriteBoundary) -> list[str]:
    """What the trace shows about one variant's write beyond its critical-path time."""
    parts = []
    if b.second_stream:
        parts.append(f"{b.variant}'s write has work on a second stream in {b.second_stream}/{b.writes} writes and "
                     f"the next kernel's stream waits {_us(b.stream_wait_ns)} for it")
    if b.early_starts:
        how = " (programmatic dependent launch)" if b.same_stream_early == b.early_starts else ""
        parts.append(f"{b.variant}'s write began {_us(b.early_overlap_ns)} before its predecessor ended in "
                     f"{b.early_starts}/{b.writes} writes{how}")
    if b.early_next:
        parts.append(f"the kernel after {b.variant}'s write began before it ended in {b.early_next}/{b.writes} writes")
    return parts


def gap_notes(savings: list[StepSaving], boundaries: list[WriteBoundary], sources: list[str]) -> list[str]:
    """One sentence per saving whose measured value is off its projection by more than its
    spread, with the trace's account (the most trusted source that traced both variants)."""
    at = {(b.variant, b.source, b.phase, b.size): b for b in boundaries}
    order = [s for s in sources if s != _REFERENCE] + sorted({b.source for b in boundaries} - set(sources))
    notes = []
    for s in savings:
        if s.gap_ns is None or abs(s.gap_ns) <= (s.spread_ns or 0.0):
            continue
        head = (f"{s.variant} vs {s.against}, {s.phase} {s.size}: {_ms(s.saving_ns)} ± {_ms(s.spread_ns)} per step "
                f"measured in the layer, {_ms(s.projected_ns)} projected from the writes alone (gap "
                f"{s.gap_ns / 1e6:+.3f} ms)")
        if s.clock == "wall":
            notes.append(f"{head}; a CPU's wall clock: host time, no GPU timeline to account for it")
            continue
        pair = next(((at[(s.variant, src, s.phase, s.size)], at[(s.against, src, s.phase, s.size)])
                     for src in order if (s.variant, src, s.phase, s.size) in at
                     and (s.against, src, s.phase, s.size) in at), None)
        if pair is None:
            notes.append(f"{head}; no profiled GPU trace of both in the layer to account for it")
            continue
        mine, theirs = pair
        account = [f"in the {mine.source} trace a {s.variant} write adds {_us(mine.critical_ns)} to the GPU "
                   f"critical path per layer, a {s.against} write {_us(theirs.critical_ns)}"]
        if mine.critical_ns is not None and theirs.critical_ns is not None:
            account[0] += (f": {s.layers} layers x the difference = "
                           f"{_ms((theirs.critical_ns - mine.critical_ns) * s.layers)} per step")
        account += _where(mine) + _where(theirs)
        other = _other_account(mine, theirs)
        if other:
            account.append(other)
        notes.append(f"{head}; " + "; ".join(account))
    return notes


@dataclass
class LayerSteps:
    """summary.json's ``layer_steps``: the savings, the trace's write boundaries, the notes."""

    against: list[str] = field(default_factory=list)
    savings: list[StepSaving] = field(default_factory=list)
    boundaries: list[WriteBoundary] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"against": list(self.against), "savings": [s.to_json() for s in self.savings],
                "boundaries": [b.to_json() for b in self.boundaries], "notes": list(self.notes)}

    @classmethod
    def from_json(cls, d: Any) -> LayerSteps | None:
        if not isinstance(d, dict):
            return None
        return cls(against=[str(x) for x in d.get("against") or []],
                   savings=[StepSaving.from_json(x) for x in d.get("savings") or [] if isinstance(x, dict)],
                   boundaries=[WriteBoundary.from_json(x) for x in d.get("boundaries") or [] if isinstance(x, dict)],
                   notes=[str(x) for x in d.get("notes") or []])


def layer_steps(timings: StepTimings | None, boundaries: list[WriteBoundary], sources: list[str],
                against: tuple[str, ...] = AGAINST) -> LayerSteps | None:
    """The whole ``layer_steps`` entry; None for a run without a decoder context."""
    if timings is None or timings.context != "layer":
        return None
    savings = step_savings(timings, against)
    present = {s.against for s in savings}
    return LayerSteps(against=[a for a in against if a in present], savings=savings, boundaries=boundaries,
                      notes=gap_notes(savings, boundaries, sources))


__all__ = ["AGAINST", "LayerSteps", "StepSaving", "WriteBoundary", "gap_notes", "layer_steps", "step_savings",
           "write_boundaries"]
