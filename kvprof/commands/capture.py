"""Run a workload per write variant and record torch.profiler traces / Nsight Systems reports.

Writes traces/<run-id>/ (manifest.json, <variant>.pt.trace.json.gz, and with
--profiler nsys|both <variant>.nsys-rep + .sqlite), then prints a first summary.
With no arguments: Llama-3.1-70B at TP 8 (1 KV head x 128, 80 layers), decode at
batch 1/10/64 and a 4096-token prefill, on whatever device there is; on a CPU each step
writes a few of the 80 layers (--layers) with one torch thread (--threads), and kvprof's
Triton kernel runs under Triton's interpreter (TRITON_INTERPRET=1, set when unset).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from kvprof.commands import command_flags
from kvprof.commands.argtypes import (
    kv_scale,
    memory_gb,
    non_negative_int,
    output_folder,
    positive_int,
    positive_ints,
    seed,
    thread_count,
)


def _names(text: str) -> list[str]:
    names = [x for x in text.replace(" ", "").split(",") if x]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text[:60]!r}")
    return names


def _writer_option(text: str) -> tuple[str, str, object]:
    """variant.key=value, value parsed as JSON when it can be (true, 3, "x"), else kept as text;
    a boolean parameter of the writer then reads the text strictly (``kvprof.kvcache.registry.typed_options``)."""
    import orjson

    try:
        target, value = text.split("=", 1)
        variant, key = target.split(".", 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected VARIANT.KEY=VALUE, got {text!r}") from None
    try:
        parsed: object = orjson.loads(value)
    except orjson.JSONDecodeError:
        parsed = value
    return variant, key, parsed


def add_arguments(p: argparse.ArgumentParser) -> None:
    from kvprof.capture.defaults import (
        CPU_DEFAULT_LAYERS,
        CPU_DEFAULT_THREADS,
        CPU_LAYER_CONTEXT_LEN,
        CPU_LAYER_DECODE_SIZES,
        CPU_LAYER_PREFILL_TOKENS,
        CPU_LAYER_REFERENCE_STEPS,
        CPU_REFERENCE_BUDGET_S,
        CPU_REFERENCE_STEPS_UP_TO,
        DEFAULT_CONTEXT_LEN,
        DEFAULT_DECODE_SIZES,
        DEFAULT_PREFILL_TOKENS,
    )
    from kvprof.core.variants import DEFAULT_CAPTURE_VARIANTS as DEFAULT_VARIANTS

    w = p.add_argument_group("workload")
    w.add_argument("--model", default="llama-3.1-70b",
                   help="preset name or LAYERSxKV_HEADSxHEAD_DIM (default: %(default)s)")
    w.add_argument("--tp", type=positive_int, default=8,
                   help="tensor-parallel degree; KV heads per rank = ceil(kv_heads/tp) (default: %(default)s)")
    w.add_argument("--phase", type=_names, default=["decode", "prefill"],
                   help="decode, prefill, serving (comma-separated; default: decode,prefill)")
    w.add_argument("--batch-sizes", "--decode-sizes", dest="decode_sizes", type=positive_ints, default=None,
                   help=f"decode batch sizes (default: {','.join(map(str, DEFAULT_DECODE_SIZES))}; "
                        f"{','.join(map(str, CPU_LAYER_DECODE_SIZES))} with --context layer on a CPU)")
    w.add_argument("--prefill-tokens", "--prefill-sizes", dest="prefill_sizes", type=positive_ints, default=None,
                   help=f"prefill tokens per chunk (default: {DEFAULT_PREFILL_TOKENS}; {CPU_LAYER_PREFILL_TOKENS} with "
                        "--context layer on a CPU)")
    w.add_argument("--steps", type=positive_int, default=10,
                   help="measured steps per phase and size (default: %(default)s)")
    w.add_argument("--warmup", type=non_negative_int, default=3, help="unmeasured warm-up steps (default: %(default)s)")
    w.add_argument("--serving-steps", type=positive_int, default=None,
                   help="decode steps of the serving phase (default: 1024, its output length)")
    w.add_argument("--chunk", type=positive_int, default=8192,
                   help="chunked-prefill size of the serving phase (default: %(default)s)")
    w.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True,
                   help="replay decode steps from a captured CUDA graph (default: on, CUDA only)")
    w.add_argument("--slots", choices=["random", "contiguous", "paged"], default="random",
                   help="slot allocation pattern (default: %(default)s)")
    w.add_argument("--page-size", type=positive_int, default=1, help="tokens per page (default: %(default)s)")
    w.add_argument("--layout", choices=("mha", "mla", "paged"), default=None,
                   help="cache layout: SGLang's MHA pool, SGLang's MLA latent pool, vLLM's paged cache "
                        "(default: mla for DeepSeek presets, else the --engine's)")
    w.add_argument("--engine", choices=("sglang", "vllm"), default="sglang",
                   help="whose cache a non-MLA model writes: sglang (mha) or vllm (paged; --page-size is the block "
                        "size, 16 when 1) (default: %(default)s)")
    w.add_argument("--pool-size", type=positive_int, default=None,
                   help="slots per layer (default: sized to the workload and device memory)")
    w.add_argument("--seed", type=seed, default=0,
                   help="random seed of slots and inputs, 0 .. 2**63-1 (default: %(default)s)")
    w.add_argument("--max-memory-gb", type=memory_gb, default=None,
                   help="refuse a capture whose pool, inputs and profiler records would need more "
                        "(default: 80%% of available host memory, 90%% of the GPU's free memory)")
    w.add_argument("--context", default="none",
                   help="none: the writes alone, back to back; layer: each write inside a decoder layer at the "
                        "model's per-rank shapes (QKV GEMM, rotary, write, attention, output and MLP GEMMs) "
                        "(default: %(default)s)")
    w.add_argument("--context-len", type=positive_int, default=None,
                   help="with --context layer: cached tokens per request that decode attention reads (default: "
                        f"{DEFAULT_CONTEXT_LEN}; {CPU_LAYER_CONTEXT_LEN} on a CPU)")
    w.add_argument("--layers", type=positive_int, default=None, metavar="N",
                   help="how many of the model's layers each step writes (the first N); per-write figures do not "
                        "depend on it, and savings per decode step are still projected to all the model's layers "
                        f"(default: all on CUDA, {CPU_DEFAULT_LAYERS} on a CPU; with --context layer each step "
                        "builds only these layers' weights)")
    w.add_argument("--threads", type=thread_count, default=None, metavar="N",
                   help=f"torch CPU threads during the capture (default: {CPU_DEFAULT_THREADS} on a CPU, where a "
                        "second thread made small writes swing; torch's own on CUDA; at most 4 per CPU)")
    w.add_argument("--reference-steps", type=positive_int, default=None,
                   help="unprofiled steps timed per phase and size for the reference figures (default: 100 on "
                        f"CUDA; on a CPU the --steps count ({CPU_LAYER_REFERENCE_STEPS} with --context layer), then "
                        f"more while a point's timed steps took under {CPU_REFERENCE_BUDGET_S:g} s, up to "
                        f"{CPU_REFERENCE_STEPS_UP_TO}; given, exactly N)")

    d = p.add_argument_group("write")
    d.add_argument("--variants", type=_names, default=None,
                   help=f"write variants (default: {','.join(DEFAULT_VARIANTS)}, skipping what cannot run here)")
    d.add_argument("--writer", action="append", default=[], metavar="MODULE:FUNCTION",
                   help="add a third-party writer factory (repeatable)")
    d.add_argument("--writer-option", action="append", type=_writer_option, default=[], metavar="VARIANT.KEY=VALUE",
                   help="pass an option to a writer, e.g. two_stream.always=true (a boolean option takes "
                        "true/false, yes/no, on/off or 1/0; anything else is refused)")
    d.add_argument("--ranks", type=positive_int, default=None, metavar="N",
                   help="tensor-parallel ranks: N processes through torch.distributed (NCCL, one GPU each; Gloo on "
                        "CPU), each writing its own traces, with the all-reduces of a TP layer (default: 1, one "
                        "process)")
    d.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: %(default)s)")
    d.add_argument("--cache-dtype", default="bf16", help="bf16, fp16, fp32, fp8_e4m3, fp8_e5m2 (default: %(default)s)")
    d.add_argument("--input-dtype", default=None,
                   help="dtype of incoming K/V (default: the cache dtype; bf16 for fp8 caches)")
    d.add_argument("--k-scale", type=kv_scale, default=None)
    d.add_argument("--v-scale", type=kv_scale, default=None)
    d.add_argument("--loc-dtype", choices=["int32", "int64"], default="int64")

    o = p.add_argument_group("output")
    o.add_argument("--profiler", choices=["torch", "nsys", "both"], default="torch",
                   help="torch.profiler, Nsight Systems, or both in separate passes (default: %(default)s)")
    o.add_argument("--torch-sync-events", action=argparse.BooleanOptionalAction, default=False,
                   help="record torch.profiler's cuda_sync events (stream waits) (default: off)")
    o.add_argument("--nsys-graph-trace", choices=["node", "graph"], default="node",
                   help="nsys --cuda-graph-trace: node keeps each write's kernels, graph only whole replays "
                        "(default: %(default)s)")
    o.add_argument("--out", "--output", dest="output", type=output_folder, default="traces",
                   help="root folder of run directories (default: %(default)s)")
    o.add_argument("--run-id", default=None, help="name of the run directory (default: time, model, tp)")
    o.add_argument("--force", action="store_true",
                   help="replace an existing run directory of that name; the old one stays whole until the new "
                        "one is complete, then is swapped out")
    o.add_argument("--no-scrub", dest="scrub", action="store_false",
                   help="keep environment data in what is written (default: scrub)")
    o.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                   help="pass this environment variable to profiled child processes too")
    o.add_argument("--no-summary", dest="summary", action="store_false", help="do not analyse the traces after capture")
    o.add_argument("--no-progress", dest="progress", action="store_false")


def config_from_args(args: argparse.Namespace):  # noqa: ANN201
    from kvprof.capture.config import DEFAULT_VARIANTS, CaptureConfig

    variants = list(args.variants) if args.variants else list(DEFAULT_VARIANTS)
    required = list(args.variants or []) + list(args.writer)
    variants += [spec for spec in args.writer if spec not in variants]
    options: dict[str, dict[str, object]] = {}
    for variant, key, value in args.writer_option:
        options.setdefault(variant, {})[key] = value
    return CaptureConfig(
        model=args.model, tp=args.tp, variants=variants, required_variants=required,
        phases=args.phase, decode_sizes=args.decode_sizes, prefill_sizes=args.prefill_sizes,
        serving_steps=args.serving_steps, chunk=args.chunk, steps=args.steps, warmup=args.warmup,
        cuda_graph=args.cuda_graph, device=args.device, cache_dtype=args.cache_dtype,
        input_dtype=args.input_dtype, k_scale=args.k_scale, v_scale=args.v_scale,
        loc_dtype=args.loc_dtype, slots=args.slots, page_size=args.page_size, pool_size=args.pool_size,
        seed=args.seed, profiler=args.profiler, scrub=args.scrub, pass_env=args.pass_env,
        writer_options=options, run_id=args.run_id, force=args.force, output=str(args.output),
        max_memory_gb=args.max_memory_gb,
        context=args.context, context_len=args.context_len, reference_steps=args.reference_steps,
        torch_sync_events=args.torch_sync_events, nsys_graph_trace=args.nsys_graph_trace,
        layout=args.layout, engine=args.engine, ranks=args.ranks, layers=args.layers, threads=args.threads,
    )


def flags() -> Callable[[str], str]:
    """A capture setting's field -> its flag here (``decode_sizes`` -> ``--batch-sizes``)."""
    return command_flags(add_arguments)


def run(args: argparse.Namespace) -> int:
    from kvprof import api
    from kvprof.commands.progress import StepProgress
    from kvprof.core.errors import rendered

    names = flags()

    def log(line: str) -> None:  # what the capture says as it goes, its settings as flags
        print(rendered(line, names), file=sys.stderr)

    # shown at once (torch and the writers load for seconds on a small machine), then the
    # capture's steps per variant on the same bar
    bar = StepProgress(None, description="loading torch", width=22) if args.progress else None

    def factory(total: int) -> StepProgress:
        assert bar is not None
        bar.set_total(total)
        return bar

    try:
        config = config_from_args(args)
        result = api.capture(config, progress_factory=factory if bar is not None else None, analyse=args.summary,
                             render=args.summary, log=log, names=names)
    finally:
        if bar is not None:
            bar.close()
    print(f"run directory: {result.run_dir}")
    for problem in result.problems:
        print(f"kvprof capture: error: {rendered(problem, names)} (the torch.profiler results are kept)",
              file=sys.stderr)
    return max((p.exit_code for p in result.problems), default=0)
