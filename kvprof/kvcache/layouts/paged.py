"""A KV cache with the layout and write contract of vLLM's paged (flash) cache.

Per layer one K and one V tensor ``[num_blocks, block_size, num_kv_heads, head_size]`` (the
flash layout), written by ``reshape_and_cache_flash(key, value, key_cache, value_cache,
slot_mapping, kv_cache_dtype, k_scale, v_scale)``. The semantics implemented here follow
vLLM's ``csrc/cache_kernels.cu`` (``reshape_and_cache_flash_kernel``) and, for fp8,
``csrc/quantization/w8a8/fp8/nvidia/quant_utils.cuh`` (``scaled_vec_conversion``):

* token ``i`` goes to block ``slot // block_size``, offset ``slot % block_size``; a slot of
  -1 means "padding: skip this token" (its cache rows are left as they are);
* ``slot_mapping`` decides the token count; ``key``/``value`` may have more rows (inputs
  padded for CUDA graphs) and any token stride (views of a fused QKV output);
* cache dtype "auto" (not fp8) stores the inputs as they are (same dtype required); an fp8
  cache stores ``fp8(clamp(float(x) / scale, -max, max))``: an IEEE fp32 division by the
  per-tensor ``k_scale``/``v_scale`` (one-element fp32 tensors, read on the device), then a
  round-to-nearest-even conversion that saturates (``__NV_SATFINITE``), so overflow and inf
  become the format's largest finite value;
* fp8 caches are stored as uint8 and read back through ``dtype`` views.

Every input is checked before any kernel runs; a bad call raises a one-line ``ValueError`` and
writes nothing. A strided ``slot_mapping`` is copied contiguous; an input (scales included)
that shares memory with the layer's caches is refused.
"""

from __future__ import annotations

import abc
from collections import Counter
from typing import Any

import torch

from kvprof.kvcache.dtypes import short_name, store_dtype_for
from kvprof.kvcache.guards import check_memory, memory_limit
from kvprof.kvcache.layouts.base import (
    LayoutWriter,
    capturing,
    check_cache_dtype,
    check_loc,
    check_positive,
    check_rows,
    check_scale_value,
    is_fp8,
    layer_index,
    slot_range,
)
from kvprof.kvcache.layouts.layout import Layout
from kvprof.kvcache.layouts.ranges import Ranges
from kvprof.kvcache.validation import check_apart, check_buffers, check_index_range
from kvprof.kvcache.writers.base import checked_impl

PAD_SLOT = -1
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


class PagedWriter(LayoutWriter):
    """Writes one layer's K and V rows at ``slot_mapping`` (-1: skip) into a paged cache."""

    layout = "paged"

    @abc.abstractmethod
    def write(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, dtype: torch.dtype, k_scale: torch.Tensor | None,
              v_scale: torch.Tensor | None) -> str:
        """``k_cache``/``v_cache``: storage ``[num_blocks, block_size, heads, dim]`` (uint8 for
        fp8); ``key``/``value``: validated ``[>= tokens, heads, dim]`` (rows contiguous, any
        token stride); ``k_scale``/``v_scale``: one-element fp32 tensors on the device (fp8
        caches only, else None). Returns the path that ran. Checked by :meth:`check_write`
        before this runs, whoever calls it."""

    def check_write(self, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,  # type: ignore[override]
                    key: torch.Tensor, value: torch.Tensor, dtype: torch.dtype, k_scale: torch.Tensor | None,
                    v_scale: torch.Tensor | None) -> tuple[Any, ...]:
        """The paged contract's checks: the caches contiguous ``[blocks, block_size, heads,
        dim]`` of one shape in the cache's storage dtype; ``slots`` 1-D int32/int64 (copied
        contiguous where strided); ``key``/``value`` ``[>= tokens, heads, dim]`` floats of one
        dtype, the cache's own (an fp8 cache: fp32/bf16/fp16); an fp8 cache's scales
        one-element fp32 tensors on the device (else None or such a tensor); no input sharing
        memory with a cache; the writer's ``unsupported_reason``; on a CPU, slots in ``[-1,
        slots)``."""
        device = check_buffers(dtype, 4, k_cache=k_cache, v_cache=v_cache)
        if k_cache.shape != v_cache.shape:
            raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
        _, _, heads, dim = k_cache.shape
        slots = check_loc(slots, device, "slot_mapping")
        tokens = slots.shape[0]
        key = check_rows(key, "key", tokens, heads, dim, device, at_least=True)
        value = check_rows(value, "value", tokens, heads, dim, device, at_least=True)
        if key.dtype != value.dtype:
            raise ValueError(f"key is {key.dtype} but value is {value.dtype}")
        fp8 = is_fp8(dtype)
        if fp8 and (is_fp8(key.dtype) or key.dtype == torch.float64):
            raise ValueError(f"an fp8 cache takes fp32/bf16/fp16 inputs, got {key.dtype}")
        if not fp8 and key.dtype != dtype:
            raise ValueError(f"a {short_name(dtype)} cache stores {short_name(dtype)} inputs as they are, "
                             f"got {key.dtype} (vLLM's kv_cache_dtype 'auto')")
        for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
            if scale is None and not fp8:
                continue
            if (not isinstance(scale, torch.Tensor) or scale.numel() != 1 or scale.dtype != torch.float32
                    or scale.device != device):
                got = (f"{tuple(scale.shape)} {scale.dtype} on {scale.device}" if isinstance(scale, torch.Tensor)
                       else type(scale).__name__)
                raise ValueError(f"{name} must be a one-element float32 tensor on {device}"
                                 f"{' (an fp8 cache divides by it)' if fp8 else ' or None'}, got {got}")
        check_apart((k_cache, v_cache), slot_mapping=slots, key=key, value=value, k_scale=k_scale, v_scale=v_scale)
        self.check_supported(k_cache, dtype, key.dtype)
        check_index_range("slot_mapping", slots, PAD_SLOT, k_cache.shape[0] * k_cache.shape[1])
        return k_cache, v_cache, slots, key, value, dtype, k_scale, v_scale


class PagedPool:
    """vLLM-compatible paged K/V cache with a pluggable writer (see the module docstring)."""

    layout = "paged"

    def __init__(self, num_blocks: int, block_size: int, dtype: torch.dtype, head_num: int, head_dim: int,
                 layer_num: int, device: str | torch.device = "cpu", *, writer: PagedWriter, start_layer: int = 0,
                 check_slots: bool = True) -> None:
        check_positive(num_blocks=num_blocks, block_size=block_size, head_num=head_num, head_dim=head_dim,
                       layer_num=layer_num)
        if isinstance(start_layer, bool) or not isinstance(start_layer, int) or start_layer < 0:
            raise ValueError(f"start_layer must be a non-negative integer, got {start_layer!r}")
        check_cache_dtype(dtype)
        if not isinstance(writer, PagedWriter):
            raise ValueError(f"the paged pool needs a paged writer, got {type(writer).__name__}")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elem = torch.empty((), dtype=dtype).element_size()
        check_memory(2 * num_blocks * block_size * head_num * head_dim * elem * layer_num, memory_limit(device),
                     f"a paged cache of {layer_num} layers x {num_blocks:,} blocks x {block_size} x {head_num} heads")
        self.num_blocks, self.block_size, self.dtype = num_blocks, block_size, dtype
        self.store_dtype = store_dtype_for(dtype)
        self.head_num, self.head_dim = head_num, head_dim
        self.layer_num, self.start_layer = layer_num, start_layer
        self.device = device
        self.writer = writer
        self.check_slots = check_slots
        self.path_counts: Counter[str] = Counter()
        self._scales: dict[float, torch.Tensor] = {}
        shape = (num_blocks, block_size, head_num, head_dim)
        self.key_cache = [torch.zeros(shape, dtype=self.store_dtype, device=device) for _ in range(layer_num)]
        self.value_cache = [torch.zeros(shape, dtype=self.store_dtype, device=device) for _ in range(layer_num)]

    @property
    def slots(self) -> int:
        """Addressable slots per layer: ``num_blocks x block_size``."""
        return self.num_blocks * self.block_size

    @property
    def row_bytes(self) -> int:
        """Bytes of one token's K row (V is the same)."""
        return self.head_num * self.head_dim * self.key_cache[0].element_size()

    def bytes_per_write(self, tokens: int, input_dtype: torch.dtype | None = None) -> int:
        in_elem = torch.empty((), dtype=input_dtype or self.dtype).element_size()
        return tokens * 2 * (self.head_num * self.head_dim * in_elem + self.row_bytes)

    def describe(self) -> dict[str, Any]:
        return {"layout": self.layout, "num_blocks": self.num_blocks, "block_size": self.block_size,
                "dtype": short_name(self.dtype), "store_dtype": short_name(self.store_dtype),
                "head_num": self.head_num, "head_dim": self.head_dim, "layer_num": self.layer_num,
                "start_layer": self.start_layer, "device": str(self.device), "writer": self.writer.name}

    def get_kv_cache(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = layer_index(layer_id, None, self.start_layer, self.layer_num)
        k, v = self.key_cache[idx], self.value_cache[idx]
        if self.store_dtype != self.dtype:
            return k.view(self.dtype), v.view(self.dtype)
        return k, v

    # -- the write ------------------------------------------------------------------------
    def reshape_and_cache_flash(self, layer: Any, key: torch.Tensor, value: torch.Tensor,
                                slot_mapping: torch.Tensor, k_scale: Any = None, v_scale: Any = None) -> None:
        """vLLM's write, argument order and all (the caches are the layer's)."""
        idx = layer_index(layer, None, self.start_layer, self.layer_num)
        slot_mapping = check_loc(slot_mapping, self.device, "slot_mapping")
        tokens = slot_mapping.shape[0]
        key = check_rows(key, "key", tokens, self.head_num, self.head_dim, self.device, at_least=True)
        value = check_rows(value, "value", tokens, self.head_num, self.head_dim, self.device, at_least=True)
        if key.dtype != value.dtype:
            raise ValueError(f"key is {key.dtype} but value is {value.dtype}")
        fp8 = is_fp8(self.dtype)
        if fp8 and (is_fp8(key.dtype) or key.dtype == torch.float64):
            raise ValueError(f"an fp8 cache takes fp32/bf16/fp16 inputs, got {key.dtype}")
        if not fp8 and key.dtype != self.dtype:
            raise ValueError(f"a {short_name(self.dtype)} cache stores {short_name(self.dtype)} inputs as they are, "
                             f"got {key.dtype} (vLLM's kv_cache_dtype 'auto')")
        check_scale_value("k_scale", k_scale, self.device)
        check_scale_value("v_scale", v_scale, self.device)
        if self.check_slots and tokens and not capturing(slot_mapping):
            lo, hi = slot_range(slot_mapping)
            if lo < PAD_SLOT:
                raise ValueError(f"slot_mapping has slot {lo}; only -1 (padding) may be negative")
            if hi >= self.slots:
                raise ValueError(f"slot_mapping has slot {hi}, past the last slot {self.slots - 1}")
        ks = self._scale(k_scale) if fp8 else None
        vs = self._scale(v_scale) if fp8 else None
        if tokens:
            check_apart((self.key_cache[idx], self.value_cache[idx]), slot_mapping=slot_mapping, key=key,
                        value=value, k_scale=ks, v_scale=vs)
        path = checked_impl(self.writer)(self.key_cache[idx], self.value_cache[idx], slot_mapping, key, value,
                                 self.dtype, ks, vs)
        self.path_counts[path] += 1

    def set_kv_buffer(self, layer: Any, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                      k_scale: Any = None, v_scale: Any = None, layer_id_override: int | None = None) -> None:
        """kvprof's common write call (the MHA pool's argument order) mapped onto vLLM's."""
        layer_id = layer_id_override if layer_id_override is not None else getattr(layer, "layer_id", layer)
        self.reshape_and_cache_flash(layer_id, cache_k, cache_v, loc, k_scale, v_scale)

    def _scale(self, scale: Any) -> torch.Tensor:
        """The scale as a one-element fp32 tensor on the device (numbers cached; a tensor is
        used as it is, so a graph replay reads its current value, as vLLM's kernel does)."""
        if isinstance(scale, torch.Tensor):
            return scale.reshape(1) if scale.dtype == torch.float32 else scale.reshape(1).float()
        value = 1.0 if scale is None else float(scale)
        t = self._scales.get(value)
        if t is None:
            t = self._scales[value] = torch.full((1,), value, dtype=torch.float32, device=self.device)
        return t


def convert_like_vllm(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """The reference conversion into the cache's storage dtype: as is for a non-fp8 cache,
    else ``fp8(clamp(float(x) / scale, -max, max))`` with an IEEE fp32 division (a 1-element
    tensor divisor on the same device: a CPU scalar would make CUDA multiply by its reciprocal)."""
    if not is_fp8(dtype):
        return x
    y = x.float()
    if scale is not None:
        y = y / scale.to(device=y.device, dtype=torch.float32).reshape(1)
    m = FP8_MAX[dtype]
    return y.clamp(-m, m).to(dtype).view(torch.uint8)


class PagedLayout(Layout[PagedPool]):
    """K and V per layer as ``[num_blocks, block_size, heads, dim]`` (vLLM's flash layout)."""

    name = "paged"
    pool_class = PagedPool
    reference = "paged_index_put"
    unfused = "paged_unfused"  # vLLM's write as separate torch ops
    fused = ("paged_triton", "paged_cuda")
    peers = ()
    # the reference drops padded slots with a host sync, so it is a check, not a captured variant
    capture_defaults = ("paged_unfused", "paged_triton", "paged_cuda")

    def __init__(self) -> None:
        super().__init__({"store": PagedWriter})

    def make_pool(self, *args: Any, instrument: bool = False, variant: str | None = None,
                  **kwargs: Any) -> PagedPool:
        if not instrument:
            return PagedPool(*args, **kwargs)

        return InstrumentedPagedPool(*args, variant=variant, **kwargs)

    def write(self, pool: PagedPool, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              k_scale: Any = None, v_scale: Any = None) -> None:
        """vLLM's call: ``loc`` is the slot mapping (-1: padding)."""
        pool.reshape_and_cache_flash(layer, k, v, loc, k_scale, v_scale)


LAYOUT = PagedLayout()


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
