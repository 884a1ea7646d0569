"""KV-cache layouts beyond SGLang's MHA pool: SGLang's MLA latent cache and vLLM's paged cache.

Each layout is a pool with the MHA pool's contract (inputs checked before any kernel, a
bit-exact reference writer, fp8 through uint8 views, pluggable writers that report the path
that ran) and its own writers (``kvprof.layouts.registry``).
"""

from kvprof.layouts.base import LAYOUTS

__all__ = ["LAYOUTS"]
