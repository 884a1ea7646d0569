"""KV-cache layouts: SGLang's MHA pool, SGLang's MLA latent cache and vLLM's paged cache.

``kvprof.kvcache.layouts.layout.Layout`` says what a layout is (writer contracts, the roles of
its writers and capture defaults from the variant table, presets); ``mha``, ``mla`` and
``paged`` each define one and register it, which importing this package does. The writers of
every layout are in one registry, ``kvprof.kvcache.registry``, keyed by (layout, name); the
pools sit above the layouts (``kvprof.kvcache.instrument.make_layout_pool``).
"""

from kvprof.kvcache.contracts import LAYOUTS
from kvprof.kvcache.layouts import mha, mla, paged  # noqa: F401  (each registers its layout)
from kvprof.kvcache.layouts.layout import Layout, get_layout

__all__ = ["LAYOUTS", "Layout", "get_layout"]
