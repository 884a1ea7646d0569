#!/usr/bin/env python3
"""Time triton_fused's candidate launch shapes on one GPU, the way `kvprof bench` times them.

    cd <repo> && OUT=/tmp/out python lab/tune_fused.py      # ~3 minutes, JSON to $OUT/tune.json

Why it exists: ``TRITON_TABLE`` (kvprof/kvcache/writers/triton_tables.py) picks a launch shape from
(row bytes, tokens); this script measures the candidates it is chosen from. Each point uses
the bench's own case (a 256 MB pool at random slots, W writes per captured graph, median of
100 replays after warm-up: ``kvprof.bench.run.BenchCase`` and ``kvprof.bench.timing.time_graph``),
so a tuned number is a bench number. Every candidate is first checked bitwise against
index_put. Row shapes: 1x128, 8x128 (4x256 has the same row bytes, so the same kernel),
32x128; bf16 from bf16 and fp8 e4m3 from bf16 with scale 0.5; tokens 1 .. 32768.

The distinct kernels (row length x launch shape x dtype pair) are compiled first, in
parallel worker processes that fill Triton's on-disk cache; the timing process then loads
them from there instead of compiling one at a time.

It also times the eager host path of every fused writer at 1 token (host time per call:
the loop of launches before the sync), split into the compiled op alone, the writer, and
the pool, so the cost of each layer is visible; and the op's own parts (the pybind call
with no launch, the launch with and without programmatic dependent launch), once with the
process free to migrate between cores and once pinned to one core.

``TUNE_PEERS`` (e.g. ``sglang_store_cache``): writers timed at every point beside the
candidates, in the same case and the same way, so a candidate can be read against them.

Environment: ``TUNE_PARTS`` (default ``host,tune``), ``TUNE_SHAPES`` (``1x128,8x128``),
``TUNE_DTYPES`` (``bf16,fp8_e4m3``) and ``TUNE_TOKENS`` (``1,8,64``) run a subset;
``TUNE_CAPTURES`` (default 1) times each candidate over that many graph captures and keeps
the median (the first measurement of a process reads low: lab/results/floor-modes.txt).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # the compiled kernels, whatever the shell says
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvprof.core.atomic import atomic_write_text  # noqa: E402  (after the path insert)

T0 = time.perf_counter()


def _env_list(name: str, default: list, parse) -> list:
    raw = os.environ.get(name)
    try:
        return [parse(x) for x in raw.split(",") if x] if raw else default
    except ValueError:
        raise SystemExit(f"tune_fused.py: error: cannot read {name}={raw!r} (e.g. TUNE_SHAPES=1x128,8x128, "
                         "TUNE_TOKENS=1,8,64)") from None


SHAPES = _env_list("TUNE_SHAPES", [(1, 128), (8, 128), (32, 128)], lambda s: tuple(int(v) for v in s.split("x")))
DTYPES = _env_list("TUNE_DTYPES", [("bf16", "bf16"), ("fp8_e4m3", "bf16")], lambda s: (s, "bf16"))
TOKENS = _env_list("TUNE_TOKENS", [1, 8, 64, 512, 4096, 32768], int)
PARTS = set(_env_list("TUNE_PARTS", ["host", "tune"], str))

# (row elements, token upper bound) -> candidate (block_t, num_warps, split[, stream]); hand-picked so
# each thread holds 4..16 elements per row chunk (8 or 16 bytes of bf16 per access).
CANDIDATES: dict[int, list[tuple[int, list[tuple[int, int, int]]]]] = {
    128: [
        (1, [(1, 1, 1)]),
        (8, [(1, 1, 1), (2, 1, 1), (4, 1, 1), (8, 2, 1)]),
        (512, [(1, 1, 1), (2, 1, 1), (4, 1, 1), (4, 2, 1), (8, 1, 1), (8, 2, 1), (16, 4, 1)]),
        (4096, [(2, 1, 1), (4, 1, 1), (4, 2, 1), (8, 1, 1), (8, 2, 1), (16, 2, 1), (16, 4, 1), (32, 4, 1)]),
        (1 << 62, [(8, 2, 1), (16, 2, 1), (16, 4, 1), (32, 4, 1), (32, 8, 1), (64, 8, 1)]),
    ],
    1024: [
        (64, [(1, 4, 1), (1, 2, 1), (1, 2, 2), (1, 1, 4), (1, 1, 2), (2, 4, 1)]),
        (512, [(1, 4, 1), (1, 2, 1), (1, 2, 2), (1, 1, 4), (2, 4, 1), (2, 8, 1)]),
        (1 << 62, [(1, 4, 1), (1, 2, 1), (2, 4, 1), (2, 8, 1), (4, 8, 1), (4, 4, 1)]),
    ],
    4096: [
        (8, [(1, 8, 1), (1, 16, 1), (1, 4, 2), (1, 2, 4), (1, 1, 8), (1, 2, 8), (1, 1, 16)]),
        (512, [(1, 8, 1), (1, 16, 1), (1, 4, 1), (1, 4, 2), (1, 2, 4), (2, 8, 1)]),
        (1 << 62, [(1, 8, 1), (1, 4, 1), (2, 8, 1), (1, 16, 1), (2, 4, 1), (2, 16, 1), (4, 16, 1), (1, 8, 2),
                   (1, 16, 2), (4, 8, 1), (1, 4, 4), (1, 8, 4), (1, 8, 2, True), (1, 16, 1, True), (1, 4, 4, True),
                   (4, 16, 1, True), (1, 8, 4, True)]),
    ],
}


# fp8 caches convert in the kernel, so at a few tokens (latency-bound) they also try shapes
# that give each thread fewer elements (4 per row chunk: more warps or more column chunks),
# which shortens the load -> convert -> store chain of each warp. Every one keeps >= 4
# elements per thread, so the hardware fp8 cast stays on (_fp8_cast_safe).
FP8_EXTRA: dict[int, list[tuple[int, list[tuple[int, int, int]]]]] = {
    128: [
        (64, [(2, 2, 1), (4, 4, 1), (8, 8, 1)]),
        (4096, [(8, 4, 1), (16, 8, 1), (16, 16, 1)]),
    ],
    1024: [
        (64, [(1, 8, 1), (1, 4, 2), (1, 2, 4), (1, 1, 8), (2, 8, 1), (2, 4, 2)]),
    ],
    4096: [
        (64, [(1, 4, 4), (1, 8, 4), (1, 4, 8), (1, 2, 16), (1, 16, 2), (1, 8, 2), (2, 8, 4)]),
    ],
}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


PEERS = _env_list("TUNE_PEERS", [], str)
CAPTURES = _env_list("TUNE_CAPTURES", [1], int)[0]  # graph captures per candidate, median taken
if CAPTURES < 1:
    raise SystemExit(f"tune_fused.py: error: TUNE_CAPTURES must be at least 1, got {CAPTURES}")


def candidates(rk: int, tokens: int, fp8: bool = False) -> list[tuple[int, int, int]]:
    """The launch shapes to time. The few-token shapes of FP8_EXTRA (4 elements per thread)
    are tried for every dtype: lab/fp8_ablation.py found them faster for bf16 copies too."""
    out: list[tuple[int, int, int]] = []
    for table in (CANDIDATES, FP8_EXTRA):
        for bound, cands in table.get(rk, []):
            if tokens <= bound:
                out += [c for c in cands if c not in out]
                break
    assert out, (rk, tokens)
    return out


def _compile_one(job: tuple[int, int, str, str, tuple]) -> str:
    """Worker: one write with one launch shape, which compiles it into Triton's disk cache."""
    heads, dim, cache, inp, shape = job
    import torch

    from kvprof.kvcache.dtypes import parse_dtype, store_dtype_for
    from kvprof.kvcache.writers.triton_fused import TritonConfig, TritonFusedWriter

    c, i = parse_dtype(cache), parse_dtype(inp)
    w = TritonFusedWriter(config=TritonConfig(*shape))
    buf = torch.zeros(64, heads, dim, dtype=store_dtype_for(c), device="cuda")
    x = torch.ones(2, heads, dim, dtype=i, device="cuda")
    scale = 0.5 if c != i else None
    for tokens in (2,):  # WIDE (64-bit offsets) is never needed at these sizes
        w.write(buf, buf.clone(), torch.arange(1, tokens + 1, device="cuda"), x, x, c, scale, scale)
    torch.cuda.synchronize()
    return f"{heads}x{dim} {cache} {'/'.join(map(str, shape))}"


def precompile() -> None:
    jobs = sorted({(h, d, c, i, cfg) for (h, d) in SHAPES for (c, i) in DTYPES for t in TOKENS
                   for cfg in candidates(h * d, t, c.startswith("fp8"))})
    log(f"compiling {len(jobs)} kernels in worker processes")
    ctx = __import__("multiprocessing").get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=min(12, os.cpu_count() or 4), mp_context=ctx) as pool:
        failed = 0
        for fut in cf.as_completed([pool.submit(_compile_one, j) for j in jobs]):
            try:
                fut.result()
            except Exception as exc:  # noqa: BLE001  the timing pass reports it per candidate
                failed += 1
                log(f"  compile failed: {str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}")
    log(f"compiled ({failed} failed)")


def time_peers(case, device) -> dict:
    """TUNE_PEERS timed in ``case`` the way the candidates are (median over TUNE_CAPTURES graphs)."""
    from kvprof.bench.timing import time_graph
    from kvprof.kvcache.writers import create_writer

    out: dict = {}
    for peer in PEERS:
        try:
            w = create_writer(peer)
            reason = w.unsupported_reason(device, case.cache, case.inp)
            if reason:
                out[peer] = {"error": reason}
                continue
            pool = case.pool(peer, w)

            def peer_step(pool=pool, case=case) -> None:
                for loc in case.locs:
                    pool.set_kv_buffer(0, loc, case.k, case.v, case.scale, case.scale)

            ts = [time_graph(peer_step, case.writes, 100) for _ in range(CAPTURES)]
            out[peer] = {"us": round(statistics.median(t.median_us for t in ts), 3),
                         "iqr": round(statistics.median(t.spread_us for t in ts), 3),
                         "captures": [round(t.median_us, 3) for t in ts]}
            del pool
        except Exception as exc:  # noqa: BLE001  a peer that fails must not lose the run
            out[peer] = {"error": str(exc).splitlines()[0][:160]}
    return {"peers": out}


def tune(results: list[dict]) -> None:
    import torch

    from kvprof.bench.run import BenchCase, BenchPoint
    from kvprof.bench.timing import copy_rate_gbs, time_graph
    from kvprof.core.bench_result import BenchTarget
    from kvprof.kvcache.writers.triton_fused import TritonConfig, TritonFusedWriter, pick_config

    device = torch.device("cuda")
    rate = copy_rate_gbs(device)
    log(f"copy rate {rate:.0f} GB/s")
    for heads, dim in SHAPES:
        for cache, inp in DTYPES:
            for tokens in TOKENS:
                point = BenchPoint(heads, dim, cache, inp, tokens)
                case = BenchCase(point, device, 256 << 20, seed=tokens)
                target = BenchTarget().us(point.bytes_moved(), rate)
                row_bytes = 2 * heads * dim * 2
                current = pick_config(row_bytes, tokens, fp8=cache.startswith("fp8"))
                cands = [TritonConfig(*c) for c in candidates(heads * dim, tokens, cache.startswith("fp8"))]
                if current not in cands:
                    cands.append(current)
                rec = {"shape": point.shape, "dtype": point.dtype_label, "tokens": tokens, "writes": case.writes,
                       "target_us": round(target, 3),
                       "table": [current.block_t, current.num_warps, current.split] + (["stream"] if current.stream
                                                                                       else []),
                       "candidates": []}
                for cfg in cands:
                    label = [cfg.block_t, cfg.num_warps, cfg.split] + (["stream"] if cfg.stream else [])
                    w = TritonFusedWriter(config=cfg)
                    try:
                        bad = case.check(w)
                        if bad:
                            rec["candidates"].append({"config": label, "error": bad})
                            continue
                        pool = case.pool("triton_fused", w)

                        def step(pool=pool, case=case) -> None:
                            for loc in case.locs:
                                pool.set_kv_buffer(0, loc, case.k, case.v, case.scale, case.scale)

                        ts = [time_graph(step, case.writes, 100) for _ in range(CAPTURES)]
                        med = statistics.median(t.median_us for t in ts)
                        rec["candidates"].append({"config": label, "us": round(med, 3),
                                                  "iqr": round(statistics.median(t.spread_us for t in ts), 3),
                                                  "captures": [round(t.median_us, 3) for t in ts]})
                        del pool
                    except Exception as exc:  # noqa: BLE001  one bad candidate must not lose the run
                        rec["candidates"].append({"config": label, "error": str(exc).splitlines()[0][:160]})
                rec.update(time_peers(case, device) if PEERS else {})
                timed = [c for c in rec["candidates"] if "us" in c]
                if timed:
                    best = min(timed, key=lambda c: c["us"])
                    rec["best"] = best
                    rec["meets"] = best["us"] <= target
                cells = "  ".join(f"{'/'.join(map(str, c['config']))}={c.get('us', 'ERR')}" for c in rec["candidates"])
                peers = "  ".join(f"{n}={p.get('us', 'ERR')}" for n, p in rec.get("peers", {}).items())
                log(f"{point.shape:>6} {point.dtype_label:>15} {tokens:>6} target {target:6.2f} {peers} "
                    f"best {'/'.join(map(str, rec.get('best', {}).get('config', [])))} {rec.get('best', {}).get('us')}"
                    f"{'' if rec.get('meets') else '  MISS'} | {cells}")
                results.append(rec)
                del case
                torch.cuda.empty_cache()


def host_times(calls: int = 200, repeats: int = 15) -> dict[str, float]:
    """Host µs per call at 1x128, 1 token: the loop of calls before the sync, median.
    Each layer of the eager path is timed on its own (Python call, pybind call without a
    launch, the op with and without PDL, writer, pool), first with the process free to move
    between cores, then pinned to one core: the bench's eager host numbers move by several
    µs between points, and this says whether the host or the code moves."""
    import torch

    from kvprof.kvcache.dtypes import store_dtype_for
    from kvprof.kvcache.pool import KVPool
    from kvprof.kvcache.writers import create_writer, cuda_fused as cfm

    def noop(*args: object) -> None:
        return None

    out: dict[str, float] = {}
    fns: dict[str, object] = {}
    for label, cache, inp, scale in (("bf16", torch.bfloat16, torch.bfloat16, None),
                                     ("fp8<-bf16", torch.float8_e4m3fn, torch.bfloat16, 0.5)):
        k_buf = torch.zeros(4096, 1, 128, dtype=store_dtype_for(cache), device="cuda")
        v_buf = torch.zeros_like(k_buf)
        loc = torch.tensor([7], device="cuda")
        k = torch.randn(1, 1, 128, device="cuda").to(inp)
        v = torch.randn(1, 1, 128, device="cuda").to(inp)
        for name in ("index_put", "triton_fused", "cuda_fused", "store_kv_fused"):
            try:
                w = create_writer(name)
            except Exception:  # noqa: BLE001  (a variant this checkout does not have)
                continue
            pool = KVPool(4095, 1, cache, 1, 128, 1, "cuda", writer=w, check_slots=False)
            fns[f"{label} {name} writer"] = (lambda w=w, k_buf=k_buf, v_buf=v_buf, loc=loc, k=k, v=v, cache=cache,
                                             scale=scale: w.write_unchecked(k_buf, v_buf, loc, k, v, cache, scale,
                                                                            scale))
            fns[f"{label} {name} pool"] = (lambda pool=pool, loc=loc, k=k, v=v, scale=scale:
                                           pool.set_kv_buffer(0, loc, k, v, scale, scale))
        ext, err = cfm.load_extension()  # the compiled op (built on first use)
        if ext is None:
            raise SystemExit(f"tune_fused.py: error: cuda_fused op unavailable: {err}")
        op = ext.store_kv
        flags = cfm.KINDS[cache] | (24 if cache != inp else 0) | 1 << 6
        args = (k_buf, v_buf, loc, k, v, 2.0, 2.0)
        # built once: slicing inside the timed call would time two torch ops too (the first
        # tuning run of lab/results/tune-fp8-2026-12-02.txt did, and read 8.5 µs for this line)
        empty = (args[0], args[1], loc[:0], k[:0], v[:0], 2.0, 2.0)
        fns[f"{label} python call, 8 args (no-op)"] = lambda args=args, flags=flags: noop(*args, flags)
        fns[f"{label} cuda op, 0 tokens (pybind + args, no launch)"] = (
            lambda empty=empty, flags=flags: op(*empty, flags))
        fns[f"{label} cuda op, launch with PDL"] = lambda args=args, flags=flags: op(*args, flags | 1 << 7)
        fns[f"{label} cuda op, launch without PDL"] = lambda args=args, flags=flags: op(*args, flags)
    fns["pybind call, no args (e4m3_saturates)"] = ext.e4m3_saturates
    fns["torch.cuda.is_current_stream_capturing()"] = torch.cuda.is_current_stream_capturing
    empty = torch.empty(0, device="cuda")
    fns["torch empty_like (floor: one torch op)"] = lambda: torch.empty_like(empty)

    def measure(fn) -> float:
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter_ns() - t0) / 1e3 / calls)
            torch.cuda.synchronize()
        return round(statistics.median(samples), 2)

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    for affinity in ("free", "pinned"):
        if affinity == "pinned":
            if not cpus:
                break
            os.sched_setaffinity(0, {cpus[len(cpus) // 2]})
        for name, fn in fns.items():
            out[f"{affinity} {name}"] = measure(fn)
            log(f"host {affinity:>6} {name:<52} {out[f'{affinity} {name}']:7.2f} us/call")
    if cpus:
        os.sched_setaffinity(0, set(cpus))
    return out


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        print("tune_fused.py needs a CUDA GPU")
        raise SystemExit(1)
    out = Path(os.environ.get("OUT", "/tmp/kvprof-gpu"))
    out.mkdir(parents=True, exist_ok=True)
    host = host_times() if "host" in PARTS else {}
    results: list[dict] = []
    if "tune" in PARTS:
        precompile()
    try:
        if "tune" in PARTS:
            tune(results)
    finally:
        atomic_write_text(out / "tune.json", json.dumps({"host_us": host, "points": results,
                                                         "elapsed_s": round(time.perf_counter() - T0, 1)}, indent=1))
        log(f"wrote {out / 'tune.json'}")


if __name__ == "__main__":
    main()
