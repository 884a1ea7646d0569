"""One variant's workload on one device: pool, slots, inputs, warm-up, graphs, steps.

Shared by the torch.profiler pass and the Nsight Systems child so both passes run the
same writes at the same slots (same seed). The session knows nothing about profilers:
callers wrap ``run_phase`` in whatever records it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from kvprof.capture.config import CaptureConfig
from kvprof.instrument import make_pool, phase_range, step_range
from kvprof.pool import KVPool
from kvprof.workload import PhaseSpec, SlotAllocator, default_pool_size, make_inputs
from kvprof.writers import KVWriter


@dataclass
class PreparedPhase:
    spec: PhaseSpec
    locs: torch.Tensor  # [steps, tokens] on the device
    k: torch.Tensor
    v: torch.Tensor
    graph: torch.cuda.CUDAGraph | None = None
    static_loc: torch.Tensor | None = None
    graph_paths: dict[str, int] = field(default_factory=dict)  # paths the captured writes took


class VariantSession:
    """Builds the pool for one writer and runs the configured phases through it."""

    def __init__(self, config: CaptureConfig, writer: KVWriter, device: torch.device, *, instrument: bool = True):
        self.config = config
        self.writer = writer
        self.device = device
        self.shape = config.rank_shape()
        self.cache_dtype = config.cache_torch_dtype()
        self.input_dtype = config.input_torch_dtype()
        self.phases = config.phase_specs(graphs_possible=device.type == "cuda")
        elem = torch.empty((), dtype=self.cache_dtype).element_size()
        size = config.pool_size or default_pool_size(
            self.phases, self.shape.head_num, self.shape.head_dim + self.shape.v_head_dim,
            self.shape.layers, elem, device,
        )
        self.pool: KVPool = make_pool(
            size, config.page_size, self.cache_dtype, self.shape.head_num, self.shape.head_dim,
            self.shape.layers, device, writer=writer, v_head_dim=self.shape.v_head_dim,
            check_slots=False, instrument=instrument, variant=writer.name,
        )
        writer.prepare(device)
        self.layers = list(range(self.pool.start_layer, self.pool.start_layer + self.pool.layer_num))
        self.allocator = SlotAllocator(self.pool.rows, config.slots, config.page_size, config.seed)
        self.k_scale = config.k_scale
        self.v_scale = config.v_scale

    # -- preparation ---------------------------------------------------------------------
    def prepare(self, spec: PhaseSpec, index: int) -> PreparedPhase:
        slots = self.allocator.steps(spec)  # checked on the host once
        locs = torch.from_numpy(slots).to(device=self.device, dtype=self.config.torch_loc_dtype())
        amplitude = 1.0 if self.k_scale is None else float(self.k_scale)
        k, v = make_inputs(
            spec.tokens, self.shape.head_num, self.shape.head_dim, self.shape.v_head_dim,
            self.input_dtype, self.device, seed=self.config.seed + index, scale=amplitude,
        )
        return PreparedPhase(spec, locs, k, v)

    def write_step(self, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        for layer in self.layers:
            self.pool.set_kv_buffer(layer, loc, k, v, self.k_scale, self.v_scale)

    def warm_up(self, prepared: PreparedPhase) -> None:
        """Eager warm-up steps (JIT compiles, allocator, autotuning) outside any measurement."""
        for i in range(self.config.warmup):
            self.write_step(prepared.locs[i % prepared.spec.steps], prepared.k, prepared.v)
        self.synchronize()

    def capture_graph(self, prepared: PreparedPhase) -> None:
        """One CUDA graph per (variant, batch size) holding every layer's write, as SGLang captures decode."""
        prepared.static_loc = prepared.locs[0].clone()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # torch's recipe: warm up on a side stream before capture
            self.write_step(prepared.static_loc, prepared.k, prepared.v)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        before = dict(self.pool.path_counts)
        with torch.cuda.graph(graph):
            self.write_step(prepared.static_loc, prepared.k, prepared.v)
        prepared.graph = graph
        prepared.graph_paths = {
            path: n - before.get(path, 0) for path, n in self.pool.path_counts.items() if n != before.get(path, 0)
        }
        self.synchronize()

    # -- measured region -----------------------------------------------------------------
    def run_phase(self, prepared: PreparedPhase, on_step: Callable[[], None] | None = None) -> None:
        spec = prepared.spec
        with phase_range(spec.phase, spec.size_key, spec.size):
            for i in range(spec.steps):
                with step_range(spec.phase, spec.size_key, spec.size, i, spec.tokens):
                    if prepared.graph is not None:
                        assert prepared.static_loc is not None
                        prepared.static_loc.copy_(prepared.locs[i], non_blocking=True)
                        prepared.graph.replay()
                    else:
                        self.write_step(prepared.locs[i], prepared.k, prepared.v)
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
            if p.graph is not None:
                for path, n in p.graph_paths.items():
                    counts[path] = counts.get(path, 0) + n * p.spec.steps
        return counts

    def bytes_per_token(self) -> int:
        return self.pool.bytes_per_write(1, self.input_dtype)

    def close(self) -> None:
        """Free the pool's memory before the next variant allocates its own."""
        self.pool.k_buffer.clear()
        self.pool.v_buffer.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


@contextmanager
def session_for(config: CaptureConfig, writer: KVWriter, device: torch.device, **kw: object) -> Iterator[VariantSession]:
    session = VariantSession(config, writer, device, **kw)  # type: ignore[arg-type]
    try:
        yield session
    finally:
        session.close()
