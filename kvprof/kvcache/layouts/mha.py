"""SGLang's MHA token-to-KV pool as a layout (the pool: ``kvprof.kvcache.pool.KVPool``, its
writers' contracts: ``KVWriter`` for the store, ``set_kv_buffer``, and ``RopeKVWriter`` for the
rotary embedding of q and k with the store, ``set_kv_buffer_with_rope``: SGLang's fused rope +
KV-cache write)."""

from __future__ import annotations

from kvprof.kvcache.layouts.layout import Layout, register_layout


class MHALayout(Layout):
    """K and V buffers per layer, ``[size + page_size, heads, dim]`` each (SGLang's ``MHATokenToKVPool``)."""

    name = "mha"


LAYOUT = register_layout(MHALayout())
