"""The plain or the instrumented pool of a layout by name (``Layout.make_pool``).

The instrumented MLA and paged pools live beside their pools (``InstrumentedMLAPool`` in
``layouts/mla.py``, ``InstrumentedPagedPool`` in ``layouts/paged.py``) over the shared ranges of
``layouts/ranges.py``; "mha" gives ``kvprof.kvcache.instrument.make_pool``'s.
"""

from __future__ import annotations

from typing import Any

from kvprof.kvcache.layouts.layout import WritePool, get_layout
from kvprof.kvcache.layouts.mla import InstrumentedMLAPool
from kvprof.kvcache.layouts.paged import InstrumentedPagedPool

__all__ = ["InstrumentedMLAPool", "InstrumentedPagedPool", "make_layout_pool"]


def make_layout_pool(layout: str, *args: Any, instrument: bool = False, variant: str | None = None,
                     **kwargs: Any) -> WritePool:
    """The plain pool of ``layout`` when instrumentation is off, the instrumented one when on
    (``Layout.make_pool``; "mha" gives ``kvprof.kvcache.instrument.make_pool``'s)."""
    return get_layout(layout).make_pool(*args, instrument=instrument, variant=variant, **kwargs)
