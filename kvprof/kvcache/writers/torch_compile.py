"""Two index_put copies (and the dtype conversion) under ``torch.compile``.

A peer SGLang itself measured against: Inductor may fuse the conversion and both
scatters into fewer kernels, so the path is reported as ``compiled`` and the trace's
kernel count says what it became.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from kvprof.kvcache.contracts import KVWriter
from kvprof.kvcache.dtypes import inverse_scale

COMPILED = "compiled"


def _store(k_buf, v_buf, loc, cache_k, cache_v):  # noqa: ANN001
    k_buf[loc] = cache_k
    v_buf[loc] = cache_v


def _store_converted(k_buf, v_buf, loc, cache_k, cache_v, k_inv, v_inv, dtype, store_dtype):  # noqa: ANN001
    k = (cache_k.float() * k_inv).to(cache_k.dtype).to(dtype).view(store_dtype)
    v = (cache_v.float() * v_inv).to(cache_v.dtype).to(dtype).view(store_dtype)
    k_buf[loc] = k
    v_buf[loc] = v


class TorchCompileWriter(KVWriter):
    name = "torch_compile"
    description = "two index_put copies compiled by torch.compile (Inductor)"
    fused = False
    devices = ("cpu", "cuda")

    def __init__(self, mode: str | None = None) -> None:
        # compiled at the first write, not here: torch.compile imports Dynamo (seconds on a small
        # CPU), which listing the variants (``kvprof variants``) or checking support never needs
        self._mode = mode
        self._compiled: dict[tuple[Any, ...], Callable[..., None]] = {}

    def _run(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn`` compiled for calls like ``args``: one compiled function per combination of
        the tensors' dtypes, ranks and contiguity and the other arguments' dtypes, each over a code
        object of its own. torch.compile keeps its cache, and counts recompiles against its limit
        (8), per code object: one function for every combination a process writes would pass the
        limit and raise (it did, under the property tests' random dtypes). Where one combination
        still reaches it (other guards: sizes of 1, devices, strides), the combination gets a fresh
        function; with ``fullgraph`` the limit raises before anything runs."""
        key = (fn.__name__, *((a.dtype, a.dim(), a.is_contiguous()) if isinstance(a, torch.Tensor) else
                              (a if isinstance(a, torch.dtype) else type(a)) for a in args))
        compiled = self._compiled.get(key) or self._compile(fn, key)
        try:
            compiled(*args)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            self._compile(fn, key)(*args)

    def _compile(self, fn: Callable[..., None], key: tuple[Any, ...]) -> Callable[..., None]:
        own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        compiled = self._compiled[key] = torch.compile(own, mode=self._mode, fullgraph=True, dynamic=True)
        return compiled

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
        if cache_k.dtype == dtype:  # the pool guarantees cache_v has cache_k's dtype
            self._run(_store, k_buf, v_buf, loc, cache_k.view(k_buf.dtype), cache_v.view(v_buf.dtype))
        else:
            k_inv = inverse_scale(k_scale)
            v_inv = inverse_scale(v_scale)
            self._run(_store_converted, k_buf, v_buf, loc, cache_k, cache_v, k_inv, v_inv, dtype, k_buf.dtype)
        return COMPILED
