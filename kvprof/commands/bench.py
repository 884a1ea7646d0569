"""Time one layer's K+V write per variant over row shapes, dtypes and token counts.

On CUDA: graph replays of many writes (median of >= 100 replays after warm-up) into a
pool several times larger than L2 with random slots, and eagerly (host launch path),
beside the device-to-device copy rate and the cost of an empty kernel node. On CPU: a
quick grid by default (--grid quick: one shape, bf16, 1 and 64 tokens; about half a minute
for every default writer, most of it torch.compile's compile and Triton's interpreter),
--grid full for 2 shapes, 2 dtypes and 1/64/512 tokens (minutes); wall clock, one torch
thread. A progress display on stderr (a terminal) names the point and variant running.
Prints a table that fits the terminal (median and interquartile range per cell) and
writes bench.json / bench.csv into --out,
by default a new folder under the per-user cache ($XDG_CACHE_HOME/kvprof/bench/<UTC
time>, ~/.cache/kvprof/bench/... without it; never the current folder), named when done.
--format json prints bench.json's document on stdout, --format csv bench.csv; the table
and the paths go to stderr then.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvprof.bench.grids import (
    CPU_GRID,
    CPU_QUICK_GRID,
    CPU_QUICK_ROPE_GRID,
    CPU_ROPE_GRID,
    CPU_THREADS,
    CUDA_GRID,
    CUDA_QUICK_GRID,
    CUDA_ROPE_GRID,
    FAMILIES,
    GRID_SIZES,
)
from kvprof.commands import add_format_arguments, command_flags
from kvprof.commands.argtypes import (
    fraction,
    memory_gb,
    memory_mb,
    non_negative_float,
    output_folder,
    positive_ints,
    repeat_count,
    seed,
    thread_count,
)
from kvprof.core.bench_result import BenchResult, BenchTarget
from kvprof.core.rundir import RunDir
from kvprof.report.renderers import formats


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _shapes(text: str) -> list[tuple[int, ...]]:
    """HEADSxDIM (the store family) or Q_HEADSxHEADSxDIM (the rope family), comma-separated."""
    try:
        out = [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]
    except ValueError:
        out = []
    if not out or any(len(s) not in (2, 3) or min(s) < 1 for s in out) or len({len(s) for s in out}) > 1:
        raise argparse.ArgumentTypeError(f"expected HEADSxDIM[,HEADSxDIM...] (--family rope: QHEADSxHEADSxDIM), "
                                         f"got {text[:60]!r}")
    return out


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("graph", "eager", "cold")]
    if bad or not modes:
        raise argparse.ArgumentTypeError(f"expected graph, eager and/or cold, comma-separated, got {text[:60]!r}")
    return modes


def _dtypes(text: str) -> list[tuple[str, str]]:
    out = []
    for item in text.split(","):
        cache, _, inp = item.partition("<-")
        out.append((cache, inp or cache))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", choices=FAMILIES, default="store",
                   help="store: one layer's K+V store (default); rope: the rotary embedding of q and k with the "
                        "store, as engines fuse it (rope_* variants; shapes QHEADSxHEADSxDIM, full grid "
                        f"{CUDA_ROPE_GRID.shapes_text()} on CUDA, {CPU_ROPE_GRID.shapes_text()} on CPU; quick "
                        f"{CPU_QUICK_ROPE_GRID.shapes_text()} {CPU_QUICK_ROPE_GRID.dtypes_text()} at "
                        f"{CPU_QUICK_ROPE_GRID.tokens_text()} token)")
    p.add_argument("--grid", choices=GRID_SIZES, default=None,
                   help="the points --shapes, --dtypes and --tokens default to: full (the default on CUDA) or quick "
                        f"(the default on a CPU: {CPU_QUICK_GRID.shapes_text()}, {CPU_QUICK_GRID.dtypes_text()}, "
                        f"{CPU_QUICK_GRID.tokens_text()} tokens; on CUDA {CUDA_QUICK_GRID.tokens_text()} tokens)")
    p.add_argument("--variants", default=None,
                   help="comma-separated (default: the family's built-ins: every store writer, or the rope writers)")
    p.add_argument("--shapes", type=_shapes, default=None,
                   help=f"HEADSxDIM list (default: the grid's; full: {CUDA_GRID.shapes_text()} on CUDA, "
                        f"{CPU_GRID.shapes_text()} on CPU); --family rope: QHEADSxHEADSxDIM")
    p.add_argument("--dtypes", type=_dtypes, default=None,
                   help=f"CACHE[<-INPUT] list (default: the grid's; full: {CUDA_GRID.dtypes_text()} on CUDA, "
                        f"{CPU_GRID.dtypes_text()} on CPU)")
    p.add_argument("--tokens", type=positive_ints, default=None,
                   help=f"token counts (default: the grid's; full: {CUDA_GRID.tokens_text()} on CUDA, "
                        f"{CPU_GRID.tokens_text()} on CPU)")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=thread_count, default=None,
                   help=f"torch intra-op threads while timing (default: {CPU_THREADS} on CPU, so a time is the "
                        "writer's work and not threads contending for cores; torch's own default on CUDA); "
                        f"recorded in {RunDir.BENCH}")
    p.add_argument("--replays", type=repeat_count, default=100, help="graph replays per point (default: %(default)s)")
    p.add_argument("--eager-repeats", type=repeat_count, default=20)
    p.add_argument("--modes", type=_modes, default=None,
                   help="timings to take, comma-separated: graph (CUDA-graph replays), eager (a loop of writes: "
                        "wall and host time), cold (one write after an L2 flush, graph node, --replays samples) "
                        "(default: graph,eager on CUDA, eager on a CPU)")
    p.add_argument("--pool-mb", type=memory_mb, default=256,
                   help="K+V pool size per point on CUDA (default: %(default)s, ~5x an H200's L2)")
    p.add_argument("--max-memory-gb", type=memory_gb, default=None,
                   help="refuse points that would need more (default: 80%% of available host memory, "
                        "90%% of the GPU's free memory)")
    p.add_argument("--out", type=output_folder, default=None,
                   help=f"folder for {RunDir.BENCH} and {RunDir.BENCH_CSV} (default: a new folder under "
                        "~/.cache/kvprof/bench)")
    p.add_argument("--seed", type=seed, default=0,
                   help="random seed of the inputs, 0 .. 2**63-1 (default: %(default)s)")
    p.add_argument("--target-fixed-us", type=non_negative_float, default=BenchTarget.fixed_us,
                   help="the fused writes' target is this many µs + bytes / (fraction x copy rate) "
                        f"(default: %(default)s; recorded in {RunDir.BENCH})")
    p.add_argument("--target-rate-fraction", type=fraction, default=BenchTarget.rate_fraction,
                   help="the fraction of the measured copy rate in that target (default: %(default)s)")
    p.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress display (it shows only when stderr is a terminal)")
    import kvprof.bench.forms  # noqa: F401 - registers the forms of bench's result

    add_format_arguments(p, formats(BenchResult))


def default_out() -> Path:
    """A fresh per-user folder: ``$XDG_CACHE_HOME/kvprof/bench/<UTC time>`` (~/.cache without it)."""
    import time

    from kvprof.core.bench_result import bench_cache_root

    return bench_cache_root() / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def run(args: argparse.Namespace) -> int:
    from kvprof.commands.progress import StepProgress

    # shown before torch loads (seconds on a small machine): what runs, then each point and variant
    bar = StepProgress(None, enabled=None if getattr(args, "progress", True) else False,
                       description="loading torch", width=36)
    try:
        return _run(args, bar)
    finally:
        bar.close()


def _run(args: argparse.Namespace, bar: Any) -> int:
    from pathlib import Path

    from kvprof.kvcache.devinfo import resolve_device, triton_interpreter

    device = resolve_device(args.device)
    # as capture does: on a CPU kvprof's Triton writers run in Triton's interpreter, which
    # Triton fixes when their modules are imported (by kvprof.bench.run, below)
    triton_interpreter(device)

    from kvprof.bench.run import (
        BENCH_VARIANTS,
        ROPE_BENCH_VARIANTS,
        check_bench_memory,
        default_grid,
        grid,
        rope_grid,
    )
    from kvprof.core.errors import UsageError
    from kvprof.kvcache.dtypes import parse_dtype

    family = getattr(args, "family", "store")
    rope = family == "rope"
    points = default_grid(device, family, getattr(args, "grid", None))
    if args.shapes and len(args.shapes[0]) != (3 if rope else 2):
        raise UsageError("--family rope takes --shapes QHEADSxHEADSxDIM (query heads, KV heads, head dim)" if rope
                         else "--shapes takes HEADSxDIM (QHEADSxHEADSxDIM is for --family rope)")
    if args.shapes or args.dtypes or args.tokens:
        shapes = args.shapes or sorted({(p.q_heads, p.heads, p.dim) if rope else (p.heads, p.dim) for p in points})
        dtypes = args.dtypes or sorted({(p.cache_dtype, p.input_dtype) for p in points})
        tokens = args.tokens or sorted({p.tokens for p in points})
        for c, i in dtypes:
            parse_dtype(c), parse_dtype(i)
        if any(t < 1 for t in tokens):
            raise UsageError("--tokens must be positive")
        points = rope_grid(shapes, dtypes, tokens) if rope else grid(shapes, dtypes, tokens)
    defaults = ROPE_BENCH_VARIANTS if rope else BENCH_VARIANTS
    variants = [v for v in (args.variants.split(",") if args.variants else defaults) if v]
    check_bench_memory(points, device, args.pool_mb << 20, getattr(args, "max_memory_gb", None), variants)
    out = Path(args.out) if args.out else default_out()
    made = not out.exists()
    try:  # before any measurement: a bench is too long to lose to an unwritable folder
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        from kvprof.core.errors import OutputError

        raise OutputError(f"cannot create output folder {out}: {exc.strerror or exc}") from None
    bar.set_total(len(points) * len(variants))
    try:
        return _measure(args, points, variants, device, out, bar)
    except BaseException:
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a refused or interrupted bench leaves no empty folder behind
        raise


def _measure(args: argparse.Namespace, points: list[Any], variants: list[str], device: Any, out: Path,
             bar: Any = None) -> int:
    import sys

    from kvprof.bench.render import to_csv
    from kvprof.bench.run import run_bench
    from kvprof.core.atomic import atomic_write_bytes, atomic_write_text
    from kvprof.report.renderers import Output, render
    from kvprof.report.terminal import note, table_console

    files = RunDir(out)
    given = sys.argv[2:] if len(sys.argv) > 1 and sys.argv[1] == "bench" else []
    command = " ".join(["python -m kvprof bench", *given])

    saved: list[BenchResult] = []

    def save(result: BenchResult) -> None:
        """bench.json after every point, marked ``complete: false`` until the last; bench.csv, which
        has no such mark, only for a complete run (an older one is removed at the first point)."""
        result.command = command
        atomic_write_bytes(files.bench, result.dumps())
        if result.complete:
            atomic_write_text(files.bench_csv, to_csv(result))
        elif not saved:
            files.bench_csv.unlink(missing_ok=True)
        saved[:] = [result]

    target = BenchTarget(args.target_fixed_us, args.target_rate_fraction)
    threads = args.threads if args.threads is not None else (None if device.type == "cuda" else CPU_THREADS)
    try:
        result = run_bench(points, variants, device, replays=args.replays, eager_repeats=args.eager_repeats,
                           pool_bytes=args.pool_mb << 20, seed=args.seed, target=target, on_partial=save,
                           threads=threads, modes=getattr(args, "modes", None), progress=bar,
                           names=command_flags(add_arguments))
        if bar is not None:
            bar.close()  # before the table: the bar is transient and would be drawn over it
        save(result)
    except KeyboardInterrupt as exc:
        if saved:
            exc.kept = (f"{files.bench} keeps the {len(saved[0].records)} results measured, "  # type: ignore[attr-defined]
                        f"marked complete: false; {RunDir.BENCH_CSV} is written only for a complete run")
        raise
    if args.format != "table":  # the document on stdout, the table for people on stderr
        render(args.format, result, Output())
    render("table", result, Output(console=table_console(args.format)))
    note(args.format, f"wrote {files.bench} and {files.bench_csv}")
    return 0
