"""Bench results (:class:`~kvprof.core.bench_result.BenchResult`) as console tables and as
CSV; rendering only, no measurement.

The console tables show each median with its interquartile range, fit the console's width
(split into several tables led by the point's columns when they do not), and say
"n/a (why)" where a figure cannot exist; a column that holds nothing on this device (a
CUDA-only writer on a CPU) is named under the table instead of printed empty.
``point_rows`` is the medians-only form the docs' Markdown tables use."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import cast

from rich.console import Console
from rich.table import Table

from kvprof.analysis.figures import MARK, classify, derived
from kvprof.bench.run import KVPROF_FUSED, ROPE_KVPROF_FUSED, fused_verdicts, rope_verdicts
from kvprof.core.bench_result import BenchResult, BenchRow
from kvprof.kvcache.writers.card_tables import describe as describe_tables
from kvprof.kvcache.writers.triton_launch import describe_counts


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


EXTRA_COLUMNS = ("best kvprof", "GB/s", "% copy", "target", "ok", "floor", "x sgl", "x 2str", "x idx")
# the rope family's: the one-launch rope + store against the same rotation, then kvprof's fused
# store (x rope+fused) or SGLang's two-stream store (x rope+2str)
ROPE_EXTRA_COLUMNS = ("best kvprof", "GB/s", "% copy", "target", "ok", "floor", "x rope+fused", "x rope+2str")
_RATIO_PEERS = ((("sgl_kernel", "sgl_kernel_cubin"), ("two_stream",), ("index_put",)),
                (("rope_then_triton_fused",), ("rope_then_two_stream",)))


def is_rope(result: BenchResult) -> bool:
    """Whether ``result`` is the rope family's (its writes rotate q and k too)."""
    return any(r.q_heads for r in result.records)


def extra_columns(result: BenchResult) -> tuple[str, ...]:
    return ROPE_EXTRA_COLUMNS if is_rope(result) else EXTRA_COLUMNS


def _point_key(r: BenchRow) -> tuple[int, int, int, str, int]:
    return (r.q_heads or 0, r.heads, r.dim, r.dtype, r.tokens)


def _shape(key: tuple[int, int, int, str, int]) -> str:
    q, h, d = key[:3]
    return f"{q}x{h}x{d}" if q else f"{h}x{d}"


def _kvprof_fused(at: dict[str, BenchRow]) -> tuple[list[BenchRow], tuple[tuple[str, ...], ...]]:
    """The kvprof fused rows at one point that ran, and the peers their ratio columns name."""
    rope = any(r.q_heads for r in at.values())
    names = ROPE_KVPROF_FUSED if rope else KVPROF_FUSED
    return [at[v] for v in names if v in at and at[v].ok and at[v].median_us is not None], _RATIO_PEERS[rope]


def point_rows(result: BenchResult, mode: str, no: str = "NO", field: str = "median_us") -> list[list[str]]:
    """One row of cells per (shape, dtype, tokens): each variant's µs (``field``: the median
    per write, or ``host_us``, the eager host time), then the best kvprof fused variant's
    bandwidth, target verdict, floor and ratios to the peers (graph and wall-clock rows)."""
    variants = result.variants
    rows = [r for r in result.records if r.mode == mode]
    out = []
    for key in sorted({_point_key(r) for r in rows}):
        dtype, tokens = key[3], key[4]
        at = {r.variant: r for r in rows if _point_key(r) == key}
        cells = [_shape(key), dtype, str(tokens)]
        for v in variants:
            r = at.get(v)
            cells.append(_fmt(getattr(r, field)) if r and r.ok else (r.status if r else "-"))
        if field != "median_us":
            out.append(cells)
            continue
        ok, peers = _kvprof_fused(at)
        if ok:
            best = min(ok, key=lambda r: cast(float, r.median_us))  # ok: median_us is not None
            ratios = best.ratio_to or {}
            cells += [best.variant, _fmt(best.gbs, 0), _fmt(best.pct_copy_rate, 0),
                      _fmt(best.target_us), {True: "yes", False: no, None: "-"}[best.meets_target],
                      _fmt(best.floor_us),
                      *(_fmt(next((ratios[n] for n in names if n in ratios), None)) for names in peers)]
        else:
            cells += ["-"] * (len(peers) + 6)
        out.append(cells)
    return out


# the console tables: (mode, median field, IQR field, title)
TABLES = (("graph", "median_us", "iqr_us", "CUDA-graph replay, µs per write: median (IQR)"),
          ("cold", "median_us", "iqr_us",
           "one write after an L2 flush (graph node, flush subtracted), µs: median (IQR)"),
          ("eager", "median_us", "iqr_us", "eager, µs per write, wall clock: median (IQR)"),
          ("eager", "host_us", "host_iqr_us",
           "eager, host µs per write through the pool (launch loop before the sync): median (IQR)"),
          ("eager", "writer_host_us", "writer_host_iqr_us",
           "eager, host µs per write, writer alone (the op's launch path, no pool checks): median (IQR)"))
KEY_COLUMNS = ("shape", "dtype", "tokens")


@dataclass
class Column:
    """One console column: its header and one cell per point."""

    header: str
    cells: list[str]

    @property
    def width(self) -> int:
        """Characters it takes in a rich table: the widest text, a space each side, a rule."""
        return max([len(self.header), *map(len, self.cells)]) + 3

    def only_na(self) -> str | None:
        """The one "n/a (why)" every cell reads, else None."""
        first = self.cells[0] if self.cells else None
        return first if first and first.startswith("n/a") and all(c == first for c in self.cells) else None


def fmt_us(x: float) -> str:
    """Three significant figures or so: 0.612, 13.5, 1467."""
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}" if abs(x) >= 0.1 else f"{x:.3f}"


def fmt_median_iqr(median: float, iqr: float | None) -> str:
    return fmt_us(median) if iqr is None else f"{fmt_us(median)} ({fmt_us(iqr)})"


def short_reason(row: BenchRow) -> str:
    """A few words for a cell: why ``row`` has no figure (the whole reason is printed below the table)."""
    reason = row.reason or ""
    if row.status == "not installed" or "not installed" in reason:
        return "not installed"
    if "needs CUDA" in reason or "CUDA device" in reason or "needs CUDA streams" in reason or ", not cpu" in reason:
        return "needs CUDA"
    if "interpreter" in reason:
        return "Triton interpreter only"
    if "no conversion" in reason:
        return "no such conversion"
    return row.status


def _cell(row: BenchRow | None, field: str, iqr_field: str) -> str:
    if row is None:
        return "n/a (not measured)"
    if row.status == "wrong":
        return "WRONG"
    if row.status == "failed":
        return "failed"
    if not row.ok:
        return f"n/a ({short_reason(row)})"
    value = getattr(row, field)
    return "n/a (not timed)" if value is None else fmt_median_iqr(value, getattr(row, iqr_field))


def _extra_cells(result: BenchResult, at: dict[str, BenchRow]) -> list[str]:
    """The best kvprof fused variant's columns at one point (EXTRA_COLUMNS, or the rope
    family's ROPE_EXTRA_COLUMNS), "n/a (why)" where a figure cannot exist."""
    ok, peers = _kvprof_fused(at)
    if not ok:
        return ["n/a (no kvprof fused write ran)"] * (len(peers) + 6)
    best = min(ok, key=lambda r: cast(float, r.median_us))
    ratios = best.ratio_to or {}
    cuda = result.device.get("type", "cuda") == "cuda"
    interpreted = set(result.settings.interpreted)
    # the one rule (kvprof.analysis.figures): nothing is derived from an interpreted time
    time = classify(best.median_us, interpreted=best.variant in interpreted, cost=True)

    def ratio(*names: str) -> str:
        name = next((n for n in names if n in ratios), None)
        if name is not None and name in interpreted and time.trusted:
            return "n/a (peer interpreted)"
        return derived(time, ratios.get(name) if name else None, f"{names[0]} not timed").text()

    rate = "no copy rate"
    gpu_target = "n/a (a GPU target)"  # 1.2 µs + bytes at the copy rate: nothing a CPU's wall clock meets
    return [best.variant + (f" {MARK}" if best.variant in interpreted else ""),
            derived(time, best.gbs, rate).text(0), derived(time, best.pct_copy_rate, rate).text(0),
            gpu_target if not cuda else rate if best.target_us is None else _fmt(best.target_us),
            gpu_target if not cuda else {True: "yes", False: "NO", None: rate}[best.meets_target],
            _fmt(best.floor_us) if best.floor_us is not None else
            ("n/a (no CUDA graphs)" if not cuda else "n/a (not measured)"),
            *(ratio(*names) for names in peers)]


def table_columns(result: BenchResult, mode: str, field: str, iqr_field: str) -> list[Column]:
    """Every column of one console table: the point, each variant's median (IQR), and for
    the median tables the best kvprof fused variant's columns."""
    rows = [r for r in result.records if r.mode == mode]
    keys = sorted({_point_key(r) for r in rows})
    at = {k: {r.variant: r for r in rows if _point_key(r) == k} for k in keys}
    cols = [Column("shape", [_shape(k) for k in keys]), Column("dtype", [k[3] for k in keys]),
            Column("tokens", [str(k[4]) for k in keys])]
    mark = set(result.settings.interpreted)
    cols += [Column(f"{v} *" if v in mark else v, [_cell(at[k].get(v), field, iqr_field) for k in keys])
             for v in result.variants]
    if field == "median_us":
        extra = [_extra_cells(result, at[k]) for k in keys]
        cols += [Column(name, [e[i] for e in extra]) for i, name in enumerate(extra_columns(result))]
    return cols


def pack(columns: list[Column], width: int, keep: int = len(KEY_COLUMNS)) -> list[list[Column]]:
    """Split columns into tables no wider than ``width``, each led by the first ``keep``
    (the point) columns; one column per table when even that does not fit."""
    head, rest = columns[:keep], columns[keep:]
    base = 1 + sum(c.width for c in head)
    tables: list[list[Column]] = []
    for c in rest:
        if tables and base + sum(x.width for x in tables[-1][keep:]) + c.width <= width:
            tables[-1].append(c)
        else:
            tables.append([*head, c])
    return tables or [head]


def _head_line(result: BenchResult, cuda: bool) -> str:
    """The device, its copy rate and graph floors, the thread count and the target, on one line."""
    limits = result.limits
    rate = limits.get("copy_rate_gbs")
    head = [f"[bold]{result.device_name}[/]", f"copy rate {_fmt(rate, 0) if rate else 'n/a'} GB/s (read+write)"]
    if cuda:
        head += [f"empty kernel node {_fmt(limits.get('empty_kernel_us'))} µs "
                 f"(with PDL {_fmt(limits.get('empty_pdl_kernel_us'))} µs)",
                 f"fill_ node {_fmt(limits.get('fill_node_us'))} µs"]
    else:
        head.append("graph floors n/a (no CUDA graphs)")
    if result.settings.torch_threads is not None:
        head.append(f"torch threads {result.settings.torch_threads}")
    head.append(f"target for kvprof's fused writes: {result.settings.target.describe()}"
                + ("" if cuda else " (CUDA-graph replays on a GPU; not judged here)"))
    if is_rope(result):
        head.append("rope family: each write rotates q and k (read and written back), reads v, writes two cache rows")
    if result.launch_tables:
        head.append(describe_tables(result.launch_tables))
    if result.launches:
        head.append(describe_counts(result.launches))
    return "  ".join(head)


def _with_figures(columns: list[Column], dropped: dict[str, list[str]]) -> list[Column]:
    """The key columns and every column with a figure; each left out one is added once to
    ``dropped`` under its "n/a (why)"."""
    shown = columns[:len(KEY_COLUMNS)]
    for c in columns[len(KEY_COLUMNS):]:
        na = c.only_na()
        if na is None:
            shown.append(c)
        elif c.header not in dropped.setdefault(na, []):
            dropped[na].append(c.header)
    return shown


def _print_packed(console: Console, title: str, columns: list[Column]) -> None:
    """``columns`` as one table, or several numbered ones where they do not fit the console."""
    parts = pack(columns, console.width)
    for i, cols in enumerate(parts):
        table = Table(title=title if len(parts) == 1 else f"{title} [{i + 1}/{len(parts)}]", show_lines=False)
        for j, c in enumerate(cols):
            table.add_column(c.header, justify="left" if j < len(KEY_COLUMNS) else "right", no_wrap=True)
        for cells in zip(*(c.cells for c in cols)):
            table.add_row(*cells)
        console.print(table)


def render_table(result: BenchResult, console: Console | None = None) -> None:
    """The limits, one table per mode and field (split to fit ``console.width``), the reasons
    and the verdicts. A column with no figure on this device is left out and named once."""
    console = console or Console(width=200)
    cuda = result.device.get("type", "cuda") == "cuda"
    console.print(_head_line(result, cuda))
    dropped: dict[str, list[str]] = {}  # "n/a (why)" -> the columns left out for it, over every table
    for mode, field, iqr_field, title in TABLES:
        rows = [r for r in result.records if r.mode == mode and (field == "median_us" or getattr(r, field) is not None)]
        if not rows:
            continue
        if field == "host_us" and not cuda:
            console.print("eager host time through the pool: the wall clock above (a CPU write has no launch queue)")
            continue
        _print_packed(console, title, _with_figures(table_columns(result, mode, field, iqr_field), dropped))
    if result.settings.interpreted:
        counts = sorted({r.samples for r in result.records
                         if r.variant in result.settings.interpreted and r.ok and r.samples})
        samples = f", {'/'.join(map(str, counts))} samples" if counts else ""
        console.print(f"  * ran under Triton's interpreter (numpy on the host): the interpreter's time, not a kernel's"
                      f"{samples} ({', '.join(result.settings.interpreted)})", markup=False, highlight=False)
    for na, names in dropped.items():
        console.print(f"  not shown, {na}: {', '.join(names)}", markup=False, highlight=False)
    reasons = {(r.variant, r.reason) for r in result.records if not r.ok}
    for variant, reason in sorted(reasons, key=str):
        console.print(f"  {variant}: {reason}", markup=False, highlight=False)
    for line in verdict_lines(result):
        console.print(line, markup=False, highlight=False)  # "[reference: ...]" is text, not markup


def _target_line(result: BenchResult, variant: str, t: dict, mode: str) -> list[str]:
    """How many timed points met the target; nothing on a CPU (the target is a GPU's: 1.2 µs
    plus the bytes at its copy rate, which no wall clock of the host is held to)."""
    if not t["points"] or result.device.get("type", "cuda") != "cuda":
        return []
    return [f"{variant}: target met at {t['met']}/{t['points']} {mode} points"
            + (f" (missed: {'; '.join(t['missed'][:6])})" if t["missed"] else "")]


def verdict_lines(result: BenchResult) -> list[str]:
    """The checks per kvprof fused variant (:func:`kvprof.bench.run.fused_verdicts`), one line
    each, from this run only."""
    lines = []
    for variant in ROPE_KVPROF_FUSED:
        if variant not in result.variants:
            continue
        rv = rope_verdicts(result, variant)
        if not rv["points"]:
            continue
        lines += _target_line(result, variant, rv["target"], rv["mode"])
        for other in ("rope_then_triton_fused", "rope_then_two_stream"):
            c = rv[other]
            if c["compared"]:
                lines.append(f"{variant}: slower than {other} at {len(c['slower'])}/{c['compared']} {rv['mode']} "
                             f"points ({other}'s time over {variant}'s: median {c['median_ratio']:.2f}, "
                             f"min {c['min_ratio']:.2f})" + (f": {'; '.join(c['slower'][:6])}" if c["slower"] else ""))
    for variant in KVPROF_FUSED:
        if variant not in result.variants:
            continue
        v = fused_verdicts(result, variant)
        if not v["graph_points"] and not v["eager_host"]["median_us"]:
            continue
        t, s, e, f = v["target"], v["vs_sgl"], v["eager_host"], v["fp8_vs_bf16"]
        lines += _target_line(result, variant, t, "graph")
        if s["compared"]:
            lines.append(f"{variant}: slower than sgl-kernel at {len(s['slower'])}/{s['compared']} points "
                         f"[{s['source']}]" + (f": {'; '.join(s['slower'][:6])}" if s["slower"] else ""))
        for mode, c in v["vs_store_cache"].items():
            if c["compared"]:
                what = "graph" if mode == "graph" else "cold single-write"
                lines.append(f"{variant}: slower than SGLang's store_cache at {len(c['slower'])}/{c['compared']} "
                             f"{what} points"
                             + (f", {len(c['within_noise'])} of them by less than the spread" if c["slower"] else "")
                             + (f": {'; '.join(c['slower'][:6])}" if c["slower"] else ""))
        if e["compared"]:
            what = "writer alone" if e["basis"] == "writer" else "through the pool"
            extra = (f"; through the pool: median {_fmt(e['pool_median_us'])} µs, above at {e['pool_over']}"
                     if e["basis"] == "writer" else "")
            if e.get("index_put_median_us") is not None:
                extra += f"; two index_put on this host: median {_fmt(e['index_put_median_us'])} µs"
            lines.append(f"{variant}: eager host time ({what}) above sgl-kernel's op at "
                         f"{len(e['over'])}/{e['compared']} points (median {_fmt(e['median_us'])} µs{extra})"
                         + (f": {'; '.join(e['over'][:6])}" if e["over"] else ""))
        if f["compared"]:
            lines.append(f"{variant}: fp8<-bf16 slower than bf16 at {len(f['slower'])}/{f['compared']} points"
                         + (f", {len(f['within_noise'])} of them by less than the replays' spread"
                            if f["slower"] else "")
                         + (f": {'; '.join(f['slower'][:6])}" if f["slower"] else ""))
    return lines


CSV_COLUMNS = ("shape", "heads", "dim", "cache_dtype", "input_dtype", "tokens", "variant", "mode", "status",
               "median_us", "iqr_us", "host_us", "host_iqr_us", "writer_host_us", "writer_host_iqr_us", "samples",
               "bytes", "gbs", "pct_copy_rate", "target_us", "meets_target", "floor_us", "reason",
               "q_heads",  # the rope family's query heads (empty for a store), late: older readers' columns stay put
               "figure")  # what the median can be taken for (kvprof.analysis.figures): measured, interpreted, n/a


def to_csv(result: BenchResult) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    w.writeheader()
    interpreted = set(result.settings.interpreted)
    for r in result.records:
        w.writerow({**r.to_json(), "figure": classify(r.median_us if r.ok else None,
                                                      interpreted=r.variant in interpreted, cost=True).kind})
    return buf.getvalue()
