"""What a capture prints: what ran, one compact table, a few plain sentences, where next.

For someone who has not read the docs yet: one table narrow enough for an 80-column
terminal (variant, fused or not, phase, size, cost per write and its source, ratio to the
baseline, saving per decode step over the model's layers), then what it means (what
fused, what a write costs here and why, what a GPU would show, where the H200 samples
are), then the command with every table (``kvprof analyze RUN``). Every figure is the
summary's; the manifest only says how the run was made (layers per step, threads,
Triton's interpreter).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text

from kvprof.core import variants
from kvprof.core.errors import Setting, Words
from kvprof.core.layer_kernels import LayerKernels
from kvprof.core.numbers import finite_or_none
from kvprof.core.run import Manifest
from kvprof.core.sources import SOURCES, TRUST_ORDER, source_names
from kvprof.core.summary import Summary
from kvprof.core.text import printable
from kvprof.report.cells import NA, Cell, Col, cpu_run, print_table, table
from kvprof.report.layer_steps import saving_lines

SHORT_SOURCE = {s.name: s.short for s in SOURCES}
SOURCE_WORDS = {s.name: s.tool for s in SOURCES}
PHASES = ("decode", "prefill", "serving")
DASHBOARD = "python -m kvprof dashboard"
DASHBOARD_MODULES = ("streamlit", "plotly")  # what the dashboard extra installs


def dashboard_hint() -> str:
    """How to open the dashboard, with the extra's install line only where it is missing."""
    import importlib.util

    if all(importlib.util.find_spec(m) is not None for m in DASHBOARD_MODULES):
        return DASHBOARD
    return (f"{DASHBOARD} (needs the dashboard extra: pip install 'kvcache-profiler[dashboard]'; from a checkout: "
            "pip install -e '.[dashboard]')")


def _cost(ns: Any) -> str | None:
    """µs, with as many digits as a reader needs: 0.65, 16.3, 5,512."""
    f = finite_or_none(ns)
    if f is None:
        return None
    v = f / 1000
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:,.0f}"


def _ratio(r: float) -> str:
    return f"{r:.2f}" if r < 10 else f"{r:.1f}" if r < 100 else f"{r:,.0f}"


# short: the first summary fits 80 columns; the legend under it says what it means
INTERPRETED_NA = NA("*", "the variant's time is Triton's interpreter's: no ratio or saving is derived from it")


def interpreted(manifest: Manifest | None) -> list[str]:
    """Variants whose kernel ran under Triton's interpreter (the manifest says so)."""
    if manifest is None:
        return []
    return [n for n, e in manifest.variants.items() if e.interpreted]


def _source_words(summary: Summary, source: str) -> str:
    """"no profiler, wall clock": the source and, for the reference pass, the clock it recorded."""
    t = summary.timing(source)
    words = SOURCE_WORDS.get(source, source)
    return f"{words}, {t.how}" if source == "reference" and t.clock is not None else words


def _fused_word(summary: Summary, name: str) -> str:
    v = summary.variants.get(name)
    if v is None or v.fused is None:
        return "unknown"
    if v.fell_back:
        return "fell back"
    if v.fused and v.rope == "fused":
        return "into rope"  # one launch rotates q and k and writes K and V
    return "yes" if v.fused else "no"


def compact_rows(summary: Summary, manifest: Manifest | None = None) -> tuple[list[Col], list[list[Cell]]]:
    """One row per variant, phase and size: the most trusted source's cost per write."""
    cmp = summary.comparison or {}
    baseline = str(cmp.get("baseline") or variants.BASELINE)
    layers = cmp.get("layers")
    order = list(summary.trusted_sources) + [s for s in source_names(TRUST_ORDER)
                                              if s not in summary.trusted_sources]
    by: dict[tuple[str, str, int], dict[str, dict[str, Any]]] = {}
    for g in summary.groups:
        if str(g.get("layer", "all")) == "all":
            by.setdefault((str(g["variant"]), str(g["phase"]), int(g["size"])), {})[str(g["source"])] = g
    compared = {(str(r["variant"]), str(r["source"]), str(r["phase"]), int(r["size"])): r
                for r in cmp.get("rows") or []}
    cpu = cpu_run(summary)
    marked = set(interpreted(manifest)) | {n for n, v in summary.variants.items() if v.interpreted}
    rank = {p: i for i, p in enumerate(PHASES)}
    keys = sorted(by, key=lambda k: (variants.order_key(k[0]), rank.get(k[1], len(PHASES)), k[2]))
    rows: list[list[Cell]] = []
    used: set[str] = set()
    for variant, phase, size in keys:
        sources = by[(variant, phase, size)]
        source = next((s for s in order if s in sources
                       and finite_or_none(sources[s].get("cost_per_write_ns")) is not None),
                      None)
        name = variant + (" *" if variant in marked else "")
        head: list[Cell] = [name, _fused_word(summary, variant), phase, str(size)]
        if source is None:
            why = NA("CPU: no GPU kernels") if cpu else NA("not measured")
            rows.append([*head, why, why, why, why])
            continue
        used.add(source)
        cost = _cost(sources[source]["cost_per_write_ns"]) or ""
        if variant == baseline:
            rows.append([*head, cost, SHORT_SOURCE.get(source, source), "baseline", "baseline"])
            continue
        c = compared.get((variant, source, phase, size))
        if c is None:
            ran = any(k[0] == baseline for k in by)
            missing = NA(f"{baseline} not by {source}") if ran else NA(f"no {baseline} run")
            rows.append([*head, cost, SHORT_SOURCE.get(source, source), missing, missing])
            continue
        ratio = finite_or_none(c.get("ratio_cost_per_write_ns"))
        saving = finite_or_none(c.get("saving_per_step_ms"))
        if saving is not None:
            saving_cell: Cell = f"{saving:.3f}"
        elif phase != "decode":
            saving_cell = NA(phase)
        else:
            saving_cell = NA("CPU") if cpu else NA("not measured")
        # the one rule (kvprof.analysis.figures): no ratio or saving derived from an interpreter's time
        if variant in marked or baseline in marked:
            rows.append([*head, cost, SHORT_SOURCE.get(source, source), INTERPRETED_NA, INTERPRETED_NA])
            continue
        rows.append([*head, cost, SHORT_SOURCE.get(source, source),
                     _ratio(ratio) if ratio is not None else NA("not measured"), saving_cell])
    per_step = f"ms per decode step, {baseline} minus the variant, x {layers} layers" if layers else \
        f"ms per decode step against {baseline}"
    if cpu:
        per_step += " (n/a on a CPU: its clock says nothing of a GPU's step)"
    fused_help = "one launch writes K and V"
    if any(v.rope == "fused" for v in summary.variants.values()):
        fused_help += "; into rope: the same launch rotates q and k"
    cols = [Col("variant", justify="left"), Col("fused", fused_help, "left"),
            Col("phase", justify="left"), Col("size", "batch (decode) or tokens (prefill)"),
            Col("µs/write", "median time one layer's write adds"),
            Col("src", "where it was timed: " + ", ".join(f"{SHORT_SOURCE.get(s, s)} = {_source_words(summary, s)}"
                                                          for s in order if s in used), "left"),
            Col("ratio", f"the variant's µs/write over {baseline}'s (the baseline)"),
            Col("saving/step", per_step)]
    return cols, rows


def run_line(manifest: Manifest | None, names: Callable[[str], str] = str) -> str | None:
    """What ran, from the manifest: model, layers per step, threads, device, interpreter (the
    capture settings it names spelled by ``names``)."""
    if manifest is None:
        return None
    cfg = manifest.config or {}
    shape = (cfg.get("resolved") or {}).get("shape") or {}
    model_layers, ran = shape.get("layers"), cfg.get("layers")
    parts = [f"{shape.get('model', cfg.get('model', '?'))} tp{shape.get('tp', cfg.get('tp', '?'))} "
             f"({shape.get('head_num', '?')}x{shape.get('head_dim', '?')} per rank), "
             f"{(cfg.get('resolved') or {}).get('cache_dtype', '?')}, on {manifest.device.get('name') or '?'}"
             f" ({manifest.device.get('type') or '?'})"]
    if isinstance(ran, int) and isinstance(model_layers, int):
        parts.append(f"each step wrote {ran} of the model's {model_layers} layers"
                     + (Words(" (", Setting("layers"), "; per-write figures do not depend on it)").render(names)
                        if ran != model_layers else ""))
    if cfg.get("context") == "layer":
        parts.append(Words("each write inside a decoder layer (", Setting("context"),
                           " layer): µs/write is what it adds to the layer").render(names))
        kernels = LayerKernels.from_json((cfg.get("resolved") or {}).get("layer"))
        if kernels is not None:
            parts.append(kernels.describe())
    if isinstance(cfg.get("threads"), int):
        parts.append(f"{cfg['threads']} torch thread{'s' if cfg['threads'] != 1 else ''}")
    how = (cfg.get("resolved") or {}).get("triton_interpret")
    marked = interpreted(manifest)
    if marked:
        parts.append(f"* {', '.join(marked)}: Triton's interpreter (TRITON_INTERPRET=1, {how or 'set'})")
    return "; ".join(parts)


def verdict_lines(summary: Summary, manifest: Manifest | None = None) -> list[str]:
    """Plain-language lines: what fused, what a write costs here and why, what next."""
    lines: list[str] = []
    ran = {n: v for n, v in summary.variants.items() if v.available}
    into_rope = [n for n, v in ran.items() if v.fused and v.rope == "fused"]
    fused = [n for n, v in ran.items() if v.fused and v.rope != "fused"]
    not_fused = [n for n, v in ran.items() if v.fused is False]
    unknown = [n for n, v in ran.items() if v.fused is None]
    if into_rope:
        lines.append(f"fused into rope (one launch rotates q and k and writes K and V): {', '.join(into_rope)}")
    if fused:
        lines.append("fused (one launch writes K and V): "
                     + ", ".join(n + (" (after a separate rotary kernel)" if ran[n].rope == "separate" else "")
                                 for n in fused))
    if not_fused:
        why = {n: ", ".join(p.replace("_", " ") for p in ran[n].paths) or "two copies" for n in not_fused}
        lines.append("not fused: " + "; ".join(f"{n} ({why[n]})" for n in not_fused))
    if unknown:
        lines.append(f"not decided (no paths or kernels to judge by): {', '.join(unknown)}")
    skipped = [(n, v.reason) for n, v in summary.variants.items() if not v.available]
    if skipped:
        lines.append("n/a here: " + "; ".join(f"{n} ({r or 'unavailable'})" for n, r in skipped))
    source = summary.trusted_sources[0] if summary.trusted_sources else None
    rows = [g for g in summary.groups if g.get("source") == source and g.get("phase") == "decode"]
    per: dict[str, list[tuple[float, str]]] = {}
    for g in rows:
        cost = _cost(g.get("cost_per_write_ns"))
        if cost:
            per.setdefault(str(g["variant"]), []).append((float(g.get("size") or 0), cost))
    if per:
        spans = []
        for n in variants.ordered(list(per)):
            costs = sorted(per[n], key=lambda sc: float(sc[1].replace(",", "")))
            spans.append(f"{n} {costs[0][1]}" + (f"-{costs[-1][1]}" if costs[-1][1] != costs[0][1] else ""))
        sizes = sorted({s for v in per.values() for s, _ in v})
        batch = f"batch {sizes[0]:g}" + (f"-{sizes[-1]:g}" if len(sizes) > 1 else "")
        lines.append(f"one layer's write here costs (decode, {batch}, µs, {source}): " + ", ".join(spans))
    marked = interpreted(manifest)
    if marked:
        lines.append(f"{', '.join(marked)} ran its Triton kernel in Triton's interpreter (numpy on the host): "
                     "that time is the interpreter's, not what the kernel costs on a GPU")
    if cpu_run(summary):
        lines.append("a CPU has no kernel launches, so what a fused write saves (one launch instead of two "
                     "per layer, at every decode step) does not show here; on a machine with a CUDA GPU the "
                     "same `python -m kvprof capture` runs every layer with compiled kernels and shows "
                     "launch-bound writes")
    else:
        h = (summary.comparison or {}).get("headline")
        if h:
            lines.append(f"{h['variant']} saves {h['saving_per_step_ms']:.3f} ms per decode step at batch "
                         f"{h['size']} against {summary.comparison['baseline']} "  # type: ignore[index]
                         f"({'measured' if h.get('measured') else 'projected'} over the model's layers)")
    bench_batch = (summary.comparison or {}).get("benchmark", {}).get("batch", 10)
    interp = set(marked) | {n for n, v in summary.variants.items() if v.interpreted}
    lines += saving_lines(summary.layer_steps, int(bench_batch), interp)  # a --context layer run only
    lines.append(f"the H200 samples (fused vs two-stream writes, both profilers): {dashboard_hint()}")
    return lines


def grouped_warnings(warnings: list[str]) -> list[str]:
    """Each warning once: the same sentence about several files becomes one line naming them."""
    files: dict[str, list[str]] = {}
    for w in warnings:
        head, sep, rest = w.partition(": ")
        if sep and "/" in head and " " not in head:  # "<path>: sentence", as the analysis words it
            files.setdefault(rest, []).append(head.rsplit("/", 1)[-1])
        else:
            files.setdefault(w, [])
    return [w if not names else f"{w} ({', '.join(names)})" for w, names in files.items()]


def render_verdict(summary: Summary, console: Any, manifest: Manifest | None = None) -> None:
    console.print(Text("What this run says", style="bold"))
    for line in verdict_lines(summary, manifest):
        console.print(Text(printable(f"  {line}")))


def render_first_run(summary: Summary, console: Any, manifest: Manifest | None = None,
                     run_dir: str | None = None, names: Callable[[str], str] = str) -> None:
    """The capture's whole summary: what ran, the compact table, the verdict, where next
    (``names`` spells the settings it names)."""
    line = run_line(manifest, names)
    if line:
        console.print(Text(printable(line)))
    cols, rows = compact_rows(summary, manifest)
    if rows:
        t, notes = table(None, cols, rows, collapse=False, compact=True, width=console.width)
        print_table(console, t, notes)
    render_verdict(summary, console, manifest)
    for line in grouped_warnings(summary.warnings):
        console.print(Text(printable(f"warning: {line}"), style="yellow"))
    console.print(Text("every table (reference pass, each profiler, observer effect, vs baseline): "
                       f"python -m kvprof analyze {run_dir or 'RUN_DIR'}"))


__all__ = ["compact_rows", "grouped_warnings", "interpreted", "render_first_run", "render_verdict",
           "run_line", "verdict_lines"]
