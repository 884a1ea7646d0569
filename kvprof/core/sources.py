"""The timing sources: where a figure was timed, in which order they are trusted, and their words.

A run's figures come from three sources: the reference pass (the workload's own step times,
no profiler attached), torch.profiler's Kineto trace and Nsight Systems' trace. Their names
are the keys of step_timings.json's passes, of summary.json's ``trusted_sources`` and of the
event table's ``source`` column; every view labels them with the words below. One
definition here, so the analysis, the reports and the dashboard agree on the names, the
order and the labels.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TimingSource:
    """One timing source and each of its labels."""

    name: str  # the key in step_timings.json, summary.json and the event table
    profiler: bool  # a profiler's trace (False: the reference pass, no profiler attached)
    short: str  # a table column's abbreviation ("ref", "torch")
    tool: str  # what timed it, in a few words ("no profiler", "torch.profiler")
    label: str  # in a sentence about the source ("reference (no profiler)")
    pass_words: str  # the pass that timed it ("the reference pass", "torch.profiler (Kineto)")
    prose: str  # in the console's sentences ("the unprofiled reference")


REFERENCE = TimingSource("reference", profiler=False, short="ref", tool="no profiler", label="reference (no profiler)",
                         pass_words="the reference pass", prose="the unprofiled reference")
KINETO = TimingSource("kineto", profiler=True, short="torch", tool="torch.profiler", label="torch.profiler",
                      pass_words="torch.profiler (Kineto)", prose="torch.profiler")
NSYS = TimingSource("nsys", profiler=True, short="nsys", tool="Nsight Systems", label="Nsight Systems",
                    pass_words="Nsight Systems", prose="Nsight Systems")

# every source, in the order a capture runs its passes: the reference, then one per profiler
SOURCES: tuple[TimingSource, ...] = (REFERENCE, KINETO, NSYS)
# the profilers, in the order a capture runs them (and a trace's event table names them)
PROFILED: tuple[TimingSource, ...] = tuple(s for s in SOURCES if s.profiler)
# the profilers by prior trust, when no measurement ranks them: nsys perturbs graph replays less
# (docs/observer-effect.md)
PROFILER_PRIOR: tuple[TimingSource, ...] = (NSYS, KINETO)
# where headline figures come from when a run ranks no source: the reference, then the prior
TRUST_ORDER: tuple[TimingSource, ...] = (REFERENCE, *PROFILER_PRIOR)

BY_NAME: dict[str, TimingSource] = {s.name: s for s in SOURCES}


def source_names(sources: tuple[TimingSource, ...]) -> tuple[str, ...]:
    """The sources' names, in their order."""
    return tuple(s.name for s in sources)


__all__ = ["BY_NAME", "KINETO", "NSYS", "PROFILED", "PROFILER_PRIOR", "REFERENCE", "SOURCES", "TRUST_ORDER",
           "TimingSource", "source_names"]
