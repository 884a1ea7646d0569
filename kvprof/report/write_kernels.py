"""The console tables of analyze's write-kernel section (kvprof.analysis.write_kernels makes it):
kvprof write ranges outside kvprof steps, the SGLang plugin's write paths, KV-write kernels by name."""

from __future__ import annotations

from typing import Any

from kvprof.core.text import markup
from kvprof.report.cells import FitCol, fit_table, print_table


def render_write_kernels(section: dict[str, Any] | None, console: Any) -> None:
    """Per rank: kvprof-ranged writes outside kvprof steps, and the kernels matched by name
    (nothing for a summary made without the write-kernel section)."""
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
    # kvprof's own captures have their writes' numbers above; the name classifier is for the others
    rows = [t for t in section.get("traces") or [] if t.get("write_kernels") and not t.get("is_kvprof_capture")]
    if not rows:
        if any(t.get("gpu") and not t.get("kvprof_writes") for t in section.get("traces") or []):
            console.print("KV-write kernels by name: none matched"
                          + (f" (--write-kernels {markup(repr(section['user_regex']))})"
                             if section.get("user_regex") else ""))
        return
    cols = [FitCol("rank"), FitCol("family", "left"), FitCol("kernels", drop=6), FitCol("writes", drop=7),
            FitCol("GPU µs", drop=5), FitCol("µs/write"), FitCol("share of GPU", drop=4), FitCol("steps", drop=2),
            FitCol("step share (median)", drop=3), FitCol("trace", "left", wrap=True, drop=1)]
    body = []
    for t in sorted(rows, key=lambda t: (str(t.get("rank")), t["path"])):
        for f in t["families"]:
            body.append([
                t.get("rank"), f["family"], f["kernels"], f["writes"],
                f"{f['total_ns'] / 1000:.1f}", f"{f['per_write_ns'] / 1000:.2f}",
                f"{t['share'] * 100:.2f} %" if t.get("share") is not None else "n/a (no GPU time)",
                t.get("steps_count") or "n/a (no steps)",
                f"{t['step_share_median'] * 100:.2f} %" if t.get("step_share_median") is not None
                else "n/a (no steps)",
                str(t["path"]).rsplit("/", 1)[-1],
            ])
    print_table(console, *fit_table("KV-write kernels by name (per rank)", cols, body, console.width))


SIDECAR_WRITE_PATHS = ("set_kv_buffer", "fused into rope", "fallback")  # the plugin's write_paths keys


def render_sidecar_paths(sidecars: list[dict[str, Any]], console: Any) -> None:
    """Per SGLang process (the plugin's sidecars): which entry point wrote -- set_kv_buffer, or
    the rotary embedding with the store fused in -- and how often a named writer fell back."""
    rows = [s for s in sidecars if s.get("write_paths") or s.get("paths")]
    if not rows:
        return

    cols = [FitCol("TP rank"), FitCol("pid", drop=2), FitCol("writer", "left"),
            *(FitCol(k, wrap=True, min_wrap=8) for k in SIDECAR_WRITE_PATHS),
            FitCol("paths", "left", wrap=True, drop=1)]
    body = []
    for s in sorted(rows, key=lambda s: (str(s.get("tp_rank")), str(s.get("pid")))):
        counts = s.get("write_paths") or {}
        body.append([s.get("tp_rank"), s.get("pid"), s.get("writer") or "SGLang's own",
                     *(counts.get(k, 0) if counts else "n/a (older sidecar)" for k in SIDECAR_WRITE_PATHS),
                     ", ".join(f"{k} {v}" for k, v in (s.get("paths") or {}).items())])
    print_table(console, *fit_table("SGLang plugin: KV writes by path (counted in Python; graph replays are not)",
                                    cols, body, console.width))


def _fmt(v: Any, scale: float = 1000.0) -> str:
    """A figure, or n/a with why as every console table says it (kvprof.report.cells)."""
    return "n/a (not measured)" if v is None else (f"{v:g}" if scale == 1 else f"{v / scale:.2f}")
