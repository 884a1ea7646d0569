#!/usr/bin/env python3
"""What a write itself adds to a decoder-layer step, apart from its neighbours' run-to-run variation;
and, with an fp8 cache, what kvprof's fused quantising writes save against SGLang's generic write.

    cd <repo> && OUT=/tmp/out python lab/layer_own_time.py [--dtypes bf16,fp8_e4m3] [--variants ...]
        [--sizes 1,10,64] [--rotations 3] [--steps 60] [--replays 5] [--budget-s 300]

Why it exists: ``capture --context layer`` reports what a write adds as the layer step with the
write minus the same step without it (CUDA events, no profiler). At batch 1 the fused write read
2.5 µs per layer on an H200, and a split-K GEMM of the MLP ran longer in the captures of some
variants than of others: that difference counted as the write's. Here, for each cache dtype,
the same variants run in several orders (rotated: each variant at a different place in each),
one process, one decoder context (Llama-3.1-70B TP8's per-rank layer, SGLang's Triton decode
attention where SGLang imports, as the capture builds it). For each variant and batch:

- the layer step with and without the write, CUDA-graph replays, interleaved in rounds of 10,
  as capture's reference pass times them (no profiler): ``added`` = the difference per layer;
- both graphs replayed again under torch.profiler, each GPU kernel tied to
  its replay by the graph launch's correlation id;
- ``kvprof.analysis.layer_own``: the write's kernels, the other kernels' change beside it
  (per-kernel medians over replays), the gaps, and ``own`` = added - the neighbours' change;
  the graphs without a write, which run the same code for every variant, capture by capture:
  how far the neighbours move between captures; with ``sglang_set_kv_buffer`` in bf16 and
  fp8: each fused writer's saving against it with an fp8 cache, against what its conversion
  launches cost (its added time fp8 minus bf16).

``floor_empty_pdl`` (a variant of this script only) launches one empty Triton kernel with PDL
where the write would be and writes nothing: its own time is the floor under any one-launch
write in this layer, and each write's own time is also shown above it.

Writes ``$OUT/layer-own-time.json`` after each capture (a timeout keeps what ran) and prints
the tables. ``--budget-s``: no capture starts after that many seconds.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402  (after the path insert)
import torch  # noqa: E402

from kvprof.analysis.layer_own import (  # noqa: E402
    KERNEL_COLUMNS,
    WITH,
    WITHOUT,
    generic_savings,
    own_times,
    runs_spread,
    summarize,
)
from kvprof.core.atomic import atomic_write_text  # noqa: E402

GENERIC = "sglang_set_kv_buffer"
FLOOR = "floor_empty_pdl"  # lab only: an empty kernel launched with PDL in the write's place
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
ROUND = 10


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--model", default="llama-3.1-70b")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--dtypes", default="bf16,fp8_e4m3", help="cache dtypes (fp8 caches get bf16 rows)")
    ap.add_argument("--variants", default=f"triton_fused,store_kv_fused,{GENERIC},{FLOOR}",
                    help=f"writers ({FLOOR}: an empty kernel node launched with PDL where the write would be, "
                         "writing nothing: the floor under any one-launch write in this layer)")
    ap.add_argument("--sizes", default="1,10,64", help="decode batch sizes")
    ap.add_argument("--rotations", type=int, default=3, help="captures per dtype, the order rotated by one each")
    ap.add_argument("--steps", type=int, default=60, help="timed steps per mode (CUDA events)")
    ap.add_argument("--replays", type=int, default=5, help="profiled replays per mode")
    ap.add_argument("--context-len", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=None, help="layers per step (default: the model's, on CUDA)")
    ap.add_argument("--generic", default=GENERIC, help="the conversion-then-store write the fp8 savings are against")
    ap.add_argument("--scale", type=float, default=0.5, help="k_scale and v_scale for an fp8 cache")
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--report", metavar="JSON", help="print the tables of a saved layer-own-time.json, run nothing")
    return ap.parse_args()


def gpu_rows(trace: Path) -> list[dict[str, Any]]:
    """The trace's GPU activities of graph replays: name, start, duration, replay index (the
    rank of its cudaGraphLaunch's correlation id); where no graph launch is recorded, every
    GPU activity with replay -1."""
    with gzip.open(trace, "rb") if trace.suffix == ".gz" else open(trace, "rb") as f:
        events = json.load(f).get("traceEvents", [])
    launches = sorted((e for e in events if e.get("name") == "cudaGraphLaunch" and e.get("ph") == "X"),
                      key=lambda e: e["ts"])
    replay_of = {e.get("args", {}).get("correlation"): i for i, e in enumerate(launches)}
    rows = [{"name": e["name"], "start_ns": float(e["ts"]) * 1e3, "dur_ns": float(e["dur"]) * 1e3,
             "replay": replay_of.get(e.get("args", {}).get("correlation"), -1)}
            for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]
    if any(r["replay"] >= 0 for r in rows):
        return [r for r in rows if r["replay"] >= 0]  # the step's slot copy, outside the graph, left out
    return rows  # nothing tied to a graph launch: every activity, replay -1


def profile_replays(session: Any, prepared: Any, mode: str, replays: int, folder: Path) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    session.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(replays):
            session.run_step(prepared, i, mode)
            session.synchronize()
    path = folder / f"{mode}.json"
    prof.export_chrome_trace(str(path))
    rows = gpu_rows(path)
    path.unlink()
    if rows and all(r["replay"] < 0 for r in rows):  # no graph launch recorded: replays by count
        if len(rows) % replays:
            print(f"  {mode}: {len(rows)} GPU activities in {replays} replays and no graph launch to tie them "
                  "to: left out", flush=True)
            return []
        rows.sort(key=lambda r: r["start_ns"])
        per = len(rows) // replays
        for i, r in enumerate(rows):
            r["replay"] = i // per
    return rows


def time_modes(session: Any, prepared: Any, device: torch.device, steps: int) -> dict[str, list[float]]:
    """The two modes' steps interleaved in rounds, as capture's reference pass times them."""
    from kvprof.capture.reference import HEAD_START_CYCLES
    from kvprof.capture.session import StepTimer

    timers = {m: StepTimer(device, steps) for m in (WITH, WITHOUT)}
    done = 0
    while done < steps:
        count = min(ROUND, steps - done)
        for mode, timer in timers.items():
            if device.type == "cuda" and prepared.spec.graph:
                torch.cuda._sleep(HEAD_START_CYCLES)
            for i in range(done, done + count):
                timer.start()
                session.run_step(prepared, i, mode)
                timer.stop()
        done += count
    session.synchronize()
    return {m: t.samples_ns() for m, t in timers.items()}


def _stats(xs: list[float]) -> tuple[float, float]:
    s = pd.Series(xs, dtype=float)
    return float(s.median()), float(s.quantile(0.75) - s.quantile(0.25)) if len(s) >= 4 else math.nan


def one_capture(plan: Any, dtype: str, variant: str, rotation: int, device: torch.device, context: Any,
                args: argparse.Namespace,
                folder: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    from kvprof.capture.layout_session import session_for
    from kvprof.kvcache.layouts.registry import create_writer

    writer = create_writer(plan.layout, variant)
    reason = writer.unsupported_reason(device, plan.cache_dtype, plan.input_dtype)
    if reason:
        return [], [], {"skipped": reason}
    kernels: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    info: dict[str, Any] = {"pdl": writer.launches_pdl(device)}
    with session_for(plan, writer, device, instrument=False, context=context) as session:
        layers = len(session.layers)
        for index, spec in enumerate(session.phases):
            prepared = session.prepare(spec, index)
            for mode in (WITH, WITHOUT):
                session.warm_up(prepared, mode)
                if spec.graph:
                    session.capture_graph(prepared, mode)
                for i in range(3):
                    session.run_step(prepared, i, mode)
            session.synchronize()
            key = {"dtype": dtype, "variant": variant, "rotation": rotation, "size": spec.size}
            for mode, samples in time_modes(session, prepared, device, args.steps).items():
                med, iqr = _stats(samples)
                steps.append({**key, "mode": mode, "median_ns": med, "iqr_ns": iqr, "layers": layers})
            if device.type == "cuda":
                for mode in (WITH, WITHOUT):
                    kernels += [{**key, "mode": mode, **r}
                                for r in profile_replays(session, prepared, mode, args.replays, folder)]
            info[f"paths_{spec.size}"] = dict(session.pool.path_counts)
            del prepared
    return kernels, steps, info


def us(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x / 1e3:.2f}"


def report(doc: dict[str, Any]) -> None:
    print("\nwhat one write adds per layer, µs: added (CUDA events, median over captures [min-max]); the traces' "
          "split: the write's kernels, its neighbours' change (kernels both graphs launch equally often) [min-max], "
          "gaps; own = added - neighbours [min-max]")
    print(f"{'dtype':9} {'variant':22} {'size':>4} {'n':>2} {'added':>6} {'[range]':>13} {'±':>5} "
          f"{'kernels':>7} {'neighb.':>7} {'[range]':>13} {'gaps':>6} {'own':>6} {'[range]':>13}")
    for s in doc["summary"]:
        rng = s["own_range_ns"]
        nr = s["neighbours_range_ns"]
        print(f"{s['dtype']:9} {s['variant']:22} {s['size']:>4} {s['captures']:>2} {us(s['added_ns']):>6} "
              f"{us(s['added_range_ns'][0]) + '-' + us(s['added_range_ns'][1]):>13} {us(s['added_spread_ns']):>5} "
              f"{us(s['write_kernels_ns']):>7} {us(s['neighbours_ns']):>7} "
              f"{(us(nr[0]) + '-' + us(nr[1])) if nr else 'n/a':>13} {us(s['gaps_ns']):>6} {us(s['own_ns']):>6} "
              f"{(us(rng[0]) + '-' + us(rng[1])) if rng else 'n/a':>13}")
    floor = {(s["dtype"], s["size"]): s for s in doc["summary"] if s["variant"] == FLOOR}
    if floor:
        print(f"\nabove the floor ({FLOOR}: an empty PDL kernel node where the write would be, in the same layer): "
              "each write's own time minus the floor's, µs per layer")
        for s in doc["summary"]:
            f = floor.get((s["dtype"], s["size"]))
            if f is None or s["variant"] == FLOOR or s["own_ns"] is None or f["own_ns"] is None:
                continue
            print(f"  {s['dtype']:9} {s['variant']:22} size {s['size']:>3}: own {us(s['own_ns'])}, floor "
                  f"{us(f['own_ns'])} (added {us(f['added_ns'])}), above it {us(s['own_ns'] - f['own_ns'])}")
    print("\nper capture (position: where the variant ran in that capture's order): added, own, the neighbour "
          "that moved most")
    for r in doc["rows"]:
        print(f"  {r['dtype']:9} {r['variant']:22} rot {r['rotation']} pos {r['position']} size {r['size']:>3}: "
              f"added {us(r['added_ns'])} own {us(r['own_ns'])} kernels {us(r['write_kernels_ns'])} "
              f"neighbours {us(r['neighbours_ns'])} ({r['top_neighbour'][:70]} {us(r['top_neighbour_ns'])})")
    print("\nthe graphs without a write (the same code for every variant), per-layer GPU time of all kernels, "
          "capture by capture: spread (max - min) and the kernel that moved most")
    for s in doc["runs_spread"]:
        print(f"  {s['dtype']:9} size {s['size']:>3}: {s['captures']} captures, spread {us(s['spread_ns'])} µs; "
              f"most: {s['top_kernel'][:80]} {us(s['top_kernel_spread_ns'])} µs")
    if doc["generic_savings"]:
        print(f"\nfp8 cache: each fused writer's saving per layer against {doc['args']['generic']} (medians over "
              "captures, ± the IQRs in quadrature), against what its conversion costs (its added time fp8 minus bf16); "
              "target share >= 0.80")
        for g in doc["generic_savings"]:
            share = "n/a" if g["share"] is None else f"{g['share']:.2f}"
            print(f"  {g['variant']:16} size {g['size']:>3}: saving {us(g['saving_ns'])} ± {us(g['saving_spread_ns'])} "
                  f"[{us(g['saving_range_ns'][0])}-{us(g['saving_range_ns'][1])}] µs/layer "
                  f"({g['saving_ns'] * doc['layers'] / 1e6:.3f} ms/step), conversion {us(g['extra_ns'])} ± "
                  f"{us(g['extra_spread_ns'])} µs/layer, share {share}")


def register_floor() -> None:
    """The floor as a variant of this script (not of kvprof: it writes nothing, so no check of
    kvprof's would pass it): one empty Triton kernel launched with PDL in the write's place."""
    import torch as _torch

    from kvprof.kvcache.writers import KVWriter, register, writer_names

    if FLOOR in writer_names():
        return

    class EmptyNode(KVWriter):
        name = FLOOR
        description = "an empty kernel launched with PDL where the write would be; writes nothing"
        fused = True
        devices = ("cuda",)

        def launches_pdl(self, device: _torch.device) -> bool:
            return True

        def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):  # type: ignore[override]  # noqa: ANN001
            from kvprof.bench.empty_kernel import launch_empty_pdl

            launch_empty_pdl()
            return "empty node"

    register(FLOOR, EmptyNode)


def check(args: argparse.Namespace) -> None:
    """Bad settings as one line, before a GPU or a model is touched (UsageError)."""
    from kvprof.core.errors import UsageError
    from kvprof.kvcache.dtypes import parse_dtype
    from kvprof.kvcache.writers import writer_names

    unknown = [v for v in args.variants.split(",") if v and v not in writer_names()]
    if unknown or not args.variants.strip(","):
        raise UsageError(f"unknown --variants {','.join(unknown) or '(none)'}; known: {', '.join(writer_names())}")
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not 1 <= len(dtypes) <= 2:
        raise UsageError(f"--dtypes takes one or two cache dtypes (plain, then quantised), got {args.dtypes!r}")
    for d in dtypes:
        try:
            parse_dtype(d)
        except UsageError as exc:
            raise UsageError(f"--dtypes: cannot read {d!r} ({exc})") from None
    if args.rotations < 1 or args.steps < 4 or args.replays < 1:
        raise UsageError("--rotations >= 1, --steps >= 4 (an IQR needs four), --replays >= 1")


def main() -> int:
    args = parse()
    os.environ.setdefault("TRITON_INTERPRET", "0")
    from kvprof.core.errors import KvprofError, UsageError

    try:
        register_floor()
        if args.report:
            try:
                from kvprof.core.files import gunzipped

                report(json.loads(gunzipped(Path(args.report).read_bytes())))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise UsageError(f"--report {args.report}: cannot read it ({type(exc).__name__}: {exc})") from None
            return 0
        check(args)
        return run(args)
    except KvprofError as exc:
        print(f"layer_own_time: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    from kvprof.capture.config import CaptureConfig
    from kvprof.capture.plan import make_context, resolve
    from kvprof.capture.runtime import prepare

    out = Path(os.environ.get("OUT", "/tmp/kvprof-layer-own"))
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    variants = [v for v in args.variants.split(",") if v]
    sizes = [int(x) for x in args.sizes.split(",")]
    kernels: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    orders: dict[tuple[str, int], list[str]] = {}
    doc: dict[str, Any] = {"args": vars(args), "captures": [], "layers": None}

    def save() -> None:
        k = pd.DataFrame(kernels, columns=list(KERNEL_COLUMNS))
        s = pd.DataFrame(steps)
        rows = own_times(k, s, orders) if len(s) else []
        doc["rows"] = [r.to_json() for r in rows]
        doc["summary"] = [x.to_json() for x in summarize(rows)]
        doc["runs_spread"] = [x.to_json() for x in runs_spread(k, doc["layers"] or 1)] if len(k) else []
        dts = args.dtypes.split(",")
        doc["generic_savings"] = ([x.to_json() for x in generic_savings(rows, args.generic, dts[1], dts[0])]
                                  if len(dts) == 2 else [])
        doc["elapsed_s"] = round(time.monotonic() - start, 1)
        atomic_write_text(out / "layer-own-time.json", json.dumps(doc, indent=1, default=str))

    # one decoder context per cache dtype, both built first (the weights of the layers a step runs,
    # twice): each rotation then runs every dtype, so a budget cut leaves both dtypes alike
    setups = []
    for dtype in args.dtypes.split(","):
        fp8 = dtype.startswith("fp8")
        config = CaptureConfig(
            model=args.model, tp=args.tp, variants=variants, phases=["decode"], decode_sizes=sizes, steps=3,
            warmup=2, device=args.device, cache_dtype=dtype, input_dtype="bf16" if fp8 else None,
            k_scale=args.scale if fp8 else None, v_scale=args.scale if fp8 else None, context="layer",
            context_len=args.context_len, reference_steps=args.steps, layers=args.layers, profiler="torch")
        config, runtime = prepare(config)
        plan = resolve(config, runtime.device)
        context = make_context(plan, runtime.device)
        if context is not None and doc.get("kernels_desc") is None:
            doc["kernels_desc"] = context.kernels.describe()
            print(f"--context layer: {doc['kernels_desc']}", flush=True)
        setups.append((dtype, plan, runtime.device, context))
    print(f"contexts built: {time.monotonic() - start:.1f} s", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for rotation in range(args.rotations):
            order = variants[rotation % len(variants):] + variants[: rotation % len(variants)]
            for dtype, plan, device, context in setups:
                orders[(dtype, rotation)] = order
                for variant in order:
                    if time.monotonic() - start > args.budget_s:
                        print(f"budget of {args.budget_s:.0f} s spent: no more captures", flush=True)
                        save()
                        report(json.loads((out / "layer-own-time.json").read_text()))
                        return 0
                    t0 = time.monotonic()
                    try:
                        k, s, info = one_capture(plan, dtype, variant, rotation, device, context, args, Path(tmp))
                    except Exception as exc:  # noqa: BLE001 - one capture failing leaves the others
                        k, s, info = [], [], {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
                    kernels += k
                    steps += s
                    if s:
                        doc["layers"] = s[0]["layers"]
                    doc["captures"].append({"dtype": dtype, "rotation": rotation, "variant": variant,
                                            "seconds": round(time.monotonic() - t0, 1), **info})
                    print(f"{dtype} rotation {rotation} {variant}: {time.monotonic() - t0:.1f} s "
                          f"{info}", flush=True)
                    save()
    save()
    report(json.loads((out / "layer-own-time.json").read_text()))
    print(f"\nwrote {out / 'layer-own-time.json'} ({time.monotonic() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
