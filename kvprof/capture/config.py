"""The full description of a capture: serializable, so a child process can re-run it exactly.

A ``CaptureConfig`` is frozen. Checking and resolving it make new ones, never change it:
``validate`` (every value checked; a new layout's default variants), ``resolved_for`` (the
device-dependent defaults fixed) and ``with_run_id``; the capture runs, records in the
manifest and hands its child processes the resolved one, and the caller's stays as it was.
"""

from __future__ import annotations

import datetime as _dt
import secrets
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from kvprof.capture.defaults import (
    CPU_DEFAULT_LAYERS,
    CPU_DEFAULT_THREADS,
    CPU_LAYER_CONTEXT_LEN,
    CPU_LAYER_DECODE_SIZES,
    CPU_LAYER_PREFILL_TOKENS,
    CPU_LAYER_REFERENCE_STEPS,
    CPU_REFERENCE_STEPS_UP_TO,
    DEFAULT_CONTEXT_LEN,
    DEFAULT_DECODE_SIZES,
    DEFAULT_PREFILL_TOKENS,
)
from kvprof.core import variants
from kvprof.core.errors import Setting, UsageError
from kvprof.core.limits import SCALE_MAX, SCALE_MIN
from kvprof.kvcache.dtypes import parse_dtype, short_name
from kvprof.kvcache.guards import check_capture_values
from kvprof.kvcache.models import RankShape, resolve_model
from kvprof.kvcache.workload import PhaseSpec, build_phases

DEFAULT_VARIANTS = variants.DEFAULT_CAPTURE_VARIANTS
PROFILERS = ("torch", "nsys", "both")
NSYS_GRAPH_TRACES = ("node", "graph")
DEFAULT_REFERENCE_STEPS = 100
MAX_RANKS = 64  # capture --ranks N: processes (one GPU each on CUDA)


@dataclass(frozen=True)
class CaptureConfig:
    """Everything that decides what a capture does. Plain data (JSON round-trips), frozen."""

    model: str = "llama-3.1-70b"
    tp: int = 8
    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    required_variants: list[str] = field(default_factory=list)  # asked for by name: unrunnable is an error
    phases: list[str] = field(default_factory=lambda: ["decode", "prefill"])
    # None: DEFAULT_DECODE_SIZES, CPU_LAYER_DECODE_SIZES with --context layer on a CPU
    decode_sizes: list[int] | None = None
    # None: DEFAULT_PREFILL_TOKENS, CPU_LAYER_PREFILL_TOKENS with --context layer on a CPU
    prefill_sizes: list[int] | None = None
    serving_steps: int | None = None
    chunk: int = 8192
    steps: int = 10
    warmup: int = 3
    cuda_graph: bool = True
    device: str = "auto"
    cache_dtype: str = "bf16"
    input_dtype: str | None = None  # None: the cache dtype (fp8 caches: bf16 inputs)
    k_scale: float | None = None
    v_scale: float | None = None
    loc_dtype: str = "int64"
    slots: str = "random"
    page_size: int = 1
    pool_size: int | None = None
    seed: int = 0
    profiler: str = "torch"
    scrub: bool = True
    pass_env: list[str] = field(default_factory=list)
    writer_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    context: str = "none"  # "layer": each write inside a decoder layer (kvprof.kvcache.layer)
    # cached tokens per request that decode attention reads; None: DEFAULT_CONTEXT_LEN,
    # CPU_LAYER_CONTEXT_LEN with --context layer on a CPU
    context_len: int | None = None
    # timed unprofiled steps per (phase, size) and mode; None: 100 on CUDA, --steps on CPU,
    # where each step is wall-clock Python (tens of ms a write under Triton's interpreter),
    # CPU_LAYER_REFERENCE_STEPS there with --context layer (each step runs the layers' GEMMs)
    reference_steps: int | None = None
    # timed on while a point's timed steps took under CPU_REFERENCE_BUDGET_S, up to this many;
    # None: exactly reference_steps. Filled in on a CPU where reference_steps was left out
    reference_steps_up_to: int | None = None
    torch_sync_events: bool = False  # torch.profiler's cuda_sync events (stream waits)
    nsys_graph_trace: str = "node"  # nsys --cuda-graph-trace: node (per-write kernels) or graph
    run_id: str | None = None
    force: bool = False  # replace an existing run directory of the same name (atomically)
    output: str = "traces"
    max_memory_gb: float | None = None  # None: what the machine has (kvprof.kvcache.guards.memory_limit)
    # the cache layout (kvprof.kvcache.layouts): None picks it from the model (MLA presets: mla) and
    # the engine (sglang: mha, vllm: paged)
    layout: str | None = None
    engine: str = "sglang"
    # capture --ranks N: N processes through torch.distributed (kvprof.capture.ranks); None: one process
    ranks: int | None = None
    # how many of the model's layers each step writes (the first N); None: every layer on
    # CUDA, CPU_DEFAULT_LAYERS on a CPU. Per-write figures are per write either way, and
    # projections per decode step multiply by the model's layer count, not by this.
    layers: int | None = None
    # torch's intra-op CPU threads during the capture; None: CPU_DEFAULT_THREADS on a CPU,
    # torch's own choice on CUDA (where the host thread only launches)
    threads: int | None = None
    # what ``resolved_for`` filled in because the option was left out (the manifest's
    # config.resolved.device_defaults; the console names them): {} before resolving
    device_defaults: dict[str, Any] = field(default_factory=dict)

    # -- derived -------------------------------------------------------------------------
    def validate(self) -> CaptureConfig:
        """Check every value (UsageError, one line); the configuration to run, a new object:
        a layout other than MHA asked for without named variants gets its own defaults."""
        if self.profiler not in PROFILERS:
            raise UsageError(f"unknown profiler {self.profiler!r}; choose from {', '.join(PROFILERS)}")
        if self.loc_dtype not in ("int32", "int64"):
            raise UsageError(Setting("loc_dtype"), f" must be int32 or int64, got {self.loc_dtype!r}")
        if self.warmup < 0:
            raise UsageError(Setting("warmup"), f" must be >= 0, got {self.warmup}")
        if self.page_size < 1:
            raise UsageError(Setting("page_size"), f" must be >= 1, got {self.page_size}")
        if not self.variants:
            raise UsageError("no variants to capture")
        from kvprof.kvcache.layer import CONTEXTS

        if self.context not in CONTEXTS:
            raise UsageError(f"unknown context {self.context!r}; choose from {', '.join(CONTEXTS)}")
        if self.context_len is not None and self.context_len < 1:
            raise UsageError(Setting("context_len"), f" must be positive, got {self.context_len}")
        if self.reference_steps is not None and self.reference_steps < 1:
            raise UsageError(Setting("reference_steps"), f" must be at least 1, got {self.reference_steps}")
        if self.reference_steps_up_to is not None and self.reference_steps_up_to < 1:
            raise UsageError(f"reference_steps_up_to must be at least 1, got {self.reference_steps_up_to}")
        if self.nsys_graph_trace not in NSYS_GRAPH_TRACES:
            raise UsageError(Setting("nsys_graph_trace"), f" must be one of {', '.join(NSYS_GRAPH_TRACES)}, "
                             f"got {self.nsys_graph_trace!r}")
        for s in (self.k_scale, self.v_scale):
            if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float))
                                  or not SCALE_MIN <= s <= SCALE_MAX):  # nan fails too
                raise UsageError(f"scales must be positive and finite, from 2**-126 to 2**127 (float32 holds "
                                 f"them and their inverses), got {s}")
        self._check_layers()
        if self.threads is not None and self.threads < 1:
            raise UsageError(Setting("threads"), f" must be at least 1, got {self.threads}")
        self._check_ranks()
        check_capture_values(self)
        checked = self._with_layout_variants()
        self.rank_shape()
        self.cache_torch_dtype()
        self.input_torch_dtype()
        self.phase_specs()
        return checked

    def _check_ranks(self) -> None:
        """What a multi-rank capture refuses before starting anything."""
        n = self.ranks
        if n is None:
            return
        if not 1 <= n <= MAX_RANKS:
            raise UsageError(Setting("ranks"), f" must be between 1 and {MAX_RANKS}, got {n}")
        if self.profiler != "torch":
            raise UsageError(Setting("ranks"), " records torch.profiler traces only; use ", Setting("profiler"),
                             " torch")

    def _check_layers(self) -> None:
        if self.layers is None:
            return
        model = self.rank_shape()
        if not 1 <= self.layers <= model.layers:
            raise UsageError(Setting("layers"), f" must be between 1 and {model.layers} ({model.model} has "
                             f"{model.layers} layers), got {self.layers}")

    def layers_on(self, device_type: str) -> int:
        """Layers each step writes (and, with --context layer, builds) on ``device_type``:
        --layers, else every layer on CUDA, else CPU_DEFAULT_LAYERS."""
        model = self.rank_shape().layers
        if self.layers is not None:
            return self.layers
        if device_type == "cuda":
            return model
        return min(CPU_DEFAULT_LAYERS, model)

    def _cpu_layer(self, device_type: str) -> bool:
        return device_type != "cuda" and self.context == "layer"

    def context_len_on(self, device_type: str) -> int:
        """Cached tokens per decode request: --context-len, else CPU_LAYER_CONTEXT_LEN with
        --context layer on a CPU, else DEFAULT_CONTEXT_LEN."""
        if self.context_len is not None:
            return self.context_len
        return CPU_LAYER_CONTEXT_LEN if self._cpu_layer(device_type) else DEFAULT_CONTEXT_LEN

    def decode_sizes_on(self, device_type: str) -> list[int]:
        """Decode batch sizes: --batch-sizes, else CPU_LAYER_DECODE_SIZES with --context layer
        on a CPU, else DEFAULT_DECODE_SIZES."""
        if self.decode_sizes is not None:
            return list(self.decode_sizes)
        return list(CPU_LAYER_DECODE_SIZES if self._cpu_layer(device_type) else DEFAULT_DECODE_SIZES)

    def prefill_sizes_on(self, device_type: str) -> list[int]:
        """Prefill tokens per chunk: --prefill-tokens, else CPU_LAYER_PREFILL_TOKENS with
        --context layer on a CPU, else DEFAULT_PREFILL_TOKENS."""
        if self.prefill_sizes is not None:
            return list(self.prefill_sizes)
        return [CPU_LAYER_PREFILL_TOKENS if self._cpu_layer(device_type) else DEFAULT_PREFILL_TOKENS]

    def threads_on(self, device_type: str) -> int | None:
        """torch's CPU threads for the capture: --threads, else 1 on a CPU, else None (torch's own)."""
        if self.threads is not None:
            return self.threads
        return CPU_DEFAULT_THREADS if device_type != "cuda" else None

    def resolved_for(self, device_type: str) -> CaptureConfig:
        """A new configuration with the device-dependent defaults (layers, threads, context
        length, decode batches, prefill tokens, reference steps) fixed, so that the manifest,
        child processes and ranks all see the values the capture used; ``device_defaults``
        names those that were left out and filled in here."""
        resolved = replace(
            self, layers=self.layers_on(device_type), threads=self.threads_on(device_type),
            context_len=self.context_len_on(device_type), decode_sizes=self.decode_sizes_on(device_type),
            prefill_sizes=self.prefill_sizes_on(device_type), reference_steps=self.reference_steps_on(device_type),
            reference_steps_up_to=self.reference_steps_up_to_on(device_type))
        keys = ("layers", "threads", "context_len", "decode_sizes", "prefill_sizes", "reference_steps",
                "reference_steps_up_to")
        filled = {k: getattr(resolved, k) for k in keys
                  if getattr(self, k) is None and getattr(resolved, k) is not None}
        return replace(resolved, device_defaults={**self.device_defaults, **filled})

    def reference_steps_on(self, device_type: str) -> int:
        if self.reference_steps is not None:
            return self.reference_steps
        if device_type == "cuda":
            return DEFAULT_REFERENCE_STEPS
        return min(CPU_LAYER_REFERENCE_STEPS, self.steps) if self.context == "layer" else self.steps

    def reference_steps_up_to_on(self, device_type: str) -> int | None:
        """How far a point's reference pass may go on past ``reference_steps`` within its time
        budget: on a CPU where neither was given, CPU_REFERENCE_STEPS_UP_TO; else exactly."""
        if self.reference_steps_up_to is not None:
            return max(self.reference_steps_up_to, self.reference_steps_on(device_type))
        if self.reference_steps is not None or device_type == "cuda":
            return None
        return max(CPU_REFERENCE_STEPS_UP_TO, self.reference_steps_on(device_type))

    def rank_shape(self) -> RankShape:
        from kvprof.kvcache.layouts.registry import MLA_PRESETS

        mla = MLA_PRESETS.get(self.model.strip().lower())
        if mla is not None:  # one latent row per token, not split by tensor parallelism
            return RankShape(model=mla.name, tp=self.tp, layers=mla.layers, head_num=1,
                             head_dim=mla.kv_lora_rank + mla.qk_rope_head_dim, v_head_dim=0)
        return resolve_model(self.model).per_rank(self.tp)

    def layout_name(self) -> str:
        from kvprof.kvcache.layouts.registry import pick_layout

        return pick_layout(self.model, self.layout, self.engine)

    def _with_layout_variants(self) -> CaptureConfig:
        """The layout exists and fits the model; a capture of a new layout without named
        variants runs that layout's defaults (the MHA defaults are MHA writers)."""
        layout = self.layout_name()
        if layout == "mha":
            return self
        if self.context != "none":
            raise UsageError(Setting("context"), f" {self.context} models MHA decoder layers; the {layout} layout "
                             "captures writes only")
        if layout == "mla" and (self.k_scale is not None or self.v_scale is not None):
            raise UsageError("the mla layout takes no ", Setting("k_scale"), "/", Setting("v_scale"),
                             " (SGLang's MLA cache casts without scaling)")
        if self.variants == list(DEFAULT_VARIANTS):
            return replace(self, variants=list(variants.capture_defaults(layout)))
        return self

    def cache_torch_dtype(self) -> torch.dtype:
        return parse_dtype(self.cache_dtype)

    def input_torch_dtype(self) -> torch.dtype:
        if self.input_dtype is not None:
            return parse_dtype(self.input_dtype)
        cache = self.cache_torch_dtype()
        return torch.bfloat16 if cache in (torch.float8_e4m3fn, torch.float8_e5m2) else cache

    def torch_loc_dtype(self) -> torch.dtype:
        return torch.int32 if self.loc_dtype == "int32" else torch.int64

    def phase_specs(self, graphs_possible: bool = True) -> list[PhaseSpec]:
        """The phases to run; an unresolved configuration (no ``resolved_for`` yet) runs the
        GPU's sizes (DEFAULT_DECODE_SIZES, DEFAULT_PREFILL_TOKENS) where they were left out."""
        decode, prefill = self.decode_sizes_on("cuda"), self.prefill_sizes_on("cuda")  # as given once resolved
        return build_phases(
            self.phases, decode, prefill, self.steps,
            self.cuda_graph and graphs_possible, self.serving_steps, self.chunk,
        )

    def with_run_id(self) -> CaptureConfig:
        """This configuration with a run id: its own, else a new one (time, model, tp)."""
        if self.run_id:
            return self
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        return replace(self, run_id=f"{stamp}-{self.rank_shape().model}-tp{self.tp}-{secrets.token_hex(2)}")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        defaults = d.pop("device_defaults")
        d["resolved"] = {
            "shape": self.rank_shape().as_dict(),
            "cache_dtype": short_name(self.cache_torch_dtype()),
            "input_dtype": short_name(self.input_torch_dtype()),
            "layout": self.layout_name(),
            "device_defaults": defaults,
        }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CaptureConfig:
        known = {f for f in cls.__dataclass_fields__}
        fields = {k: v for k, v in d.items() if k in known}
        defaults = (d.get("resolved") or {}).get("device_defaults") if isinstance(d.get("resolved"), dict) else None
        if isinstance(defaults, dict):
            fields.setdefault("device_defaults", defaults)
        return cls(**fields)
