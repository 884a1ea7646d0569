"""Empty Triton kernels: the cost of one kernel node, the floor under any write.

Two floors, because kvprof's fused writes launch with programmatic dependent launch
(PDL) on sm_90+: a plain empty kernel waits for the previous node to finish before it
starts, a PDL one (``griddepcontrol``, as the writes do) overlaps its launch with the
previous node's tail, so back-to-back PDL nodes cost less than plain ones.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _empty(x):  # noqa: ANN001
    pass


@triton.jit
def _empty_pdl(x):  # noqa: ANN001
    tl.extra.cuda.gdc_launch_dependents()
    tl.extra.cuda.gdc_wait()


def launch_empty() -> None:
    _empty[(1,)](0)


def launch_empty_pdl() -> None:
    _empty_pdl[(1,)](0, launch_pdl=True)
