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
from kvprof.core.vocab import NVTX_DOMAIN, WRITE_RANGE_FORMAT
from kvprof.kvcache.layouts.base import layer_index

_profiler_enabled = torch._C._autograd._profiler_enabled  # one C call: is a torch profiler recording?


class Ranges:
    """The ranges of one pool: names per layer, NVTX attributes per (layer, tokens)."""

    def __init__(self, pool: Any, variant: str) -> None:
        self.variant = variant
        self.domain = nvtx.get_domain(NVTX_DOMAIN)
        self.colour = variants.info(variant).argb
        self.start = pool.start_layer
        self.count = pool.layer_num
        self.names = [WRITE_RANGE_FORMAT.format(variant=variant, layer=pool.start_layer + i)
                      for i in range(pool.layer_num)]
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
