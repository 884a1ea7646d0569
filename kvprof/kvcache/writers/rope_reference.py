"""The rotary embedding every rope writer is checked against, in float32.

``out_x = x * cos - y * sin`` and ``out_y = x * sin + y * cos`` for each rotated pair
``(x, y)``: the first and second half of the first ``rope_dim`` dims (GPT-NeoX,
``is_neox=True``) or dims ``2i`` and ``2i + 1`` (GPT-J), with ``cos``/``sin`` the halves of
``cos_sin_cache[position]``; dims at and past ``rope_dim`` pass through. Engines compute the
same formula in fp32 and round once to the input dtype; a compiler may contract it into
fused multiply-adds, so their output is this reference rounded to the output dtype up to
one unit in its last place (the tests state their tolerance with that reason).
"""

from __future__ import annotations

import torch


def rope_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    is_neox: bool,
    rope_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotated ``q`` and ``k`` (``[T, H, D]``) in float32; the inputs are not modified.
    ``rope_dim``: the rotated dims, ``cos_sin_cache.shape[-1]`` when None."""
    width = cos_sin_cache.shape[-1]
    rope_dim = width if rope_dim is None else rope_dim
    if rope_dim != width or rope_dim % 2 or rope_dim > q.shape[-1] or rope_dim > k.shape[-1]:
        raise ValueError(f"rope_dim {rope_dim} must be even, equal cos_sin_cache's width {width} and fit "
                         f"head_dim {q.shape[-1]}")
    half = rope_dim // 2
    table = cos_sin_cache.float()[positions.long()]  # [T, rope_dim]
    cos = table[:, None, :half]
    sin = table[:, None, half:]
    return _rotate(q.float(), cos, sin, is_neox, rope_dim), _rotate(k.float(), cos, sin, is_neox, rope_dim)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool, rope_dim: int) -> torch.Tensor:
    out = x.clone()
    half = rope_dim // 2
    if is_neox:
        a, b = x[..., :half], x[..., half:rope_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:rope_dim] = a * sin + b * cos
    else:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = a * cos - b * sin
        out[..., 1:rope_dim:2] = a * sin + b * cos
    return out


def cos_sin_table(max_position: int, rope_dim: int, base: float = 10000.0) -> torch.Tensor:
    """A ``[max_position, rope_dim]`` float32 cache as engines build it (cos half, sin half),
    for tests and benchmarks."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
    freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).contiguous()


__all__ = ["cos_sin_table", "rope_reference"]
