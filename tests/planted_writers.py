"""Writers with one planted bug each, for ``kvprof verify`` to catch (tests/test_verify.py).

Each is a ``module:function`` factory, as ``verify --variants planted_writers:NAME`` takes it
(tests/ on the path). Every plant starts from the layout's reference and breaks one thing:
the row (off by one, a neighbour's row written too, the slots read as a run from the
first one, the slots' storage read as if contiguous), one byte, or a whole buffer (V skipped).
``torch_rope`` is a correct rope writer in plain torch, so a rope plant has a fast, right twin.
"""

from __future__ import annotations

import torch

from kvprof.kvcache.contracts import KVWriter, MLAWriter, PagedWriter, RopeKVWriter, convert_pair
from kvprof.kvcache.dtypes import convert_for_cache, convert_like_vllm
from kvprof.kvcache.writers.rope_reference import rope_reference


class _Store(KVWriter):
    """index_put's write with ``_rows(loc, rows)`` choosing the rows, then ``_after``."""

    description = "a planted bug"

    def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):  # type: ignore[override]
        k, v = convert_pair(cache_k.reshape(cache_k.shape[0], *k_buf.shape[1:]),
                            cache_v.reshape(cache_v.shape[0], *v_buf.shape[1:]), dtype, k_scale, v_scale)
        rows = self._rows(loc, k_buf.shape[0])
        k_buf[rows] = k
        if self.writes_v:
            v_buf[rows] = v
        self._after(k_buf, v_buf, loc, k, v)
        return "planted"

    writes_v = True

    def _rows(self, loc: torch.Tensor, rows: int) -> torch.Tensor:
        return loc

    def _after(self, k_buf, v_buf, loc, k, v) -> None:
        pass


class OffByOne(_Store):
    name = "off_by_one"

    def _rows(self, loc, rows):
        return (loc.long() + 1) % rows


class OneWrongByte(_Store):
    name = "one_wrong_byte"

    def _after(self, k_buf, v_buf, loc, k, v):
        row = int(loc[0]) if loc.numel() else 0
        k_buf[row].view(torch.uint8).view(-1)[0] ^= 0x10


class ContiguousLoc(_Store):
    """The strided-loc bug: the slots taken as a run from the first one (rows 1, 2, 3 for 1, 5, 9)."""

    name = "contiguous_loc"

    def _rows(self, loc, rows):
        if not loc.numel():
            return loc
        return (loc[0].long() + torch.arange(loc.numel(), device=loc.device)) % rows


class StridedStorage(_Store):
    """The strided-loc bug as a kernel makes it: loc's memory read as if it were contiguous.
    It says it checks its own inputs, so the pool hands it ``loc`` as the caller passed it."""

    name = "strided_storage"
    validates_inputs = True

    def _rows(self, loc, rows):
        return torch.as_strided(loc, (loc.numel(),), (1,), loc.storage_offset()).long() % rows


class NeighbourSlot(_Store):
    name = "neighbour_slot"

    def _after(self, k_buf, v_buf, loc, k, v):
        k_buf[(loc.long() + 1) % k_buf.shape[0]] = k


class SkipsV(_Store):
    name = "skips_v"
    writes_v = False


class RefusesAfterWriting(_Store):
    name = "refuses_after_writing"

    def _after(self, k_buf, v_buf, loc, k, v):
        raise ValueError("too late: the rows are written")


class FirstTokenWins(_Store):
    """Right, though not the reference's order: tokens written last to first, so where several
    write one slot the first one's row stays (engines guarantee no order)."""

    name = "first_token_wins"

    def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):  # type: ignore[override]
        k, v = convert_pair(cache_k.reshape(cache_k.shape[0], *k_buf.shape[1:]),
                            cache_v.reshape(cache_v.shape[0], *v_buf.shape[1:]), dtype, k_scale, v_scale)
        for i in reversed(range(loc.shape[0])):
            k_buf[int(loc[i])] = k[i]
            v_buf[int(loc[i])] = v[i]
        return "planted"


class SkipsDummySlot(_Store):
    """Right: as SGLang's store_cache, tokens padded to the dummy slot 0 are not written."""

    name = "skips_dummy_slot"

    def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):  # type: ignore[override]
        keep = loc != 0
        return super().write(k_buf, v_buf, loc[keep], cache_k[keep], cache_v[keep], dtype, k_scale, v_scale)


class ScalesInPlace(_Store):
    """Writes the right rows, then changes the caller's K rows in place (as SGLang's ``div_``
    would): the cache is right, the input is not the caller's any more."""

    name = "scales_in_place"

    def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):  # type: ignore[override]
        path = super().write(k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale, v_scale)
        if cache_k.numel():
            cache_k.zero_()
        return path


class DeclaresButZeroes(ScalesInPlace):
    """Says it changes its rows (``modifies_inputs``, as SGLang's generic write, which divides
    them by the scale in place) but zeroes K instead: a change other than the declared one."""

    name = "declares_but_zeroes"
    modifies_inputs = True


class RefusesCleanly(KVWriter):
    name = "refuses_cleanly"

    def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):  # type: ignore[override]
        raise ValueError("this writer takes no call")


class PagedContiguousLoc(PagedWriter):
    """vLLM's layout with the slots taken as a run from the first one."""

    name = "paged_contiguous_loc"

    def write(self, k_cache, v_cache, slots, key, value, dtype, k_scale, v_scale):  # type: ignore[override]
        n = slots.shape[0]
        if not n:
            return "planted"
        run = slots[0].clamp(min=0) + torch.arange(n, device=slots.device)
        keep = slots >= 0
        h, d = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, h, d)[run[keep] % (k_cache.shape[0] * k_cache.shape[1])] = \
            convert_like_vllm(key[:n], dtype, k_scale)[keep]
        v_cache.view(-1, h, d)[run[keep] % (v_cache.shape[0] * v_cache.shape[1])] = \
            convert_like_vllm(value[:n], dtype, v_scale)[keep]
        return "planted"


class MLAWritesSkipped(MLAWriter):
    """SGLang's MLA write without its skip: the dummy slot 0 is written too."""

    name = "mla_writes_skipped"

    def write(self, kv_buf, loc, nope, rope, dtype, skip):  # type: ignore[override]
        row = torch.cat([nope, rope], dim=-1).to(dtype)
        kv_buf[loc] = row.view(kv_buf.dtype) if kv_buf.dtype != dtype else row
        return "planted"


class TorchRope(RopeKVWriter):
    """A right rope writer in plain torch: rotate q and k in place (fp32, rounded once), store."""

    name = "torch_rope"
    stale_k = False  # the plant: store k as it came, before the rotation

    def write(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,  # type: ignore[override]
              k_scale=None, v_scale=None):
        before = k.clone()
        rq, rk = rope_reference(q, k, cos_sin_cache, positions, is_neox)
        q.copy_(rq.to(q.dtype))
        k.copy_(rk.to(k.dtype))
        k_buf[loc] = convert_for_cache(before if self.stale_k else k, dtype, k_scale)
        v_buf[loc] = convert_for_cache(v, dtype, v_scale)
        return "rope_fused"


class StaleKRope(TorchRope):
    name = "stale_k_rope"
    stale_k = True


class FusedMultiplyAddRope(TorchRope):
    """A right rope writer whose arithmetic rounds once per output, as a compiler's fused
    multiply-adds do (float64 inside): where the two products cancel it is many fp32 units
    from the fp32 reference, within the error a fused multiply-add may make."""

    name = "fma_rope"

    def write(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,  # type: ignore[override]
              k_scale=None, v_scale=None):
        rq, rk = _rotate64(q, cos_sin_cache, positions, is_neox), _rotate64(k, cos_sin_cache, positions, is_neox)
        q.copy_(rq.to(q.dtype))
        k.copy_(rk.to(k.dtype))
        k_buf[loc] = convert_for_cache(k, dtype, k_scale)
        v_buf[loc] = convert_for_cache(v, dtype, v_scale)
        return "rope_fused"


class SloppyRope(TorchRope):
    """A wrong rope writer: each rotated value 2^-12 too large, far past a rounding's error in
    float32 (in bf16 mostly within one unit: caught where q and k are fp32)."""

    name = "sloppy_rope"

    def write(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,  # type: ignore[override]
              k_scale=None, v_scale=None):
        rq, rk = rope_reference(q, k, cos_sin_cache, positions, is_neox)
        q.copy_((rq * (1 + 2.0**-12)).to(q.dtype))
        k.copy_((rk * (1 + 2.0**-12)).to(k.dtype))
        k_buf[loc] = convert_for_cache(k, dtype, k_scale)
        v_buf[loc] = convert_for_cache(v, dtype, v_scale)
        return "rope_fused"


def _rotate64(x, cos_sin_cache, positions, is_neox):
    half = cos_sin_cache.shape[-1] // 2
    table = cos_sin_cache.double()[positions.long()]
    cos, sin = table[:, None, :half], table[:, None, half:]
    out = x.double().clone()
    if is_neox:
        a, b = out[..., :half].clone(), out[..., half:2 * half].clone()
        out[..., :half], out[..., half:2 * half] = a * cos - b * sin, a * sin + b * cos
    else:
        a, b = out[..., 0:2 * half:2].clone(), out[..., 1:2 * half:2].clone()
        out[..., 0:2 * half:2], out[..., 1:2 * half:2] = a * cos - b * sin, a * sin + b * cos
    return out


def off_by_one() -> KVWriter:
    return OffByOne()


def one_wrong_byte() -> KVWriter:
    return OneWrongByte()


def contiguous_loc() -> KVWriter:
    return ContiguousLoc()


def strided_storage() -> KVWriter:
    return StridedStorage()


def neighbour_slot() -> KVWriter:
    return NeighbourSlot()


def skips_v() -> KVWriter:
    return SkipsV()


def refuses_after_writing() -> KVWriter:
    return RefusesAfterWriting()


def first_token_wins() -> KVWriter:
    return FirstTokenWins()


def skips_dummy_slot() -> KVWriter:
    return SkipsDummySlot()


def scales_in_place() -> KVWriter:
    return ScalesInPlace()


def declares_but_zeroes() -> KVWriter:
    return DeclaresButZeroes()


def refuses_cleanly() -> KVWriter:
    return RefusesCleanly()


def paged_contiguous_loc() -> PagedWriter:
    return PagedContiguousLoc()


def mla_writes_skipped() -> MLAWriter:
    return MLAWritesSkipped()


def torch_rope() -> RopeKVWriter:
    return TorchRope()


def stale_k_rope() -> RopeKVWriter:
    return StaleKRope()


def fma_rope() -> RopeKVWriter:
    return FusedMultiplyAddRope()


def sloppy_rope() -> RopeKVWriter:
    return SloppyRope()
