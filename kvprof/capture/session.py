"""One variant's workload on one device: pool, slots, inputs, warm-up, graphs, steps.

Shared by the torch.profiler pass, the Nsight Systems child and the unprofiled reference
pass, so every pass runs the same writes at the same slots (same seed). The session knows
nothing about profilers: callers wrap ``run_phase`` in whatever records it.

A step runs in one of three modes: ``writes`` (every layer's write back to back), ``layer``
(each write inside a decoder layer, ``--context layer``) and ``layer_no_write`` (the same
layers with the write left out: what the rest of the step costs). The capture's own mode
is ``layer`` with a decoder context, else ``writes``; the reference pass also times the
other two to measure the write's share of a step and the projection's inputs.

With a decoder context every variant is held to the same unit of work, the rotary
embedding plus the K/V store, fed as the layer feeds it (q, k, v views of one QKV output):
a store writer runs after the layer's rotary, a rope writer (``RopeKVWriter``) does both.
``layer_no_write`` keeps the rotary and leaves the store out, for every variant alike, and
``writes`` runs the unit alone, layer after layer, on a QKV-shaped input.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic

import torch

from kvprof.capture.plan import CapturePlan
from kvprof.core.errors import Setting, UsageError
from kvprof.core.timings import CUDA_EVENTS, WALL
from kvprof.kvcache.contracts import RopeKVWriter, Writer
from kvprof.kvcache.instrument import make_pool, phase_range, step_range
from kvprof.kvcache.layer import DecoderContext, Rotary, split_qkv
from kvprof.kvcache.layouts.layout import Layout, PoolT, get_layout
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.workload import PhaseSpec, SlotAllocator, default_pool_size, make_inputs
from kvprof.kvcache.writers import KVWriter

MODES = ("writes", "layer", "layer_no_write")


@dataclass
class PreparedPhase:
    spec: PhaseSpec
    locs: torch.Tensor  # [steps, tokens] on the device
    k: torch.Tensor
    v: torch.Tensor
    graphs: dict[str, torch.cuda.CUDAGraph] = field(default_factory=dict)  # by mode
    static_loc: torch.Tensor | None = None
    graph_paths: dict[str, int] = field(default_factory=dict)  # paths the captured writes took (main mode)
    # the writes-alone input where q is part of the write (a decoder context, a rope writer):
    # one QKV output [tokens, (Hq + 2 Hk) D] and the tokens' positions
    qkv: torch.Tensor | None = None
    positions: torch.Tensor | None = None

    @property
    def graph(self) -> torch.cuda.CUDAGraph | None:
        return next(iter(self.graphs.values()), None) if self.graphs else None


class StepTimer:
    """Per-step times without a profiler's help: CUDA events on the step's stream (what the
    GPU timeline pays, launch gaps included), the wall clock on CPU. Events are made up
    front so that timing allocates nothing between steps."""

    def __init__(self, device: torch.device, steps: int) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[object, object]] = []
        if self.cuda:
            self._pool = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                          for _ in range(steps)]
        self._wall: list[int] = []
        self._t0 = 0

    def start(self) -> None:
        if self.cuda:
            pair = self._pool[len(self.marks)]
            pair[0].record()  # type: ignore[attr-defined]
            self.marks.append(pair)
        else:
            self._t0 = time.perf_counter_ns()

    def stop(self) -> None:
        if self.cuda:
            self.marks[-1][1].record()  # type: ignore[attr-defined]
        else:
            self._wall.append(time.perf_counter_ns() - self._t0)

    def samples_ns(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) * 1e6 for a, b in self.marks]  # type: ignore[attr-defined]
        return [float(x) for x in self._wall]

    @property
    def clock(self) -> str:
        return CUDA_EVENTS if self.cuda else WALL


class VariantSession(abc.ABC, Generic[PoolT]):
    """Builds one layout's pool for one writer and runs the configured phases through it
    (``MHASession``; the MLA and paged sessions are in ``layout_session``)."""

    pool: PoolT

    def __init__(self, plan: CapturePlan, writer: Writer, device: torch.device, *, instrument: bool = True,
                 context: DecoderContext | None = None):
        self.plan = plan
        self.context = context
        self.mode = "layer" if context is not None else "writes"
        self.writer = writer
        self.device = device
        self.layout: Layout = get_layout(plan.layout)
        self.shape = plan.shape
        self.cache_dtype = plan.cache_dtype
        self.input_dtype = plan.input_dtype
        self.phases = list(plan.phases)
        self.k_scale = plan.k_scale
        self.v_scale = plan.v_scale
        self.pool = self.make_pool(instrument)
        writer.prepare(device)
        self.layers = list(range(self.pool.start_layer, self.pool.start_layer + self.pool.layer_num))

    @abc.abstractmethod
    def make_pool(self, instrument: bool) -> PoolT:
        """The layout's pool for the configured phases (and whatever hands out its slots)."""

    # -- preparation ---------------------------------------------------------------------
    @abc.abstractmethod
    def prepare(self, spec: PhaseSpec, index: int) -> PreparedPhase:
        """The phase's slots and inputs, on the device, the same for every pass (same seed)."""

    def write_step(self, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        write, pool = self.layout.write, self.pool
        for layer in self.layers:
            write(pool, layer, loc, k, v, self.k_scale, self.v_scale)

    def step(self, prepared: PreparedPhase, loc: torch.Tensor, mode: str | None = None) -> None:
        """One step of ``prepared``'s phase in ``mode`` (default: the session's own); only
        ``writes`` here (a decoder context models MHA layers: ``MHASession``)."""
        mode = mode or self.mode
        if mode != "writes":
            raise UsageError(Setting("context"), f" layer models MHA decoder layers; the {self.layout.name} layout "
                             "captures writes only")
        self.write_step(loc, prepared.k, prepared.v)

    def before_step(self, prepared: PreparedPhase, loc: torch.Tensor, mode: str | None = None) -> None:
        """What the engine updates before a step and outside its graph (attention metadata)."""

    def warm_up(self, prepared: PreparedPhase, mode: str | None = None) -> None:
        """Eager warm-up steps (JIT compiles, allocator, autotuning) outside any measurement."""
        for i in range(self.plan.warmup):
            loc = prepared.locs[i % prepared.spec.steps]
            self.before_step(prepared, loc, mode)
            self.step(prepared, loc, mode)
        self.synchronize()

    def capture_graph(self, prepared: PreparedPhase, mode: str | None = None) -> None:
        """One CUDA graph per (variant, batch size, mode) holding every layer's step, as SGLang captures decode."""
        mode = mode or self.mode
        if prepared.static_loc is None:
            prepared.static_loc = prepared.locs[0].clone()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # torch's recipe: warm up on a side stream before capture
            self.step(prepared, prepared.static_loc, mode)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        before = dict(self.pool.path_counts)
        with torch.cuda.graph(graph):
            self.step(prepared, prepared.static_loc, mode)
        prepared.graphs[mode] = graph
        if mode == self.mode:
            prepared.graph_paths = {
                path: n - before.get(path, 0) for path, n in self.pool.path_counts.items() if n != before.get(path, 0)
            }
        self.synchronize()

    def run_step(self, prepared: PreparedPhase, i: int, mode: str) -> None:
        """Step ``i`` of the phase in ``mode``: a graph replay where one was captured, else eager."""
        graph = prepared.graphs.get(mode)
        loc = prepared.locs[i % prepared.spec.steps]
        self.before_step(prepared, loc, mode)
        if graph is not None:
            assert prepared.static_loc is not None
            prepared.static_loc.copy_(loc, non_blocking=True)
            graph.replay()
        else:
            self.step(prepared, loc, mode)

    # -- measured region -----------------------------------------------------------------
    def run_phase(self, prepared: PreparedPhase, on_step: Callable[[], None] | None = None,
                  timer: StepTimer | None = None) -> None:
        """The measured steps, each in its step range; ``timer`` (optional) times each step
        as the reference pass does, so a profiled pass can be held against it."""
        spec = prepared.spec
        with phase_range(spec.phase, spec.size_key, spec.size):
            for i in range(spec.steps):
                with step_range(spec.phase, spec.size_key, spec.size, i, spec.tokens):
                    if timer is not None:
                        timer.start()
                    self.run_step(prepared, i, self.mode)
                    if timer is not None:
                        timer.stop()
                if on_step is not None:
                    on_step()
            self.synchronize()

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def measured_paths(self, prepared: list[PreparedPhase]) -> dict[str, int]:
        """Paths of the measured writes: eager ones as counted since the last reset, each
        captured write once per replay (a graph records the path once, at capture)."""
        counts = dict(self.pool.path_counts)
        for p in prepared:
            if self.mode in p.graphs:
                for path, n in p.graph_paths.items():
                    counts[path] = counts.get(path, 0) + n * p.spec.steps
        return counts

    def bytes_per_token(self) -> int:
        return self.pool.bytes_per_write(1, self.input_dtype)

    def close(self) -> None:
        """Free the pool's memory before the next variant allocates its own (subclasses drop
        their pool's buffers first)."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


class MHASession(VariantSession[KVPool]):
    """The MHA pool's session: slots from SGLang's allocator, and optionally a decoder layer
    around each write (``--context layer``). In a layer its writer is a store (``KVWriter``,
    through ``set_kv_buffer`` after the layer's rotary) or a rope writer (``RopeKVWriter``,
    through ``set_kv_buffer_with_rope`` instead of the rotary and the store); rope writers
    without a layer have their own session (``kvprof.capture.rope_session``)."""

    writer: KVWriter | RopeKVWriter  # type: ignore[assignment]

    def __init__(self, plan: CapturePlan, writer: Writer, device: torch.device, *, instrument: bool = True,
                 context: DecoderContext | None = None):
        super().__init__(plan, writer, device, instrument=instrument, context=context)
        self.rope = isinstance(writer, RopeKVWriter)
        self.rotary: Rotary | None = context.rotary if context is not None else None  # the layer's

    def make_pool(self, instrument: bool) -> KVPool:
        plan, device, context = self.plan, self.device, self.context
        elem = torch.empty((), dtype=self.cache_dtype).element_size()
        # slots per layer as for the whole model, so a step of fewer layers (--layers) writes
        # into the same per-layer pool a full step does
        size = plan.pool_size or default_pool_size(
            self.phases, self.shape.head_num, self.shape.head_dim + self.shape.v_head_dim,
            self.shape.layers, elem, device,
        )
        if context is not None:  # decode attention reads batch x context-len rows of the pool
            decode = [p.tokens for p in self.phases if p.phase == "decode"]
            size = max(size, context.slots_needed(max(decode, default=1)) + 2 * max(p.tokens for p in self.phases))
        pool = make_pool(
            size, plan.page_size, self.cache_dtype, self.shape.head_num, self.shape.head_dim,
            plan.layers, device, writer=self.writer, v_head_dim=self.shape.v_head_dim,
            check_slots=False, instrument=instrument, variant=self.writer.name,
        )
        self.allocator = SlotAllocator(pool.rows, plan.slots, plan.page_size, plan.seed)
        return pool

    def prepare(self, spec: PhaseSpec, index: int) -> PreparedPhase:
        slots = self.allocator.steps(spec)  # checked on the host once
        locs = torch.from_numpy(slots).to(device=self.device, dtype=self.plan.loc_dtype)
        amplitude = 1.0 if self.k_scale is None else float(self.k_scale)
        k, v = make_inputs(
            spec.tokens, self.shape.head_num, self.shape.head_dim, self.shape.v_head_dim,
            self.input_dtype, self.device, seed=self.plan.seed + index, scale=amplitude,
        )
        prepared = PreparedPhase(spec, locs, k, v)
        if self.rotary is not None:
            s = self.shape
            gen = torch.Generator(device="cpu").manual_seed(self.plan.seed + 1000 + index)
            qkv = torch.randn((spec.tokens, (s.q_head_num + 2 * s.head_num) * s.head_dim), generator=gen) * amplitude
            prepared.qkv = qkv.to(dtype=self.input_dtype, device=self.device)
            assert self.context is not None
            prepared.positions = self.context.positions(spec.tokens, spec.phase == "decode")
        return prepared

    # the MHA layout's write (MHALayout.write) called on the pool directly: the measured hot path
    def write_step(self, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        for layer in self.layers:
            self.pool.set_kv_buffer(layer, loc, k, v, self.k_scale, self.v_scale)

    def _write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.pool.set_kv_buffer(layer, loc, k, v, self.k_scale, self.v_scale)

    def _rope_write(self, layer: int, loc: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    positions: torch.Tensor, cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
        self.pool.set_kv_buffer_with_rope(layer, loc, q, k, v, positions, cos_sin_cache, is_neox, self.k_scale,
                                          self.v_scale)

    def _buffers(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool.get_key_buffer(layer), self.pool.get_value_buffer(layer)

    def _unit_step(self, prepared: PreparedPhase, loc: torch.Tensor) -> None:
        """The writes alone when q is part of the unit: rotary + store (or the rope write)
        per layer, on q, k, v views of the phase's QKV input."""
        assert prepared.qkv is not None and prepared.positions is not None and self.rotary is not None
        s, rotary, positions = self.shape, self.rotary, prepared.positions
        q, k, v = split_qkv(prepared.qkv, s.q_head_num, s.head_num, s.head_dim)
        for layer in self.layers:
            if self.rope:
                self._rope_write(layer, loc, q, k, v, positions, rotary.cos_sin_cache, rotary.is_neox)
            else:
                rotary(q, k, positions)
                self.pool.set_kv_buffer(layer, loc, k, v, self.k_scale, self.v_scale)

    def before_step(self, prepared: PreparedPhase, loc: torch.Tensor, mode: str | None = None) -> None:
        if self.context is not None and (mode or self.mode) != "writes":
            self.context.prepare_step(loc, decode=prepared.spec.phase == "decode")

    def step(self, prepared: PreparedPhase, loc: torch.Tensor, mode: str | None = None) -> None:
        """One step of ``prepared``'s phase in ``mode`` (default: the session's own)."""
        mode = mode or self.mode
        if mode == "writes":
            if prepared.qkv is not None:
                self._unit_step(prepared, loc)
            else:
                self.write_step(loc, prepared.k, prepared.v)
            return
        self.layer_step(prepared, loc, mode)

    def bytes_per_token(self) -> int:
        if self.rope:  # q and k read and written back too
            return self.pool.rope_bytes_per_write(1, self.shape.q_head_num, self.input_dtype)
        return super().bytes_per_token()

    def layer_step(self, prepared: PreparedPhase, loc: torch.Tensor, mode: str,
                   reduce: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor:
        """The decoder layers, the write (store or rope write) in ``layer`` mode only; returns
        the last layer's output."""
        assert self.context is not None
        store = mode == "layer" and not self.rope
        absorbed = mode == "layer" and self.rope
        return self.context.step(loc, self._write if store else None, self.layers, self._buffers,
                          decode=prepared.spec.phase == "decode", reduce=reduce,
                          rope_write=self._rope_write if absorbed else None)

    def close(self) -> None:
        self.pool.k_buffer.clear()
        self.pool.v_buffer.clear()
        super().close()
