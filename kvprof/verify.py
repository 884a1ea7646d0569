"""Differential testing of KV writers: each writer against its layout's reference, case by case.

A case is one write drawn at random from a seed, the layout, the writer's name and the case's
number (so ``--case N`` reruns exactly it): cache and input dtypes (fp8 with and without
scales included, only pairs the writer says it runs), row shapes, the token count, the slot
pattern (random, a strided ``loc`` view, consecutive slots read through a strided view,
duplicate slots, padding slots, the first and last slot, a run of consecutive slots, no
tokens at all), the slots' dtype, how the inputs are laid out (dense, ``[tokens, heads *
dim]``, a token-strided view of a wider tensor, more rows than slots where the layout allows
it), whether the pool checks slot values, and which layer is written.

Two pools of the same shape start from the same random bytes (every layer, not only the one
written, so a write into the wrong layer or the wrong row shows); the reference writer writes
one, the writer under test the other, each from its own copy of the inputs; then every byte of
every buffer is compared. Where several tokens write one slot, engines leave the slot with
any one of their rows (threads race): each element of such a row must be that element of
one of those tokens' rows, as the reference converts them (written apart, into distinct
slots of a scratch pool). The rope contract (MHA: rotate q and k in place, store k and v)
is held against :func:`kvprof.kvcache.writers.rope_reference.rope_reference` in float32: q and k
within one unit in the last place of their dtype (an FMA-contracting kernel's rounding;
kvprof's own are bitwise, tests/test_rope_writers.py), v unchanged, and the cache rows
bitwise what the layout's reference stores for the rotated k the writer wrote back.

A writer may refuse a call (a one-line ``ValueError`` or a kvprof error) if it changes
nothing: a refusal with every buffer (and, for rope, q and k) as before counts as refused;
one that changed a byte counts as wrong. Any other exception is an error. A call the
reference refuses must be refused.

What it does not prove: a sample of cases is not every case; the values are finite normal
floats (no NaN or inf, whose payloads writers need not keep); each case is one write, so
races between writes (PDL, streams) are not exercised here.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from kvprof.core.errors import DeviceError, KvprofError, Setting, UsageError, Words
from kvprof.core.verify import ERROR, OK, REFUSED, WRONG, CaseReport, VerifyResult, WriterTally
from kvprof.kvcache.contracts import LAYOUTS, Writer
from kvprof.kvcache.dtypes import FP8_DTYPES, short_name
from kvprof.kvcache.instrument import make_layout_pool
from kvprof.kvcache.layouts.layout import Layout, get_layout

DEFAULT_BUDGET_S = 40.0
DEFAULT_CASES = 200
PATTERNS = ("random", "strided", "strided_run", "duplicate", "padding", "first_last", "run", "empty")
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
ROPE_FLOATS = (torch.float32, torch.bfloat16, torch.float16)
SCALES = (0.5, 3.0, 0.0137)
MAX_POSITION = 96
REFUSALS = (ValueError, KvprofError)
SHOWN_ROWS = 4  # wrong rows named in a case's detail


# --- cases -------------------------------------------------------------------------------------------

@dataclass
class Case:
    """One write to check, fully decided by (seed, layout, writer, index)."""

    layout: str
    contract: str
    index: int
    cache: torch.dtype
    inp: torch.dtype
    tokens: int
    pattern: str
    loc_dtype: torch.dtype
    form: str  # dense, flat, strided (a token-strided view), padded (paged: more rows than slots)
    check_slots: bool
    layer: int  # offset of the layer written within the pool (0 or 1 of 2)
    start_layer: int
    scale: float | str | None  # a number, "tensor:<value>", or None
    shape: dict[str, int] = field(default_factory=dict)
    seed: int = 0
    is_neox: bool = True

    def text(self) -> str:
        dt = short_name(self.cache) if self.inp == self.cache else f"{short_name(self.cache)}<-{short_name(self.inp)}"
        shape = " ".join(f"{k}={v}" for k, v in self.shape.items())
        rope = f" {'neox' if self.is_neox else 'gptj'}" if self.contract == "rope" else ""
        scale = f" scale={self.scale}" if self.scale is not None else ""
        loc = "int32" if self.loc_dtype == torch.int32 else "int64"
        return (f"{dt}{scale} {shape}{rope} tokens={self.tokens} slots={self.pattern} loc={loc}"
                f" inputs={self.form} check_slots={'on' if self.check_slots else 'off'} layer={self.layer}")


def dtype_pairs(layout: str, contract: str) -> list[tuple[torch.dtype, torch.dtype]]:
    """(cache, input) pairs a layout's write takes, before asking the writer."""
    if contract == "rope":
        return [(d, d) for d in ROPE_FLOATS] + [(f8, d) for f8 in FP8_DTYPES for d in ROPE_FLOATS]
    if layout == "paged":  # vLLM: "auto" stores its own dtype; fp8 takes fp32/bf16/fp16
        return [(d, d) for d in FLOATS] + [(f8, d) for f8 in FP8_DTYPES for d in FLOATS]
    pairs = [(d, d) for d in FLOATS] + [(torch.bfloat16, torch.float32), (torch.float16, torch.float32)]
    pairs += [(f8, d) for f8 in FP8_DTYPES for d in FLOATS]
    if layout == "mha":
        pairs += [(f8, f8) for f8 in FP8_DTYPES]
    return pairs


def draw_case(layout: str, contract: str, writer_key: str, index: int, seed: int,
              pairs: Sequence[tuple[torch.dtype, torch.dtype]]) -> Case:
    rng = random.Random(f"{seed}/{layout}/{contract}/{writer_key}/{index}")
    cache, inp = pairs[rng.randrange(len(pairs))]
    # the first two rounds: every pattern once with the pool's slot checks, once without (a
    # writer that checks its own inputs then gets the caller's strided loc as it is)
    first_rounds = index // len(PATTERNS)
    pattern = PATTERNS[index % len(PATTERNS)] if first_rounds < 2 else rng.choice(PATTERNS)
    if pattern == "empty":
        tokens = 0
    elif rng.random() < 0.8:
        tokens = rng.randint(1, 16)
    else:
        tokens = rng.randint(17, 130)
    if pattern in ("duplicate", "padding") and tokens < 2:
        tokens = 2
    if pattern == "first_last" and tokens < 2:
        tokens = 2
    scale: float | str | None = None
    if inp != cache and (layout == "mha" or layout == "paged"):  # MLA's cast takes no scale
        kind, value = rng.random(), rng.choice(SCALES)
        scale = value if kind < 0.4 else f"tensor:{value}" if kind < 0.8 else None
    if layout == "paged" and cache in FP8_DTYPES and scale is None and rng.random() < 0.5:
        scale = rng.choice(SCALES)
    forms = ["dense", "flat", "strided"] + (["padded"] if layout == "paged" else [])
    case = Case(layout=layout, contract=contract, index=index, cache=cache, inp=inp, tokens=tokens,
                pattern=pattern, loc_dtype=rng.choice((torch.int32, torch.int64)), form=rng.choice(forms),
                check_slots=first_rounds % 2 == 0 if first_rounds < 2 else rng.random() < 0.5,
                layer=rng.randint(0, 1), start_layer=rng.randint(0, 3),
                scale=scale, seed=rng.randrange(2**31), is_neox=rng.random() < 0.5)
    if contract == "rope":
        # mostly as models have them (GQA: q heads a multiple of k heads, full rotary, V as wide as K)
        dim = rng.choice((16, 32, 64, 128))
        rope_dim = rng.choice((dim, dim, dim // 2, max(2, (dim // 3) & ~1)))
        heads = rng.randint(1, 4)
        q_heads = heads * rng.randint(1, 4) if rng.random() < 0.8 else rng.randint(1, 8)
        case.shape = {"q_heads": q_heads, "heads": heads, "dim": dim, "v_dim": rng.choice((dim, dim, dim, 16)),
                      "rope_dim": rope_dim, "page": rng.choice((1, 1, 16))}
    elif layout == "mha":
        dim = rng.choice((8, 24, 64, 128))
        case.shape = {"heads": rng.randint(1, 4), "dim": dim, "v_dim": rng.choice((dim, dim, 16, 40)),
                      "page": rng.choice((1, 1, 16))}
    elif layout == "mla":
        rank, rope = rng.choice(((512, 64), (128, 64), (16, 8), (64, 32)))
        case.shape = {"rank": rank, "rope": rope, "page": rng.choice((1, 1, 16))}
    else:
        case.shape = {"block": rng.choice((1, 8, 16)), "heads": rng.randint(1, 4), "dim": rng.choice((8, 64, 128))}
    return case


def slot_count(case: Case) -> int:
    """Addressable slots of the case's pool: room for twice the tokens and a few more."""
    need = max(2 * case.tokens + 8, 24)
    if case.layout == "paged":
        block = case.shape["block"]
        return math.ceil(need / block) * block
    page = case.shape["page"]
    return need + (-need) % page + page  # size (a multiple of the page) + one page


def make_loc(case: Case, slots: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """The case's slots, as the pattern says (a strided view for the strided patterns)."""
    t = case.tokens
    pad = -1 if case.layout == "paged" else 0  # vLLM skips -1; SGLang pads with the dummy slot 0
    first = 0 if case.layout == "paged" else 1  # the first slot a real token gets
    usable = torch.randperm(slots - first, generator=gen) + first
    if case.pattern == "empty":
        loc = torch.empty(0, dtype=torch.int64)
    elif case.pattern in ("strided", "strided_run"):
        # a view with a stride: a writer that reads loc as consecutive memory reads the gaps
        step = max(2, min(2 + int(torch.randint(0, 3, (1,), generator=gen)), (slots - first) // t))
        if case.pattern == "strided_run":  # slots first, first + step, ... (1, 5, 9: read as 1, 2, 3)
            wide = torch.arange(first, first + t * step)
        else:  # distinct random slots, other slots in the gaps
            wide = usable[(t + torch.arange(t * step)) % len(usable)].clone()
            wide[::step] = usable[:t]
        return wide.to(case.loc_dtype).to(device)[::step]
    elif case.pattern == "random":
        loc = usable[:t]
    elif case.pattern == "duplicate":
        chosen = usable[: max(1, t // 2)]
        loc = chosen[torch.randint(0, len(chosen), (t,), generator=gen)]
    elif case.pattern == "padding":
        loc = usable[:t].clone()
        loc[torch.randperm(t, generator=gen)[: max(1, t // 3)]] = pad
    elif case.pattern == "first_last":  # the first slot a token gets and the buffer's last row
        last = slots - 1
        middle = usable[(usable != first) & (usable != last)][: t - 2]
        loc = torch.cat([torch.tensor([first]), middle, torch.tensor([last])])
    else:  # run: consecutive slots
        start = int(torch.randint(first, slots - t + 1, (1,), generator=gen))
        loc = torch.arange(start, start + t)
    return loc.to(case.loc_dtype).to(device)


def make_rows(case: Case, tokens: int, heads: int, dim: int, gen: torch.Generator, device: torch.device,
              scale: float = 4.0) -> torch.Tensor:
    """``[tokens, heads, dim]`` of the input dtype in the case's form (a view where the form is one)."""
    extra = 3 if case.form == "padded" else 0
    x = (torch.randn(tokens + extra, heads, dim, generator=gen) * scale).to(case.inp)
    if case.form == "flat":
        return x.reshape(tokens + extra, heads * dim)[:tokens].to(device)
    if case.form == "strided":  # one slice of a wider row, as a fused QKV output's view is
        wide = torch.zeros(tokens, heads * dim + 8, dtype=case.inp)
        wide[:, 4:4 + heads * dim] = x.reshape(tokens, heads * dim)
        return wide.to(device)[:, 4:4 + heads * dim].view(tokens, heads, dim)
    if case.form == "padded":
        return x.to(device)  # more rows than slots: only the first `tokens` are written
    return x.to(device)


def scale_value(case: Case, device: torch.device) -> float | torch.Tensor | None:
    if isinstance(case.scale, str):
        return torch.tensor([float(case.scale.partition(":")[2])], dtype=torch.float32, device=device)
    return case.scale


# --- pools and their bytes ----------------------------------------------------------------------------

def make_pool(layout: Layout, case: Case, writer: Writer, slots: int, device: torch.device) -> Any:
    s = case.shape
    kw: dict[str, Any] = {"writer": writer, "start_layer": case.start_layer, "check_slots": case.check_slots}
    if case.layout == "paged":
        return make_layout_pool(layout.name, slots // s["block"], s["block"], case.cache, s["heads"], s["dim"], 2,
                                device, **kw)
    page = s["page"]
    if case.layout == "mla":
        return make_layout_pool(layout.name, slots - page, page, case.cache, s["rank"], s["rope"], 2, device, **kw)
    return make_layout_pool(layout.name, slots - page, page, case.cache, s["heads"], s["dim"], 2, device,
                            v_head_dim=s["v_dim"], **kw)


def buffers(pool: Any) -> list[tuple[str, torch.Tensor]]:
    """Every storage buffer of the pool as ``[slots, bytes]`` uint8 views, named."""
    if hasattr(pool, "k_buffer"):
        named = [(f"K[{i}]", b) for i, b in enumerate(pool.k_buffer)] + [(f"V[{i}]", b)
                                                                        for i, b in enumerate(pool.v_buffer)]
    elif hasattr(pool, "kv_buffer"):
        named = [(f"KV[{i}]", b) for i, b in enumerate(pool.kv_buffer)]
    else:
        named = [(f"K[{i}]", b) for i, b in enumerate(pool.key_cache)] + [(f"V[{i}]", b)
                                                                          for i, b in enumerate(pool.value_cache)]
    out = []
    for name, b in named:
        rows = b.shape[0] * (b.shape[1] if b.dim() == 4 else 1)
        out.append((name, b.view(torch.uint8).reshape(rows, -1)))
    return out


def element_bytes(pool: Any) -> list[int]:
    if hasattr(pool, "k_buffer"):
        return [b.element_size() for b in pool.k_buffer + pool.v_buffer]
    if hasattr(pool, "kv_buffer"):
        return [b.element_size() for b in pool.kv_buffer]
    return [b.element_size() for b in pool.key_cache + pool.value_cache]


def fill_random(pool: Any, gen: torch.Generator) -> list[torch.Tensor]:
    """Random bytes into every buffer (so an untouched row and a written one differ); a copy of each."""
    initial = []
    for _, b in buffers(pool):
        r = torch.randint(0, 256, tuple(b.shape), dtype=torch.uint8, generator=gen)
        b.copy_(r.to(b.device))
        initial.append(b.clone())
    return initial


# --- one case -----------------------------------------------------------------------------------------

@dataclass
class Inputs:
    loc: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float | torch.Tensor | None
    q: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    cos_sin: torch.Tensor | None = None

    def copy(self) -> Inputs:
        """Fresh inputs for one pool, in the same form (views stay views of their own copy)."""
        return Inputs(_same_form(self.loc), _same_form(self.k), _same_form(self.v),
                      self.scale.clone() if isinstance(self.scale, torch.Tensor) else self.scale,
                      None if self.q is None else _same_form(self.q),
                      None if self.positions is None else self.positions.clone(),
                      None if self.cos_sin is None else self.cos_sin.clone())


def _same_form(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with ``t``'s strides (a strided view stays a strided view of new storage)."""
    if t.is_contiguous():
        return t.clone()
    base = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    base.copy_(t)
    return base


def make_inputs(case: Case, slots: int, device: torch.device) -> Inputs:
    gen = torch.Generator().manual_seed(case.seed)
    loc = make_loc(case, slots, gen, device)
    s = case.shape
    t = case.tokens
    if case.layout == "mla":
        return Inputs(loc, make_rows(case, t, 1, s["rank"], gen, device), make_rows(case, t, 1, s["rope"], gen, device),
                      None)
    heads, dim = s["heads"], s["dim"]
    v_dim = s.get("v_dim", dim)
    scale = scale_value(case, device)
    if case.contract == "rope":
        k = make_rows(case, t, heads, dim, gen, device, 1.0)
        q = make_rows(case, t, s["q_heads"], dim, gen, device, 1.0)
        v = make_rows(case, t, heads, v_dim, gen, device)
        positions = torch.randint(0, MAX_POSITION, (t,), generator=gen).to(case.loc_dtype).to(device)
        from kvprof.kvcache.writers.rope_reference import cos_sin_table

        return Inputs(loc, k, v, scale, q, positions, cos_sin_table(MAX_POSITION, s["rope_dim"]).to(device))
    return Inputs(loc, make_rows(case, t, heads, dim, gen, device), make_rows(case, t, heads, v_dim, gen, device),
                  scale)


def write(layout: Layout, case: Case, pool: Any, x: Inputs) -> None:
    layer = case.start_layer + case.layer
    if case.contract == "rope":
        pool.set_kv_buffer_with_rope(layer, x.loc, x.q, x.k, x.v, x.positions, x.cos_sin, case.is_neox, x.scale,
                                     x.scale)
    else:
        layout.write(pool, layer, x.loc, x.k, x.v, x.scale, x.scale)


@dataclass
class Outcome:
    outcome: str
    wrong_rows: int = 0
    wrong_bytes: int = 0
    detail: str = ""


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def run_case(case: Case, writer: Writer, reference: Writer, device: torch.device) -> Outcome:
    """Write the case with ``writer`` and with ``reference`` and compare every byte."""
    layout = get_layout(case.layout)
    slots = slot_count(case)
    gen = torch.Generator().manual_seed(case.seed ^ 0x5EED)
    x = make_inputs(case, slots, device)
    test_pool = make_pool(layout, case, writer, slots, device)
    initial = fill_random(test_pool, gen)
    got = x.copy()
    try:
        write(layout, case, test_pool, got)
    except REFUSALS as exc:
        return _refused(case, exc, buffers(test_pool), initial, x, got)
    except Exception as exc:  # noqa: BLE001 (anything else a writer raises is the case's error)
        return Outcome(ERROR, detail=_one_line(exc))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    wrong_qk, detail_qk, stored_k = _rope_check(case, x, got) if case.contract == "rope" else (0, "", got.k)
    changed = _inputs_changed(case, _as_declared(case, writer, x), got)
    if changed:
        wrong_qk += sum(n for _, n in changed)
        detail_qk = "; ".join(filter(None, [detail_qk, "changed its input " + ", ".join(
            f"{name} ({n} rows)" for name, n in changed)]))

    ref_pool = make_pool(layout, case, reference, slots, device)
    for (_, b), b0 in zip(buffers(ref_pool), initial):
        b.copy_(b0)
    want = x.copy()
    try:
        if case.contract == "rope":  # the layout's reference store of the rotated k
            want.k = _same_form(stored_k)
            ref_pool.set_kv_buffer(case.start_layer + case.layer, want.loc, want.k, want.v, want.scale, want.scale)
        else:
            write(layout, case, ref_pool, want)
    except REFUSALS as exc:
        written = sum(int((b != b0).any(dim=1).sum()) for (_, b), b0 in zip(buffers(test_pool), initial))
        return Outcome(WRONG, written, 0, f"wrote a call the reference refuses ({_one_line(exc)})")
    dup = _duplicate_slots(x.loc)
    candidates = _candidates(layout, case, reference, x, stored_k if case.contract == "rope" else None, slots,
                             device) if dup else None
    # SGLang's MHA dummy slot 0 (padding tokens' writes): left as it was is right too (SGLang's
    # store_cache skips it)
    keep = (0,) if case.layout == "mha" else ()
    rows, wrong_bytes, where = _compare(buffers(test_pool), buffers(ref_pool), initial, element_bytes(test_pool),
                                        dup, candidates, keep)
    if rows or wrong_qk:
        detail = "; ".join(filter(None, ["wrong " + ", ".join(where) if where else "", detail_qk]))
        return Outcome(WRONG, rows + wrong_qk, wrong_bytes, detail)
    return Outcome(OK)


def _refused(case: Case, exc: BaseException, bufs: list[tuple[str, torch.Tensor]], initial: list[torch.Tensor],
             x: Inputs, got: Inputs) -> Outcome:
    """A refusal is right when it changed nothing: no buffer byte, and (rope) no q or k element."""
    changed = [(name, int((b != b0).any(dim=1).sum())) for (name, b), b0 in zip(bufs, initial)]
    rows = sum(n for _, n in changed)
    rotated = case.contract == "rope" and not (_equal(got.q, x.q) and _equal(got.k, x.k))
    if rows or rotated:
        where = ", ".join(f"{n} rows of {name}" for name, n in changed if n) or "q/k rotated"
        return Outcome(WRONG, rows, sum(int((b != b0).sum()) for (_, b), b0 in zip(bufs, initial)),
                       f"refused ({_one_line(exc)}) after changing {where}")
    return Outcome(REFUSED, detail=_one_line(exc))


def _as_declared(case: Case, writer: Writer, x: Inputs) -> Inputs:
    """The inputs as the write may leave them: as they were, or, for a writer that declares it
    changes its rows (``KVWriter.modifies_inputs``: SGLang's generic write), k and v divided by
    the scale in place where it converts them to the cache's dtype -- exactly that, nothing else
    (rows whose elements share memory, which ``div_`` cannot write, stay as they were)."""
    scale = x.scale
    if (not getattr(writer, "modifies_inputs", False) or case.contract == "rope" or case.inp == case.cache
            or scale is None):
        return x
    out = x.copy()
    for t in (out.k, out.v):
        if int(torch._debug_has_internal_overlap(t)) != 1:
            t.div_(scale)
    return out


def _inputs_changed(case: Case, x: Inputs, got: Inputs) -> list[tuple[str, int]]:
    """Inputs the write must only read, with the rows it changed (rope's q and k are rotated in
    place by contract and held to the reference instead)."""
    pairs = [("loc", x.loc, got.loc), ("positions", x.positions, got.positions)]
    pairs += [("v", x.v, got.v)] if case.contract == "rope" else [("k", x.k, got.k), ("v", x.v, got.v)]
    out = []
    for name, a, b in pairs:
        if a is None or b is None or a.numel() == 0:
            continue
        n = int((~_rows_equal(a, b)).sum())
        if n:
            out.append((name, n))
    return out


def _rope_check(case: Case, x: Inputs, got: Inputs) -> tuple[int, str, torch.Tensor]:
    """q and k as rotated in place against the float32 reference (one ulp); returns
    the wrong rows, their words and the k the cache is held against (the writer's, or the
    reference's where the writer's is wrong)."""
    from kvprof.kvcache.writers.rope_reference import rope_magnitude, rope_reference

    assert x.q is not None and got.q is not None and x.positions is not None and x.cos_sin is not None
    dim = case.shape["dim"]
    q3, k3 = _rows3(x.q, dim), _rows3(x.k, dim)
    rq, rk = rope_reference(q3, k3, x.cos_sin, x.positions, case.is_neox)
    mq, mk = rope_magnitude(q3, k3, x.cos_sin, x.positions, case.is_neox)
    bad_q = _ulp_rows(_rows3(got.q, dim), rq, mq)
    bad_k = _ulp_rows(_rows3(got.k, dim), rk, mk)
    if not (bad_q or bad_k):
        return 0, "", got.k
    detail = f"q: {bad_q} rows, k: {bad_k} rows past the fp32 reference's rounding (1 ulp + fused multiply-add)"
    return bad_q + bad_k, detail, rk.to(x.k.dtype).reshape(x.k.shape)


def _compare(got: list[tuple[str, torch.Tensor]], want: list[tuple[str, torch.Tensor]], initial: list[torch.Tensor],
             elems: list[int], dup: dict[int, list[int]],
             candidates: list[torch.Tensor] | None, keep: tuple[int, ...] = ()) -> tuple[int, int, list[str]]:
    """Wrong (buffer, row) pairs, wrong bytes and where, over every buffer; a slot several
    tokens write is right when each element is that of one of their rows; a slot of ``keep``
    (a dummy row) is right too when left as it was."""
    rows = wrong_bytes = 0
    where: list[str] = []
    for i, ((name, g), (_, w), b0, elem) in enumerate(zip(got, want, initial, elems)):
        diff = g != w
        bad = diff.any(dim=1)
        nbytes = diff.sum(dim=1)
        for slot, toks in dup.items() if candidates is not None else ():
            if not bool(bad[slot]) or not bool((w[slot] != b0[slot]).any()):
                continue  # right already, or a slot the reference leaves alone (MLA's 0)
            assert candidates is not None
            cands = candidates[i][toks].reshape(len(toks), -1, elem)
            ok = (cands == g[slot].reshape(-1, elem)).all(dim=-1).any(dim=0)
            bad[slot] = not bool(ok.all())
            nbytes[slot] = int((~ok).sum()) * elem
        for slot in keep:
            if bool(bad[slot]) and bool((g[slot] == b0[slot]).all()):
                bad[slot] = False
        n = int(bad.sum())
        if n:
            rows += n
            wrong_bytes += int(nbytes[bad].sum())
            shown = bad.nonzero().flatten()[:SHOWN_ROWS].tolist()
            where.append(f"{name} rows {shown}{' ...' if n > SHOWN_ROWS else ''} ({n})")
    return rows, wrong_bytes, where


def _rows3(t: torch.Tensor, dim: int) -> torch.Tensor:
    return t if t.dim() == 3 else t.reshape(t.shape[0], t.shape[1] // dim, dim)


def _equal(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))) if a.numel() else True


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A copy with the standard strides (``contiguous()`` keeps odd strides of size-1 dims)."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def _rows_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.numel() == 0:
        return torch.ones(a.shape[0], dtype=torch.bool, device=a.device)
    a2 = _dense(a).reshape(a.shape[0], -1).view(torch.uint8)
    b2 = _dense(b).reshape(b.shape[0], -1).view(torch.uint8)
    return (a2 == b2).all(dim=1)


_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _ulp_rows(out: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor | None = None) -> int:
    """Rows of ``out`` with an element more than one unit in the last place from ``ref`` rounded
    to ``out``'s dtype (the same sign, and at most one representable value apart), and, where
    ``magnitude`` is given, also more than two float32 epsilons of it away from ``ref``: a fused
    multiply-add rounds one product less, which moves a result whose products cancel by many
    of its own units but never by more than that (rope_reference's docstring)."""
    if out.numel() == 0:
        return 0
    want = ref.to(out.dtype).contiguous()
    a = out.contiguous().view(_INT[out.element_size()]).long()
    b = want.view(_INT[out.element_size()]).long()
    ok = (a == b) | (((a - b).abs() <= 1) & ((a < 0) == (b < 0)))
    if magnitude is not None:
        eps = torch.finfo(torch.float32).eps
        ok |= (out.float() - ref).abs() <= 2 * eps * magnitude
    return int((~ok.reshape(ok.shape[0], -1).all(dim=1)).sum())


def _duplicate_slots(loc: torch.Tensor) -> dict[int, list[int]]:
    """Slot -> the tokens that write it, for slots written more than once (-1 never is)."""
    by_slot: dict[int, list[int]] = {}
    for token, slot in enumerate(loc.tolist()):
        if slot >= 0:
            by_slot.setdefault(slot, []).append(token)
    return {s: t for s, t in by_slot.items() if len(t) > 1}


def _candidates(layout: Layout, case: Case, reference: Writer, x: Inputs, rotated_k: torch.Tensor | None,
                slots: int, device: torch.device) -> list[torch.Tensor]:
    """Each token's rows as the reference stores them, per buffer: written into distinct slots
    1..tokens of a scratch pool (rows past the tokens: unused)."""
    scratch_case = Case(**{**case.__dict__, "check_slots": True})
    pool = make_pool(layout, scratch_case, reference, slots, device)
    y = x.copy()
    y.loc = torch.arange(1, case.tokens + 1, dtype=x.loc.dtype, device=device)
    layer = case.start_layer + case.layer
    if rotated_k is not None:
        pool.set_kv_buffer(layer, y.loc, rotated_k, y.v, y.scale, y.scale)
    else:
        write(layout, scratch_case, pool, y)
    return [b[1:case.tokens + 1] for _, b in buffers(pool)]


# --- the run ------------------------------------------------------------------------------------------

@dataclass
class Target:
    """A writer to verify: how to build it, the layout and contract it writes, the dtype pairs it runs."""

    layout: str
    spec: str  # a registered name or module:function, as given
    contract: str
    pairs: list[tuple[torch.dtype, torch.dtype]]
    writer: Writer
    tally: WriterTally
    build_s: float = 0.0  # how long building it took (an import of a library, a compiler's start)
    next_index: int = 0


def _layouts(names: Sequence[str] | None) -> list[str]:
    if not names:
        return list(LAYOUTS)
    bad = [n for n in names if n not in LAYOUTS]
    if bad:
        raise UsageError(f"unknown layout {bad[0]!r}; choose from {', '.join(LAYOUTS)}")
    return list(dict.fromkeys(names))


def _specs(variants: Sequence[str] | None, layouts: list[str]) -> Iterator[tuple[str, str, bool]]:
    """(layout, spec, named) for each writer asked for; every registered writer when none is named."""
    from kvprof.kvcache.writers import REGISTRY

    if not variants:
        for layout in layouts:
            for name in REGISTRY.names(layout):
                yield layout, name, False
        return
    for spec in dict.fromkeys(variants):
        if ":" in spec:
            found = False
            first: UsageError | None = None
            for layout in layouts:
                try:
                    REGISTRY.create(spec, layout=layout)
                except UsageError as exc:
                    first = first or exc
                    if "cannot import" in str(exc) or "has no writer factory" in str(exc) or "not callable" in str(exc):
                        raise
                    continue
                found = True
                yield layout, spec, True
            if not found:
                assert first is not None
                raise first
            continue
        owners = [layout for layout in layouts if spec in REGISTRY.names(layout)]
        if not owners:
            known = sorted({n for layout in layouts for n in REGISTRY.names(layout)})
            raise UsageError(f"unknown variant {spec!r}: not a writer of the {'/'.join(layouts)} layout"
                             f"{'s' if len(layouts) > 1 else ''}; known: {', '.join(known)} (or give module:function)")
        for layout in owners:
            yield layout, spec, True


def targets(variants: Sequence[str] | None, layouts: Sequence[str] | None,
            device: torch.device) -> tuple[list[Target], list[WriterTally]]:
    """The writers to verify and those that cannot run here (with why). A writer named on the
    command line that cannot run on ``device`` is a ``DeviceError``."""
    from kvprof.kvcache.writers import REGISTRY

    runnable: list[Target] = []
    skipped: list[WriterTally] = []
    for layout_name, spec, named in _specs(variants, _layouts(layouts)):
        layout = get_layout(layout_name)
        began = time.perf_counter()
        try:
            writer = REGISTRY.create(spec, layout=layout_name)
        except UsageError as exc:
            if named:
                raise
            skipped.append(WriterTally(layout_name, spec, skipped=str(exc)))
            continue
        contract = layout.contract_of(writer) or "store"
        reasons: list[str] = []
        pairs = []
        for cache, inp in dtype_pairs(layout_name, contract):
            why = writer.unsupported_reason(device, cache, inp)
            if why is None:
                pairs.append((cache, inp))
            elif why not in reasons:
                reasons.append(why)
        if not pairs:
            if named:
                raise DeviceError(f"{spec} cannot run on {device.type}: {reasons[0]}")
            skipped.append(WriterTally(layout_name, spec, contract, skipped=reasons[0]))
            continue
        writer.prepare(device)
        tally = WriterTally(layout_name, spec, contract)
        runnable.append(Target(layout_name, spec, contract, pairs, writer, tally, time.perf_counter() - began))
    return runnable, skipped


def reproduce_command(device: torch.device, layout: str, spec: str, seed: int, index: int,
                      names: Callable[[str], str] = str) -> str:
    """The command that reruns exactly one case, its settings spelled by ``names``."""
    return Words("python -m kvprof verify ", Setting("device"), f" {device.type} ", Setting("layouts"), f" {layout} ",
                 Setting("variants"), f" {spec} ", Setting("seed"), f" {seed} ", Setting("case"),
                 f" {index}").render(names)


def verify(variants: Sequence[str] | None = None, layouts: Sequence[str] | None = None, *,
           device: torch.device, budget_s: float = DEFAULT_BUDGET_S, cases: int = DEFAULT_CASES, seed: int = 0,
           case: int | None = None, interpreted: bool = False, started: float | None = None,
           clock: Callable[[], float] = time.perf_counter, names: Callable[[str], str] = str) -> VerifyResult:
    """Run cases of every writer asked for (each its first case before any its second, the
    quickest-built first; then least time spent first) until each ran ``cases`` or ``budget_s`` has passed since the
    start (writer builds included; ``started``: a ``clock()`` value to count from instead of now);
    ``case``: run only that case of each writer; ``names``: how a failing case's rerun command
    spells its settings."""
    start = clock() if started is None else started
    result = VerifyResult(device=str(device), seed=seed, budget_s=budget_s, cases_per_writer=cases,
                          interpreted=interpreted)
    runnable, skipped = targets(variants, layouts, device)
    references: dict[tuple[str, str], Writer] = {}
    result.writers = [t.tally for t in runnable] + skipped
    if case is not None:
        for t in runnable:
            t.next_index = case
    limit = 1 if case is not None else cases
    while True:
        left = [t for t in runnable if t.tally.cases < limit]
        if not left:
            break
        if clock() - start >= budget_s:
            result.budget_hit = True
            break
        # first cases first, quickest-built writer first (a slow build, e.g. a compiler's, tends
        # to mean a slow first case); then the writer with the least time spent
        t = min(left, key=lambda t: (t.tally.cases > 0, t.tally.seconds if t.tally.cases else t.build_s))
        began = clock()
        ref = references.get((t.layout, t.contract))
        if ref is None:
            from kvprof.kvcache.writers import REGISTRY

            ref_name = get_layout(t.layout).reference
            ref = references[(t.layout, t.contract)] = REGISTRY.create(ref_name, layout=t.layout)
        c = draw_case(t.layout, t.contract, t.spec, t.next_index, seed, t.pairs)
        out = run_case(c, t.writer, ref, device)
        t.tally.count(out.outcome)
        t.tally.seconds += clock() - began
        report = CaseReport(t.layout, t.spec, t.contract, t.next_index, out.outcome, c.text(), out.wrong_rows,
                            out.wrong_bytes, out.detail, reproduce_command(device, t.layout, t.spec, seed,
                                                                           t.next_index, names))
        if out.outcome in (WRONG, ERROR):
            result.failures.append(report)
        if case is not None:
            result.only_case = report
        t.next_index += 1
    result.elapsed_s = clock() - start
    return result


__all__ = ["DEFAULT_BUDGET_S", "DEFAULT_CASES", "OK", "REFUSED", "Case", "draw_case", "run_case", "verify"]
