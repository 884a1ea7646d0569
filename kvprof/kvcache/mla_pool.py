"""A KV pool with the layout and write contract of SGLang's ``MLATokenToKVPool``.

DeepSeek-V2/V3/R1 cache one latent row per token and layer: ``kv_lora_rank`` compressed
values followed by ``qk_rope_head_dim`` rotary key values (DeepSeek-V3: 512 + 64 = 576),
one buffer per layer of ``[size + page_size, 1, kv_lora_rank + qk_rope_head_dim]``, not split
by tensor parallelism. As in SGLang (0.5.23, ``sglang/srt/mem_cache/memory_pool.py``):

* ``set_kv_buffer(layer, loc, cache_k, cache_v)`` writes the whole row ``cache_k`` at every
  slot of ``loc`` (``cache_v`` is ignored); a different input dtype is cast with ``.to``;
* ``set_mla_kv_buffer(layer, loc, cache_k_nope, cache_k_rope)`` casts each part and writes
  them side by side into the row in one step, and skips slot 0 (SGLang's
  ``reserved_skip_index``: the dummy row CUDA-graph padding points at stays untouched);
* fp8 caches live in uint8 buffers, read back through ``dtype`` views; there are no K/V
  scales (SGLang's MLA cast does not scale).

Every input is checked before any kernel runs; a bad call raises a one-line ``ValueError`` and
writes nothing. A strided ``loc`` is copied contiguous; an input that shares memory with the
layer's buffer is refused.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from kvprof.kvcache import signature
from kvprof.kvcache.contracts import NO_SKIP, RESERVED_SKIP_SLOT, MLAWriter, checked_impl
from kvprof.kvcache.dtypes import short_name, store_dtype_for
from kvprof.kvcache.guards import check_memory, memory_limit
from kvprof.kvcache.validation import (
    capturing,
    check_apart,
    check_cache_dtype,
    check_loc,
    check_positive,
    check_rows,
    layer_index,
    slot_range,
)


class MLAPool:
    """SGLang-compatible MLA latent pool with a pluggable writer (see the module docstring)."""

    layout = "mla"

    def __init__(self, size: int, page_size: int, dtype: torch.dtype, kv_lora_rank: int, qk_rope_head_dim: int,
                 layer_num: int, device: str | torch.device = "cpu", *, writer: MLAWriter, start_layer: int = 0,
                 check_slots: bool = True) -> None:
        check_positive(size=size, page_size=page_size, kv_lora_rank=kv_lora_rank,
                       qk_rope_head_dim=qk_rope_head_dim, layer_num=layer_num)
        if isinstance(start_layer, bool) or not isinstance(start_layer, int) or start_layer < 0:
            raise ValueError(f"start_layer must be a non-negative integer, got {start_layer!r}")
        check_cache_dtype(dtype)
        if not isinstance(writer, MLAWriter):
            raise ValueError(f"the MLA pool needs an MLA writer, got {type(writer).__name__}")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        elem = torch.empty((), dtype=dtype).element_size()
        check_memory((size + page_size) * self.kv_cache_dim * elem * layer_num, memory_limit(device),
                     f"an MLA pool of {layer_num} layers x {size + page_size:,} slots x {self.kv_cache_dim}")
        self.size, self.page_size, self.dtype = size, page_size, dtype
        self.store_dtype = store_dtype_for(dtype)
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.layer_num, self.start_layer = layer_num, start_layer
        self.device = device
        self.writer = writer
        self.check_slots = check_slots
        self.path_counts: Counter[str] = Counter()
        # the padded slot 0 is where padded tokens' dummy outputs go
        self.kv_buffer = [torch.zeros((self.rows, 1, self.kv_cache_dim), dtype=self.store_dtype, device=device)
                          for _ in range(layer_num)]

    @property
    def rows(self) -> int:
        return self.size + self.page_size

    @property
    def row_bytes(self) -> int:
        return self.kv_cache_dim * self.kv_buffer[0].element_size()

    def bytes_per_write(self, tokens: int, input_dtype: torch.dtype | None = None) -> int:
        """Inputs read once, latent rows written once."""
        in_elem = torch.empty((), dtype=input_dtype or self.dtype).element_size()
        return tokens * (self.kv_cache_dim * in_elem + self.row_bytes)

    def describe(self) -> dict[str, Any]:
        return {"layout": self.layout, "size": self.size, "page_size": self.page_size, "dtype": short_name(self.dtype),
                "store_dtype": short_name(self.store_dtype), "kv_lora_rank": self.kv_lora_rank,
                "qk_rope_head_dim": self.qk_rope_head_dim, "layer_num": self.layer_num,
                "start_layer": self.start_layer, "device": str(self.device), "writer": self.writer.name}

    # -- getters (SGLang contract) --------------------------------------------------------
    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        buf = self.kv_buffer[layer_index(layer_id, None, self.start_layer, self.layer_num)]
        return buf.view(self.dtype) if self.store_dtype != self.dtype else buf

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.get_key_buffer(layer_id)[..., : self.kv_lora_rank]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    # -- the writes -----------------------------------------------------------------------
    def write_layer(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_scale: Any = None, v_scale: Any = None) -> None:
        """SGLang's DeepSeek write (``Layout.write``): ``k`` is the latent row's nope part, ``v``
        its rope part."""
        if k_scale is not None or v_scale is not None:
            raise ValueError("the MLA pool takes no k_scale/v_scale (SGLang's MLA cache casts without scaling)")
        self.set_mla_kv_buffer(layer, loc, k, v)

    def set_kv_buffer(self, layer: Any, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: Any = None,
                      k_scale: Any = None, v_scale: Any = None, layer_id_override: int | None = None) -> None:
        """Write whole latent rows ``cache_k`` (``[tokens, 1, D]`` or ``[tokens, D]``) at ``loc``."""
        idx = layer_index(layer, layer_id_override, self.start_layer, self.layer_num)
        if k_scale is not None or v_scale is not None:
            raise ValueError("the MLA pool takes no k_scale/v_scale (SGLang's MLA cache casts without scaling)")
        loc = self._check_loc(loc)
        row = check_rows(cache_k, "cache_k", loc.shape[0], 1, self.kv_cache_dim, self.device)
        check_apart((self.kv_buffer[idx],), loc=loc, cache_k=row)
        r = self.kv_lora_rank
        path = self._write_checked(self.kv_buffer[idx], loc, row[..., :r], row[..., r:], self.dtype, NO_SKIP)
        self.path_counts[path] += 1

    def set_mla_kv_buffer(self, layer: Any, loc: torch.Tensor, cache_k_nope: torch.Tensor,
                          cache_k_rope: torch.Tensor, layer_id_override: int | None = None) -> None:
        """Write ``cache_k_nope`` and ``cache_k_rope`` side by side into the rows at ``loc``
        (slot 0 skipped, as SGLang does)."""
        idx = layer_index(layer, layer_id_override, self.start_layer, self.layer_num)
        if not self.check_slots and signature.ready(loc):
            # the writer's contract checks what the pool's checks do once nope is kv_lora_rank
            # wide (the buffer is the pool's), kept per call key (checked_call); the pool's checks
            # run only to word a refusal
            try:
                args = self.writer.checked_call(self.kv_buffer[idx], loc, cache_k_nope, cache_k_rope, self.dtype,
                                                RESERVED_SKIP_SLOT)
            except ValueError:
                self._checked(idx, loc, cache_k_nope, cache_k_rope)
                raise
            if args[2].shape[-1] == self.kv_lora_rank:
                self.path_counts[checked_impl(self.writer)(*args)] += 1
                return
        self.path_counts[self._write_checked(*self._checked(idx, loc, cache_k_nope, cache_k_rope))] += 1

    def _write_checked(self, *args: Any) -> str:
        """The writer's own write of a call the pool's checks passed; with ``check_slots`` off, on a
        CPU the slots are read first as the writer's checks read them (``check_values``)."""
        if not self.check_slots:
            self.writer.check_values(*args)
        return checked_impl(self.writer)(*args)

    def _checked(self, idx: int, loc: Any, cache_k_nope: Any, cache_k_rope: Any) -> tuple[Any, ...]:
        """The pool's checks, in SGLang's terms; the writer's arguments."""
        loc = self._check_loc(loc)
        tokens = loc.shape[0]
        nope = check_rows(cache_k_nope, "cache_k_nope", tokens, 1, self.kv_lora_rank, self.device)
        rope = check_rows(cache_k_rope, "cache_k_rope", tokens, 1, self.qk_rope_head_dim, self.device)
        if nope.dtype != rope.dtype:
            raise ValueError(f"cache_k_nope is {nope.dtype} but cache_k_rope is {rope.dtype}")
        check_apart((self.kv_buffer[idx],), loc=loc, cache_k_nope=nope, cache_k_rope=rope)
        return self.kv_buffer[idx], loc, nope, rope, self.dtype, RESERVED_SKIP_SLOT

    def _check_loc(self, loc: Any) -> torch.Tensor:
        loc = check_loc(loc, self.device)
        if self.check_slots and loc.shape[0] and not capturing(loc):
            lo, hi = slot_range(loc)
            if lo < 0:
                raise ValueError(f"loc has a negative slot ({lo})")
            if hi >= self.rows:
                raise ValueError(f"loc has slot {hi}, past the last slot {self.rows - 1}")
        return loc
