"""Host cost per call of kvprof's Triton writers' own Python, the launch left out (any CPU).

An eager Triton write is the writer's Python (its plan and shape memos, strides, scales, the
mode bits), then the compiled launcher (``kvprof.kvcache.writers.triton_launch``: the key,
then Triton's C launch). On a GPU ``lab/eager_split.py`` times those layers; this times the
first two without a GPU: each writer's ``write_unchecked`` with its launcher replaced by one
that keeps the kernel's arguments under the launcher's own key (``CompiledLauncher`` over a
stand-in kernel whose launch does nothing), so what is timed is kvprof's part of the host
path. ``triton_fused`` runs twice: as the interpreter plans it and with ``convert="hw"``, the
GPU's fp8 cast decision (the per-call layout check a GPU write makes).

Each writer runs twice: keyed by its own Python (the C++ signature helper left out) and keyed
by the signature of its tensors (``kvprof.kvcache.signature.SIGNATURE``, built here if a C++ compiler is
found), which launches through the kept kernel's ``SignedLaunch``. Prints medians (and IQRs) of
repeated timed loops, µs per call, measured in this one run, and their ratio.

    TRITON_INTERPRET=1 python benchmarks/bench_triton_host.py [--calls 20000] [--repeats 7] [--tokens 64]
"""

from __future__ import annotations

import argparse
import os
import platform
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TRITON_INTERPRET", "1")  # the writers plan as on a CPU; nothing is launched

import torch  # noqa: E402

from kvprof.bench.timing import time_eager  # noqa: E402
from kvprof.kvcache import signature as tensor_signature  # noqa: E402
from kvprof.kvcache.writers import mla_triton, paged_triton, rope_triton, triton_fused, triton_launch  # noqa: E402
from kvprof.kvcache.writers.rope_reference import cos_sin_table  # noqa: E402


class _Kept:
    """A kept kernel whose launch does nothing."""

    function = 0
    packed_metadata = (4, 1, 0)
    metadata = None

    def run(self, *args: Any) -> None:
        return None


class _Kernel:
    """Stands in for a ``@triton.jit`` kernel: its parameters, and a first launch that keeps ``_Kept``."""

    def __init__(self, fn: Any) -> None:
        self.arg_names = list(fn.arg_names)
        self.do_not_specialize = list(getattr(fn, "do_not_specialize", []) or [])

    def __getitem__(self, grid: Any) -> Callable[..., _Kept]:
        return lambda *args, **kwargs: _Kept()


def _launcher(fn: Any) -> triton_launch.CompiledLauncher:
    return triton_launch.CompiledLauncher(_Kernel(fn), "stand-in", compiled=True, device=lambda: 0,
                                          stream=lambda d: 0, hooks=lambda: False)


def _timed(fn: Callable[[], object], calls: int, repeats: int) -> tuple[float, float]:
    """µs per call, median and IQR of ``repeats`` loops of ``calls`` calls (the bench's own
    eager timing, ``kvprof.bench.timing.time_eager``; on a CPU there is nothing to synchronize)."""

    def loop() -> None:
        for _ in range(calls):
            fn()

    for _ in range(2000):  # the first calls keep the kernel and fill the memos
        fn()
    t = time_eager(loop, calls, repeats, torch.device("cpu"))
    return t.host_us, t.host_spread_us  # type: ignore[return-value]


def cases(tokens: int) -> dict[str, Callable[[], object]]:
    """Writer name -> one write of ``tokens`` tokens with the launch stubbed."""
    out: dict[str, Callable[[], object]] = {}
    store = _launcher(triton_fused.kernel.store_kv_kernel)
    triton_fused.launcher_for = lambda fn, name=None: store  # type: ignore[assignment]
    x = torch.randn(tokens, 8, 128).to(torch.bfloat16)
    loc = torch.arange(tokens)
    slots = loc + 1  # MLA's slot 0 is skipped
    for label, convert in (("", "auto"), (" hw", "hw")):
        for dname, dtype, scale in (("bf16", torch.bfloat16, None), ("fp8", torch.float8_e4m3fn, 0.5)):
            w = triton_fused.TritonFusedWriter(convert=convert)
            buf = torch.zeros(4 * tokens + 1, 8, 128, dtype=torch.bfloat16 if dtype == torch.bfloat16 else torch.uint8)
            vbuf = torch.zeros_like(buf)
            out[f"triton_fused{label} {dname}"] = (
                lambda w=w, buf=buf, vbuf=vbuf, dtype=dtype, scale=scale:
                w.write_unchecked(buf, vbuf, loc, x, x, dtype, scale, scale))
    rope = _launcher(rope_triton.kernel.rope_kv_kernel)
    rope_triton.launcher_for = lambda fn, name=None: rope  # type: ignore[assignment]
    qkv = torch.randn(tokens, 10 * 128).to(torch.bfloat16)
    q, k, v = (qkv[:, :1024].view(tokens, 8, 128), qkv[:, 1024:1152].view(tokens, 1, 128),
               qkv[:, 1152:].view(tokens, 1, 128))
    kb = torch.zeros(4 * tokens + 1, 1, 128, dtype=torch.bfloat16)
    vb = torch.zeros_like(kb)
    cs = cos_sin_table(8192, 128)
    rw = rope_triton.RopeTritonFusedWriter()
    out["rope_triton_fused bf16"] = lambda: rw.write_unchecked(q, k, v, kb, vb, slots, loc, cs, True, torch.bfloat16,
                                                               None, None)
    mla = _launcher(mla_triton._mla_store_kernel)
    mla_triton.launcher_for = lambda fn, name=None: mla  # type: ignore[assignment]
    mw = mla_triton.MLATritonWriter()
    kv = torch.zeros(4 * tokens + 2, 1, 576, dtype=torch.bfloat16)
    latent = torch.randn(tokens, 1, 576).to(torch.bfloat16)
    nope, rope_part = latent[..., :512], latent[..., 512:]
    out["mla_triton bf16"] = lambda: mw.write_unchecked(kv, slots, nope, rope_part, torch.bfloat16, 0)
    paged = _launcher(paged_triton._paged_store_kernel)
    paged_triton.launcher_for = lambda fn, name=None: paged  # type: ignore[assignment]
    pw = paged_triton.PagedTritonWriter()
    kc = torch.zeros(-(-(8 * tokens + 64) // 16), 16, 8, 128, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    out["paged_triton bf16"] = lambda: pw.write_unchecked(kc, vc, loc, x, x, torch.bfloat16, None, None)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=64)
    args = ap.parse_args()
    if args.calls < 1 or args.repeats < 1 or args.tokens < 1:
        raise SystemExit("bench_triton_host.py: --calls, --repeats and --tokens must be positive")
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, Python "
          f"{platform.python_version()}; {args.tokens} tokens, median (IQR) of {args.repeats} x {args.calls} calls, "
          "µs per call, the launch stubbed")
    why = tensor_signature.load()
    signature = tensor_signature.SIGNATURE
    print(f"the launcher's C++ signature helper: {why or 'built'}")
    print(f"{'writer':<26} {'python key':>10} {'IQR':>6} {'signed':>7} {'IQR':>6} {'ratio':>6}")
    rows: dict[str, list[float]] = {}
    for mode in ("python", "signed"):
        tensor_signature.SIGNATURE = signature if mode == "signed" else None
        if mode == "signed" and signature is None:
            break
        for name, fn in cases(args.tokens).items():
            rows.setdefault(name, []).extend(_timed(fn, args.calls, args.repeats))
    tensor_signature.SIGNATURE = signature
    for name, r in rows.items():
        signed = f"{r[2]:7.2f} {r[3]:6.2f} {r[0] / r[2]:6.2f}" if len(r) == 4 else "   n/a"
        print(f"{name:<26} {r[0]:10.2f} {r[1]:6.2f} {signed}", flush=True)
    # the helper alone on the rope write's eight tensors, beside the same reads from Python
    qkv = torch.randn(args.tokens, 10 * 128).to(torch.bfloat16)
    tensors = (qkv[:, :1024].view(args.tokens, 8, 128), qkv[:, 1024:1152].view(args.tokens, 1, 128),
               qkv[:, 1152:].view(args.tokens, 1, 128), torch.zeros(9, 1, 128), torch.zeros(9, 1, 128),
               torch.arange(args.tokens), torch.arange(args.tokens), cos_sin_table(8192, 128))

    def python_reads() -> object:
        return tuple((t.dtype, t.is_cuda, t.data_ptr(), t.shape, t.stride()) for t in tensors)

    reads = _timed(python_reads, args.calls, args.repeats)
    line = f"# eight tensors' dtype, device, address, shape and strides: Python {reads[0]:.2f} µs"
    if signature is not None:
        helper = _timed(lambda: signature(*tensors), args.calls, args.repeats)
        line += f", the C++ helper {helper[0]:.2f} µs"
    print(line)


if __name__ == "__main__":
    main()
