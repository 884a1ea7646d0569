"""NVTX and torch.profiler ranges around the MLA and paged pools' writes, named as the MHA
pool's are (``kvprof.core.vocab.WRITE_RANGE_FORMAT``: variant and layer, payload = tokens),
so the trace readers and the analysis take these layouts' captures unchanged.

Off means the plain pool (no wrapper on the hot path); on, each write pushes an NVTX range
in domain ``kvprof`` and, only while a torch profiler records, a ``record_function`` range.
A call the pool refuses gets no range (it raises before writing anything).
"""

from __future__ import annotations

from typing import Any

import nvtx
import torch

from kvprof.core import variants
from kvprof.layouts.base import layer_index
from kvprof.layouts.layout import WritePool, get_layout
from kvprof.layouts.mla import MLAPool
from kvprof.layouts.paged import PagedPool
from kvprof.core.vocab import NVTX_DOMAIN, WRITE_RANGE_FORMAT

_profiler_enabled = torch._C._autograd._profiler_enabled  # one C call: is a torch profiler recording?


class _Ranges:
    """The ranges of one pool: names per layer, NVTX attributes per (layer, tokens)."""

    def __init__(self, pool: Any, variant: str) -> None:
        self.variant = variant
        self.domain = nvtx.get_domain(NVTX_DOMAIN)
        self.colour = variants.info(variant).argb
        self.start = pool.start_layer
        self.count = pool.layer_num
        self.names = [WRITE_RANGE_FORMAT.format(variant=variant, layer=pool.start_layer + i) for i in range(pool.layer_num)]
        self.attrs: dict[tuple[int, int], Any] = {}

    def run(self, layer: Any, loc: Any, write: Any) -> None:
        try:
            idx = layer_index(layer, None, self.start, self.count)
            tokens = int(loc.shape[0])
        except (ValueError, AttributeError, IndexError, TypeError):
            return write()  # the pool's own one-line error; no range for a bad call
        attr = self.attrs.get((idx, tokens))
        if attr is None:
            attr = self.attrs[(idx, tokens)] = self.domain.get_event_attributes(
                message=self.names[idx], color=self.colour, category=self.variant, payload=tokens)
        self.domain.push_range(attr)
        try:
            if _profiler_enabled():
                with torch.profiler.record_function(self.names[idx]):
                    write()
            else:
                write()
        finally:
            self.domain.pop_range()


class InstrumentedMLAPool(MLAPool):
    """An ``MLAPool`` whose writes are named ranges in Nsight Systems and torch.profiler."""

    def __init__(self, *args: Any, variant: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.variant = variant or self.writer.name
        self._ranges = _Ranges(self, self.variant)

    def set_kv_buffer(self, layer, loc, cache_k, cache_v=None, k_scale=None, v_scale=None,  # type: ignore[override]
                      layer_id_override=None) -> None:
        lid = layer_id_override if layer_id_override is not None else getattr(layer, "layer_id", layer)
        self._ranges.run(lid, loc, lambda: MLAPool.set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale, v_scale,
                                                                 layer_id_override))

    def set_mla_kv_buffer(self, layer, loc, cache_k_nope, cache_k_rope,  # type: ignore[override]
                          layer_id_override=None) -> None:
        lid = layer_id_override if layer_id_override is not None else getattr(layer, "layer_id", layer)
        self._ranges.run(lid, loc, lambda: MLAPool.set_mla_kv_buffer(self, layer, loc, cache_k_nope, cache_k_rope,
                                                                     layer_id_override))


class InstrumentedPagedPool(PagedPool):
    """A ``PagedPool`` whose writes are named ranges in Nsight Systems and torch.profiler."""

    def __init__(self, *args: Any, variant: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.variant = variant or self.writer.name
        self._ranges = _Ranges(self, self.variant)

    def reshape_and_cache_flash(self, layer, key, value, slot_mapping, k_scale=None,  # type: ignore[override]
                                v_scale=None) -> None:
        self._ranges.run(layer, slot_mapping, lambda: PagedPool.reshape_and_cache_flash(
            self, layer, key, value, slot_mapping, k_scale, v_scale))


def make_layout_pool(layout: str, *args: Any, instrument: bool = False, variant: str | None = None,
                     **kwargs: Any) -> WritePool:
    """The plain pool of ``layout`` when instrumentation is off, the instrumented one when on
    (``Layout.make_pool``; "mha" gives ``kvprof.instrument.make_pool``'s)."""
    return get_layout(layout).make_pool(*args, instrument=instrument, variant=variant, **kwargs)
