"""vLLM's paged (flash) layout (the pool: ``kvprof.kvcache.paged_pool``, its writers' contract:
``kvprof.kvcache.contracts.PagedWriter``); ``write``'s ``loc`` is the slot mapping (-1: padding)."""

from __future__ import annotations

from kvprof.kvcache.layouts.layout import Layout, register_layout


class PagedLayout(Layout):
    """K and V per layer as ``[num_blocks, block_size, heads, dim]`` (vLLM's flash layout)."""

    name = "paged"


LAYOUT = register_layout(PagedLayout())
