"""KV-cache layouts: SGLang's MHA pool, SGLang's MLA latent cache and vLLM's paged cache.

``kvprof.kvcache.layouts.layout.Layout`` says what a layout is (pool, writer contracts, the roles of
its writers, capture defaults, presets, how a workload writes one layer); ``mha``, ``mla`` and
``paged`` each define one. Every pool has the MHA pool's contract (inputs checked before any
kernel, a bit-exact reference writer, fp8 through uint8 views, pluggable writers that report
the path that ran); the writers of every layout are in one registry,
``kvprof.kvcache.writers.registry``, keyed by (layout, name).
"""

from kvprof.kvcache.layouts.layout import LAYOUTS, Layout, get_layout

__all__ = ["LAYOUTS", "Layout", "get_layout"]
