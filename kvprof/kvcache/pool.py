"""A KV pool with the layout and write contract of SGLang's ``MHATokenToKVPool``.

Per layer one K buffer ``[size + page_size, head_num, head_dim]`` and one V buffer
``[size + page_size, head_num, v_head_dim]``; slot 0 is the dummy that padded tokens
write to; fp8 caches are stored as uint8 and read back through ``dtype`` views. The
write itself is delegated to a ``KVWriter`` chosen by name, so every implementation is
measured behind the same contract. Inputs are validated before any kernel runs
(``kvprof.kvcache.validation``): a bad call raises ``ValueError`` naming the problem and never
writes out of bounds.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

import torch

from kvprof.kvcache import signature
from kvprof.kvcache.contracts import KVWriter, RopeKVWriter, checked_impl
from kvprof.kvcache.dtypes import short_name, store_dtype_for
from kvprof.kvcache.guards import check_memory, memory_limit, pool_bytes
from kvprof.kvcache.validation import FLOAT_INPUTS, check_write_inputs


class KVPool:
    """SGLang-compatible MHA token-to-KV pool with a pluggable writer.

    ``check_slots`` validates slot values on every write (one device sync on CUDA; skipped
    while a CUDA graph is being captured, where a sync is illegal). Workloads that build
    their slots on the host check them once there and turn it off for the hot path.
    With it off, on a CPU the writer's contract still refuses a slot outside ``[0, rows)``
    (reading the slots costs no sync there); on CUDA slots in ``[0, rows)`` are the caller's
    promise: a slot outside is never written outside the buffers, but writers differ in what
    they do with it: ``index_put`` and ``two_stream`` hit torch's device-side assert for a
    slot >= rows and, like Python indexing, write a negative slot to row ``rows + slot``; the
    Triton and CUDA fused writers skip the row (their kernels mask ``0 <= slot < rows``).

    Every other input is checked before any kernel runs (:func:`check_write_inputs`), so a
    refused call writes nothing: a strided ``loc`` is copied contiguous, and an input that
    shares memory with the layer's buffers is refused. The checks run in Python here, or, for
    a writer that checks the same things itself in compiled code (``validates_inputs``, e.g.
    ``cuda_fused``), there, with the Python checks run only when the writer refuses a call, to
    give the same one-line error. The writer is fixed at construction.
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str | torch.device = "cpu",
        *,
        writer: KVWriter | RopeKVWriter,
        v_head_dim: int | None = None,
        start_layer: int = 0,
        check_slots: bool = True,
    ) -> None:
        for name, value in (("size", size), ("page_size", page_size), ("head_num", head_num),
                            ("head_dim", head_dim), ("layer_num", layer_num)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if v_head_dim is not None and (not isinstance(v_head_dim, int) or v_head_dim <= 0):
            raise ValueError(f"v_head_dim must be a positive integer, got {v_head_dim!r}")
        if not isinstance(start_layer, int) or start_layer < 0:
            raise ValueError(f"start_layer must be a non-negative integer, got {start_layer!r}")
        if dtype not in FLOAT_INPUTS:
            raise ValueError(f"unsupported cache dtype {dtype}")
        # sized before allocating: a typo (size=10**12) is a one-line refusal, not an OOM kill
        need = pool_bytes(size + page_size, layer_num, head_num, head_dim, v_head_dim or head_dim,
                          torch.empty((), dtype=dtype).element_size())
        check_memory(need, memory_limit(_resolve(torch.device(device))), f"a KV pool of {layer_num} layers x "
                     f"{size + page_size:,} slots x {head_num} heads")
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.store_dtype = store_dtype_for(dtype)
        self.head_num = head_num
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim or head_dim
        self.layer_num = layer_num
        self.start_layer = start_layer
        self.end_layer = start_layer + layer_num - 1
        self.device = _resolve(torch.device(device))
        self._device_index = self.device.index if self.device.type == "cuda" else -1  # Tensor.get_device()
        # typed as the store writer of the hot path; a rope writer is used only by
        # set_kv_buffer_with_rope (and refused by set_kv_buffer)
        self.writer: KVWriter = writer  # type: ignore[assignment]
        self._writer_checks = bool(getattr(writer, "validates_inputs", False))
        # the pool runs the checks itself (or, validates_inputs, the writer's compiled code does):
        # it calls the writer's own write, not the one that checks again (ChecksItsCalls)
        self._write = checked_impl(writer)
        # a rope writer rotates q and k too: it writes through set_kv_buffer_with_rope only
        self._rope_writer = isinstance(writer, RopeKVWriter)
        self.check_slots = check_slots
        self.path_counts: Counter[str] = Counter()
        rows = size + page_size
        self.k_buffer = [
            torch.zeros((rows, head_num, head_dim), dtype=self.store_dtype, device=self.device)
            for _ in range(layer_num)
        ]
        self.v_buffer = [
            torch.zeros((rows, head_num, self.v_head_dim), dtype=self.store_dtype, device=self.device)
            for _ in range(layer_num)
        ]

    # -- sizes -------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        """Slots per layer buffer, dummy slot and last page included."""
        return self.size + self.page_size

    @property
    def k_row_bytes(self) -> int:
        return self.head_num * self.head_dim * self.k_buffer[0].element_size()

    @property
    def v_row_bytes(self) -> int:
        return self.head_num * self.v_head_dim * self.v_buffer[0].element_size()

    def bytes_per_write(self, tokens: int, input_dtype: torch.dtype | None = None) -> int:
        """Bytes a K+V write of ``tokens`` must move: inputs read once, rows written once."""
        in_elem = torch.empty((), dtype=input_dtype or self.dtype).element_size()
        elems = self.head_num * (self.head_dim + self.v_head_dim)
        return tokens * (elems * in_elem + self.k_row_bytes + self.v_row_bytes)

    def rope_bytes_per_write(self, tokens: int, q_heads: int, input_dtype: torch.dtype) -> int:
        """Bytes a rope + K/V write of ``tokens`` must move: q and k read and written back
        (rotated in place), v read, the K and V rows written."""
        in_elem = torch.empty((), dtype=input_dtype).element_size()
        rotated = (q_heads + self.head_num) * self.head_dim
        return tokens * ((2 * rotated + self.head_num * self.v_head_dim) * in_elem
                         + self.k_row_bytes + self.v_row_bytes)

    def describe(self) -> dict[str, Any]:
        return {
            "size": self.size, "page_size": self.page_size, "dtype": short_name(self.dtype),
            "store_dtype": short_name(self.store_dtype), "head_num": self.head_num,
            "head_dim": self.head_dim, "v_head_dim": self.v_head_dim, "layer_num": self.layer_num,
            "start_layer": self.start_layer, "device": str(self.device), "writer": self.writer.name,
        }

    # -- getters (SGLang contract) -------------------------------------------------------
    def _index(self, layer_id: int) -> int:
        if isinstance(layer_id, bool) or not isinstance(layer_id, int):  # True is not layer 1
            raise ValueError(f"layer {layer_id!r} is not a layer id (an int)")
        idx = layer_id - self.start_layer
        if not 0 <= idx < self.layer_num:
            raise ValueError(
                f"layer {layer_id!r} is not in this pool (layers {self.start_layer}..{self.end_layer})"
            )
        return idx

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        buf = self.k_buffer[self._index(layer_id)]
        return buf.view(self.dtype) if self.store_dtype != self.dtype else buf

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        buf = self.v_buffer[self._index(layer_id)]
        return buf.view(self.dtype) if self.store_dtype != self.dtype else buf

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    # -- the write -----------------------------------------------------------------------
    def write_layer(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    k_scale: Any = None, v_scale: Any = None) -> None:
        """One layer's write as SGLang calls it (``Layout.write``): ``set_kv_buffer``."""
        self.set_kv_buffer(layer, loc, k, v, k_scale, v_scale)

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
        """Write one layer's K and V rows at slots ``loc``.

        ``layer`` is a layer id or an object with ``layer_id`` (SGLang's RadixAttention).
        """
        if layer_id_override is not None:
            layer_id = layer_id_override
        elif type(layer) is int:
            layer_id = layer
        else:
            layer_id = getattr(layer, "layer_id", layer)
        idx = layer_id - self.start_layer if type(layer_id) is int else -1
        if not 0 <= idx < self.layer_num:
            idx = self._index(layer_id)  # raises the one-line error
        if k_scale is not None or v_scale is not None:
            _check_scale("k_scale", k_scale)
            _check_scale("v_scale", v_scale)
        store = self.writer
        if TYPE_CHECKING:  # a rope writer has no validates_inputs and is refused in _validate
            assert isinstance(store, KVWriter)
        if self._writer_checks and not self.check_slots:
            # The writer checks every input in compiled code before it launches anything
            # (KVWriter.validates_inputs); the Python checks run only to word a refusal.
            try:
                path = self._write(
                    self.k_buffer[idx], self.v_buffer[idx], loc, cache_k, cache_v, self.dtype, k_scale, v_scale
                )
            except Exception:
                self._validate(idx, loc, cache_k, cache_v)  # the pool's one-line ValueError for bad input
                raise  # the inputs were fine: the writer's own error
        elif self.check_slots or self._rope_writer or not signature.ready(loc):
            loc, cache_k, cache_v = self._validate(idx, loc, cache_k, cache_v)
            args = (self.k_buffer[idx], self.v_buffer[idx], loc, cache_k, cache_v, self.dtype, k_scale, v_scale)
            if not self.check_slots:
                store.check_values(*args)  # on a CPU, slots inside the buffers (as the writer's checks read them)
            path = self._write(*args)
        else:
            # the writer's contract checks what the pool's checks do and more, kept per call key
            # (checked_call: a repeated call is one C++ call and a lookup); the pool's checks run
            # only to word a refusal in its terms
            try:
                args = store.checked_call(self.k_buffer[idx], self.v_buffer[idx], loc, cache_k, cache_v,
                                          self.dtype, k_scale, v_scale)
            except ValueError:
                self._validate(idx, loc, cache_k, cache_v)
                raise
            path = self._write(*args)
        self.path_counts[path] += 1

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
        """Rotate ``q`` and ``k`` in place and write the rotated K and V rows at slots ``loc``:
        SGLang's rope with ``FusedSetKVBufferArg``, through a ``RopeKVWriter`` (one fused
        launch, or a rotary kernel and then a store). ``positions`` index ``cos_sin_cache``
        (``[max_position, rope_dim]`` float32, cosines then sines); ``is_neox``: NeoX halves,
        else GPT-J pairs. Every input is checked before anything is written or rotated."""
        if layer_id_override is not None:
            layer_id = layer_id_override
        elif type(layer) is int:
            layer_id = layer
        else:
            layer_id = getattr(layer, "layer_id", layer)
        idx = self._index(layer_id)
        if not self._rope_writer:
            raise ValueError(f"writer {self.writer.name} stores K and V only: write through set_kv_buffer, or "
                             "build the pool with a rope writer (rope_triton_fused, rope_then_*)")
        k_buf, v_buf = self.k_buffer[idx], self.v_buffer[idx]
        writer: RopeKVWriter = self.writer  # type: ignore[assignment]
        # the writer's own contract checks everything, its unsupported_reason included, before
        # anything is rotated; on a CPU that takes slots and positions inside their ranges too
        # (checked_call: a call of the same key as one that passed takes its result)
        args = writer.checked_call(q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, self.dtype,
                                   k_scale, v_scale)
        if self.check_slots and loc.is_cuda and loc.shape[0] and not _capturing(loc):  # one device sync
            for name, t, end in (("loc", loc, self.rows), ("positions", positions, cos_sin_cache.shape[0])):
                lo, hi = (int(x) for x in torch.aminmax(t))
                if lo < 0 or hi >= end:
                    raise ValueError(f"{name} has {'slot' if name == 'loc' else 'position'} {lo if lo < 0 else hi}, "
                                     f"outside [0, {end})")
        path = self._write(*args)
        self.path_counts[path] += 1

    def _validate(
        self, idx: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._rope_writer:
            raise ValueError(f"writer {self.writer.name} rotates q and k too: write through set_kv_buffer_with_rope")
        loc, cache_k, cache_v = check_write_inputs(loc, cache_k, cache_v, self.head_num, self.head_dim,
                                                   self.v_head_dim, self.device, self._device_index,
                                                   self.k_buffer[idx], self.v_buffer[idx])
        if self.check_slots and loc.shape[0] and not _capturing(loc):
            lo, hi = (int(x) for x in torch.aminmax(loc))
            if lo < 0:
                raise ValueError(f"loc has a negative slot ({lo})")
            if hi >= self.rows:
                raise ValueError(f"loc has slot {hi}, past the last slot {self.rows - 1}")
        return loc, cache_k, cache_v


def _check_scale(name: str, scale: Any) -> None:
    """A scale is None, a positive finite number, or a one-element floating tensor (its value
    is the caller's: reading it would sync the device)."""
    if scale is None:
        return
    if scale.__class__ is float or (isinstance(scale, (int, float)) and not isinstance(scale, bool)):
        if not (0 < scale < math.inf):
            raise ValueError(f"{name} must be positive (finite and non-zero), got {scale!r}")
        return
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or not scale.is_floating_point():
            raise ValueError(f"{name} must be a one-element floating-point tensor, got {tuple(scale.shape)} "
                             f"{scale.dtype}")
        return
    raise ValueError(f"{name} must be a positive number or a one-element tensor, got {type(scale).__name__}")


def _resolve(device: torch.device) -> torch.device:
    """'cuda' means the current CUDA device, so tensors on cuda:N compare equal."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()
