#!/usr/bin/env python3
"""The rope + K/V store of a whole decoder stack, per layer, from CUDA graphs: kvprof's CUDA and
Triton writers against SGLang's and sgl-kernel's kernels, and against the store alone.

    cd <repo> && OUT=/tmp/out python lab/rope_bench.py     # or: bash gpu/run_gpu_checks.sh rope

Shapes: Llama-3.1-70B at TP8, per rank (8 q heads, 1 KV head x 128, bf16, GPT-NeoX, rope_dim
128), 80 layers, q/k/v as views of one qkv row per layer (the engines' split), the same slots
and positions for every layer (as one step's ``out_cache_loc``), at 1, 10, 64, 512 and 4096
tokens. One graph holds the 80 layers' writes; it is replayed ``ROPE_REPLAYS`` times per
capture, ``ROPE_CAPTURES`` captures (each its own graph); a figure is µs per layer write: the
median over captures of each capture's median replay, its spread the median interquartile
range inside a capture, min/max the captures' medians. The eager columns are a loop of the 80
writes without a graph: wall and host time per write (the launch path). Every replay rotates
q and k again (in place, as the write does); a rotation keeps the values' size, so the work
stays the same. Knobs: ROPE_VARIANTS, ROPE_TOKENS, ROPE_CACHE (bf16 or fp8_e4m3, scale 0.5),
ROPE_LAYERS, ROPE_CAPTURES, ROPE_REPLAYS, ROPE_JSON (the file name). ``rotary:kvprof`` and
``rotary:sglang`` time the rotary alone (kvprof's, and the one SGLang runs unfused). ``rope_triton_fused@T.H.W`` in
ROPE_VARIANTS forces that writer's launch shape (tuning). ``copy:<bytes>`` is a plain device copy
moving that many bytes a token (half read, half written; each layer its own buffers) in the same
graphs: the copy floor at the write's own size, where ``bench``'s copy rate is one 1 GiB copy's
(``copy:5376`` the bytes the rope + store moves for this model, ``copy:5120`` without k written
back). JSON to $OUT/rope-bench.json.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["TRITON_INTERPRET"] = "0"
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvprof.core.atomic import atomic_write_text  # noqa: E402  (after the path insert)

HQ, HK, DIM = 8, 1, 128  # Llama-3.1-70B / TP8, per rank
MAX_POS = 8192


def env_list(name: str, default: str) -> list[str]:
    return [x.strip() for x in os.environ.get(name, default).split(",") if x.strip()]


def factories() -> dict[str, Callable[[], Any]]:
    """Variant name -> a writer factory (rope writers; ``store:<name>`` a store writer alone)."""

    def cuda(**options: Any) -> Callable[[], Any]:
        def make() -> Any:
            from kvprof.kvcache.writers.rope_cuda import RopeCudaWriter

            return RopeCudaWriter(**options)

        return make

    def triton(kind: str) -> Callable[[], Any]:
        def make() -> Any:
            from kvprof.kvcache.writers import rope_triton

            return rope_triton.RopeTritonFusedWriter() if kind == "fused" else rope_triton.RopeThenStoreWriter(kind)

        return make

    def sglang(kind: str) -> Callable[[], Any]:
        def make() -> Any:
            from kvprof.kvcache.writers import rope_sglang

            if kind == "jit":
                return rope_sglang.SglangRopeStoreWriter()
            return rope_sglang.SglangTritonRopeCacheWriter()

        return make

    def sgl_cubin() -> Any:
        from kvprof.kvcache.writers.rope_sgl_cubin import SglKernelRopeCubinWriter

        return SglKernelRopeCubinWriter()

    def store(name: str) -> Callable[[], Any]:
        def make() -> Any:
            from kvprof.kvcache.writers import create_writer

            return create_writer(name)

        return make

    def rotary(kind: str) -> Callable[[], Any]:
        def make() -> Any:
            return RotaryOnly(kind)

        return make

    return {
        "rotary:kvprof": rotary("kvprof"),
        "rotary:sglang": rotary("sglang"),
        "rope_cuda_fused": cuda(),
        "rope_cuda_fused:nopdl": cuda(pdl=False),
        "rope_triton_fused": triton("fused"),
        "rope_then_triton_fused": triton("triton_fused"),
        "rope_then_cuda_fused": triton("cuda_fused"),
        "sglang_rope_store": sglang("jit"),
        "sglang_triton_rope_cache": sglang("triton"),
        "sgl_kernel_rope_cubin": sgl_cubin,
        "store:cuda_fused": store("cuda_fused"),
        "store:triton_fused": store("triton_fused"),
    }


class RotaryOnly:
    """The rotary embedding alone (q and k in place, nothing stored), timed like the writers:
    ``kvprof`` is the rotary of the unfused baselines and of ``--context layer`` (kvprof's
    Triton rope kernel without the store), ``sglang`` the one SGLang 0.5.23 runs on CUDA
    without a fused store (``apply_rope_inplace``, called by its
    ``apply_rope_with_cos_sin_cache_inplace``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fn: Any = None

    def unsupported_reason(self, device: Any, dtype: Any, input_dtype: Any = None) -> str | None:
        if self.kind == "kvprof":
            from kvprof.kvcache.writers.rope_triton import TritonRope

            rope = TritonRope("rotary")
            self._fn = rope.rotate
            return rope.unsupported_reason(device, dtype, input_dtype)
        try:
            from sglang.kernels.ops.attention.rope import apply_rope_inplace
        except Exception as exc:  # noqa: BLE001 - SGLang not installed, or its import fails here
            return f"SGLang's apply_rope_inplace is not importable ({type(exc).__name__})"

        def run(q: Any, k: Any, positions: Any, cs: Any, is_neox: bool) -> None:
            apply_rope_inplace(q, k, cs, positions, is_neox=is_neox)

        self._fn = run
        return None

    def prepare(self, device: Any) -> None:
        """Nothing to build ahead: both kernels compile at their first call (before capture)."""

    def write(self, q: Any, k: Any, v: Any, k_buf: Any, v_buf: Any, loc: Any, pos: Any, cs: Any, is_neox: bool,
              *rest: Any) -> str:
        self._fn(q, k, pos, cs, is_neox)
        return "rotary only"


class CopyFloor:
    """``copy:<bytes>``: a ``copy_`` of ``bytes_per_token`` / 2 bytes a token per layer, so a graph of
    the layers moves what a write of that many bytes a token moves, with the same count of launches."""

    def __init__(self, bytes_per_token: int) -> None:
        self.bytes_per_token = bytes_per_token

    def unsupported_reason(self, device: Any, dtype: Any, input_dtype: Any = None) -> str | None:
        return None

    def prepare(self, device: Any) -> None:
        """Buffers are per token count: ``bench_tokens`` makes them."""


def copy_floor(name: str) -> Callable[[], Any] | None:
    """``copy:<bytes>`` with an even byte count of at least 2, or None for any other name."""
    match = re.fullmatch(r"copy:(\d+)", name)
    if match is None:
        return None
    nbytes = int(match[1])
    if nbytes < 2 or nbytes % 2:
        fail(f"ROPE_VARIANTS {name}: the bytes a token must be even and at least 2 (half read, half written)")
    return lambda: CopyFloor(nbytes)


def copy_pairs(tokens: int, bytes_per_token: int, layers: int, device: Any) -> list[tuple[Any, Any]]:
    """Per layer a (source, destination) of ``tokens`` x ``bytes_per_token`` / 2 bytes each: a copy
    between them reads and writes ``bytes_per_token`` a token, from buffers no other layer touches."""
    import torch

    half = tokens * bytes_per_token // 2
    return [(torch.ones(half, dtype=torch.uint8, device=device), torch.empty(half, dtype=torch.uint8, device=device))
            for _ in range(layers)]


def bench_tokens(tokens: int, writers: dict[str, Any], cs: Any, cache: Any, scale: float | None, layers: int,
                 captures: int, replays: int) -> list[dict[str, Any]]:
    """Every writer at one token count, on its own fresh stack of layers (freed on return)."""
    import torch

    from kvprof.bench.timing import time_eager, time_graph
    from kvprof.kvcache.dtypes import store_dtype_for

    device = cs.device
    g = torch.Generator().manual_seed(tokens)
    rows = max(2 * tokens, 1024) + 1
    store = store_dtype_for(cache)
    qkv = [torch.randn(tokens, (HQ + 2 * HK) * DIM, generator=g).bfloat16().to(device) for _ in range(layers)]
    split = [tuple(t.view(tokens, -1, DIM) for t in x.split([HQ * DIM, HK * DIM, HK * DIM], dim=1)) for x in qkv]
    k_bufs = [torch.zeros(rows, HK, DIM, dtype=store, device=device) for _ in range(layers)]
    v_bufs = [torch.zeros(rows, HK, DIM, dtype=store, device=device) for _ in range(layers)]
    loc = (torch.randperm(rows - 1, generator=g)[:tokens] + 1).to(device)
    pos = torch.randint(0, MAX_POS, (tokens,), generator=g).to(device)
    from kvprof.kvcache.contracts import checked_impl

    results = []
    for name, writer in writers.items():
        paths: set[str] = set()
        rope = not name.startswith("store:")

        # the writer's own write (write_unchecked): what the pools launch, without the checks a
        # direct write runs first (their cost: benchmarks/bench_writer_checks.py)
        if isinstance(writer, CopyFloor):
            pairs = copy_pairs(tokens, writer.bytes_per_token, layers, device)

            def step(pairs: list[tuple[Any, Any]] = pairs, paths: set[str] = paths) -> None:
                for src, dst in pairs:
                    dst.copy_(src)
                paths.add("copy")
        else:
            own_write = checked_impl(writer)

            def step(write: Any = own_write, paths: set[str] = paths, rope: bool = rope) -> None:
                for (q, k, v), kb, vb in zip(split, k_bufs, v_bufs):
                    if rope:
                        paths.add(write(q, k, v, kb, vb, loc, pos, cs, True, cache, scale, scale))
                    else:
                        paths.add(write(kb, vb, loc, k, v, cache, scale, scale))

        try:
            graphs = [time_graph(step, layers, replays) for _ in range(captures)]
            eager = time_eager(step, layers, 10, device)
        except Exception as exc:  # noqa: BLE001 - one variant failing leaves the others' figures
            print(f"{name:<26} {tokens:>6}  failed: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}",
                  flush=True)
            continue
        medians = [t.median_us for t in graphs]
        row = {"variant": name, "tokens": tokens, "graph_us": statistics.median(medians),
               "iqr_us": statistics.median(t.spread_us for t in graphs), "min_us": min(medians),
               "max_us": max(medians), "eager_us": eager.median_us, "host_us": eager.host_us,
               "paths": sorted(paths)}
        results.append(row)
        print(f"{name:<26} {tokens:>6} {row['graph_us']:9.3f} {row['iqr_us']:7.3f} {row['min_us']:8.3f} "
              f"{row['max_us']:8.3f} {row['eager_us']:9.3f} {row['host_us']:8.3f}  {', '.join(row['paths'])}",
              flush=True)
    return results


def fail(msg: str) -> None:
    print(f"rope_bench.py: {msg}", file=sys.stderr)
    raise SystemExit(1)


def env_int(name: str, default: str) -> int:
    raw = os.environ.get(name, default)
    try:
        value = int(raw)
    except ValueError:
        fail(f"{name} must be an integer, got {raw!r}")
    if value < 1:
        fail(f"{name} must be at least 1, got {value}")
    return value


def tuned(name: str) -> Callable[[], Any] | None:
    """``rope_triton_fused@T.H.W``: kvprof's fused Triton rope + store with one forced launch shape
    (``block_t`` tokens x ``block_h`` heads per program, ``num_warps``), for tuning its table;
    after W, ``t`` runs the programs token-major (``RopeConfig.token_major``), ``s`` with the
    streaming hints (``stream``), ``pN`` as a persistent grid of N programs per SM
    (``persistent``): ``@16.1.8t``, ``@16.1.8ts``, ``@16.1.8p4``."""
    base, _, shape = name.partition("@")
    if base != "rope_triton_fused" or not shape:
        return None
    match = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(t?)(s?)(?:p(\d+))?", shape)
    if match is None:
        return None
    from kvprof.kvcache.writers.rope_tables import RopeConfig

    try:  # a shape the kernel cannot take is refused before anything runs
        config = RopeConfig(*(int(x) for x in match.group(1, 2, 3)), bool(match[4]), bool(match[5]),
                            int(match[6] or 0))
    except ValueError as exc:
        fail(f"ROPE_VARIANTS {name}: {exc}")

    def make() -> Any:
        from kvprof.kvcache.writers.rope_triton import RopeTritonFusedWriter

        return RopeTritonFusedWriter(config=config)

    return make


def main() -> None:
    makers = factories()
    variants = env_list("ROPE_VARIANTS", ",".join(makers))
    for name in variants:
        maker = tuned(name) or copy_floor(name)
        if maker is not None:
            makers[name] = maker
    unknown = [v for v in variants if v not in makers]
    if unknown:
        fail(f"unknown ROPE_VARIANTS {', '.join(unknown)}; known: {', '.join(makers)}")
    try:
        tokens_list = [int(t) for t in env_list("ROPE_TOKENS", "1,10,64,512,4096")]
    except ValueError:
        fail(f"ROPE_TOKENS must be integers separated by commas, got {os.environ.get('ROPE_TOKENS')!r}")
    if not tokens_list or min(tokens_list) < 1:
        fail("ROPE_TOKENS must list token counts of at least 1")
    cache_name = os.environ.get("ROPE_CACHE", "bf16")
    if cache_name not in ("bf16", "fp8_e4m3", "fp8_e5m2"):
        fail(f"ROPE_CACHE must be bf16, fp8_e4m3 or fp8_e5m2, got {cache_name!r}")
    layers, captures = env_int("ROPE_LAYERS", "80"), env_int("ROPE_CAPTURES", "3")
    replays = env_int("ROPE_REPLAYS", "50")

    import torch

    if not torch.cuda.is_available():
        fail("needs a CUDA GPU")
    from kvprof.kvcache.dtypes import parse_dtype
    from kvprof.kvcache.writers.rope_reference import cos_sin_table

    cache = parse_dtype(cache_name)
    scale = 0.5 if cache != torch.bfloat16 else None
    device = torch.device("cuda")
    t0 = time.perf_counter()
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; {layers} layers of {HQ} q heads, "
          f"{HK} KV head x {DIM}, bf16 in, {cache} cache; {captures} captures x {replays} replays", flush=True)

    writers: dict[str, Any] = {}
    for name in variants:
        try:
            writer = makers[name]()
            reason = writer.unsupported_reason(device, cache, torch.bfloat16)
        except Exception as exc:  # noqa: BLE001 - a peer that is not installed here
            reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if reason:
            print(f"  {name}: not run ({reason})", flush=True)
            continue
        writer.prepare(device)
        writers[name] = writer

    cs = cos_sin_table(MAX_POS, DIM).to(device)
    results: list[dict[str, Any]] = []
    print(f"{'variant':<26} {'tokens':>6} {'graph us':>9} {'IQR':>7} {'min':>8} {'max':>8} "
          f"{'eager us':>9} {'host us':>8}  path")
    for tokens in tokens_list:
        results += bench_tokens(tokens, writers, cs, cache, scale, layers, captures, replays)
        torch.cuda.empty_cache()
    dest = Path(os.environ.get("OUT", "/tmp/kvprof-gpu")) / os.environ.get("ROPE_JSON", "rope-bench.json")
    dest.parent.mkdir(parents=True, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "layers": layers,
            "shape": f"{HQ}q/{HK}kv x {DIM}", "cache": str(cache), "captures": captures, "replays": replays}
    atomic_write_text(dest, json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    print(f"wrote {dest} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
