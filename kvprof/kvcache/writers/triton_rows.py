"""Device code every fused Triton store shares: which tokens a program owns and their slots.

``triton_fused`` (MHA), ``mla_triton`` and ``paged_triton`` all start the same way, so the
start is written once. Triton inlines a ``@triton.jit`` helper into its caller: the kernels'
SASS is the same as with the lines written out in each (``lab/sass_offline.py`` and
``gpu/layouts_sass_offline.py`` print a digest per compiled kernel to check exactly that).
"""

from __future__ import annotations

from kvprof.kvcache.devinfo import decorates_triton_kernels
from kvprof.kvcache.writers.triton_convert import triton

decorates_triton_kernels(__name__)  # before its kernels are decorated: Triton reads TRITON_INTERPRET then

if triton is not None:
    import triton.language as tl

    @triton.jit
    def program_tokens(loc, tokens, BLOCK_T: tl.constexpr, WIDE: tl.constexpr, PDL: tl.constexpr):
        """The ``BLOCK_T`` token indices of program ``program_id(0)``, which of them exist, and
        their slots (-1 past the end). ``WIDE``: 64-bit indices. ``PDL``: programmatic dependent
        launch -- let the next kernel start, then wait for the previous one before any load."""
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        if WIDE:
            tok = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        else:
            tok = pid * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = tok < tokens
        slot = tl.load(loc + tok, mask=tmask, other=-1)
        return tok, tmask, slot
