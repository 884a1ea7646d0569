"""The console view of an analysis: one table per source, verdicts, comparison, warnings.

Every table follows kvprof.report.cells: a missing figure reads ``n/a (why)``, a column
n/a in every row is named once under the table, and a legend line says what the columns
are. The figures themselves are the summary's (``analyze --json`` has every one).
"""

from __future__ import annotations

from typing import Any, TypeGuard

from rich.console import Console
from rich.table import Table

from kvprof.core.numbers import finite_or_none
from kvprof.core.rundir import RunDir
from kvprof.core.sources import SOURCES
from kvprof.core.summary import Summary, VariantVerdict
from kvprof.core.text import markup
from kvprof.core.timings import WALL, SourceTiming
from kvprof.report.cells import (
    NA,
    NEGATIVE,
    NOT_MEASURED,
    Cell,
    Col,
    gpu_traced,
    missing_reason,
    no_gpu_reason,
    num,
    print_table,
    table,
    us,
)
from kvprof.report.layer_steps import render_layer_steps
from kvprof.report.ranks import render_ranks

SOURCE_NAMES = {s.name: s.prose for s in SOURCES}

WRITE_COLS = (
    Col("variant", justify="left"), Col("phase", justify="left"), Col("size", "batch or tokens"),
    Col("writes", "writes measured"), Col("kern/wr", "GPU kernels per write"),
    Col("GPU span µs", "first kernel start to last end"), Col("cost/wr µs", "GPU time a write adds"),
    Col("host µs", "the launching thread's time in the write"), Col("launch→GPU µs", "launch to first kernel"),
    Col("GB/s", "K+V bytes over cost"), Col("% peak", "of the device's peak bandwidth"),
)
STEP_COLS = (
    Col("variant", justify="left"), Col("phase", justify="left"), Col("size"),
    Col("attribution", "how writes were matched to GPU work", "left"), Col("streams", "CUDA streams used"),
    Col("overlap %", "of the span on two streams at once"),
    Col("gap µs", "GPU idle before a write; 0, never negative, where it began before the work before it ended"),
    Col("PDL", "the writer launches with programmatic dependent launch"),
    Col("PDL overlap", "writes that began before the work before them on their stream ended, and how early "
                       "(median, max µs); 'anomaly' where the writer does not launch with PDL"),
    Col("step µs", "one measured step, host"), Col("step GPU µs", "one measured step, GPU"),
)


def groups_table(rows: list[dict[str, Any]], source: str, summary: Summary | None = None,
                 width: int | None = None) -> list[tuple[Table, list[str]]]:
    """One profiler source's rows: what a write costs, then what a step holds (two tables
    of the same rows, so each fits a terminal; summary.csv has every column in one)."""
    summary = summary or Summary(input="", input_kind="")
    gpu = gpu_traced(summary)
    writes: list[list[Cell]] = []
    steps: list[list[Cell]] = []
    for r in rows:
        has_gpu = (source, str(r["variant"])) in gpu

        def why(key: str, r: dict[str, Any] = r, has_gpu: bool = has_gpu) -> NA:
            return missing_reason(r, key, has_gpu, summary)

        overlap = finite_or_none(r.get("overlap_frac"))
        head: list[Cell] = [str(r["variant"]), str(r["phase"]), str(r["size"])]
        writes.append([
            *head, str(r["writes"]), num(r["kernels_per_write"] if has_gpu else None, why("kernels_per_write"), "{:g}"),
            us(r["gpu_span_ns"], why("gpu_span_ns")), us(r["cost_per_write_ns"], why("cost_per_write_ns")),
            us(r["host_launch_ns"], why("host_launch_ns")), us(r["launch_delay_ns"], why("launch_delay_ns")),
            num(r["bandwidth_gbs"], why("bandwidth_gbs")), num(r["pct_of_peak"], why("pct_of_peak"), "{:.2f}"),
        ])
        steps.append([
            *head, str(r["attribution"]), num(r["streams"] if has_gpu else None, why("streams"), "{:.0f}"),
            num(overlap * 100 if overlap is not None else None, why("overlap_frac")),
            us(r.get("gap_before_ns"), why("gap_before_ns")), pdl_cell(r.get("pdl_launch")),
            pdl_overlap_cell(r, why("same_stream_early") if not has_gpu else None),
            us(r["step_ns"], why("step_ns"), 1), us(r["step_gpu_ns"], why("step_gpu_ns"), 1),
        ])
    name = SOURCE_NAMES.get(source, source)
    return [table(f"per write, median ({source}: {name})", WRITE_COLS, writes, width=width),
            table(f"per step, median ({source}: {name})", STEP_COLS, steps, width=width)]


PDL_NOT_RECORDED = NA("not recorded", "the run does not record whether the writer launches with programmatic "
                                     "dependent launch (a library's kernel, or a run from before kvprof recorded it)")


def pdl_cell(pdl: Any) -> Cell:
    """Whether the variant launches with programmatic dependent launch, as the capture recorded it."""
    return "yes" if pdl is True else "no" if pdl is False else PDL_NOT_RECORDED


def pdl_overlap_cell(r: dict[str, Any], missing: NA | None) -> Cell:
    """``n/writes`` that began before the work before them on their stream ended, with the
    median and max early start; 'anomaly' where the variant does not launch with PDL."""
    if missing is not None:
        return missing
    n = int(finite_or_none(r.get("same_stream_early")) or 0)
    head = f"{n}/{r.get('writes')}"
    if not n:
        return head
    median, most = us(r.get("same_stream_early_ns"), NOT_MEASURED), us(r.get("same_stream_early_max_ns"), NOT_MEASURED)
    cell = f"{head}, {median}, max {most}"
    return f"{cell}, anomaly" if r.get("pdl_launch") is False else cell


def reference_table(rows: list[dict[str, Any]], width: int | None = None) -> tuple[Table, list[str]]:
    """The unprofiled reference pass: the figures a step pays, with their spread."""
    clocks = sorted({str(r.get("attribution")) for r in rows})
    how = SourceTiming("reference", clocks[0] if len(clocks) == 1 else "mixed").how
    layer = any(r.get("context") == "layer" for r in rows)
    cols = [Col("variant", justify="left"), Col("phase", justify="left"), Col("size", "batch or tokens"),
            Col("steps", "steps timed"), Col("step µs", "one step's median (every layer it ran)"),
            Col("IQR µs", "interquartile range of the steps"), Col("cost/wr µs", "the step over its writes")]
    if layer:
        cols += [Col("write share %", "of a decoder-layer step"), Col("writes alone µs", "the step's writes, no layer")]
    out: list[list[Cell]] = []
    for r in rows:
        cells: list[Cell] = [str(r["variant"]), str(r["phase"]), str(r["size"]), str(r["steps"]),
                             us(r["step_ns"], NOT_MEASURED, 1, cost=True),
                             us(r.get("step_iqr_ns"), missing_reason(r, "step_iqr_ns", True, Summary("", "")), 1),
                             us(r["cost_per_write_ns"], NOT_MEASURED, cost=True)]
        if layer:
            share = r.get("write_share")
            plain = NA("writes only, no layer") if r.get("context") != "layer" else NOT_MEASURED
            cells += [NEGATIVE if _is_number(share) and share < 0 else  # the one rule: noise, not a share
                      num(share * 100 if _is_number(share) else None, plain),
                      us(r.get("writes_only_step_ns"), plain, 1)]
        out.append(cells)
    return table(f"reference: no profiler, no ranges, each step timed with {how} (median)", cols, out, width=width)


def observer_table(obs: dict[str, Any], summary: Summary | None = None,
                   width: int | None = None) -> tuple[Table, list[str]]:
    """Each profiler's reading over the reference: its observer effect, per point."""
    summary = summary or Summary(input="", input_kind="")
    gpu = gpu_traced(summary)
    pct = round(obs.get("threshold", 0.1) * 100)
    cols = (Col("variant", justify="left"), Col("source", justify="left"), Col("phase", justify="left"),
            Col("size"), Col("cost/wr µs", "the profiler's reading"), Col("reference µs", "the unprofiled figure"),
            Col("per write", "reading / reference"), Col("per step", "step reading / reference step"),
            Col("run slowed", "profiled run's own steps / reference"), Col("flag", justify="left"))
    out: list[list[Cell]] = []
    for r in obs.get("rows") or []:
        has_gpu = (str(r["source"]), str(r["variant"])) in gpu
        missing = no_gpu_reason(summary) if not has_gpu else NOT_MEASURED
        out.append([str(r["variant"]), str(r["source"]), str(r["phase"]), str(r["size"]),
                    us(r.get("cost_per_write_ns"), missing),
                    us(r.get("reference_cost_per_write_ns"), NOT_MEASURED, cost=True),
                    # a ratio to a negative (noise) reference is no ratio
                    NEGATIVE if _negative(r.get("reference_cost_per_write_ns")) else
                    num(r.get("ratio_per_write"), missing, "{:.2f}x"), num(r.get("ratio_per_step"), NOT_MEASURED,
                                                                           "{:.2f}x"),
                    num(r.get("pass_slowdown"), NOT_MEASURED, "{:.2f}x"), "off" if r.get("flagged") else "ok"])
    return table(f"observer effect: profiler reading / reference (flag: more than {pct} % off)", cols, out,
                 width=width)


def _negative(v: Any) -> bool:
    return _is_number(v) and v < 0


def verdict_line(name: str, v: VariantVerdict) -> str:
    """One variant's verdict as rich markup (the names and reasons in it escaped)."""
    name = markup(name)
    if not v.available:
        return f"[dim]{name}: not run ({markup(v.reason)})[/dim]"
    parts = [f"{name}: {v.verdict_word()}"]
    parts.append(f"paths say {markup(v.paths_said())}")
    counts = v.kernel_counts.get("gpu_ops_per_write") or {}
    if counts and isinstance(counts, dict):
        parts.append("GPU ops/write " + ", ".join(f"{markup(k)} x{markup(c)}" for k, c in counts.items()))
    if v.fell_back:
        reasons = "; ".join(markup(r) for r in v.fallback_reasons)
        parts.append("[red]fell back[/red]" + (f" ({reasons})" if reasons else ""))
    if v.agree is False:
        parts.append("[yellow]paths and kernel count disagree[/yellow]")
    return " · ".join(parts)


NO_GPU_TIME = NA("no GPU time", "this source timed no GPU work for the row (a CPU run's profiler; its reference "
                                "rows have a cost)")


def saving_reason(r: dict[str, Any]) -> NA:
    """Why a comparison row has no saving per decode step."""
    if r.get("phase") != "decode":
        return NA(str(r.get("phase")), "savings are per decode step")
    mine, theirs = ((r.get("after_cost_per_write_ns"), r.get("before_cost_per_write_ns")) if "only_in" in r else
                    (r.get("cost_per_write_ns"), r.get("baseline_cost_per_write_ns")))
    if finite_or_none(mine) is None or finite_or_none(theirs) is None:
        return NO_GPU_TIME
    # kvprof.analysis.compare projects GPU time only
    return NA(*SourceTiming(str(r.get("source")), WALL).no_step_why)


def comparison_rows(cmp: dict[str, Any]) -> tuple[list[Col], list[list[Cell]]]:
    rows = cmp["rows"]
    layer = any(r.get("measured_saving_per_step_ms") is not None for r in rows)
    cols = [Col("variant", justify="left"), Col("source", justify="left"), Col("phase", justify="left"), Col("size"),
            Col("cost/write µs", "the variant's"), Col("baseline µs", f"{cmp['baseline']}'s, same source and size"),
            Col("ratio", "variant / baseline"),
            Col("saving/step ms", f"per decode step over {cmp['layers']} layers")]
    if layer:
        cols += [Col("± ms", "spread of the measured saving"), Col("projected ms", "from the writes alone")]
    cols += [Col("% of ITL", "saving over the benchmark's inter-token latency"),
             Col("predicted ITL ms", "the benchmark's ITL less the saving")]
    out: list[list[Cell]] = []
    # the one rule (kvprof.analysis.figures): an interpreted time is marked, nothing derived from it
    marked = set(cmp.get("interpreted") or [])
    interp = NA("interpreted", "a time in Triton's interpreter: no ratio or saving is derived from it")
    for r in rows:
        untrusted = str(r["variant"]) in marked or str(cmp.get("baseline")) in marked
        saving = interp if untrusted else saving_reason(r)
        cells: list[Cell] = [str(r["variant"]) + (" *" if str(r["variant"]) in marked else ""), str(r["source"]),
                             str(r["phase"]), str(r["size"]),
                             us(r["cost_per_write_ns"], NO_GPU_TIME), us(r["baseline_cost_per_write_ns"], NO_GPU_TIME),
                             interp if untrusted else num(r["ratio_cost_per_write_ns"], NO_GPU_TIME, "{:.2f}"),
                             num(None if untrusted else r.get("saving_per_step_ms"), saving, "{:.3f}")]
        if layer:
            cells += [num(r.get("measured_saving_spread_ms"), NA("< 4 steps")),
                      num(None if untrusted else r.get("projected_saving_per_step_ms"), saving, "{:.3f}")]
        share = None if untrusted else r.get("saving_share_of_itl")
        cells += [num(share * 100 if share is not None else None, saving, "{:.2f}"),
                  num(None if untrusted else r.get("predicted_itl_ms"), saving, "{:.2f}")]
        out.append(cells)
    return cols, out


def comparison_view(cmp: dict[str, Any], width: int | None = None) -> tuple[Table, list[str]]:
    """The comparison's rows that have a figure to compare, and the lines under them (the
    sources with none, the columns n/a in every row, the legend)."""
    cols, rows = comparison_rows(cmp)
    keep = [(r, c) for r, c in zip(cmp["rows"], rows) if _is_number(r.get("cost_per_write_ns"))]
    empty = sorted({str(r["source"]) for r in cmp["rows"]} - {str(r["source"]) for r, _ in keep})
    t, notes = table(_comparison_title(cmp), cols, [c for _, c in keep], width=width)
    if empty:
        notes.insert(0, f"not shown: the {', '.join(empty)} rows, n/a ({NO_GPU_TIME.why}): {NO_GPU_TIME.explain}")
    return t, notes


def comparison_table(cmp: dict[str, Any], width: int | None = None) -> Table:
    """``compare``'s view: the comparison, with the lines about it as the table's caption."""
    t, notes = comparison_view(cmp, width)
    t.caption, t.caption_justify = "\n".join(markup(n) for n in notes), "left"
    return t


def _comparison_title(cmp: dict[str, Any]) -> str:
    layer = any(r.get("measured_saving_per_step_ms") is not None for r in cmp["rows"])
    title = f"vs baseline {cmp['baseline']} (projection: {cmp['layers']} layers/step"
    return title + ("; in a decoder layer the saving is measured, step against step)" if layer else ")")


def run_comparison_table(doc: dict[str, Any]) -> Table:
    """kvprof.analysis.runs.RunComparison rows: each variant before -> after. A row measured in one
    run only says so in the other run's cells; rows with a cost per write in neither run (a CPU
    run's profiler rows) are not shown, and one line under the table says which and why."""
    cols = [Col("variant", justify="left"), Col("source", justify="left"), Col("phase", justify="left"), Col("size"),
            Col("before µs", "cost per write in the before run"), Col("after µs", "cost per write in the after run"),
            Col("after/before"), Col("saving/step ms")]
    out: list[list[Cell]] = []
    costless: dict[str, list[str]] = {}
    # the one rule (kvprof.analysis.figures): each run's cost marked `*` where that run timed the
    # interpreter, n/a (negative: noise) below zero; no ratio or saving from either
    interpreted = {side: set((doc.get("interpreted") or {}).get(side) or []) for side in ("before", "after")}
    interp = NA("interpreted", "a time in Triton's interpreter: no ratio or saving is derived from it")
    for r in doc["rows"]:
        before, after = r.get("before_cost_per_write_ns"), r.get("after_cost_per_write_ns")
        if finite_or_none(before) is None and finite_or_none(after) is None:
            costless.setdefault(str(r["source"]), []).append(f"{r['variant']} {r['phase']} {r['size']}")
            continue
        only = r.get("only_in")
        gone = NA(f"only in {only}", f"measured in the {only} run only") if only else None
        marked = [str(r.get(side) or r["variant"]) in interpreted[side] for side in ("before", "after")]
        costs = [us(c, gone or NO_GPU_TIME, cost=True) for c in (before, after)]
        costs = [f"{c} *" if m and isinstance(c, str) else c for c, m in zip(costs, marked)]
        untrusted = interp if any(marked) else NEGATIVE if NEGATIVE in costs else None
        out.append([str(r["variant"]) + (" *" if any(marked) else ""), str(r["source"]), str(r["phase"]),
                    str(r["size"]), *costs,
                    untrusted or num(r.get("ratio_cost_per_write_ns"), gone or NO_GPU_TIME, "{:.2f}"),
                    untrusted or num(r.get("saving_per_step_ms"), gone or saving_reason(r), "{:.3f}")])
    t, notes = table(f"run vs run (before -> after; projection: {doc['layers']} layers/step)", cols, out)
    for source, points in costless.items():
        notes.insert(0, f"not shown: {len(points)} {source} row(s) with no cost per write in either run "
                        f"({', '.join(points[:4])}{', ...' if len(points) > 4 else ''}): {NO_GPU_TIME.explain}")
    t.caption, t.caption_justify = "\n".join(markup(n) for n in notes), "left"
    return t


def headline_line(h: dict[str, Any], b: dict[str, Any]) -> str:
    """The one-line answer, naming the source its figure comes from and how it was got (rich markup)."""
    source = markup(SOURCE_NAMES.get(h["source"], h["source"]))
    how = "measured in a decoder layer" if h.get("measured") else "projected as layers x per-write saving"
    extra = ""
    if h.get("measured") and _is_number(h.get("projected_saving_per_step_ms")):
        extra = f"; the writes alone project {h['projected_saving_per_step_ms']:.3f} ms"
    return (f"{markup(h['variant'])} vs baseline at decode bs={markup(h['size'])} ({source}): saving "
            f"{h['saving_per_step_ms']:.3f} ms/step, {how}{extra}; ITL {b['itl_before_ms']:.2f} → "
            f"{h['predicted_itl_ms']:.2f} ms predicted, {b['itl_before_ms']:.2f} → {b['itl_after_ms']:.2f} ms "
            f"({h['measured_saving_ms']:.2f} ms) measured by the serving benchmark")


def _is_number(v: Any) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and v == v


def make_console() -> Console:
    """The terminal's width; piped, COLUMNS or kvprof.report.terminal.PIPE_WIDTH (rich assumes 80)."""
    from kvprof.report.terminal import make_console as _make

    return _make()


def _generic(summary: Summary, con: Console) -> None:
    """A trace with no kvprof steps: the numbers any trace has."""
    found = sum(int((tr.get("attribution") or {}).get("writes") or 0) for tr in summary.traces)
    con.print(f"{found:,} writes found, none inside a kvprof step range: no per-phase table; generic numbers "
              f"only (see the warnings and {RunDir.SUMMARY} 'traces[].generic')" if found else
              f"no kvprof writes: generic numbers only (see {RunDir.SUMMARY} 'traces[].generic')")
    for tr in summary.traces:
        g = tr.get("generic") or {}
        if g.get("gpu"):
            busy, window = us(g.get("gpu_busy_ns"), NOT_MEASURED, 1), us(g.get("gpu_window_ns"), NOT_MEASURED, 1)
            overlap = num((g.get("overlap_frac") or 0) * 100, NOT_MEASURED)
            devices = g.get("devices") or []
            con.print(f"  {markup(tr['path'])}: GPU busy {busy} µs of {window} µs, overlap {overlap} %, "
                      f"{len(g.get('streams') or [])} streams" + (
                          f" on {len(devices)} devices (overlap: streams of one device at once)"
                          if len(devices) > 1 else ""))
            for d in devices if len(devices) > 1 else []:
                con.print(f"    device {markup(d['device'])} ({markup(d.get('name') or 'name not in the trace')}): "
                          f"busy {us(d.get('busy_ns'), NOT_MEASURED, 1)} µs, overlap "
                          f"{num((d.get('overlap_frac') or 0) * 100, NOT_MEASURED)} % across its "
                          f"{markup(d['streams'])} streams, {markup(d['kernels'])} kernels")
            for k in (g.get("kernels_by_name") or [])[:5]:
                con.print(f"    {markup(k['count']):>6} x {markup(str(k['name'])[:70])}  "
                          f"total {us(k['total_ns'], NOT_MEASURED, 1)} µs")
        else:
            con.print(f"  {markup(tr['path'])}: {markup(g.get('note', 'no GPU activity'))}")


def _devices_named(summary: Summary) -> str | None:
    """"2 x NVIDIA H100": the devices the traces' generic numbers name, where the summary's device has none."""
    names = [d.get("name") for tr in summary.traces for d in (tr.get("generic") or {}).get("devices") or []]
    named = sorted({n for n in names if isinstance(n, str)})
    if not named:
        return None
    return ", ".join(f"{names.count(n)} x {n}" if names.count(n) > 1 else n for n in named)


def _writes_words(att: dict[str, Any], named: dict[str, Any] | None) -> str:
    """"writes 40, attribution graph_order"; for a trace without kvprof's ranges whose KV-write kernels
    were found by name, those kernels and how many are tied to a step and a layer (never "writes 0" alone)."""
    n = att.get("writes", 0)
    named = named or {}
    kernels = named.get("write_kernels") or 0
    if n or not kernels:
        return f"writes {markup(n)}, attribution {markup(att.get('method', 'none'))}"
    return (f"no kvprof write ranges; {markup(_count(kernels))} KV-write kernels by name, "
            f"{markup(_count(named.get('tied_step_and_layer') or 0))} tied to a step and a layer "
            f"(steps: {markup(named.get('step_method') or 'none found')})")


def peak_words(dev: dict[str, Any]) -> str:
    """"peak 4,800 GB/s (spec table)": the device's peak and where it came from; n/a with why."""
    peak = finite_or_none(dev.get("peak_bandwidth_gbs"))
    if peak is None:
        return "peak n/a (not recorded, not in the spec table)"
    src = dev.get("peak_bandwidth_source")
    return f"peak {peak:,.0f} GB/s" + (f" ({markup(src)})" if isinstance(src, str) and src else "")


def render(summary: Summary, console: Console | None = None) -> None:
    con = console or make_console()
    dev = summary.device
    con.print(f"[bold]kvprof analyze[/bold] {markup(summary.input)}  ({markup(summary.input_kind)}; device: "
              f"{markup(dev.get('name') or _devices_named(summary) or '?')}, {peak_words(dev)})")
    by_name = {t.get("path"): t for t in (summary.write_kernels or {}).get("traces") or []}
    for tr in summary.traces:
        att = tr.get("attribution") or {}
        con.print(f"  {markup(tr['source'])}: {markup(tr['path'])} — {markup(_count(tr.get('events')))} events, "
                  f"{markup(_count(tr.get('gpu_events')))} on GPU, {_writes_words(att, by_name.get(tr['path']))}")
    groups = summary.groups
    ref_rows = [g for g in groups if g["source"] == "reference"]
    if ref_rows:
        print_table(con, *reference_table(ref_rows, con.width))
    for source in sorted({g["source"] for g in groups} - {"reference"}):
        for part in groups_table([g for g in groups if g["source"] == source], source, summary, con.width):
            print_table(con, *part)
    obs = summary.observer
    if obs.get("rows"):
        print_table(con, *observer_table(obs, summary, con.width))
    if not groups:
        _generic(summary, con)
    render_ranks(summary.ranks, con)  # a multi-rank run only
    for name, v in summary.variants.items():
        con.print(verdict_line(name, v))
    cmp = summary.comparison
    if cmp and cmp.get("rows"):
        interpreted = sorted(n for n, v in summary.variants.items() if v.interpreted)
        print_table(con, *comparison_view({**cmp, "interpreted": interpreted}, con.width))
        h = cmp.get("headline")
        if h:
            con.print(headline_line(h, cmp["benchmark"]))
    render_layer_steps(summary.layer_steps, con,  # a --context layer run only
                       {n for n, v in summary.variants.items() if v.interpreted})
    for w in summary.warnings:
        con.print(f"[yellow]warning:[/yellow] {markup(w)}", soft_wrap=True)


def _count(v: Any) -> str:
    """A count with thousands separators; anything else (a tampered summary) as its text."""
    return f"{v:,}" if isinstance(v, int) else str(v)


__all__ = ["SOURCE_NAMES", "comparison_rows", "comparison_table", "comparison_view", "groups_table",
           "headline_line", "make_console", "observer_table", "reference_table", "render", "run_comparison_table",
           "saving_reason", "verdict_line"]
