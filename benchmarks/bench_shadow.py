"""What the engine plugins' shadow check (``KVPROF_<ENGINE>_SHADOW=N``) adds to a hooked KV write.

Times one layer's write through the plugin's hook, eagerly, per call: without the plugin (the
engine's write alone), the plugin with the check off, and the check on every N-th write for
each N of ``--every``. Two writes:

- ``sglang``: SGLang's real ``MHATokenToKVPool.set_kv_buffer`` through the SGLang adapter's hook
  (skipped where SGLang does not import);
- ``vllm-packed``: the vLLM adapter's hook over a stand-in implementation class whose write is
  vLLM's ``reshape_and_cache_flash`` in torch (two index writes into the packed
  ``[blocks, heads, block_size, 2*head_size]`` cache), no vLLM needed.

bf16 rows of ``--heads`` x ``--dim`` (default 8 x 128), a cache of 4096 slots, ``--tokens`` per
write (default 1 and 64: a decode step and a prefill chunk), slots drawn at random. Each row is
the median of ``--repeats`` loops of ``--calls`` writes (on CUDA synchronised at the loop's end,
so the check's device work and its batched count reads are inside the time). This is the eager
hook's cost. On CUDA it then captures ``--graph-layers`` hooked writes (default 80, one per layer,
Llama-3.1-70B's K/V heads at TP 8) into one CUDA graph and times its replays with the check off
and on: inside a graph every N-th captured write gets one comparison kernel that runs at each
replay, so what a check adds there is that kernel's time, printed per check and as a share of
the graph's write time at N=100.

    python benchmarks/bench_shadow.py [--device cpu|cuda] [--every 100,10,1] [--tokens 1,64]
                                      [--calls 2000] [--repeats 5] [--clock thread|wall]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kvprof.integrations import core


def _timed(fn: Callable[[], Any], calls: int, repeats: int, device: torch.device, clock: Callable[[], float]) -> float:
    """Median µs per call over ``repeats`` loops of ``calls``."""
    per: list[float] = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = clock()
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        per.append((clock() - t0) / calls * 1e6)
    return statistics.median(per)


def sglang_case(device: torch.device, heads: int, dim: int, tokens: int) -> tuple[Any, Callable[[], Any], Any] | str:
    """(the adapter's state, the engine's own call, the hooked call), or why SGLang is not here."""
    try:
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

        from kvprof.integrations import sglang as adapter
    except Exception as exc:  # noqa: BLE001 - any import failure means: no SGLang case
        return f"SGLang does not import ({core.line(exc)})"
    pool = MHATokenToKVPool(size=4095, page_size=1, dtype=torch.bfloat16, head_num=heads, head_dim=dim,
                            layer_num=1, device=str(device), enable_memory_saver=False)
    original = MHATokenToKVPool.set_kv_buffer
    hook = adapter._make_hook("MHATokenToKVPool", "set_kv_buffer", "sglang_mha")

    class Layer:
        layer_id = 0

    layer = Layer()
    gen = torch.Generator().manual_seed(0)
    loc = (torch.randperm(4095, generator=gen)[:tokens] + 1).to(device)
    k = torch.randn(tokens, heads, dim, generator=gen).bfloat16().to(device)
    v = torch.randn(tokens, heads, dim, generator=gen).bfloat16().to(device)
    return adapter.STATE, (lambda: original(pool, layer, loc, k, v)), (lambda: hook(original, pool, layer, loc, k, v))


def vllm_case(device: torch.device, heads: int, dim: int, tokens: int) -> tuple[Any, Callable[[], Any], Any]:
    from kvprof.integrations import vllm as adapter

    class TritonAttentionImpl:  # the name of a backend whose cache views the adapter knows
        def __init__(self) -> None:
            self.head_size, self.kv_cache_dtype, self.attn_type = dim, "auto", "decoder"

        def do_kv_cache_update(self, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> None:
            kc, vc = kv_cache.transpose(1, 2).split(dim, dim=-1)
            bs = kc.shape[1]
            b, t = slot_mapping // bs, slot_mapping % bs
            kc[b, t] = key
            vc[b, t] = value

    class Layer:
        layer_name = "model.layers.0.self_attn.attn"

    impl, layer = TritonAttentionImpl(), Layer()
    cache = torch.zeros(256, heads, 16, 2 * dim, dtype=torch.bfloat16, device=device)
    gen = torch.Generator().manual_seed(0)
    slots = torch.randperm(4096, generator=gen)[:tokens].to(device)
    k = torch.randn(tokens, heads, dim, generator=gen).bfloat16().to(device)
    v = torch.randn(tokens, heads, dim, generator=gen).bfloat16().to(device)
    fn = TritonAttentionImpl.__dict__["do_kv_cache_update"]
    hook = adapter._make_hook(TritonAttentionImpl, "do_kv_cache_update", fn)
    return adapter.STATE, (lambda: fn(impl, layer, k, v, cache, slots)), (lambda: hook(impl, layer, k, v, cache, slots))


def graph_rows(device: torch.device, layers: int, heads: int, dim: int, tokens: int, every: list[int],
               replays: int, repeats: int) -> list[tuple[str, float, int]]:
    """Inside a CUDA graph: ``layers`` hooked writes (vLLM's stand-in, one cache per layer) captured
    into one graph through kvprof's graph hook, the check off and on every N-th write (the counter
    set so that the graph's first sampled write is its first: N >= layers gives one check); the
    median µs per replay over ``repeats`` runs of ``replays`` (CUDA events) and the checks in it."""
    from kvprof.integrations import vllm as adapter

    graph_cls = type("BenchCUDAGraph", (torch.cuda.CUDAGraph,), {})
    core.hook_graphs(graph_cls, lambda: core.GRAPHS, lambda: None)

    class TritonAttentionImpl:
        def __init__(self) -> None:
            self.head_size, self.kv_cache_dtype, self.attn_type = dim, "auto", "decoder"

        def do_kv_cache_update(self, layer: Any, key: Any, value: Any, kv_cache: Any, slot_mapping: Any) -> None:
            kc, vc = kv_cache.transpose(1, 2).split(dim, dim=-1)
            bs = kc.shape[1]
            b, t = slot_mapping // bs, slot_mapping % bs
            kc[b, t] = key
            vc[b, t] = value

    class Layer:
        def __init__(self, i: int) -> None:
            self.layer_name = f"model.layers.{i}.self_attn.attn"

    impl = TritonAttentionImpl()
    fn = TritonAttentionImpl.__dict__["do_kv_cache_update"]
    hook = adapter._make_hook(TritonAttentionImpl, "do_kv_cache_update", fn)
    caches = [torch.zeros(256, heads, 16, 2 * dim, dtype=torch.bfloat16, device=device) for _ in range(layers)]
    slots = torch.randperm(4096, device=device)[:tokens]
    k = torch.randn(tokens, heads, dim, device=device).bfloat16()
    v = torch.randn(tokens, heads, dim, device=device).bfloat16()
    state = adapter.STATE
    state.shadow = core.Shadow(0)
    for i in range(layers):
        hook(impl, Layer(i), k, v, caches[i], slots)  # eager first: each layer's cache described
    out = []
    for n in [0, *every]:
        state.shadow = core.Shadow(n)
        if n:
            state.shadow.calls = n - 1  # the graph's first write is sampled
        graph = graph_cls()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph):
            for i in range(layers):
                hook(impl, Layer(i), k, v, caches[i], slots)
        torch.cuda.synchronize()
        per = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            per.append(start.elapsed_time(end) * 1e3 / replays)
        rec = state.shadow.record() if n else None
        assert rec is None or rec.mismatched == 0, rec
        out.append(("check off" if not n else f"every {n}", statistics.median(per), rec.in_graphs if rec else 0))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--every", default="100,10,1")
    ap.add_argument("--tokens", default="1,64")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--graph-layers", type=int, default=80,
                    help="on CUDA: also time this many hooked writes captured into one CUDA graph (0: not)")
    ap.add_argument("--graph-heads", type=int, default=1, help="K/V heads of the graph's writes (default: "
                    "Llama-3.1-70B at TP 8)")
    ap.add_argument("--clock", choices=("thread", "wall"), default=None,
                    help="thread: this thread's CPU time (default on a CPU: other processes' load left out); "
                         "wall (default on CUDA: the device's work counts)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    os.environ.setdefault("KVPROF_SGLANG_DIR", "/tmp")
    os.environ.setdefault("KVPROF_VLLM_DIR", "/tmp")
    every = [int(x) for x in args.every.split(",") if x]
    clock_name = args.clock or ("wall" if device.type == "cuda" else "thread")
    clock = time.perf_counter if clock_name == "wall" else time.thread_time
    if device.type == "cpu":
        torch.set_num_threads(1)  # one core: the thread clock then counts all of a write's work
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"shadow check cost per hooked write on {device} ({name}), torch {torch.__version__}, "
          f"bf16 {args.heads} x {args.dim}, median of {args.repeats} x {args.calls} calls, {clock_name} clock; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"{'write':<12} {'tokens':>6} {'setting':<16} {'µs/write':>9} {'vs plugin, check off':>21}")
    for tokens in (int(x) for x in args.tokens.split(",") if x):
        for label, make in (("sglang", sglang_case), ("vllm-packed", vllm_case)):
            case = make(device, args.heads, args.dim, tokens)
            if isinstance(case, str):
                print(f"{label:<12} {tokens:>6} not run: {case}")
                continue
            state, plain, hooked = case
            rows = [("no plugin", None, plain)] + [("check off", 0, hooked)] + \
                [(f"every {n}", n, hooked) for n in every]
            base = None
            for setting, n, fn in rows:
                if n is not None:
                    state.shadow = core.Shadow(n)
                fn()  # warm: the pool described once, kernels loaded
                us = _timed(fn, args.calls, args.repeats, device, clock)
                if n == 0:
                    base = us
                rel = f"{(us / base - 1) * 100:+.1f} %" if base and n else ""
                print(f"{label:<12} {tokens:>6} {setting:<16} {us:>9.2f} {rel:>21}")
                if n:
                    rec = state.shadow.record()
                    assert rec.mismatched == 0 and rec.checked, (setting, rec)
    if device.type != "cuda" or not args.graph_layers:
        return
    print(f"\ninside one CUDA graph: {args.graph_layers} hooked writes (vLLM's stand-in, bf16 {args.graph_heads} x "
          f"{args.dim}), µs per replay, median of {args.repeats} x 200 replays (CUDA events)")
    print(f"{'tokens':>6} {'setting':<12} {'µs/replay':>10} {'checks':>7} {'µs/write':>9} {'µs/check':>9} "
          f"{'at N=100, of the writes':>24}")
    for tokens in (int(x) for x in args.tokens.split(",") if x):
        rows = graph_rows(device, args.graph_layers, args.graph_heads, args.dim, tokens, every, 200, args.repeats)
        off = rows[0][1]
        write = off / args.graph_layers
        for setting, us, checks in rows:
            per_check = (us - off) / checks if checks else 0.0
            share = f"{per_check / (100 * write) * 100:+.2f} %" if checks else ""
            per_write = us / args.graph_layers
            print(f"{tokens:>6} {setting:<12} {us:>10.2f} {checks:>7} {per_write:>9.3f} {per_check:>9.3f} {share:>24}")


if __name__ == "__main__":
    main()
