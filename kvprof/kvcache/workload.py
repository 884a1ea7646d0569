"""Workloads: which writes a serving step makes, at which slots, with which inputs.

A phase is decode (every request adds one token per layer per step: ``bs`` tokens per
write) or prefill (a chunk of ``tokens`` per write). Slots come from an allocator that
mimics a serving engine's free list: random (a long-running server's shuffled free
list), contiguous, or paged (pages of ``page_size`` slots, tokens contiguous inside).
All slots are built and checked on the host once, so the hot path can skip the check.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from kvprof.core.errors import Setting, UsageError

PHASES = ("decode", "prefill", "serving")
SLOT_PATTERNS = ("random", "contiguous", "paged")

# The serving shape of the benchmark that motivated kvprof (SGLang PR #9775).
SERVING_REQUESTS = 10
SERVING_INPUT = 4096
SERVING_OUTPUT = 1024


@dataclass(frozen=True)
class PhaseSpec:
    """One (phase, size) block of identical steps."""

    phase: str  # "decode" or "prefill"
    size: int  # batch size (decode) or chunk tokens (prefill)
    steps: int
    graph: bool  # replay a captured CUDA graph per step (decode on CUDA only)

    @property
    def size_key(self) -> str:
        return "bs" if self.phase == "decode" else "tokens"

    @property
    def tokens(self) -> int:
        """Tokens per write: one per request in decode, the chunk in prefill."""
        return self.size

    @property
    def key(self) -> str:
        return f"{self.phase} {self.size_key}={self.size}"

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "size_key": self.size_key, "tokens": self.tokens, "key": self.key}


def build_phases(
    phases: Sequence[str],
    decode_sizes: Sequence[int],
    prefill_sizes: Sequence[int],
    steps: int,
    cuda_graph: bool,
    serving_steps: int | None = None,
    chunk: int = 8192,
) -> list[PhaseSpec]:
    """Expand phase names into (phase, size) blocks; 'serving' is 10 x 4096 in, 1024 out."""
    if steps < 1:
        raise UsageError(Setting("steps"), f" must be at least 1, got {steps}")
    for s in (*decode_sizes, *prefill_sizes, chunk):
        if s < 1:
            raise UsageError(f"sizes must be positive, got {s}")
    out: list[PhaseSpec] = []
    for phase in phases:
        if phase == "decode":
            out += [PhaseSpec("decode", bs, steps, cuda_graph) for bs in decode_sizes]
        elif phase == "prefill":
            out += [PhaseSpec("prefill", t, steps, False) for t in prefill_sizes]
        elif phase == "serving":
            total = SERVING_REQUESTS * SERVING_INPUT
            full, rest = divmod(total, chunk)
            if full:
                out.append(PhaseSpec("prefill", chunk, full, False))
            if rest:
                out.append(PhaseSpec("prefill", rest, 1, False))
            out.append(PhaseSpec("decode", SERVING_REQUESTS, serving_steps or SERVING_OUTPUT, cuda_graph))
        else:
            raise UsageError(f"unknown phase {phase!r}; choose from {', '.join(PHASES)}")
    return out


@dataclass
class SlotAllocator:
    """Hands out slots like a serving engine's token allocator; never slot 0 (the dummy)."""

    rows: int
    pattern: str = "random"
    page_size: int = 1
    seed: int = 0
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.pattern not in SLOT_PATTERNS:
            raise UsageError(f"unknown slot pattern {self.pattern!r}; choose from {', '.join(SLOT_PATTERNS)}")
        if self.pattern == "paged" and self.page_size < 2:
            raise UsageError("the paged slot pattern needs ", Setting("page_size"), " of 2 or more")
        self._rng = np.random.default_rng(self.seed)

    @property
    def usable(self) -> int:
        # SGLang reserves the first page (slot 0 is the padded-token dummy).
        return self.rows - self.page_size

    def steps(self, phase: PhaseSpec) -> np.ndarray:
        """[steps, tokens] int64 slots, unique within each step, all in 1..rows-1."""
        tokens, steps = phase.tokens, phase.steps
        if tokens > self.usable:
            raise UsageError(
                f"{phase.key} needs {tokens} slots per write but the pool has {self.usable}; raise ",
                Setting("pool_size"))
        if self.pattern == "contiguous":
            flat = (np.arange(steps * tokens, dtype=np.int64) % self.usable) + self.page_size
            out = flat.reshape(steps, tokens)
        elif self.pattern == "random":
            out = np.empty((steps, tokens), dtype=np.int64)
            perm = self._perm()
            pos = 0
            for i in range(steps):
                if pos + tokens > perm.size:
                    perm, pos = self._perm(), 0
                out[i] = perm[pos : pos + tokens]
                pos += tokens
        else:
            out = self._paged(phase)
        assert out.min() >= 1 and out.max() < self.rows  # built here, checked here
        return out

    def _perm(self) -> np.ndarray:
        return self._rng.permutation(self.usable).astype(np.int64) + self.page_size

    def _paged(self, phase: PhaseSpec) -> np.ndarray:
        ps = self.page_size
        pages = self.usable // ps
        order = self._rng.permutation(pages) + 1  # page 0 is reserved
        next_page = itertools.cycle(order.tolist())  # wraps if a long run exhausts the pool
        out = np.empty((phase.steps, phase.tokens), dtype=np.int64)
        if phase.phase == "decode":
            # each request owns a page and appends one token per step
            page = np.array([next(next_page) for _ in range(phase.tokens)], dtype=np.int64)
            offset = self._rng.integers(0, ps, size=phase.tokens)
            for i in range(phase.steps):
                out[i] = page * ps + offset
                offset += 1
                full = offset == ps
                if full.any():
                    page[full] = [next(next_page) for _ in range(int(full.sum()))]
                    offset[full] = 0
        else:
            need = -(-phase.tokens // ps)
            for i in range(phase.steps):
                chunk_pages = np.array([next(next_page) for _ in range(need)], dtype=np.int64)
                slots = (chunk_pages[:, None] * ps + np.arange(ps)[None, :]).reshape(-1)
                out[i] = slots[: phase.tokens]
        return out


def make_inputs(
    tokens: int,
    head_num: int,
    head_dim: int,
    v_head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K and V rows (never zeros: zeros hide unwritten rows and run faster)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    k = torch.randn((tokens, head_num, head_dim), generator=gen, dtype=torch.float32) * scale
    v = torch.randn((tokens, head_num, v_head_dim), generator=gen, dtype=torch.float32) * scale
    return k.to(dtype=dtype, device=device), v.to(dtype=dtype, device=device)


def default_pool_size(
    phases: Iterable[PhaseSpec], head_num: int, dims: int, layers: int, elem: int, device: torch.device,
    budget_bytes: int | None = None,
) -> int:
    """Slots per layer: enough for every step without reuse where memory allows.

    On CUDA the pool is sized to be several times the L2 (random slots then miss L2 as
    in a real server) within a budget of GPU memory; on CPU it stays small.
    """
    need = max((p.steps * p.tokens for p in phases), default=1)
    row_bytes = head_num * dims * elem  # K + V
    if budget_bytes is None:
        budget_bytes = (8 << 30) if device.type == "cuda" else (256 << 20)
    cap = max(budget_bytes // (row_bytes * layers), 1)
    largest_write = max((p.tokens for p in phases), default=1)
    return int(max(min(max(need, 1 << 18), cap), 2 * largest_write + 64))
