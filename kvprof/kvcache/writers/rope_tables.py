"""Launch shapes of kvprof's Triton rope (+ store) kernel, by token count.

A program owns ``block_t`` tokens x up to ``block_h`` heads of q, or of k (and then the same
heads of v): the grid is ``(cdiv(tokens, block_t), cdiv(Hq, bq) + cdiv(Hk, bk))`` with ``bq``
and ``bk`` the block capped at the next power of two of Hq and of Hk (a GQA model's one k
head is not padded to four), or with ``token_major`` one axis of their product, head groups
fastest. A write of a few tokens (decode) is latency-bound: one head per program spreads it
over as many SMs as there are heads. A prefill of thousands of tokens is bound by bandwidth
(q read and written, k and v read, two cache rows written): larger tiles, fewer programs.

Provenance: the head-size-128 rows of the H200 (and fallback) table are the fastest shapes of
a sweep on an H200 (Llama-3.1-70B at TP8 per rank: 8 q heads, 1 KV head x 128, bf16; 80
layers from CUDA graphs; 24 decode shapes at 1, 10 and 64 tokens, 32 prefill shapes at 512
and 4096; ``lab/rope_bench.py`` with ``rope_triton_fused@T.H.W`` variants, output in
``lab/results/rope-tune-*.txt``); the H100 row differs at 1-4096 tokens (its comment says
why). The other rows are untimed guesses after the fused store's table
(:mod:`kvprof.kvcache.writers.triton_tables`). ``RopeTritonFusedWriter(config=...)``
overrides them per writer.
Under Triton's interpreter a write takes :func:`interpreted_rope_config` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvprof.kvcache.writers.triton_tables import INTERPRETED_TILE


@dataclass(frozen=True)
class RopeConfig:
    """Tokens per program, heads per program at most (q heads, or k and v heads), warps per
    program, and the programs' order: ``token_major`` runs a token block's head groups side by
    side (a 1-D grid), else one head group's token blocks (``(token blocks, groups)``).
    ``persistent`` > 0 launches that many programs per SM (at most one per tile), each walking
    the token-major tiles in strides of the grid; ``stream`` loads the inputs evict-first and
    stores the cache rows streaming (``.cs``)."""

    block_t: int
    block_h: int
    num_warps: int
    token_major: bool = False
    stream: bool = False
    persistent: int = 0

    def __post_init__(self) -> None:
        for name in ("block_t", "block_h"):
            value = getattr(self, name)
            if value < 1 or value & (value - 1):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if not 0 <= self.persistent <= 64:
            raise ValueError(f"persistent must be 0 (off) to 64 programs per SM, got {self.persistent}")


RopeTable = list[tuple[int, int, RopeConfig]]
_ANY = 1 << 62

# (largest head_dim, largest token count, config): first match wins.
ROPE_TABLE: RopeTable = [
    (128, 16, RopeConfig(1, 1, 1)),
    (128, 64, RopeConfig(1, 2, 4)),
    (128, 512, RopeConfig(8, 1, 4)),
    (128, 4096, RopeConfig(16, 1, 8)),
    (128, _ANY, RopeConfig(16, 1, 8)),
    (_ANY, 1, RopeConfig(1, 1, 2)),
    (_ANY, 64, RopeConfig(1, 1, 2)),
    (_ANY, 512, RopeConfig(2, 2, 4)),
    (_ANY, _ANY, RopeConfig(4, 2, 4)),
]


# The H100 SXM's row: lab/rope_bench.py on H100 80GB HBM3 hosts, launch shapes in both program
# orders and with the streaming cache hints (``stream``), at 1, 10, 64, 512, 2048 and 4096 tokens,
# each range timed at its top; two runs on 2026-12-07, two on 2026-12-08 (the last with the
# decode shapes alone; lab/results/h100-2026-12-07f/, -07g/, h100-2026-12-08/, -08b/). Per range
# the shape whose largest slowdown against a run's fastest is the smallest, µs per layer write:
# 1-16 tokens 1.1.1 token-major streaming (10 tokens: 1.120 / 1.117 / 1.190 / 1.151, within
# 0.7 % of each run's fastest); 17-512 8.1.4 token-major streaming (64 tokens: 1.202 / 1.195 /
# 1.192 / 1.370, within 4.2 %; 2.1.2 token-major, fastest in three runs, read 1.314 in the
# third, +10 %: at 17-64 tokens the shapes' order changes from run to run; 512: 2.312 / 2.311
# against 2.372 / 2.371 without the hints); 513-4096 16.1.8 in order, streaming (4096: 8.973 /
# 9.016 / 8.981 against 9.150 / 9.185 without the hints; 2048: 5.196 / 5.194 against 5.400).
# Persistent grids of 1-16 programs per SM were slower at 512 and 4096 tokens (10.06 µs and more
# at 4096). Past 4096 tokens the H200 row's shape stays (not timed). The picks at 10-4096 tokens
# are lab/rope_rows.py's over those runs, as the H200 row's are over its 2026-12-04 runs
# (lab/tests/test_rope_rows.py).
ROPE_TABLE_H100_SXM: RopeTable = [
    (128, 16, RopeConfig(1, 1, 1, token_major=True, stream=True)),
    (128, 512, RopeConfig(8, 1, 4, token_major=True, stream=True)),
    (128, 4096, RopeConfig(16, 1, 8, stream=True)),
    (128, _ANY, RopeConfig(16, 1, 8)),
    *ROPE_TABLE[5:],
]

# Per card (kvprof.kvcache.writers.card_tables: a device takes its card's row, else "fallback").
ROPE_TABLES: dict[str, RopeTable] = {"H200": ROPE_TABLE, "H100-SXM": ROPE_TABLE_H100_SXM, "fallback": ROPE_TABLE}
SOURCES: dict[str, str] = {
    "H200": "lab/rope_bench.py on an H200, 2026-12-04 (lab/results/rope-tune-{decode,prefill}-2026-12-04.txt)",
    "H100-SXM": "lab/rope_bench.py on H100s, 2026-12-07 and -08: streaming hints at 1-4096 tokens, "
                "token-major at 1-512 (lab/results/h100-2026-12-07f/*/rope-order-*.txt, h100-2026-12-07g/*/, "
                "h100-2026-12-08/rope-stream-*.txt, h100-2026-12-08b/rope-table-decode.txt)",
    "fallback": "the H200 row",
}
FALLBACK_WHY = "the only card these shapes were measured on (H200)"


def rope_table(card: str | None) -> RopeTable:
    """The card row's table (``card_tables.device_card``), else the fallback."""
    return ROPE_TABLES.get(card or "fallback") or ROPE_TABLES["fallback"]


def pick_rope_config(head_dim: int, tokens: int, table: RopeTable | None = None, card: str | None = None) -> RopeConfig:
    """The table's shape for a head size and a token count (``table`` None: the card's row)."""
    for max_dim, max_tokens, cfg in table or rope_table(card):
        if head_dim <= max_dim and tokens <= max_tokens:
            return cfg
    return RopeConfig(1, 1, 4)


def interpreted_rope_config(heads: int, head_elements: int, tokens: int) -> RopeConfig:
    """Under Triton's interpreter a program is one numpy pass with a fixed cost of
    milliseconds, so as few programs as the tile cap allows: every head in one program (one
    for q, one for k and v) and as many tokens as fit ``INTERPRETED_TILE`` elements.
    ``heads``: the larger of Hq and Hk; ``head_elements``: the padded elements of one head."""
    block_h = 1 << max(0, heads - 1).bit_length()
    cap = max(1, INTERPRETED_TILE // max(1, block_h * head_elements))
    cap = 1 << (cap.bit_length() - 1)
    block_t = min(1 << max(0, tokens - 1).bit_length(), cap)
    return RopeConfig(block_t, block_h, 4)


__all__ = ["FALLBACK_WHY", "ROPE_TABLE", "ROPE_TABLES", "SOURCES", "RopeConfig", "RopeTable", "interpreted_rope_config",
           "pick_rope_config", "rope_table"]
