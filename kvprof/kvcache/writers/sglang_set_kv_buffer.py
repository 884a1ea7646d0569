"""SGLang's generic MHA write, ``MHATokenToKVPool.set_kv_buffer``, as SGLang runs it.

For a cache whose dtype differs from the incoming rows (an fp8 cache fed bf16 K and V) SGLang
runs, before its one-launch ``store_cache``, ``cache_k.div_(k_scale)`` and
``cache_v.div_(v_scale)`` **in place on the caller's tensors**, then ``.to(fp8)`` on each (two
more kernels) and ``.view(uint8)`` (no kernel): up to four launches a layer that a quantising
fused writer does not make.

- ``sglang_set_kv_buffer`` calls SGLang's own method (an installed SGLang's
  ``MHATokenToKVPool.set_kv_buffer``, on one SGLang pool object per cache dtype and row shape
  whose buffer is pointed at the caller's), so the conversion, the store it picks
  (``store_cache`` where its row widths are served, else SGLang's fallback) and any change
  SGLang makes to them are SGLang's.
- ``set_kv_buffer_torch`` is the same four operations written in torch, for where SGLang does
  not import: ``div_`` in place, ``.to``, ``.view``, then SGLang's own store for rows
  ``store_cache`` does not take, two ``index_put`` (no JIT kernel without SGLang).

Both modify the caller's K and V (``modifies_inputs``): in an engine, and in kvprof's
``--context layer``, K and V are views of the QKV projection's output computed again each
step, so this costs nothing there; bench gives such a writer its own copies of the rows.
"""

from __future__ import annotations

from typing import Any

import torch

from kvprof.core.vocab import CONVERT_THEN_STORE
from kvprof.kvcache.contracts import FALLBACK_PREFIX, FUSED, TWO_COPIES, KVWriter
from kvprof.kvcache.dtypes import store_dtype_for

# what SGLang's set_kv_buffer reads of a layer: its id
_LAYER0 = type("SglangLayer", (), {"layer_id": 0})()


def find_sglang_pool() -> tuple[Any, str]:
    """(SGLang's MHATokenToKVPool class, "") or (None, why not)."""
    try:
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    except Exception as exc:  # noqa: BLE001 - ImportError, or SGLang's own import-time failures
        text = str(exc).strip().splitlines()
        first = text[0][:160] if text else ""
        return None, f"SGLang's MHATokenToKVPool is not importable ({type(exc).__name__}: {first})"
    return MHATokenToKVPool, ""


def _overlaps(x: torch.Tensor) -> bool:
    """Whether elements of ``x`` share memory (an expanded tensor), which torch's in-place
    ``div_`` refuses to write: torch's own test (1 = overlap; 2 = too hard to tell, which
    ``div_`` lets through)."""
    return int(torch._debug_has_internal_overlap(x)) == 1


def _writable(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a copy where ``div_`` cannot write it in place (elements sharing memory: SGLang
    would raise there; the write then divides the copy and leaves the caller's rows as they were)."""
    return x.contiguous() if _overlaps(x) else x


class SetKVBufferTorchWriter(KVWriter):
    """SGLang's ``set_kv_buffer`` conversion as torch ops, then two ``index_put``."""

    name = "set_kv_buffer_torch"
    description = ("SGLang's set_kv_buffer as torch ops: div_ in place, .to, .view, then two index_put "
                   "(SGLang's store where store_cache does not serve)")
    fused = False
    devices = ("cpu", "cuda")
    modifies_inputs = True

    def launches_pdl(self, device: torch.device) -> bool:
        """torch's own kernels, launched without programmatic dependent launch."""
        return False

    def write(
        self,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        dtype: torch.dtype,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> str:
        converts = cache_k.dtype != dtype  # SGLang's test: the rows' dtype against the cache's
        if converts:
            cache_k, cache_v = _writable(cache_k), _writable(cache_v)
            if k_scale is not None:
                cache_k.div_(k_scale)
            if v_scale is not None:
                cache_v.div_(v_scale)
            cache_k = cache_k.to(dtype)
            cache_v = cache_v.to(dtype)
        store = store_dtype_for(dtype)
        if store != dtype:
            cache_k = cache_k.view(store)
            cache_v = cache_v.view(store)
        k_buf[loc] = cache_k
        v_buf[loc] = cache_v
        return CONVERT_THEN_STORE if converts else TWO_COPIES


class SglangSetKVBufferWriter(KVWriter):
    """SGLang's ``MHATokenToKVPool.set_kv_buffer`` itself, over the caller's buffers."""

    name = "sglang_set_kv_buffer"
    description = ("SGLang's MHATokenToKVPool.set_kv_buffer (its own code): for an fp8 cache div_ in place, "
                   ".to, .view, then store_cache")
    fused = False  # up to five launches for an fp8 cache; one (store_cache) for a cache of the rows' dtype
    devices = ("cpu", "cuda")
    modifies_inputs = True

    def __init__(self) -> None:
        self._cls, self._missing = find_sglang_pool()
        self._pools: dict[tuple[torch.dtype, int, int, int, torch.device], Any] = {}

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if self._cls is None:
            return self._missing
        return super().unsupported_reason(device, dtype, input_dtype)

    def launches_pdl(self, device: torch.device) -> bool | None:
        """Off CUDA, SGLang's own copies: no PDL. On CUDA SGLang's store_cache decides (its JIT
        kernel launches with PDL where the card has it; the conversion's torch kernels without)."""
        return None if device.type == "cuda" else False

    def _pool(self, k_buf: torch.Tensor, v_buf: torch.Tensor, dtype: torch.dtype) -> Any:
        heads, dim, v_dim = k_buf.shape[1], k_buf.shape[2], v_buf.shape[2]
        key = (dtype, heads, dim, v_dim, k_buf.device)
        pool = self._pools.get(key)
        if pool is None:
            # two slots of SGLang's own allocation; its buffers are then the caller's
            kw: dict[str, Any] = {"v_head_dim": v_dim} if v_dim != dim else {}
            pool = self._cls(size=1, page_size=1, dtype=dtype, head_num=heads, head_dim=dim, layer_num=1,
                             device=str(k_buf.device), enable_memory_saver=False, **kw)
            self._pools[key] = pool
        # size + page_size is the row count SGLang bounds the slots by (store_cache's size_limit)
        pool.k_buffer, pool.v_buffer, pool.size = [k_buf], [v_buf], k_buf.shape[0] - pool.page_size
        return pool

    def write(
        self,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        dtype: torch.dtype,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> str:
        pool = self._pool(k_buf, v_buf, dtype)
        if pool.store_dtype != k_buf.dtype:
            return f"{FALLBACK_PREFIX} SGLang stores a {dtype} cache as {pool.store_dtype}, the buffer is {k_buf.dtype}"
        converts = cache_k.dtype != dtype
        if converts:
            cache_k, cache_v = _writable(cache_k), _writable(cache_v)
        pool.set_kv_buffer(_LAYER0, loc, cache_k, cache_v, k_scale, v_scale)
        if converts:
            return CONVERT_THEN_STORE
        return FUSED if k_buf.is_cuda else TWO_COPIES  # store_cache on CUDA; SGLang's own copies elsewhere
