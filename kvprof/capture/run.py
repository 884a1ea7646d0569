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

from kvprof.capture.config import CaptureConfig
from kvprof.capture.layout_session import session_for
from kvprof.capture.plan import (
    CapturedRun,
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
from kvprof.capture.runtime import Runtime, prepare
from kvprof.capture.torch_pass import run_torch_pass
from kvprof.core.atomic import atomic_directory
from kvprof.core.errors import KvprofError, ToolError
from kvprof.core.run import Manifest, PathReport, TraceMeta, VariantEntry
from kvprof.core.rundir import RunDir
from kvprof.core.timings import StepTimings
from kvprof.kvcache.devinfo import torch_threads
from kvprof.kvcache.dtypes import short_name
from kvprof.kvcache.guards import check_capture

if TYPE_CHECKING:
    from kvprof.kvcache.layer import DecoderContext


def capture(
    config: CaptureConfig,
    *,
    progress_factory: Callable[[int], Any] | None = None,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
) -> CapturedRun:
    """Run every variant and write the run directory; nothing is analysed (kvprof.api.capture does)."""
    config, runtime = prepare(config)  # before any writer is built: Triton's interpreter on a CPU
    if config.ranks is not None:  # one process per rank (kvprof.capture.ranks)
        from kvprof.capture.ranks import capture_ranks

        return capture_ranks(config, log=log, runtime=runtime)
    with torch_threads(config.threads):
        return _capture(config, runtime, progress_factory, log)


_OPTION = {"layers": "--layers", "threads": "--threads", "decode_sizes": "--batch-sizes",
           "context_len": "--context-len", "prefill_sizes": "--prefill-tokens", "reference_steps": "--reference-steps"}


_PHASE_OF = {"decode_sizes": "decode", "context_len": "decode", "prefill_sizes": "prefill"}


def defaults_line(config: CaptureConfig, device_type: str) -> str | None:
    """With --context layer on a CPU, the smaller settings the capture chose for the options
    left out, so that a first run says what it ran (none on CUDA, where the defaults are the
    documented ones; the writes alone say their layers and threads in the first summary)."""
    if device_type == "cuda" or config.context != "layer" or not config.device_defaults:
        return None
    model_layers = config.rank_shape().layers
    parts = []
    for key, value in config.device_defaults.items():
        if key not in _OPTION:
            continue
        if key in ("decode_sizes", "context_len", "prefill_sizes") and _PHASE_OF[key] not in config.phases:
            continue  # a size of a phase that does not run
        shown = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        parts.append(f"{_OPTION[key]} {shown}" + (f" (of {model_layers})" if key == "layers" else ""))
    if not parts:
        return None
    return (f"on {device_type}: {', '.join(parts)} (defaults on a CPU, to finish in minutes; pass an option to "
            "change it)")


def _capture(config: CaptureConfig, runtime: Runtime, progress_factory: Callable[[int], Any] | None,
             log: Callable[[str], None]) -> CapturedRun:
    device = runtime.device
    planned = plan_variants(config, device)
    check_capture(config, device)  # sizes and memory, before anything is allocated
    config = config.with_run_id()
    run_id = str(config.run_id)
    final = Path(config.output) / run_id
    check_replaceable(final, config.force)
    problems: list[KvprofError] = []
    nsys_path = _nsys_or_problem(config, problems)
    runnable = [p for p in planned if p.reason is None]
    context = make_context(config, device)
    line = defaults_line(config, device.type)  # once nothing more is refused: a refusal is one line
    if line:
        log(line)
    for p in planned:
        if p.reason is not None:
            log(f"skipping {p.name}: {p.reason}")
    if context is not None:
        log(f"--context layer: {context.kernels.describe()}")
    sweep_stale(final.parent, log)
    with atomic_directory(final, replace=config.force) as tmp:
        tmp = Path(tmp)
        manifest = base_manifest(config, device, runtime, context)
        for p in planned:
            manifest.variants[p.name] = variant_entry(p)
        steps_per_variant = sum(ph.steps for ph in config.phase_specs(device.type == "cuda"))
        bar = progress_factory(steps_per_variant * len(runnable)) if progress_factory else None
        timings = StepTimings(context=config.context, context_len=config.context_len if context else None)
        try:
            for p in runnable:
                if bar is not None:
                    bar.describe(p.name)
                if config.profiler in ("torch", "both"):
                    _torch_pass(config, p, manifest, runtime, context, tmp, bar, timings)
                _reference_pass(config, p, manifest.variants[p.name], runtime, context, timings, log)
        finally:
            if bar is not None:
                bar.close()
        if nsys_path is not None:
            from kvprof.capture.nsys_pass import run_nsys_passes

            problems += run_nsys_passes(nsys_path, config, runnable, tmp, manifest, log, timings)
        run = RunDir(tmp)
        manifest.files = {RunDir.TIMINGS_KEY: run.write_timings(timings)}
        if config.scrub:
            manifest.scrubbed = scrub_files(tmp)
        manifest.problems = [str(e) for e in problems]
        manifest = scrub_manifest(manifest) if config.scrub else manifest  # its paths name $HOME
        run.write_manifest(manifest)
    return CapturedRun(final, manifest, problems)


def _nsys_or_problem(config: CaptureConfig, problems: list[KvprofError]) -> Path | None:
    """Where nsys is, when the profiler needs it. Not found: an error for ``--profiler nsys``;
    a problem added to ``problems`` for ``both`` (the torch pass still runs)."""
    if config.profiler not in ("nsys", "both"):
        return None
    from kvprof.tools.nsys import find_nsys

    nsys_path = find_nsys()
    if nsys_path is None:
        err = ToolError(
            "Nsight Systems (nsys) not found on PATH, in KVPROF_NSYS or the usual install folders"
        )
        if config.profiler == "nsys":
            raise err
        problems.append(err)
    return nsys_path


def _torch_pass(config: CaptureConfig, p: PlannedVariant, manifest: Manifest, runtime: Runtime,
                context: DecoderContext | None, tmp: Path, bar: Any, timings: StepTimings) -> None:
    """One variant under torch.profiler: its trace, paths and kernels per write go into its
    manifest entry, its step timings into ``timings``."""
    entry = manifest.variants[p.name]
    meta = TraceMeta(
        variant=p.name, fused=entry.fused_claim, run_id=str(config.run_id), layout=config.layout_name(),
        cache_dtype=short_name(config.cache_torch_dtype()),
        input_dtype=short_name(config.input_torch_dtype()),
        device=manifest.device, model=config.rank_shape().as_dict(),
        extra=trace_extra(entry),
    )
    with session_for(config, p.writer, runtime.device, context=context) as session:
        out = run_torch_pass(session, tmp, meta, on_step=bar.advance if bar else None,
                             sync_events=config.torch_sync_events)
    entry.files["torch_trace"] = out.torch_trace
    entry.paths = dict(out.meta.paths)
    entry.kernels_per_write = dict(out.meta.kernels_per_write)
    entry.bytes_per_token = out.meta.bytes_per_token
    entry.fused = PathReport.of_paths(entry.fused_claim, entry.paths)
    for rec in out.step_timings:
        timings.add(rec)


def _reference_pass(config: CaptureConfig, p: PlannedVariant, entry: VariantEntry, runtime: Runtime,
                    context: DecoderContext | None, timings: StepTimings, log: Callable[[str], None]) -> None:
    """The unperturbed figure every profiler's reading is held against; a failure is recorded
    in the variant's entry and logged, and the capture goes on."""
    try:
        for rec in run_reference_pass(config, p.writer, runtime.device, context):
            timings.add(rec)
    except (KvprofError, RuntimeError, ValueError) as exc:
        entry.reference_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        log(f"reference pass for {p.name} failed: {entry.reference_error}")


__all__ = ["CapturedRun", "capture", "check_replaceable", "plan_variants", "sweep_stale"]
