"""A capture resolved once into a frozen plan, and what every capture (one process,
``--ranks N``, the nsys child) decides from it before it runs: the variants and why one
cannot run here, the manifest's base, the decoder context, whether the output may be
replaced; and what a finished capture returns.

``resolve`` is the one place a ``CaptureConfig`` (what the user or the facade gives) is
checked and turned into what a capture runs: the device, the layout, the rank's shape, the
dtypes, the phases and sizes, the device-dependent defaults, the run id. The capture
modules receive the ``CapturePlan`` and read its fields; none of them goes back to the
configuration for a derived value. Child processes (the nsys pass, the ranks) get the
plan's ``settings`` (the resolved configuration as the manifest records it) and resolve
them again here, to the same plan.

Capture writes a run and analyses nothing: ``CapturedRun`` is the run directory, its
manifest and the parts that failed but were kept; ``kvprof.api.capture`` opens and
analyses it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from types import MappingProxyType
from typing import Any

import torch

import kvprof
from kvprof.capture.config import CaptureConfig
from kvprof.capture.runtime import Runtime
from kvprof.core.atomic import clean_stale
from kvprof.core.errors import DeviceError, KvprofError, OutputError, Setting, Words, rendered
from kvprof.core.run import Manifest, VariantEntry
from kvprof.core.rundir import RunDir
from kvprof.kvcache.contracts import Writer
from kvprof.kvcache.devinfo import device_properties, resolve_device, versions
from kvprof.kvcache.guards import check_layer_weights, memory_limit
from kvprof.kvcache.layer import DecoderContext, layer_weight_bytes
from kvprof.kvcache.layouts.layout import get_layout
from kvprof.kvcache.layouts.registry import create_variant
from kvprof.kvcache.models import RankShape
from kvprof.kvcache.workload import PhaseSpec
from kvprof.kvcache.writers import KVWriter


@dataclass(frozen=True)
class CapturePlan:
    """Everything a capture runs, resolved once (``resolve``): read, never derived again."""

    device: torch.device
    layout: str  # mha, mla or paged (kvprof.kvcache.layouts)
    model: str  # the preset or shape as given (the MLA pools look their preset up by it)
    shape: RankShape  # one rank's pool: heads, dims, the model's layer count
    cache_dtype: torch.dtype
    input_dtype: torch.dtype
    loc_dtype: torch.dtype
    phases: tuple[PhaseSpec, ...]  # each (phase, size) block, graphs only where CUDA can capture them
    phase_names: tuple[str, ...]  # decode, prefill, serving as asked
    layers: int  # how many of the model's layers each step writes
    threads: int | None  # torch's CPU threads during the capture; None: torch's own (CUDA)
    context: str  # none, or layer (a decoder layer around each write)
    context_len: int  # cached tokens per decode request
    reference_steps: int  # timed unprofiled steps per (phase, size) and mode, at least
    # at most, timed past reference_steps while within the CPU's budget (== reference_steps: exactly)
    reference_steps_up_to: int
    steps: int
    warmup: int
    seed: int
    slots: str
    page_size: int
    pool_size: int | None
    k_scale: float | None
    v_scale: float | None
    max_memory_gb: float | None
    variants: tuple[str, ...]
    required_variants: frozenset[str]  # asked for by name: one that cannot run is an error
    writer_options: Mapping[str, Mapping[str, Any]]
    profiler: str
    torch_sync_events: bool
    nsys_graph_trace: str
    pass_env: tuple[str, ...]
    ranks: int | None
    run_id: str
    output: Path
    force: bool
    scrub: bool
    # the options left out and filled in for this device (the console names them)
    device_defaults: Mapping[str, Any]
    # the resolved configuration as the manifest records it (config.resolved included): what
    # a child process resolves again
    settings: Mapping[str, Any]

    @property
    def final(self) -> Path:
        """The run directory once in place."""
        return self.output / self.run_id

    def manifest_config(self) -> dict[str, Any]:
        """A copy of ``settings`` for a manifest to extend."""
        return copy.deepcopy(dict(self.settings))


def resolve(config: CaptureConfig, device: torch.device | None = None) -> CapturePlan:
    """The one resolution of a capture: ``config`` checked (UsageError, one line), the device
    (``device``, else the configuration's), the device-dependent defaults, a run id; every
    derived value computed here. ``config`` itself is left as it was."""
    checked = config.validate()
    if device is None:
        device = resolve_device(checked.device)
    resolved = checked.resolved_for(device.type).with_run_id()
    assert resolved.layers is not None and resolved.context_len is not None
    assert resolved.reference_steps is not None and resolved.run_id is not None
    options = {name: MappingProxyType(dict(o)) for name, o in resolved.writer_options.items()}
    return CapturePlan(
        device=device, layout=resolved.layout_name(), model=resolved.model, shape=resolved.rank_shape(),
        cache_dtype=resolved.cache_torch_dtype(), input_dtype=resolved.input_torch_dtype(),
        loc_dtype=resolved.torch_loc_dtype(),
        phases=tuple(resolved.phase_specs(graphs_possible=device.type == "cuda")),
        phase_names=tuple(resolved.phases), layers=resolved.layers, threads=resolved.threads,
        context=resolved.context, context_len=resolved.context_len, reference_steps=resolved.reference_steps,
        reference_steps_up_to=resolved.reference_steps_up_to or resolved.reference_steps,
        steps=resolved.steps, warmup=resolved.warmup, seed=resolved.seed, slots=resolved.slots,
        page_size=resolved.page_size, pool_size=resolved.pool_size, k_scale=resolved.k_scale,
        v_scale=resolved.v_scale, max_memory_gb=resolved.max_memory_gb, variants=tuple(resolved.variants),
        required_variants=frozenset(resolved.required_variants), writer_options=MappingProxyType(options),
        profiler=resolved.profiler, torch_sync_events=resolved.torch_sync_events,
        nsys_graph_trace=resolved.nsys_graph_trace, pass_env=tuple(resolved.pass_env), ranks=resolved.ranks,
        run_id=resolved.run_id, output=Path(resolved.output), force=resolved.force, scrub=resolved.scrub,
        device_defaults=MappingProxyType(dict(resolved.device_defaults)),
        settings=MappingProxyType(resolved.as_dict()),
    )


def resolve_settings(settings: Mapping[str, Any], device: torch.device | None = None) -> CapturePlan:
    """A child process's plan: the parent's ``settings`` resolved again (the same plan; a
    hand-made one is resolved like any configuration)."""
    return resolve(CaptureConfig.from_dict(dict(settings)), device)


@dataclass
class CapturedRun:
    """A finished capture: its run directory (renamed into place), its manifest, and the parts
    that failed while the run was kept (the nsys pass; the exit code says so)."""

    run_dir: Path
    manifest: Manifest
    problems: list[KvprofError] = field(default_factory=list)


@dataclass
class PlannedVariant:
    name: str
    writer: Writer
    reason: str | None  # None: runnable here
    # the writer's word on programmatic dependent launch here (Writer.launches_pdl); None: not said
    pdl_launch: bool | None = None


def plan_variants(plan: CapturePlan, device: torch.device | None = None) -> list[PlannedVariant]:
    """Build each writer and ask whether it can run here (``device``, else the plan's); an
    explicitly named one must. A default variant that would only repeat another's kernel here
    (store_kv_fused on a CPU is triton_fused's kernel) is left out with that reason: same
    writes, twice the time."""
    device = plan.device if device is None else device
    cache, inp = plan.cache_dtype, plan.input_dtype
    planned: list[PlannedVariant] = []
    for name in plan.variants:
        try:
            writer = create_variant(plan.layout, name, **plan.writer_options.get(name, {}))
        except KvprofError as exc:
            if name in plan.required_variants:
                raise
            planned.append(PlannedVariant(name, _Unavailable(name), exc.words or str(exc)))
            continue
        reason = writer.unsupported_reason(device, cache, inp) or _rope_reason(plan, writer)
        if reason and name in plan.required_variants:
            raise DeviceError(f"variant {name} cannot run on {device}: ", reason)
        if reason is None and name not in plan.required_variants:
            reason = _repeats(writer, device, planned)
        pdl = writer.launches_pdl(device) if reason is None else None
        planned.append(PlannedVariant(writer.name, writer, reason, pdl))
    if not any(p.reason is None for p in planned):
        raise DeviceError(f"none of the variants can run on {device} (", *_joined(planned), ")")
    return planned


def _rope_reason(plan: CapturePlan, writer: Writer) -> str | None:
    """Why a rope + store writer cannot run in this capture, or None: its session writes only,
    on one rank (``kvprof.capture.rope_session``)."""
    if plan.layout != "mha" or get_layout("mha").contract_of(writer) != "rope":
        return None
    if plan.ranks is not None:
        return Words("rope + store writes are captured on one rank (no ", Setting("ranks"), ")")
    return None


def _repeats(writer: Writer, device: torch.device, planned: list[PlannedVariant]) -> str | None:
    """Why ``writer`` would repeat a variant already planned to run here, or None."""
    kernel_for = getattr(writer, "kernel_for", None)  # writers that pick one of two kernels per call
    if kernel_for is None:
        return None
    eager, captured = kernel_for(device, captured=False), kernel_for(device, captured=True)
    same = eager if eager == captured else None
    if same and same != writer.name and any(p.name == same and p.reason is None for p in planned):
        return Words(f"on {device.type} it runs {same}'s kernel, the same writes; ", Setting("variants"),
                     f" {writer.name} runs it anyway")
    return None


def _joined(planned: list[PlannedVariant]) -> list[object]:
    """``name: reason; name: reason``, each reason's settings kept as parts."""
    out: list[object] = []
    for i, p in enumerate(planned):
        out += ["; " if i else "", f"{p.name}: ", p.reason]
    return out


class _Unavailable(KVWriter):
    """Stands in for a writer that could not even be built, so the manifest can say why."""

    description = "could not be built"

    def __init__(self, name: str) -> None:
        self.name = name

    def write(self, *args: Any, **kwargs: Any) -> str:  # pragma: no cover - never planned to run
        raise RuntimeError(f"{self.name} is unavailable")


def captured_now() -> str:
    """The capture's start, ISO 8601 in UTC to the second: what compare pairs and orders runs by."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def base_manifest(plan: CapturePlan, device: torch.device, runtime: Runtime | None = None,
                  context: DecoderContext | None = None) -> Manifest:
    phases = plan.phases
    settings = plan.manifest_config()
    if runtime is not None:
        settings["threads"] = runtime.threads
        settings["resolved"]["triton_interpret"] = runtime.triton_interpret
    if context is not None:  # the layer's attention and rotary kernels (kvprof.core.layer_kernels)
        settings["resolved"]["layer"] = context.kernels.as_dict()
    return Manifest(
        kvprof=kvprof.__version__, run_id=plan.run_id, captured_at=captured_now(),
        versions=versions(), device=device_properties(device),
        config=settings, phases=[p.as_dict() for p in phases], cuda_graphs_used=any(p.graph for p in phases),
    )


def variant_entry(p: PlannedVariant, names: Callable[[str], str] = str) -> VariantEntry:
    """The manifest's entry for a planned variant; ``interpreted`` where its kernel runs under
    Triton's interpreter (on the host, in numpy: its times are not a GPU's). ``names``: how
    its reason spells a setting (the command line: its flag)."""
    info = p.writer.info()
    reason = None if p.reason is None else rendered(p.reason, names)
    entry = VariantEntry(available=p.reason is None, reason=reason, description=info.description,
                         fused_claim=info.fused)
    if p.reason is None and info.extra.get("interpreted"):  # VariantEntry.interpreted
        entry.extra["interpreted"] = True
    if info.extra.get("rope"):  # a rope + store writer: "fused" (one launch) or "separate"
        entry.extra["rope"] = info.extra["rope"]
    entry.pdl_launch = p.pdl_launch
    return entry


def trace_extra(entry: VariantEntry) -> dict[str, Any]:
    """What a variant's trace carries of its manifest entry beyond TraceMeta's own fields (its
    ``rope``, ``pdl_launch``), so that the trace alone is analysed as the run would be."""
    out: dict[str, Any] = {"rope": entry.extra["rope"]} if "rope" in entry.extra else {}
    if entry.pdl_launch is not None:
        out["pdl_launch"] = entry.pdl_launch
    return out


def make_context(plan: CapturePlan, device: torch.device | None = None) -> DecoderContext | None:
    """The decoder layers around the writes (context ``layer``), once per capture: only the
    layers a step runs (``plan.layers``), refused before allocating when their weights would
    not fit (naming the ``layers`` that would)."""
    if plan.context != "layer":
        return None
    device = plan.device if device is None else device
    shape, dtype = plan.shape, plan.input_dtype
    per_layer, fixed = layer_weight_bytes(shape, dtype)
    check_layer_weights(per_layer, fixed, plan.layers, memory_limit(device, plan.max_memory_gb),
                        Words(Setting("context"), f" layer for {shape.model} at tp {shape.tp} on {device}"))
    return DecoderContext(shape, dtype, device, plan.context_len, seed=plan.seed,
                          k_scale=plan.k_scale, v_scale=plan.v_scale, layers=plan.layers)


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
        raise OutputError(f"cannot write {final}: it already exists (pass ", Setting("force"),
                          " to replace it, or choose another ", Setting("run_id"), ")")
    if final.is_symlink() or not final.is_dir():
        raise OutputError(f"cannot replace {final}: it is not a folder")
    if not RunDir(final).is_run() and any(final.iterdir()):
        raise OutputError(f"cannot replace {final}: it is not a kvprof run directory (no {RunDir.MANIFEST}); ",
                          Setting("force"), " replaces only run directories")


def scrub_manifest(manifest: Manifest) -> Manifest:
    """The manifest as it may be shared: the scrub rules on every string (it names $HOME paths)."""
    from kvprof.tools.scrub import Rules, scrub_document

    return Manifest.from_json(scrub_document(manifest.to_json(), Rules()))


def scrub_files(folder: Path) -> list[str]:
    """Scrub every file of a run being written; what each changed one had (for the manifest)."""
    from kvprof.tools.scrub import scrub_path

    return [str(r) for f in sorted(folder.iterdir()) if f.is_file() and (r := scrub_path(f)) is not None and r.changed]


__all__ = ["CapturePlan", "CapturedRun", "PlannedVariant", "base_manifest", "check_replaceable", "make_context",
           "plan_variants", "resolve", "resolve_settings", "scrub_files", "scrub_manifest", "trace_extra",
           "variant_entry"]
