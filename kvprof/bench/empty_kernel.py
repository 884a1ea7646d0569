"""An empty Triton kernel: the cost of one kernel node, the floor under any write."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _empty(x):  # noqa: ANN001
    pass


def launch_empty() -> None:
    _empty[(1,)](0)
