"""The rotary embedding every rope writer is checked against, in float32.

``out_x = x * cos - y * sin`` and ``out_y = x * sin + y * cos`` for each rotated pair
``(x, y)``: the first and second half of the first ``rope_dim`` dims (GPT-NeoX,
``is_neox=True``) or dims ``2i`` and ``2i + 1`` (GPT-J), with ``cos``/``sin`` the halves of
``cos_sin_cache[position]``; dims at and past ``rope_dim`` pass through. Engines compute the
same formula in fp32 and round once to the input dtype. A compiler may contract it into
fused multiply-adds, which round one product less: the output then differs from this
reference by up to one unit in the last place of the output dtype plus about one float32
epsilon of ``|x * cos| + |y * sin|`` (``rope_magnitude``), which is many units of the result
where the two products cancel (the tests state their tolerance with that reason).
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


def rope_magnitude(
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``|x * cos| + |y * sin|`` (and ``|x * sin| + |y * cos|``) per rotated element of ``q`` and
    ``k``, ``|x|`` per passed-through one, in float32: what a rounding error of the rotation
    scales with (a fused multiply-add moves the result by up to a float32 epsilon of it)."""
    half = cos_sin_cache.shape[-1] // 2
    table = cos_sin_cache.float()[positions.long()].abs()
    cos, sin = table[:, None, :half], table[:, None, half:]
    width = cos_sin_cache.shape[-1]
    return (_rotate(q.float().abs(), cos, sin, is_neox, width, magnitude=True),
            _rotate(k.float().abs(), cos, sin, is_neox, width, magnitude=True))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool, rope_dim: int,
            magnitude: bool = False) -> torch.Tensor:
    out = x.clone()
    half = rope_dim // 2
    if is_neox:
        a, b = x[..., :half], x[..., half:rope_dim]
        first, second = slice(0, half), slice(half, rope_dim)
    else:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        first, second = slice(0, rope_dim, 2), slice(1, rope_dim, 2)
    # the magnitude adds the two products' sizes where the rotation subtracts them
    out[..., first] = a * cos + b * sin if magnitude else a * cos - b * sin
    out[..., second] = a * sin + b * cos
    return out


def cos_sin_table(max_position: int, rope_dim: int, base: float = 10000.0) -> torch.Tensor:
    """A ``[max_position, rope_dim]`` float32 cache as engines build it (cos half, sin half),
    for tests and benchmarks."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim))
    freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).contiguous()


__all__ = ["cos_sin_table", "rope_magnitude", "rope_reference"]
