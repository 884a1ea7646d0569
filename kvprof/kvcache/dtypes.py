"""Cache dtypes, their storage views, and the one reference conversion every writer must match.

SGLang stores fp8 caches as uint8 views (index_put had no fp8 kernels), and when the
incoming K/V have another dtype it divides them by k_scale/v_scale in their own dtype
and casts. On CUDA, ``x.div_(python_float)`` multiplies by the fp32 reciprocal; that
is the rounding we define here, on every device, so that a fused kernel can reproduce
it bit for bit: ``(x.float() * fp32(1/scale)).to(x.dtype).to(cache_dtype)``.
"""

from __future__ import annotations

import numpy as np
import torch

from kvprof.core.errors import UsageError

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8": torch.float8_e4m3fn,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "float8_e5m2": torch.float8_e5m2,
}

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """Accept 'bf16', 'fp8_e4m3', 'torch.bfloat16' or a dtype."""
    if isinstance(name, torch.dtype):
        return name
    key = name.strip().lower().removeprefix("torch.")
    if key not in DTYPES:
        raise UsageError(f"unknown dtype {name!r}; choose one of {', '.join(sorted(set(DTYPES)))}")
    return DTYPES[key]


def short_name(dtype: torch.dtype) -> str:
    return {
        torch.float32: "fp32",
        torch.bfloat16: "bf16",
        torch.float16: "fp16",
        torch.float8_e4m3fn: "fp8_e4m3",
        torch.float8_e5m2: "fp8_e5m2",
        torch.uint8: "uint8",
    }.get(dtype, str(dtype).removeprefix("torch."))


def store_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """fp8 caches live in uint8 buffers, as in SGLang."""
    return torch.uint8 if dtype in FP8_DTYPES else dtype


def inverse_scale(scale: float | torch.Tensor | None) -> float:
    """fp32(1) / fp32(scale), the factor CUDA's scalar division multiplies by."""
    if scale is None:
        return 1.0
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1:
            raise ValueError(f"a K/V scale must be a single number, got a tensor of shape {tuple(scale.shape)}")
        scale = float(scale.reshape(()).item())
    s = np.float32(scale)
    if not np.isfinite(s) or s == 0:
        raise ValueError(f"a K/V scale must be finite and non-zero, got {scale!r}")
    return float(np.float32(1.0) / s)


def convert_for_cache(
    x: torch.Tensor, dtype: torch.dtype, scale: float | torch.Tensor | None
) -> torch.Tensor:
    """The reference conversion of incoming K or V rows into the cache's storage dtype.

    Never mutates ``x`` (SGLang's ``div_`` does; a profiler must not change its inputs).
    """
    if x.dtype != dtype:
        if scale is not None:
            x = (x.float() * inverse_scale(scale)).to(x.dtype)
        x = x.to(dtype)
    store = store_dtype_for(dtype)
    return x.view(store) if store != dtype else x


def cast_like_sglang(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """SGLang's MLA cast: ``.to(dtype)`` (no scale), then the storage view (uint8 for fp8)."""
    if x.dtype != dtype:
        x = x.to(dtype)
    store = store_dtype_for(dtype)
    return x.view(store) if store != dtype else x



# fp8's largest finite values (vLLM saturates to them)
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def convert_like_vllm(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """The reference conversion into the cache's storage dtype: as is for a non-fp8 cache,
    else ``fp8(clamp(float(x) / scale, -max, max))`` with an IEEE fp32 division (a 1-element
    tensor divisor on the same device: a CPU scalar would make CUDA multiply by its reciprocal)."""
    if dtype not in FP8_DTYPES:
        return x
    y = x.float()
    if scale is not None:
        y = y / scale.to(device=y.device, dtype=torch.float32).reshape(1)
    m = FP8_MAX[dtype]
    return y.clamp(-m, m).to(dtype).view(torch.uint8)

