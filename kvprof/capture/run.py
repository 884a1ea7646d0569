"""``capture``: run the workload per variant and write ``traces/<run-id>/`` atomically.

The run directory is built under a temporary name and renamed at the end, so Ctrl-C or
an error never leaves a half-written run. The Nsight Systems pass comes after the
torch pass, in child processes with an allowlisted environment; if it fails, the torch
results are kept, the manifest says what went wrong, and the exit code says so too.
Capture analyses nothing: it returns the run (``CapturedRun``), and ``kvprof.api.capture``
opens, analyses and renders it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvprof.capture.defaults import CPU_REFERENCE_BUDGET_S
from kvprof.capture.layout_session import session_for
from kvprof.capture.plan import (
    CapturedRun,
    CapturePlan,
    PlannedVariant,
    base_manifest,
    check_replaceable,
    make_context,
    plan_variants,
    scrub_files,
    scrub_manifest,
    sweep_stale,
    trace_extra,
    variant_entry,
)
from kvprof.capture.reference import run_reference_pass
from kvprof.capture.runtime import Runtime, start
from kvprof.capture.torch_pass import EventReader, run_torch_pass
from kvprof.core.atomic import atomic_directory
from kvprof.core.errors import KvprofError, Setting, ToolError, Words, rendered
from kvprof.core.run import Manifest, PathReport, TraceMeta, VariantEntry
from kvprof.core.rundir import RunDir
from kvprof.core.timings import StepTimings
from kvprof.kvcache.devinfo import torch_threads
from kvprof.kvcache.dtypes import short_name
from kvprof.kvcache.guards import check_capture

if TYPE_CHECKING:
    from kvprof.kvcache.layer import DecoderContext


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def capture(
    plan: CapturePlan,
    *,
    progress_factory: Callable[[int], Any] | None = None,
    log: Callable[[str], None] = _stderr,
    names: Callable[[str], str] = str,
    read_events: EventReader,
) -> CapturedRun:
    """Run every variant of ``plan`` (``kvprof.capture.plan.resolve``: the one resolution of a
    ``CaptureConfig``) and write the run directory; nothing is analysed (kvprof.api.capture does).

    ``names``: how what the run records (a variant's reason, a failed pass) spells a setting
    (the field, unless the command line gives its flags); ``log`` gets ``Words`` it can render
    likewise. ``read_events``: how a step's throwaway trace is read on CUDA (the trace readers,
    which sit above capture, handed down by ``kvprof.api``)."""
    runtime = start(plan.device, plan.threads)  # before any writer is built: Triton's interpreter on a CPU
    if plan.ranks is not None:  # one process per rank (kvprof.capture.ranks)
        from kvprof.capture.ranks import capture_ranks

        spec = f"{read_events.__module__}:{read_events.__qualname__}"  # each rank imports it by this name
        return capture_ranks(plan, log=log, runtime=runtime, names=names, read_events=spec)
    with torch_threads(plan.threads):
        return _capture(plan, runtime, progress_factory, log, names, read_events)


# the device-dependent defaults the console names, and the phase whose size each one is
_SHOWN = ("layers", "threads", "decode_sizes", "context_len", "prefill_sizes", "reference_steps")
_PHASE_OF = {"decode_sizes": "decode", "context_len": "decode", "prefill_sizes": "prefill"}


def defaults_line(plan: CapturePlan) -> Words | None:
    """With context ``layer`` on a CPU, the smaller settings the capture chose for the options
    left out, so that a first run says what it ran (none on CUDA, where the defaults are the
    documented ones; the writes alone say their layers and threads in the first summary)."""
    device_type = plan.device.type
    if device_type == "cuda" or plan.context != "layer" or not plan.device_defaults:
        return None
    parts: list[object] = []
    for key, value in plan.device_defaults.items():
        if key not in _SHOWN:
            continue
        if key in _PHASE_OF and _PHASE_OF[key] not in plan.phase_names:
            continue  # a size of a phase that does not run
        shown = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        up_to = plan.device_defaults.get("reference_steps_up_to")
        if key == "reference_steps" and up_to is not None and up_to > value:
            shown += f" to {up_to} (on while a point's steps took under {CPU_REFERENCE_BUDGET_S:g} s)"
        parts += [", " if parts else "", Setting(key), f" {shown}"
                  + (f" (of {plan.shape.layers})" if key == "layers" else "")]
    if not parts:
        return None
    return Words(f"on {device_type}: ", *parts,
                 " (defaults on a CPU, to finish in minutes; pass an option to change it)")


def _capture(plan: CapturePlan, runtime: Runtime, progress_factory: Callable[[int], Any] | None,
             log: Callable[[str], None], names: Callable[[str], str], read_events: EventReader) -> CapturedRun:
    device = runtime.device
    planned = plan_variants(plan)
    check_capture(plan, device)  # sizes and memory, before anything is allocated
    final = plan.final
    check_replaceable(final, plan.force)
    problems: list[KvprofError] = []
    nsys_path = _nsys_or_problem(plan, problems)
    runnable = [p for p in planned if p.reason is None]
    context = make_context(plan)
    line = defaults_line(plan)  # once nothing more is refused: a refusal is one line
    if line:
        log(line)
    for p in planned:
        if p.reason is not None:
            log(Words(f"skipping {p.name}: ", p.reason))
    if context is not None:
        log(Words(Setting("context"), f" layer: {context.kernels.describe()}"))
    sweep_stale(final.parent, log)
    with atomic_directory(final, replace=plan.force) as tmp:
        tmp = Path(tmp)
        manifest = base_manifest(plan, device, runtime, context)
        for p in planned:
            manifest.variants[p.name] = variant_entry(p, names)
        steps_per_variant = sum(ph.steps for ph in plan.phases)
        bar = progress_factory(steps_per_variant * len(runnable)) if progress_factory else None
        timings = StepTimings(context=plan.context, context_len=plan.context_len if context else None)
        try:
            for p in runnable:
                if bar is not None:
                    bar.describe(p.name)
                if plan.profiler in ("torch", "both"):
                    _torch_pass(plan, p, manifest, runtime, context, tmp, bar, timings, read_events)
                _reference_pass(plan, p, manifest.variants[p.name], runtime, context, timings, log, names)
        finally:
            if bar is not None:
                bar.close()
        if nsys_path is not None:
            from kvprof.capture.nsys_pass import run_nsys_passes

            problems += run_nsys_passes(nsys_path, plan, runnable, tmp, manifest, log, timings, names)
        run = RunDir(tmp)
        manifest.files = {RunDir.TIMINGS_KEY: run.write_timings(timings)}
        if plan.scrub:
            manifest.scrubbed = scrub_files(tmp)
        manifest.problems = [rendered(e, names) for e in problems]
        manifest = scrub_manifest(manifest) if plan.scrub else manifest  # its paths name $HOME
        run.write_manifest(manifest)
    return CapturedRun(final, manifest, problems)


def _nsys_or_problem(plan: CapturePlan, problems: list[KvprofError]) -> Path | None:
    """Where nsys is, when the profiler needs it. Not found: an error for profiler ``nsys``;
    a problem added to ``problems`` for ``both`` (the torch pass still runs)."""
    if plan.profiler not in ("nsys", "both"):
        return None
    from kvprof.tools.nsys import find_nsys

    nsys_path = find_nsys()
    if nsys_path is None:
        err = ToolError(
            "Nsight Systems (nsys) not found on PATH, in KVPROF_NSYS or the usual install folders"
        )
        if plan.profiler == "nsys":
            raise err
        problems.append(err)
    return nsys_path


def _torch_pass(plan: CapturePlan, p: PlannedVariant, manifest: Manifest, runtime: Runtime,
                context: DecoderContext | None, tmp: Path, bar: Any, timings: StepTimings,
                read_events: EventReader) -> None:
    """One variant under torch.profiler: its trace, paths and kernels per write go into its
    manifest entry, its step timings into ``timings``."""
    entry = manifest.variants[p.name]
    meta = TraceMeta(
        variant=p.name, fused=entry.fused_claim, run_id=plan.run_id, layout=plan.layout,
        cache_dtype=short_name(plan.cache_dtype), input_dtype=short_name(plan.input_dtype),
        device=manifest.device, model=plan.shape.as_dict(),
        extra=trace_extra(entry),
    )
    with session_for(plan, p.writer, runtime.device, context=context) as session:
        out = run_torch_pass(session, tmp, meta, on_step=bar.advance if bar else None,
                             sync_events=plan.torch_sync_events, read_events=read_events)
    entry.files["torch_trace"] = out.torch_trace
    entry.paths = dict(out.meta.paths)
    entry.kernels_per_write = dict(out.meta.kernels_per_write)
    entry.bytes_per_token = out.meta.bytes_per_token
    entry.fused = PathReport.of_paths(entry.fused_claim, entry.paths)
    for rec in out.step_timings:
        timings.add(rec)


def _reference_pass(plan: CapturePlan, p: PlannedVariant, entry: VariantEntry, runtime: Runtime,
                    context: DecoderContext | None, timings: StepTimings, log: Callable[[str], None],
                    names: Callable[[str], str]) -> None:
    """The unperturbed figure every profiler's reading is held against; a failure is recorded
    in the variant's entry and logged, and the capture goes on."""
    try:
        for rec in run_reference_pass(plan, p.writer, runtime.device, context):
            timings.add(rec)
    except (KvprofError, RuntimeError, ValueError) as exc:
        entry.reference_error = f"{type(exc).__name__}: {rendered(exc, names)}".splitlines()[0]
        log(f"reference pass for {p.name} failed: {entry.reference_error}")


__all__ = ["CapturedRun", "capture", "check_replaceable", "defaults_line", "plan_variants", "sweep_stale"]
