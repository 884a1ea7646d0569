"""The console tables of analyze's write-kernel section (kvprof.analysis.write_kernels makes it):
kvprof write ranges outside kvprof steps, the SGLang plugin's write paths, KV-write kernels by name."""

from __future__ import annotations

from typing import Any

from kvprof.core.text import markup


def render_write_kernels(section: dict[str, Any] | None, console: Any) -> None:
    """Per rank: kvprof-ranged writes outside kvprof steps, and the kernels matched by name
    (nothing for a summary made without the write-kernel section)."""
    if section is None:
        return
    from rich.table import Table

    stepless = section.get("stepless_writes") or []
    if stepless:
        t = Table(title="kvprof write ranges outside kvprof steps (e.g. SGLang's plugin), per rank, median",
                  title_justify="left")
        for col in ("rank", "variant", "writes", "layers", "graph", "kern/wr", "GPU span µs", "GPU busy µs",
                    "host µs", "launch→GPU µs"):
            t.add_column(col, justify="left" if col == "variant" else "right", no_wrap=True)
        for r in stepless:
            t.add_row(markup(r["rank"]), markup(r["variant"]), markup(r["writes"]), markup(r["layers"]),
                      markup(r["graph_writes"]),
                      _fmt(r["kernels_per_write"], 1), _fmt(r["gpu_span_ns"]), _fmt(r["gpu_busy_ns"]),
                      _fmt(r["host_ns"]), _fmt(r["launch_delay_ns"]))
        console.print(t)
    render_sidecar_paths(section.get("sidecars") or [], console)
    # kvprof's own captures have their writes' numbers above; the name classifier is for the others
    rows = [t for t in section.get("traces") or [] if t.get("write_kernels") and not t.get("is_kvprof_capture")]
    if not rows:
        if any(t.get("gpu") and not t.get("kvprof_writes") for t in section.get("traces") or []):
            console.print("KV-write kernels by name: none matched"
                          + (f" (--write-kernels {markup(repr(section['user_regex']))})"
                             if section.get("user_regex") else ""))
        return
    table = Table(title="KV-write kernels by name (per rank)", title_justify="left")
    for col in ("rank", "family", "kernels", "writes", "GPU µs", "µs/write", "share of GPU", "steps",
                "step share (median)", "trace"):
        table.add_column(col, justify="left" if col in ("family", "trace") else "right", no_wrap=True)
    for t in sorted(rows, key=lambda t: (str(t.get("rank")), t["path"])):
        for f in t["families"]:
            table.add_row(
                markup(t.get("rank")), markup(f["family"]), markup(f["kernels"]), markup(f["writes"]),
                f"{f['total_ns'] / 1000:.1f}", f"{f['per_write_ns'] / 1000:.2f}",
                f"{t['share'] * 100:.2f} %" if t.get("share") is not None else "n/a (no GPU time)",
                markup(t.get("steps_count") or "n/a (no steps)"),
                f"{t['step_share_median'] * 100:.2f} %" if t.get("step_share_median") is not None
                else "n/a (no steps)",
                markup(str(t["path"]).rsplit("/", 1)[-1][:60]),
            )
    console.print(table)


SIDECAR_WRITE_PATHS = ("set_kv_buffer", "fused into rope", "fallback")  # the plugin's write_paths keys


def render_sidecar_paths(sidecars: list[dict[str, Any]], console: Any) -> None:
    """Per SGLang process (the plugin's sidecars): which entry point wrote -- set_kv_buffer, or
    the rotary embedding with the store fused in -- and how often a named writer fell back."""
    rows = [s for s in sidecars if s.get("write_paths") or s.get("paths")]
    if not rows:
        return
    from rich.table import Table

    t = Table(title="SGLang plugin: KV writes by path (counted in Python; graph replays are not)",
              title_justify="left")
    for col in ("TP rank", "pid", "writer", *SIDECAR_WRITE_PATHS, "paths"):
        t.add_column(col, justify="left" if col in ("writer", "paths") else "right", no_wrap=col != "paths")
    for s in sorted(rows, key=lambda s: (str(s.get("tp_rank")), str(s.get("pid")))):
        counts = s.get("write_paths") or {}
        t.add_row(markup(s.get("tp_rank")), markup(s.get("pid")), markup(s.get("writer") or "SGLang's own"),
                  *(markup(counts.get(k, 0)) if counts else "n/a (older sidecar)" for k in SIDECAR_WRITE_PATHS),
                  markup(", ".join(f"{k} {v}" for k, v in (s.get("paths") or {}).items())))
    console.print(t)


def _fmt(v: Any, scale: float = 1000.0) -> str:
    """A figure, or n/a with why as every console table says it (kvprof.report.cells)."""
    return "n/a (not measured)" if v is None else (f"{v:g}" if scale == 1 else f"{v / scale:.2f}")
