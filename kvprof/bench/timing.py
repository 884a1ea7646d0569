"""Timers for one layer's write, and the two limits every result is read against.

On CUDA a write is timed as replays of a captured graph of many writes (launch gaps
shrink to the device's own node cost, as in a serving engine's decode graph), median of
many replays after warm-up, with CUDA events. Eagerly it is the wall time of a loop of
writes, which at small sizes is the host launch path. On CPU only the wall clock exists.

The limits: the device-to-device copy rate (bytes read + written per second) and the
cost of one empty kernel node in a replayed graph. A write cannot beat either.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    median_us: float
    samples: int
    spread_us: float  # interquartile range, to judge whether two medians differ
    host_us: float | None = None  # eager only: the host's own time per write (launch path)
    host_spread_us: float | None = None


def _summary(samples_us: list[float], host_us: list[float] | None = None) -> Timing:
    med, spread = _median_iqr(samples_us)
    if host_us is None:
        return Timing(med, len(samples_us), spread)
    host_med, host_spread = _median_iqr(host_us)
    return Timing(med, len(samples_us), spread, host_med, host_spread)


def _median_iqr(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    q = statistics.quantiles(samples, n=4) if len(samples) >= 4 else [samples[0], 0, samples[-1]]
    return statistics.median(samples), q[2] - q[0]


def _warm_outside_capture(fn: Callable[[], object]) -> None:
    """Run ``fn`` once on a side stream first: compilation and the allocator's first requests
    must not happen while a graph is captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()


def time_graph(fn: Callable[[], object], writes: int, replays: int, warmup: int = 10) -> Timing:
    """µs per write: ``fn`` issues ``writes`` writes; it is captured once and replayed."""
    _warm_outside_capture(fn)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for s, e in zip(starts, ends):
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    per_write = [s.elapsed_time(e) * 1000.0 / writes for s, e in zip(starts, ends)]
    del graph
    return _summary(per_write)


def time_eager(fn: Callable[[], object], writes: int, repeats: int, device: torch.device, warmup: int = 3) -> Timing:
    """µs per write of ``fn`` (``writes`` writes) run eagerly: wall clock, synchronized at the
    end, and the host's own time (the loop of launches before the sync). The host time is
    what "host launch path" means; with at most a few hundred launches in flight the launch
    queue does not fill, so it is not inflated by waiting for the GPU."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples, host = [], []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        t1 = time.perf_counter_ns()
        sync()
        samples.append((time.perf_counter_ns() - t0) / 1000.0 / writes)
        host.append((t1 - t0) / 1000.0 / writes)
    return _summary(samples, host)


def time_cold(fn: Callable[[], object], replays: int, device: torch.device, nodes: int = 20,
              warmup: int = 5) -> Timing:
    """µs of one write (``fn``) with the L2 flushed before it: what a write costs when its
    inputs, slots and rows come from DRAM, as the first write of a layer after other work
    does. Two graphs are captured: ``nodes`` x (flush, write) and ``nodes`` x (flush), the
    flush zeroing a buffer twice the L2's size; they are replayed in alternation and each
    sample is the pair's difference over ``nodes``, so what remains is the write's node in a
    replayed graph, on a cold cache, and neither the flush nor the host's launch path. The
    flush before a write triggers no early launch, so programmatic dependent launch hides
    nothing here."""
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (64 << 20))
    flush = torch.empty(2 * l2, dtype=torch.uint8, device=device)

    def with_write() -> None:
        for _ in range(nodes):
            flush.zero_()
            fn()

    def flush_only() -> None:
        for _ in range(nodes):
            flush.zero_()

    _warm_outside_capture(fn)
    graphs = []
    for body in (with_write, flush_only):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        graphs.append(g)
    for _ in range(warmup):
        for g in graphs:
            g.replay()
    torch.cuda.synchronize()
    events = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(replays)]
    for ev in events:
        for i, g in enumerate(graphs):
            ev[2 * i].record()
            g.replay()
            ev[2 * i + 1].record()
    torch.cuda.synchronize()
    samples = [(ev[0].elapsed_time(ev[1]) - ev[2].elapsed_time(ev[3])) * 1000.0 / nodes for ev in events]
    del graphs
    return _summary(samples)


def copy_rate_gbs(device: torch.device, nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """Device-to-device copy rate in GB/s, counting bytes read plus bytes written."""
    if device.type != "cuda":
        src = torch.empty(nbytes // 16, dtype=torch.uint8)
        src.fill_(1)
        dst = torch.empty_like(src)
        t = time_eager(lambda: dst.copy_(src), 1, 5, device)  # noqa: F821 (freed by `del` after the timing)
        return 2 * src.numel() / (t.median_us * 1e3)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.fill_(7)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        samples.append(s.elapsed_time(e) / 1000.0)
    seconds = statistics.median(samples)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / seconds / 1e9


def empty_node_us(device: torch.device, nodes: int = 200, replays: int = 100) -> dict[str, float | None]:
    """Cost of one node in a replayed graph: an empty kernel, and a one-element torch fill_."""
    if device.type != "cuda":
        return {"empty_kernel_us": None, "fill_node_us": None}
    out: dict[str, float | None] = {}
    try:
        from kvprof.bench.empty_kernel import launch_empty

        out["empty_kernel_us"] = time_graph(_repeat(launch_empty, nodes), nodes, replays).median_us
    except Exception as exc:  # no triton: the fill_ node still gives a floor  # noqa: BLE001
        out["empty_kernel_us"] = None
        out["empty_kernel_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # type: ignore[assignment]
    if torch.cuda.get_device_capability(device)[0] >= 9:  # the floor of writes launched with PDL
        try:
            from kvprof.bench.empty_kernel import launch_empty_pdl

            out["empty_pdl_kernel_us"] = time_graph(_repeat(launch_empty_pdl, nodes), nodes, replays).median_us
        except Exception as exc:  # noqa: BLE001  (a triton without launch_pdl)
            out["empty_pdl_kernel_us"] = None
            out["empty_pdl_kernel_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # type: ignore[assignment]
    x = torch.zeros(1, device=device)
    out["fill_node_us"] = time_graph(_repeat(lambda: x.fill_(1.0), nodes), nodes, replays).median_us
    return out


def _repeat(fn: Callable[[], object], times: int) -> Callable[[], None]:
    """``fn`` called ``times`` times in a row (one graph node each when captured)."""
    def run() -> None:
        for _ in range(times):
            fn()
    return run
