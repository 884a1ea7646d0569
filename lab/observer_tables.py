#!/usr/bin/env python3
"""The tables of docs/observer-effect.md, from analysed run directories.

    python lab/observer_tables.py traces/samples/h200-llama70b-tp8
    python lab/observer_tables.py --settings lab/results/observer-settings/nsys-{node,graph}
    python lab/observer_tables.py --layer RUN_LAYER                 # writes inside a decoder layer

Reads only each run's summary.json and step_timings.json (what `kvprof analyze` and
`kvprof capture` wrote), and prints Markdown, so every figure in the doc can be re-made.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import orjson

from kvprof.core.timings import StepTimings


def _load(run: Path) -> tuple[dict[str, Any], StepTimings]:
    try:
        summary = orjson.loads((run / "summary.json").read_bytes())
        timings = StepTimings.from_json((run / "step_timings.json").read_bytes())
    except (OSError, ValueError) as exc:
        sys.exit(f"observer_tables.py: error: {run}: {exc}")
    return summary, timings


def _us(ns: Any, digits: int = 2) -> str:
    return "n/a" if not isinstance(ns, (int, float)) else f"{ns / 1000:.{digits}f}"


def _x(r: Any) -> str:
    return "n/a" if not isinstance(r, (int, float)) else f"{r:.2f}x"


def observer(run: Path) -> None:
    summary, _ = _load(run)
    rows = {(r["variant"], r["source"], r["phase"], r["size"]): r for r in summary["observer"]["rows"]}
    ref = {(g["variant"], g["phase"], g["size"]): g for g in summary["groups"]
           if g["source"] == "reference" and str(g["layer"]) == "all"}
    print(f"Run `{run.name}`: per-write cost in µs (reading / reference; how much the profiled run itself "
          "was slowed per step)\n")
    print("| variant | phase | size | reference | torch.profiler | Nsight Systems |")
    print("|---|---|---|---|---|---|")
    for (variant, phase, size), g in sorted(ref.items(), key=lambda kv: (kv[0][1] != "decode", kv[0][0], kv[0][2])):
        cells = [variant, phase, str(size), f"{_us(g['cost_per_write_ns'])} (IQR of steps {_us(g['step_iqr_ns'], 1)})"]
        for source in ("kineto", "nsys"):
            r = rows.get((variant, source, phase, size))
            cells.append("n/a" if r is None else
                         f"{_us(r['cost_per_write_ns'])} ({_x(r['ratio_per_write'])}; run {_x(r['pass_slowdown'])})")
        print("| " + " | ".join(cells) + " |")
    for source, st in summary["observer"]["sources"].items():
        print(f"\n{source}: {st['flagged']} of {st['points']} points more than 10 % off; median reading / "
              f"reference {_x(st['median_ratio_per_write'])}, median slowdown of the run "
              f"{_x(st['median_pass_slowdown'])}")
    head = (summary.get("comparison") or {}).get("headline")
    if head:
        print(f"\nheadline: {head['variant']} at decode bs={head['size']} ({head['source']}): "
              f"{head['saving_per_step_ms']:.3f} ms per step, ITL {head['predicted_itl_ms']:.2f} ms predicted")


def settings(runs: list[Path]) -> None:
    print("Median step time of decode graph replays, µs: the unprofiled reference, then each profiled "
          "pass's own steps timed with the same CUDA events (and its slowdown)\n")
    print("| run | variant | bs | reference | torch.profiler pass | Nsight Systems pass |")
    print("|---|---|---|---|---|---|")
    for run in runs:
        try:
            timings = StepTimings.from_json((run / "step_timings.json").read_bytes())
        except (OSError, ValueError) as exc:
            sys.exit(f"observer_tables.py: error: {run}: {exc}")
        cfg = orjson.loads((run / "manifest.json").read_bytes())["config"]
        sync = "on" if cfg.get("torch_sync_events") else "off"
        label = f"nsys {cfg.get('nsys_graph_trace')}, torch sync events {sync}"
        by = {(r.pass_, r.variant, r.size): r for r in timings.records if r.phase == "decode"}
        for (p, variant, size), ref in sorted(by.items()):
            if p != "reference":
                continue
            cells = [label, variant, str(size), _us(ref.median_ns, 1)]
            for source in ("kineto", "nsys"):
                own = by.get((source, variant, size))
                cells.append("n/a" if own is None else f"{_us(own.median_ns, 1)} ({_x(own.median_ns / ref.median_ns)})")
            print("| " + " | ".join(cells) + " |")


def layer(run: Path) -> None:
    summary, timings = _load(run)
    groups = [g for g in summary["groups"] if g["source"] == "reference" and str(g["layer"]) == "all"]
    cmp = {(r["variant"], r["source"], r["size"]): r for r in (summary.get("comparison") or {}).get("rows") or []}
    base = (summary.get("comparison") or {}).get("baseline")
    print(f"Run `{run.name}` (context {timings.context}, {timings.context_len} cached tokens per request): "
          f"reference step times, µs (median, IQR), and the saving per step against {base}, ms\n")
    print("| variant | bs | step | IQR | write adds / write | write share | writes alone | saving measured "
          "(± IQRs) | saving projected |")
    print("|---|---|---|---|---|---|---|---|---|")
    for g in sorted(groups, key=lambda g: (g["phase"] != "decode", g["size"], g["variant"])):
        c = cmp.get((g["variant"], "reference", g["size"]), {})
        meas = c.get("measured_saving_per_step_ms")
        spread = c.get("measured_saving_spread_ms")
        share = g.get("write_share")
        print("| " + " | ".join([
            g["variant"], str(g["size"]), _us(g["step_ns"], 1), _us(g["step_iqr_ns"], 1), _us(g["cost_per_write_ns"]),
            f"{share * 100:.1f} %" if isinstance(share, (int, float)) else "n/a", _us(g["writes_only_step_ns"], 1),
            "baseline" if g["variant"] == base else ("n/a" if meas is None else
                                                     f"{meas:.3f} (± {spread:.3f})" if spread is not None
                                                     else f"{meas:.3f}"),
            "baseline" if g["variant"] == base else ("n/a" if c.get("projected_saving_per_step_ms") is None
                                                     else f"{c['projected_saving_per_step_ms']:.3f}"),
        ]) + " |")
    rows = [r for r in summary["observer"]["rows"] if r["phase"] == "decode"]
    for source in ("kineto", "nsys"):
        slow = [r["pass_slowdown"] for r in rows if r["source"] == source and r["pass_slowdown"]]
        ratio = [r["ratio_per_step"] for r in rows if r["source"] == source and r["ratio_per_step"]]
        if slow:
            print(f"\n{source}: decode steps in the profiled pass {statistics.median(slow):.2f}x the reference "
                  f"(median; {min(slow):.2f}-{max(slow):.2f}x), its step reading {statistics.median(ratio):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--settings", action="store_true")
    mode.add_argument("--layer", action="store_true")
    args = ap.parse_args()
    if args.settings:
        settings(args.runs)
    elif args.layer:
        for run in args.runs:
            layer(run)
    else:
        for run in args.runs:
            observer(run)


if __name__ == "__main__":
    main()
