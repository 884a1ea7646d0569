"""Benchmark one layer's write into the MLA and paged layouts: kvprof's fused writers beside
the engine's unfused path and, where installed, the engine's own kernel.

MLA at DeepSeek-V3's shape (512 + 64 latent values, 61 layers, one row per token), written
as SGLang's DeepSeek model writes it: ``set_mla_kv_buffer`` with nope and rope as views of
one ``[tokens, 576]`` tensor. Paged at Llama-3.1-70B's per-rank shape at TP 8 (1 KV head x
128), block size 16, slots from scattered block tables, key and value as views of the
rank's fused QKV output (vLLM's inputs). Every variant is checked bitwise against its
layout's reference before it is timed; timing is the bench's (graph replays and eager).

    python -m kvprof.bench.layouts --layout mla,paged --out DIR   (prints a table; DIR/bench.json, bench.csv)
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import io
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from kvprof.bench.run import writes_per_graph
from kvprof.bench.timing import copy_rate_gbs, time_cold, time_eager, time_graph
from kvprof.core.atomic import atomic_write_bytes
from kvprof.core.bench_result import BenchTarget
from kvprof.core.errors import KvprofError, UsageError
from kvprof.core.rundir import RunDir
from kvprof.kvcache.contracts import RESERVED_SKIP_SLOT, checked_impl
from kvprof.kvcache.devinfo import device_properties, versions
from kvprof.kvcache.dtypes import parse_dtype
from kvprof.kvcache.layouts import registry
from kvprof.kvcache.layouts.layout import get_layout
from kvprof.kvcache.layouts.workload import BlockTables
from kvprof.kvcache.mla_pool import MLAPool
from kvprof.kvcache.paged_pool import PagedPool
from kvprof.kvcache.writers.card_tables import describe as describe_tables, tables_report
from kvprof.kvcache.writers.triton_launch import describe_counts, launch_counts

TARGET = BenchTarget()  # the MHA bench's default target: 1.2 µs + bytes / (0.9 x copy rate)
TOKENS = (1, 8, 64, 512, 4096, 32768)
DTYPES = (("bf16", "bf16"), ("fp8_e4m3", "bf16"))
MLA_SHAPE = (512, 64)  # DeepSeek-V3: kv_lora_rank, qk_rope_head_dim
PAGED_SHAPE = (1, 128, 16, 8)  # Llama-3.1-70B at TP 8: KV heads, head dim, block size; query heads per rank


@dataclass(frozen=True)
class LayoutPoint:
    layout: str
    cache_dtype: str
    input_dtype: str
    tokens: int

    @property
    def shape(self) -> str:
        return "512+64" if self.layout == "mla" else "1x128/b16"

    @property
    def dtype_label(self) -> str:
        return self.cache_dtype if self.cache_dtype == self.input_dtype else f"{self.cache_dtype}<-{self.input_dtype}"

    def bytes_moved(self) -> int:
        """Inputs read once plus rows written once."""
        cache = torch.empty((), dtype=parse_dtype(self.cache_dtype)).element_size()
        inp = torch.empty((), dtype=parse_dtype(self.input_dtype)).element_size()
        elems = sum(MLA_SHAPE) if self.layout == "mla" else 2 * PAGED_SHAPE[0] * PAGED_SHAPE[1]
        return self.tokens * elems * (cache + inp)


class LayoutCase:
    """One point: slots for several writes, inputs, and pools built on demand."""

    def __init__(self, point: LayoutPoint, device: torch.device, pool_bytes: int, seed: int) -> None:
        self.point, self.device = point, device
        self.cache, self.inp = parse_dtype(point.cache_dtype), parse_dtype(point.input_dtype)
        gen = torch.Generator().manual_seed(seed)
        self.writes = writes_per_graph(point.bytes_moved()) if device.type == "cuda" else 2
        t = point.tokens
        if point.layout == "mla":
            row = sum(MLA_SHAPE) * torch.empty((), dtype=self.cache).element_size()
            self.rows = max(pool_bytes // row, 4 * t + 2) if device.type == "cuda" else 4 * t + 2
            self.locs = [(torch.randperm(self.rows - 1, generator=gen)[:t] + 1).to(device) for _ in range(self.writes)]
            latent = torch.randn((t, 1, sum(MLA_SHAPE)), generator=gen).to(self.inp).to(device)
            self.args = (latent[..., : MLA_SHAPE[0]], latent[..., MLA_SHAPE[0]:])  # views, token stride 576
        else:
            heads, dim, block, q_heads = PAGED_SHAPE
            row = 2 * heads * dim * torch.empty((), dtype=self.cache).element_size()
            slots = max(pool_bytes // row, 8 * t + 64) if device.type == "cuda" else 8 * t + 64
            self.blocks = -(-slots // block)
            tables = BlockTables(self.blocks, block, seed)
            self.locs = [torch.from_numpy(tables.prefill(t, chunk=max(16, min(t, 2048)))).to(device)
                         for _ in range(self.writes)]
            qkv = torch.randn((t, (q_heads + 2 * heads) * dim), generator=gen).to(self.inp).to(device)
            q_end = q_heads * dim
            self.args = (qkv[:, q_end:q_end + heads * dim].view(t, heads, dim),
                         qkv[:, q_end + heads * dim:].view(t, heads, dim))
        self.scale = 0.5 if self.cache in (torch.float8_e4m3fn, torch.float8_e5m2) else None

    def pool(self, writer: Any, small: bool = False) -> Any:
        if self.point.layout == "mla":
            rows = 4 * self.point.tokens + 2 if small else self.rows
            return MLAPool(rows - 1, 1, self.cache, *MLA_SHAPE, 1, self.device, writer=writer, check_slots=False)
        heads, dim, block, _ = PAGED_SHAPE
        return PagedPool(self.blocks, block, self.cache, heads, dim, 1, self.device, writer=writer, check_slots=False)

    def write(self, pool: Any, loc: torch.Tensor) -> None:
        if self.point.layout == "mla":
            pool.set_mla_kv_buffer(0, loc, *self.args)
        else:
            pool.reshape_and_cache_flash(0, *self.args, loc, self.scale, self.scale)

    def writer_write(self, pool: Any, writer: Any, loc: torch.Tensor) -> None:
        """The pool's write on the writer's own launch path: the call the pool makes, without
        the pool's checks or the contract's (``write_unchecked``), as the MHA bench's
        "writer alone" times it."""
        write = checked_impl(writer)
        if self.point.layout == "mla":
            write(pool.kv_buffer[0], loc, *self.args, self.cache, RESERVED_SKIP_SLOT)
        else:
            fp8 = self.scale is not None
            ks = pool._scale(self.scale) if fp8 else None
            write(pool.key_cache[0], pool.value_cache[0], loc, *self.args, self.cache, ks, ks)

    def check(self, writer: Any) -> str | None:
        """None when ``writer`` leaves the pool bitwise equal to the layout's reference."""
        reference = get_layout(self.point.layout).reference
        ref, got = (self.pool(w, small=True) for w in (registry.create_writer(self.point.layout, reference), writer))
        loc = self.locs[0] if self.point.layout == "paged" else (
            torch.randperm(4 * self.point.tokens, generator=torch.Generator().manual_seed(1))[: self.point.tokens] + 1
        ).to(self.device)
        for p in (ref, got):
            self.write(p, loc)
        bufs = (lambda p: p.kv_buffer) if self.point.layout == "mla" else (lambda p: p.key_cache + p.value_cache)
        for a, b in zip(bufs(ref), bufs(got)):
            if not torch.equal(a, b):
                return f"differs from {reference} in {int((a != b).flatten(1).any(1).sum())} rows"
        return None


MODES = ("graph", "eager", "cold")  # cold: one write after an L2 flush (kvprof.bench.timing.time_cold)
DEFAULT_MODES = ("graph", "eager")


def bench_point(case: LayoutCase, variant: str, writer: Any, replays: int, eager_repeats: int,
                modes: Sequence[str] = DEFAULT_MODES) -> list[dict[str, Any]]:
    point = case.point
    base = {**asdict(point), "shape": point.shape, "dtype": point.dtype_label, "variant": variant,
            "bytes": point.bytes_moved(), "writes_per_sample": case.writes}
    modes = tuple(modes) if case.device.type == "cuda" else ("eager",)
    if isinstance(writer, KvprofError):
        return [{**base, "mode": m, "status": "unavailable", "reason": str(writer)} for m in modes]
    reason = writer.unsupported_reason(case.device, case.cache, case.inp)
    if reason:
        return [{**base, "mode": m, "status": "unavailable", "reason": reason} for m in modes]
    writer.prepare(case.device)
    try:
        wrong = case.check(writer)
    except Exception as exc:  # noqa: BLE001  a writer that cannot run this point is a result too
        wrong = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if wrong:
        return [{**base, "mode": m, "status": "wrong", "reason": wrong} for m in modes]
    pool = case.pool(writer)

    def step() -> None:
        for loc in case.locs:
            case.write(pool, loc)  # noqa: F821 (freed by `del pool` after its last call)

    def writer_step() -> None:
        for loc in case.locs:
            case.writer_write(pool, writer, loc)  # noqa: F821

    out = []
    for mode in modes:
        pool.path_counts.clear()
        try:
            if mode == "graph":
                t = time_graph(step, case.writes, replays)
            elif mode == "cold":
                first = case.locs[0]
                t = time_cold(lambda: case.write(pool, first), replays, case.device)  # noqa: F821
            else:
                t = time_eager(step, case.writes, eager_repeats, case.device)
        except Exception as exc:  # noqa: BLE001
            out.append({**base, "mode": mode, "status": "failed",
                        "reason": f"{type(exc).__name__}: {exc}".splitlines()[0]})
            continue
        rec = {**base, "mode": mode, "status": "ok", "median_us": t.median_us, "iqr_us": t.spread_us,
               "paths": dict(pool.path_counts)}
        if t.host_us is not None:
            rec["host_us"] = t.host_us
            w = time_eager(writer_step, case.writes, eager_repeats, case.device)
            rec["writer_host_us"], rec["writer_host_iqr_us"] = w.host_us, w.host_spread_us
        out.append(rec)
    del pool
    return out


def derive(records: list[dict[str, Any]], rate: float) -> list[dict[str, Any]]:
    """Target, and each kvprof writer against the unfused path and the peers at its point."""
    by_point: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in records:
        by_point.setdefault((r["layout"], r["dtype"], r["tokens"], r["mode"]), {})[r["variant"]] = r
    for r in records:
        if r.get("status") != "ok":
            continue
        r["gbs"] = r["bytes"] / (r["median_us"] * 1e3)
        r["pct_copy_rate"] = 100.0 * r["gbs"] / rate
        r["target_us"] = TARGET.fixed_us + r["bytes"] / (TARGET.rate_fraction * rate * 1e3)
        r["meets_target"] = r["median_us"] <= r["target_us"]
        peers = by_point[(r["layout"], r["dtype"], r["tokens"], r["mode"])]
        r["ratio_to"] = {n: p["median_us"] / r["median_us"] for n, p in peers.items()
                         if n != r["variant"] and p.get("status") == "ok"}  # > 1: this one is faster
    return records


def run(layouts: Sequence[str], device: torch.device, tokens: Sequence[int] = TOKENS, replays: int = 100,
        eager_repeats: int = 20, pool_bytes: int = 512 << 20, on_record: Any = None,
        modes: Sequence[str] = DEFAULT_MODES, only: Sequence[str] | None = None) -> dict[str, Any]:
    """``modes``: which timings (of :data:`MODES`); ``only``: the variants to run (default: the
    layout's unfused path, peers and kvprof's writers)."""
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise UsageError(f"unknown mode {bad[0] if bad else '(none)'!r}; choose from {', '.join(MODES)}")
    rate = copy_rate_gbs(device)
    records: list[dict[str, Any]] = []
    names: list[str] = []
    for layout in layouts:
        if layout not in ("mla", "paged"):
            raise UsageError(f"the layout bench covers mla and paged, not {layout!r}")
        layout_def = get_layout(layout)
        variants = [layout_def.unfused, *layout_def.peers, *layout_def.fused]
        if only is not None:
            variants = [v for v in variants if v in only]
        names += variants
        writers: dict[str, Any] = {}
        for v in variants:
            try:
                writers[v] = registry.create_writer(layout, v)
            except KvprofError as exc:
                writers[v] = exc
        for i, (cache, inp) in enumerate(DTYPES):
            for t in tokens:
                case = LayoutCase(LayoutPoint(layout, cache, inp, t), device, pool_bytes, seed=i * 1000 + t)
                for v in variants:
                    recs = bench_point(case, v, writers[v], replays, eager_repeats, modes)
                    records += recs
                    if on_record:
                        for r in recs:
                            on_record(r)
                del case
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return {"kind": "kvprof-layout-bench", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": device_properties(device), "versions": versions(), "copy_rate_gbs": rate,
            "limits": {"copy_rate_gbs": rate},  # as the MHA bench's, so the dashboard's Sweeps page reads it
            "launch_tables": tables_report(device), "launches": launch_counts(),
            "target": f"{TARGET.describe()}",
            "settings": {"replays": replays, "eager_repeats": eager_repeats,
                         "pool_bytes": pool_bytes, "variants": names, "modes": list(modes),
                         "mla_shape": MLA_SHAPE, "paged_shape": PAGED_SHAPE},
            "records": derive(records, rate)}


def verdicts(result: dict[str, Any]) -> list[str]:
    """One line per mode, layout, dtype and fused writer: target met, faster than unfused, vs
    peers (with where it is slower than a peer and by how much). Graph and cold modes where
    measured, else eager."""
    lines = []
    present = {x.get("mode") for x in result["records"]}
    timed = [m for m in ("graph", "cold") if m in present] or ["eager"]
    for mode in timed:
        recs = [r for r in result["records"] if r.get("mode") == mode]
        for layout in ("mla", "paged"):
            layout_def = get_layout(layout)
            for fused in layout_def.fused:
                mine = [r for r in recs if r["layout"] == layout and r["variant"] == fused]
                if not mine:
                    continue
                bad = [r for r in mine if r.get("status") != "ok"]
                ok = [r for r in mine if r.get("status") == "ok"]
                miss = [f"{r['dtype']} x{r['tokens']}" for r in ok if not r["meets_target"]]
                slower = [f"{r['dtype']} x{r['tokens']}" for r in ok
                          if r["ratio_to"].get(layout_def.unfused, 2) <= 1]
                line = (f"{mode} {layout} {fused}: target met at {len(ok) - len(miss)}/{len(mine)} points"
                        + (f" (missed: {', '.join(miss)})" if miss else "")
                        + f"; faster than {layout_def.unfused} at {len(ok) - len(slower)}/{len(mine)}"
                        + (f" (not: {', '.join(slower)})" if slower else ""))
                for peer in layout_def.peers:
                    pairs = [(r, r["ratio_to"][peer]) for r in ok if peer in r["ratio_to"]]
                    if pairs:
                        vs = [x for _, x in pairs]
                        line += (f"; vs {peer}: no slower at {sum(x >= 1 for x in vs)}/{len(vs)}"
                                 f" (min ratio {min(vs):.2f})")
                        lost = [f"{r['dtype']} x{r['tokens']} {r['median_us']:.2f} vs "
                                f"{r['median_us'] * x:.2f} us" for r, x in pairs if x < 1]
                        if lost:
                            line += f" (slower: {'; '.join(lost)})"
                if bad:
                    line += f"; {len(bad)} points not ok ({bad[0]['status']}: {bad[0].get('reason', '')})"
                lines.append(line)
    return lines


def table(result: dict[str, Any]) -> str:
    head = (f"{'layout':6} {'dtype':13} {'tokens':>6} {'mode':5} {'variant':15} {'us':>9} {'target':>8} {'GB/s':>7} ok"
            "   host us (pool / writer alone)")
    rows = [head]
    for r in result["records"]:
        if r.get("status") != "ok":
            rows.append(f"{r['layout']:6} {r['dtype']:13} {r['tokens']:>6} {r['mode']:5} {r['variant']:15} "
                        f"{r['status']}: {r.get('reason', '')[:80]}")
            continue
        rows.append(f"{r['layout']:6} {r['dtype']:13} {r['tokens']:>6} {r['mode']:5} {r['variant']:15} "
                    f"{r['median_us']:9.3f} {r['target_us']:8.3f} {r['gbs']:7.0f} "
                    f"{'yes' if r['meets_target'] else 'NO '}"
                    + (f"  {r['host_us']:7.2f} / {r['writer_host_us']:.2f}" if r.get("writer_host_us") is not None
                       else ""))
    return "\n".join(rows)


def write_files(result: dict[str, Any], out: Path) -> None:
    """bench.json and bench.csv into ``out``, each replaced in one step (a reader never sees half of one)."""
    out.mkdir(parents=True, exist_ok=True)
    files = RunDir(out)
    atomic_write_bytes(files.bench, (json.dumps(result, indent=1, default=str) + "\n").encode())
    cols = ["layout", "shape", "dtype", "tokens", "mode", "variant", "status", "median_us", "iqr_us", "host_us",
            "writer_host_us", "target_us", "meets_target", "gbs", "bytes", "reason"]
    table = io.StringIO(newline="")
    w = csv.DictWriter(table, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    w.writerows(result["records"])
    atomic_write_bytes(files.bench_csv, table.getvalue().encode())


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvprof.bench.layouts", description=__doc__.splitlines()[0])
    ap.add_argument("--layout", default="mla,paged", help="mla, paged or both (comma-separated)")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"of {', '.join(MODES)} (comma-separated)")
    ap.add_argument("--variants", default=None, help="only these variants (comma-separated; default: all)")
    ap.add_argument("--out", default=None, help=f"directory for {RunDir.BENCH} and {RunDir.BENCH_CSV}")
    args = ap.parse_args(argv)
    try:
        layouts = [x.strip() for x in args.layout.split(",") if x.strip()]
        tokens = [int(x) for x in args.tokens.split(",")]
        if not tokens or min(tokens) < 1 or args.replays < 1:
            raise UsageError("--tokens and --replays must be positive")
        only = [x.strip() for x in args.variants.split(",") if x.strip()] if args.variants else None
        result = run(layouts, torch.device(args.device), tokens, replays=args.replays,
                     modes=[x.strip() for x in args.modes.split(",") if x.strip()], only=only,
                     on_record=lambda r: print(f"  {r['layout']} {r['dtype']} x{r['tokens']} {r['variant']} "
                                               f"{r['mode']}: {r.get('median_us', r.get('status'))}", flush=True))
    except (KvprofError, ValueError) as exc:
        print(f"kvprof: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    print(table(result))
    print(f"copy rate {result['copy_rate_gbs']:.0f} GB/s; target {result['target']}")
    print(describe_tables(result["launch_tables"]))
    if result["launches"]:
        print(describe_counts(result["launches"]))
    print("\n".join(verdicts(result)))
    if args.out:
        write_files(result, Path(args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
