"""Benchmark one layer's K+V write per variant over a grid of row shapes, dtypes and token counts.

Each point is checked bitwise against ``index_put`` before it is timed (a fast wrong
write is not a result), then timed as graph replays (CUDA) and eagerly. The rope family
(``family="rope"``) times the write as engines now fuse it, rotary embedding of q and k plus
the store (``RopeKVWriter``s), checked bitwise against the float32 reference rotation and
``convert_for_cache``. The result is a
:class:`kvprof.core.bench_result.BenchResult` (one row per point, variant and mode), which
the table, the JSON/CSV files and the dashboard's Sweeps page all read.
"""

from __future__ import annotations

import copy
import datetime as _dt
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvprof.bench import grids
from kvprof.bench.timing import Timing, copy_rate_gbs, empty_node_us, time_cold, time_eager, time_graph
from kvprof.core import variants
from kvprof.core.bench_result import BenchResult, BenchRow, BenchSettings, BenchTarget
from kvprof.core.errors import KvprofError, Setting, UsageError, Words, rendered
from kvprof.kvcache.contracts import RopeKVWriter, checked_impl
from kvprof.kvcache.devinfo import device_properties, torch_threads, versions
from kvprof.kvcache.dtypes import parse_dtype, short_name
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.writers import create_writer, writer_names
from kvprof.kvcache.writers.card_tables import tables_report
from kvprof.kvcache.writers.triton_launch import launch_counts

BENCH_VARIANTS = variants.DEFAULT_BENCH_VARIANTS
# sgl-kernel's store_kv_cache, as the op (where it installs) or as its own kernels launched from
# the wheel's cubin (device time only: that variant's host path is kvprof's ctypes call)
SGL_PEERS = ("sgl_kernel", "sgl_kernel_cubin")
STORE_CACHE_PEER = "sglang_store_cache"  # SGLang's current JIT store (PDL), the peer of today's engines
KVPROF_FUSED = variants.KVPROF_FUSED
# the rope family: kvprof's one-launch rope + store, and what it is held against (the same
# rotary kernel, then kvprof's fused store or SGLang's two-stream store)
ROPE_KVPROF_FUSED = variants.ROPE_KVPROF_FUSED
ROPE_UNFUSED = ("rope_then_triton_fused", "rope_then_two_stream")
# SGLang's own rope + store kernels (JIT, Triton, sgl-kernel's cubin), where they can run
ROPE_PEERS = variants.ROPE_PEERS
ROPE_BENCH_VARIANTS = (*reversed(ROPE_UNFUSED), *ROPE_PEERS, *ROPE_KVPROF_FUSED)


@dataclass(frozen=True)
class BenchPoint:
    heads: int
    dim: int
    cache_dtype: str
    input_dtype: str
    tokens: int
    q_heads: int = 0  # the rope family: query heads rotated with the write (0: a store alone)

    @property
    def shape(self) -> str:
        return f"{self.q_heads}x{self.heads}x{self.dim}" if self.q_heads else f"{self.heads}x{self.dim}"

    @property
    def dtype_label(self) -> str:
        return self.cache_dtype if self.cache_dtype == self.input_dtype else f"{self.cache_dtype}<-{self.input_dtype}"

    def bytes_moved(self) -> int:
        """Inputs read once plus rows written once, K and V; a rope write also reads and
        writes back q and k (rotated in place): the copy floor of what each write moves."""
        elems = 2 * self.heads * self.dim * self.tokens
        cache = torch.empty((), dtype=parse_dtype(self.cache_dtype)).element_size()
        inp = torch.empty((), dtype=parse_dtype(self.input_dtype)).element_size()
        if not self.q_heads:
            return elems * (cache + inp)
        rotated = (self.q_heads + self.heads) * self.dim * self.tokens  # q and k: read, then written back
        return elems * cache + (2 * rotated + self.heads * self.dim * self.tokens) * inp


def grid(
    shapes: Sequence[tuple[int, int]],
    dtypes: Sequence[tuple[str, str]],
    tokens: Sequence[int],
) -> list[BenchPoint]:
    return [BenchPoint(h, d, c, i, t) for (h, d) in shapes for (c, i) in dtypes for t in tokens]


def rope_grid(
    shapes: Sequence[tuple[int, int, int]],
    dtypes: Sequence[tuple[str, str]],
    tokens: Sequence[int],
) -> list[BenchPoint]:
    """Rope-family points: ``shapes`` are (q heads, KV heads, head dim); each write rotates the
    whole head, so a head dim the rotary cannot take is refused here, in one line."""
    from kvprof.kvcache.contracts import rope_dim_reason

    for _, _, d in shapes:
        reason = rope_dim_reason(d, d)
        if reason:
            raise UsageError(Setting("family"), f" rope rotates the whole head (rope_dim = head dim): {reason}")
    return [BenchPoint(h, d, c, i, t, q_heads=q) for (q, h, d) in shapes for (c, i) in dtypes for t in tokens]


def default_grid(device: torch.device, family: str = "store", size: str | None = None) -> list[BenchPoint]:
    """The device kind's grid for ``family`` (:mod:`kvprof.bench.grids` says why these points);
    ``size``: quick or full (None: the one that fits the device kind)."""
    if family == "rope":
        r = grids.default_rope_grid(device.type, size)
        return rope_grid(r.shapes, r.dtypes, r.tokens)
    g = grids.default_grid(device.type, size)
    return grid(g.shapes, g.dtypes, g.tokens)


def writes_per_graph(bytes_per_write: int) -> int:
    """Writes per replay: enough that a replay's own launch cost (a few µs) is amortised.

    Sized by bytes, not tokens: a graph of a few writes of ~1.5 µs (4096 tokens x 1x128)
    reads the replay's own overhead into every write.
    """
    return max(10, min(100, -(-(256 << 20) // max(bytes_per_write, 1))))


def _pool_rows(point: BenchPoint, device: torch.device, pool_bytes: int) -> int:
    row = 2 * point.heads * point.dim * torch.empty((), dtype=parse_dtype(point.cache_dtype)).element_size()
    return max(pool_bytes // row, 4 * point.tokens + 1) if device.type == "cuda" else max(4 * point.tokens + 1, 1024)


def point_bytes(point: BenchPoint, device: torch.device, pool_bytes: int, variants: Sequence[str] = ()) -> int:
    """Peak memory of one point (its cases' pools, slot tables and inputs, the equivalence
    check's two small pools), from the sizes alone."""
    from kvprof.kvcache.guards import pool_bytes as kv_bytes

    cache = torch.empty((), dtype=parse_dtype(point.cache_dtype)).element_size()
    inp = torch.empty((), dtype=parse_dtype(point.input_dtype)).element_size()
    rows = _pool_rows(point, device, pool_bytes)
    cases = max([floor_allocations(point, v, device) for v in variants] or [1])
    per_case = (kv_bytes(rows, 2, point.heads, point.dim, point.dim, cache)  # the case's pool and a timed one
                + rows * 8 * 2  # randperm of every row, int64, and its shifted copy
                + (point.q_heads + 2 * point.heads) * point.tokens * point.dim * (4 + inp))  # inputs (rope: q too)
    check = kv_bytes(4 * point.tokens + 1, 2, point.heads, point.dim, point.dim, cache)
    return cases * per_case + check


def check_bench_memory(points: Iterable[BenchPoint], device: torch.device, pool_bytes: int,
                       max_memory_gb: float | None = None, variants: Sequence[str] = ()) -> None:
    """Refuse, before anything is allocated, a grid whose largest point needs more than the limit."""
    from kvprof.kvcache.guards import check_memory, memory_limit

    points = list(points)
    if not points:
        return
    biggest = max(points, key=lambda p: point_bytes(p, device, pool_bytes, variants))
    check_memory(point_bytes(biggest, device, pool_bytes, variants), memory_limit(device, max_memory_gb),
                 f"bench point {biggest.shape} x {biggest.tokens} tokens ({biggest.cache_dtype})")


class BenchCase:
    """One point on one device: the pool size, the slots of every write of a graph and the
    K/V inputs, shared by every variant timed at that point (and by lab scripts that time
    kernels the way the bench does).

    ``pool(name, writer)`` makes a pool of ``rows`` slots with that writer; ``check(writer)``
    says how a writer's result differs from index_put's (None: bitwise equal)."""

    def __init__(self, point: BenchPoint, device: torch.device, pool_bytes: int, seed: int) -> None:
        self.point = point
        self.device = device
        self.cache = parse_dtype(point.cache_dtype)
        self.inp = parse_dtype(point.input_dtype)
        self.rows = _pool_rows(point, device, pool_bytes)
        gen = torch.Generator().manual_seed(seed)
        if device.type == "cuda":
            self.writes = writes_per_graph(point.bytes_moved())
        else:
            self.writes = max(2, min(20, 2000 // point.tokens))
        self.locs = [
            (torch.randperm(self.rows - 1, generator=gen)[: point.tokens] + 1).to(device)
            for _ in range(self.writes)
        ]
        scale = 0.5 if self.cache in (torch.float8_e4m3fn, torch.float8_e5m2) else None
        self.scale = scale
        k = torch.randn((point.tokens, point.heads, point.dim), generator=gen)
        v = torch.randn((point.tokens, point.heads, point.dim), generator=gen)
        self.k, self.v = k.to(self.inp).to(device), v.to(self.inp).to(device)

    def own_inputs(self) -> BenchCase:
        """The same point with its own copy of the rows, for a writer that changes the rows it is
        given (``KVWriter.modifies_inputs``: SGLang's generic write divides them in place), so
        the variants after it write the rows every variant was given. Its replays then divide
        its copy again and again: the values change, the kernels' work does not."""
        own = copy.copy(self)
        own.k, own.v = self.k.clone(), self.v.clone()
        return own

    def pool(self, writer_name: str, writer: Any, rows: int | None = None) -> KVPool:
        return KVPool(rows or self.rows, 1, self.cache, self.point.heads, self.point.dim, 1, self.device,
                      writer=writer, check_slots=False)

    def family_reason(self, writer: Any) -> str | None:
        """Why ``writer`` is not timed at this point's family, else None."""
        if isinstance(writer, RopeKVWriter):
            return Words("it rotates q and k with the write: time it with kvprof bench ", Setting("family"), " rope")
        return None

    def write(self, pool: KVPool, loc: torch.Tensor) -> None:
        """One write through the pool, as the engine calls it."""
        pool.set_kv_buffer(0, loc, self.k, self.v, self.scale, self.scale)

    def writer_write(self, writer: Any, k_buf: torch.Tensor, v_buf: torch.Tensor, dtype: torch.dtype,
                     loc: torch.Tensor) -> None:
        """The same write on the writer's own launch path: no pool checks, and not the contract's
        checks its public ``write`` runs first (``write_unchecked``; their cost per call:
        benchmarks/bench_writer_checks.py)."""
        checked_impl(writer)(k_buf, v_buf, loc, self.k, self.v, dtype, self.scale, self.scale)

    def check(self, writer: Any) -> str | None:
        """None when ``writer`` leaves a small pool bitwise equal to index_put, else what differs."""
        rows = min(self.rows, 4 * self.point.tokens + 1)
        gen = torch.Generator().manual_seed(1)
        loc = (torch.randperm(rows - 1, generator=gen)[: self.point.tokens] + 1).to(self.device)
        ref = self.pool("index_put", create_writer("index_put"), rows)
        got = self.pool(writer.name, writer, rows)
        for p in (ref, got):
            p.set_kv_buffer(0, loc, self.k, self.v, self.scale, self.scale)
        for name, a, b in (("K", ref.k_buffer[0], got.k_buffer[0]), ("V", ref.v_buffer[0], got.v_buffer[0])):
            if not torch.equal(a, b):
                bad = int((a != b).any(dim=-1).any(dim=-1).sum())
                return f"{name} differs from index_put in {bad} rows"
        return None


class RopeBenchCase(BenchCase):
    """A rope-family point: q, k and v as views of one projection row (an engine's strides),
    positions and a float32 cos/sin table; each write rotates q and k in place (NeoX, the
    whole head) and stores K and V."""

    MAX_POSITION = 8192

    def __init__(self, point: BenchPoint, device: torch.device, pool_bytes: int, seed: int) -> None:
        super().__init__(point, device, pool_bytes, seed)
        if device.type != "cuda":
            self.writes = 2  # Triton's interpreter: tens of ms per write
            self.locs = self.locs[:2]
        gen = torch.Generator().manual_seed(seed + 1)
        t, q, h, d = point.tokens, point.q_heads, point.heads, point.dim
        self.qkv = torch.randn((t, (q + 2 * h) * d), generator=gen).to(self.inp).to(device)
        self.positions = torch.randint(0, self.MAX_POSITION, (t,), generator=gen).to(device)
        from kvprof.kvcache.writers.rope_reference import cos_sin_table

        self.cos_sin_cache = cos_sin_table(self.MAX_POSITION, d).to(device)
        self.q, self.k, self.v = self.views(self.qkv)

    def views(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t, q, h, d = self.point.tokens, self.point.q_heads, self.point.heads, self.point.dim
        return (qkv[:, : q * d].view(t, q, d), qkv[:, q * d : (q + h) * d].view(t, h, d),
                qkv[:, (q + h) * d :].view(t, h, d))

    def family_reason(self, writer: Any) -> str | None:
        if not isinstance(writer, RopeKVWriter):
            return "a store of K and V alone: the rope family times rope + store writers (rope_*)"
        return None

    def write(self, pool: KVPool, loc: torch.Tensor) -> None:
        pool.set_kv_buffer_with_rope(0, loc, self.q, self.k, self.v, self.positions, self.cos_sin_cache, True,
                                     self.scale, self.scale)

    def writer_write(self, writer: Any, k_buf: torch.Tensor, v_buf: torch.Tensor, dtype: torch.dtype,
                     loc: torch.Tensor) -> None:
        checked_impl(writer)(self.q, self.k, self.v, k_buf, v_buf, loc, self.positions, self.cos_sin_cache, True, dtype,
                     self.scale, self.scale)

    def check(self, writer: Any) -> str | None:
        """None when ``writer`` rotates q and k as the float32 reference does, up to one unit in
        the last place of their dtype (a kernel compiled with fused multiply-adds, such as
        SGLang's, rounds within that; kvprof's own match it bitwise, tests/test_rope_writers.py),
        and stores what ``convert_for_cache`` makes of the k it wrote back and of v, bitwise."""
        from kvprof.kvcache.dtypes import convert_for_cache
        from kvprof.kvcache.writers.rope_reference import rope_reference

        rows = min(self.rows, 4 * self.point.tokens + 1)
        gen = torch.Generator().manual_seed(1)
        loc = (torch.randperm(rows - 1, generator=gen)[: self.point.tokens] + 1).to(self.device)
        qkv = self.qkv.clone()
        q, k, v = self.views(qkv)
        ref_q, ref_k = rope_reference(q, k, self.cos_sin_cache, self.positions, True)
        pool = self.pool(writer.name, writer, rows)
        pool.set_kv_buffer_with_rope(0, loc, q, k, v, self.positions, self.cos_sin_cache, True, self.scale, self.scale)
        for name, got, ref, before in (("q", q, ref_q, self.views(self.qkv)[0]),
                                       ("k", k, ref_k, self.views(self.qkv)[1])):
            off = _beyond_one_ulp(got, ref, before)
            if off:
                return f"{name} differs from the float32 reference by more than one ulp in {off} tokens"
        store = pool.k_buffer[0].dtype
        for name, got, want in (("K cache", pool.k_buffer[0][loc],
                                 convert_for_cache(k, self.cache, self.scale).view(store)),
                                ("V cache", pool.v_buffer[0][loc],
                                 convert_for_cache(v, self.cache, self.scale).view(store))):
            if not torch.equal(got, want):
                return f"{name} differs from convert_for_cache in {int((got != want).flatten(1).any(1).sum())} tokens"
        return None


def _beyond_one_ulp(got: torch.Tensor, ref: torch.Tensor, before: torch.Tensor) -> int:
    """Tokens where ``got`` is further from the float32 ``ref`` than one ulp of its dtype at
    ``ref`` plus the fp32 rounding of the products where they cancel (``before``: the inputs)."""
    finfo = torch.finfo(got.dtype)
    mantissa = {torch.bfloat16: 7, torch.float16: 10}.get(got.dtype, 23)
    exponent = torch.floor(torch.log2(ref.abs().clamp_min(finfo.tiny)))
    ulp = torch.exp2(exponent - mantissa).clamp_min(finfo.tiny * 2.0 ** -mantissa)  # subnormals: their step
    slack = 2.0 ** -22 * before.float().abs().amax(dim=-1, keepdim=True)
    bad = (got.float() - ref).abs() > ulp + slack
    return int(bad.flatten(1).any(1).sum())


def make_case(point: BenchPoint, device: torch.device, pool_bytes: int, seed: int) -> BenchCase:
    """The point's case: a store of K and V, or (``q_heads``) a rope + store write."""
    return (RopeBenchCase if point.q_heads else BenchCase)(point, device, pool_bytes, seed)


# At the latency floor a graph's median depends on where its buffers landed (one allocation
# can read 0.06-0.09 µs apart from others of the same point: docs/benchmarks.md). So small points of
# the variants the verdicts judge are timed over this many allocations (pool, slots, rows), and
# the median of their medians is the record's; each one is kept (``allocation_us``).
FLOOR_ALLOCATIONS = 5
FLOOR_BYTES = 4 << 20  # per write: up to 64 tokens at every shape, 512 at the small rows


def floor_allocations(point: BenchPoint, variant: str, device: torch.device) -> int:
    if device.type != "cuda" or point.bytes_moved() > FLOOR_BYTES:
        return 1
    judged = variant in KVPROF_FUSED or variant in SGL_PEERS or variant in ROPE_KVPROF_FUSED
    return FLOOR_ALLOCATIONS if judged or variant == STORE_CACHE_PEER else 1


def bench_variant(case: BenchCase, variant: str, writer: Any, replays: int, eager_repeats: int,
                  extra_cases: Sequence[BenchCase] = (), modes: Sequence[str] | None = None,
                  names: Callable[[str], str] = str) -> list[BenchRow]:
    """``writer`` is built once per run (compiled writers then compile once, not per point);
    ``extra_cases``: the same point in other allocations, graph-timed too (see FLOOR_ALLOCATIONS);
    ``modes``: which timings (default :func:`default_modes`; "cold" is one write after an L2 flush);
    ``names``: how a row's reason spells a setting it names."""
    point = case.point
    modes = tuple(modes or default_modes(case.device))

    def row(mode: str, status: str, **kw: Any) -> BenchRow:
        return BenchRow(point.heads, point.dim, point.cache_dtype, point.input_dtype, point.tokens, variant, mode,
                        status, bytes=point.bytes_moved(), writes_per_sample=case.writes,
                        q_heads=point.q_heads or None, **kw)

    if isinstance(writer, KvprofError):
        return [row(m, "unavailable", reason=str(writer)) for m in modes]
    reason = case.family_reason(writer) or writer.unsupported_reason(case.device, case.cache, case.inp)
    if reason:
        status = "not installed" if "not installed" in reason else "unavailable"
        return [row(m, status, reason=rendered(reason, names)) for m in modes]
    writer.prepare(case.device)
    case, extra_cases = _inputs_for(writer, case, extra_cases)
    wrong = case.check(writer)
    if wrong:
        return [row(m, "wrong", reason=wrong) for m in modes]
    pool = case.pool(variant, writer)
    eager_repeats, warmup = _eager_samples(writer, eager_repeats)

    def step() -> None:
        for loc in case.locs:
            case.write(pool, loc)  # noqa: F821 (freed by `del pool` after its last call)

    k_buf, v_buf, dtype = pool.k_buffer[0], pool.v_buffer[0], pool.dtype

    def writer_step() -> None:
        # the same writes without the pool's checks: the writer's own launch path, the
        # counterpart of calling sgl-kernel's op directly
        for loc in case.locs:
            case.writer_write(writer, k_buf, v_buf, dtype, loc)

    out = []
    for mode in modes:
        pool.path_counts.clear()
        try:
            t: Timing
            if mode == "graph":
                t = time_graph(step, case.writes, replays)
            elif mode == "cold":
                first = case.locs[0]
                t = time_cold(lambda: case.write(pool, first), replays, case.device)  # noqa: F821
            else:
                t = time_eager(step, case.writes, eager_repeats, case.device, warmup=warmup)
        except Exception as exc:  # a variant that cannot be captured (e.g. syncs) is a result too  # noqa: BLE001
            out.append(row(mode, "failed",
                           reason=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
            continue
        rec = row(mode, "ok", median_us=t.median_us, iqr_us=t.spread_us, samples=t.samples,
                  paths=dict(pool.path_counts))
        if mode == "graph" and extra_cases:
            timings = [t, *(_time_other_allocation(c, variant, writer, replays) for c in extra_cases)]
            rec.median_us = statistics.median(x.median_us for x in timings)
            rec.iqr_us = statistics.median(x.spread_us for x in timings)
            rec.allocation_us = [round(x.median_us, 4) for x in timings]
        if t.host_us is not None:
            rec.host_us, rec.host_iqr_us = t.host_us, t.host_spread_us
            w = time_eager(writer_step, case.writes, eager_repeats, case.device, warmup=warmup)
            rec.writer_host_us, rec.writer_host_iqr_us = w.host_us, w.host_spread_us
        out.append(rec)
    del pool
    return out


def _inputs_for(writer: Any, case: BenchCase, extra: Sequence[BenchCase]) -> tuple[BenchCase, Sequence[BenchCase]]:
    """The cases as ``writer`` gets them: its own copy of the rows where it changes them."""
    if getattr(writer, "modifies_inputs", False):
        return case.own_inputs(), [c.own_inputs() for c in extra]
    return case, extra


def _time_other_allocation(case: BenchCase, variant: str, writer: Any, replays: int) -> Timing:
    pool = case.pool(variant, writer)

    def step() -> None:
        for loc in case.locs:
            case.write(pool, loc)  # noqa: F821 (freed by `del pool` after its last call)

    try:
        return time_graph(step, case.writes, replays)
    finally:
        del pool


MODES = ("graph", "eager", "cold")
# a writer run by Triton's interpreter (a CPU) takes tens of ms a write and its time is the
# interpreter's, not a kernel's: it gets at most this many eager samples after one warm-up
# (its rows record their samples), so that a default CPU bench ends in about half a minute
INTERPRETED_REPEATS = 3


def _runs_interpreted(writer: object) -> bool:
    """Whether ``writer``'s kernel runs under Triton's interpreter here (its info says so)."""
    info = getattr(writer, "info", None)
    if not callable(info):
        return False
    try:
        return bool(info().extra.get("interpreted"))
    except KvprofError:  # a writer that cannot say here (what it needs is missing): it does not run
        return False


def _eager_samples(writer: object, repeats: int) -> tuple[int, int]:
    """(samples, warm-up calls) of an eager timing: fewer for an interpreted writer."""
    return (min(repeats, INTERPRETED_REPEATS), 1) if _runs_interpreted(writer) else (repeats, 3)


def default_modes(device: torch.device) -> tuple[str, ...]:
    return ("graph", "eager") if device.type == "cuda" else ("eager",)


def check_modes(modes: Sequence[str], device: torch.device) -> tuple[str, ...]:
    """``modes`` as given, refused in one line where unknown or where the device has no such timing."""
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise UsageError(f"unknown timing mode(s) {', '.join(unknown) or '(none given)'}; choose from "
                         f"{', '.join(MODES)}")
    if device.type != "cuda" and set(modes) - {"eager"}:
        raise UsageError(Setting("modes"), f" {','.join(modes)}: on {device.type} only the eager wall clock exists "
                         "(graph replays and an L2 flush need a CUDA device)")
    return tuple(dict.fromkeys(modes))


def derive(records: list[BenchRow], limits: dict[str, Any], target: BenchTarget | None = None) -> list[BenchRow]:
    """Bandwidth, share of the copy rate, target, and ratios to every peer at the same point (in place)."""
    target = target or BenchTarget()
    rate = limits.get("copy_rate_gbs")
    by_point: dict[tuple, dict[str, BenchRow]] = {}
    for r in records:
        by_point.setdefault(r.key, {})[r.variant] = r
    for r in records:
        if not r.ok or r.median_us is None:
            continue
        us = r.median_us
        r.gbs = r.bytes / (us * 1e3)
        r.pct_copy_rate = 100.0 * r.gbs / rate if rate else None
        if rate:
            r.target_us = target.us(r.bytes, rate)
            r.meets_target = us <= r.target_us
        r.floor_us = limits.get("empty_kernel_us")
        r.ratio_to = {  # > 1: this variant is faster than that peer
            name: p.median_us / us for name, p in by_point[r.key].items()
            if name != r.variant and p.ok and p.median_us is not None
        }
    return records


def run_bench(
    points: Iterable[BenchPoint],
    variants: Sequence[str],
    device: torch.device,
    *,
    replays: int = 100,
    eager_repeats: int = 20,
    pool_bytes: int = 256 << 20,
    seed: int = 0,
    target: BenchTarget | None = None,
    on_point: Callable[[BenchPoint], None] | None = None,
    on_partial: Callable[[BenchResult], None] | None = None,
    threads: int | None = None,
    modes: Sequence[str] | None = None,
    progress: Any = None,
    names: Callable[[str], str] = str,
) -> BenchResult:
    """``target``: what the fused writes are judged against (default :class:`BenchTarget`);
    ``on_partial`` gets the result so far after every point (``complete`` False), so a run
    cut short by a time limit still leaves every point it measured. ``threads``: torch's
    intra-op threads while timing (None: as they are); the result records the number used.
    ``progress``: told what runs (``describe(text)``) and when a variant's point is done
    (``advance()``), as capture's progress bar is. ``names``: how a row's reason spells a
    setting it names (default its field; the command line passes its flags)."""
    if replays < 1 or eager_repeats < 1:
        raise UsageError(Setting("replays"), " and ", Setting("eager_repeats"), " must be positive")
    if threads is not None and threads < 1:
        raise UsageError(Setting("threads"), " must be positive")
    chosen = check_modes(modes, device) if modes else default_modes(device)
    with torch_threads(threads):
        return _run_bench(list(points), variants, device, replays=replays, eager_repeats=eager_repeats,
                          pool_bytes=pool_bytes, seed=seed, target=target or BenchTarget(), on_point=on_point,
                          on_partial=on_partial, modes=chosen, progress=progress, names=names)


def point_label(point: BenchPoint) -> str:
    """A point as the table names it: shape, dtype, tokens (``8x128 bf16 64 tok``)."""
    return f"{point.shape} {point.dtype_label} {point.tokens} tok"


def _run_bench(points: list[BenchPoint], variants: Sequence[str], device: torch.device, *, replays: int,
               eager_repeats: int, pool_bytes: int, seed: int, target: BenchTarget,
               on_point: Callable[[BenchPoint], None] | None,
               on_partial: Callable[[BenchResult], None] | None, modes: tuple[str, ...],
               progress: Any = None, names: Callable[[str], str] = str) -> BenchResult:
    if progress is not None:
        progress.describe("copy rate")
    limits: dict[str, Any] = {"copy_rate_gbs": copy_rate_gbs(device), **empty_node_us(device)}
    records: list[BenchRow] = []
    unknown = [v for v in variants if ":" not in v and v not in writer_names()]
    if unknown:
        raise UsageError(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(writer_names())}")
    writers: dict[str, Any] = {}
    for variant in variants:
        if progress is not None:
            progress.describe(f"loading {variant}")
        try:
            writers[variant] = create_writer(variant)
        except KvprofError as exc:
            writers[variant] = exc
    sources = {name: src for name, w in writers.items()
               if callable(getattr(w, "source", None)) and (src := w.source())}
    interpreted = [name for name, w in writers.items() if _runs_interpreted(w)]
    settings = BenchSettings(replays=replays, eager_repeats=eager_repeats, pool_bytes=pool_bytes,
                             variants=list(variants), points=len(points), target=target,
                             floor_allocations={"count": FLOOR_ALLOCATIONS, "max_bytes_per_write": FLOOR_BYTES,
                                                "variants": [*KVPROF_FUSED, *SGL_PEERS, STORE_CACHE_PEER,
                                                             *ROPE_KVPROF_FUSED]},
                             torch_threads=torch.get_num_threads(), modes=list(modes), interpreted=interpreted)

    tables = tables_report(device)

    def result(complete: bool) -> BenchResult:
        return BenchResult(
            records=derive([copy.copy(r) for r in records], limits, target), settings=settings,
            device=device_properties(device), versions=versions(), limits=limits,
            # where a peer's kernels come from (sgl_kernel_cubin: the wheel and the cubin's hash)
            sources=sources, date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            complete=complete, launch_tables=tables, launches=launch_counts())

    for i, point in enumerate(points):
        if on_point:
            on_point(point)
        case = make_case(point, device, pool_bytes, seed + i)
        extra: list[BenchCase] = []
        for variant in variants:
            n = floor_allocations(point, variant, device)
            while len(extra) < n - 1:  # built once per point, shared by the variants that use them
                extra.append(make_case(point, device, pool_bytes, seed + i + 7919 * (len(extra) + 1)))
            if progress is not None:
                progress.describe(f"{point_label(point)}: {variant}{' *' if variant in interpreted else ''}")
            records += bench_variant(case, variant, writers[variant], replays, eager_repeats, extra[: n - 1],
                                     modes, names)
            if progress is not None:
                progress.advance()
        del case, extra
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if on_partial:
            on_partial(result(complete=False))
    return result(complete=True)


def fused_verdicts(result: BenchResult, variant: str) -> dict[str, Any]:
    """The checks for one fused variant, from one run's records only.

    * ``target``: graph median <= the run's target (:class:`BenchTarget`), at every point;
    * ``vs_sgl``: no slower than sgl-kernel's ``store_kv_cache`` in graph replays: the
      measured ``sgl_kernel`` column where it ran, else the measured ``sgl_kernel_cubin``
      column (sgl-kernel's own kernels from its wheel), else (on an H200) the reference
      numbers of :mod:`kvprof.bench.reference`, reported as such;
    * ``eager_host``: host time per eager write <= sgl-kernel's op (measured, else
      reference). Judged on the writer's own launch path (``writer_host_us``: the call the
      pool makes, the counterpart of calling sgl-kernel's op), with the time through the
      pool and two index_put's time on the same host beside it; records without the writer
      column are judged through the pool (``basis``);
    * ``fp8_vs_bf16``: an fp8 cache written from bf16 (scale in the same launch) takes no
      more graph time than the bf16 cache at the same row shape and token count. Every
      slower point is listed; ``within_noise`` are those slower by no more than the larger
      of the two interquartile ranges of the replays.
    """
    from kvprof.bench import reference

    ref = reference.load()
    ok = [r for r in result.records if r.ok and r.median_us is not None]
    recs = [r for r in ok if r.variant == variant]
    graph = [r for r in recs if r.mode == "graph"]
    eager = [r for r in recs if r.mode == "eager" and r.host_us is not None]
    out: dict[str, Any] = {"variant": variant, "graph_points": len(graph)}
    judged = [r for r in graph if r.target_us is not None]
    missed = [r for r in judged if not r.meets_target]
    out["target"] = {"met": len(judged) - len(missed), "points": len(judged),
                     "missed": [_where(r) + f" {r.median_us:.2f} > {r.target_us:.2f} µs" for r in missed]}

    use_ref = ref.applies(result.device_name)
    by_peer = {name: {r.key: r for r in ok if r.variant == name} for name in SGL_PEERS}
    sgl = by_peer["sgl_kernel"]
    slower, compared, sources = [], 0, set()
    for r in graph:
        peer_name = next((name for name in SGL_PEERS if r.key in by_peer[name]), None)
        ref_us = by_peer[peer_name][r.key].median_us if peer_name else None
        if peer_name:
            sources.add(f"measured: {peer_name}")
        elif use_ref and r.dtype == "bf16":
            ref_us = ref.graph_us.get((r.shape, r.tokens))
            if ref_us is not None:
                sources.add(f"reference: {ref.source}")
        if ref_us is None:
            continue
        compared += 1
        if r.median_us is not None and r.median_us > ref_us:
            slower.append(_where(r) + f" {r.median_us:.2f} > {ref_us:.2f} µs")
    out["vs_sgl"] = {"compared": compared, "slower": slower, "source": "; ".join(sorted(sources)) or "none"}
    out["vs_store_cache"] = {mode: _against(recs, ok, STORE_CACHE_PEER, mode) for mode in ("graph", "cold")}

    field = "writer_host_us" if eager and all(r.writer_host_us is not None for r in eager) else "host_us"

    def over_limit(key: str) -> tuple[list[str], int]:
        over, compared = [], 0
        for r in eager:
            peer = sgl.get((r.shape, r.dtype, r.tokens, "eager"))
            limit = getattr(peer, key) if peer else (ref.eager_host_us if use_ref else None)
            if limit is None:
                continue
            compared += 1
            if getattr(r, key) > limit:
                over.append(_where(r) + f" {getattr(r, key):.2f} > {limit:.2f} µs")
        return over, compared

    over, host_compared = over_limit(field)
    pool_over, _ = over_limit("host_us")
    index_put = [getattr(r, field) for r in ok if r.variant == "index_put" and r.mode == "eager"
                 and getattr(r, field) is not None]
    out["eager_host"] = {"compared": host_compared, "over": over, "basis": "writer" if field != "host_us" else "pool",
                         "median_us": _median([getattr(r, field) for r in eager]),
                         "pool_median_us": _median([r.host_us for r in eager if r.host_us is not None]),
                         "pool_over": len(pool_over),
                         "index_put_median_us": _median(index_put)}

    bf16 = {(r.shape, r.tokens): r for r in graph if r.dtype == "bf16"}
    fp8 = [r for r in graph if r.cache_dtype.startswith("fp8") and r.input_dtype == "bf16"]
    worse, noise = [], []
    for r in fp8:
        b = bf16.get((r.shape, r.tokens))
        if b is None or r.median_us is None or b.median_us is None or r.median_us <= b.median_us:
            continue
        line = _where(r) + f" {r.median_us:.2f} > bf16 {b.median_us:.2f} µs"
        worse.append(line)
        if r.median_us - b.median_us <= max(r.iqr_us or 0.0, b.iqr_us or 0.0):
            noise.append(line)
    out["fp8_vs_bf16"] = {"compared": sum((r.shape, r.tokens) in bf16 for r in fp8), "slower": worse,
                          "within_noise": noise}
    return out


def _against(mine: list[BenchRow], ok: list[BenchRow], peer: str, mode: str) -> dict[str, Any]:
    """``mine`` against ``peer`` at the same points in one mode: the points compared, those
    where ``mine`` is slower, and those of them slower by no more than the larger IQR."""
    theirs = {r.key: r for r in ok if r.variant == peer and r.mode == mode}
    compared, slower, noise = 0, [], []
    for r in mine:
        p = theirs.get(r.key) if r.mode == mode else None
        if p is None or p.median_us is None or r.median_us is None:
            continue
        compared += 1
        if r.median_us > p.median_us:
            line = _where(r) + f" {r.median_us:.3f} > {p.median_us:.3f} µs"
            slower.append(line)
            if r.median_us - p.median_us <= max(r.iqr_us or 0.0, p.iqr_us or 0.0):
                noise.append(line)
    return {"compared": compared, "slower": slower, "within_noise": noise}


def rope_verdicts(result: BenchResult, variant: str) -> dict[str, Any]:
    """The checks for one rope + store variant fused into one launch, from one run's records:
    the target (its copy floor counts q and k read and written back, v read, two cache rows
    written), and how it compares with the same rotation followed by a store (``ROPE_UNFUSED``)
    at the same points: graph replays on CUDA, the wall clock on a CPU."""
    ok = [r for r in result.records if r.ok and r.median_us is not None]
    mode = "graph" if any(r.mode == "graph" for r in ok) else "eager"
    mine = [r for r in ok if r.variant == variant and r.mode == mode]
    judged = [r for r in mine if r.target_us is not None]
    missed = [r for r in judged if not r.meets_target]
    out: dict[str, Any] = {"variant": variant, "mode": mode, "points": len(mine),
                           "target": {"met": len(judged) - len(missed), "points": len(judged),
                                      "missed": [_where(r) + f" {r.median_us:.2f} > {r.target_us:.2f} µs"
                                                 for r in missed]}}
    for other in ROPE_UNFUSED:
        ratios = [(r, (r.ratio_to or {})[other]) for r in mine if other in (r.ratio_to or {})]
        out[other] = {"compared": len(ratios), "slower": [_where(r) + f" x{x:.2f}" for r, x in ratios if x < 1],
                      "min_ratio": min((x for _, x in ratios), default=None),
                      "median_ratio": _median([x for _, x in ratios])}
    return out


def _where(r: BenchRow) -> str:
    return f"{r.shape} {r.dtype} {r.tokens} tok"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


__all__ = ["BENCH_VARIANTS", "ROPE_BENCH_VARIANTS", "BenchCase", "BenchPoint", "BenchResult", "BenchRow", "BenchTarget",
           "RopeBenchCase", "default_grid", "derive", "fused_verdicts", "grid", "make_case", "point_label",
           "rope_grid", "rope_verdicts", "run_bench", "short_name"]
