"""SGLang's real MHATokenToKVPool on the GPU with kvprof's plugin, eagerly and in a CUDA graph.

Run by gpu/sglang_check.sh (which installs SGLang from carried wheels), under torch.profiler
(``--profiler torch``: a trace named as SGLang's profiler names it, ``<id>-TP-0.trace.json.gz``,
with ProfilerStep ranges) or under nsys (``--profiler none``, nsys started outside with
``--cuda-graph-trace=node``). The plugin is loaded through SGLang's own ``load_plugins()``
before the pool exists, as in a server. Each decode step writes every layer once; the
graph is captured after eager warm-up writes (which also compile store_cache's JIT module).
The bits of every write are checked against two index_put copies into a second pool.

``--path rope``: the writes a fused-rope model makes instead (Qwen3-MoE, GPT-OSS on CUDA with a
bf16 cache): SGLang's real rotary embedding (``get_rope``) called as those models call it, with
``create_fused_set_kv_buffer_arg`` in a forward context over the real pool, for layers x steps
eager writes (plus one rotation without a write per step, which must not count), under
torch.profiler; SGLang's JIT rope + store compiles with nvcc at the first call. Checked: the
plugin hooked SGLang's kernel wrapper, the sidecar counts exactly layers x steps writes fused
into rope, the K cache at the slots holds the rotated k bit for bit and the V cache v, and the
rotated k is the float32 reference within SGLang's bound (one bf16 ulp plus one float32 product
rounding: nvcc contracts multiply-adds), or bit for bit with ``KVPROF_SGLANG_WRITER=rope_triton_fused``.
Each step runs in a forward context with its batch, as ModelRunner runs one: the write ledger
must count every step and see every token asked of every layer.
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
    ap.add_argument("--path", choices=("set_kv_buffer", "rope"), default="set_kv_buffer")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("KVPROF_SGLANG", "1")
    os.environ.setdefault("KVPROF_SGLANG_DIR", args.out)
    if args.path == "rope":
        return rope_main(args)

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


def rope_main(args: argparse.Namespace) -> int:
    """SGLang's fused rope + store, through its real CUDA rotary embedding (see the module doc)."""
    from sglang.srt.plugins import load_plugins

    load_plugins()  # before the pool and the model exist, as in a server
    import sglang.kernels.ops.attention.rope as sgl_rope
    from sglang.srt.layers.rotary_embedding import base as rotary_base
    from sglang.srt.layers.rotary_embedding.factory import get_rope
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
    from sglang.srt.models.utils import create_fused_set_kv_buffer_arg, enable_fused_set_kv_buffer

    from kvprof.integrations.sglang import STATE
    from kvprof.kvcache.writers.rope_reference import rope_reference

    fn = sgl_rope.apply_rope_with_cos_sin_cache_inplace
    hooked = hasattr(fn, "__wrapped__") and rotary_base.apply_rope_with_cos_sin_cache_inplace is fn
    writer = os.environ.get("KVPROF_SGLANG_WRITER") or None
    print("rope + store hooked:", hooked, "writer:", writer or "SGLang's own", flush=True)
    if not hooked:
        return 1

    class Attn:  # what create_fused_set_kv_buffer_arg reads of SGLang's RadixAttention
        def __init__(self, i: int) -> None:
            self.layer_id, self.k_scale, self.v_scale = i, None, None

    class Backend:
        def __init__(self, pool: object) -> None:
            self.token_to_kv_pool = pool

    class Batch:  # a plain decode batch: no context parallelism, no DCP mask, no MoE padding
        def __init__(self, loc: torch.Tensor) -> None:
            self.out_cache_loc, self.forward_mode, self.dcp_kv_mask = loc, None, None
            self.moe_num_token_non_padded = None  # SGLang 0.5.23's forward_context reads it

    heads_q, heads, dim, size = 4 * args.heads, args.heads, args.head_dim, 16384
    with torch.device("cuda"):
        rotary = get_rope(dim, dim, 8192, 1000000, True, dtype=torch.bfloat16)
    pool = MHATokenToKVPool(size=size, page_size=1, dtype=torch.bfloat16, head_num=heads, head_dim=dim,
                            layer_num=args.layers, device="cuda", enable_memory_saver=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    steps = []
    for _ in range(args.steps):
        loc = (torch.randperm(size, device="cuda", generator=g)[: args.batch] + 1).long()
        pos = torch.randint(0, 8192, (args.batch,), device="cuda", generator=g)
        rows = [(torch.randn(args.batch, heads_q * dim, device="cuda", generator=g).bfloat16(),
                 torch.randn(args.batch, heads * dim, device="cuda", generator=g).bfloat16(),
                 torch.randn(args.batch, heads * dim, device="cuda", generator=g).bfloat16())
                for _ in range(args.layers)]
        steps.append((loc, pos, rows))

    ok = True
    with forward_context(ForwardContext(attn_backend=Backend(pool))):
        enabled = enable_fused_set_kv_buffer(Batch(steps[0][0]))
        print("enable_fused_set_kv_buffer (what the models ask):", enabled, flush=True)
        ok &= bool(enabled)

        def step(loc: torch.Tensor, pos: torch.Tensor, rows: list, check: bool) -> bool:
            # one forward step as ModelRunner opens it: a forward context with its batch (the ledger's step)
            with forward_context(ForwardContext(attn_backend=Backend(pool)), forward_batch=Batch(loc)):
                return step_writes(loc, pos, rows, check)

        def step_writes(loc: torch.Tensor, pos: torch.Tensor, rows: list, check: bool) -> bool:
            good = True
            for i, (q, k, v) in enumerate(rows):
                q, k = q.clone(), k.clone()
                if not check:  # the profiled steps: the writes only
                    rotary(pos, q, k, fused_set_kv_buffer_arg=create_fused_set_kv_buffer_arg(v, Attn(i), Batch(loc)))
                    continue
                ref_k = rope_reference(q.view(len(loc), -1, dim), k.view(len(loc), -1, dim),
                                       rotary.cos_sin_cache, pos, True)[1]
                before = k.view(len(loc), -1, dim).float().abs().amax(dim=-1, keepdim=True)
                _, k = rotary(pos, q, k, fused_set_kv_buffer_arg=create_fused_set_kv_buffer_arg(v, Attn(i), Batch(loc)))
                k3 = k.view(len(loc), -1, dim)
                good &= torch.equal(pool.k_buffer[i][loc], k3) and torch.equal(pool.v_buffer[i][loc], v.view_as(k3))
                diff = (k3.float() - ref_k.bfloat16().float()).abs()
                want = ref_k.bfloat16().float().abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
                bound = torch.finfo(torch.bfloat16).eps * torch.exp2(torch.floor(torch.log2(want)))
                bound = torch.zeros_like(bound) if writer else bound + before * 2.0**-23
                good &= bool((diff <= bound).all())
            q, k, _ = rows[0]
            rotary(pos, q.clone(), k.clone())  # the rotary embedding alone: no write, no count
            return good

        t = time.perf_counter()
        loc, pos, rows = steps[0]
        ok &= step(loc, pos, rows, True)  # compiles SGLang's JIT rope + store for this shape
        torch.cuda.synchronize()
        print(f"first step (JIT compile included): {time.perf_counter() - t:.1f} s; cache as SGLang's path "
              f"and the reference say: {ok}", flush=True)
        from torch.profiler import ProfilerActivity, profile

        name = os.path.join(args.out, f"{int(time.time())}-TP-0.trace.json.gz")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for loc, pos, rows in steps[1:]:
                ok &= step(loc, pos, rows, False)
            torch.cuda.synchronize()
        prof.export_chrome_trace(name)
        for loc, pos, rows in steps[1:]:  # the profiled steps again, checked
            ok &= step(loc, pos, rows, True)
        torch.cuda.synchronize()
    print("trace:", name, flush=True)
    STATE.write_sidecar()
    writes = 2 * args.layers * (len(steps) - 1) + args.layers  # every step checked, the profiled ones twice
    counted = STATE.write_paths.get("fused into rope", 0)
    print(json.dumps({"paths": STATE.paths, "write_paths": STATE.write_paths, "fallbacks": STATE.fallbacks,
                      "unattributed": STATE.unattributed, "expected_writes": writes}), flush=True)
    ok &= counted == writes and not STATE.fallbacks and not STATE.unattributed
    print(f"writes fused into rope counted: {counted} of {writes}; caches and rotation checked: {ok}", flush=True)
    ledger = STATE.ledger.record()
    asked = {str(i): args.batch * (2 * len(steps) - 1) for i in range(args.layers)}
    seen_all = ledger is not None and ledger.steps == 2 * len(steps) - 1 and ledger.expected == asked \
        and ledger.seen == asked
    print(f"write ledger: {ledger.steps if ledger else 0} steps, tokens asked {ledger.expected if ledger else None}, "
          f"seen {ledger.seen if ledger else None}: every write seen: {seen_all}", flush=True)
    ok &= seen_all
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
