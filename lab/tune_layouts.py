#!/usr/bin/env python3
"""Time the MLA and paged Triton writers' candidate launch shapes on one GPU, the way
``python -m kvprof.bench.layouts`` times a write.

    cd <repo> && OUT=/tmp/out python lab/tune_layouts.py     # a few minutes; $OUT/tune-layouts.json

Why it exists: ``kvprof/kvcache/writers/layout_tables.py`` picks a launch shape for the MLA and paged
fused writers from the token count; this script measures the candidates it is chosen from (for
MLA with and without streaming stores). Each point is the layout bench's own case
(``kvprof.bench.layouts.LayoutCase``: MLA at DeepSeek-V3's 512 + 64 latent row as views of one
tensor, the paged cache at Llama-3.1-70B TP8 with key/value as views of the fused QKV output,
scattered slots, W writes per captured graph, median of the replays), every candidate first
checked bitwise against the layout's reference. The fastest few are timed again over
``TUNE_RECHECK`` more graph captures and the median decides, because one capture's median can
read low. It also times, at each point, the writer's current default, the best shape without
programmatic dependent launch, and SGLang's MLA store where SGLang is installed, so the gain of
each part is visible.

Environment: ``TUNE_LAYOUTS`` (``mla,paged``), ``TUNE_TOKENS`` (``1,8,64,512,4096,32768``),
``TUNE_RECHECK`` (3).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # the compiled kernels, whatever the shell says
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvprof.core.atomic import atomic_write_text  # noqa: E402  (after the path insert)

T0 = time.perf_counter()


def _env(name: str, default: str, parse, ok) -> list:  # noqa: ANN001
    """A comma-separated setting, refused in one line when it does not parse."""
    raw = os.environ.get(name, default)
    try:
        values = [parse(x) for x in raw.split(",") if x]
    except ValueError:
        values = []
    if not values or not all(ok(v) for v in values):
        raise SystemExit(f"tune_layouts.py: error: cannot use {name}={raw!r} (e.g. TUNE_LAYOUTS=mla,paged "
                         "TUNE_TOKENS=1,64 TUNE_RECHECK=3)")
    return values


LAYOUTS = _env("TUNE_LAYOUTS", "mla,paged", str, lambda v: v in ("mla", "paged"))
TOKENS = _env("TUNE_TOKENS", "1,8,64,512,4096,32768", int, lambda v: v > 0)
RECHECK = _env("TUNE_RECHECK", "3", int, lambda v: v > 0)[0]
DTYPES = (("bf16", "bf16"), ("fp8_e4m3", "bf16"))

# (block_t, num_warps, streaming stores) for MLA; (block_t, num_warps, split) for paged
MLA_CANDIDATES = [(bt, w, st) for bt in (1, 2, 4, 8, 16) for w in (1, 2, 4, 8) for st in (False, True)]
PAGED_CANDIDATES = [(bt, w, 1) for bt in (1, 2, 4, 8, 16, 32, 64) for w in (1, 2, 4, 8)] + [
    (1, 1, 2), (1, 2, 2), (2, 1, 2)]


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def make_writer(layout: str, cand: tuple, pdl: bool | None = None):  # noqa: ANN201
    from kvprof.kvcache.writers.mla_triton import MLATritonWriter
    from kvprof.kvcache.writers.paged_triton import PagedTritonWriter

    if layout == "mla":
        return MLATritonWriter(block_t=cand[0], num_warps=cand[1], pdl=pdl, stream=cand[2])
    return PagedTritonWriter(block_t=cand[0], num_warps=cand[1], split=cand[2], pdl=pdl)


def candidates(layout: str, tokens: int) -> list[tuple]:
    cands = MLA_CANDIDATES if layout == "mla" else PAGED_CANDIDATES
    return [c for c in cands if c[0] <= max(1, 2 * tokens)]  # no program mostly empty


def _compile_one(job: tuple) -> str:
    """Worker: one small write per candidate fills Triton's on-disk cache (same specialisation
    as the timed write: the same views, strides and dtype pair)."""
    layout, cache, inp, cand = job
    import torch

    from kvprof.bench.layouts import LayoutCase, LayoutPoint

    case = LayoutCase(LayoutPoint(layout, cache, inp, 2), torch.device("cuda"), 1 << 20, seed=0)
    for pdl in (None, False):
        w = make_writer(layout, cand, pdl)
        case.write(case.pool(w, small=True), case.locs[0])
    torch.cuda.synchronize()
    return f"{layout} {cache}<-{inp} {cand}"


def precompile() -> None:
    jobs = sorted({(layout, c, i, cand) for layout in LAYOUTS for c, i in DTYPES
                   for t in TOKENS for cand in candidates(layout, t)})
    log(f"compiling {len(jobs)} kernels x 2 (with and without PDL) in worker processes")
    ctx = __import__("multiprocessing").get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=min(12, os.cpu_count() or 1), mp_context=ctx) as ex:
        for f in cf.as_completed([ex.submit(_compile_one, j) for j in jobs]):
            try:
                f.result()
            except Exception as exc:  # noqa: BLE001  reported; the timing pass reports it again
                log(f"compile failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    log("compiled")


def time_writer(case, writer, replays: int = 100) -> float | str:  # noqa: ANN001
    from kvprof.bench.timing import time_graph

    try:
        wrong = case.check(writer)
    except Exception as exc:  # noqa: BLE001
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if wrong:
        return f"wrong: {wrong}"
    pool = case.pool(writer)

    def step() -> None:
        for loc in case.locs:
            case.write(pool, loc)

    try:
        return time_graph(step, case.writes, replays).median_us
    except Exception as exc:  # noqa: BLE001
        return f"failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def median_of(case, writer, n: int) -> float | str:  # noqa: ANN001
    vals = [time_writer(case, writer) for _ in range(n)]
    nums = [v for v in vals if isinstance(v, float)]
    return statistics.median(nums) if len(nums) == len(vals) else next(v for v in vals if not isinstance(v, float))


def main() -> int:
    import torch

    from kvprof.bench.layouts import LayoutCase, LayoutPoint
    from kvprof.kvcache.layouts import registry

    if not torch.cuda.is_available():
        print("tune_layouts.py: error: needs a CUDA device", file=sys.stderr)
        return 4
    out_dir = Path(os.environ.get("OUT", "."))
    precompile()
    try:
        peer = registry.create_writer("mla", "sglang_mla")
        peer_reason = peer.unsupported_reason(torch.device("cuda"), torch.bfloat16, torch.bfloat16)
    except Exception as exc:  # noqa: BLE001
        peer, peer_reason = None, str(exc)
    log(f"peer sglang_mla: {'available' if peer is not None and not peer_reason else peer_reason}")
    results = []
    for layout in LAYOUTS:
        for cache, inp in DTYPES:
            for t in TOKENS:
                case = LayoutCase(LayoutPoint(layout, cache, inp, t), torch.device("cuda"), 512 << 20, seed=t)
                first = {cand: time_writer(case, make_writer(layout, cand)) for cand in candidates(layout, t)}
                ok = sorted((v, c) for c, v in first.items() if isinstance(v, float))
                top = [c for _v, c in ok[:3]]
                rechecked = {c: median_of(case, make_writer(layout, c), RECHECK) for c in top}
                best = min((c for c in top if isinstance(rechecked[c], float)), key=lambda c: rechecked[c])
                default_us = median_of(case, registry.create_writer(layout, f"{layout}_triton"), RECHECK)
                no_pdl_us = median_of(case, make_writer(layout, best, pdl=False), RECHECK)
                peer_us = None
                if layout == "mla" and peer is not None and not peer.unsupported_reason(
                        torch.device("cuda"), case.cache, case.inp):
                    peer_us = median_of(case, peer, RECHECK)
                rec = {"layout": layout, "dtype": case.point.dtype_label, "tokens": t, "writes": case.writes,
                       "best": list(best), "best_us": rechecked[best], "default_us": default_us,
                       "best_no_pdl_us": no_pdl_us, "sglang_mla_us": peer_us,
                       "first_pass": {str(list(c)): v for c, v in first.items()},
                       "rechecked": {str(list(c)): v for c, v in rechecked.items()}}
                results.append(rec)
                log(f"{layout} {case.point.dtype_label:14} x{t:<6} best {best} {rechecked[best]:.3f} us; default "
                    f"{default_us if isinstance(default_us, str) else f'{default_us:.3f}'}; no PDL "
                    f"{no_pdl_us if isinstance(no_pdl_us, str) else f'{no_pdl_us:.3f}'}"
                    + (f"; sglang_mla {peer_us:.3f}" if isinstance(peer_us, float) else ""))
                del case
                torch.cuda.empty_cache()
    from kvprof.kvcache.devinfo import device_properties, versions

    doc = {"kind": "kvprof-tune-layouts", "device": device_properties(torch.device("cuda")), "versions": versions(),
           "recheck": RECHECK, "results": results}
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "tune-layouts.json", json.dumps(doc, indent=1, default=str) + "\n")
    log(f"wrote {out_dir / 'tune-layouts.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
