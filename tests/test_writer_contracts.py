"""Every writer refuses, by itself, a call it cannot run right: called directly, not through a
pool, each registered writer of every contract (``KVWriter``, ``MLAWriter``, ``PagedWriter``,
``RopeKVWriter``) either writes exactly the reference rows or raises a one-line ``ValueError``
with every buffer and input as it was.

The checks live once per contract (``check_write``) and run before any subclass's ``write``
(``kvprof.kvcache.contracts.ChecksItsCalls``), so a writer registered later gets them too: the
third-party writers below rely on a contiguous ``loc`` as kernels do, and write the right
rows anyway. The store writers are driven with the strategies of the pools' property test
(tests/test_writer_properties.py: strided, offset, expanded and 2-D slots; strided, offset,
flat and expanded rows; wrong dtypes; inputs inside a buffer) plus faults only a direct call
can make (a strided buffer, a buffer of another dtype, K and V the same buffer); the rope
writers with aliased q/k/v/cos-sin inputs and positions past the cos/sin table.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import orjson
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import test_writer_properties as wp
from cli_support import run_cli
from kvprof.core import variants
from kvprof.kvcache.contracts import KVWriter, MLAWriter, PagedWriter, RopeKVWriter
from kvprof.kvcache.dtypes import convert_for_cache, store_dtype_for
from kvprof.kvcache.pool import KVPool
from kvprof.kvcache.validation import _meet, _rows_form, check_disjoint
from kvprof.kvcache.writers import WriterRegistry, create_writer, writer_names
from kvprof.kvcache.writers.rope_reference import cos_sin_table, rope_reference

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy overflow in Triton's interpreter
CPU = torch.device("cpu")
INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(INT_OF[t.element_size()])


# -- a strided loc called directly, and writers registered later ---------------------------------
def test_triton_fused_called_directly_writes_the_slots_a_strided_loc_holds() -> None:
    """``loc = torch.arange(1, 13)[::4]`` holds slots 1, 5, 9: the kernel read it as consecutive
    slots and wrote rows 1, 2, 3; the writer's own check now copies it contiguous first."""
    w = create_writer("triton_fused")
    w.prepare(CPU)
    k_buf = torch.zeros(16, 2, 8, dtype=torch.bfloat16)
    v_buf = torch.zeros_like(k_buf)
    k = torch.randn(3, 2, 8).to(torch.bfloat16)
    v = torch.randn(3, 2, 8).to(torch.bfloat16)
    w.write(k_buf, v_buf, torch.arange(1, 13)[::4], k, v, torch.bfloat16)
    ref_k, ref_v = torch.zeros_like(k_buf), torch.zeros_like(v_buf)
    create_writer("index_put").write(ref_k, ref_v, torch.tensor([1, 5, 9]), k, v, torch.bfloat16)
    assert torch.equal(bits(k_buf), bits(ref_k)) and torch.equal(bits(v_buf), bits(ref_v))
    assert (k_buf.flatten(1) != 0).any(1).nonzero().flatten().tolist() == [1, 5, 9]


def _consecutive(loc: torch.Tensor) -> torch.Tensor:
    """The slots as a kernel reads them: ``loc.shape[0]`` values from its first, one apart."""
    return torch.as_strided(loc, (loc.shape[0],), (1,))


class NaiveStore(KVWriter):
    name = "naive_store"

    def write(self, k_buf, v_buf, loc, cache_k, cache_v, dtype, k_scale=None, v_scale=None):  # type: ignore[override]
        slots = _consecutive(loc)
        k_buf[slots] = convert_for_cache(cache_k, dtype, k_scale)
        v_buf[slots] = convert_for_cache(cache_v, dtype, v_scale)
        return "naive"


class NaiveMLA(MLAWriter):
    name = "naive_mla"

    def write(self, kv_buf, loc, nope, rope, dtype, skip):  # type: ignore[override]
        slots = _consecutive(loc)
        kv_buf[slots] = torch.cat([nope, rope], -1).to(dtype)
        return "naive"


class NaivePaged(PagedWriter):
    name = "naive_paged"

    def write(self, k_cache, v_cache, slots, key, value, dtype, k_scale, v_scale):  # type: ignore[override]
        s = _consecutive(slots)
        n = s.shape[0]
        k_cache.view(-1, *k_cache.shape[2:])[s] = key[:n]
        v_cache.view(-1, *v_cache.shape[2:])[s] = value[:n]
        return "naive"


class NaiveRope(RopeKVWriter):
    name = "naive_rope"

    def write(self, q, k, v, k_buf, v_buf, loc, positions, cos_sin_cache, is_neox, dtype,  # type: ignore[override]
              k_scale=None, v_scale=None):
        rq, rk = rope_reference(q, k, cos_sin_cache, _consecutive(positions), is_neox)
        q.copy_(rq)
        k.copy_(rk)
        slots = _consecutive(loc)
        k_buf[slots] = convert_for_cache(k, dtype, k_scale)
        v_buf[slots] = convert_for_cache(v, dtype, v_scale)
        return "naive"


STRIDED = torch.arange(1, 13)[::4]  # slots 1, 5, 9 as a view


def _third_party(layout: str, cls: type) -> Any:
    reg = WriterRegistry()
    reg.register(cls.name, cls, layout=layout)
    return reg.create(cls.name, layout=layout)


@pytest.mark.parametrize("fault", [None, "int8 rows", "k is v buffer"])
def test_a_store_writer_registered_later_gets_the_checks(fault: str | None) -> None:
    w = _third_party("mha", NaiveStore)
    k_buf, v_buf = torch.zeros(16, 2, 8), torch.zeros(16, 2, 8)
    k, v = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    if fault is None:
        assert w.write(k_buf, v_buf, STRIDED, k, v, torch.float32) == "naive"
        assert torch.equal(k_buf[[1, 5, 9]], k) and torch.equal(v_buf[[1, 5, 9]], v)
        assert (k_buf.flatten(1) != 0).any(1).sum() == 3
        return
    args = ((k_buf, v_buf, STRIDED, k.to(torch.int8), v.to(torch.int8)) if fault == "int8 rows"
            else (k_buf, k_buf, STRIDED, k, v))
    with pytest.raises(ValueError) as err:
        w.write(*args, torch.float32)
    assert "\n" not in str(err.value) and not k_buf.any() and not v_buf.any()


def test_mla_and_paged_writers_registered_later_get_the_checks() -> None:
    mla = _third_party("mla", NaiveMLA)
    kv = torch.zeros(16, 1, 12)
    nope, rope = torch.randn(3, 1, 8), torch.randn(3, 1, 4)
    mla.write(kv, STRIDED, nope, rope, torch.float32, -1)
    assert torch.equal(kv[[1, 5, 9]], torch.cat([nope, rope], -1)) and (kv.flatten(1) != 0).any(1).sum() == 3
    with pytest.raises(ValueError, match="nope has 3 tokens but the slots have 2"):
        mla.write(kv, STRIDED[:2], nope, rope[:2], torch.float32, -1)
    paged = _third_party("paged", NaivePaged)
    kc, vc = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    paged.write(kc, vc, STRIDED, key, value, torch.float32, None, None)
    assert torch.equal(kc.view(16, 2, 8)[[1, 5, 9]], key) and torch.equal(vc.view(16, 2, 8)[[1, 5, 9]], value)
    before = kc.clone()
    with pytest.raises(ValueError, match="slot_mapping has slot 16, outside"):
        paged.write(kc, vc, torch.tensor([3, 16, 1]), key, value, torch.float32, None, None)
    assert torch.equal(kc, before)


def test_a_rope_writer_registered_later_gets_the_checks() -> None:
    w = _third_party("mha", NaiveRope)
    q, k, v, cs, pos = _rope_inputs(3)
    pos_strided = torch.zeros(12, dtype=torch.int64)
    pos_strided[1::4] = pos
    k_buf, v_buf = torch.zeros(16, 2, 8), torch.zeros(16, 2, 8)
    rq, rk = rope_reference(q, k, cs, pos, True)
    w.write(q, k, v, k_buf, v_buf, STRIDED, pos_strided[1::4], cs, True, torch.float32)
    assert torch.equal(q, rq) and torch.equal(k, rk) and torch.equal(k_buf[[1, 5, 9]], rk)
    q0 = q.clone()
    with pytest.raises(ValueError, match="shares memory"):
        w.write(q, q[:, :2], v, k_buf, v_buf, STRIDED, pos, cs, True, torch.float32)
    assert torch.equal(q, q0)


# -- the rope contract: aliased inputs, positions past the table, an unsupported store -----------
MAX_POS = 16


def _rope_inputs(tokens: int, hq: int = 4, hk: int = 2, dim: int = 8, dtype: torch.dtype = torch.float32,
                 seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, hq, dim, generator=g).to(dtype)
    k = torch.randn(tokens, hk, dim, generator=g).to(dtype)
    v = torch.randn(tokens, hk, dim, generator=g).to(dtype)
    return q, k, v, cos_sin_table(MAX_POS, dim), torch.randint(0, MAX_POS, (tokens,), generator=g)


def _rope_writers() -> list[str]:
    return [n for n in writer_names() if variants.info(n).rope]


def _rope_writer(name: str, device: torch.device = CPU) -> RopeKVWriter:
    w = create_writer(name)
    assert isinstance(w, RopeKVWriter)
    reason = w.unsupported_reason(device, torch.bfloat16, torch.bfloat16)
    if reason:
        pytest.skip(reason)
    w.prepare(device)
    return w


def _aliased(case: str) -> dict[str, Any]:
    """One call's inputs (bf16, 3 tokens, 2 KV heads of 8, q of 4 heads), ``case`` sharing memory."""
    q, k, v, cs, pos = (t.to(torch.bfloat16) if t.is_floating_point() and t.dim() == 3 else t
                        for t in _rope_inputs(3))
    k_buf, v_buf = torch.zeros(16, 2, 8, dtype=torch.bfloat16), torch.zeros(16, 2, 8, dtype=torch.bfloat16)
    call = dict(q=q, k=k, v=v, k_buf=k_buf, v_buf=v_buf, loc=torch.tensor([1, 5, 9]), positions=pos,
                cos_sin_cache=cs)
    qkv = torch.randn(3, 6 * 8).to(torch.bfloat16)
    if case == "q is k":
        call.update(q=k, k=k)
    elif case == "q and k overlap by a head":  # k is q's last two heads... and one more
        call.update(q=qkv[:, :32].view(3, 4, 8), k=qkv[:, 24:40].view(3, 2, 8))
    elif case == "v is k":
        call.update(v=k)
    elif case == "v overlaps k":
        call.update(k=qkv[:, :16].view(3, 2, 8), v=qkv[:, 8:24].view(3, 2, 8))
    elif case == "q views cos_sin_cache":
        call.update(q=cs.view(torch.bfloat16).reshape(-1)[:96].view(3, 4, 8))
    elif case == "k views cos_sin_cache":
        call.update(k=cs.view(torch.bfloat16).reshape(-1)[:48].view(3, 2, 8))
    elif case == "v inside k_buf":
        call.update(v=k_buf[10:13])
    elif case == "q inside v_buf":
        call.update(q=v_buf[:6].view(3, 4, 8))
    elif case == "positions inside k_buf":
        call.update(positions=k_buf.view(torch.int64).reshape(-1)[:3])
    return call


ALIASES = ["q is k", "q and k overlap by a head", "v is k", "v overlaps k", "q views cos_sin_cache",
           "k views cos_sin_cache", "v inside k_buf", "q inside v_buf", "positions inside k_buf"]


def _snapshot(call: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in call.items()}


def _unchanged(call: dict[str, Any], before: dict[str, torch.Tensor]) -> None:
    for name, t in call.items():
        assert torch.equal(bits(t) if t.is_floating_point() else t, bits(before[name]) if t.is_floating_point()
                           else before[name]), f"{name} changed by a refused call"


@pytest.mark.parametrize("case", ALIASES)
@pytest.mark.parametrize("name", _rope_writers())
def test_rope_writers_refuse_aliased_inputs_and_change_nothing(name: str, case: str) -> None:
    """q rotated twice (q is k), v cached as the rotated k by some writers and unrotated by
    others (v is k), a table that changes while it is read: refused by the one overlap check
    over every tensor of the call, directly and through a pool, before anything is rotated."""
    w = _rope_writer(name)
    call = _aliased(case)
    before = _snapshot(call)
    with pytest.raises(ValueError, match="shares memory") as err:
        w.write(**call, is_neox=True, dtype=torch.bfloat16)
    assert "\n" not in str(err.value)
    _unchanged(call, before)


def test_rope_pool_refuses_aliased_inputs_before_rotating() -> None:
    pool = KVPool(15, 1, torch.bfloat16, 2, 8, 1, writer=create_writer("rope_then_store"), check_slots=False)
    for case in ALIASES[:6]:
        call = _aliased(case)
        call.update(k_buf=pool.k_buffer[0], v_buf=pool.v_buffer[0])
        before = _snapshot(call)
        with pytest.raises(ValueError, match="shares memory"):
            pool.set_kv_buffer_with_rope(0, call["loc"], call["q"], call["k"], call["v"], call["positions"],
                                         call["cos_sin_cache"])
        _unchanged(call, before)


def test_q_k_v_split_out_of_one_projection_are_not_aliases() -> None:
    """SGLang's q, k, v are views of one QKV row per token: their spans interleave, their bytes
    do not meet. The overlap check is exact for views with one token stride."""
    for name in _rope_writers():
        w = create_writer(name)
        if w.unsupported_reason(CPU, torch.bfloat16, torch.bfloat16):
            continue
        qkv = torch.randn(3, 8 * 8).to(torch.bfloat16)
        q, k, v = qkv[:, :32].view(3, 4, 8), qkv[:, 32:48].view(3, 2, 8), qkv[:, 48:].view(3, 2, 8)
        _, _, _, cs, pos = _rope_inputs(3)
        rq, rk = rope_reference(q.clone(), k.clone(), cs, pos, True)
        k_buf, v_buf = torch.zeros(16, 2, 8, dtype=torch.bfloat16), torch.zeros(16, 2, 8, dtype=torch.bfloat16)
        v0 = v.clone()
        w.write(q, k, v, k_buf, v_buf, torch.tensor([1, 5, 9]), pos, cs, True, torch.bfloat16)
        assert torch.equal(bits(q), bits(rq.to(torch.bfloat16))) and torch.equal(bits(k), bits(rk.to(torch.bfloat16)))
        assert torch.equal(k_buf[[1, 5, 9]], k) and torch.equal(v_buf[[1, 5, 9]], v0)


@pytest.mark.parametrize("bad", [MAX_POS, MAX_POS + 1000, 1 << 40, -1])
@pytest.mark.parametrize("name", _rope_writers())
def test_positions_past_the_cos_sin_table_are_refused_even_with_slot_checks_off(name: str, bad: int) -> None:
    """A position past the table read what lies beyond it (values to 1e36, NaN) and, far past
    it, crashed the process. Refused on a CPU, whatever ``check_slots`` says, before q or k is
    rotated; directly and through a pool built with ``check_slots=False``."""
    w = _rope_writer(name)
    q, k, v, cs, pos = (t.to(torch.bfloat16) if t.dim() == 3 else t for t in _rope_inputs(3))
    pos[1] = bad
    pool = KVPool(15, 1, torch.bfloat16, 2, 8, 1, writer=w, check_slots=False)
    call = dict(q=q, k=k, v=v, k_buf=pool.k_buffer[0], v_buf=pool.v_buffer[0], loc=torch.tensor([1, 5, 9]),
                positions=pos, cos_sin_cache=cs)
    before = _snapshot(call)
    with pytest.raises(ValueError, match=f"positions has position {bad}, outside \\[0, {MAX_POS}\\)"):
        w.write(**call, is_neox=True, dtype=torch.bfloat16)
    _unchanged(call, before)
    with pytest.raises(ValueError, match="positions has position"):
        pool.set_kv_buffer_with_rope(0, call["loc"], q, k, v, pos, cs)
    _unchanged(call, before)


def test_a_rope_pool_whose_store_cannot_run_here_refuses_before_rotating() -> None:
    """``rope_then_store(store=cuda_fused)`` on a CPU rotated q and k, then raised that
    cuda_fused cannot run: the writer's unsupported_reason is asked first now."""
    w = create_writer("rope_then_store", store="cuda_fused")
    reason = w.unsupported_reason(CPU, torch.bfloat16, torch.bfloat16)
    assert reason
    pool = KVPool(15, 1, torch.bfloat16, 2, 8, 1, writer=w)
    q, k, v, cs, pos = (t.to(torch.bfloat16) if t.dim() == 3 else t for t in _rope_inputs(3))
    call = dict(q=q, k=k, v=v, positions=pos, k_buf=pool.k_buffer[0], v_buf=pool.v_buffer[0])
    before = _snapshot(call)
    with pytest.raises(ValueError, match="rope_then_store cannot take this call") as err:
        pool.set_kv_buffer_with_rope(0, torch.tensor([1, 5, 9]), q, k, v, pos, cs)
    assert reason in str(err.value)
    _unchanged(call, before)


# -- the overlap check itself, against every byte's address -----------------------------------
def _addresses(t: torch.Tensor) -> set[int]:
    """Every byte address ``t``'s elements occupy."""
    size = t.element_size()
    base = t.data_ptr()
    offsets = torch.zeros((), dtype=torch.int64)
    for n, s in zip(t.shape, t.stride()):
        offsets = offsets.unsqueeze(-1) + torch.arange(n) * s
    return {base + int(o) * size + b for o in offsets.flatten() for b in range(size)}


@st.composite
def _views(draw: Any, storage: torch.Tensor) -> torch.Tensor:
    """A 2-D or 3-D view of ``storage`` (96 float32s) at any offset, row stride and width."""
    rows = draw(st.integers(1, 4))
    heads = draw(st.integers(1, 3))
    dim = draw(st.integers(1, 4))
    stride = draw(st.integers(0 if draw(st.booleans()) else heads * dim, 24))
    inner = draw(st.sampled_from(["dense", "head-gap", "transposed"]))
    head_stride = dim + (1 if inner == "head-gap" else 0)
    if inner == "transposed":
        strides = (stride, 1, heads)
    else:
        strides = (stride, head_stride, 1)
    span = (rows - 1) * stride + (heads - 1) * strides[1] + (dim - 1) * strides[2] + 1
    offset = draw(st.integers(0, max(0, storage.numel() - span)))
    if span > storage.numel():
        rows, stride, strides = 1, 0, (0, *strides[1:])
    return storage.as_strided((rows, heads, dim), strides, offset)


def _exact(t: torch.Tensor) -> bool:
    """Whether ``t`` is rows of one dense block each (what the check reads exactly)."""
    if t.is_contiguous():
        return True
    dense = 1
    for n, stride in reversed(list(zip(t.shape[1:], t.stride()[1:]))):
        if n != 1 and stride != dense:
            return False
        dense *= n
    return True


@settings(max_examples=300, deadline=None, database=None)
@given(data=st.data())
def test_the_overlap_check_never_takes_tensors_that_share_a_byte(data: Any) -> None:
    """Two views of one storage: refused whenever they share a byte (never a false "apart"),
    and told apart exactly where both are rows of one token stride (q, k and v split out of
    one QKV projection), so an engine's ordinary call is never refused."""
    storage = torch.zeros(96)
    a, b = data.draw(_views(storage)), data.draw(_views(storage))
    meets = bool(_addresses(a) & _addresses(b))
    fa, fb = _rows_form(a), _rows_form(b)
    said = _meet(fa, fb)
    assert said or not meets, "two tensors that share a byte were taken as apart"
    one_stride = fa[3] == 1 or fb[3] == 1 or (fa[1] == fb[1] and fa[1] > 0)
    if _exact(a) and _exact(b) and one_stride:
        assert said == meets
    # a written tensor whose own elements overlap is refused for that: always where torch says
    # so or where it is rows of one dense block each (rows closer than their width), never else
    self_overlap = len(_addresses(a)) < a.numel() * a.element_size()
    if self_overlap and (_exact(a) or torch._debug_has_internal_overlap(a) == 1):
        with pytest.raises(ValueError, match="a is written and more than one of its elements"):
            check_disjoint({"a": a}, {"b": b})
        return
    if said:
        with pytest.raises(ValueError, match="b shares memory with a"):
            check_disjoint({"a": a}, {"b": b})
    else:
        check_disjoint({"a": a}, {"b": b})
    check_disjoint({}, {"a": a, "b": b})  # read-only tensors may share memory


def test_a_written_tensor_whose_elements_overlap_is_refused() -> None:
    q = torch.randn(1, 2, 8).expand(3, 2, 8)
    with pytest.raises(ValueError, match="q is written and more than one of its elements is one memory location"):
        check_disjoint({"q": q}, {})


# -- every registered writer, called directly, any way --------------------------------------------
def _store_params() -> list:
    return wp._params()


DIRECT_FAULTS = ("buffer strided", "buffer dtype", "buffers aliased")


@st.composite
def _direct_cases(draw: Any, layout: str, device: torch.device = CPU) -> dict[str, Any]:
    """The pools' cases, plus faults only a direct call makes. On a GPU no slot out of range:
    the slots' values stay the caller's there (reading them would sync the device), and
    writers mask or assert on one (the pools' test checks it with check_slots on); SGLang's
    store_cache never writes slot 0, so MHA slots start at 1 there."""
    first = 1 if layout == "mha" and device.type == "cuda" else 0
    case = draw(wp.cases(layout, first).filter(lambda c: device.type == "cpu" or c["fault"] != "slot out of range"))
    case["direct"] = None
    if case["fault"] is None and draw(st.integers(0, 3)) == 0:
        case["direct"] = draw(st.sampled_from(DIRECT_FAULTS if layout != "mla" else DIRECT_FAULTS[:2]))
    return case


def _direct_buffers(case: dict[str, Any], buffers: list[torch.Tensor]) -> list[torch.Tensor]:
    """The buffers the call is given: the pool's, or (a direct fault) a strided view of a wider
    one, one of another dtype, or K's twice."""
    fault = case["direct"]
    if fault == "buffer strided":
        wide = torch.zeros((*buffers[0].shape[:-1], buffers[0].shape[-1] + 2), dtype=buffers[0].dtype,
                           device=buffers[0].device)
        return [wide[..., : buffers[0].shape[-1]], *buffers[1:]]
    if fault == "buffer dtype":
        other = torch.float16 if buffers[0].dtype != torch.float16 else torch.float32
        return [torch.zeros(buffers[0].shape, dtype=other, device=buffers[0].device), *buffers[1:]]
    if fault == "buffers aliased":
        return [buffers[0], buffers[0]]
    return buffers


def _call(layout: str, writer: Any, case: dict[str, Any], bufs: list[torch.Tensor], loc: torch.Tensor,
          inputs: list[torch.Tensor], scale: Any) -> None:
    cache = case["cache"]
    if layout == "mha":
        writer.write(bufs[0], bufs[1], loc, inputs[0], inputs[1], cache, scale, scale)
    elif layout == "mla" and case["split"]:
        writer.write(bufs[0], loc, inputs[0], inputs[1], cache, 0)
    elif layout == "mla":
        r = 2 * case["dim"]
        writer.write(bufs[0], loc, inputs[0][..., :r], inputs[0][..., r:], cache, -1)
    else:
        fp8 = cache in wp.FP8
        s = None
        if fp8:
            s = scale if isinstance(scale, torch.Tensor) else torch.tensor([1.0 if scale is None else scale],
                                                                           device=bufs[0].device)
        writer.write(bufs[0], bufs[1], loc, inputs[0], inputs[1], cache, s, s)


def _run_direct(layout: str, writer: Any, case: dict[str, Any], device: torch.device = CPU) -> None:
    """As the pools' test's ``_run``, with the writer called directly."""
    gen = torch.Generator().manual_seed(case["seed"])
    _, buffers = wp._pool(layout, writer, case, device)
    wp._fill(buffers, gen)
    loc = wp._loc(case, buffers)
    inputs = [wp._rows(case, i, shape, buffers, gen) for i, shape in enumerate(wp._input_shapes(layout, case))]
    bufs = _direct_buffers(case, buffers)
    watched = list({id(b): b for b in [*buffers, *bufs]}.values())
    snapshot = [wp._rows_of(b).clone() for b in watched]
    held = [x.clone() for x in inputs]
    refuse = wp._expect_refusal(case, writer, device) or case["direct"] is not None
    scale = wp._scale(case, device)
    try:
        _call(layout, writer, case, bufs, loc, inputs, scale)
    except ValueError as exc:
        for before, b in zip(snapshot, watched):
            assert torch.equal(before, wp._rows_of(b)), f"{writer.name} changed a buffer, then refused: {exc}"
        assert refuse, f"{writer.name} refused a valid direct call: {exc}"
        # a case with a fault and dtypes the writer cannot take may be refused for either
        unsupported = writer.unsupported_reason(device, case["cache"], case["inp"])
        assert case["fault"] is None or wp.REFUSALS[case["fault"]] in str(exc) or (
            unsupported is not None and unsupported in str(exc)), f"{case['fault']}: refused for {exc}"
        assert "\n" not in str(exc)
        return
    assert not refuse, f"{writer.name} took a direct call it must refuse: {case}"
    wp._check_written(layout, writer.name, case, snapshot[: len(buffers)], buffers, held, scale, device)


@pytest.mark.parametrize("device", wp.DEVICES)
@pytest.mark.parametrize(("layout", "name"), _store_params())
def test_every_store_writer_called_directly_writes_the_reference_rows_or_nothing(layout: str, name: str,
                                                                                   device: torch.device) -> None:
    if name not in wp.SLOW:
        _run_direct_examples(layout, wp._writer(layout, name, device), device)
        return
    # torch_compile: its own writer, dynamo's cache emptied before and after (the cache is per
    # function, and each call shape recompiles: the pools' test of the same writer must not
    # start at this test's recompile count)
    if device.type == "cuda":
        pytest.skip(f"{name} recompiles per call shape: checked on CPU (-m slow)")
    torch._dynamo.reset()
    try:
        _run_direct_examples(layout, create_writer(name, layout=layout), device)
    finally:
        torch._dynamo.reset()


def test_a_fault_beside_dtypes_the_writer_cannot_take_may_be_refused_for_either() -> None:
    """A case Hypothesis drew: mla_triton on a CPU, an fp32 input for a bf16 cache and a slot past
    the buffer. The writer refuses the dtypes first (its contract asks ``unsupported_reason``
    before the slot range), which is a right refusal, and nothing is written."""
    case = {"fault": "slot out of range", "cache": torch.bfloat16, "inp": torch.float32, "tokens": 1,
            "check_slots": True, "slots": [33], "loc_layout": "contiguous", "loc_dtype": torch.int64,
            "row_layouts": ("contiguous", "contiguous"), "into": 0, "heads": 1, "dim": 4, "vdim": 4,
            "scale": None, "split": False, "padded": 0, "seed": 0, "direct": None}
    _run_direct("mla", wp._writer("mla", "mla_triton", CPU), case, CPU)


def _run_direct_examples(layout: str, writer: Any, device: torch.device) -> None:
    # 20 calls per writer here; 10 on a GPU, where each new launch shape compiles a kernel
    @settings(max_examples=20 if device.type == "cpu" else 10, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], database=None)
    @given(case=_direct_cases(layout, device))
    def run(case: dict[str, Any]) -> None:
        _run_direct(layout, writer, case, device)

    run()


ROPE_FAULTS = ("q is k", "q and k overlap by a head", "v is k", "v overlaps k", "q views cos_sin_cache",
               "k inside k_buf", "position past the table", "slot out of range", "v dtype", "loc strided")


@st.composite
def _rope_cases(draw: Any, device: torch.device = CPU) -> dict[str, Any]:
    """One rope + store call, half of them with one fault. On a GPU no slot or position out
    of range: their values stay the caller's there (reading them would sync the device)."""
    faults = [f for f in ROPE_FAULTS if device.type == "cpu" or f not in ("position past the table",
                                                                          "slot out of range")]
    fault = draw(st.sampled_from([None] * 6 + faults))
    return {"fault": fault, "tokens": draw(st.integers(1, 4)), "hq": draw(st.integers(1, 3)),
            "hk": draw(st.integers(1, 2)), "dim": draw(st.sampled_from([4, 8])),
            "rope_frac": draw(st.sampled_from([1.0, 0.5])), "split": draw(st.booleans()),
            "dtype": draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32])),
            "cache": draw(st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn])),
            "neox": draw(st.booleans()), "loc_layout": draw(st.sampled_from(wp.LOC_LAYOUTS)),
            "slots": draw(st.lists(st.integers(0, 15), min_size=4, max_size=4)),
            "bad": draw(st.integers(0, 3)), "seed": draw(st.integers(0, 2**16))}


def _rope_call(case: dict[str, Any], device: torch.device = CPU) -> dict[str, Any]:
    t, hq, hk, d, dtype = case["tokens"], case["hq"], case["hk"], case["dim"], case["dtype"]
    g = torch.Generator().manual_seed(case["seed"])
    fault = case["fault"]
    width = (hq + 2 * hk) * d
    qkv = torch.randn(t, width, generator=g).to(dtype).to(device)
    if case["split"] or fault in ("q and k overlap by a head", "v overlaps k"):
        q = qkv[:, : hq * d].view(t, hq, d)
        k = qkv[:, hq * d: (hq + hk) * d].view(t, hk, d)
        v = qkv[:, (hq + hk) * d:].view(t, hk, d)
    else:
        q, k, v = (qkv[:, : hq * d].reshape(t, hq, d).clone(), qkv[:, hq * d: (hq + hk) * d].reshape(t, hk, d).clone(),
                   qkv[:, (hq + hk) * d:].reshape(t, hk, d).clone())
    rope_dim = max(2, int(d * case["rope_frac"]) // 2 * 2)
    # a table with room for a q inside it (the "q views cos_sin_cache" fault)
    cs = cos_sin_table(MAX_POS * (8 if fault == "q views cos_sin_cache" else 1), rope_dim).to(device)
    pos = torch.randint(0, MAX_POS, (t,), generator=g).to(device)
    store = store_dtype_for(case["cache"])
    k_buf = torch.randint(0, 100, (16, hk, d), generator=g).to(store).to(device)
    v_buf = torch.randint(0, 100, (16, hk, d), generator=g).to(store).to(device)
    slots = case["slots"][:t]
    bad = 0 if case["loc_layout"] == "expanded" else case["bad"] % t  # an expanded loc holds slot 0 only
    if fault == "slot out of range":
        slots = [*slots]
        slots[bad] = 16
    if fault == "position past the table":
        pos[bad] = cs.shape[0] + bad
    loc = wp._as_loc(slots, torch.int64, "strided" if fault == "loc strided" else case["loc_layout"], device)
    if case["loc_layout"] == "expanded" and fault != "loc strided":
        slots = [slots[0]] * t
    if fault == "q is k":
        q = k  # q of k's heads: q and k the same tensor
    elif fault == "q and k overlap by a head":
        k = qkv[:, (hq - 1) * d: (hq - 1 + hk) * d].view(t, hk, d)
    elif fault == "v is k":
        v = k
    elif fault == "v overlaps k":
        v = qkv[:, hq * d + d // 2: hq * d + d // 2 + hk * d].view(t, hk, d)
    elif fault == "q views cos_sin_cache":
        need = t * hq * d * q.element_size() // 4
        q = cs.reshape(-1)[:need].view(dtype).view(t, hq, d)
    elif fault == "k inside k_buf":
        k = k_buf[:t].view(dtype) if store.itemsize == q.element_size() else k
    elif fault == "v dtype":
        v = v.to(torch.float16 if dtype != torch.float16 else torch.float32)
    return {"q": q, "k": k, "v": v, "k_buf": k_buf, "v_buf": v_buf, "loc": loc, "positions": pos,
            "cos_sin_cache": cs, "slots": slots}


def _run_rope_direct(writer: RopeKVWriter, case: dict[str, Any], device: torch.device = CPU) -> None:
    """Refused with every tensor as it was, or q and k rotated and the rows stored as the
    float32 reference does, bit for bit (kvprof's writers; SGLang's kernels, compiled with
    fused multiply-adds, round within an ulp of it on a GPU, tests/test_rope_peers.py: there
    only the rows outside the slots are checked)."""
    call = _rope_call(case, device)
    slots = call.pop("slots")
    watched = {name: t for name, t in call.items()}
    before = {name: t.clone() for name, t in watched.items()}
    scale = 0.5 if case["cache"] == torch.float8_e4m3fn else None
    fault = case["fault"]
    if fault == "k inside k_buf" and not call["k"].data_ptr() == call["k_buf"].data_ptr():
        fault = None  # the buffer's dtype is not k's: no view of it makes a k
    supported = writer.unsupported_reason(device, case["cache"], call["k"].dtype) is None
    shape_reason = getattr(writer, "shape_reason", None)  # a peer kernel's own shape limits (SGLang's asserts)
    if supported and shape_reason is not None:
        supported = shape_reason(call["q"], call["k"], call["v"], call["k_buf"], call["v_buf"],
                                 call["cos_sin_cache"], case["neox"]) is None
    refuse = fault not in (None, "loc strided") or not supported
    rq = rk = None
    if not refuse:
        rq, rk = rope_reference(call["q"].clone(), call["k"].clone(), call["cos_sin_cache"], call["positions"],
                                case["neox"])
    try:
        writer.write(**call, is_neox=case["neox"], dtype=case["cache"], k_scale=scale, v_scale=scale)
    except ValueError as exc:
        for name, t in watched.items():
            assert torch.equal(bits(t) if t.is_floating_point() else t,
                               bits(before[name]) if t.is_floating_point() else before[name]), (
                f"{writer.name} changed {name}, then refused: {exc}")
        assert refuse, f"{writer.name} refused a valid call: {exc}"
        assert "\n" not in str(exc)
        return
    assert not refuse, f"{writer.name} took a call it must refuse: {fault}"
    assert rq is not None and rk is not None
    q, k = call["q"], call["k"]
    if device.type != "cpu" and not writer.name.startswith("rope_"):
        for name in ("k_buf", "v_buf"):
            outside = [s for s in range(16) if s not in slots]
            assert torch.equal(wp._rows_of(call[name])[outside], wp._rows_of(before[name])[outside])
        return
    assert torch.equal(bits(q), bits(rq.to(q.dtype))), f"{writer.name}: q is not the reference rotation"
    assert torch.equal(bits(k), bits(rk.to(k.dtype))), f"{writer.name}: k is not the reference rotation"
    for i, (buf, x) in enumerate(((call["k_buf"], k), (call["v_buf"], before["v"]))):
        want = wp._bytes(convert_for_cache(x, case["cache"], scale))
        wp._check_rows(f"{writer.name} {'KV'[i]}", wp._rows_of(before[("k_buf", "v_buf")[i]]), wp._rows_of(buf),
                       slots, want)


@pytest.mark.parametrize("device", wp.DEVICES)
@pytest.mark.parametrize("name", _rope_writers())
def test_every_rope_writer_called_directly_rotates_and_stores_the_reference_or_nothing(name: str,
                                                                                       device: torch.device) -> None:
    writer = _rope_writer(name, device)

    @settings(max_examples=20 if device.type == "cpu" else 10, deadline=None,
              suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(case=_rope_cases(device))
    def run(case: dict[str, Any]) -> None:
        _run_rope_direct(writer, case, device)

    run()


def _outcome(fn: Any) -> Any:
    """What a check returned (q, k and v as their address, shape and strides; loc and positions,
    contiguous copies where strided, as their values) or the error it raised."""
    try:
        q, k, v, loc, positions = fn()
    except ValueError as exc:
        return ("refused", str(exc))
    return (*((t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) for t in (q, k, v)),
            *((t.tolist(), t.dtype, t.is_contiguous()) for t in (loc, positions)))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(case=_rope_cases(), flat=st.sampled_from(["", "q", "k", "v", "qkv", "q/2", "k/2", "v/2"]),
       scale=st.sampled_from([None, 0.5, 2, -1.0, float("inf"), "tensor"]))
def test_the_rope_checks_common_call_written_out_decides_as_the_full_checks(case: dict[str, Any], flat: str,
                                                                             scale: Any) -> None:
    """check_rope_call's fast path (the common call, written out) returns what the full checks
    return, and refuses what they refuse in the same words: any call, faults, 2-D q/k/v and
    every kind of scale included."""
    from kvprof.kvcache import contracts

    call = _rope_call(case)
    call.pop("slots")
    halve = flat.endswith("/2")  # flat with twice the tokens: a 2-D view the checks must not take
    for name in flat.removesuffix("/2"):
        t = call[name]
        if t.dim() == 3 and t.shape[1] * t.shape[2]:
            try:
                call[name] = t.reshape(-1, t.shape[1] * t.shape[2] // 2) if halve and t.shape[2] % 2 == 0 \
                    else t.view(t.shape[0], -1)
            except RuntimeError:
                pass
    k_scale = torch.tensor([0.5]) if scale == "tensor" else scale

    def check() -> Any:
        return contracts.check_rope_call(**call, dtype=case["cache"], k_scale=k_scale, v_scale=k_scale)

    fast = _outcome(check)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(contracts, "_rope_call_fast", lambda *a: None)
        full = _outcome(check)
    assert fast == full


# -- a writer that cannot be built, a head dim the rotary cannot take: one line, no traceback -----
@pytest.fixture
def broken_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "kvprof_broken_writer.py").write_text(textwrap.dedent('''
        def factory(**options):
            raise RuntimeError("the writer's library failed to load\\nsecond line")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "kvprof_broken_writer:factory"
    sys.modules.pop("kvprof_broken_writer", None)


def test_a_writer_factory_that_raises_is_one_line_through_capture(broken_factory: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "capture", "--writer", broken_factory, "--out", str(tmp_path / "run"))
    assert r.rc == 2
    assert r.err.strip().splitlines() == [
        f"kvprof capture: error: writer '{broken_factory}' could not be built: RuntimeError: the writer's library "
        "failed to load"]
    assert not (tmp_path / "run").exists()


def test_a_writer_factory_that_raises_is_one_line_through_bench(broken_factory: str, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """bench records a variant it cannot build as unavailable, with the one-line reason."""
    r = run_cli(capsys, "bench", "--variants", f"index_put,{broken_factory}", "--shapes", "1x8", "--dtypes", "bf16",
                "--tokens", "1", "--eager-repeats", "1", "--out", str(tmp_path / "b"))
    assert r.rc == 0 and not r.err
    records = orjson.loads((tmp_path / "b" / "bench.json").read_bytes())["records"]
    broken = [rec for rec in records if rec["variant"] == broken_factory]
    assert broken and {rec["status"] for rec in broken} == {"unavailable"}
    assert {rec["reason"] for rec in broken} == {
        f"writer '{broken_factory}' could not be built: RuntimeError: the writer's library failed to load"}
    assert any(rec["variant"] == "index_put" and rec["status"] == "ok" for rec in records)


@pytest.mark.parametrize("shape", ["4x2x7", "4x2x1", "4x2x9"])
def test_bench_rope_with_a_head_dim_the_rotary_cannot_take_is_one_line(shape: str, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    r = run_cli(capsys, "bench", "--family", "rope", "--shapes", f"8x8x16,{shape}", "--tokens", "1", "--dtypes",
                "bf16", "--out", str(tmp_path / "b"))
    dim = shape.split("x")[-1]
    assert r.rc == 2
    assert r.err.strip().splitlines() == [
        f"kvprof bench: error: --family rope rotates the whole head (rope_dim = head dim): rope_dim {dim} must be "
        f"even and in [2, head_dim={dim}]"]
    assert not (tmp_path / "b").exists()
