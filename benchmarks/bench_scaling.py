"""Time vs input size for the surfaces a hostile input can grow: analyze's matching of the SGLang
plugin's graph records to an engine's replays, the sidecar reader, kernel-name matching, and the
Perfetto export's lanes and file. Each row doubles the input; "per unit" should stay flat (linear)
or fall, never grow with the size (the growth column is the per-unit time over the first row's).

    python benchmarks/bench_scaling.py [--quick] [--out benchmarks/results/scaling-DATE.txt]

CPU only, single process; each size timed ``--repeats`` times (best kept). The graph-matching rows
time ``kvprof.trace.load.load`` of a folder holding one synthetic engine trace
(``kvprof.trace.synthetic.build_engine``) and its sidecar: reading, attribution and the matching.
"""

from __future__ import annotations

import argparse
import gc
import io
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvprof.core.sidecar import (  # noqa: E402
    SIDECAR_SCHEMA,
    CapturedGraph,
    GraphWrite,
    Sidecar,
    SidecarPool,
    decode_sidecar,
    encode_sidecar,
    kernel_matches,
)
from kvprof.trace.synthetic import EngineReplaySpec, build_engine, dumps  # noqa: E402

LAYERS = 20


def _engine_folder(d: Path, graphs: int, replays: int, ranges: bool, layers: int = LAYERS) -> Path:
    spec = EngineReplaySpec(layers=list(range(layers)), graphs={g: 8 + g % 64 for g in range(graphs)},
                            replays=[i % graphs for i in range(replays)], replay_ranges=ranges)
    doc, _ = build_engine(spec)
    (d / "1796307500-TP-0.trace.json").write_bytes(dumps(doc))
    side = _sidecar(spec)
    (d / "kvprof-sglang.TP-0.pid-1584.json").write_bytes(encode_sidecar(side))
    return d


def _sidecar(spec: EngineReplaySpec) -> Sidecar:
    rec = [CapturedGraph(graph=g, writes=[GraphWrite(layer=layer, variant="sglang_mha", path="sglang:sglang_mha",
                                                     tokens=bs, kernel="store_kvcache_kernel")
                                          for layer in spec.layers]) for g, bs in spec.graphs.items()]
    return Sidecar(schema=SIDECAR_SCHEMA, pid=spec.pid, tp_rank=0,
                   pools=[SidecarPool(cls="MHATokenToKVPool", variant="sglang_mha", native_path="store_cache")],
                   paths={"sglang:sglang_mha": len(spec.layers) * len(spec.replays)}, graphs=rec)


def best_of(fn: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def graph_matching(sizes: list[int], ranges: bool, repeats: int) -> list[tuple[int, float, str]]:
    from kvprof.trace.load import load

    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            d = _engine_folder(Path(tmp), graphs=n, replays=n, ranges=ranges)

            def run(d: Path = d, n: int = n) -> None:
                (t,) = load(d).traces
                assert len(t.writes) == n * LAYERS, (len(t.writes), n * LAYERS)

            rows.append((n, best_of(run, repeats), f"{n} graphs x {LAYERS} writes, {n} replays"))
    return rows


def sidecar_decode(sizes: list[int], repeats: int) -> list[tuple[int, float, str]]:
    rows = []
    for n in sizes:
        spec = EngineReplaySpec(layers=list(range(200)), graphs={g: 8 for g in range(n)}, replays=[0])
        raw = encode_sidecar(_sidecar(spec))
        rows.append((n, best_of(lambda raw=raw: decode_sidecar(raw, "x.json"), repeats),
                     f"{n} graphs x 200 writes, {len(raw) / 2**20:.1f} MiB"))
    return rows


def name_matching(sizes: list[int], repeats: int) -> list[tuple[int, float, str]]:
    recorded = {"store_kvcache_kernel", "_store_kv_kernel", "index_put", "kvprof::store_kv_kernel", "a_" * 500}
    rows = []
    for n in sizes:
        name = ("a_" * (n // 4)) + " " + ("b::" * (n // 6)) + "store_kvcache_kernel"
        rows.append((n, best_of(lambda name=name: kernel_matches(name, recorded), repeats), f"{len(name):,} chars"))
    return rows


def perfetto_lanes(sizes: list[int], repeats: int, gc_off: bool = False) -> list[tuple[int, float, str]]:
    """``gc_off``: the same with Python's cyclic garbage collector paused, which shows how much of any
    growth is the collector walking the lanes' lists (it runs more often the more containers live)."""
    from kvprof.report.perfetto import _Slice, lanes

    rows = []
    for n in sizes:
        slices = [_Slice(i * 10, i * 10 + 10 * n, "k") for i in range(n)]  # every slice overlaps every other

        def run(slices: list[_Slice] = slices, n: int = n) -> None:
            if gc_off:
                gc.disable()
            try:
                assert len(lanes(slices)) == n
            finally:
                gc.enable()

        rows.append((n, best_of(run, repeats), f"{n} kernels overlapping on one stream"))
    return rows


def perfetto_file(sizes: list[int], repeats: int) -> list[tuple[int, float, str]]:
    from kvprof.report.perfetto import PerfettoWriter, _Slice

    rows = []
    for n in sizes:
        slices = [_Slice(i * 10, i * 10 + 35, f"kernel\x00{i % 50}") for i in range(n)]  # 4 lanes deep

        def run(slices: list[_Slice] = slices) -> None:
            w = PerfettoWriter()
            w.slices("GPU 0 stream 7", w.track("trace"), slices, rank=5)
            with tempfile.TemporaryDirectory() as tmp:
                w.write(Path(tmp) / "x.pftrace")

        rows.append((n, best_of(run, repeats), f"{n} kernels, written to a .pftrace"))
    return rows


def table(title: str, unit: str, rows: list[tuple[int, float, str]]) -> str:
    out = io.StringIO()
    out.write(f"\n{title}\n")
    out.write(f"{'size':>10} {'seconds':>9} {'per ' + unit:>14} {'growth':>7}  input\n")
    base = rows[0][1] / rows[0][0]
    for n, s, what in rows:
        per = s / n
        out.write(f"{n:>10,} {s:>9.3f} {per * 1e6:>11.2f} µs {per / base:>7.2f}  {what}\n")
    return out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the two smallest sizes of each row (a smoke run)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="also write the tables here")
    args = ap.parse_args()
    cut = 2 if args.quick else None

    def sizes(*s: int) -> list[int]:
        return list(s[:cut])

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    parts = [f"kvprof scaling benchmark: {platform.machine()}, {os.cpu_count()} CPUs (load average {load:.1f} at "
             f"the start), Python {platform.python_version()}, best of {args.repeats}\n"]
    for title, unit, rows in [
        ("analyze: graph records x replays, no kvprof.graph_replay ranges (every replay matched by its kernels)",
         "replay", lambda: graph_matching(sizes(100, 200, 400, 800), False, args.repeats)),
        ("analyze: graph records x replays, each replay in its kvprof.graph_replay range",
         "replay", lambda: graph_matching(sizes(250, 500, 1000, 2000), True, args.repeats)),
        ("sidecar reader (decode and validate)", "graph", lambda: sidecar_decode(sizes(100, 200, 400, 800),
                                                                                  args.repeats)),
        ("kernel-name matching (kvprof.core.sidecar.kernel_matches)", "char",
         lambda: name_matching(sizes(250_000, 500_000, 1_000_000, 2_000_000), args.repeats)),
        ("Perfetto export: lanes of overlapping kernels", "kernel",
         lambda: perfetto_lanes(sizes(15_000, 30_000, 60_000, 120_000), args.repeats)),
        ("Perfetto export: the same lanes, Python's garbage collector paused", "kernel",
         lambda: perfetto_lanes(sizes(15_000, 30_000, 60_000, 120_000), args.repeats, gc_off=True)),
        ("Perfetto export: slices written to a file", "kernel",
         lambda: perfetto_file(sizes(25_000, 50_000, 100_000, 200_000), args.repeats)),
    ]:
        text = table(title, unit, rows())  # type: ignore[operator]
        print(text, end="", flush=True)
        parts.append(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
