"""Host cost per write of the instrumentation, on and off, with no profiler attached.

Target: under 2 µs added per write when on. A writer that does nothing isolates the
wrapper's own cost; index_put shows it beside a real (CPU) write. Prints medians of
repeated timed loops, measured in this one run.

    python benchmarks/bench_instrumentation.py [--calls 20000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvprof.kvcache.instrument import make_pool
from kvprof.kvcache.writers import KVWriter, create_writer


class NullWriter(KVWriter):
    name = "null"
    description = "does nothing: isolates the pool's and the wrapper's host cost"

    def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):  # noqa: ANN001
        return "null"


def per_call_us(pool, calls: int, repeats: int) -> float:
    loc = torch.tensor([1, 2, 3, 4])
    k = torch.randn(4, 1, 128).to(torch.bfloat16)
    for _ in range(1000):
        pool.set_kv_buffer(0, loc, k, k)
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            pool.set_kv_buffer(0, loc, k, k)
        samples.append((time.perf_counter_ns() - t0) / calls / 1000)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    assert not torch.autograd.profiler._is_profiler_enabled  # noqa: SLF001
    print(f"{'writer':<10} {'off µs/write':>13} {'on µs/write':>12} {'added µs':>9}  (median of {args.repeats} x "
          f"{args.calls})")
    for name, factory in (("null", NullWriter), ("index_put", lambda: create_writer("index_put"))):
        times = {}
        for on in (False, True):
            pool = make_pool(64, 1, torch.bfloat16, 1, 128, 1, "cpu", writer=factory(),
                             instrument=on, check_slots=False)
            times[on] = per_call_us(pool, args.calls if name == "null" else args.calls // 10, args.repeats)
        added = times[True] - times[False]
        verdict = "ok" if added < 2.0 else "OVER the 2 µs target"
        print(f"{name:<10} {times[False]:>13.3f} {times[True]:>12.3f} {added:>9.3f}  {verdict}")


if __name__ == "__main__":
    main()
