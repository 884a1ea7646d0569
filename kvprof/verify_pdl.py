"""PDL visibility: does a kernel launched right after a write, with programmatic dependent
launch, read the rows just written once it has passed its own ``griddepcontrol.wait``?

A writer that launches with PDL lets the next kernel on its stream start before it ends;
SGLang's JIT ``store_cache`` issues ``griddepcontrol.launch_dependents`` before its own
stores, so what its consumers read rests on their ``griddepcontrol.wait``. This check
launches, after each write, a reader with PDL (``launch_pdl=True``) whose first instruction
is ``griddepcontrol.wait``; it then compares every row the write wrote with the row that
write must leave (each writer's own, written once before with a device sync: ``verify``
holds that against the reference) and counts the rows that differ: stale reads.

Each trial alternates two input sets whose rows differ everywhere, so a stale row is the
previous trial's. Writes go through the layout's engine call (the pool, as ``verify``), on
the current stream, back to back with no host sync between trials, over several token
counts (the writer's and the reader's grid sizes). CUDA, sm_90+ (PDL), compiled kernels only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from kvprof.core.errors import DeviceError, Setting, Words
from kvprof.core.verify import PdlResult, PdlTally
from kvprof.kvcache.contracts import Writer
from kvprof.kvcache.layouts.layout import Layout, get_layout
from kvprof.verify import Case, Inputs, buffers, make_pool, targets, write

DEFAULT_TOKENS = (1, 7, 64, 512, 4096)
DEFAULT_TRIALS = 256
SHAPES = {"mha": {"heads": 8, "dim": 128, "v_dim": 128, "page": 1},  # Llama-3.1-70B's KV heads at TP1
          "mla": {"rank": 512, "rope": 64, "page": 1},  # DeepSeek-V3
          "paged": {"block": 16, "heads": 8, "dim": 128}}
ROPE_SHAPE = {"q_heads": 64, "heads": 8, "dim": 128, "v_dim": 128, "rope_dim": 128, "page": 1}
MAX_POSITION = 8192

_KERNEL: Any = None


def pdl_refusal(device: torch.device) -> Words | None:
    """Why this device cannot run the check (one line, naming the check by its setting), None
    when it can."""
    import os

    check = ("verify ", Setting("pdl"))
    if device.type != "cuda":
        return Words(*check, f" needs a CUDA GPU with programmatic dependent launch (sm_90+); the device is "
                     f"{device.type}")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        return Words(*check, f" needs sm_90+ (programmatic dependent launch); {torch.cuda.get_device_name(device)} "
                     f"is sm_{major}{minor}")
    if os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no", "off"):
        return Words(*check, " needs compiled kernels: TRITON_INTERPRET is set")
    return None


def _reader() -> Any:
    """The dependent kernel (Triton, compiled at first use): wait, then count rows that differ."""
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def read_rows(buf0, buf1, want0, want1, loc, stale, bytes0, bytes1, BLOCK: tl.constexpr,  # noqa: N803
                  PDL: tl.constexpr):  # noqa: N803
        if PDL:  # off only where Triton's interpreter runs it (a CPU test of the counting)
            tl.extra.cuda.gdc_wait()  # griddepcontrol.wait: every read below comes after it
        t = tl.program_id(0)
        which = tl.program_id(1)
        slot = tl.load(loc + t).to(tl.int64)
        row_bytes = tl.where(which == 0, bytes0, bytes1)
        offs = tl.arange(0, BLOCK)
        bad = 0
        for start in range(0, tl.maximum(bytes0, bytes1), BLOCK):
            m = (start + offs) < row_bytes
            if which == 0:
                got = tl.load(buf0 + slot * bytes0 + start + offs, mask=m, other=0)
                want = tl.load(want0 + t * bytes0 + start + offs, mask=m, other=0)
            else:
                got = tl.load(buf1 + slot * bytes1 + start + offs, mask=m, other=0)
                want = tl.load(want1 + t * bytes1 + start + offs, mask=m, other=0)
            bad += tl.sum((got != want).to(tl.int32))
        tl.atomic_add(stale, tl.where(bad > 0, 1, 0).to(tl.int64))

    _KERNEL = read_rows
    return _KERNEL


def _case(layout: str, contract: str, tokens: int) -> Case:
    shape = dict(ROPE_SHAPE if contract == "rope" else SHAPES[layout])
    return Case(layout=layout, contract=contract, index=0, cache=torch.bfloat16, inp=torch.bfloat16, tokens=tokens,
                pattern="random", loc_dtype=torch.int64, form="dense", check_slots=False, layer=0, start_layer=0,
                scale=None, shape=shape, is_neox=True)


def _inputs(case: Case, slots: int, loc: torch.Tensor, seed: int, device: torch.device) -> Inputs:
    gen = torch.Generator().manual_seed(seed)
    s = case.shape
    t = case.tokens

    def rows(heads: int, dim: int) -> torch.Tensor:
        return torch.randn(t, heads, dim, generator=gen).to(case.inp).to(device)

    if case.layout == "mla":
        return Inputs(loc, rows(1, s["rank"]), rows(1, s["rope"]), None)
    if case.contract == "rope":
        from kvprof.kvcache.writers.rope_reference import cos_sin_table

        positions = torch.randint(0, MAX_POSITION, (t,), generator=gen).to(device)
        return Inputs(loc, rows(s["heads"], s["dim"]), rows(s["heads"], s["v_dim"]), None,
                      rows(s["q_heads"], s["dim"]), positions, cos_sin_table(MAX_POSITION, s["rope_dim"]).to(device))
    return Inputs(loc, rows(s["heads"], s["dim"]), rows(s["heads"], s.get("v_dim", s["dim"])), None)


def _slots(case: Case) -> int:
    """Room for the largest grid, slot 0 never used (SGLang's dummy), pages/blocks whole."""
    need = case.tokens * 2 + 16
    unit = case.shape.get("block") or case.shape.get("page") or 1
    return (need + unit - 1) // unit * unit + (0 if case.layout == "paged" else case.shape.get("page", 1))


def check_writer(layout: Layout, writer: Writer, contract: str, tokens: int, trials: int,
                 device: torch.device, seed: int) -> tuple[int, int]:
    """(reads, stale) of ``trials`` writes of ``tokens`` tokens, each followed by the PDL reader."""
    case = _case(layout.name, contract, tokens)
    slots = _slots(case)
    pool = make_pool(layout, case, writer, slots, device)
    gen = torch.Generator().manual_seed(seed)
    loc = (torch.randperm(slots - 1, generator=gen)[:tokens] + 1).to(device)
    sets = [_inputs(case, slots, loc, seed * 2 + i, device) for i in range(2)]
    pristine = [(x.q.clone(), x.k.clone()) if x.q is not None else None for x in sets]
    bufs = [b for name, b in buffers(pool) if name.endswith("[0]")]
    want = []
    for x, saved in zip(sets, pristine):  # each set's rows as this writer leaves them
        if saved is not None:
            assert x.q is not None
            x.q.copy_(saved[0])
            x.k.copy_(saved[1])
        write(layout, case, pool, x)
        torch.cuda.synchronize(device)
        want.append([b[loc].contiguous() for b in bufs])
    for a, b in zip(*want):
        if not bool((a != b).any(dim=1).all()):
            raise DeviceError(f"{writer.name}: the two input sets left a row alike; no stale read could show")
    kernel = _reader()
    stale = torch.zeros(1, dtype=torch.int64, device=device)
    b0, b1 = bufs[0], bufs[-1]
    w = [(ws[0], ws[-1]) for ws in want]
    block = 256
    grid = (tokens, len(bufs))
    for i in range(trials):
        x, saved = sets[i % 2], pristine[i % 2]
        if saved is not None:  # rope rotates q and k in place: each write starts from the same inputs
            assert x.q is not None
            x.q.copy_(saved[0])
            x.k.copy_(saved[1])
        write(layout, case, pool, x)
        kernel[grid](b0, b1, w[i % 2][0], w[i % 2][1], loc, stale, b0.shape[1], b1.shape[1], BLOCK=block,
                     PDL=True, launch_pdl=True)
    torch.cuda.synchronize(device)
    return trials * tokens * len(bufs), int(stale.item())


def verify_pdl(variants: Sequence[str] | None = None, layouts: Sequence[str] | None = None, *,
               device: torch.device, trials: int = DEFAULT_TRIALS, tokens: Sequence[int] = DEFAULT_TOKENS,
               seed: int = 0) -> PdlResult:
    """Stale reads per writer that launches with PDL (or whose library decides: SGLang's
    kernels), over ``trials`` writes at each token count. A ``DeviceError`` where the device
    cannot run it (no CUDA, before sm_90, Triton interpreted)."""
    why = pdl_refusal(device)
    if why is not None:
        raise DeviceError(why)
    start = time.perf_counter()
    result = PdlResult(device=f"{device} ({torch.cuda.get_device_name(device)})", trials=trials, tokens=list(tokens))
    runnable, skipped = targets(variants, layouts, device)
    for t in runnable:
        says = t.writer.launches_pdl(device)
        tally = PdlTally(t.layout, t.spec, t.contract, "yes" if says else "library", list(tokens), trials)
        if says is False:
            if variants:
                tally.skipped = "launches without PDL (its writes wait for the kernel before them)"
                result.writers.append(tally)
            continue
        if torch.bfloat16 not in {c for c, i in t.pairs if c == i}:
            tally.skipped = "does not write bf16 rows of bf16 inputs here"
            result.writers.append(tally)
            continue
        began = time.perf_counter()
        layout = get_layout(t.layout)
        try:
            for n in tokens:
                reads, stale = check_writer(layout, t.writer, t.contract, n, trials, device, seed)
                tally.reads += reads
                tally.stale += stale
        except ValueError as exc:  # the writer refused the shape: say so, count nothing
            tally.skipped = f"refused: {exc}"
        tally.seconds = time.perf_counter() - began
        result.writers.append(tally)
    result.writers += [PdlTally(w.layout, w.writer, w.contract, skipped=w.skipped) for w in skipped]
    result.elapsed_s = time.perf_counter() - start
    return result


__all__ = ["DEFAULT_TOKENS", "DEFAULT_TRIALS", "check_writer", "pdl_refusal", "verify_pdl"]
