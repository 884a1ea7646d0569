"""The console view of an analysis: one table per source, verdicts, comparison, warnings."""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from rich.console import Console, JustifyMethod
from rich.table import Table

from kvprof.core.summary import Summary, VariantVerdict
from kvprof.report.ranks import render_ranks


def _us(ns: Any, digits: int = 2) -> str:
    try:
        v = float(ns)
    except (TypeError, ValueError):
        return "-"
    return "-" if not math.isfinite(v) else f"{v / 1000:.{digits}f}"


def _num(v: Any, fmt: str = "{:.1f}") -> str:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return "-"
    return "-" if not math.isfinite(f) else fmt.format(f)


def groups_table(rows: list[dict[str, Any]], source: str) -> Table:
    t = Table(title=f"per write, median ({source})", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("variant", "left"), ("phase", "left"), ("size", "right"), ("writes", "right"),
        ("attribution", "left"), ("kern/wr", "right"), ("GPU span µs", "right"),
        ("cost/wr µs", "right"), ("host µs", "right"), ("launch→GPU µs", "right"),
        ("streams", "right"), ("overlap %", "right"), ("GB/s", "right"), ("% peak", "right"),
        ("step µs", "right"), ("step GPU µs", "right"))
    for col, just in columns:
        t.add_column(col, justify=just, no_wrap=True)
    for r in rows:
        t.add_row(
            str(r["variant"]), str(r["phase"]), str(r["size"]), str(r["writes"]), str(r["attribution"]),
            _num(r["kernels_per_write"], "{:g}"), _us(r["gpu_span_ns"]), _us(r["cost_per_write_ns"]),
            _us(r["host_launch_ns"]), _us(r["launch_delay_ns"]), _num(r["streams"], "{:.0f}"),
            _num((r["overlap_frac"] or 0) * 100 if r["overlap_frac"] is not None else None),
            _num(r["bandwidth_gbs"]), _num(r["pct_of_peak"], "{:.2f}"), _us(r["step_ns"], 1),
            _us(r["step_gpu_ns"], 1),
        )
    return t


def reference_table(rows: list[dict[str, Any]]) -> Table:
    """The unprofiled reference pass: the figures a step pays, with their spread."""
    clock = {r.get("attribution") for r in rows}
    how = "CUDA events" if clock == {"cuda_events"} else "wall clock" if clock == {"wall"} else "events / wall clock"
    layer = any(r.get("context") == "layer" for r in rows)
    t = Table(title=f"reference: no profiler, no ranges, each step timed with {how} (median)", title_justify="left")
    cols = ["variant", "phase", "size", "steps", "step µs", "IQR µs", "cost/wr µs"]
    if layer:
        cols += ["write share %", "writes alone µs"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("variant", "phase") else "right", no_wrap=True)
    for r in rows:
        cells = [str(r["variant"]), str(r["phase"]), str(r["size"]), str(r["steps"]), _us(r["step_ns"], 1),
                 _us(r.get("step_iqr_ns"), 1), _us(r["cost_per_write_ns"])]
        if layer:
            share = r.get("write_share")
            cells += [_num(share * 100 if _is_number(share) else None), _us(r.get("writes_only_step_ns"), 1)]
        t.add_row(*cells)
    return t


def observer_table(obs: dict[str, Any]) -> Table:
    """Each profiler's reading over the reference: its observer effect, per point."""
    pct = round(obs.get("threshold", 0.1) * 100)
    t = Table(title=f"observer effect: profiler reading / reference (flag: more than {pct} % off)", title_justify="left")
    for col in ("variant", "source", "phase", "size", "cost/wr µs", "reference µs", "per write", "per step",
                "run slowed", "flag"):
        t.add_column(col, justify="left" if col in ("variant", "source", "phase", "flag") else "right", no_wrap=True)
    for r in obs.get("rows") or []:
        t.add_row(str(r["variant"]), str(r["source"]), str(r["phase"]), str(r["size"]),
                  _us(r.get("cost_per_write_ns")), _us(r.get("reference_cost_per_write_ns")),
                  _num(r.get("ratio_per_write"), "{:.2f}x"), _num(r.get("ratio_per_step"), "{:.2f}x"),
                  _num(r.get("pass_slowdown"), "{:.2f}x"), "[yellow]off[/yellow]" if r.get("flagged") else "ok")
    return t


def verdict_line(name: str, v: VariantVerdict) -> str:
    if not v.available:
        return f"[dim]{name}: not run ({v.reason})[/dim]"
    word = "fused" if v.fused else ("not fused" if v.fused is False else "unknown")
    parts = [f"{name}: {word}"]
    parts.append(f"paths say {'fused' if v.fused_by_paths else 'not fused' if v.fused_by_paths is False else '?'}")
    counts = v.kernel_counts.get("gpu_ops_per_write") or {}
    if counts:
        parts.append("GPU ops/write " + ", ".join(f"{k} x{c}" for k, c in counts.items()))
    if v.fell_back:
        parts.append("[red]fell back[/red]" + (f" ({'; '.join(v.fallback_reasons)})" if v.fallback_reasons else ""))
    if v.agree is False:
        parts.append("[yellow]paths and kernel count disagree[/yellow]")
    return " · ".join(parts)


def comparison_table(cmp: dict[str, Any]) -> Table:
    rows = cmp["rows"]
    layer = any(r.get("measured_saving_per_step_ms") is not None for r in rows)
    title = f"vs baseline {cmp['baseline']} (projection: {cmp['layers']} layers/step"
    title += "; in a decoder layer the saving is measured, step against step)" if layer else ")"
    t = Table(title=title, title_justify="left")
    cols = ["variant", "source", "phase", "size", "cost/write µs", "baseline µs", "ratio", "saving/step ms"]
    if layer:
        cols += ["± ms", "projected ms"]
    cols += ["% of ITL", "predicted ITL ms"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("variant", "source", "phase") else "right", no_wrap=True)
    for r in rows:
        cells = [str(r["variant"]), str(r["source"]), str(r["phase"]), str(r["size"]),
                 _us(r["cost_per_write_ns"]), _us(r["baseline_cost_per_write_ns"]),
                 _num(r["ratio_cost_per_write_ns"], "{:.2f}"), _num(r.get("saving_per_step_ms"), "{:.3f}")]
        if layer:
            cells += [_num(r.get("measured_saving_spread_ms"), "{:.3f}"),
                      _num(r.get("projected_saving_per_step_ms"), "{:.3f}")]
        share = r.get("saving_share_of_itl")
        cells += [_num(share * 100 if share is not None else None, "{:.2f}"), _num(r.get("predicted_itl_ms"), "{:.2f}")]
        t.add_row(*cells)
    return t


def run_comparison_table(doc: dict[str, Any]) -> Table:
    """kvprof.analysis.runs.RunComparison rows: each variant before -> after."""
    t = Table(title=f"run vs run (before -> after; projection: {doc['layers']} layers/step)", title_justify="left")
    cols = ["variant", "source", "phase", "size", "before µs", "after µs", "after/before", "saving/step ms"]
    for col in cols:
        t.add_column(col, justify="left" if col in ("variant", "source", "phase") else "right", no_wrap=True)
    for r in doc["rows"]:
        t.add_row(str(r["variant"]), str(r["source"]), str(r["phase"]), str(r["size"]),
                  _us(r.get("baseline_cost_per_write_ns")), _us(r.get("cost_per_write_ns")),
                  _num(r.get("ratio_cost_per_write_ns"), "{:.2f}"), _num(r.get("saving_per_step_ms"), "{:.3f}"))
    return t


SOURCE_NAMES = {"reference": "the unprofiled reference", "kineto": "torch.profiler", "nsys": "Nsight Systems"}


def headline_line(h: dict[str, Any], b: dict[str, Any]) -> str:
    """The one-line answer, naming the source its figure comes from and how it was got."""
    source = SOURCE_NAMES.get(h["source"], h["source"])
    how = "measured in a decoder layer" if h.get("measured") else "projected as layers x per-write saving"
    extra = ""
    if h.get("measured") and _is_number(h.get("projected_saving_per_step_ms")):
        extra = f"; the writes alone project {h['projected_saving_per_step_ms']:.3f} ms"
    return (f"{h['variant']} vs baseline at decode bs={h['size']} ({source}): saving {h['saving_per_step_ms']:.3f} "
            f"ms/step, {how}{extra}; ITL {b['itl_before_ms']:.2f} → {h['predicted_itl_ms']:.2f} ms predicted, "
            f"{b['itl_before_ms']:.2f} → {b['itl_after_ms']:.2f} ms ({h['measured_saving_ms']:.2f} ms) measured by "
            "the serving benchmark")


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and v == v


def make_console() -> Console:
    """The terminal's width; piped, COLUMNS or kvprof.report.terminal.PIPE_WIDTH (rich assumes 80)."""
    from kvprof.report.terminal import make_console as _make

    return _make()


def render(summary: Summary, console: Console | None = None) -> None:
    con = console or make_console()
    dev = summary.device
    con.print(f"[bold]kvprof analyze[/bold] {summary.input}  ({summary.input_kind}; device: {dev.get('name') or '?'}, "
              f"peak {_num(dev.get('peak_bandwidth_gbs'), '{:.0f}')} GB/s)")
    for tr in summary.traces:
        att = tr.get("attribution") or {}
        con.print(f"  {tr['source']}: {tr['path']} — {tr['events']:,} events, {tr['gpu_events']:,} on GPU, "
                  f"writes {att.get('writes', 0)}, attribution {att.get('method', 'none')}")
    groups = summary.groups
    ref_rows = [g for g in groups if g["source"] == "reference"]
    if ref_rows:
        con.print(reference_table(ref_rows))
    for source in sorted({g["source"] for g in groups} - {"reference"}):
        con.print(groups_table([g for g in groups if g["source"] == source], source))
    obs = summary.observer
    if obs.get("rows"):
        con.print(observer_table(obs))
    if not groups:
        found = sum(int((tr.get("attribution") or {}).get("writes") or 0) for tr in summary.traces)
        con.print(f"{found:,} writes found, none inside a kvprof step range: no per-phase table; generic numbers "
                  "only (see the warnings and summary.json 'traces[].generic')" if found else
                  "no kvprof writes: generic numbers only (see summary.json 'traces[].generic')")
        for tr in summary.traces:
            g = tr.get("generic") or {}
            if g.get("gpu"):
                con.print(f"  {tr['path']}: GPU busy {_us(g.get('gpu_busy_ns'), 1)} µs of {_us(g.get('gpu_window_ns'), 1)} µs, "
                          f"overlap {_num((g.get('overlap_frac') or 0) * 100)} %, {len(g.get('streams') or [])} streams")
                for k in (g.get("kernels_by_name") or [])[:5]:
                    con.print(f"    {k['count']:>6} x {k['name'][:70]}  total {_us(k['total_ns'], 1)} µs")
            else:
                con.print(f"  {tr['path']}: {g.get('note', 'no GPU activity')}")
    render_ranks(summary.ranks, con)  # a multi-rank run only
    for name, v in summary.variants.items():
        con.print(verdict_line(name, v))
    cmp = summary.comparison
    measured_rows = [r for r in (cmp or {}).get("rows") or [] if _is_number(r.get("cost_per_write_ns"))]
    if cmp and cmp.get("rows") and not measured_rows:
        con.print(f"vs baseline {cmp.get('baseline')}: no GPU time to compare (no GPU events in these traces)")
    elif cmp and cmp.get("rows"):
        con.print(comparison_table(cmp))
        h = cmp.get("headline")
        if h:
            con.print(headline_line(h, cmp["benchmark"]))
    for w in summary.warnings:
        con.print(f"[yellow]warning:[/yellow] {w}", soft_wrap=True)
