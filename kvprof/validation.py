"""The checks a write's inputs pass before any kernel runs, as one function.

Why a module of its own: the pool runs these on every write, except for a writer that
checks the same things itself in compiled code (``KVWriter.validates_inputs``), where they
cost nanoseconds instead of a few µs of Python on the eager launch path whose host time
kvprof reports; the pool then runs them only to word the error of a call the writer
refused. A writer whose kernel cannot check (a Triton launch inside CUDA-graph capture)
calls them itself. One function, so every path refuses the same calls with the same words.

Kernels read ``loc`` as consecutive slots, so a strided ``loc`` (a view) is copied here into a
contiguous one; and no input may share memory with a buffer it is written into (a kernel
would read rows while it overwrites them), which is refused here, before any write, so that
a refused call changes nothing.
"""

from __future__ import annotations

import torch

from kvprof.dtypes import FP8_DTYPES

FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16, *FP8_DTYPES)


def check_write_inputs(
    loc: object,  # anything: what is not a tensor is refused
    cache_k: object,
    cache_v: object,
    head_num: int,
    head_dim: int,
    v_head_dim: int,
    device: torch.device,
    device_index: int,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Raise ``ValueError`` (one line) for anything but 1-D int32/int64 slots and K/V rows of
    ``[tokens, head_num, head_dim]`` (or ``[tokens, head_num * head_dim]``) floats of one dtype,
    all on ``device`` (``device_index``: its CUDA index, -1 for any other device), none of them
    sharing memory with ``k_buf``/``v_buf`` (the buffers written, contiguous). Returns
    ``(loc, cache_k, cache_v)``: ``loc`` contiguous, the rows as ``[tokens, heads, dim]`` with
    contiguous rows, copying only where needed. Slot values are the caller's (a device sync)."""
    # Ordered and written so that the common, valid call costs about a dozen attribute
    # reads (identity tests, one shape read per tensor, integer device ids instead of
    # torch.device objects): each Python-level read is a visible part of the pool's cost per
    # write (docs/benchmarks.md, "Eager").
    if not isinstance(loc, torch.Tensor):
        raise ValueError(f"loc must be a tensor of slot indices, got {type(loc).__name__}")
    loc_dtype = loc.dtype
    if loc_dtype is not torch.int64 and loc_dtype is not torch.int32:
        raise ValueError(f"loc must be an int32 or int64 tensor, got {loc_dtype}")
    loc_shape = loc.shape
    if len(loc_shape) != 1:
        raise ValueError(f"loc must be 1-D, got shape {tuple(loc_shape)}")
    if not loc.is_contiguous():  # a strided view: kernels read consecutive slots
        loc = loc.contiguous()
    if not isinstance(cache_k, torch.Tensor) or not isinstance(cache_v, torch.Tensor):
        raise ValueError("cache_k and cache_v must be tensors")
    # get_device() is -1 for every non-CUDA device: those compare device objects
    if (device_index < 0 or loc.get_device() != device_index or cache_k.get_device() != device_index
            or cache_v.get_device() != device_index):
        _check_devices(device, loc=loc, cache_k=cache_k, cache_v=cache_v)
    k_dtype = cache_k.dtype
    if k_dtype is not cache_v.dtype:
        raise ValueError(f"cache_k is {k_dtype} but cache_v is {cache_v.dtype}")
    if k_dtype not in FLOAT_INPUTS:
        raise ValueError(f"cache_k/cache_v must be floating point, got {k_dtype}")
    tokens = loc_shape[0]
    k_dense = cache_k.shape == (tokens, head_num, head_dim) and cache_k.is_contiguous()
    if not k_dense:
        cache_k = _rows(cache_k, "cache_k", tokens, head_num, head_dim)
    v_dense = cache_v.shape == (tokens, head_num, v_head_dim) and cache_v.is_contiguous()
    if not v_dense:
        cache_v = _rows(cache_v, "cache_v", tokens, head_num, v_head_dim)
    if tokens:
        # No input may share a byte with a buffer written into. An input's bytes run from its
        # first one to the end of its last row (rows are contiguous here); the buffers are
        # contiguous (the pool's are, and the kernels need it).
        k_lo = k_buf.data_ptr()
        k_hi = k_lo + k_buf.nbytes
        v_lo = v_buf.data_ptr()
        v_hi = v_lo + v_buf.nbytes
        lo = cache_k.data_ptr()
        hi = lo + (cache_k.nbytes if k_dense else
                   ((tokens - 1) * cache_k.stride()[0] + head_num * head_dim) * cache_k.itemsize)
        if (lo < k_hi and k_lo < hi) or (lo < v_hi and v_lo < hi):
            _shared("cache_k")
        lo = cache_v.data_ptr()
        hi = lo + (cache_v.nbytes if v_dense else
                   ((tokens - 1) * cache_v.stride()[0] + head_num * v_head_dim) * cache_v.itemsize)
        if (lo < k_hi and k_lo < hi) or (lo < v_hi and v_lo < hi):
            _shared("cache_v")
        lo = loc.data_ptr()
        hi = lo + loc.nbytes
        if (lo < k_hi and k_lo < hi) or (lo < v_hi and v_lo < hi):
            _shared("loc")
    return loc, cache_k, cache_v


def _check_devices(device: torch.device, **inputs: torch.Tensor) -> None:
    """The first input not on ``device``, named (off the fast path: a CUDA pool's inputs on its
    own GPU never get here)."""
    for name, t in inputs.items():
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, the pool is on {device}")


def _shared(name: str) -> None:
    raise ValueError(f"{name} shares memory with a cache buffer it would be written into; pass a copy (.clone())")


def check_buffers_inputs(k_buf: torch.Tensor, v_buf: torch.Tensor, loc: torch.Tensor, cache_k: torch.Tensor,
                         cache_v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`check_write_inputs` with the expectations read off a pool's ``[rows, heads,
    dim]`` buffers, for writers that check their own calls (off the hot path)."""
    index = k_buf.get_device()
    return check_write_inputs(loc, cache_k, cache_v, k_buf.shape[1], k_buf.shape[2], v_buf.shape[2],
                              k_buf.device, index, k_buf, v_buf)


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``[first, end)`` that ``t`` can touch (torch strides are never negative);
    an empty span for an empty tensor."""
    first = t.data_ptr()
    if t.is_contiguous():
        return first, first + t.nbytes
    last = 0
    for size, stride in zip(t.shape, t.stride()):
        if size == 0:
            return first, first
        last += (size - 1) * stride
    return first, first + (last + 1) * t.element_size()


def check_apart(buffers: tuple[torch.Tensor, ...], **inputs: torch.Tensor | None) -> None:
    """Refuse (one-line ``ValueError``) an input whose bytes meet a buffer's: the write would
    read it while overwriting it. Byte ranges, so any overlap counts, even of rows not
    written; inputs that are None or empty are skipped."""
    spans = [byte_span(b) for b in buffers]
    for name, t in inputs.items():
        if t is None:
            continue
        lo, hi = byte_span(t)
        if lo == hi:
            continue
        for b_lo, b_hi in spans:
            if lo < b_hi and b_lo < hi:
                _shared(name)


def _rows(t: torch.Tensor, name: str, tokens: int, head_num: int, dim: int) -> torch.Tensor:
    shape = t.shape
    if len(shape) == 3 and shape[0] == tokens and shape[1] == head_num and shape[2] == dim:
        if t.is_contiguous() or (t.stride(2) == 1 and t.stride(1) == dim):
            return t  # the common case: no new tensor object
        return t.contiguous()
    if len(shape) == 0 or shape[0] != tokens:
        got = shape[0] if len(shape) else "a scalar"
        raise ValueError(f"{name} has {got} tokens but loc has {tokens}")
    if tuple(shape[1:]) not in ((head_num, dim), (head_num * dim,)):
        raise ValueError(f"{name} rows have shape {tuple(shape[1:])}, expected ({head_num}, {dim})")
    t = t.reshape(tokens, head_num, dim)
    return t if t.stride(2) == 1 and t.stride(1) == dim else t.contiguous()
