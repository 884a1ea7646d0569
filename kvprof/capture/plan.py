"""What every capture (one process, ``--ranks N``, the nsys child) decides before it runs: the
variants and why one cannot run here, the manifest's base, the decoder context, whether
the output may be replaced; and what a finished capture returns.

Capture writes a run and analyses nothing: ``CapturedRun`` is the run directory, its
manifest and the parts that failed but were kept; ``kvprof.api.capture`` opens and
analyses it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import kvprof
from kvprof.capture.config import CaptureConfig
from kvprof.capture.runtime import Runtime
from kvprof.core.atomic import clean_stale
from kvprof.core.errors import DeviceError, KvprofError, OutputError
from kvprof.core.run import Manifest, VariantEntry
from kvprof.core.rundir import RunDir
from kvprof.kvcache.contracts import Writer
from kvprof.kvcache.devinfo import device_properties, versions
from kvprof.kvcache.guards import check_layer_weights, memory_limit
from kvprof.kvcache.layer import DecoderContext, layer_weight_bytes
from kvprof.kvcache.layouts.layout import get_layout
from kvprof.kvcache.layouts.registry import create_variant
from kvprof.kvcache.writers import KVWriter


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
        reason = writer.unsupported_reason(device, cache, inp) or _rope_reason(config, writer)
        if reason and name in config.required_variants:
            raise DeviceError(f"variant {name} cannot run on {device}: {reason}")
        if reason is None and name not in config.required_variants:
            reason = _repeats(writer, device, planned)
        pdl = writer.launches_pdl(device) if reason is None else None
        planned.append(PlannedVariant(writer.name, writer, reason, pdl))
    if not any(p.reason is None for p in planned):
        why = "; ".join(f"{p.name}: {p.reason}" for p in planned)
        raise DeviceError(f"none of the variants can run on {device} ({why})")
    return planned


def _rope_reason(config: CaptureConfig, writer: Writer) -> str | None:
    """Why a rope + store writer cannot run in this capture, or None: its session writes only,
    on one rank (``kvprof.capture.rope_session``)."""
    if config.layout_name() != "mha" or get_layout("mha").contract_of(writer) != "rope":
        return None
    if config.ranks is not None:
        return "rope + store writes are captured on one rank (no --ranks)"
    return None


def _repeats(writer: Writer, device: torch.device, planned: list[PlannedVariant]) -> str | None:
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


def captured_now() -> str:
    """The capture's start, ISO 8601 in UTC to the second: what compare pairs and orders runs by."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def base_manifest(config: CaptureConfig, device: torch.device, runtime: Runtime | None = None,
                  context: DecoderContext | None = None) -> Manifest:
    phases = config.phase_specs(graphs_possible=device.type == "cuda")
    settings = config.as_dict()
    if runtime is not None:
        settings["threads"] = runtime.threads
        settings["resolved"]["triton_interpret"] = runtime.triton_interpret
    if context is not None:  # the layer's attention and rotary kernels (kvprof.core.layer_kernels)
        settings["resolved"]["layer"] = context.kernels.as_dict()
    return Manifest(
        kvprof=kvprof.__version__, run_id=config.run_id, captured_at=captured_now(),
        versions=versions(), device=device_properties(device),
        config=settings, phases=[p.as_dict() for p in phases], cuda_graphs_used=any(p.graph for p in phases),
    )


def variant_entry(p: PlannedVariant) -> VariantEntry:
    """The manifest's entry for a planned variant; ``interpreted`` where its kernel runs under
    Triton's interpreter (on the host, in numpy: its times are not a GPU's)."""
    info = p.writer.info()
    entry = VariantEntry(available=p.reason is None, reason=p.reason, description=info.description,
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


def make_context(config: CaptureConfig, device: torch.device) -> DecoderContext | None:
    """The decoder layers around the writes (``--context layer``), once per capture: only the
    layers a step runs (``config.layers_on``), refused before allocating when their weights
    would not fit (naming the ``--layers`` that would)."""
    if config.context != "layer":
        return None
    shape = config.rank_shape()
    dtype = config.input_torch_dtype()
    layers = config.layers_on(device.type)
    per_layer, fixed = layer_weight_bytes(shape, dtype)
    check_layer_weights(per_layer, fixed, layers, memory_limit(device, config.max_memory_gb),
                        f"--context layer for {shape.model} at tp {shape.tp} on {device}")
    return DecoderContext(shape, dtype, device, config.context_len_on(device.type), seed=config.seed,
                          k_scale=config.k_scale, v_scale=config.v_scale, layers=layers)


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
    if not RunDir(final).is_run() and any(final.iterdir()):
        raise OutputError(f"cannot replace {final}: it is not a kvprof run directory (no {RunDir.MANIFEST}); "
                          "--force replaces only run directories")


def scrub_manifest(manifest: Manifest) -> Manifest:
    """The manifest as it may be shared: the scrub rules on every string (it names $HOME paths)."""
    from kvprof.tools.scrub import Rules, scrub_document

    return Manifest.from_json(scrub_document(manifest.to_json(), Rules()))


def scrub_files(folder: Path) -> list[str]:
    """Scrub every file of a run being written; what each changed one had (for the manifest)."""
    from kvprof.tools.scrub import scrub_path

    return [str(r) for f in sorted(folder.iterdir()) if f.is_file() and (r := scrub_path(f)) is not None and r.changed]


__all__ = ["CapturedRun", "PlannedVariant", "base_manifest", "check_replaceable", "make_context", "plan_variants",
           "scrub_files", "scrub_manifest", "trace_extra", "variant_entry"]
