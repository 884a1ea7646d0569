"""``step_timings.json``: per-step times measured by the workload itself, per pass.

The reference pass runs each variant's steps with no profiler and no ranges and times
each with CUDA events (wall clock on CPU): the unperturbed figure every profiler's
reading is held against. The profiled passes time their own steps the same way, which
separates a profiler's two effects: how much it slows the real run (pass timing over
reference) and how far its reading is from what ran (reading over pass timing).

Torch-free: the analysis reads it without importing the workload.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

TIMINGS_SCHEMA = "kvprof.step_timings/1"
PASSES = ("reference", "kineto", "nsys")  # the reference pass, then one per profiler source


@dataclass(frozen=True)
class StepSamples:
    """Times of consecutive steps of one (variant, pass, phase, size, mode)."""

    variant: str
    pass_: str  # "reference", or the source of the profiled pass it was timed in
    phase: str
    size: int
    mode: str  # "writes", "layer" or "layer_no_write" (kvprof.capture.session.MODES)
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


__all__ = ["PASSES", "TIMINGS_SCHEMA", "StepSamples", "StepTimings"]
