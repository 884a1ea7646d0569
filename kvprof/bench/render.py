"""Bench results as a console table and as CSV; rendering only, no measurement."""

from __future__ import annotations

import csv
import io
from typing import Any

from rich.console import Console
from rich.table import Table

from kvprof.bench.run import KVPROF_FUSED


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


EXTRA_COLUMNS = ("best kvprof", "GB/s", "% copy", "target", "ok", "floor", "x sgl", "x 2str", "x idx")


def point_rows(result: dict[str, Any], mode: str, no: str = "NO") -> list[list[str]]:
    """One row of cells per (shape, dtype, tokens): each variant's µs, then the best kvprof
    fused variant's bandwidth, target verdict, floor and ratios to the peers."""
    variants = result["settings"]["variants"]
    rows = [r for r in result["records"] if r["mode"] == mode]
    out = []
    for key in sorted({(r["heads"], r["dim"], r["dtype"], r["tokens"]) for r in rows}):
        heads, dim, dtype, tokens = key
        at = {r["variant"]: r for r in rows if (r["heads"], r["dim"], r["dtype"], r["tokens"]) == key}
        cells = [f"{heads}x{dim}", dtype, str(tokens)]
        for v in variants:
            r = at.get(v)
            cells.append(_fmt(r["median_us"]) if r and r.get("status") == "ok" else (r or {}).get("status", "-"))
        ok = [at[v] for v in KVPROF_FUSED if v in at and at[v].get("status") == "ok"]
        if ok:
            best = min(ok, key=lambda r: r["median_us"])
            ratios = best.get("ratio_to", {})
            cells += [best["variant"], _fmt(best.get("gbs"), 0), _fmt(best.get("pct_copy_rate"), 0),
                      _fmt(best.get("target_us")), {True: "yes", False: no, None: "-"}[best.get("meets_target")],
                      _fmt(best.get("floor_us")), _fmt(ratios.get("sgl_kernel")), _fmt(ratios.get("two_stream")),
                      _fmt(ratios.get("index_put"))]
        else:
            cells += ["-"] * len(EXTRA_COLUMNS)
        out.append(cells)
    return out


def render_table(result: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console(width=200)
    limits = result["limits"]
    console.print(
        f"[bold]{result['device'].get('name')}[/]  copy rate {_fmt(limits.get('copy_rate_gbs'), 0)} GB/s (read+write)  "
        f"empty kernel node {_fmt(limits.get('empty_kernel_us'))} µs  fill_ node {_fmt(limits.get('fill_node_us'))} µs  "
        f"target for kvprof's fused writes: {result['settings']['target']}"
    )
    variants = result["settings"]["variants"]
    for mode in ("graph", "eager"):
        rows = [r for r in result["records"] if r["mode"] == mode]
        if not rows:
            continue
        title = "CUDA-graph replay, µs per write (median)" if mode == "graph" else "eager, µs per write (median, wall clock)"
        table = Table(title=title, show_lines=False)
        for col in ("shape", "dtype", "tokens"):
            table.add_column(col)
        for v in variants:
            table.add_column(v, justify="right")
        for col in EXTRA_COLUMNS:
            table.add_column(col, justify="right")
        for cells in point_rows(result, mode):
            table.add_row(*cells)
        console.print(table)
    reasons = {(r["variant"], r.get("reason")) for r in result["records"] if r.get("status") != "ok"}
    for variant, reason in sorted(reasons, key=str):
        console.print(f"  {variant}: {reason}")


CSV_COLUMNS = ("shape", "heads", "dim", "cache_dtype", "input_dtype", "tokens", "variant", "mode", "status",
               "median_us", "iqr_us", "samples", "bytes", "gbs", "pct_copy_rate", "target_us", "meets_target",
               "floor_us", "reason")


def to_csv(result: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    w.writeheader()
    for r in result["records"]:
        w.writerow(r)
    return buf.getvalue()


def to_markdown(result: dict[str, Any], mode: str = "graph") -> str:
    """One Markdown table per bench run (for docs/benchmarks.md): µs per write per variant."""
    variants = result["settings"]["variants"]
    head = ["shape", "dtype", "tokens", *variants, *EXTRA_COLUMNS]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cells) + " |" for cells in point_rows(result, mode, no="**no**")]
    return "\n".join(out) + "\n"
