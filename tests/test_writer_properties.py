"""Every registered writer of every layout writes exactly the rows of a plain reference
(``buf[loc] = convert(x)``) whatever the memory layout of its inputs, and a call it refuses
leaves every buffer byte for byte as it was.

Hypothesis draws, per writer: the cache dtype, the input dtype (valid, or one the pool
refuses), the token count, slots (duplicates, padding, one out of range), the slots' dtype and
layout (contiguous, a strided view, a storage offset, an expanded view, 2-D), the K/V inputs'
layout (contiguous, token-strided, offset, non-contiguous rows, flat, expanded) and inputs
that share memory with a buffer. Writers that cannot run here are skipped with their
``unsupported_reason``; the Triton ones run under Triton's interpreter. Where a slot appears
twice, which token's values land is unspecified (as for ``index_put``): each must be one of
theirs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from kvprof.kvcache.dtypes import cast_like_sglang, convert_for_cache, convert_like_vllm, store_dtype_for
from kvprof.kvcache.layouts import registry
from kvprof.kvcache.mla_pool import MLAPool
from kvprof.kvcache.paged_pool import PagedPool
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.writers import writer_names

CPU = torch.device("cpu")
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
CACHES = (torch.float32, torch.bfloat16, torch.float16, *FP8)
BAD_INPUTS = (torch.float64, torch.int32)
BAD_LOCS = (torch.float32, torch.int16, torch.uint8)
LOC_LAYOUTS = ("contiguous", "strided", "offset", "expanded")
ROW_LAYOUTS = ("contiguous", "token-strided", "offset", "rows-strided", "flat", "expanded")
FAULTS = ("loc dtype", "loc 2-D", "slot out of range", "input dtype", "dtype mismatch", "input0 aliased",
          "input1 aliased", "loc aliased")
# what the one-line refusal of each fault says (every pool words them alike)
REFUSALS = {"loc dtype": "int32 or int64", "loc 2-D": "must be 1-D", "slot out of range": "slot",
            "input dtype": "floating point", "dtype mismatch": " but ", "input0 aliased": "shares memory",
            "input1 aliased": "shares memory", "loc aliased": "shares memory"}
NEED_TOKENS = ("slot out of range", "input0 aliased", "input1 aliased", "loc aliased")
SIZE = 32  # slots per buffer (+1 for the MHA/MLA page): room for every aliasing view below
SLOW = {"torch_compile"}  # compiles per dtype combination, seconds each: about a minute here


def _inputs(layout: str, cache: torch.dtype) -> list[torch.dtype]:
    """Input dtypes the layout's pool takes for this cache (a writer without one of these
    conversions says so in ``unsupported_reason`` and must refuse the call)."""
    if layout == "paged":  # vLLM: an fp8 cache from fp32/bf16/fp16, else the cache's own dtype
        return [torch.bfloat16, torch.float16, torch.float32] if cache in FP8 else [cache]
    if cache == torch.float8_e4m3fn:
        return [cache, torch.bfloat16, torch.float16, torch.float32]
    if cache == torch.float8_e5m2:
        return [cache, torch.bfloat16, torch.float32]
    return [cache, torch.float32]


_WRITERS: dict[tuple[str, str], object] = {}


def _writer(layout: str, name: str, device: torch.device):  # noqa: ANN202
    """One writer per name for the whole file (compiled code and plans are kept), or a skip."""
    if name in SLOW and device.type == "cuda":  # the GPU run has a time budget for all its tests
        pytest.skip(f"{name} recompiles per call shape: checked on CPU (-m slow)")
    key = (layout, name)
    if key not in _WRITERS:
        if name in SLOW:  # torch.compile's cache is per function, not per writer: start it empty, so
            torch._dynamo.reset()  # another file's compiles do not count towards its recompile limit
        _WRITERS[key] = registry.create_variant(layout, name)
    writer = _WRITERS[key]
    reason = writer.unsupported_reason(device, torch.bfloat16)
    if reason:
        pytest.skip(reason)
    return writer


def _params() -> list:
    """Every store writer of every layout. The MHA layout's rope + store writers take q, k, v,
    positions and a cos/sin cache (another contract): tests/test_rope_writers.py checks them the
    same way (strided slots and positions, inputs sharing memory with the cache refused)."""
    from kvprof.core import variants

    names = [("mha", n) for n in writer_names() if not variants.info(n).rope]
    names += [(layout, n) for layout in ("mla", "paged") for n in registry.writer_names(layout)]
    return [pytest.param(layout, n, id=f"{layout}-{n}", marks=[pytest.mark.slow] if n in SLOW else [])
            for layout, n in names]


# -- building the inputs -----------------------------------------------------------------------
def _as_loc(slots: list[int], dtype: torch.dtype, layout: str, device: torch.device) -> torch.Tensor:
    """The slots as a tensor of ``dtype`` in ``layout`` (same values in every layout but 2-D)."""
    n = len(slots)
    flat = torch.tensor(slots, dtype=torch.int64, device=device)
    if layout == "strided":  # a stride of 4 and a storage offset of 1: [1, 5, 9] is arange(12)[1::4]
        wide = torch.full((4 * n + 1,), 7, dtype=torch.int64, device=device)
        wide[1::4] = flat
        return wide.to(dtype)[1::4]
    if layout == "offset":
        wide = torch.full((n + 2,), 7, dtype=torch.int64, device=device)
        wide[2:] = flat
        return wide.to(dtype)[2:]
    if layout == "expanded" and n:  # one slot, read n times through a zero stride
        return flat[:1].to(dtype).expand(n)
    if layout == "2-D":
        return flat.to(dtype).view(1, n)
    return flat.to(dtype)


def _as_rows(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x`` ([tokens, heads, dim], contiguous) with the same values in ``layout``."""
    t, h, d = x.shape
    if layout == "token-strided":  # a view of a wider tensor, as K out of a fused QKV output
        wide = torch.zeros((t, h, d + 3), dtype=x.dtype, device=x.device)
        wide[..., :d] = x
        return wide[..., :d]
    if layout == "offset":
        big = torch.zeros((t + 1, h, d), dtype=x.dtype, device=x.device)
        big[1:] = x
        return big[1:]
    if layout == "rows-strided":  # each row's heads and dims transposed in memory
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    if layout == "flat":
        return x.reshape(t, h * d)
    if layout == "expanded" and t:
        return x[:1].expand(t, h, d)
    return x


def _view_of(buf: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...], byte_offset: int) -> torch.Tensor:
    """A tensor of ``dtype``/``shape`` whose bytes are ``buf``'s from ``byte_offset`` on."""
    n = 1
    for s in shape:
        n *= s
    size = torch.empty((), dtype=dtype).element_size()
    raw = buf.view(torch.uint8).reshape(-1)[byte_offset: byte_offset + n * size]
    assert raw.numel() == n * size, "the buffer is too small for this view"
    return raw.view(dtype).view(shape)


@st.composite
def cases(draw, layout: str, first_slot: int = 0):  # noqa: ANN201
    """One write: half of them valid, the others with exactly one fault (``case["fault"]``).
    ``first_slot``: the lowest slot drawn (padding's -1 aside)."""
    fault = draw(st.sampled_from([None] * len(FAULTS) + list(FAULTS)))
    cache = draw(st.sampled_from(CACHES))
    tokens = draw(st.integers(1 if fault in NEED_TOKENS else 0, 5))
    if fault == "input dtype":
        inp = draw(st.sampled_from(BAD_INPUTS))
    elif fault in ("input0 aliased", "input1 aliased") and layout != "paged":
        inp = cache  # a view of the buffer's own bytes (a paged cache takes its inputs in any width)
    else:
        inp = draw(st.sampled_from(_inputs(layout, cache)))
    check_slots = fault == "slot out of range" or draw(st.booleans())
    rows = SIZE + (0 if layout == "paged" else 1)
    low = -1 if layout == "paged" else first_slot  # vLLM's -1: padding, skipped
    slots = draw(st.lists(st.integers(low, rows - 1), min_size=tokens, max_size=tokens,
                          unique=draw(st.booleans())))
    loc_layout = "2-D" if fault == "loc 2-D" else draw(st.sampled_from(LOC_LAYOUTS))
    bad = draw(st.integers(0, tokens - 1)) if fault == "slot out of range" else 0
    if fault == "slot out of range":
        slots[bad] = draw(st.sampled_from([rows, rows + 5, -2]))
    if loc_layout == "expanded" and slots:
        slots = [slots[bad]] * tokens
    return {
        "fault": fault, "cache": cache, "inp": inp, "tokens": tokens, "check_slots": check_slots,
        "slots": slots, "loc_layout": loc_layout,
        "loc_dtype": draw(st.sampled_from(BAD_LOCS if fault == "loc dtype" else (torch.int64, torch.int32))),
        "row_layouts": (draw(st.sampled_from(ROW_LAYOUTS)), draw(st.sampled_from(ROW_LAYOUTS))),
        "into": draw(st.integers(0, 1)), "heads": draw(st.integers(1, 2)),
        "dim": draw(st.sampled_from([4, 8, 16])), "vdim": draw(st.sampled_from([4, 8, 16])),
        "scale": draw(st.sampled_from([None, 0.5, 3.0, "tensor"])),
        "split": fault in ("input1 aliased", "dtype mismatch") or draw(st.booleans()),  # MLA: nope + rope
        "padded": draw(st.integers(0, 2)), "seed": draw(st.integers(0, 2**16)),
    }


def _loc(case: dict, buffers: list[torch.Tensor]) -> torch.Tensor:
    if case["fault"] == "loc aliased":
        # the slots stored in a buffer's own bytes (its last ones): the writer reads them there
        buf = buffers[case["into"] % len(buffers)]
        size = torch.empty((), dtype=case["loc_dtype"]).element_size()
        offset = (buf.numel() * buf.element_size() - case["tokens"] * size) // 8 * 8
        loc = _view_of(buf, case["loc_dtype"], (case["tokens"],), offset)
        loc.copy_(torch.tensor(case["slots"]))
        return loc
    return _as_loc(case["slots"], case["loc_dtype"], case["loc_layout"], buffers[0].device)


def _rows(case: dict, which: int, shape: tuple[int, ...], buffers: list[torch.Tensor],
          gen: torch.Generator) -> torch.Tensor:
    """Input ``which`` (0: K or nope or the latent row, 1: V or rope) of ``shape``."""
    dtype = case["inp"]
    if which == 1 and case["fault"] == "dtype mismatch":
        dtype = torch.float16 if dtype != torch.float16 else torch.bfloat16
    if case["fault"] == f"input{which} aliased":
        return _view_of(buffers[case["into"] % len(buffers)], dtype, shape, 8)
    if dtype.is_floating_point:
        x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    else:
        x = torch.randint(-3, 3, shape, generator=gen).to(dtype)
    return _as_rows(x.to(buffers[0].device), case["row_layouts"][which])


def _scale(case: dict, device: torch.device):  # noqa: ANN202
    return torch.tensor([0.25], device=device) if case["scale"] == "tensor" else case["scale"]


def _expect_refusal(case: dict, writer, device: torch.device) -> bool:  # noqa: ANN001
    """Whether the call is one the pool (or the writer, for a conversion it lacks) refuses."""
    return case["fault"] is not None or writer.unsupported_reason(device, case["cache"], case["inp"]) is not None


# -- running one case and checking it -----------------------------------------------------------
def _fill(buffers: list[torch.Tensor], gen: torch.Generator) -> None:
    """Random bytes in every buffer: a row written or left alone cannot pass for the other."""
    for b in buffers:
        raw = b.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, generator=gen, dtype=torch.uint8))


def _rows_of(buf: torch.Tensor) -> torch.Tensor:
    """One row of bytes per slot, on the host."""
    return buf.view(torch.uint8).reshape(buf.shape[0] * (buf.shape[1] if buf.dim() == 4 else 1), -1).cpu()


def _check_rows(name: str, before: torch.Tensor, after: torch.Tensor, slots: list[int],
                expected: torch.Tensor, columns: slice = slice(None), skip: int | None = None) -> None:
    """Every row of ``after`` (bytes, one row per slot) is ``before``'s, except rows at
    ``slots`` (not ``skip``), which hold ``expected``'s row of the token with that slot; of
    several tokens with one slot, each byte may come from any of them (parallel stores)."""
    touched: dict[int, list[int]] = {}
    for t, s in enumerate(slots):
        if s >= 0 and s != skip:
            touched.setdefault(s, []).append(t)
    for s in range(before.shape[0]):
        got = after[s, columns]
        if s not in touched:
            assert torch.equal(got, before[s, columns]), f"{name}: slot {s} was written but is not in loc"
        else:
            assert (expected[touched[s]] == got).any(dim=0).all(), (
                f"{name}: slot {s} does not hold the reference row of token(s) {touched[s]}")


def _pool(layout: str, writer: Any, case: dict, device: torch.device) -> tuple[Any, list[torch.Tensor]]:
    """The layout's pool with ``writer``, and the buffers it writes into."""
    cache, heads, dim, vdim = case["cache"], case["heads"], case["dim"], case["vdim"]
    if layout == "mha":
        pool = KVPool(SIZE, 1, cache, heads, dim, 1, device, writer=writer, v_head_dim=vdim,
                      check_slots=case["check_slots"])
        return pool, [pool.k_buffer[0], pool.v_buffer[0]]
    if layout == "mla":
        pool = MLAPool(SIZE, 1, cache, 2 * dim, vdim, 1, device, writer=writer, check_slots=case["check_slots"])
        return pool, [pool.kv_buffer[0]]
    pool = PagedPool(SIZE // 4, 4, cache, heads, dim, 1, device, writer=writer, check_slots=case["check_slots"])
    return pool, [pool.key_cache[0], pool.value_cache[0]]


def _input_shapes(layout: str, case: dict) -> list[tuple[int, int, int]]:
    """The shapes of the rows the layout's write call takes."""
    tokens, heads, dim, vdim = case["tokens"], case["heads"], case["dim"], case["vdim"]
    if layout == "mha":
        return [(tokens, heads, dim), (tokens, heads, vdim)]
    if layout == "mla":
        return [(tokens, 1, 2 * dim), (tokens, 1, vdim)] if case["split"] else [(tokens, 1, 2 * dim + vdim)]
    return [(tokens + case["padded"], heads, dim)] * 2


def _write(layout: str, pool: Any, case: dict, loc: torch.Tensor, inputs: list[torch.Tensor], scale: Any) -> None:
    """The layout's own write call (SGLang's MHA and MLA ones, vLLM's paged one)."""
    if layout == "mha":
        pool.set_kv_buffer(0, loc, inputs[0], inputs[1], scale, scale)
    elif layout == "mla" and case["split"]:
        pool.set_mla_kv_buffer(0, loc, inputs[0], inputs[1])
    elif layout == "mla":
        pool.set_kv_buffer(0, loc, inputs[0])
    else:
        pool.reshape_and_cache_flash(0, inputs[0], inputs[1], loc, scale, scale)


def _check_written(layout: str, name: str, case: dict, snapshot: list[torch.Tensor], buffers: list[torch.Tensor],
                   held: list[torch.Tensor], scale: Any, device: torch.device) -> None:
    """The reference rows (each layout's own conversion) at the slots, every other row as it was."""
    cache, tokens, heads, dim, vdim, slots = (case[k] for k in ("cache", "tokens", "heads", "dim", "vdim", "slots"))
    if layout == "mha":
        for i, (before, b) in enumerate(zip(snapshot, buffers)):
            x = held[i].reshape(tokens, heads, (dim, vdim)[i])
            _check_rows(name, before, _rows_of(b), slots, _bytes(convert_for_cache(x, cache, scale)))
    elif layout == "mla":
        after = _rows_of(buffers[0])
        if case["split"]:  # set_mla_kv_buffer: nope, then rope, side by side; slot 0 skipped
            cut = 2 * dim * torch.empty((), dtype=store_dtype_for(cache)).element_size()
            for x, columns in zip(held, (slice(0, cut), slice(cut, None))):
                _check_rows(name, snapshot[0], after, slots, _bytes(cast_like_sglang(x, cache)), columns, 0)
        else:
            _check_rows(name, snapshot[0], after, slots, _bytes(cast_like_sglang(held[0], cache)))
    else:
        s = None if scale is None else (scale if isinstance(scale, torch.Tensor)
                                        else torch.tensor([scale], device=device))
        for i, (before, b) in enumerate(zip(snapshot, buffers)):
            _check_rows(name, before, _rows_of(b), slots, _bytes(convert_like_vllm(held[i][:tokens], cache, s)))


def _run(layout: str, writer, case: dict, device: torch.device = CPU) -> None:  # noqa: ANN001
    """One call through the layout's pool; then either the reference rows at the slots and every
    other row as it was, or a ValueError and every byte as it was."""
    gen = torch.Generator().manual_seed(case["seed"])
    pool, buffers = _pool(layout, writer, case, device)
    _fill(buffers, gen)
    loc = _loc(case, buffers)
    inputs = [_rows(case, i, shape, buffers, gen) for i, shape in enumerate(_input_shapes(layout, case))]
    snapshot = [_rows_of(b).clone() for b in buffers]
    held = [x.clone() for x in inputs]  # the values as the call sees them (aliased ones included)
    refuse = _expect_refusal(case, writer, device)
    scale = _scale(case, device)
    try:
        _write(layout, pool, case, loc, inputs, scale)
    except ValueError as exc:
        for before, b in zip(snapshot, buffers):
            assert torch.equal(before, _rows_of(b)), f"{writer.name} changed the cache, then refused: {exc}"
        assert refuse, f"{writer.name} refused a valid call: {exc}"
        assert case["fault"] is None or REFUSALS[case["fault"]] in str(exc), f"{case['fault']}: refused for {exc}"
        assert "\n" not in str(exc)
        return
    assert not refuse, f"{writer.name} took a call it must refuse: {case}"
    _check_written(layout, writer.name, case, snapshot, buffers, held, scale, device)


def _bytes(x: torch.Tensor) -> torch.Tensor:
    """Each token's row of ``x`` as bytes."""
    if not len(x):
        return torch.empty((0, 0), dtype=torch.uint8)
    return x.contiguous().view(torch.uint8).reshape(len(x), -1).cpu()


DEVICES = [pytest.param(CPU, id="cpu"), pytest.param(torch.device("cuda"), id="cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("layout", "name"), _params())
def test_writer_writes_the_reference_rows_or_nothing(layout: str, name: str, device: torch.device) -> None:
    writer = _writer(layout, name, device)
    # SGLang's store_cache never writes slot 0 (the padding dummy): MHA slots from 1 on a GPU
    first = 1 if layout == "mha" and device.type == "cuda" else 0

    # 25 calls per writer here; 10 on a GPU, where each new launch shape compiles a kernel
    examples = 25 if device.type == "cpu" else 10

    @settings(max_examples=examples, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(case=cases(layout, first))
    def run(case: dict) -> None:
        _run(layout, writer, case, device)

    run()


def _case(**changes: object) -> dict:
    """A valid bf16 write of three tokens at slots 1, 5, 9, with ``changes``."""
    case = {"fault": None, "cache": torch.bfloat16, "inp": torch.bfloat16, "tokens": 3, "check_slots": True,
            "slots": [1, 5, 9], "loc_layout": "contiguous", "loc_dtype": torch.int64,
            "row_layouts": ("contiguous", "contiguous"), "into": 1, "heads": 2, "dim": 8, "vdim": 8,
            "scale": None, "split": True, "padded": 0, "seed": 0}
    case.update(changes)
    return case


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("check_slots", [True, False])
@pytest.mark.parametrize(("layout", "name"), _params())
def test_a_strided_loc_writes_the_slots_it_holds(layout: str, name: str, check_slots: bool,
                                                  device: torch.device) -> None:
    """loc = [1, 5, 9] as a view with a stride of 4 and a storage offset of 1 (as
    ``torch.arange(12)[1::4]``): rows 1, 5 and 9 are written, no other (the fused Triton
    writer wrote 1, 2, 3: its kernel read loc as consecutive slots)."""
    _run(layout, _writer(layout, name, device), _case(loc_layout="strided", check_slots=check_slots), device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fault", ["input0 aliased", "input1 aliased", "loc aliased"])
@pytest.mark.parametrize(("layout", "name"), _params())
def test_an_input_sharing_memory_with_a_buffer_is_refused_and_changes_nothing(
        layout: str, name: str, fault: str, device: torch.device) -> None:
    """V (or K, or loc) as a view of the V buffer: refused before anything is written
    (index_put and two_stream wrote K, then torch refused V; triton_fused took it)."""
    case = _case(fault=fault, check_slots=False)
    _run(layout, _writer(layout, name, device), case, device)


def test_cuda_fused_copies_what_its_op_refuses_then_launches(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuda_fused's op refuses a strided loc and rows with a non-contiguous inside before
    launching (store_kv.cpp, loc first); the writer copies what was refused and calls it again,
    so such a call writes the right rows. Driven on CPU through a stand-in with the op's checks
    and words (the op itself: the GPU runs of the tests above)."""
    from pathlib import Path
    from types import SimpleNamespace

    from kvprof.kvcache.writers import cuda_fused

    source = (Path(cuda_fused.__file__).with_name("csrc") / "store_kv.cpp").read_text()
    assert cuda_fused.NOT_LOC_CONTIGUOUS in source and cuda_fused.NOT_ROW_CONTIGUOUS in source
    calls = []

    def store_kv(k_buf, v_buf, loc, k, v, k_inv, v_inv, flags):  # noqa: ANN001, ANN202
        calls.append((loc.is_contiguous(), k.is_contiguous()))
        if loc.stride(0) != 1:
            raise RuntimeError(cuda_fused.NOT_LOC_CONTIGUOUS)
        if k.stride(1) != k.shape[2] or v.stride(1) != v.shape[2]:
            raise RuntimeError(cuda_fused.NOT_ROW_CONTIGUOUS)
        if k.dtype != k_buf.dtype:
            raise RuntimeError("cuda_fused: launch failed: out of resources")
        k_buf[loc] = k
        v_buf[loc] = v

    monkeypatch.setattr(cuda_fused, "load_extension", lambda: (SimpleNamespace(store_kv=store_kv), None))
    writer = cuda_fused.CudaFusedWriter()
    k_buf, v_buf = torch.zeros(16, 2, 4, dtype=torch.bfloat16), torch.zeros(16, 2, 4, dtype=torch.bfloat16)
    x = torch.randn(3, 2, 4).to(torch.bfloat16)
    # the writer's own path, as a pool calls it (validates_inputs: its op checks); its public
    # write refuses here first, as cuda_fused needs CUDA (tests/test_writer_contracts.py)
    writer.write_unchecked(k_buf, v_buf, torch.arange(12)[1::4], _as_rows(x, "rows-strided"), x, torch.bfloat16)
    assert calls == [(False, False), (True, False), (True, True)]
    assert torch.equal(k_buf[[1, 5, 9]], x) and torch.equal(v_buf[[1, 5, 9]], x)
    assert not k_buf[[0, 2, 3, 4, 6, 7, 8, 10]].any()
    with pytest.raises(RuntimeError, match="out of resources"):  # any other refusal is the op's own
        writer.write_unchecked(k_buf, v_buf, torch.arange(12)[1::4], x.float(), x.float(), torch.bfloat16)


@pytest.mark.slow
def test_torch_compile_writes_more_combinations_than_one_compiled_function_may_recompile() -> None:
    """torch.compile counts recompiles per code object and raises past its limit (8): the
    torch_compile writer compiles one function per combination of dtypes, ranks and contiguity,
    so one writer takes every combination a process writes (twelve converting dtype pairs here;
    before, the ninth raised "recompile limit exceeded")."""
    from kvprof.kvcache.dtypes import convert_for_cache, store_dtype_for

    torch._dynamo.reset()
    writer = registry.create_variant("mha", "torch_compile")
    floats = (torch.bfloat16, torch.float16, torch.float32)
    combos = [(c, i) for c in (*floats, torch.float8_e4m3fn, torch.float8_e5m2) for i in floats if c != i]
    assert len(combos) > 8
    for cache, inp in combos:
        k_buf = torch.zeros(16, 2, 8, dtype=store_dtype_for(cache))
        v_buf = torch.zeros_like(k_buf)
        x = torch.randn(3, 2, 8).to(inp)
        loc = torch.tensor([1, 5, 9])
        writer.write(k_buf, v_buf, loc, x, x, cache, 0.5, 0.5)
        want = convert_for_cache(x, cache, 0.5)
        assert torch.equal(k_buf[loc], want) and torch.equal(v_buf[loc], want), (cache, inp)
        assert int((k_buf != 0).flatten(1).any(1).sum()) <= 3


@pytest.mark.slow
def test_torch_compile_takes_a_fresh_function_where_one_combination_reaches_the_recompile_limit() -> None:
    """Within one combination of dtypes, a size of 1 is a guard of its own (0/1 specialisation):
    with the limit at 1, the second token count recompiles past it; the writer starts a fresh
    function for the combination and writes the rows. (Dynamo's config is patched through its
    own context manager: pytest's monkeypatch deletes a config entry on undo.)"""
    torch._dynamo.reset()
    limit = torch._dynamo.config.recompile_limit
    writer = registry.create_variant("mha", "torch_compile")
    k_buf, v_buf = torch.zeros(16, 2, 8, dtype=torch.bfloat16), torch.zeros(16, 2, 8, dtype=torch.bfloat16)
    with torch._dynamo.config.patch(recompile_limit=1):
        for slots in ([1, 5, 9], [3]):
            x = torch.randn(len(slots), 2, 8).to(torch.bfloat16)
            loc = torch.tensor(slots)
            writer.write(k_buf, v_buf, loc, x, x, torch.bfloat16)
            assert torch.equal(k_buf[loc], x) and torch.equal(v_buf[loc], x)
    assert torch._dynamo.config.recompile_limit == limit  # put back as it was, whatever torch's default
