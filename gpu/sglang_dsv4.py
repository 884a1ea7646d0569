"""DeepSeek-V4's pool setters on a GPU, with SGLang's own JIT kernels, as the plugin sees them.

Run by ``bash gpu/run_gpu_checks.sh dsv4`` (SGLang's package from the carried wheels, the plugin
loaded by SGLang's ``load_plugins()``; ``--dry-run-cpu`` runs the same flow on a CPU with stand-in
kernels, where only the checks of the replayed GPU kernels fail). SGLang's real
``DeepSeekV4TokenToKVPool`` on the GPU (3 layers: 0 keeps SWA rows only, 1 a C4 compressed cache
and its indexer's keys, 2 a C128 one),
written as the model and its compressors call its setters: each layer's KV norm + rope + store
(``set_swa_key_buffer_radix_fused_norm_rope``, ``_compute_kv_to_cache``'s call), the compressed
KV (``set_extra_key_buffer_fused``) and the index keys (``set_index_k_fused``). Three eager steps
(a prefill of 8 tokens, two decodes) inside SGLang's ``forward_context``, then one decode step
captured into a CUDA graph (inside its own ``forward_context``, as SGLang's graph runner captures)
and replayed ``--replays`` times under torch.profiler. What stands in: the attention backend's
SWA slot translation (SGLang's own ``translate_loc_from_full_to_swa``) and the model's tensors
(random bf16 rows).

Checked, each printed with PASS or FAIL (exit 1 on any FAIL):

- the writes landed: every layer's SWA cache, layer 1's and 2's compressed caches and layer 1's
  index keys hold non-zero bytes;
- the sidecar: the paths counted per variant, the captured graph's writes in order with the
  kernel each launches (``fused_k_norm_rope_flashmla``, ``fused_store_flashmla_cache``,
  ``fused_store_indexer_cache``), and the ledger: every token asked was seen;
- analyze ties every replayed write to its kernel by graph order: ``replays x 6`` writes, one
  kernel each, each named as the record names it, and no replay left untied.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

LAYERS, RATIOS = 3, [0, 4, 128]
# (layer, variant, kernel) of one step's writes, in order
STEP_WRITES = [(0, "sglang_dsv4_swa_norm_rope", "fused_k_norm_rope_flashmla"),
               (1, "sglang_dsv4_swa_norm_rope", "fused_k_norm_rope_flashmla"),
               (1, "sglang_dsv4_compressed", "fused_store_flashmla_cache"),
               (1, "sglang_dsv4_index_k", "fused_store_indexer_cache"),
               (2, "sglang_dsv4_swa_norm_rope", "fused_k_norm_rope_flashmla"),
               (2, "sglang_dsv4_compressed", "fused_store_flashmla_cache")]


def dry_run_stand_ins() -> None:
    """``--dry-run-cpu``: the script's own flow on a CPU, to catch its mistakes before a GPU run. The
    JIT kernels under the setters mark each token's row instead, and torch's C graph class does
    nothing (as tests/test_sglang_plugin.py's DeepSeek-V4 scenario); no GPU kernel runs, so the
    checks of the replayed kernels FAIL there by design."""
    import sglang.srt.mem_cache.deepseek_v4_memory_pool as dsv4_pool
    import torch.cuda.graphs as torch_graphs

    cuda_part = torch_graphs.CUDAGraph.__mro__[1]
    cuda_part.__new__ = lambda cls, *a, **k: object.__new__(cls)  # type: ignore[method-assign]
    cuda_part.__init__ = lambda self, *a, **k: None  # type: ignore[method-assign]
    for name in ("capture_begin", "capture_end", "replay"):
        setattr(cuda_part, name, lambda self, *a, **k: None)

    def mark(cache: torch.Tensor, loc: torch.Tensor, page_size: int) -> None:
        loc = loc.long()
        cache.view(torch.uint8)[loc // page_size, loc % page_size] = 1

    dsv4_pool.fused_k_norm_rope_flashmla = lambda **k: mark(k["kvcache"], k["out_loc"], k["page_size"])
    dsv4_pool.fused_store_cache = lambda input, cache, indices, **k: mark(cache, indices, k["page_size"])


def run(out: Path, replays: int, dev: str = "cuda") -> dict[str, list[bool]]:
    import sglang.srt.model_executor.forward_context as fc  # fc.forward_context: read after the hooks apply
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
    from sglang.srt.plugins import load_plugins
    from sglang.srt.runtime_context import publish, reset_context
    from sglang.srt.server_args import ServerArgs

    reset_context()
    publish(ServerArgs(model_path="dummy", device=dev), role="tokenizer")
    load_plugins()
    pool = DeepSeekV4TokenToKVPool(
        max_num_reqs=2, swa_size=256, c4_size=128, c128_size=128, c4_state_pool_size=2, c128_state_pool_size=2,
        page_size=128, swa_page_size=128, dtype=torch.float8_e4m3fn, c4_state_dtype=torch.float32,
        c128_state_dtype=torch.float32, qk_nope_head_dim=448, qk_rope_head_dim=64, indexer_head_dim=128,
        layer_num=LAYERS, device=dev, enable_memory_saver=False, compression_ratios=RATIOS, full_size=256)
    pool.register_mapping(torch.arange(512, device=dev))

    class Backend:  # what the model's store reads of the attention backend
        token_to_kv_pool = pool

    g = torch.Generator(device=dev).manual_seed(0)
    freqs = torch.polar(torch.ones(512, 32, device=dev), torch.rand(512, 32, device=dev, generator=g))
    weight = torch.ones(512, device=dev, dtype=torch.bfloat16)

    def forward(batch: ForwardBatch, kvs: list[torch.Tensor]) -> None:
        loc = batch.out_cache_loc
        swa_loc = pool.translate_loc_from_full_to_swa(loc).to(torch.int32)
        for layer in range(LAYERS):
            pool.set_swa_key_buffer_radix_fused_norm_rope(layer_id=layer, swa_loc=swa_loc, kv=kvs[layer],
                                                          kv_weight=weight, eps=1e-6, freqs_cis=freqs,
                                                          positions=batch.positions)
            if RATIOS[layer]:  # a compressor's output as the setter path stores a decode: every token
                rows = loc // RATIOS[layer]
                pool.set_extra_key_buffer_fused(layer_id=layer, loc=rows, cache_k=kvs[layer])
                if RATIOS[layer] == 4:
                    pool.set_index_k_fused(layer_id=layer, loc=rows, cache_k=kvs[layer][:, :128].contiguous())

    def batch_of(mode: ForwardMode, start: int, tokens: int) -> ForwardBatch:
        loc = torch.arange(start, start + tokens, device=dev)
        return ForwardBatch(forward_mode=mode, batch_size=1,
                            input_ids=torch.zeros(tokens, dtype=torch.long, device=dev),
                            req_pool_indices=torch.zeros(1, dtype=torch.long, device=dev),
                            seq_lens=torch.tensor([start + tokens - 1], device=dev), out_cache_loc=loc,
                            seq_lens_sum=start + tokens - 1, positions=loc - 1)

    def rows(tokens: int) -> list[torch.Tensor]:  # the model's latent KV rows, made outside any capture
        return [torch.randn(tokens, 512, device=dev, generator=g).bfloat16() for _ in range(LAYERS)]

    # eager steps (SGLang's JIT kernels compile at their first call), then a decode step captured as
    # SGLang's graph runner captures (inside its forward_context: no ledger step), then its replays,
    # profiled as sglang_pool.py profiles its graph
    start = 1
    for mode, tokens in ((ForwardMode.EXTEND, 8), (ForwardMode.DECODE, 1), (ForwardMode.DECODE, 1)):
        batch = batch_of(mode, start, tokens)
        start += tokens
        with fc.forward_context(fc.ForwardContext(attn_backend=Backend()), forward_batch=batch):
            forward(batch, rows(tokens))
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    sync()
    batch, kvs = batch_of(ForwardMode.DECODE, start, 1), rows(1)
    graph = torch.cuda.CUDAGraph()
    with fc.forward_context(fc.ForwardContext(attn_backend=Backend()), forward_batch=batch):
        if dev == "cuda":
            with torch.cuda.graph(graph):
                forward(batch, kvs)
        else:  # the dry run: torch.cuda.graph needs a device; the graph's own methods still run
            graph.capture_begin()
            forward(batch, kvs)
            graph.capture_end()
    sync()
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(replays):
            graph.replay()
        sync()
    prof.export_chrome_trace(str(out / "1790857026.5-TP-0.trace.json.gz"))
    return {"swa": [bool(pool.get_swa_raw_buffer(i).view(torch.uint8).any()) for i in range(LAYERS)],
            "compressed": [bool(pool.get_extra_key_buffer(i).view(torch.uint8).any()) for i in (1, 2)],
            "index_k": [bool(pool.get_index_k_with_scale_buffer(1).view(torch.uint8).any())]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--dry-run-cpu", action="store_true", help="the flow on a CPU with stand-in kernels")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("KVPROF_SGLANG", "1")
    os.environ.setdefault("KVPROF_SGLANG_DIR", str(out))
    if args.dry_run_cpu:
        dry_run_stand_ins()
    else:
        print("gpu:", torch.cuda.get_device_name(0), flush=True)
    written = run(out, args.replays, "cpu" if args.dry_run_cpu else "cuda")
    failed = 0

    def check(ok: bool, what: str) -> None:
        nonlocal failed
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {what}", flush=True)

    check(all(v for vs in written.values() for v in vs), f"the writes landed: {written}")
    from kvprof.integrations import sglang as plugin

    plugin.STATE.write_sidecar()
    import kvprof.api as kv

    loaded = kv.open_run(out)
    (side,) = loaded.sidecars
    check(side.paths == {"sglang:sglang_dsv4_swa_norm_rope": 12, "sglang:sglang_dsv4_compressed": 8,
                         "sglang:sglang_dsv4_index_k": 4}, f"paths: {side.paths}")
    graphs = side.graphs or []
    recorded = [[(w.layer, w.variant, w.kernel) for w in g.writes] for g in graphs]
    check(recorded == [STEP_WRITES], f"graph record: {recorded}")
    ledger = side.ledger
    check(ledger is not None and ledger.steps == 3 and ledger.expected == ledger.seen == {str(i): 10 for i in range(3)}
          and not ledger.unseen_paths, f"ledger: {ledger}")

    summary = kv.analyze(loaded, write_kernels=True)
    w = summary.writes
    replayed = w[w["attribution"] == "graph_order"]
    check(len(replayed) == args.replays * len(STEP_WRITES),
          f"graph-replayed writes attributed: {len(replayed)} (expected {args.replays} x {len(STEP_WRITES)})")
    names_ok = True
    for variant, kernel in {(v, k) for _, v, k in STEP_WRITES}:
        rows = replayed[replayed["variant"] == variant]
        ok = bool(len(rows)) and (rows["gpu_ops"] == 1).all() and \
            rows["kernel_names"].astype(str).str.contains(kernel, regex=False).all()
        names_ok &= ok
        print(f"  {variant}: {len(rows)} replayed writes, kernels {sorted(set(rows['kernel_names'].astype(str)))}",
              flush=True)
    check(names_ok, "one kernel per replayed write, named as the graph record names it")
    untied = [m for m in summary.summary.warnings if "graph replays lie outside" in m or "counted by name only" in m]
    check(not untied, f"no replay left untied: {untied}")
    spans = {v: float(replayed[replayed["variant"] == v]["gpu_span_ns"].median()) for v in set(replayed["variant"])}
    print(json.dumps({"replayed_gpu_span_ns_median": dict(sorted(spans.items()))}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
