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

from collections import Counter
from typing import Any

import torch

from kvprof.kvcache import signature
from kvprof.kvcache.contracts import PAD_SLOT, PagedWriter, checked_impl
from kvprof.kvcache.dtypes import short_name, store_dtype_for
from kvprof.kvcache.guards import check_memory, memory_limit
from kvprof.kvcache.validation import (
    capturing,
    check_apart,
    check_cache_dtype,
    check_loc,
    check_positive,
    check_rows,
    check_scale_value,
    is_fp8,
    layer_index,
    slot_range,
)


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
        self._fp8 = is_fp8(dtype)
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
        fp8 = self._fp8
        if (self.check_slots or (not fp8 and (k_scale is not None or v_scale is not None))
                or not signature.ready(slot_mapping)):
            args = self._checked(idx, key, value, slot_mapping, k_scale, v_scale)
            if not self.check_slots:
                self.writer.check_values(*args)  # on a CPU, slots as the writer's checks read them
            self.path_counts[checked_impl(self.writer)(*args)] += 1
            return
        # the writer's contract checks what the pool's checks do (the caches are the pool's, the
        # scales' values checked here), kept per call key (checked_call); the pool's checks run
        # only to word a refusal
        try:
            ks = vs = None
            if fp8:
                check_scale_value("k_scale", k_scale, self.device)
                check_scale_value("v_scale", v_scale, self.device)
                ks, vs = self._scale(k_scale), self._scale(v_scale)
            args = self.writer.checked_call(self.key_cache[idx], self.value_cache[idx], slot_mapping, key,
                                            value, self.dtype, ks, vs)
        except ValueError:
            self._checked(idx, key, value, slot_mapping, k_scale, v_scale)
            raise
        path = checked_impl(self.writer)(*args)
        self.path_counts[path] += 1

    def _checked(self, idx: int, key: Any, value: Any, slot_mapping: Any, k_scale: Any,
                 v_scale: Any) -> tuple[Any, ...]:
        """The pool's checks, in vLLM's terms; the writer's arguments."""
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
        return self.key_cache[idx], self.value_cache[idx], slot_mapping, key, value, self.dtype, ks, vs

    def write_layer(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_scale: Any = None, v_scale: Any = None) -> None:
        """vLLM's call (``Layout.write``): ``loc`` is the slot mapping (-1: padding)."""
        self.reshape_and_cache_flash(layer, k, v, loc, k_scale, v_scale)

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
