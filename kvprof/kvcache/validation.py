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

from typing import Any

import torch

from kvprof.kvcache.dtypes import FP8_DTYPES

FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16, *FP8_DTYPES)
# a cache dtype -> the dtype its buffers hold (kvprof.kvcache.dtypes.store_dtype_for, as one lookup)
_STORE = {d: torch.uint8 if d in FP8_DTYPES else d for d in FLOAT_INPUTS}


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


# -- the checks every writer runs on its own calls (KVWriter, RopeKVWriter, MLAWriter, PagedWriter) --
def check_buffers(dtype: object, rank: int, **buffers: object) -> torch.device:
    """Refuse (one-line ``ValueError``) cache buffers a kernel cannot write right: each a
    contiguous tensor of ``rank`` dims in the storage dtype of the cache's ``dtype`` (uint8
    for fp8), all on one device, no two sharing a byte. Returns their device."""
    store = _STORE.get(dtype)  # type: ignore[call-overload]
    if store is None:
        raise ValueError(f"unsupported cache dtype {dtype}")
    device = None
    spans: list[tuple[str, int, int]] = []
    for name, b in buffers.items():
        if b.__class__ is not torch.Tensor and not isinstance(b, torch.Tensor):
            raise ValueError(f"{name} must be a tensor (a cache buffer), got {type(b).__name__}")
        if len(b.shape) != rank:
            raise ValueError(f"{name} must have {rank} dims, got shape {tuple(b.shape)}")
        if b.dtype is not store:
            raise ValueError(f"{name} is {b.dtype}, a {dtype} cache is stored as {store}")
        if not b.is_contiguous():
            raise ValueError(f"{name} must be contiguous (kernels address its rows by slot), got strides {b.stride()}")
        if device is None:
            device = b.device
        elif b.device != device:
            raise ValueError(f"{name} is on {b.device}, the other cache buffer on {device}")
        lo = b.data_ptr()
        hi = lo + b.nbytes
        for other, o_lo, o_hi in spans:
            if lo < o_hi and o_lo < hi:
                raise ValueError(f"{name} shares memory with {other}: the write would store into both")
        spans.append((name, lo, hi))
    if device is None:
        raise ValueError("no cache buffer given")
    return device


def buffer_pair_rows(dtype: object, k_buf: Any, v_buf: Any) -> tuple[int, int, int] | None:
    """``(heads, dim, v_dim)`` of an MHA cache's K and V buffers that :func:`check_buffer_pair`
    takes, found in about a dozen attribute reads (the common call: plain tensors); None for
    anything else, which :func:`check_buffer_pair` then takes or words."""
    t_cls = torch.Tensor
    store = _STORE.get(dtype)  # type: ignore[call-overload]
    if (store is None or k_buf.__class__ is not t_cls or v_buf.__class__ is not t_cls or k_buf.dtype is not store
            or v_buf.dtype is not store or not k_buf.is_contiguous() or not v_buf.is_contiguous()
            or v_buf.device != k_buf.device):
        return None
    k_shape, v_shape = k_buf.shape, v_buf.shape
    if len(k_shape) != 3 or len(v_shape) != 3 or k_shape[0] != v_shape[0] or k_shape[1] != v_shape[1]:
        return None
    k_lo, v_lo = k_buf.data_ptr(), v_buf.data_ptr()
    if k_lo < v_lo + v_buf.nbytes and v_lo < k_lo + k_buf.nbytes:
        return None
    return k_shape[1], k_shape[2], v_shape[2]


def check_buffer_pair(dtype: object, k_buf: object, v_buf: object) -> None:
    """:func:`check_buffers` for an MHA cache's K and V buffers (3-D, the same rows and heads);
    the common call costs :func:`buffer_pair_rows`."""
    if buffer_pair_rows(dtype, k_buf, v_buf) is not None:
        return
    check_buffers(dtype, 3, k_buf=k_buf, v_buf=v_buf)  # dtype, rank, contiguity, device, overlap worded
    assert isinstance(k_buf, torch.Tensor) and isinstance(v_buf, torch.Tensor)
    k_shape, v_shape = k_buf.shape, v_buf.shape
    if k_shape[0] != v_shape[0] or k_shape[1] != v_shape[1]:
        raise ValueError(f"k_buf {tuple(k_shape)} and v_buf {tuple(v_shape)} must have the same rows and heads")


def check_scale(name: str, scale: object, device: torch.device, where: str = "the cache") -> None:
    """None, a positive finite number, or a one-element floating-point tensor on ``device``
    (a kernel reads it through its pointer; its value is the caller's: reading it would sync)."""
    if scale is None:
        return
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        if not 0 < scale < float("inf"):
            raise ValueError(f"{name} must be positive (finite and non-zero), got {scale!r}")
        return
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or not scale.is_floating_point():
            raise ValueError(f"{name} must be a one-element floating-point tensor, got {tuple(scale.shape)} "
                             f"{scale.dtype}")
        if scale.device != device:
            raise ValueError(f"{name} is on {scale.device}, {where} is on {device}")
        return
    raise ValueError(f"{name} must be a positive number or a one-element tensor, got {type(scale).__name__}")


def check_index_range(name: str, index: torch.Tensor, low: int, end: int, what: str = "slot") -> None:
    """Refuse an index outside ``[low, end)`` where reading the values costs no device sync
    (a CPU tensor: a µs or two). On a GPU the values stay the caller's, as a pool with
    ``check_slots=False`` takes them (reading them would sync the device, and a CUDA-graph
    capture forbids it)."""
    n = index.shape[0]
    if not n or index.device.type != "cpu":
        return
    if n <= 64:  # a list's min and max beat torch.aminmax's dispatch on a few values
        values = index.tolist()
        lo, hi = min(values), max(values)
    else:
        lo, hi = (int(x) for x in torch.aminmax(index))
    if lo < low or hi >= end:
        raise ValueError(f"{name} has {what} {lo if lo < low else hi}, outside [{low}, {end})")


def _rows_form(t: torch.Tensor) -> tuple[int, int, int, int]:
    """``t``'s bytes as ``(first, row stride, row width, rows)``: rows of ``width`` contiguous
    bytes, ``stride`` apart, when every dim after the first is dense (views along the last dim
    of one tensor, such as q, k and v split out of a QKV projection, have this form); else its
    whole span as one row."""
    if t.is_contiguous():
        first = t.data_ptr()
        return first, t.nbytes, t.nbytes, 1
    return _strided_form(t)


def _strided_form(t: torch.Tensor) -> tuple[int, int, int, int]:
    """:func:`_rows_form` of a tensor that is not contiguous."""
    first = t.data_ptr()
    size = t.element_size()
    shape, stride = t.shape, t.stride()
    if len(shape) == 3 and (shape[2] == 1 or stride[2] == 1) and (shape[1] == 1 or stride[1] == shape[2]):
        return first, stride[0] * size, shape[1] * shape[2] * size, shape[0]  # [tokens, heads, dim] rows
    dense = 1
    for i in range(len(shape) - 1, 0, -1):
        if shape[i] != 1 and stride[i] != dense:
            lo, hi = byte_span(t)
            return lo, hi - lo, hi - lo, 1
        dense *= shape[i]
    return first, stride[0] * size, dense * size, shape[0]


def _meet(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    """Whether two rows forms share a byte: exact where both have the same row stride (or one
    row), else whether their spans meet (it may then refuse a pair that interleaves without
    touching, never take one that touches)."""
    a0, sa, wa, na = a
    b0, sb, wb, nb = b
    if not (wa and wb and na and nb):
        return False
    if a0 >= b0 + (nb - 1) * sb + wb or b0 >= a0 + (na - 1) * sa + wa:
        return False  # the spans are apart
    if na == 1 and nb == 1:
        return True
    s = sa if nb == 1 else sb if na == 1 else sa if sa == sb else 0
    if s <= 0:
        return True  # different strides (or a zero one): the spans meet, so refuse
    # rows i of a and j of b meet iff -wb < d + m*s < wa, m = j - i in [1 - na, nb - 1]
    d = b0 - a0
    m_lo = max(1 - na, (-wb - d) // s + 1)
    m_hi = min(nb - 1, -((d - wa) // s) - 1)  # ceil((wa - d) / s) - 1
    return m_lo <= m_hi


def check_disjoint(written: dict[str, torch.Tensor | None], read: dict[str, torch.Tensor | None]) -> None:
    """Refuse (one-line ``ValueError``) a call where a tensor the write changes shares a byte
    with any other tensor of the call, written or read: the kernel would read what it has
    just overwritten (or write one place twice), and writers that order their loads and stores
    differently would disagree. One check over every pair, whatever the tensors are; read-only
    inputs may share memory with each other. A written tensor whose own elements overlap (an
    expanded view) is refused too."""
    # each tensor's rows form once (a contiguous one is its own single row and cannot overlap
    # itself); then only tensors whose spans meet are compared, pair by pair
    spans: list[tuple[int, int, str, tuple[int, int, int, int], bool]] = []
    for writes, group in ((True, written), (False, read)):
        for name, t in group.items():
            if t is None:
                continue
            if t.is_contiguous():
                size = t.nbytes
                if size:
                    first = t.data_ptr()
                    spans.append((first, first + size, name, (first, size, size, 1), writes))
                continue
            if not t.numel():
                continue
            form = _strided_form(t)
            # dense rows overlap one another iff they are closer than their width; any other
            # form is torch's to judge
            if writes and ((form[1] < form[2]) if form[3] > 1 else torch._debug_has_internal_overlap(t) == 1):
                raise ValueError(f"{name} is written and more than one of its elements is one memory location "
                                 "(an expanded view); pass a copy (.clone())")
            spans.append((form[0], form[0] + (form[3] - 1) * form[1] + form[2], name, form, writes))
    # sorted by first byte, each is compared with those that start before its span ends (none,
    # for tensors of separate allocations)
    spans.sort(key=lambda e: e[0])
    for i, (_, hi, name, form, writes) in enumerate(spans):
        for lo_j, _, other, other_form, other_writes in spans[i + 1:]:
            if lo_j >= hi:
                break
            if (writes or other_writes) and _meet(form, other_form):
                w, r = (name, other) if writes else (other, name)
                raise ValueError(f"{r} shares memory with {w}, which the write changes; pass a copy (.clone())")


def check_positive(**values: Any) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def check_cache_dtype(dtype: Any) -> None:
    if dtype not in FLOAT_INPUTS:
        raise ValueError(f"unsupported cache dtype {dtype}")


def check_loc(loc: Any, device: torch.device, name: str = "loc") -> torch.Tensor:
    """1-D int32/int64 slots on the pool's device; returns them contiguous (the kernels read
    consecutive slots: a strided view is copied)."""
    if not isinstance(loc, torch.Tensor):
        raise ValueError(f"{name} must be a tensor of slot indices, got {type(loc).__name__}")
    if loc.dtype is not torch.int64 and loc.dtype is not torch.int32:
        raise ValueError(f"{name} must be an int32 or int64 tensor, got {loc.dtype}")
    if loc.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(loc.shape)}")
    if loc.device != device:
        raise ValueError(f"{name} is on {loc.device}, the pool is on {device}")
    return loc if loc.is_contiguous() else loc.contiguous()


def check_rows(t: Any, name: str, tokens: int, heads: int, dim: int, device: torch.device,
               at_least: bool = False) -> torch.Tensor:
    """A float tensor of ``[tokens, heads, dim]`` or ``[tokens, heads * dim]`` on ``device``,
    returned as ``[tokens, heads, dim]`` with contiguous rows (any token stride; copied only
    where a row is not contiguous). ``at_least``: more tokens than ``tokens`` are allowed
    (vLLM pads inputs for CUDA graphs; only the first ``tokens`` rows are written)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, the pool is on {device}")
    if t.dtype not in FLOAT_INPUTS:
        raise ValueError(f"{name} must be floating point, got {t.dtype}")
    if t.dim() == 0 or (t.shape[0] < tokens if at_least else t.shape[0] != tokens):
        got = t.shape[0] if t.dim() else "a scalar"
        raise ValueError(f"{name} has {got} tokens but the slots have {tokens}")
    if tuple(t.shape[1:]) not in ((heads, dim), (heads * dim,)):
        raise ValueError(f"{name} rows have shape {tuple(t.shape[1:])}, expected ({heads}, {dim})")
    t = t.reshape(t.shape[0], heads, dim) if t.dim() == 2 else t
    if t.stride(2) != 1 or (heads > 1 and t.stride(1) != dim):
        t = t.contiguous()
    return t


def slot_range(loc: torch.Tensor) -> tuple[int, int]:
    """Smallest and largest slot (one device sync)."""
    lo, hi = (int(x) for x in torch.aminmax(loc))
    return lo, hi


def capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def layer_index(layer: Any, layer_id_override: int | None, start_layer: int, layer_num: int) -> int:
    """The buffer index of ``layer`` (an int or an object with ``layer_id``), or a one-line error."""
    layer_id = layer_id_override if layer_id_override is not None else getattr(layer, "layer_id", layer)
    if isinstance(layer_id, bool) or not isinstance(layer_id, int):
        raise ValueError(f"layer {layer_id!r} is not a layer id (an int)")
    idx = layer_id - start_layer
    if not 0 <= idx < layer_num:
        raise ValueError(f"layer {layer_id!r} is not in this pool "
                         f"(layers {start_layer}..{start_layer + layer_num - 1})")
    return idx


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def check_scale_value(name: str, scale: Any, device: torch.device) -> None:
    """None, a positive finite number, or a one-element floating tensor on the pool's device (the
    writers' own check, :func:`kvprof.kvcache.validation.check_scale`)."""
    check_scale(name, scale, device, "the pool")
