"""The console tables of analyze's write-kernel section (kvprof.analysis.write_kernels makes it):
kvprof write ranges outside kvprof steps, the SGLang plugin's write paths, KV-write kernels by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvprof.core.errors import Setting, Words
from kvprof.core.text import markup, printable
from kvprof.report.cells import FitCol, fit_table, print_table


def render_write_kernels(section: dict[str, Any] | None, console: Any, names: Callable[[str], str] = str) -> None:
    """Per rank: kvprof-ranged writes outside kvprof steps, and the kernels matched by name
    (nothing for a summary made without the write-kernel section); ``names`` spells the user's
    pattern's setting."""
    if section is None:
        return

    stepless = section.get("stepless_writes") or []
    if stepless:
        cols = [FitCol("rank"), FitCol("variant", "left"), FitCol("writes", drop=6), FitCol("layers", drop=4),
                FitCol("graph", drop=3), FitCol("kern/wr", drop=5), FitCol("GPU span µs", drop=7),
                FitCol("GPU busy µs", drop=2), FitCol("host µs", drop=8), FitCol("launch→GPU µs", drop=1)]
        print_table(console, *fit_table(
            "kvprof write ranges outside kvprof steps (e.g. SGLang's plugin), per rank, median", cols,
            [[r["rank"], r["variant"], r["writes"], r["layers"], r["graph_writes"], _fmt(r["kernels_per_write"], 1),
              _fmt(r["gpu_span_ns"]), _fmt(r["gpu_busy_ns"]), _fmt(r["host_ns"]), _fmt(r["launch_delay_ns"])]
             for r in stepless], console.width))
    render_sidecar_paths(section.get("sidecars") or [], console)
    render_ledgers(section.get("sidecars") or [], console)
    render_shadow(section.get("sidecars") or [], console)
    # kvprof's own captures have their writes' numbers above; the name classifier is for the others
    rows = [t for t in section.get("traces") or [] if t.get("write_kernels") and not t.get("is_kvprof_capture")]
    if not rows:
        if any(t.get("gpu") and not t.get("kvprof_writes") for t in section.get("traces") or []):
            console.print("KV-write kernels by name: none matched"
                          + (Words(" (", Setting("write_kernel_regex"), f" {markup(repr(section['user_regex']))})")
                             .render(names) if section.get("user_regex") else ""))
        return
    cols = [FitCol("rank"), FitCol("family", "left"), FitCol("kernels", drop=6), FitCol("writes", drop=7),
            FitCol("GPU µs", drop=5), FitCol("µs/write"), FitCol("share of GPU", drop=4), FitCol("steps", drop=2),
            FitCol("step share (median)", drop=3), FitCol("tied", drop=9), FitCol("replayed", drop=8),
            FitCol("trace", "left", wrap=True, drop=1)]
    body = []
    for t in sorted(rows, key=lambda t: (str(t.get("rank")), t["path"])):
        graph = t.get("graph") or {}
        for f in t["families"]:
            body.append([
                t.get("rank"), f["family"], f["kernels"], f["writes"],
                f"{f['total_ns'] / 1000:.1f}", f"{f['per_write_ns'] / 1000:.2f}",
                f"{t['share'] * 100:.2f} %" if t.get("share") is not None else "n/a (no GPU time)",
                t.get("steps_count") or "n/a (none found)",
                f"{t['step_share_median'] * 100:.2f} %" if t.get("step_share_median") is not None
                else "n/a (none found)",
                f"{t.get('tied_step_and_layer', 'n/a')} of {t.get('write_kernels')}",
                f"{graph.get('replayed_write_kernels', 'n/a')} of {graph.get('launches', 0)} replays",
                str(t["path"]).rsplit("/", 1)[-1],
            ])
    print_table(console, *fit_table("KV-write kernels by name (per rank; tied: to a step and a layer; replayed: "
                                    "write kernels in CUDA graph replays)", cols, body, console.width))
    for t in sorted(rows, key=lambda t: (str(t.get("rank")), t["path"])):
        render_engine_steps(t, console)


SIDECAR_WRITE_PATHS = ("set_kv_buffer", "fused into rope", "fallback")  # the plugin's write_paths keys


def render_sidecar_paths(sidecars: list[dict[str, Any]], console: Any) -> None:
    """Per SGLang process (the plugin's sidecars): which entry point wrote -- set_kv_buffer, or
    the rotary embedding with the store fused in -- and how often a named writer fell back."""
    rows = [s for s in sidecars if s.get("write_paths") or s.get("paths")]
    if not rows:
        return

    from kvprof.core.sidecar import ENGINE_NAMES

    engines = sorted({ENGINE_NAMES.get(str(s.get("engine") or "sglang"), str(s.get("engine"))) for s in rows})
    cols = [FitCol("TP rank"), FitCol("pid", drop=2), FitCol("writer", "left"),
            *(FitCol(k, wrap=True, min_wrap=8) for k in SIDECAR_WRITE_PATHS),
            FitCol("shadow check", "left", wrap=True, min_wrap=8, drop=3),
            FitCol("paths", "left", wrap=True, drop=1)]
    body = []
    for s in sorted(rows, key=lambda s: (str(s.get("tp_rank")), str(s.get("pid")))):
        counts = s.get("write_paths") or {}
        body.append([s.get("tp_rank"), s.get("pid"), s.get("writer") or
                     f"{ENGINE_NAMES.get(str(s.get('engine') or 'sglang'), str(s.get('engine')))}'s own",
                     *(counts.get(k, 0) if counts else "n/a (older sidecar)" for k in SIDECAR_WRITE_PATHS),
                     shadow_cell(s.get("shadow")),
                     ", ".join(f"{k} {v}" for k, v in (s.get("paths") or {}).items())])
    print_table(console, *fit_table(f"{' and '.join(engines)} plugin: KV writes by path (counted in Python; "
                                    "graph replays are not)", cols, body, console.width))


def shadow_cell(shadow: Any) -> str:
    """The shadow check's counts in the plugin table: off, or checked / WRONG / skipped."""
    if not isinstance(shadow, dict):
        return "off"
    wrong = shadow.get("mismatched") or 0
    skipped = sum(v for v in (shadow.get("skipped") or {}).values() if isinstance(v, int))
    return (f"1 in {shadow.get('every')}: {shadow.get('checked') or 0} checked, "
            + (f"{wrong} WRONG" if wrong else "0 wrong") + f", {skipped} skipped")


def ledger_lines(sidecar: dict[str, Any]) -> tuple[list[tuple[str, int, int, int]], list[str]]:
    """One sidecar's write ledger: rows (layer, tokens asked, tokens seen, unseen) for the layers
    that differ, and the lines to print (every write seen, or where the unseen ones went)."""
    ledger = sidecar.get("ledger") or {}
    who = f"{sidecar.get('engine') or 'sglang'} TP {sidecar.get('tp_rank')} pid {sidecar.get('pid')}"
    expected = {str(k): int(v) for k, v in (ledger.get("expected") or {}).items()}
    seen = {str(k): int(v) for k, v in (ledger.get("seen") or {}).items()}
    steps, graph_steps = int(ledger.get("steps") or 0), int(ledger.get("graph_steps") or 0)
    layers = sorted(set(expected) | set(seen), key=lambda k: (len(k), k))
    rows = [(k, expected.get(k, 0), seen.get(k, 0), expected.get(k, 0) - seen.get(k, 0)) for k in layers
            if expected.get(k, 0) != seen.get(k, 0)]
    lines = []
    asked = sum(expected.values())
    graphs = (f"; {graph_steps} of them replayed CUDA graphs (their writes are the graph record's, not "
              "counted here)") if graph_steps else ""
    if not rows:
        lines.append(f"write ledger ({who}): every write was seen: {asked:,} tokens asked of {len(expected)} "
                     f"layers over {steps} steps{graphs}")
        return rows, lines
    unseen = sum(r[3] for r in rows if r[3] > 0)
    lines.append(f"write ledger ({who}): {unseen:,} of {asked:,} tokens asked were written where no hook saw "
                 f"them, over {steps} steps{graphs}")
    paths = ledger.get("unseen_paths") or {}
    if paths:
        lines.append("  the engine took these paths around the hooked writes: " +
                     "; ".join(f"{k} ({v:,} tokens)" for k, v in sorted(paths.items())))
    else:
        lines.append("  no hook named their path (a kernel kvprof does not hook wrote them)")
    if any(r[3] < 0 for r in rows):
        lines.append("  layers with more tokens seen than asked: writes outside the engine's steps "
                     "(a warm-up, or a caller of the pool's own)")
    return rows, lines


def render_ledgers(sidecars: list[dict[str, Any]], console: Any) -> None:
    """Per engine process with a ledger: every write seen, or the layers whose writes no hook saw."""
    for s in sorted(sidecars, key=lambda s: (str(s.get("tp_rank")), str(s.get("pid")))):
        if not s.get("ledger"):
            continue
        rows, lines = ledger_lines(s)
        if rows:
            print_table(console, *fit_table(
                "write ledger: tokens asked of each layer against tokens its hooks saw",
                [FitCol("layer"), FitCol("asked"), FitCol("seen"), FitCol("unseen")],
                [["no layer" if layer == "-1" else layer, f"{asked:,}", f"{seen:,}", f"{unseen:,}"]
                 for layer, asked, seen, unseen in rows], console.width))
        for line in lines:
            console.print(printable(line), markup=False, highlight=False)


def render_shadow(sidecars: list[dict[str, Any]], console: Any) -> None:
    """Per engine process whose plugin ran the shadow check: its counts, a mismatch in red; and the
    violations SGLang's own KV canary reported, in red."""
    import msgspec

    from kvprof.core.sidecar import Sidecar, canary_lines, shadow_lines

    for s in sorted(sidecars, key=lambda s: (str(s.get("tp_rank")), str(s.get("pid")))):
        if not s.get("shadow") and not s.get("canary"):
            continue
        try:
            doc = msgspec.convert(s, Sidecar)
        except msgspec.ValidationError as exc:  # a tampered summary: said, not raised
            console.print(f"shadow check: not readable ({markup(' '.join(str(exc).split())[:200])})")
            continue
        canary = canary_lines(doc)
        for i, line in enumerate(canary):
            console.print(f"[bold red]{markup(line)}[/bold red]" if i == 0 else printable(line),
                          markup=i == 0, highlight=False, soft_wrap=True)
        wrong, lines = shadow_lines(doc)
        for i, line in enumerate(lines):
            if wrong and i == 0:
                console.print(f"[bold red]{markup(line)}[/bold red]", soft_wrap=True)
            else:
                console.print(printable(line), markup=False, highlight=False, soft_wrap=True)


def _fmt(v: Any, scale: float = 1000.0) -> str:
    """A figure, or n/a with why as every console table says it (kvprof.report.cells)."""
    return "n/a (not measured)" if v is None else (f"{v:g}" if scale == 1 else f"{v / scale:.2f}")


STEPS_PRINTED = 12


def render_engine_steps(t: dict[str, Any], console: Any) -> None:
    """One trace's steps: the method that found them (or why none was found), the kernels not tied
    and why, and the first steps with their writes and share of the GPU's busy time."""
    plain = str(t["path"]).rsplit("/", 1)[-1]
    name = markup(plain)
    if t.get("no_steps_reason"):
        console.print(f"{name}: {markup(t['no_steps_reason'])}")
        return
    if not t.get("step_method"):
        return
    console.print(f"{name}: steps from {markup(t['step_method'])}")
    for u in t.get("unassigned") or []:
        console.print(f"  {markup(u['kernels'])} write kernels not tied to a layer: {markup(u['reason'])}")
    steps = t.get("steps") or []
    if not steps:
        return
    cols = [FitCol("step", "left", wrap=True), FitCol("writes", drop=5), FitCol("layers", drop=3),
            FitCol("write µs"), FitCol("GPU busy µs", drop=4), FitCol("share", drop=2),
            FitCol("graph launch", drop=1)]
    body = [[s["step"], s.get("writes"), s.get("layers"), _fmt(s.get("write_ns")), _fmt(s.get("gpu_busy_ns")),
             f"{s['share'] * 100:.2f} %" if s.get("share") is not None else "n/a (no GPU time)",
             s["graph_launch"] if s.get("graph_launch") is not None else "eager"]
            for s in steps[:STEPS_PRINTED]]
    print_table(console, *fit_table(f"steps of {plain} (first {min(len(steps), STEPS_PRINTED)} of "
                                    f"{t.get('steps_count')})", cols, body, console.width))
