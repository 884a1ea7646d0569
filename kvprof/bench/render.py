"""Bench results (:class:`~kvprof.core.bench_result.BenchResult`) as a console table and as
CSV; rendering only, no measurement."""

from __future__ import annotations

import csv
import io
from typing import cast

from rich.console import Console
from rich.table import Table

from kvprof.bench.run import KVPROF_FUSED, fused_verdicts
from kvprof.core.bench_result import BenchResult


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


EXTRA_COLUMNS = ("best kvprof", "GB/s", "% copy", "target", "ok", "floor", "x sgl", "x 2str", "x idx")


def point_rows(result: BenchResult, mode: str, no: str = "NO", field: str = "median_us") -> list[list[str]]:
    """One row of cells per (shape, dtype, tokens): each variant's µs (``field``: the median
    per write, or ``host_us``, the eager host time), then the best kvprof fused variant's
    bandwidth, target verdict, floor and ratios to the peers (graph and wall-clock rows)."""
    variants = result.variants
    rows = [r for r in result.records if r.mode == mode]
    out = []
    for key in sorted({(r.heads, r.dim, r.dtype, r.tokens) for r in rows}):
        heads, dim, dtype, tokens = key
        at = {r.variant: r for r in rows if (r.heads, r.dim, r.dtype, r.tokens) == key}
        cells = [f"{heads}x{dim}", dtype, str(tokens)]
        for v in variants:
            r = at.get(v)
            cells.append(_fmt(getattr(r, field)) if r and r.ok else (r.status if r else "-"))
        if field != "median_us":
            out.append(cells)
            continue
        ok = [at[v] for v in KVPROF_FUSED if v in at and at[v].ok and at[v].median_us is not None]
        if ok:
            best = min(ok, key=lambda r: cast(float, r.median_us))  # ok: median_us is not None
            ratios = best.ratio_to or {}
            cells += [best.variant, _fmt(best.gbs, 0), _fmt(best.pct_copy_rate, 0),
                      _fmt(best.target_us), {True: "yes", False: no, None: "-"}[best.meets_target],
                      _fmt(best.floor_us), _fmt(ratios.get("sgl_kernel", ratios.get("sgl_kernel_cubin"))),
                      _fmt(ratios.get("two_stream")),
                      _fmt(ratios.get("index_put"))]
        else:
            cells += ["-"] * len(EXTRA_COLUMNS)
        out.append(cells)
    return out


def render_table(result: BenchResult, console: Console | None = None) -> None:
    console = console or Console(width=200)
    limits = result.limits
    console.print(
        f"[bold]{result.device_name}[/]  copy rate {_fmt(limits.get('copy_rate_gbs'), 0)} GB/s (read+write)  "
        f"empty kernel node {_fmt(limits.get('empty_kernel_us'))} µs  (with PDL {_fmt(limits.get('empty_pdl_kernel_us'))} µs)  "
        f"fill_ node {_fmt(limits.get('fill_node_us'))} µs  "
        f"target for kvprof's fused writes: {result.settings.target.describe()}"
    )
    variants = result.variants
    tables = (("graph", "median_us", "CUDA-graph replay, µs per write (median)"),
              ("eager", "median_us", "eager, µs per write (median, wall clock)"),
              ("eager", "host_us", "eager, host µs per write through the pool (median, launch loop before the sync)"),
              ("eager", "writer_host_us", "eager, host µs per write, writer alone (the op's launch path, no pool checks)"))
    for mode, field, title in tables:
        rows = [r for r in result.records if r.mode == mode and (field == "median_us" or getattr(r, field) is not None)]
        if not rows:
            continue
        table = Table(title=title, show_lines=False)
        for col in ("shape", "dtype", "tokens"):
            table.add_column(col)
        for v in variants:
            table.add_column(v, justify="right")
        if field == "median_us":
            for col in EXTRA_COLUMNS:
                table.add_column(col, justify="right")
        for cells in point_rows(result, mode, field=field):
            table.add_row(*cells)
        console.print(table)
    reasons = {(r.variant, r.reason) for r in result.records if not r.ok}
    for variant, reason in sorted(reasons, key=str):
        console.print(f"  {variant}: {reason}")
    for line in verdict_lines(result):
        console.print(line, markup=False, highlight=False)  # "[reference: ...]" is text, not markup


def verdict_lines(result: BenchResult) -> list[str]:
    """The checks per kvprof fused variant (:func:`kvprof.bench.run.fused_verdicts`), one line
    each, from this run only."""
    lines = []
    for variant in KVPROF_FUSED:
        if variant not in result.variants:
            continue
        v = fused_verdicts(result, variant)
        if not v["graph_points"] and not v["eager_host"]["median_us"]:
            continue
        t, s, e, f = v["target"], v["vs_sgl"], v["eager_host"], v["fp8_vs_bf16"]
        lines.append(f"{variant}: target met at {t['met']}/{t['points']} graph points"
                     + (f" (missed: {'; '.join(t['missed'][:6])})" if t["missed"] else ""))
        if s["compared"]:
            lines.append(f"{variant}: slower than sgl-kernel at {len(s['slower'])}/{s['compared']} points "
                         f"[{s['source']}]" + (f": {'; '.join(s['slower'][:6])}" if s["slower"] else ""))
        if e["compared"]:
            what = "writer alone" if e["basis"] == "writer" else "through the pool"
            extra = (f"; through the pool: median {_fmt(e['pool_median_us'])} µs, above at {e['pool_over']}"
                     if e["basis"] == "writer" else "")
            if e.get("index_put_median_us") is not None:
                extra += f"; two index_put on this host: median {_fmt(e['index_put_median_us'])} µs"
            lines.append(f"{variant}: eager host time ({what}) above sgl-kernel's op at {len(e['over'])}/{e['compared']}"
                         f" points (median {_fmt(e['median_us'])} µs{extra})"
                         + (f": {'; '.join(e['over'][:6])}" if e["over"] else ""))
        if f["compared"]:
            lines.append(f"{variant}: fp8<-bf16 slower than bf16 at {len(f['slower'])}/{f['compared']} points"
                         + (f", {len(f['within_noise'])} of them by less than the replays' spread" if f["slower"] else "")
                         + (f": {'; '.join(f['slower'][:6])}" if f["slower"] else ""))
    return lines


CSV_COLUMNS = ("shape", "heads", "dim", "cache_dtype", "input_dtype", "tokens", "variant", "mode", "status",
               "median_us", "iqr_us", "host_us", "host_iqr_us", "writer_host_us", "writer_host_iqr_us", "samples",
               "bytes", "gbs", "pct_copy_rate", "target_us", "meets_target", "floor_us", "reason")


def to_csv(result: BenchResult) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in result.records:
        w.writerow(r.to_json())
    return buf.getvalue()
