"""Launch shapes of kvprof's fused Triton write, by (K+V input row bytes, tokens).

Chosen by ``python lab/tune_fused.py``, which times every candidate shape the way ``kvprof
bench`` times a write (CUDA-graph replays of W writes into a 256 MB pool at random slots,
median of 100 replays) and keeps the fastest. The run these tables come from, its GPU and
its output (``lab/results/tune-*.txt``): lab/README.md; what the shapes mean for the
bench's numbers: docs/benchmarks.md. ``TritonFusedWriter(config=...)`` overrides the tables
per writer. Under Triton's interpreter (CPU) a write takes ``interpreted_config`` instead:
few large programs, see the comment there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TritonConfig:
    """Launch shape: tokens per program, warps per program, and column chunks per row.

    ``split`` > 1 cuts every K and V row into that many chunks, one program each (grid
    axis 1): a write of a few tokens with long rows then runs on ``split`` times as many
    SMs instead of making one SM issue every load, conversion and store of the row.
    ``stream``: the inputs are read once and the rows are not read again by this kernel, so
    a write of hundreds of MB can tell the caches so (``evict_first`` loads, ``.cs`` stores)."""

    block_t: int
    num_warps: int
    split: int = 1
    stream: bool = False  # streaming cache hints: inputs loaded evict-first, rows stored with .cs

    def __post_init__(self) -> None:
        if self.block_t < 1 or self.block_t & (self.block_t - 1):
            raise ValueError(f"block_t must be a power of two, got {self.block_t}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if self.split < 1 or self.split & (self.split - 1):
            raise ValueError(f"split must be a power of two, got {self.split}")


Table = list[tuple[int, int, TritonConfig]]
_ANY = 1 << 62

# (largest K+V input row bytes per token, largest token count, config): first match wins.
# 16-bit caches (a copy, no conversion). At a few tokens the shapes give every thread 4
# elements per row chunk (a short load -> store chain per warp); larger writes take more
# tokens per program; 16 KB rows split into column chunks up to 64 tokens.
TRITON_TABLE: Table = [
    (1024, 64, TritonConfig(4, 4)),
    (1024, 512, TritonConfig(4, 1)),
    (1024, 4096, TritonConfig(8, 2)),
    (1024, _ANY, TritonConfig(16, 4)),
    (8192, 512, TritonConfig(1, 4)),
    (8192, 4096, TritonConfig(2, 4)),
    (8192, _ANY, TritonConfig(1, 4)),
    (_ANY, 1, TritonConfig(1, 8, 4)),
    (_ANY, 8, TritonConfig(1, 4, 2)),
    (_ANY, 64, TritonConfig(1, 2, 4)),
    (_ANY, 512, TritonConfig(1, 16)),
    (_ANY, _ANY, TritonConfig(1, 8, 4)),  # 16 KB rows from 4096 tokens: quarter rows, 8 warps each
]
# fp8 caches (the conversion runs in the kernel): at a few tokens, more warps or more column
# chunks so that each thread converts 4 elements per row chunk.
TRITON_TABLE_FP8: Table = [
    (1024, 64, TritonConfig(4, 4)),
    (1024, 512, TritonConfig(4, 2)),
    (1024, 4096, TritonConfig(8, 4)),
    (1024, _ANY, TritonConfig(32, 8)),
    (8192, 1, TritonConfig(1, 8)),
    (8192, 8, TritonConfig(1, 4)),
    (8192, 64, TritonConfig(1, 8)),
    (8192, 512, TritonConfig(1, 4)),
    (8192, 4096, TritonConfig(2, 8)),
    (8192, _ANY, TritonConfig(2, 8)),
    (_ANY, 1, TritonConfig(1, 8, 4)),
    (_ANY, 8, TritonConfig(1, 4, 8)),
    (_ANY, 64, TritonConfig(1, 4, 4)),
    (_ANY, _ANY, TritonConfig(1, 16)),
]


# Under Triton's interpreter (TRITON_INTERPRET=1, the CPU path) a program is not a block of
# GPU threads but one numpy pass over its whole [block_t, row] tile, with a fixed cost of
# milliseconds per program for walking the kernel's Python. The GPU tables above launch
# many small programs, so a write under the interpreter costs tens to thousands of times
# more with them than with one program over every token (measured by
# lab/interpreter_shapes.py; lab/results/interpreter-shapes-*.txt). Same kernel, same
# bits: the launch shape only decides which program writes which token, and each
# element's conversion does not depend on it. The tile is capped at INTERPRETED_TILE
# elements (4096 tokens of 1x128 K+V rows) so that a long prefill or long rows take a few
# programs instead of numpy temporaries of hundreds of MB.
INTERPRETED_TILE = 1 << 20


def interpreted_config(row_elements: int, tokens: int) -> TritonConfig:
    """The interpreter's launch shape: as few programs as the tile cap allows.
    ``row_elements``: K plus V elements of one token's row blocks (powers of two)."""
    cap = max(1, INTERPRETED_TILE // max(1, row_elements))
    cap = 1 << (cap.bit_length() - 1)  # a power of two, at most the cap
    block_t = min(1 << max(0, tokens - 1).bit_length(), cap)
    # num_warps and split mean nothing to the interpreter: one program per token block
    return TritonConfig(block_t, 4, 1)


# The H100 SXM's rows: lab/tune_cards.py on an H100 80GB HBM3 (132 SMs), 3 captures a point. The
# 8x128 and 32x128 classes (row bytes above 1024), 2026-12-07: every candidate shape in graph replays
# and after an L2 flush, each point's pick at or below SGLang's store_cache in both modes with the
# least regret over both (at 32x128 bf16 x64 the graphs' fastest shape was 5 % slower than the
# pick after a flush). The 1x128 class the same way, 2026-12-07 on another host (its 2026-12-06
# rows, each point's fastest in graphs alone, were already at or below store_cache in both modes
# there; the picks trade at most 0.035 µs in graphs for up to 0.14 µs after a flush,
# lab/results/h100-2026-12-07g/c-tune-1x128/). docs/benchmarks.md has the tables against store_cache.
B16_H100_SXM: Table = [
    (1024, 1, TritonConfig(8, 8)),
    (1024, 8, TritonConfig(2, 2)),
    (1024, 64, TritonConfig(4, 4)),
    (1024, 512, TritonConfig(2, 1)),
    (1024, 4096, TritonConfig(8, 2)),
    (1024, _ANY, TritonConfig(32, 8)),
    (8192, 1, TritonConfig(1, 8)),
    (8192, 8, TritonConfig(2, 4, 2)),
    (8192, 64, TritonConfig(1, 8)),
    (8192, 512, TritonConfig(1, 2)),
    (8192, 4096, TritonConfig(4, 8)),
    (8192, _ANY, TritonConfig(2, 8)),
    (_ANY, 1, TritonConfig(1, 4, 8)),
    (_ANY, 8, TritonConfig(1, 8, 4)),
    (_ANY, 64, TritonConfig(1, 2, 4)),
    (_ANY, _ANY, TritonConfig(1, 16)),
]
FP8_H100_SXM: Table = [
    (1024, 1, TritonConfig(8, 8)),
    (1024, 64, TritonConfig(4, 4)),
    (1024, 512, TritonConfig(8, 4)),
    (1024, 4096, TritonConfig(16, 8)),
    (1024, _ANY, TritonConfig(32, 8)),
    (8192, 1, TritonConfig(1, 8)),
    (8192, 8, TritonConfig(1, 4, 2)),
    (8192, 64, TritonConfig(1, 8)),
    (8192, 512, TritonConfig(1, 4)),
    (8192, 4096, TritonConfig(2, 4)),
    (8192, _ANY, TritonConfig(1, 4)),
    (_ANY, 1, TritonConfig(1, 4, 8)),
    (_ANY, 8, TritonConfig(1, 8, 4)),
    (_ANY, 64, TritonConfig(1, 4, 4)),
    (_ANY, 512, TritonConfig(1, 16)),
    (_ANY, 4096, TritonConfig(4, 8)),
    (_ANY, _ANY, TritonConfig(1, 16)),
]


# Per card (kvprof.kvcache.writers.card_tables: a device takes its card's row, else "fallback"):
# (16-bit table, fp8 table). The H200 row is the tables above.
STORE_TABLES: dict[str, tuple[Table, Table]] = {
    "H200": (TRITON_TABLE, TRITON_TABLE_FP8),
    "H100-SXM": (B16_H100_SXM, FP8_H100_SXM),
    "fallback": (TRITON_TABLE, TRITON_TABLE_FP8),
}
SOURCES: dict[str, str] = {
    "H200": "lab/tune_fused.py on an H200, 2026-12-02 (lab/results/tune-2026-12-02.txt, tune-fp8-, tune-fewtokens-)",
    "H100-SXM": "lab/tune_cards.py on H100s, 2026-12-07, in both modes: 8x128 and 32x128 rows "
                "(lab/results/h100-2026-12-07f/a-order-tune/cards-H100-SXM.json.gz), 1x128 rows "
                "(lab/results/h100-2026-12-07g/c-tune-1x128/cards-H100-SXM.json.gz)",
    "fallback": "the H200 row",
}
FALLBACK_WHY = "the only card these shapes were measured on when it was chosen (H200)"


def store_tables(card: str | None) -> tuple[Table, Table]:
    """(16-bit table, fp8 table) for a card row name (``card_tables.device_card``), else the fallback."""
    return STORE_TABLES.get(card or "fallback") or STORE_TABLES["fallback"]


def pick_config(row_bytes: int, tokens: int, table: Table | None = None, fp8: bool = False,
                card: str | None = None) -> TritonConfig:
    """The table's config for one token's K+V input bytes and the token count (``fp8``: the
    cache is fp8, converted in the kernel). ``table`` given: that table; else the card's row
    (``card``: a row name of ``STORE_TABLES``; None: the fallback)."""
    for max_row, max_tokens, cfg in table or store_tables(card)[1 if fp8 else 0]:
        if row_bytes <= max_row and tokens <= max_tokens:
            return cfg
    return TritonConfig(1, 8)


__all__ = ["FALLBACK_WHY", "INTERPRETED_TILE", "SOURCES", "STORE_TABLES", "TRITON_TABLE", "TRITON_TABLE_FP8", "Table",
           "TritonConfig", "interpreted_config", "pick_config", "store_tables"]
