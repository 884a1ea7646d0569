"""The default grids of ``kvprof bench``, per device kind; torch-free so ``--help`` can state them.

On CUDA the grid spans the row shapes of the served models (a Llama-3.1-70B KV head per
rank at TP8 up to 32 heads), three dtypes and 1 to 32768 tokens. On a CPU every write is
host code (no graphs, no launch queue), a point costs milliseconds to seconds, and
torch.compile compiles once per new shape: two row shapes (70B at TP8, 8B at TP1), the
bf16 cache and the fp8 one written from bf16 (the cast is the costly part on a CPU), and
one, 64 and 512 tokens (per-call cost, then copy-bound) say what differs between the
writers in a few minutes (most of it torch.compile's compiles and Triton's interpreter):
that is ``--grid full`` on a CPU; the default there is ``--grid quick``, one shape and dtype.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Grid:
    shapes: tuple[tuple[int, int], ...]  # (heads, head dim)
    dtypes: tuple[tuple[str, str], ...]  # (cache dtype, input dtype)
    tokens: tuple[int, ...]

    @property
    def points(self) -> int:
        return len(self.shapes) * len(self.dtypes) * len(self.tokens)

    def shapes_text(self) -> str:
        return ",".join(f"{h}x{d}" for h, d in self.shapes)

    def dtypes_text(self) -> str:
        return ",".join(c if c == i else f"{c}<-{i}" for c, i in self.dtypes)

    def tokens_text(self) -> str:
        return ",".join(str(t) for t in self.tokens)


CUDA_GRID = Grid(shapes=((1, 128), (8, 128), (4, 256), (32, 128)),
                 dtypes=(("bf16", "bf16"), ("fp16", "fp16"), ("fp8_e4m3", "bf16")),
                 tokens=(1, 8, 64, 512, 4096, 32768))
CPU_GRID = Grid(shapes=((1, 128), (8, 128)), dtypes=(("bf16", "bf16"), ("fp8_e4m3", "bf16")), tokens=(1, 64, 512))

# torch's intra-op threads while a CPU bench times: one, so that a write's time is the
# writer's work and not how two threads contend for a small (often shared) machine's cores
CPU_THREADS = 1


# --grid quick (the default on a CPU): one row shape, the bf16 cache, a single token (the per-call
# cost) and 64 (a decode batch); on a CPU every default writer in about half a minute on an idle
# 2-core machine (most of it torch.compile's one compile and Triton's interpreter). On CUDA the
# same shape and dtype at 1, 64 and 4096 tokens.
CPU_QUICK_GRID = Grid(shapes=((8, 128),), dtypes=(("bf16", "bf16"),), tokens=(1, 64))
CUDA_QUICK_GRID = Grid(shapes=((8, 128),), dtypes=(("bf16", "bf16"),), tokens=(1, 64, 4096))
GRID_SIZES = ("quick", "full")  # --grid; default: quick on a CPU, full on CUDA


def default_size(device_type: str) -> str:
    """The grid that fits the device kind: the full one on CUDA, the quick one on a CPU."""
    return "full" if device_type == "cuda" else "quick"


def default_grid(device_type: str, size: str | None = None) -> Grid:
    size = size or default_size(device_type)
    if device_type == "cuda":
        return CUDA_GRID if size == "full" else CUDA_QUICK_GRID
    return CPU_GRID if size == "full" else CPU_QUICK_GRID


@dataclass(frozen=True)
class RopeGrid:
    """The rope family's grid (``bench --family rope``): each write rotates q and k and stores
    K and V, so a shape names the query heads too: (q heads, KV heads, head dim)."""

    shapes: tuple[tuple[int, int, int], ...]
    dtypes: tuple[tuple[str, str], ...]
    tokens: tuple[int, ...]

    @property
    def points(self) -> int:
        return len(self.shapes) * len(self.dtypes) * len(self.tokens)

    def shapes_text(self) -> str:
        return ",".join(f"{q}x{h}x{d}" for q, h, d in self.shapes)

    def dtypes_text(self) -> str:
        return ",".join(c if c == i else f"{c}<-{i}" for c, i in self.dtypes)

    def tokens_text(self) -> str:
        return ",".join(str(t) for t in self.tokens)


# Llama-3.1-70B per rank at TP 8 (8 q heads, 1 KV head) and Llama-3.1-8B at TP 1 (32 q, 8 KV),
# the bf16 cache and fp8 from bf16, decode batches to a long prefill. On a CPU the kernels run
# in Triton's interpreter (tens of ms a write): one shape, one and 64 tokens.
CUDA_ROPE_GRID = RopeGrid(shapes=((8, 1, 128), (32, 8, 128)), dtypes=(("bf16", "bf16"), ("fp8_e4m3", "bf16")),
                          tokens=(1, 8, 64, 512, 4096, 32768))
CPU_ROPE_GRID = RopeGrid(shapes=((8, 1, 128),), dtypes=(("bf16", "bf16"), ("fp8_e4m3", "bf16")), tokens=(1, 64))
FAMILIES = ("store", "rope")  # what one write is: the K/V store alone, or rope + store


# --family rope --grid quick: one shape, bf16, one token (on a CPU each rope write of the
# Triton writers is tens of ms in the interpreter); on CUDA 1, 64 and 4096 tokens
CPU_QUICK_ROPE_GRID = RopeGrid(shapes=((8, 1, 128),), dtypes=(("bf16", "bf16"),), tokens=(1,))
CUDA_QUICK_ROPE_GRID = RopeGrid(shapes=((8, 1, 128),), dtypes=(("bf16", "bf16"),), tokens=(1, 64, 4096))


def default_rope_grid(device_type: str, size: str | None = None) -> RopeGrid:
    size = size or default_size(device_type)
    if device_type == "cuda":
        return CUDA_ROPE_GRID if size == "full" else CUDA_QUICK_ROPE_GRID
    return CPU_ROPE_GRID if size == "full" else CPU_QUICK_ROPE_GRID


__all__ = ["CPU_GRID", "CPU_QUICK_GRID", "CPU_QUICK_ROPE_GRID", "CPU_ROPE_GRID", "CPU_THREADS", "CUDA_GRID",
           "CUDA_QUICK_GRID", "CUDA_QUICK_ROPE_GRID", "CUDA_ROPE_GRID", "FAMILIES", "GRID_SIZES", "Grid", "RopeGrid",
           "default_grid", "default_rope_grid", "default_size"]
