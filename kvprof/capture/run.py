"""``capture``: run the workload per variant and write ``traces/<run-id>/`` atomically.

The run directory is built under a temporary name and renamed at the end, so Ctrl-C or
an error never leaves a half-written run. The Nsight Systems pass comes after the
torch pass, in child processes with an allowlisted environment; if it fails, the torch
results are kept, the manifest says what went wrong, and the exit code says so too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

import kvprof
from kvprof.core.atomic import atomic_directory, atomic_write_bytes, clean_stale
from kvprof.capture.config import CaptureConfig
from kvprof.capture.reference import run_reference_pass
from kvprof.capture.runtime import Runtime, prepare
from kvprof.capture.session import session_for
from kvprof.capture.summary import scrub_manifest, verify_run_dir
from kvprof.capture.torch_pass import run_torch_pass
from kvprof.core.run import MANIFEST, Manifest, PathReport, TraceMeta, VariantEntry
from kvprof.core.timings import TIMINGS_FILE, StepTimings
from kvprof.devinfo import device_properties, torch_threads, versions
from kvprof.dtypes import short_name
from kvprof.core.errors import DeviceError, KvprofError, OutputError, ToolError, UsageError
from kvprof.guards import check_capture
from kvprof.layer import DecoderContext, weight_bytes
from kvprof.layouts.registry import create_variant
from kvprof.writers import KVWriter

if TYPE_CHECKING:
    from kvprof.core.summary import Summary


@dataclass
class PlannedVariant:
    name: str
    writer: KVWriter
    reason: str | None  # None: runnable here


@dataclass
class CaptureResult:
    run_dir: Path
    manifest: Manifest
    problems: list[KvprofError] = field(default_factory=list)  # kept-but-failed parts (nsys)
    summary: Summary | None = None  # the analysis of the run, as `analyze` makes it
    analysis_error: str | None = None


def plan_variants(config: CaptureConfig, device: torch.device) -> list[PlannedVariant]:
    """Build each writer and ask whether it can run here; an explicitly named one must.
    A default variant that would only repeat another's kernel here (store_kv_fused on a CPU
    is triton_fused's kernel) is left out with that reason: same writes, twice the time."""
    cache, inp = config.cache_torch_dtype(), config.input_torch_dtype()
    planned: list[PlannedVariant] = []
    for name in config.variants:
        try:
            writer = create_variant(config.layout_name(), name, **config.writer_options.get(name, {}))
        except KvprofError as exc:
            if name in config.required_variants:
                raise
            planned.append(PlannedVariant(name, _Unavailable(name), str(exc)))
            continue
        reason = writer.unsupported_reason(device, cache, inp)
        if reason and name in config.required_variants:
            raise DeviceError(f"variant {name} cannot run on {device}: {reason}")
        if reason is None and name not in config.required_variants:
            reason = _repeats(writer, device, planned)
        planned.append(PlannedVariant(writer.name, writer, reason))
    if not any(p.reason is None for p in planned):
        why = "; ".join(f"{p.name}: {p.reason}" for p in planned)
        raise DeviceError(f"none of the variants can run on {device} ({why})")
    return planned


def _repeats(writer: KVWriter, device: torch.device, planned: list[PlannedVariant]) -> str | None:
    """Why ``writer`` would repeat a variant already planned to run here, or None."""
    kernel_for = getattr(writer, "kernel_for", None)  # writers that pick one of two kernels per call
    if kernel_for is None:
        return None
    eager, captured = kernel_for(device, captured=False), kernel_for(device, captured=True)
    same = eager if eager == captured else None
    if same and same != writer.name and any(p.name == same and p.reason is None for p in planned):
        return f"on {device.type} it runs {same}'s kernel, the same writes; --variants {writer.name} runs it anyway"
    return None


class _Unavailable(KVWriter):
    """Stands in for a writer that could not even be built, so the manifest can say why."""

    description = "could not be built"

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, *args: Any, **kwargs: Any) -> str:  # pragma: no cover - never planned to run
        raise RuntimeError(f"{self.name} is unavailable")


def base_manifest(config: CaptureConfig, device: torch.device, runtime: Runtime | None = None) -> Manifest:
    phases = config.phase_specs(graphs_possible=device.type == "cuda")
    settings = config.as_dict()
    if runtime is not None:
        settings["threads"] = runtime.threads
        settings["resolved"]["triton_interpret"] = runtime.triton_interpret
    return Manifest(
        kvprof=kvprof.__version__, run_id=config.run_id, versions=versions(), device=device_properties(device),
        config=settings, phases=[p.as_dict() for p in phases], cuda_graphs_used=any(p.graph for p in phases),
    )


def variant_entry(p: PlannedVariant) -> VariantEntry:
    """The manifest's entry for a planned variant; ``interpreted`` where its kernel runs under
    Triton's interpreter (on the host, in numpy: its times are not a GPU's)."""
    info = p.writer.info()
    entry = VariantEntry(available=p.reason is None, reason=p.reason, description=info.description,
                         fused_claim=info.fused)
    if p.reason is None and info.extra.get("interpreted"):
        entry.extra["interpreted"] = True
    return entry


def _memory_available(device: torch.device) -> int:
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * 0.8)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") * 0.5)
    except (ValueError, OSError, AttributeError):
        return 4 << 30


def make_context(config: CaptureConfig, device: torch.device) -> DecoderContext | None:
    """The decoder layers around the writes (``--context layer``), once per capture; refused
    before allocating when its weights would not fit."""
    if config.context != "layer":
        return None
    shape = config.rank_shape()
    dtype = config.input_torch_dtype()
    need, have = weight_bytes(shape, dtype), _memory_available(device)
    if need > have:
        raise UsageError(
            f"--context layer for {shape.model} at tp {shape.tp} needs {need / 2**30:.1f} GiB of weights on "
            f"{device}, more than the {have / 2**30:.1f} GiB available; pick a smaller --model or a larger --tp")
    return DecoderContext(shape, dtype, device, config.context_len, seed=config.seed)


def capture(
    config: CaptureConfig,
    *,
    progress_factory: Callable[[int], Any] | None = None,
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr),
    analyse: bool = True,
) -> CaptureResult:
    runtime = prepare(config)  # before any writer is built: Triton's interpreter on a CPU
    if config.ranks is not None:  # one process per rank (kvprof.capture.ranks)
        from kvprof.capture.ranks import capture_ranks

        return capture_ranks(config, log=log, analyse=analyse, runtime=runtime)
    with torch_threads(config.threads):
        return _capture(config, runtime, progress_factory, log, analyse)


def _capture(config: CaptureConfig, runtime: Runtime, progress_factory: Callable[[int], Any] | None,
             log: Callable[[str], None], analyse: bool) -> CaptureResult:
    device = runtime.device
    planned = plan_variants(config, device)
    check_capture(config, device)  # sizes and memory, before anything is allocated
    run_id = config.ensure_run_id()
    final = Path(config.output) / run_id
    check_replaceable(final, config.force)
    nsys_path = None
    problems: list[KvprofError] = []
    if config.profiler in ("nsys", "both"):
        from kvprof.tools.nsys import find_nsys

        nsys_path = find_nsys()
        if nsys_path is None:
            err = ToolError(
                "Nsight Systems (nsys) not found on PATH, in KVPROF_NSYS or the usual install folders"
            )
            if config.profiler == "nsys":
                raise err
            problems.append(err)
    runnable = [p for p in planned if p.reason is None]
    context = make_context(config, device)
    for p in planned:
        if p.reason is not None:
            log(f"skipping {p.name}: {p.reason}")
    sweep_stale(final.parent, log)
    with atomic_directory(final, replace=config.force) as tmp:
        tmp = Path(tmp)
        manifest = base_manifest(config, device, runtime)
        for p in planned:
            manifest.variants[p.name] = variant_entry(p)
        steps_per_variant = sum(ph.steps for ph in config.phase_specs(device.type == "cuda"))
        bar = progress_factory(steps_per_variant * len(runnable)) if progress_factory else None
        timings = StepTimings(context=config.context, context_len=config.context_len if context else None)
        try:
            for p in runnable:
                entry = manifest.variants[p.name]
                if bar is not None:
                    bar.describe(p.name)
                if config.profiler in ("torch", "both"):
                    meta = TraceMeta(
                        variant=p.name, fused=entry.fused_claim, run_id=run_id, layout=config.layout_name(),
                        cache_dtype=short_name(config.cache_torch_dtype()),
                        input_dtype=short_name(config.input_torch_dtype()),
                        device=manifest.device, model=config.rank_shape().as_dict(),
                    )
                    with session_for(config, p.writer, device, context=context) as session:
                        out = run_torch_pass(session, tmp, meta, on_step=bar.advance if bar else None,
                                             sync_events=config.torch_sync_events)
                    entry.files["torch_trace"] = out.torch_trace
                    entry.paths = dict(out.meta.paths)
                    entry.kernels_per_write = dict(out.meta.kernels_per_write)
                    entry.bytes_per_token = out.meta.bytes_per_token
                    entry.fused = PathReport.of_paths(entry.fused_claim, entry.paths)
                    for rec in out.step_timings:
                        timings.add(rec)
                # the unperturbed figure every profiler's reading is held against
                try:
                    for rec in run_reference_pass(config, p.writer, device, context):
                        timings.add(rec)
                except (KvprofError, RuntimeError, ValueError) as exc:
                    entry.reference_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    log(f"reference pass for {p.name} failed: {entry.reference_error}")
        finally:
            if bar is not None:
                bar.close()
        if nsys_path is not None:
            from kvprof.capture.nsys_pass import run_nsys_passes

            problems += run_nsys_passes(nsys_path, config, runnable, tmp, manifest, log, timings)
        atomic_write_bytes(tmp / TIMINGS_FILE, timings.to_json())
        manifest.files = {"step_timings": TIMINGS_FILE}
        if config.scrub:
            from kvprof.tools.scrub import scrub_path

            manifest.scrubbed = [
                str(r) for f in sorted(tmp.iterdir()) if f.is_file() and (r := scrub_path(f)) is not None and r.changed
            ]
        manifest.problems = [str(e) for e in problems]
        manifest = scrub_manifest(manifest) if config.scrub else manifest  # its paths name $HOME
        atomic_write_bytes(tmp / MANIFEST, manifest.dumps())
    # The run is complete and in place; the analysis adds its files one atomic write each.
    summary: Summary | None = None
    analysis_error: str | None = "not analysed (--no-summary)"
    if analyse:
        from kvprof.capture.summary import analyze_run_dir

        summary, analysis_error = analyze_run_dir(final, config.rank_shape().layers, scrub=config.scrub)
    if config.scrub:  # after the last file: prove what was written is clean
        problems += verify_run_dir(final)
    return CaptureResult(final, manifest, problems, summary, analysis_error)


def sweep_stale(folder: Path, log: Callable[[str], None]) -> None:
    """Remove, and name, the hidden temporaries in ``folder`` of kvprof processes that are gone
    (killed outright, e.g. SIGKILL, where no cleanup could run)."""
    for path in clean_stale(folder):
        log(f"removed {path.name} from {folder}: left behind by a kvprof process that no longer runs")


def check_replaceable(final: Path, force: bool) -> None:
    """Before any work: an existing ``final`` needs --force, and --force replaces only a run
    directory (one holding manifest.json) or an empty folder, never some other folder."""
    if not (final.exists() or final.is_symlink()):
        return
    if not force:
        raise OutputError(f"cannot write {final}: it already exists (pass --force to replace it, "
                          "or choose another --run-id)")
    if final.is_symlink() or not final.is_dir():
        raise OutputError(f"cannot replace {final}: it is not a folder")
    if not (final / MANIFEST).is_file() and any(final.iterdir()):
        raise OutputError(f"cannot replace {final}: it is not a kvprof run directory (no {MANIFEST}); "
                          "--force replaces only run directories")


__all__ = ["CaptureResult", "capture", "check_replaceable", "plan_variants", "sweep_stale"]
