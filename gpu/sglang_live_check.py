"""Check, on a GPU, that a run the SGLang plugin recorded reads as kvprof's own captures do.

Run by ``bash gpu/sglang_check.sh install live`` on the folder ``gpu/sglang_pool.py --profiler torch``
wrote (SGLang's real MHATokenToKVPool: eager steps, then replays of one CUDA graph captured with
the plugin on). Checked, each printed with PASS or FAIL (exit 1 on any FAIL):

- the sidecar records this device by name with a positive peak and its source (the spec table
  for a GPU it lists, else the device's properties), and analyze's summary carries the same;
- the sidecar records one captured graph whose writes are the layers in order, each with the
  kernel the trace shows (SGLang's store_kvcache_kernel, or the writer's);
- analyze ties every replayed write kernel to its write: ``steps x layers`` writes attributed
  by graph order, one kernel each, every layer ``steps`` times, and no replay left untied;
- the variant's verdict comes from the plugin's paths and agrees with the kernel count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import kvprof.api as kv
from kvprof.core.sidecar import PLUGIN_SOURCE


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {what}", flush=True)

    loaded = kv.open_run(Path(args.folder))
    (side,) = loaded.sidecars
    dev = side.device
    gpu = torch.cuda.get_device_name(0)
    check(dev is not None and dev.name == gpu and (dev.peak_bandwidth_gbs or 0) > 0
          and dev.peak_bandwidth_source in ("spec table", "device properties"),
          f"sidecar device {gpu}: peak {dev.peak_bandwidth_gbs if dev else None} GB/s "
          f"({dev.peak_bandwidth_source if dev else None}; computed from the properties: "
          f"{dev.peak_bandwidth_computed_gbs if dev else None})")
    summary = kv.analyze(loaded, write_kernels=True)
    s = summary.summary
    check((s.device.get("peak_bandwidth_gbs") or 0) > 0 and bool(s.device.get("peak_bandwidth_source")),
          f"summary device peak {s.device.get('peak_bandwidth_gbs')} GB/s ({s.device.get('peak_bandwidth_source')})")

    graphs = side.graphs or []
    check(len(graphs) == 1 and [w.layer for w in graphs[0].writes] == list(range(args.layers))
          and all(w.kernel for w in graphs[0].writes),
          f"sidecar graphs: {[(g.graph, [(w.layer, w.kernel) for w in g.writes]) for g in graphs]}")
    kernel = graphs[0].writes[0].kernel if graphs and graphs[0].writes else None

    w = summary.writes
    replayed = w[w["attribution"] == "graph_order"]
    check(len(replayed) == args.steps * args.layers,
          f"graph-replayed writes attributed: {len(replayed)} (expected {args.steps} x {args.layers})")
    counts = replayed["layer"].value_counts().to_dict()
    check(counts == {layer: args.steps for layer in range(args.layers)}, f"writes per layer: {counts}")
    check(bool(len(replayed)) and (replayed["gpu_ops"] == 1).all()
          and replayed["kernel_names"].astype(str).str.contains(str(kernel), regex=False).all(),
          f"one kernel per replayed write, named {kernel}: {sorted(set(replayed['kernel_names'].astype(str)))}")
    untied = [m for m in s.warnings if "graph replays lie outside" in m or "counted by name only" in m]
    check(not untied, f"no replay left untied: {untied}")
    print("replayed write GPU span, median ns:", replayed["gpu_span_ns"].median(), flush=True)

    variant = side.writer or "sglang_mha"
    v = s.variants.get(variant)
    check(v is not None and v.fused is True and v.agree is True and v.paths_source == PLUGIN_SOURCE,
          f"verdict {variant}: {v.verdict_word() if v else None} · paths say {v.paths_said() if v else None} · "
          f"GPU ops/write {v.kernel_counts.get('gpu_ops_per_write') if v else None}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
