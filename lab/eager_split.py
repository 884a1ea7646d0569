#!/usr/bin/env python3
"""Where an eager Triton write's host time goes, layer by layer of its launch path.

    cd <repo> && OUT=/tmp/out python lab/eager_split.py [--tokens 1,64] [--calls 200] [--repeats 30]

Why it exists: ``kvprof bench --modes eager`` times a whole write (10.4 µs for triton_fused on
an H100 host against 4.1 µs for the compiled CUDA op) and says nothing of where the time goes
between kvprof's Python, the compiled launcher's key and Triton's own launch layers. Here each
layer is timed alone on the same arguments, host µs per call (the loop of ``--calls`` calls
before a synchronize, median and IQR over ``--repeats``), on a CUDA device:

- ``writer``: the writer's ``write_unchecked`` (what bench's "writer alone" times):
  ``triton_fused`` (8x128 rows) for each ``--dtypes``, and ``rope_triton_fused`` (8 q heads, 1
  k/v head of 128, bf16; ``--rope``) for bf16: with the launcher's C++ signature helper, the
  call keyed by its tensors' signature and launched through the kept kernel's SignedLaunch;
- ``writer (python key)``: the same write with the helper left out (the writer's own Python
  key, then the launcher's);
- ``launcher``: the compiled launcher's ``launch`` with the arguments the writer passes;
- ``key``: the launcher's key function alone;
- ``run(tensors)`` / ``run(addresses)``: Triton's ``CompiledKernel.run`` of the kept kernel,
  given the tensors (Triton's C launcher calls ``data_ptr`` and asks the driver about each
  pointer) or their addresses;
- ``launch(addresses)``: the C launch function behind ``run``, called directly (Triton 3.3-3.6);
- ``cuda_fused``: the compiled CUDA op's write, for reference; ``empty``: one empty Triton
  kernel through the same direct launch (the floor of any launch through Triton's C launcher).

Writes ``$OUT/eager-split.json`` and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def timed(fn: Callable[[], object], calls: int, repeats: int, device: Any) -> dict[str, float]:
    """Host µs per call: ``calls`` calls timed, then a synchronize (not timed), ``repeats``
    times (``kvprof.bench.timing.time_eager``, the bench's own eager timing)."""
    from kvprof.bench.timing import time_eager

    def loop() -> None:
        for _ in range(calls):
            fn()

    t = time_eager(loop, calls, repeats, device)
    return {"median_us": t.host_us, "iqr_us": t.host_spread_us}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="1,64")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--dtypes", default="bf16,fp8_e4m3")
    ap.add_argument("--no-rope", dest="rope", action="store_false", help="leave out rope_triton_fused")
    args = ap.parse_args()
    try:
        token_counts = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        raise SystemExit(f"eager_split.py: --tokens must be integers separated by commas, got {args.tokens!r}") \
            from None
    if min(token_counts) < 1 or args.calls < 1 or args.repeats < 4:
        raise SystemExit("eager_split.py: tokens and --calls must be positive, --repeats at least 4 (an IQR)")

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("eager_split.py: needs a CUDA device")
    from kvprof.core.atomic import atomic_write_text
    from kvprof.kvcache import signature as tensor_signature
    from kvprof.kvcache.dtypes import parse_dtype
    from kvprof.kvcache.writers import triton_launch
    from kvprof.kvcache.writers.triton_launch import direct_launch, launcher_for

    dev = torch.device("cuda")
    try:
        dtypes = [(name, parse_dtype(name)) for name in args.dtypes.split(",")]
    except Exception as exc:  # noqa: BLE001 - said in one line
        raise SystemExit(f"eager_split.py: --dtypes: {exc}") from None
    results: list[dict[str, Any]] = []
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; host µs per call, "
          f"{args.calls} calls x {args.repeats} repeats: median (IQR)")
    print(f"{'writer':<18} {'dtype':<9} {'tokens':>6}  {'layer':<20} {'µs':>7} {'IQR':>6}")
    empty = _empty_kernel()
    direct_found = False
    cases = _cases(dtypes, token_counts, args.rope, dev)
    for wname, dname, tokens, write, cuda_write, kernel_fn in cases:
        write()  # compiles, keeps the kernel
        la = launcher_for(kernel_fn)
        seen: list[tuple[Any, ...]] = []
        real = la.launch

        def spy(grid: Any, args: Any, consts: Any, num_warps: int, pdl: bool = False, fp_fusion: bool = True,
                fixed: tuple[int, ...] = ()) -> None:
            seen.append((grid, args, consts, num_warps, pdl, fp_fusion, fixed))

        signature = tensor_signature.SIGNATURE
        tensor_signature.SIGNATURE = None  # the Python path, which calls launch

        def python_key(write: Callable[[], object] = write, signature: Any = signature) -> None:
            tensor_signature.SIGNATURE = None
            try:
                write()
            finally:
                tensor_signature.SIGNATURE = signature

        la.launch = spy  # type: ignore[method-assign]
        try:
            write()
        finally:
            del la.launch
            tensor_signature.SIGNATURE = signature
        write()  # keeps the signed launch (where the helper is built)
        grid, targs, consts, warps, pdl, fusion, fixed = seen[0]
        real(grid, targs, consts, warps, pdl, fusion, fixed)
        torch.cuda.synchronize()
        assert la._keyfn is not None
        arg_key, addresses = la._keyfn(targs)
        key = (torch.cuda.current_device(), consts, warps, pdl, fusion, arg_key, fixed)
        run, function, packed, direct = la._kernels[key]
        stream = torch.cuda.current_stream().cuda_stream
        gy = grid[1] if len(grid) > 1 else 1
        layers: dict[str, Callable[[], object]] = {
            "writer": write,
            "writer (python key)": python_key,
            "launcher": lambda: real(grid, targs, consts, warps, pdl, fusion, fixed),
            "key": lambda: la._keyfn(targs),  # type: ignore[misc]
            "run(tensors)": lambda: run(grid[0], gy, 1, stream, function, packed, None, None, None, *targs,
                                        *fixed, *consts),
            "run(addresses)": lambda: run(grid[0], gy, 1, stream, function, packed, None, None, None,
                                          *addresses, *fixed, *consts),
        }
        found = direct or direct_launch(run)
        if found is not None:
            direct_found = True
            launch, prefix = found
            layers["launch(addresses)"] = lambda: launch(grid[0], gy, 1, stream, function, *prefix, packed, None,
                                                         None, None, *addresses, *fixed, *consts)
        if cuda_write is not None:
            layers["cuda_fused"] = cuda_write
        if empty is not None:
            layers["empty"] = empty
        for name, fn in layers.items():
            r = timed(fn, args.calls, args.repeats, dev)
            results.append({"writer": wname, "dtype": dname, "tokens": tokens, "layer": name, **r})
            print(f"{wname:<18} {dname:<9} {tokens:>6}  {name:<20} {r['median_us']:7.2f} {r['iqr_us']:6.2f}",
                  flush=True)
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "calls": args.calls,
            "repeats": args.repeats, "direct": direct_found, "signature": tensor_signature.state()}
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    dest = Path(os.environ.get("OUT", "/tmp/kvprof-gpu")) / "eager-split.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(dest, json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    print(f"signature helper: {tensor_signature.state()}; signed launches: "
          f"{sum(c.get('signed', 0) for c in triton_launch.launch_counts().values())}")
    print(f"wrote {dest}")


Case = tuple[str, str, int, Callable[[], object], Callable[[], object] | None, Any]


def _cases(dtypes: list[tuple[str, Any]], token_counts: list[int], rope: bool, dev: Any) -> list[Case]:
    """(writer, dtype name, tokens, the write, the compiled CUDA op's write or None, the kernel)
    for triton_fused per dtype and token count, and rope_triton_fused per token count in bf16."""
    import torch

    from kvprof.kvcache.dtypes import store_dtype_for
    from kvprof.kvcache.writers import rope_triton_kernel, triton_kernel
    from kvprof.kvcache.writers.cuda_fused import CudaFusedWriter
    from kvprof.kvcache.writers.rope_reference import cos_sin_table
    from kvprof.kvcache.writers.rope_triton import RopeTritonFusedWriter
    from kvprof.kvcache.writers.triton_fused import TritonFusedWriter

    heads, dim, rows = 8, 128, 4097
    cases: list[Case] = []
    for dname, dtype in dtypes:
        scale = None if dtype == torch.bfloat16 else 0.5
        for tokens in token_counts:
            k_buf = torch.zeros(rows, heads, dim, dtype=store_dtype_for(dtype), device=dev)
            v_buf = torch.zeros_like(k_buf)
            x = torch.randn(tokens, heads, dim, device=dev).to(torch.bfloat16)
            loc = (torch.randperm(rows - 1, device=dev)[:tokens] + 1)
            writer = TritonFusedWriter()
            cuda = CudaFusedWriter()
            cuda_write: Callable[[], object] | None = None
            if not cuda.unsupported_reason(dev, dtype, torch.bfloat16):
                cuda.prepare(dev)
                cuda_write = (lambda cuda=cuda, k_buf=k_buf, v_buf=v_buf, loc=loc, x=x, dtype=dtype,  # noqa: E731
                              scale=scale: cuda.write_unchecked(k_buf, v_buf, loc, x, x, dtype, scale, scale))
            cases.append(("triton_fused", dname, tokens,
                          lambda writer=writer, k_buf=k_buf, v_buf=v_buf, loc=loc, x=x, dtype=dtype, scale=scale:
                          writer.write_unchecked(k_buf, v_buf, loc, x, x, dtype, scale, scale),
                          cuda_write, triton_kernel.store_kv_kernel))
            if dtype == torch.bfloat16 and rope:
                qkv = torch.randn(tokens, 10 * dim, device=dev).to(torch.bfloat16)
                q, k, v = (qkv[:, :8 * dim].view(tokens, 8, dim), qkv[:, 8 * dim:9 * dim].view(tokens, 1, dim),
                           qkv[:, 9 * dim:].view(tokens, 1, dim))
                kb = torch.zeros(rows, 1, dim, dtype=torch.bfloat16, device=dev)
                vb = torch.zeros_like(kb)
                pos = torch.arange(tokens, device=dev)
                cs = cos_sin_table(8192, dim).to(dev)
                rw = RopeTritonFusedWriter()
                cases.append(("rope_triton_fused", dname, tokens,
                              lambda rw=rw, q=q, k=k, v=v, kb=kb, vb=vb, loc=loc, pos=pos, cs=cs:
                              rw.write_unchecked(q, k, v, kb, vb, loc, pos, cs, True, torch.bfloat16, None, None),
                              None, rope_triton_kernel.rope_kv_kernel))
    return cases


def _empty_kernel() -> Callable[[], object] | None:
    """One empty Triton kernel (one program) through its C launch function, or None."""
    try:
        import torch
        import triton
        import triton.language as tl  # noqa: F401

        @triton.jit
        def empty_kernel(x):  # type: ignore[no-untyped-def]
            pass

        buf = torch.zeros(16, device="cuda")
        k = empty_kernel[(1,)](buf)
        from kvprof.kvcache.writers.triton_launch import direct_launch

        found = direct_launch(k.run)
        if found is None:
            return None
        launch, prefix = found
        stream = torch.cuda.current_stream().cuda_stream
        ptr = buf.data_ptr()
        return lambda: launch(1, 1, 1, stream, k.function, *prefix, k.packed_metadata, None, None, None, ptr)
    except Exception as exc:  # noqa: BLE001 - the floor is optional
        print(f"(no empty kernel: {type(exc).__name__}: {exc})")
        return None


if __name__ == "__main__":
    main()
