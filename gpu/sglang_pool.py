"""SGLang's real MHATokenToKVPool on the GPU with kvprof's plugin, eagerly and in a CUDA graph.

Run by gpu/sglang_check.sh (which installs SGLang from carried wheels), under torch.profiler
(``--profiler torch``: a trace named as SGLang's profiler names it, ``<id>-TP-0.trace.json.gz``,
with ProfilerStep ranges) or under nsys (``--profiler none``, nsys started outside with
``--cuda-graph-trace=node``). The plugin is loaded through SGLang's own ``load_plugins()``
before the pool exists, as in a server. Each decode step writes every layer once; the
graph is captured after eager warm-up writes (which also compile store_cache's JIT module).
The bits of every write are checked against two index_put copies into a second pool.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--profiler", choices=("torch", "none"), default="torch")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--heads", type=int, default=1)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("KVPROF_SGLANG", "1")
    os.environ.setdefault("KVPROF_SGLANG_DIR", args.out)

    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    hooked = hasattr(MHATokenToKVPool.set_kv_buffer, "__wrapped__")
    print("plugin hooked:", hooked, "writer:", os.environ.get("KVPROF_SGLANG_WRITER") or "SGLang's own", flush=True)
    if not hooked:
        return 1

    class Layer:
        def __init__(self, i: int) -> None:
            self.layer_id = i

    size = 16384
    pool = MHATokenToKVPool(size=size, page_size=1, dtype=torch.bfloat16, head_num=args.heads,
                            head_dim=args.head_dim, layer_num=args.layers, device="cuda", enable_memory_saver=False)
    ref = [torch.zeros_like(b) for b in pool.k_buffer], [torch.zeros_like(b) for b in pool.v_buffer]
    layers = [Layer(i) for i in range(args.layers)]
    g = torch.Generator(device="cuda").manual_seed(0)
    loc = (torch.randperm(size, device="cuda", generator=g)[: args.batch] + 1).long()
    k = torch.randn(args.layers, args.batch, args.heads, args.head_dim, device="cuda", generator=g).bfloat16()
    v = torch.randn_like(k)

    def step() -> None:
        for i in range(args.layers):
            pool.set_kv_buffer(layers[i], loc, k[i], v[i], None, None)

    t = time.perf_counter()
    step()  # eager: compiles store_cache's module for this row width
    torch.cuda.synchronize()
    print(f"first eager step (JIT compile included): {time.perf_counter() - t:.1f} s", flush=True)
    for i in range(args.layers):
        ref[0][i][loc] = k[i]
        ref[1][i][loc] = v[i]
    # store_cache skips the reserved slot 0; loc never holds it, so every slot must match
    same = all(torch.equal(a, b) for a, b in zip(pool.k_buffer + pool.v_buffer, ref[0] + ref[1]))
    print("eager write matches index_put bit for bit:", same, flush=True)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    k.add_(1)  # new rows, replayed through the graph
    v.add_(1)
    graph.replay()
    torch.cuda.synchronize()
    for i in range(args.layers):
        ref[0][i][loc] = k[i]
        ref[1][i][loc] = v[i]
    same_graph = all(torch.equal(a, b) for a, b in zip(pool.k_buffer + pool.v_buffer, ref[0] + ref[1]))
    print("graph replay matches index_put bit for bit:", same_graph, flush=True)

    def run_steps() -> None:
        for _ in range(args.steps):  # eager steps: per-write attribution through correlation ids
            step()
        for _ in range(args.steps):  # graph replays: kernels by name (torch) or graph nodes (nsys)
            graph.replay()

    if args.profiler == "torch":
        from torch.profiler import ProfilerActivity, profile, schedule

        n = 2 * args.steps
        name = os.path.join(args.out, f"{int(time.time())}-TP-0.trace.json.gz")
        # one warm-up step, then exactly one active cycle of n steps, exported when it ends
        # (a schedule's cycle clears its events once over, so the export must be its handler)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                     schedule=schedule(wait=0, warmup=1, active=n, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(name)) as prof:
            step()
            torch.cuda.synchronize()
            prof.step()
            for _ in range(args.steps):
                step()
                torch.cuda.synchronize()
                prof.step()
            for _ in range(args.steps):
                graph.replay()
                torch.cuda.synchronize()
                prof.step()
        print("trace:", name, flush=True)
    else:
        run_steps()  # nsys records the whole process, graph capture included
        torch.cuda.synchronize()
    from kvprof.integrations.sglang import STATE

    STATE.write_sidecar()
    print(json.dumps({"paths": STATE.paths, "fallbacks": STATE.fallbacks,
                      "pools": [p.get("native_path") for p in STATE.pools.values()]}), flush=True)
    return 0 if same and same_graph else 2


if __name__ == "__main__":
    sys.exit(main())
