"""NVTX and torch.profiler ranges around each write, free when switched off.

Off means the plain ``KVPool``: no wrapper, no flag test on the hot path. On, each
``set_kv_buffer`` (and ``set_kv_buffer_with_rope``, in the same range) pushes an NVTX range
in domain ``kvprof`` (message naming variant and layer, payload = tokens, a colour and
category per variant) from event attributes built once per (layer, tokens), and enters a
``record_function`` range of the same name only while a torch profiler is recording: outside
a profiler record_function costs ~8.6 µs a call on a 2-core CPU machine, NVTX with prebuilt
attributes ~0.1 µs (`python benchmarks/bench_instrumentation.py` prints both).

The MLA and paged pools' writes get the same ranges (``Ranges``: message per variant and layer,
payload = tokens), so the trace readers and the analysis take these layouts' captures
unchanged. ``make_layout_pool`` builds any layout's pool, plain or instrumented; a call the
pool refuses gets no range (it raises before writing anything).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import nvtx
import torch

from kvprof.core import variants
from kvprof.core.vocab import NVTX_DOMAIN, PHASE_RANGE_FORMAT, STEP_RANGE_FORMAT, WRITE_RANGE_FORMAT
from kvprof.kvcache.contracts import check_layout
from kvprof.kvcache.mla_pool import MLAPool
from kvprof.kvcache.paged_pool import PagedPool
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.validation import layer_index

_BAD_CALL = object()  # a call the plain pool will reject: no range for it
_STEP_COLOR = 0xFFBAB0AC
_PHASE_COLOR = 0xFF9D755D

_profiler_enabled = torch._C._autograd._profiler_enabled  # one C call: is a torch profiler recording?


def variant_color(variant: str) -> int:
    """The variant's colour as NVTX's ARGB (kvprof.core.variants: the same on every chart)."""
    return variants.info(variant).argb


class InstrumentedKVPool(KVPool):
    """A ``KVPool`` whose writes show up as named ranges in Nsight Systems and torch.profiler."""

    def __init__(self, *args: Any, variant: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.variant = variant or self.writer.name
        self._domain = nvtx.get_domain(NVTX_DOMAIN)
        self._color = variant_color(self.variant)
        self._names = [
            WRITE_RANGE_FORMAT.format(variant=self.variant, layer=self.start_layer + i)
            for i in range(self.layer_num)
        ]
        self._attrs: dict[tuple[int, int], Any] = {}

    def _attributes(self, layer_id: Any, loc: Any) -> Any:
        """Build (once per layer and token count) the NVTX attributes; _BAD_CALL for a bad call."""
        if not (isinstance(layer_id, int) and isinstance(loc, torch.Tensor) and loc.dim() == 1):
            return _BAD_CALL
        idx = layer_id - self.start_layer
        if not 0 <= idx < self.layer_num:
            return _BAD_CALL
        tokens = loc.shape[0]
        attr = self._domain.get_event_attributes(
            message=self._names[idx], color=self._color, category=self.variant, payload=tokens
        )
        # (nvtx's no-tool domain returns None, and push_range(None) is its no-op)
        self._attrs[(layer_id, tokens)] = attr
        return attr

    def set_kv_buffer(
        self,
        layer: Any,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        layer_id = layer_id_override if layer_id_override is not None else getattr(layer, "layer_id", layer)
        try:
            attr = self._attrs[(layer_id, loc.shape[0])]
        except KeyError:
            attr = self._attributes(layer_id, loc)
        except (AttributeError, IndexError, TypeError):
            attr = _BAD_CALL
        if attr is _BAD_CALL:
            # not a layer of this pool or not a 1-D loc: the plain pool raises its
            # ValueError; no range for a call that writes nothing
            return KVPool.set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale, v_scale, layer_id_override)
        self._domain.push_range(attr)
        try:
            if _profiler_enabled():
                with torch.profiler.record_function(self._names[layer_id - self.start_layer]):
                    KVPool.set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale, v_scale, layer_id_override)
            else:
                KVPool.set_kv_buffer(self, layer, loc, cache_k, cache_v, k_scale, v_scale, layer_id_override)
        finally:
            self._domain.pop_range()


    def set_kv_buffer_with_rope(
        self,
        layer: Any,
        loc: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        is_neox: bool = True,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        """The rope + store write in the same range as ``set_kv_buffer``'s (same name, payload
        and colour), so the analysis attributes the whole unit -- rotation and store -- to it."""
        args = (layer, loc, q, k, v, positions, cos_sin_cache, is_neox, k_scale, v_scale, layer_id_override)
        layer_id = layer_id_override if layer_id_override is not None else getattr(layer, "layer_id", layer)
        try:
            attr = self._attrs[(layer_id, loc.shape[0])]
        except KeyError:
            attr = self._attributes(layer_id, loc)
        except (AttributeError, IndexError, TypeError):
            attr = _BAD_CALL
        if attr is _BAD_CALL:  # the plain pool raises its ValueError; no range for a call that writes nothing
            return KVPool.set_kv_buffer_with_rope(self, *args)
        self._domain.push_range(attr)
        try:
            if _profiler_enabled():
                with torch.profiler.record_function(self._names[layer_id - self.start_layer]):
                    KVPool.set_kv_buffer_with_rope(self, *args)
            else:
                KVPool.set_kv_buffer_with_rope(self, *args)
        finally:
            self._domain.pop_range()


def make_pool(*args: Any, instrument: bool = False, variant: str | None = None, **kwargs: Any) -> KVPool:
    """The plain pool when instrumentation is off (same call path), the instrumented one when on."""
    if instrument:
        return InstrumentedKVPool(*args, variant=variant, **kwargs)
    return KVPool(*args, **kwargs)


@contextmanager
def annotate(message: str, color: int, payload: int | None = None) -> Iterator[None]:
    """An NVTX range plus, under a profiler, a record_function range of the same name."""
    domain = nvtx.get_domain(NVTX_DOMAIN)
    domain.push_range(domain.get_event_attributes(message=message, color=color, category="kvprof", payload=payload))
    try:
        if _profiler_enabled():
            with torch.profiler.record_function(message):
                yield
        else:
            yield
    finally:
        domain.pop_range()


def step_range(phase: str, size_key: str, size: int, step: int, tokens: int) -> Any:
    return annotate(STEP_RANGE_FORMAT.format(phase=phase, size_key=size_key, size=size, step=step), _STEP_COLOR, tokens)


def phase_range(phase: str, size_key: str, size: int) -> Any:
    return annotate(PHASE_RANGE_FORMAT.format(phase=phase, size_key=size_key, size=size), _PHASE_COLOR, size)


# -- the MLA and paged pools' ranges, named as the MHA pool's are (kvprof.core.vocab.WRITE_RANGE_FORMAT)

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


class InstrumentedMLAPool(MLAPool):
    """An ``MLAPool`` whose writes are named ranges in Nsight Systems and torch.profiler."""

    def __init__(self, *args: Any, variant: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.variant = variant or self.writer.name
        self._ranges = Ranges(self, self.variant)

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
        self._ranges = Ranges(self, self.variant)

    def reshape_and_cache_flash(self, layer, key, value, slot_mapping, k_scale=None,  # type: ignore[override]
                                v_scale=None) -> None:
        self._ranges.run(layer, slot_mapping, lambda: PagedPool.reshape_and_cache_flash(
            self, layer, key, value, slot_mapping, k_scale, v_scale))


# layout -> (plain pool, instrumented pool)
POOLS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "mha": (KVPool, InstrumentedKVPool),
    "mla": (MLAPool, InstrumentedMLAPool),
    "paged": (PagedPool, InstrumentedPagedPool),
}


def make_layout_pool(layout: str, *args: Any, instrument: bool = False, variant: str | None = None,
                     **kwargs: Any) -> Any:
    """The plain pool of ``layout`` when instrumentation is off (its own constructor
    arguments), the instrumented one when on: its writes are NVTX and torch.profiler ranges
    named by ``variant`` (default: the writer's name)."""
    plain, instrumented = POOLS[check_layout(layout)]
    if instrument:
        return instrumented(*args, variant=variant, **kwargs)
    return plain(*args, **kwargs)
