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


ShapeTable = list[tuple[int, LayoutShape]]
# Per card (kvprof.kvcache.writers.card_tables: a device takes its card's row, else "fallback"):
# MLA (16-bit, fp8, short rows) and paged (16-bit, fp8, mid rows, long rows).
MLA_TABLES: dict[str, tuple[ShapeTable, ShapeTable, ShapeTable]] = {
    "H200": (_MLA_16BIT, _MLA_FP8, _MLA_SHORT), "fallback": (_MLA_16BIT, _MLA_FP8, _MLA_SHORT)}
PAGED_TABLES: dict[str, tuple[ShapeTable, ShapeTable, ShapeTable, ShapeTable]] = {
    "H200": (_PAGED_16BIT, _PAGED_FP8, _PAGED_MID, _PAGED_LONG),
    "fallback": (_PAGED_16BIT, _PAGED_FP8, _PAGED_MID, _PAGED_LONG)}
SOURCES: dict[str, str] = {
    "H200": "lab/tune_layouts.py on an H200, 2026-12-03 (lab/results/tune-layouts-2026-12-03.txt)",
    "fallback": "the H200 row",
}
FALLBACK_WHY = "the only card these shapes were measured on (H200)"


def _pick(table: ShapeTable, tokens: int) -> LayoutShape:
    return next(shape for bound, shape in table if tokens <= bound)


def mla_shape(tokens: int, row_elems: int, fp8: bool, card: str | None = None) -> LayoutShape:
    """The MLA write's shape for ``tokens`` latent rows of ``row_elems`` values (``fp8``: the
    cache is fp8, converted in the kernel) from the card's row (``card_tables.device_card``)."""
    wide, narrow, short = MLA_TABLES.get(card or "fallback") or MLA_TABLES["fallback"]
    if row_elems < 256:
        return _pick(short, tokens)
    return _pick(narrow if fp8 else wide, tokens)


def paged_shape(tokens: int, row_elems: int, fp8: bool, card: str | None = None) -> LayoutShape:
    """The paged write's shape for ``tokens`` tokens of K and V rows of ``row_elems`` values."""
    b16, b8, mid, long = PAGED_TABLES.get(card or "fallback") or PAGED_TABLES["fallback"]
    if row_elems <= 512:  # e.g. 1 head x 128 (Llama-3.1-70B at TP 8), the tuned case
        return _pick(b8 if fp8 else b16, tokens)
    return _pick(mid if row_elems <= 4096 else long, tokens)


__all__ = ["FALLBACK_WHY", "MLA_TABLES", "PAGED_TABLES", "SOURCES", "LayoutShape", "ShapeTable", "mla_shape",
           "paged_shape"]
