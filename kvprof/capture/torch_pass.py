"""The torch.profiler pass: one gzipped Chrome trace per variant, self-describing.

The trace carries a top-level ``kvprof`` key (variant, layer order, bytes per token,
kernels per write from an eager template, the paths the writer reported) so that it can
be analysed without its run directory, and ``distributedInfo`` so that
HolisticTraceAnalysis loads it.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile

from kvprof.capture.session import PreparedPhase, StepTimer, VariantSession
from kvprof.core.interrupts import signals_deferred
from kvprof.core.run import TraceMeta, hta_metadata_json
from kvprof.core.rundir import RunDir
from kvprof.core.schema import GPU_WORK_KINDS
from kvprof.core.timings import StepSamples

if TYPE_CHECKING:
    import pandas as pd

# A Kineto trace file -> its event table (kvprof.core.schema), each write's activities
# attributed: the trace readers' work, which sits above capture; ``kvprof.api`` hands it down.
EventReader = Callable[[Path], "pd.DataFrame"]

# Kineto (torch >= 2.13) writes a marker line to fd 2 whenever a profiler starts or stops,
# "USDT:<date> <time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start": noise
# between kvprof's own lines, with nothing for the user to act on.
_KINETO_MARKER = re.compile(rb"^USDT:\S+ \S+ \d+:\d+ \S+\] profiler_(start|stop)\s*$")


@contextlib.contextmanager
def _without_kineto_markers() -> Iterator[None]:
    """Hold fd 2 in a temporary file for the duration, then pass on every line but Kineto's
    start/stop markers (its warnings and errors, and anything Python wrote, still reach stderr)."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as held:
        saved = os.dup(2)
        try:
            os.dup2(held.fileno(), 2)
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = b"".join(line for line in held if not _KINETO_MARKER.match(line))
            if kept:
                os.write(2, kept)


@contextlib.contextmanager
def recording(prof: profile) -> Iterator[profile]:
    """``with prof:`` with Kineto's start/stop markers left out of stderr."""
    with _without_kineto_markers():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _without_kineto_markers():
            prof.__exit__(*sys.exc_info())


def _activities(device: torch.device) -> list[ProfilerActivity]:
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


def _experimental(sync_events: bool) -> Any:
    """torch.profiler's experimental config: cuda_sync events only when asked for."""
    if not sync_events:
        return None
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(enable_cuda_sync_events=True)
    except (ImportError, TypeError):  # older torch: no sync events, everything else still works
        return None


def step_template(session: VariantSession, prepared: PreparedPhase, read_events: EventReader) -> dict[str, Any]:
    """What one eager step launches, from a throwaway trace attributed by kvprof itself.

    Graph replays carry no per-write ranges, so the analysis cuts a replay by this
    template: ``ops_per_layer`` GPU activities per layer in start order, of which those
    at ``write_positions`` belong to the write (all of them without a decoder context).
    ``kernels``/``memcpy``/``memset`` count one write's own activities. Measured, not
    assumed from the writer's claim; None where the step does not split evenly by layer.
    ``read_events`` reads the throwaway trace (``EventReader``).
    """
    empty: dict[str, Any] = {"kernels": None, "memcpy": None, "memset": None}
    if session.device.type != "cuda":
        return empty
    with recording(profile(activities=_activities(session.device))) as prof:
        session.step(prepared, prepared.locs[0])
        session.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "template.json")
        prof.export_chrome_trace(path)
        ev = read_events(Path(path))
    work = ev[ev["kind"].isin(GPU_WORK_KINDS)].sort_values(["start_ns", "dur_ns"], kind="stable")
    layers = len(session.layers)
    if len(work) == 0 or len(work) % layers:
        return empty
    per = len(work) // layers
    in_write = (work["write_id"].to_numpy() >= 0).reshape(layers, per)
    if not (in_write == in_write[0]).all():
        return empty  # layers differ in where their write sits: no template to cut by
    positions = [int(i) for i in in_write[0].nonzero()[0]]
    kinds = work["kind"].astype(str).to_numpy().reshape(layers, per)[0][positions]
    return {
        "kernels": int((kinds == "kernel").sum()), "memcpy": int((kinds == "gpu_memcpy").sum()),
        "memset": int((kinds == "gpu_memset").sum()), "ops_per_layer": per, "write_positions": positions,
    }


@dataclass
class TorchPassResult:
    torch_trace: str  # the trace's file name in the run directory
    meta: TraceMeta  # the metadata written into it (paths, kernels per write, template, bytes per token)
    step_timings: list[StepSamples]


def run_torch_pass(
    session: VariantSession,
    out_dir: Path,
    metadata: TraceMeta,
    *,
    read_events: EventReader,
    on_step: Callable[[], None] | None = None,
    sync_events: bool = False,
    rank: int = 0,
    world_size: int = 1,
    name: str | None = None,
) -> TorchPassResult:
    """Warm up, capture graphs, then profile every phase; write ``<variant>.pt.trace.json.gz``.

    Each measured step is also timed as the reference pass times it (``step_timings`` in
    the result), so the profiler's slowdown of the run can be told from its reading error.
    ``rank``/``world_size``/``name``: one rank's trace of a multi-rank capture; ``read_events``:
    how the step templates' throwaway traces are read (CUDA only).
    """
    prepared: list[PreparedPhase] = []
    templates: dict[str, dict[str, Any]] = {}
    for i, spec in enumerate(session.phases):
        p = session.prepare(spec, i)
        session.warm_up(p)
        templates[f"{spec.phase} {spec.size}"] = step_template(session, p, read_events)
        if spec.graph:
            session.capture_graph(p)
        prepared.append(p)
    session.pool.path_counts.clear()  # from here on: only the measured steps
    timers = {p.spec: StepTimer(session.device, p.spec.steps) for p in prepared}
    # a schedule that always records: torch.profiler then marks each prof.step() with a
    # ProfilerStep#N range, the iterations HolisticTraceAnalysis looks for
    with recording(profile(activities=_activities(session.device), experimental_config=_experimental(sync_events),
                           schedule=lambda step: ProfilerAction.RECORD)) as prof:

        def stepped() -> None:
            # step() makes the next ProfilerStep#N range, then enters it: an interrupt between the
            # two left a range the profiler's stop could not close (a SIGSEGV, not exit 130)
            with signals_deferred():
                prof.step()
            if on_step is not None:
                on_step()

        for p in prepared:
            session.run_phase(p, stepped, timer=timers[p.spec])
        paths = session.measured_paths(prepared)
        meta = replace(
            metadata,
            layers=list(session.layers),
            context=session.mode if session.mode == "layer" else "none",
            bytes_per_token=session.bytes_per_token(),
            phases=[p.spec.as_dict() for p in prepared],
            # keyed "<phase> <size>", e.g. "decode 10"
            kernels_per_write={k: v["kernels"] for k, v in templates.items()},
            template=templates,
            paths=paths,
        )
        # metadata must be added while the profiler is still recording
        prof.add_metadata_json("kvprof", orjson.dumps(meta.to_json()).decode())
        # HolisticTraceAnalysis reads the rank here
        prof.add_metadata_json("distributedInfo", hta_metadata_json(rank=rank, world_size=world_size))
    name = name or RunDir.torch_trace_name(session.writer.name)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        raw = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(raw)
        with open(raw, "rb") as src, gzip.open(out_dir / name, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    step_timings = [
        StepSamples(variant=session.writer.name, pass_="kineto", phase=p.spec.phase, size=p.spec.size,
                    mode=session.mode, graph=p.spec.graph, writes_per_step=len(session.layers),
                    clock=timers[p.spec].clock, samples_ns=tuple(timers[p.spec].samples_ns()))
        for p in prepared
    ]
    del prepared
    return TorchPassResult(torch_trace=name, meta=meta, step_timings=step_timings)
