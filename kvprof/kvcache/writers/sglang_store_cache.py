"""SGLang's current KV write kernel, ``store_cache``, called from an installed SGLang.

SGLang's ``MHATokenToKVPool`` writes through ``sglang.kernels.ops.kvcache.kvcache.store_cache``
(a CUDA kernel compiled at first use through apache-tvm-ffi, with programmatic dependent
launch, a device assert on slots outside ``size_limit`` and writes to the reserved slot 0
skipped) wherever ``can_use_store_cache`` accepts the row widths; otherwise two
``index_put``. This writer makes the same call with the same arguments as SGLang's
``_set_kv_buffer_impl``, and SGLang's conversion before it (``div`` by the scale, then
``.to``: two kernels per tensor), so it is measured as SGLang runs it. Rows the kernel
does not take fall back to two ``index_put``, reported as ``fallback: <why>``.
"""

from __future__ import annotations

from typing import Any

import torch

from kvprof.kvcache.contracts import FALLBACK_PREFIX, FUSED, KVWriter
from kvprof.kvcache.writers.sgl_kernel import sglang_convert


def find_store_cache() -> tuple[Any, Any, str]:
    """(store_cache, can_use_store_cache, "") from SGLang, or (None, None, why not)."""
    if not torch.cuda.is_available():
        return None, None, "SGLang's store_cache is a CUDA kernel (no CUDA device here)"
    try:
        from sglang.kernels.ops.kvcache.kvcache import can_use_store_cache, store_cache
    except Exception as exc:  # noqa: BLE001 - ImportError, or SGLang's own import-time failures
        text = str(exc).strip().splitlines()
        first = text[0][:160] if text else ""
        return None, None, f"SGLang's store_cache is not importable ({type(exc).__name__}: {first})"
    return store_cache, can_use_store_cache, ""


class SglangStoreCacheWriter(KVWriter):
    name = "sglang_store_cache"
    description = "SGLang's store_cache JIT kernel (one launch), as SGLang's MHA pool calls it"
    fused = True
    devices = ("cuda",)

    def __init__(self) -> None:
        self._op, self._can_use, self._missing = find_store_cache()
        self._ok: dict[tuple[int, int], bool] = {}

    def unsupported_reason(self, device, dtype, input_dtype=None):  # type: ignore[override]
        if self._op is None:
            return self._missing
        return super().unsupported_reason(device, dtype, input_dtype)

    def prepare(self, device: torch.device) -> None:
        """Nothing per device: the kernel compiles per row width, at the first write of it
        (outside any graph capture: capture's warm-up writes run eagerly first)."""

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
        if cache_k.dtype != k_buf.dtype or cache_v.dtype != v_buf.dtype:
            cache_k, cache_v = sglang_convert(cache_k, dtype, k_scale), sglang_convert(cache_v, dtype, v_scale)
        rows, tokens = k_buf.shape[0], loc.shape[0]
        row_dim, v_row_dim = k_buf[0].numel(), v_buf[0].numel()
        row_bytes, v_row_bytes = row_dim * k_buf.element_size(), v_row_dim * v_buf.element_size()
        key = (row_bytes, v_row_bytes)
        ok = self._ok.get(key)
        if ok is None:
            ok = self._ok[key] = bool(self._op is not None and self._can_use(row_bytes, v_row_bytes))
        if ok:
            # SGLang's _set_kv_buffer_impl: rows viewed 2-D, the buffer's row count as size_limit
            self._op(cache_k.reshape(tokens, row_dim), cache_v.reshape(tokens, v_row_dim),
                     k_buf.view(rows, row_dim), v_buf.view(rows, v_row_dim), loc,
                     row_bytes=row_bytes, v_row_bytes=v_row_bytes, size_limit=rows)
            return FUSED
        k_buf[loc] = cache_k
        v_buf[loc] = cache_v
        reason = self._missing or f"store_cache cannot serve rows of {row_bytes}/{v_row_bytes} bytes"
        return f"{FALLBACK_PREFIX} {reason}"
