"""``step_timings.json``: per-step times measured by the workload itself, per pass.

The reference pass runs each variant's steps with no profiler and no ranges and times
each with CUDA events (wall clock on CPU): the unperturbed figure every profiler's
reading is held against. The profiled passes time their own steps the same way, which
separates a profiler's two effects: how much it slows the real run (pass timing over
reference) and how far its reading is from what ran (reading over pass timing). On a CPU
the reference pass also times a ``control`` series between its steps (the same bytes
copied by torch alone): the machine's own speed at each step.

Torch-free: the analysis reads it without importing the workload.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from kvprof.core.sources import REFERENCE, SOURCES, source_names

TIMINGS_SCHEMA = "kvprof.step_timings/1"
PASSES = source_names(SOURCES)  # the reference pass, then one per profiler source
CONTROL = "control"  # a CPU reference pass's control series: the machine's speed between the steps
# the same bytes stored by numpy, no torch: the machine's speed free of any code a variant runs
# (torch's index_put is the index_put variant's own code; a slower torch slows CONTROL with it)
FREE_CONTROL = "control_numpy"
CONTROLS = (CONTROL, FREE_CONTROL)
CUDA_EVENTS = "cuda_events"  # StepSamples.clock on a CUDA device (kvprof.capture.session.StepTimer)
WALL = "wall"  # StepSamples.clock on a CPU: time.perf_counter_ns around the step
CLOCK_WORDS = {CUDA_EVENTS: "CUDA events", WALL: "wall clock"}
SOURCE_NAMES = {s.name: s.pass_words for s in SOURCES}


@dataclass(frozen=True)
class StepSamples:
    """Times of consecutive steps of one (variant, pass, phase, size, mode)."""

    variant: str
    pass_: str  # "reference", or the source of the profiled pass it was timed in
    phase: str
    size: int
    mode: str  # "writes", "layer", "layer_no_write" (kvprof.capture.session.MODES), CONTROL or FREE_CONTROL
    graph: bool
    writes_per_step: int  # layers whose write the step holds (0 for layer_no_write)
    clock: str  # "cuda_events" or "wall"
    samples_ns: tuple[float, ...]

    @property
    def median_ns(self) -> float:
        return float(statistics.median(self.samples_ns)) if self.samples_ns else float("nan")

    @property
    def iqr_ns(self) -> float:
        if len(self.samples_ns) < 4:
            return float("nan")
        q = statistics.quantiles(self.samples_ns, n=4, method="inclusive")  # as pandas
        return float(q[2] - q[0])

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        d["samples_ns"] = [round(x, 1) for x in self.samples_ns]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepSamples:
        return cls(
            variant=str(d["variant"]), pass_=str(d["pass"]), phase=str(d["phase"]), size=int(d["size"]),
            mode=str(d.get("mode", "writes")), graph=bool(d.get("graph", False)),
            writes_per_step=int(d.get("writes_per_step", 0)), clock=str(d.get("clock", "cuda_events")),
            samples_ns=tuple(float(x) for x in d.get("samples_ns") or ()),
        )


@dataclass
class StepTimings:
    """Every timed series of a run; the reference's context says what a step held."""

    context: str = "none"
    context_len: int | None = None
    records: list[StepSamples] = field(default_factory=list)

    def add(self, rec: StepSamples) -> None:
        self.records.append(rec)

    def select(self, *, pass_: str | None = None, mode: str | None = None) -> list[StepSamples]:
        return [r for r in self.records if (pass_ is None or r.pass_ == pass_) and (mode is None or r.mode == mode)]

    def to_json(self) -> bytes:
        doc = {"schema": TIMINGS_SCHEMA, "context": self.context, "context_len": self.context_len,
               "records": [r.to_json() for r in self.records]}
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, data: bytes | str) -> StepTimings:
        doc = orjson.loads(data)
        if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("kvprof.step_timings/"):
            raise ValueError("not a kvprof step_timings document")
        recs = doc.get("records")
        if not isinstance(recs, list):
            raise ValueError("step_timings: 'records' is not a list")
        return cls(context=str(doc.get("context") or "none"), context_len=doc.get("context_len"),
                   records=[StepSamples.from_json(r) for r in recs if isinstance(r, dict)])


@dataclass(frozen=True)
class SourceTiming:
    """How one source of a run timed its figures, in the words every view uses.

    The reference pass records its clock per series (``StepSamples.clock``, summary.json's
    ``reference.clock``): CUDA events on a GPU, the wall clock on a CPU. A profiler source
    times GPU work only where its trace holds GPU events. Only GPU time says anything of a
    GPU serving step: the share of the inter-token latency and the saving per decode step
    exist only where ``gpu`` is true, and a CPU run's figures are labelled wall clock.
    """

    source: str | None
    clock: str | None  # CUDA_EVENTS, WALL, "mixed" (reference); "gpu" or "host" (profilers); None: unknown

    @property
    def gpu(self) -> bool:
        return self.clock in (CUDA_EVENTS, "gpu")

    @property
    def how(self) -> str:
        """The clock in a few words: "wall clock", "CUDA events", "the profiler's GPU timestamps"."""
        if self.clock in CLOCK_WORDS:
            return CLOCK_WORDS[self.clock]
        return {"gpu": "the profiler's GPU timestamps", "host": "host time only (no GPU events)",
                "mixed": "CUDA events and wall clock"}.get(str(self.clock), "clock unknown")

    @property
    def words(self) -> str:
        """The source and its clock: "the reference pass (no profiler attached, wall clock)"."""
        if self.source is None:
            return "no source"
        if self.source == REFERENCE.name:
            return "the reference pass (no profiler attached" + (f", {self.how})" if self.clock else ")")
        name = SOURCE_NAMES.get(self.source, self.source)
        return name if self.gpu or self.clock is None else f"{name}, {self.how}"

    def _qualified(self, what: str) -> str:
        if self.gpu:
            return f"GPU {what}"
        return what if self.clock is None else f"{what} ({self.how})"

    @property
    def unit(self) -> str:
        """What a per-write figure of this source is in: "GPU µs", "µs (wall clock)"."""
        return self._qualified("µs")

    @property
    def per_write(self) -> str:
        """An axis title: "GPU µs per write", "µs per write (wall clock)"."""
        return self._qualified("µs per write")

    @property
    def per_write_short(self) -> str:
        """A column header: "GPU µs/write", "µs/write (wall clock)"."""
        return self._qualified("µs/write")

    @property
    def no_step_why(self) -> tuple[str, str]:
        """Why a saving per decode step or a share of the ITL does not exist here: (a word, a sentence)."""
        if self.clock == WALL:
            return "CPU", "a CPU's wall clock says nothing of a GPU's decode step"
        return "no GPU time", "this source timed no GPU work"


def source_timing(source: str | None, reference: Mapping[str, Any] | None,
                  traces: Sequence[Mapping[str, Any]] | None) -> SourceTiming:
    """``source``'s timing from summary.json's ``reference`` and ``traces`` (their clocks and
    GPU event counts); kvprof.core.summary.Summary.timing is the same for a typed summary."""
    if source is None:
        return SourceTiming(None, None)
    if source == REFERENCE.name:
        listed = reference.get("clock") if isinstance(reference, Mapping) else None
        clocks = sorted({str(c) for c in listed}) if isinstance(listed, list) else []
        return SourceTiming(source, clocks[0] if len(clocks) == 1 else "mixed" if clocks else None)
    mine = [t for t in (traces if isinstance(traces, Sequence) else []) if isinstance(t, Mapping)
            and str(t.get("source")) == source]
    if not mine:
        return SourceTiming(source, None)
    gpu = any(isinstance(n := t.get("gpu_events"), (int, float)) and n > 0 for t in mine)
    return SourceTiming(source, "gpu" if gpu else "host")


__all__ = ["CLOCK_WORDS", "CONTROL", "CONTROLS", "CUDA_EVENTS", "FREE_CONTROL", "PASSES", "SOURCE_NAMES",
           "TIMINGS_SCHEMA", "WALL", "SourceTiming", "StepSamples", "StepTimings", "source_timing"]
