"""triton_fused under Triton's interpreter: the GPU tables' launch shape against the
interpreter's own (``kvprof.kvcache.writers.triton_tables.interpreted_config``), ms per write.

Why the interpreter has its own shape: it runs each program as one numpy pass over the
program's tile, at a fixed cost per program, so many small programs (what a GPU wants)
are slow on a CPU. Both shapes write the same bits (tests/test_fused_writers.py).

    python lab/interpreter_shapes.py [--threads 1] [--shape 1x128] [--repeats 5]

Sets TRITON_INTERPRET=1 itself. Rows: tokens, then the median ms per write of each shape
over ``--repeats`` writes at random slots of a pool of the capture's CPU size, and the
machine's load average, which the figures depend on (2 shared cores here).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    p.add_argument("--shape", default="1x128", help="HEADSxDIM of K and V rows (default: %(default)s)")
    p.add_argument("--tokens", default="1,10,64,512,4096", help="tokens per write (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="timed writes per point (default: %(default)s)")
    p.add_argument("--rows", type=int, default=8256, help="pool slots per layer (default: the CPU capture's)")
    args = p.parse_args(argv)
    try:
        heads, dim = (int(x) for x in args.shape.lower().split("x"))
        tokens = [int(x) for x in args.tokens.split(",") if x]
    except ValueError:
        print(f"interpreter_shapes: cannot read --shape {args.shape!r} / --tokens {args.tokens!r}", file=sys.stderr)
        return 1
    if args.repeats < 1 or args.threads < 1 or min(tokens, default=0) < 1 or max(tokens) > args.rows:
        print("interpreter_shapes: --repeats, --threads and tokens must be >= 1, tokens <= --rows", file=sys.stderr)
        return 1

    import torch

    from kvprof.kvcache.writers.triton_fused import TritonFusedWriter
    from kvprof.kvcache.writers.triton_kernel import interpreted
    from kvprof.kvcache.writers.triton_tables import interpreted_config, pick_config

    if not interpreted():
        print("interpreter_shapes: the kernel is compiled, not interpreted (TRITON_INTERPRET=0?)", file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    k_buf = torch.zeros(args.rows + 1, heads, dim, dtype=torch.bfloat16)
    v_buf = torch.zeros_like(k_buf)
    row_bytes, row_elements = 2 * heads * dim * 2, 2 * (1 << max(0, heads * dim - 1).bit_length())
    print(f"# triton_fused under Triton's interpreter, {heads}x{dim} bf16 -> bf16, {args.threads} thread(s), "
          f"pool {args.rows} slots, median of {args.repeats}; load average {os.getloadavg()[0]:.2f}")
    print("# command: python lab/interpreter_shapes.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(f"{'tokens':>7} {'GPU table shape':>22} {'ms':>9} {'interpreter shape':>22} {'ms':>9}")
    for t in tokens:
        loc = torch.randperm(args.rows, generator=g)[:t]
        k = torch.randn(t, heads, dim, generator=g).to(torch.bfloat16)
        v = torch.randn(t, heads, dim, generator=g).to(torch.bfloat16)
        cells = []
        for cfg in (pick_config(row_bytes, t), interpreted_config(row_elements, t)):
            w = TritonFusedWriter(config=cfg)
            w.write(k_buf, v_buf, loc, k, v, torch.bfloat16)  # the first call builds the writer's plan
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                w.write(k_buf, v_buf, loc, k, v, torch.bfloat16)
                times.append(time.perf_counter() - t0)
            programs = -(-t // cfg.block_t) * cfg.split
            cells += [f"block_t={cfg.block_t} ({programs} prog)", f"{statistics.median(times) * 1e3:.1f}"]
        print(f"{t:>7} {cells[0]:>22} {cells[1]:>9} {cells[2]:>22} {cells[3]:>9}", flush=True)
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
