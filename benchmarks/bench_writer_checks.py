"""Host cost per call of the checks every writer runs on its own calls (``check_write``).

Each contract (MHA store ``KVWriter``, ``MLAWriter``, ``PagedWriter``, the rope contract
``RopeKVWriter``) checks a call before its writer's own ``write`` runs
(``kvprof.kvcache.contracts.ChecksItsCalls``). A writer that does nothing isolates that cost:
``write`` (checked) minus ``write_unchecked`` (the writer's own, as the pools call it after
their checks) is what the checks add per call: in Python on every call ("write", the C++ call
key left out), and kept per call key ("kept write": ``checked_call`` takes a passed call's
result for the same tensors and arguments and reads only the values; one call repeated, as an
engine's layers repeat theirs). ``check_write`` alone is timed too, and the MHA pool's own checks
(``check_write_inputs``) beside them for scale. On a CPU the checks
also read the slots (and positions) to refuse one out of range: that part grows with the
token count (a list's min/max up to 64 tokens, ``torch.aminmax`` above), so three token
counts are timed; on a GPU the values are not read (a sync) and the cost is flat.

Prints medians of repeated timed loops, measured in this one run.

    python benchmarks/bench_writer_checks.py [--device cpu|cuda] [--calls 20000] [--repeats 7] [--clock thread|wall]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kvprof.kvcache import signature
from kvprof.kvcache.contracts import KVWriter, MLAWriter, PagedWriter, RopeKVWriter
from kvprof.kvcache.validation import check_write_inputs
from kvprof.kvcache.writers.rope_reference import cos_sin_table


class NullStore(KVWriter):
    name = "null_store"

    def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):  # noqa: ANN001
        return "null"


class NullMLA(MLAWriter):
    name = "null_mla"

    def write(self, kv_buf, loc, nope, rope, dtype, skip):  # noqa: ANN001
        return "null"


class NullPaged(PagedWriter):
    name = "null_paged"

    def write(self, k_cache, v_cache, slots, key, value, dtype, k_scale, v_scale):  # noqa: ANN001
        return "null"


class NullRope(RopeKVWriter):
    name = "null_rope"

    def write(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,  # noqa: ANN001
              k_scale=None, v_scale=None):
        return "null"


CLOCKS = {"thread": time.thread_time_ns, "wall": time.perf_counter_ns}


def per_call_ns(fn: Callable[[], Any], calls: int, repeats: int, clock: Callable[[], int]) -> float:
    for _ in range(min(calls, 1000)):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = clock()
        for _ in range(calls):
            fn()
        samples.append((clock() - t0) / calls)
    return statistics.median(samples)


def cases(tokens: int, device: torch.device) -> list[tuple[str, Any, tuple[Any, ...], Callable[[], Any] | None]]:
    """(contract, writer, the call's arguments, the pool's own check of that call or None)."""
    bf16 = torch.bfloat16
    rows = 8 * tokens + 8
    loc = torch.randperm(rows - 1)[:tokens].add(1).to(device)
    k = torch.randn(tokens, 8, 128).to(bf16).to(device)
    v = torch.randn(tokens, 8, 128).to(bf16).to(device)
    k_buf = torch.zeros(rows, 8, 128, dtype=bf16, device=device)
    v_buf = torch.zeros(rows, 8, 128, dtype=bf16, device=device)
    store = (k_buf, v_buf, loc, k, v, bf16, None, None)

    def pool_check() -> Any:
        return check_write_inputs(loc, k, v, 8, 128, 128, k_buf.device, k_buf.get_device(), k_buf, v_buf)

    kv = torch.zeros(rows, 1, 576, dtype=bf16, device=device)
    latent = torch.randn(tokens, 1, 576).to(bf16).to(device)
    mla = (kv, loc, latent[..., :512], latent[..., 512:], bf16, -1)
    k_cache = torch.zeros(rows // 16 + 1, 16, 8, 128, dtype=bf16, device=device)
    v_cache = torch.zeros_like(k_cache)
    paged = (k_cache, v_cache, loc, k, v, bf16, None, None)
    qkv = torch.randn(tokens, (32 + 16) * 128).to(bf16).to(device)
    q, kr, vr = qkv[:, :4096].view(tokens, 32, 128), qkv[:, 4096:5120].view(tokens, 8, 128), \
        qkv[:, 5120:].view(tokens, 8, 128)
    positions = torch.randint(0, 8192, (tokens,)).to(device)
    table = cos_sin_table(8192, 128).to(device)
    rope = (q, kr, vr, k_buf, v_buf, loc, positions, table, True, bf16, None, None)
    return [("MHA store (KVWriter)", NullStore(), store, pool_check), ("MLA (MLAWriter)", NullMLA(), mla, None),
            ("paged (PagedWriter)", NullPaged(), paged, None), ("rope + store (RopeKVWriter)", NullRope(), rope, None)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tokens", default="1,64,4096", help="token counts (default: %(default)s)")
    ap.add_argument("--clock", choices=CLOCKS, default="thread",
                    help="thread: this thread's CPU time (a shared machine's waits for a core not counted); "
                         "wall: elapsed time (default: %(default)s)")
    args = ap.parse_args()
    clock = CLOCKS[args.clock]
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"device {device} ({where}), torch {torch.__version__}, Python {platform.python_version()}; "
          f"median of {args.repeats} x {args.calls} calls, ns per call ({args.clock} clock)")
    why = signature.load()
    call_key = signature.CALL_KEY
    print(f"the C++ call key (checked_call's memo): {why or 'built'}")
    head = (f"{'contract':<28} {'tokens':>6} {'unchecked':>10} {'write':>10} {'checks add':>10} {'kept write':>10} "
            f"{'kept add':>9} {'check_write':>11} {'pool check':>10}")
    print(head)
    print("-" * len(head))
    for tokens in (int(t) for t in args.tokens.split(",")):
        for contract, writer, call, pool_check in cases(tokens, device):
            unchecked = per_call_ns(lambda w=writer, c=call: w.write_unchecked(*c), args.calls, args.repeats, clock)
            signature.CALL_KEY = None  # every call checked in Python
            try:
                checked = per_call_ns(lambda w=writer, c=call: w.write(*c), args.calls, args.repeats, clock)
            finally:
                signature.CALL_KEY = call_key
            kept = (per_call_ns(lambda w=writer, c=call: w.write(*c), args.calls, args.repeats, clock)
                    if call_key is not None else None)
            alone = per_call_ns(lambda w=writer, c=call: w.check_write(*c), args.calls, args.repeats, clock)
            pool = per_call_ns(pool_check, args.calls, args.repeats, clock) if pool_check else None
            kept_cols = f"{kept:>10.0f} {kept - unchecked:>9.0f}" if kept is not None else f"{'n/a':>10} {'':>9}"
            print(f"{contract:<28} {tokens:>6} {unchecked:>10.0f} {checked:>10.0f} {checked - unchecked:>10.0f} "
                  f"{kept_cols} {alone:>11.0f} {'' if pool is None else f'{pool:.0f}':>10}")


if __name__ == "__main__":
    main()
