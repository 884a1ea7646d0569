"""SGLang's MHA token-to-KV pool as a layout: ``kvprof.kvcache.pool.KVPool`` written by ``KVWriter``s
(the store, ``set_kv_buffer``) and by ``RopeKVWriter``s (the rotary embedding of q and k with
the store, ``set_kv_buffer_with_rope``: SGLang's fused rope + KV-cache write).

The pool and its instrumented form stay where the rest of kvprof imports them
(``kvprof.kvcache.pool``, ``kvprof.kvcache.instrument``); this module says what the MHA layout is beside the
MLA and paged ones.
"""

from __future__ import annotations

from typing import Any

import torch

from kvprof.core.variants import DEFAULT_CAPTURE_VARIANTS
from kvprof.kvcache.instrument import make_pool
from kvprof.kvcache.layouts.layout import Layout
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.writers.base import KVWriter
from kvprof.kvcache.writers.rope_base import RopeKVWriter


class MHALayout(Layout[KVPool]):
    """K and V buffers per layer, ``[size + page_size, heads, dim]`` each (SGLang's ``MHATokenToKVPool``)."""

    name = "mha"
    pool_class = KVPool
    reference = "index_put"
    unfused = "two_stream"  # SGLang's write before fused stores: two copies on two streams
    fused = ("triton_fused", "cuda_fused", "store_kv_fused")
    peers = ("sgl_kernel", "sgl_kernel_cubin", "sglang_store_cache")
    capture_defaults = DEFAULT_CAPTURE_VARIANTS

    def __init__(self) -> None:
        super().__init__({"store": KVWriter, "rope": RopeKVWriter})

    def make_pool(self, *args: Any, instrument: bool = False, variant: str | None = None, **kwargs: Any) -> KVPool:
        return make_pool(*args, instrument=instrument, variant=variant, **kwargs)

    def write(self, pool: KVPool, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              k_scale: Any = None, v_scale: Any = None) -> None:
        pool.set_kv_buffer(layer, loc, k, v, k_scale, v_scale)


LAYOUT = MHALayout()
