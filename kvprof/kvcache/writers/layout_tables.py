"""Launch shapes of kvprof's fused MLA and paged Triton writes, by token count.

Chosen by ``python lab/tune_layouts.py``, which times every candidate the way ``python -m
kvprof.bench.layouts`` times a write (CUDA-graph replays of W writes at scattered slots,
median of 100 replays; the fastest three re-timed over three captures) at DeepSeek-V3's
latent row (512 + 64) and at vLLM's paged cache for Llama-3.1-70B TP8 (1 KV head x 128,
block size 16); streaming stores (``.cs``) only where they made MLA writes faster. The run
these tables come from, its GPU and its output: lab/README.md. Rows of other lengths keep
shapes chosen by the same rule as the MHA table: one program per token for long rows, more
tokens per program as the write grows. The writers' constructor arguments override these
per writer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayoutShape:
    """Tokens per program, warps per program, column chunks per row (paged), and whether
    stores stream past L2 (``.cs``)."""

    block_t: int
    num_warps: int
    split: int = 1
    stream: bool = False


_ANY = 1 << 62
# (largest token count, shape): first match wins
_MLA_16BIT = [(64, LayoutShape(2, 4)), (4096, LayoutShape(4, 4, stream=True)), (_ANY, LayoutShape(4, 1, stream=True))]
_MLA_FP8 = [(64, LayoutShape(2, 4)), (512, LayoutShape(2, 4, stream=True)), (4096, LayoutShape(4, 4, stream=True)),
            (_ANY, LayoutShape(8, 8, stream=True))]
_MLA_SHORT = [(512, LayoutShape(4, 4)), (_ANY, LayoutShape(8, 4))]  # rows under 256 values

_PAGED_16BIT = [(512, LayoutShape(4, 4)), (4096, LayoutShape(8, 8)), (_ANY, LayoutShape(16, 4))]
_PAGED_FP8 = [(64, LayoutShape(1, 4)), (512, LayoutShape(4, 4)), (4096, LayoutShape(8, 8)), (_ANY, LayoutShape(16, 8))]
_PAGED_MID = [(512, LayoutShape(1, 4)), (_ANY, LayoutShape(2, 4))]  # rows of 513..4096 values
_PAGED_LONG = [(8, LayoutShape(1, 8, 4)), (64, LayoutShape(1, 4, 4)), (_ANY, LayoutShape(1, 16))]


def _pick(table: list[tuple[int, LayoutShape]], tokens: int) -> LayoutShape:
    return next(shape for bound, shape in table if tokens <= bound)


def mla_shape(tokens: int, row_elems: int, fp8: bool) -> LayoutShape:
    """The MLA write's shape for ``tokens`` latent rows of ``row_elems`` values (``fp8``: the
    cache is fp8, converted in the kernel)."""
    if row_elems < 256:
        return _pick(_MLA_SHORT, tokens)
    return _pick(_MLA_FP8 if fp8 else _MLA_16BIT, tokens)


def paged_shape(tokens: int, row_elems: int, fp8: bool) -> LayoutShape:
    """The paged write's shape for ``tokens`` tokens of K and V rows of ``row_elems`` values."""
    if row_elems <= 512:  # e.g. 1 head x 128 (Llama-3.1-70B at TP 8), the tuned case
        return _pick(_PAGED_FP8 if fp8 else _PAGED_16BIT, tokens)
    return _pick(_PAGED_MID if row_elems <= 4096 else _PAGED_LONG, tokens)


__all__ = ["LayoutShape", "mla_shape", "paged_shape"]
